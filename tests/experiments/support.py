"""Helpers of the experiment's tests: a small copy of MNIST, and plots recorded, not drawn.

The training tests use the first 2,000 training and 500 test images of MNIST (or fewer, cut by
``data.train_subset`` and ``data.test_subset``). Read from the installed 17 MB pickle, every
session normalizes all 70,000 images before it cuts them (about 0.13 s). A copy of just those
images as IDX files (``data.source: idx``) gives bit-for-bit the same tensors
(``test_small_mnist_gives_the_tensors_of_the_full_copy``) in a few milliseconds, in the test
process and in the subprocesses that the crash tests start. The loader keeps the last pickle it
read in memory (one file at a time); IDX files are not cached, so reading the small copy does
not evict the installed pickle that other tests read (decompressing it again takes about 2 s).

A finished run draws two figures, about 0.8 s of CPU: most of a short test run. The tests whose
subject is what a resumed run trains (its rows and weights against an uninterrupted run) use
:func:`record_plots`, which records that the run asked for its plots instead of drawing them;
the figures themselves are drawn and tested where they are the subject: the ``test_plot_*``
tests (on test_checkpoints' reference run, which draws its own), the smoke run, the hand-edited
epsilons, the stop-signal tests' interrupted runs, the console, plan and proven tests, the
worked example of a registered dataset, the users smoke run and a sweep's figure.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

#: The images copied: those of the smoke configs (``configs/smoke.yaml``, ``users_smoke.yaml``).
SMALL_TRAIN, SMALL_TEST = 2000, 500


def _idx_bytes(array: np.ndarray) -> bytes:
    """``array`` (unsigned bytes) as an IDX file: magic number, sizes, then the data."""
    header = bytes([0, 0, 0x08, array.ndim])
    sizes = b"".join(int(d).to_bytes(4, "big") for d in array.shape)
    return header + sizes + np.ascontiguousarray(array, dtype=np.uint8).tobytes()


def write_small_mnist(root: Path) -> list[str]:
    """Write the first 2,000 + 500 MNIST images as IDX files into ``root``.

    Returns:
        The config overrides that read them.
    """
    from shuffle_experiments.data import IDX_FILES, load_mnist

    mnist = load_mnist("auto")
    arrays = {
        "train_images": mnist.train_images[:SMALL_TRAIN],
        "train_labels": mnist.train_labels[:SMALL_TRAIN],
        "test_images": mnist.test_images[:SMALL_TEST],
        "test_labels": mnist.test_labels[:SMALL_TEST],
    }
    for key, stem in IDX_FILES.items():
        (root / stem).write_bytes(_idx_bytes(arrays[key]))
    return ["data.source=idx", f"data.root={root}"]


def record_plots(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """From now on (until the test ends), record the runs' calls of ``plot_run``, draw nothing.

    Returns:
        The run directories whose plots were asked for, in order (filled as runs finish).
    """
    from shuffle_experiments import plots

    asked: list[Path] = []

    def recorded(run_dir: str | Path, plan: object = None) -> list[Path]:
        asked.append(Path(run_dir))
        return []

    monkeypatch.setattr(plots, "plot_run", recorded)
    return asked
