"""A dataset as checked arrays: :class:`DatasetArrays`, and the checks of each array.

What every loader of the registry (:mod:`.datasets`) returns, whoever wrote it: training and
test examples ``(N, *S)`` converted to ``float32`` and finite, labels converted to ``int64`` in
``[0, num_classes)``, an optional client id per training example (ids ``0 .. K - 1``, none
empty) and optional public normalisation constants. Every problem is one line naming the array
and what was expected (:class:`DatasetError`, a ``ValueError``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["MAX_CLASSES", "DatasetArrays", "DatasetError", "client_ids", "is_int"]

#: The most classes a dataset may have (the models' output size).
MAX_CLASSES = 100_000


class DatasetError(ValueError):
    """A dataset that is unknown, missing or malformed; the message is one line."""


def is_int(array: np.ndarray) -> bool:
    """Return whether ``array`` holds integers (bools are not)."""
    return np.issubdtype(array.dtype, np.integer) and array.dtype != bool


def _examples(name: str, x: Any, where: str) -> np.ndarray:
    """Return ``x`` as a float32 array ``(N, *S)`` with finite values, or refuse it."""
    array = np.asarray(x)
    if array.dtype == bool or not (is_int(array) or np.issubdtype(array.dtype, np.floating)):
        raise DatasetError(f"{where}{name} must hold floats or integers, got dtype {array.dtype}")
    if array.ndim < 2 or array.shape[0] == 0:
        raise DatasetError(
            f"{where}{name} must have shape (N, *S): N >= 1 examples of at least one dimension, "
            f"got shape {array.shape}"
        )
    array = array.astype(np.float32, copy=False)
    # A float64 sum of float32 values cannot overflow, so it is finite exactly when every
    # value is: one pass and no array of flags.
    if not np.isfinite(array.sum(dtype=np.float64)):
        bad = int(np.flatnonzero(~np.isfinite(array.reshape(array.shape[0], -1)).all(1))[0])
        raise DatasetError(f"{where}{name} must be finite, got nan or inf in example {bad}")
    return array


def _labels(name: str, y: Any, examples: int, classes: int, where: str) -> np.ndarray:
    """Return ``y`` as int64 labels ``(examples,)`` in ``[0, classes)``, or refuse it."""
    array = np.asarray(y)
    if not is_int(array):
        raise DatasetError(f"{where}{name} must hold integers, got dtype {array.dtype}")
    if array.shape != (examples,):
        raise DatasetError(
            f"{where}{name} must have shape ({examples},) (one label per example), got "
            f"{array.shape}"
        )
    low, high = int(array.min()), int(array.max())
    if low < 0 or high >= classes:
        bad = low if low < 0 else high
        raise DatasetError(
            f"{where}{name} must be in [0, {classes - 1}] (num_classes {classes}), got {bad}"
        )
    return array.astype(np.int64, copy=False)


def client_ids(ids: Any, examples: int, where: str) -> np.ndarray:
    """Return ``ids`` as int64 client ids ``0 .. K - 1`` of every example, none empty.

    Args:
        ids: One client id per training example.
        examples: The number of training examples.
        where: The start of every message (where the arrays come from).

    Returns:
        The ids as ``int64``.

    Raises:
        DatasetError: for ids that are not integers, one per example, in range, and numbering
            every client ``0 .. K - 1`` with at least one example each.
    """
    array = np.asarray(ids)
    if not is_int(array):
        raise DatasetError(f"{where}train_client must hold integers, got dtype {array.dtype}")
    if array.shape != (examples,):
        raise DatasetError(
            f"{where}train_client must have shape ({examples},) (the client of every training "
            f"example), got {array.shape}"
        )
    low, high = int(array.min()), int(array.max())
    if low < 0 or high >= examples:
        raise DatasetError(
            f"{where}train_client must give every example a client id in [0, {examples - 1}], "
            f"got {low if low < 0 else high}"
        )
    counts = np.bincount(array.astype(np.int64, copy=False), minlength=high + 1)
    if (counts == 0).any():
        raise DatasetError(
            f"{where}train_client must number the clients 0 .. {high} with every client "
            f"holding an example, got no example for client {int(np.flatnonzero(counts == 0)[0])}"
        )
    return array.astype(np.int64, copy=False)


@dataclass(frozen=True)
class DatasetArrays:
    """A dataset as arrays, checked when built (every problem one :class:`DatasetError` line).

    Attributes:
        train_x: Training examples, ``(N, *S)``, converted to ``float32``; finite.
        train_y: Their labels, ``(N,)``, converted to ``int64``; in ``[0, num_classes)``.
        test_x: Test examples, ``(M, *S)`` with the same ``S``.
        test_y: Their labels, ``(M,)``.
        num_classes: Number of classes (>= 2), the size of the models' output.
        train_client: The client id of every training example (``(N,)``, ids ``0 .. K - 1``,
            none empty), or ``None``: the partition ``clients.partition: dataset`` uses.
        mean: Public mean for ``data.normalize: standard`` (``None``: the dataset has none).
        std: Public standard deviation (> 0) for ``data.normalize: standard``.
        source: Where the arrays came from, for messages.
    """

    train_x: np.ndarray
    train_y: np.ndarray
    test_x: np.ndarray
    test_y: np.ndarray
    num_classes: int
    train_client: np.ndarray | None = None
    mean: float | None = None
    std: float | None = None
    source: str = ""

    def __post_init__(self) -> None:
        """Check and convert the arrays (see the attributes).

        Raises:
            DatasetError: one line naming the array and what was expected.
        """
        where = f"{self.source}: " if self.source else ""
        classes = self.num_classes
        if isinstance(classes, np.integer):
            classes = int(classes)
        if not isinstance(classes, int) or isinstance(classes, bool):
            raise DatasetError(f"{where}num_classes must be an integer, got {classes!r}")
        if not 2 <= classes <= MAX_CLASSES:
            raise DatasetError(f"{where}num_classes must be in [2, {MAX_CLASSES}], got {classes}")
        train_x = _examples("train_x", self.train_x, where)
        test_x = _examples("test_x", self.test_x, where)
        if test_x.shape[1:] != train_x.shape[1:]:
            raise DatasetError(
                f"{where}test_x must have the examples' shape {train_x.shape[1:]} of train_x, "
                f"got {test_x.shape[1:]}"
            )
        n = train_x.shape[0]
        values: dict[str, Any] = {
            "num_classes": classes,
            "train_x": train_x,
            "test_x": test_x,
            "train_y": _labels("train_y", self.train_y, n, classes, where),
            "test_y": _labels("test_y", self.test_y, test_x.shape[0], classes, where),
        }
        if self.train_client is not None:
            values["train_client"] = client_ids(self.train_client, n, where)
        if (self.mean is None) != (self.std is None):
            raise DatasetError(f"{where}mean and std must be given together, got one of them")
        if self.mean is not None:
            mean, std = float(self.mean), float(self.std)  # type: ignore[arg-type]
            if not (np.isfinite(mean) and np.isfinite(std) and std > 0):
                raise DatasetError(
                    f"{where}mean must be finite and std finite and > 0, got mean {mean!r}, "
                    f"std {std!r}"
                )
            values.update(mean=mean, std=std)
        for key, value in values.items():
            object.__setattr__(self, key, value)

    @property
    def input_shape(self) -> tuple[int, ...]:
        """The shape ``S`` of one example."""
        return tuple(int(d) for d in self.train_x.shape[1:])
