"""The experiment's datasets: one record per dataset, looked up by ``data.name``.

A :class:`Dataset` names a loader that returns :class:`DatasetArrays` (training and test
examples with their labels, the number of classes, optionally the public mean and standard
deviation that ``data.normalize: standard`` uses, and optionally a client partition of the
training examples). :data:`DATASETS` holds the records; :func:`register_dataset` adds one.
Two come with the experiment:

- ``mnist`` (the default): :func:`shuffle_experiments.data.load_mnist`, pixels in ``[0, 1]``
  as ``N x 1 x 28 x 28``, 10 classes, standardised with MNIST's mean 0.1307 and standard
  deviation 0.3081; no partition. It reads ``data.source``, ``data.root`` and
  ``data.pickle_path``.
- ``npz``: a user's own arrays in one local ``.npz`` file at ``data.path``, read with
  ``allow_pickle=False`` (nothing in the file can run code) and never downloaded. Its keys:

  ============== ========================= ============== =====================================
  key            dtype                     shape          values
  ============== ========================= ============== =====================================
  train_x        float or integer (not     ``(N, *S)``,   finite; converted to float32 as they
                 bool)                     ``N >= 1``     are (integers are not rescaled)
  train_y        integer (not bool)        ``(N,)``       in ``[0, num_classes)``
  test_x         as ``train_x``            ``(M, *S)``,   finite; the same example shape ``S``
                                           ``M >= 1``
  test_y         integer (not bool)        ``(M,)``       in ``[0, num_classes)``
  num_classes    integer                   ``()``         in ``[2, 100000]``
  train_client   integer (not bool)        ``(N,)``       optional: the client of each training
                                                          example, ids ``0 .. K - 1``, every id
                                                          used (no empty client)
  mean, std      float or integer          ``()``         optional, both or neither: public
                                                          constants for ``normalize: standard``,
                                                          finite, ``std > 0``
  ============== ========================= ============== =====================================

  ``S`` is the shape of one example (``(1, 28, 28)`` for an image, ``(d,)`` for a feature
  vector), at least one dimension. Any other key is refused, so that a misspelt
  ``train_clients`` is not silently ignored. ``num_classes``, ``mean`` and ``std`` are given,
  not computed from the training data: a number computed from the private examples would be
  released without noise.

Every problem is one line naming the array and what was expected (:class:`DatasetError`, a
``ValueError``). A dataset fixes what the model sees: the models take its example shape and
number of classes (:func:`shuffle_experiments.models.build_model`).
"""

from __future__ import annotations

import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from shuffle_opacus.common.suggestions import did_you_mean

from .data import load_mnist
from .dataset_arrays import DatasetArrays, DatasetError, client_ids, is_int

if TYPE_CHECKING:
    from .config import ClientsConfig, DataConfig

__all__ = [
    "DATASETS",
    "MNIST_MEAN",
    "MNIST_STD",
    "MNIST_TRAIN_IMAGES",
    "Dataset",
    "DatasetArrays",
    "DatasetError",
    "DatasetTensors",
    "check_data",
    "dataset_tensors",
    "get_dataset",
    "register_dataset",
]

#: Mean and standard deviation of MNIST training pixels in [0, 1], used to standardise inputs.
MNIST_MEAN, MNIST_STD = 0.1307, 0.3081
#: Images in MNIST's training set: the population when ``data.train_subset`` is not given.
MNIST_TRAIN_IMAGES = 60_000
#: The ``data`` keys that say where a dataset's files are, with their defaults; a dataset
#: names those its loader reads (:attr:`Dataset.keys`), and the others must keep their default.
SOURCE_KEYS: dict[str, Any] = {"source": "auto", "root": None, "pickle_path": None, "path": None}
NPZ_KEYS = (
    "train_x",
    "train_y",
    "test_x",
    "test_y",
    "num_classes",
    "train_client",
    "mean",
    "std",
)


#: What :attr:`Dataset.count` returns: training examples, and the clients of the dataset's own
#: partition (``None`` without one).
Counts = tuple[int, int | None]


