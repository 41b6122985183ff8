"""The files of a run directory, written so that every failure is one line naming the file.

A write that fails (a full disk, ``ENOSPC``; a file-size limit, ``EFBIG``) raises
:class:`RunFileError`: ``cannot write PATH (CAUSE)``. The operating system names no file when
a ``write`` or ``flush`` fails, so without this the error would read ``[Errno 28] No space left
on device`` and leave the user to guess which file. Whole files (``summary.json``, the plots,
``config.yaml``, the rewritten ``metrics.csv``, checkpoints) go through a temporary file and a
rename (:func:`write_file`): a failed write leaves no temporary file and the previous version
of the file as it was. Rows are appended to ``metrics.csv`` through :class:`AppendedFile`.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from types import TracebackType
from typing import IO

__all__ = [
    "RunFileError",
    "AppendedFile",
    "cause",
    "write_file",
    "METRICS_FILE",
    "CHECKPOINT_FILE",
    "CONFIG_FILE",
    "SUMMARY_FILE",
    "PLOT_STEMS",
    "PLOT_FILES",
]

METRICS_FILE = "metrics.csv"
CHECKPOINT_FILE = "checkpoint.pt"
CONFIG_FILE = "config.yaml"
SUMMARY_FILE = "summary.json"
#: The figures of :mod:`shuffle_experiments.plots`: each a PNG and a CSV of its points.
PLOT_STEMS = ("accuracy_vs_epsilon", "epsilon_vs_rounds")
PLOT_FILES = tuple(f"{stem}.{ext}" for stem in PLOT_STEMS for ext in ("csv", "png"))


class RunFileError(OSError):
    """A file of the run cannot be written; the message is one line naming it and the cause."""


def cause(exc: BaseException) -> str:
    """Return the cause of a failure in words: the OS message, else the first line.

    Args:
        exc: The exception.

    Returns:
        ``exc.strerror`` for an ``OSError`` that has one (``No space left on device``), else
        the first line of the message, else the exception's type name.
    """
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def write_file(path: Path, data: bytes | str, *, note: str = "") -> None:
    """Write ``data`` to ``path.tmp``, then rename it onto ``path``.

    Args:
        path: The file to write.
        data: Its whole content; a string is encoded as UTF-8 (line endings as given).
        note: Appended to the error message (for example what was kept).

    Raises:
        RunFileError: ``cannot write PATH (CAUSE)``; the temporary file is removed and an
            existing ``path`` is left as it was.
    """
    tmp = path.with_name(path.name + ".tmp")
    payload = data.encode("utf-8") if isinstance(data, str) else data
    try:
        with open(tmp, "wb") as fh:
            fh.write(payload)
        os.replace(tmp, path)
    except OSError as exc:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise RunFileError(f"cannot write {path} ({cause(exc)}){note}") from None


class AppendedFile:
    """A text file opened for appending whose failures name it (:class:`RunFileError`).

    It has what :mod:`csv` writers need (``write``) and ``flush``; use it as a context manager.

    Args:
        path: The file; created if it does not exist.

    Raises:
        RunFileError: if it cannot be opened.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            self._fh: IO[str] = open(path, "a", newline="", encoding="utf-8")
        except OSError as exc:
            raise RunFileError(f"cannot write {path} ({cause(exc)})") from None

    def write(self, text: str) -> int:
        """Append ``text``.

        Args:
            text: What to append.

        Returns:
            The number of characters written.

        Raises:
            RunFileError: naming the file and the cause.
        """
        try:
            return self._fh.write(text)
        except OSError as exc:
            raise RunFileError(f"cannot write {self.path} ({cause(exc)})") from None

    def flush(self) -> None:
        """Write what is buffered to the file.

        Raises:
            RunFileError: naming the file and the cause.
        """
        try:
            self._fh.flush()
        except OSError as exc:
            raise RunFileError(f"cannot write {self.path} ({cause(exc)})") from None

    def close(self) -> None:
        """Flush and close the file.

        Raises:
            RunFileError: naming the file and the cause, if the buffered rows cannot be written.
        """
        try:
            self._fh.close()
        except OSError as exc:
            raise RunFileError(f"cannot write {self.path} ({cause(exc)})") from None

    def __enter__(self) -> AppendedFile:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if kind is None:
            self.close()
            return
        # Already failing: that error is the one to report; the file is closed regardless.
        with contextlib.suppress(OSError):
            self._fh.close()
