"""What a run prints: the header before training, and its progress (a bar, or plain lines).

On a terminal the progress is a tqdm bar; when stderr is a file (a batch job's log) it is one
plain line every 5% of the rounds or every minute, whichever comes first, so that the log stays
readable. ``training.threads: auto`` is resolved here from the cores this process may use and
the machine's load.
"""

from __future__ import annotations

import math
import os
import sys
import time
from collections.abc import Callable
from typing import Any

__all__ = ["Progress", "auto_threads", "machine_load", "progress", "usable_cores"]

#: Seconds between two plain progress lines at most.
_LINE_SECONDS = 60.0


def usable_cores() -> int:
    """Return the number of cores this process may run on (its CPU affinity).

    Returns:
        At least 1.
    """
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


def machine_load() -> float | None:
    """Return the machine's one-minute load average (``None`` where it is not available).

    Returns:
        The load average.
    """
    try:
        return float(os.getloadavg()[0])
    except (AttributeError, OSError):  # pragma: no cover - not POSIX
        return None


def auto_threads() -> int:
    """Return the threads ``training.threads: auto`` takes: usable cores minus busy ones.

    On a shared machine more threads than free cores make every round wait for the busiest
    core (measured on 2 cores with one busy: 1.86 s per quick.yaml round with 2 threads, 0.48 s
    with 1).

    Returns:
        ``max(1, usable cores - round(load average))``, at most the usable cores.
    """
    cores = usable_cores()
    load = machine_load()
    busy = 0 if load is None else int(round(load))
    return max(1, min(cores, cores - busy))


def _duration(seconds: float) -> str:
    """Return ``seconds`` as ``1h02m``, ``3m05s`` or ``12s``."""
    whole = int(round(seconds))
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m"
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


class Progress:
    """Plain progress lines for a log file (the tqdm calls the runner makes, nothing more)."""

    def __init__(self, total: int, initial: int, echo: Callable[[str], None]) -> None:
        """Start counting at ``initial`` of ``total`` rounds.

        Args:
            total: Rounds of the run.
            initial: Rounds already done.
            echo: Where the lines go.
        """
        self.total, self.n, self.echo = total, initial, echo
        self.step = max(1, total // 20)
        self.started = time.monotonic()
        self.last = self.started
        self.first = initial
        self.postfix: dict[str, str] = {}

    def update(self, count: int) -> None:
        """Count ``count`` more rounds; print a line when one is due.

        A line is due after the session's first round (so a log shows progress within seconds
        of the header), every ``total / 20`` rounds, at the last round, and at least once a
        minute. It gives the rounds done, the speed in rounds per second and the time left.
        """
        before = self.n
        self.n += count
        now = time.monotonic()
        due = before == self.first or self.n // self.step > before // self.step
        if due or self.n == self.total or now - self.last >= _LINE_SECONDS:
            per_round = (now - self.started) / max(1, self.n - self.first)
            speed = 1.0 / per_round if per_round > 0 else math.inf
            left = _duration(per_round * (self.total - self.n))
            extra = " ".join(f"{k}={v}" for k, v in self.postfix.items())
            self.echo(
                f"round {self.n}/{self.total}  {speed:.3g} rounds/s  {left} left  {extra}".rstrip()
            )
            self.last = now

    def set_postfix(self, values: dict[str, str], refresh: bool = False) -> None:
        """Keep the values shown with the next line."""
        self.postfix = dict(values)

    def close(self) -> None:
        """Nothing to release."""


def progress(total: int, initial: int, enabled: bool, echo: Callable[[str], None]) -> Any:
    """Return a tqdm bar on a terminal, :class:`Progress` lines otherwise.

    Args:
        total: Rounds of the run.
        initial: Rounds already done.
        enabled: ``False`` shows nothing (a disabled bar).
        echo: Where plain lines go.

    Returns:
        An object with ``update``, ``set_postfix`` and ``close``.
    """
    from tqdm.auto import tqdm

    if enabled and not sys.stderr.isatty():
        return Progress(total, initial, echo)
    return tqdm(
        total=total,
        initial=initial,
        unit="round",
        disable=not enabled,
        dynamic_ncols=True,
        smoothing=0.05,
    )