@dataclass(frozen=True)
class Dataset:
    """One dataset of the registry.

    Attributes:
        name: What ``data.name`` calls it (letters, digits, ``_`` and ``-``).
        load: Returns the :class:`DatasetArrays` for a ``data`` section (the whole training and
            test sets: ``data.train_subset`` and ``data.test_subset`` are applied after).
        keys: The ``data`` keys of :data:`SOURCE_KEYS` the loader reads (e.g. ``("path",)``);
            a config that sets another is refused.
        count: Returns ``(training examples, clients of its partition or None)`` without
            loading everything, for the config's checks; ``None`` loads the arrays to count.
        about: One line for listings.
    """

    name: str
    load: Callable[[DataConfig], DatasetArrays]
    keys: tuple[str, ...] = ()
    count: Callable[[DataConfig], Counts] | None = None
    about: str = ""

    def arrays(self, data: DataConfig) -> DatasetArrays:
        """Return :attr:`load`'s arrays for ``data``.

        Raises:
            DatasetError: if the loader returns something else than :class:`DatasetArrays`.
        """
        arrays = self.load(data)
        if not isinstance(arrays, DatasetArrays):
            raise DatasetError(
                f"dataset {self.name!r}: load must return DatasetArrays, got "
                f"{type(arrays).__name__}"
            )
        return arrays

    def counts(self, data: DataConfig) -> Counts:
        """Return ``(training examples, clients of its partition or None)``."""
        if self.count is not None:
            return self.count(data)
        arrays = self.arrays(data)
        clients = arrays.train_client
        return arrays.train_x.shape[0], None if clients is None else int(clients.max()) + 1


#: The registry: ``data.name`` -> :class:`Dataset`.
DATASETS: dict[str, Dataset] = {}


def register_dataset(dataset: Dataset, *, replace: bool = False) -> Dataset:
    """Add ``dataset`` to :data:`DATASETS` under its name.

    Args:
        dataset: The record.
        replace: Replace a dataset of the same name instead of refusing it.

    Returns:
        ``dataset``.

    Raises:
        DatasetError: for a name that is not letters, digits, ``_`` and ``-``, a name taken
            (without ``replace``), a loader that is not callable, or an unknown key.
    """
    name = dataset.name
    if not (isinstance(name, str) and name and name.replace("_", "a").replace("-", "a").isalnum()):
        raise DatasetError(f"dataset name must be letters, digits, _ and -, got {name!r}")
    if name in DATASETS and not replace:
        raise DatasetError(f"dataset {name!r} is registered already; pass replace=True")
    if not callable(dataset.load):
        raise DatasetError(f"dataset {name!r}: load must be callable, got {dataset.load!r}")
    unknown = [key for key in dataset.keys if key not in SOURCE_KEYS]
    if unknown:
        raise DatasetError(
            f"dataset {name!r}: keys must be among {', '.join(SOURCE_KEYS)}, got {unknown[0]!r}"
        )
    DATASETS[name] = dataset
    return dataset


def get_dataset(name: str) -> Dataset:
    """Return the registered dataset ``name``.

    Raises:
        DatasetError: for an unknown name, with the closest registered one.
    """
    if name not in DATASETS:
        raise DatasetError(
            f"data.name must be one of {', '.join(DATASETS)}{did_you_mean(name, DATASETS)}, "
            f"got {name!r}"
        )
    return DATASETS[name]


# --- MNIST ---------------------------------------------------------------------------------


def _load_mnist(data: DataConfig) -> DatasetArrays:
    train_x, train_y, test_x, test_y = load_mnist(
        data.source, data.root, data.pickle_path
    ).normalized()
    return DatasetArrays(
        train_x=train_x.reshape(-1, 1, 28, 28),
        train_y=train_y,
        test_x=test_x.reshape(-1, 1, 28, 28),
        test_y=test_y,
        num_classes=10,
        mean=MNIST_MEAN,
        std=MNIST_STD,
        source="MNIST",
    )


def _count_mnist(data: DataConfig) -> Counts:
    if data.source in ("torchvision", "idx") and data.root is None:
        raise DatasetError(f"data.root is required for data.source {data.source}, got null")
    return MNIST_TRAIN_IMAGES, None


register_dataset(
    Dataset(
        name="mnist",
        load=_load_mnist,
        keys=("source", "root", "pickle_path"),
        count=_count_mnist,
        about="MNIST from local files (data.source, data.root, data.pickle_path)",
    )
)


