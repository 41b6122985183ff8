"""The run directory: a fresh timestamped directory, its lock, the ``latest`` link, temporaries."""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import yaml

from .config import ConfigError, ExperimentConfig
from .files import (
    CHECKPOINT_FILE,
    CONFIG_FILE,
    METRICS_FILE,
    PLOT_FILES,
    SUMMARY_FILE,
    RunFileError,
    write_file,
)
from .files import cause as _cause

__all__ = ["new_run_dir"]


def new_run_dir(config: ExperimentConfig) -> Path:
    """Create a fresh ``output_dir/name/<timestamp>[-k]`` directory.

    The name is claimed with an exclusive ``mkdir``, so two runs started in the same second get
    different directories. ``latest`` is pointed at the directory by :func:`run` once its
    ``config.yaml`` is written (see :func:`_point_latest_at`).

    Returns:
        The new, empty directory.
    """
    parent = Path(config.output_dir) / config.name
    _make_dir(parent, "output_dir")
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    suffix = 1
    while True:
        run_dir = parent / (stamp if suffix == 1 else f"{stamp}-{suffix}")
        try:
            run_dir.mkdir()
            return run_dir
        except FileExistsError:
            suffix += 1
        except OSError as exc:
            raise ConfigError(
                f"output_dir: cannot create the run directory {run_dir} ({_cause(exc)})"
            ) from None


def _make_dir(path: Path, what: str) -> None:
    """Create a directory (and its parents); a failure is one ConfigError line naming ``what``."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"{what}: cannot create the directory {path} ({_cause(exc)})") from None


@contextlib.contextmanager
def _run_lock(run_dir: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``run_dir`` (``flock`` on the directory itself) while training.

    Two sessions in one run directory would each rewrite ``metrics.csv`` (one's rows would
    vanish) and write the same temporary checkpoint; the second is refused instead. The lock
    needs no file and is released when the process ends, however it ends.

    Raises:
        ConfigError: if another process holds the lock, or the directory cannot be opened.
    """
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not a POSIX system: no lock
        yield
        return
    try:
        fd = os.open(run_dir, os.O_RDONLY)
    except OSError as exc:
        raise ConfigError(f"run directory {run_dir} cannot be opened ({_cause(exc)})") from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ConfigError(
                f"run directory {run_dir} is in use by another training session; wait for it to "
                f"finish (two sessions would overwrite each other's metrics and checkpoint)"
            ) from None
        yield
    finally:
        os.close(fd)


def _remove_stale_temporaries(run_dir: Path) -> None:
    """Remove the temporary files a killed session may have left (the lock is held)."""
    for name in (CHECKPOINT_FILE, METRICS_FILE, CONFIG_FILE, SUMMARY_FILE, *PLOT_FILES):
        with contextlib.suppress(FileNotFoundError):
            (run_dir / f"{name}.tmp").unlink()


def _point_latest_at(run_dir: Path) -> None:
    """Atomically point ``run_dir/../latest`` at ``run_dir`` (a relative symlink).

    The link is created under a name unique to this process and renamed over ``latest``, so a
    reader always finds either the previous run or this one, never a missing or partial link;
    it is called once the run directory holds its config. A ``latest`` that is not a symlink
    (a user's own file or directory) is left alone.

    Raises:
        RunFileError: one line naming ``latest``, if the link cannot be made.
    """
    latest = run_dir.parent / "latest"
    if latest.exists() and not latest.is_symlink():
        return
    tmp = run_dir.parent / f".latest-{os.getpid()}-{threading.get_ident()}"
    try:
        if tmp.is_symlink():
            tmp.unlink()
        tmp.symlink_to(run_dir.name)
        os.replace(tmp, latest)
    except OSError as exc:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise RunFileError(f"cannot point {latest} at {run_dir.name} ({_cause(exc)})") from None


def _write_yaml(config: ExperimentConfig, path: Path) -> None:
    write_file(path, yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False))