# --- a user's arrays in one .npz file ------------------------------------------------------


def _npz(data: DataConfig, keys: tuple[str, ...]) -> dict[str, np.ndarray]:
    """Read ``keys`` (those present) of the ``.npz`` at ``data.path``, after checking its keys."""
    if data.path is None:
        raise DatasetError("data.path is required for data.name npz (the .npz file), got null")
    path = Path(data.path).expanduser()
    if not path.is_file():
        raise DatasetError(f"data.path {path} is not a file")
    where = f"data.path {path}: "
    if not zipfile.is_zipfile(path):
        raise DatasetError(f"{where}not a readable .npz file (a zip archive of .npy arrays)")
    try:
        with np.load(path, allow_pickle=False) as npz:
            files = list(npz.files)
            unknown = [k for k in files if k not in NPZ_KEYS]
            if unknown:
                raise DatasetError(
                    f"{where}{unknown[0]} is not a key of the format"
                    f"{did_you_mean(unknown[0], NPZ_KEYS)} (keys: {', '.join(NPZ_KEYS)})"
                )
            required = ("train_x", "train_y", "test_x", "test_y", "num_classes")
            missing = [k for k in required if k not in files]
            if missing:
                raise DatasetError(f"{where}the array {missing[0]} is missing")
            return {k: npz[k] for k in keys if k in files}
    except (OSError, EOFError, zipfile.BadZipFile) as exc:
        raise DatasetError(f"{where}not a readable .npz file ({type(exc).__name__})") from None
    except ValueError as exc:
        if isinstance(exc, DatasetError):
            raise
        # numpy refuses object arrays without allow_pickle, and damaged headers, as ValueError.
        raise DatasetError(f"{where}holds an array numpy cannot read without pickle") from None


def _scalar(name: str, value: np.ndarray | None, where: str) -> float | int | None:
    if value is None:
        return None
    if value.shape != () or value.dtype == bool or not np.issubdtype(value.dtype, np.number):
        raise DatasetError(
            f"{where}{name} must be a number of shape (), got dtype {value.dtype} shape "
            f"{value.shape}"
        )
    return value.item()  # type: ignore[no-any-return]


def _load_npz(data: DataConfig) -> DatasetArrays:
    arrays = _npz(data, NPZ_KEYS)
    where = f"data.path {Path(data.path).expanduser()}: "  # type: ignore[arg-type]
    classes = arrays["num_classes"]
    if classes.shape != () or not is_int(classes):
        raise DatasetError(
            f"{where}num_classes must be an integer of shape (), got dtype {classes.dtype} "
            f"shape {classes.shape}"
        )
    return DatasetArrays(
        train_x=arrays["train_x"],
        train_y=arrays["train_y"],
        test_x=arrays["test_x"],
        test_y=arrays["test_y"],
        num_classes=int(classes),
        train_client=arrays.get("train_client"),
        mean=_scalar("mean", arrays.get("mean"), where),
        std=_scalar("std", arrays.get("std"), where),
        source=where[:-2],
    )


def _count_npz(data: DataConfig) -> Counts:
    arrays = _npz(data, ("train_y", "train_client"))
    examples = int(arrays["train_y"].shape[0]) if arrays["train_y"].ndim else 0
    if examples == 0:
        raise DatasetError(
            f"data.path {data.path}: train_y must have shape (N,) with N >= 1, got "
            f"{arrays['train_y'].shape}"
        )
    ids = arrays.get("train_client")
    if ids is None:
        return examples, None
    where = f"data.path {data.path}: "
    return examples, int(client_ids(ids, examples, where).max()) + 1


register_dataset(
    Dataset(
        name="npz",
        load=_load_npz,
        keys=("path",),
        count=_count_npz,
        about="a user's arrays in one local .npz file (data.path); format in this module",
    )
)


# --- what the config and the session use ---------------------------------------------------


def check_data(data: DataConfig, clients: ClientsConfig | None) -> int:
    """Check the ``data`` section against its dataset; return the training examples used.

    Args:
        data: The config's ``data`` section.
        clients: Its ``clients`` section (``None`` at example level).

    Returns:
        ``data.train_subset``, or the dataset's number of training examples.

    Raises:
        DatasetError: for an unknown ``data.name``, a source key the dataset does not read, a
            subset larger than the training set, or a ``clients.partition: dataset`` that the
            dataset cannot serve (no partition, another number of clients, a subset).
    """
    dataset = get_dataset(data.name)
    for key, default in SOURCE_KEYS.items():
        value = getattr(data, key)
        if key not in dataset.keys and value != default:
            users = [d.name for d in DATASETS.values() if key in d.keys]
            raise DatasetError(
                f"data.{key} applies to data.name {' and '.join(users) or 'none'} only, got "
                f"{value!r}"
            )
    examples, partition = dataset.counts(data)
    if data.train_subset is not None and data.train_subset > examples:
        raise DatasetError(
            f"data.train_subset must be <= {examples} (the training set of {data.name}), got "
            f"{data.train_subset}"
        )
    if clients is not None and clients.partition == "dataset":
        if partition is None:
            raise DatasetError(
                f"clients.partition dataset needs a dataset with its own partition (npz key "
                f"train_client); data.name {data.name} has none"
            )
        if data.train_subset is not None:
            raise DatasetError(
                f"data.train_subset cannot cut the dataset's own partition (clients.partition "
                f"dataset), got {data.train_subset}"
            )
        if clients.count != partition:
            raise DatasetError(
                f"clients.count must be {partition}, the clients of {data.name}'s partition, "
                f"got {clients.count}"
            )
    return data.train_subset or examples


@dataclass(frozen=True)
class DatasetTensors:
    """What a session trains on: tensors on the CPU, and what the model must fit.

    Attributes:
        train_x: Training inputs ``(N, *S)``, normalised as ``data.normalize`` says.
        train_y: Their labels (``int64``).
        test_x: Test inputs ``(M, *S)``.
        test_y: Their labels.
        train_client: The client id of every training example, or ``None``.
        num_classes: Number of classes.
    """

    train_x: torch.Tensor
    train_y: torch.Tensor
    test_x: torch.Tensor
    test_y: torch.Tensor
    train_client: np.ndarray | None
    num_classes: int

    @property
    def input_shape(self) -> tuple[int, ...]:
        """The shape ``S`` of one example."""
        return tuple(self.train_x.shape[1:])


def dataset_tensors(data: DataConfig) -> DatasetTensors:
    """Load ``data.name``, cut the subsets, normalise, and return tensors.

    Args:
        data: The config's ``data`` section.

    Returns:
        The tensors (``float32`` inputs, ``int64`` labels).

    Raises:
        DatasetError: if the dataset is unknown or malformed, ``data.train_subset`` exceeds
            its training set, or ``data.normalize: standard`` meets a dataset without a
            public mean and standard deviation.
    """
    arrays = get_dataset(data.name).arrays(data)
    train_x, train_y, clients = arrays.train_x, arrays.train_y, arrays.train_client
    test_x, test_y = arrays.test_x, arrays.test_y
    if data.train_subset is not None:
        if data.train_subset > train_x.shape[0]:
            raise DatasetError(
                f"data.train_subset must be <= {train_x.shape[0]} (the training set), got "
                f"{data.train_subset}"
            )
        train_x, train_y = train_x[: data.train_subset], train_y[: data.train_subset]
        clients = None if clients is None else clients[: data.train_subset]
    if data.test_subset is not None:
        test_x, test_y = test_x[: data.test_subset], test_y[: data.test_subset]
    mean, std = arrays.mean, arrays.std
    if data.normalize == "standard" and (mean is None or std is None):
        raise DatasetError(
            f"data.normalize standard needs the public mean and std of {data.name} (npz keys "
            "mean and std); give them, or set data.normalize: unit to train on the arrays as "
            "they are"
        )

    def inputs(x: np.ndarray) -> torch.Tensor:
        values = torch.from_numpy(x)
        if data.normalize == "standard" and mean is not None and std is not None:
            values = (values - mean) / std  # Python floats: float32 arithmetic, as always
        return values.contiguous()

    return DatasetTensors(
        train_x=inputs(train_x),
        train_y=torch.from_numpy(train_y).long(),
        test_x=inputs(test_x),
        test_y=torch.from_numpy(test_y).long(),
        train_client=clients,
        num_classes=arrays.num_classes,
    )
