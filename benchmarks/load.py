"""Load records: CPU time of the machine, of our processes and of the others, from /proc/stat.

A benchmark result is flagged busy when other processes used more than a threshold of a core
before, during or after it (:func:`probe`, :class:`_Meter`); :mod:`timing` uses them.
"""

from __future__ import annotations

import os
import resource
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100

__all__ = ["probe"]


def _proc_stat() -> list[tuple[int, int]] | None:
    """Per-CPU ``(busy, total)`` clock ticks from ``/proc/stat``, or ``None`` off Linux."""
    try:
        lines = Path("/proc/stat").read_text().splitlines()
    except OSError:
        return None
    cpus = []
    for line in lines:
        if line.startswith("cpu") and line[3:4].isdigit():
            fields = [int(v) for v in line.split()[1:]]
            # user nice system idle iowait irq softirq steal (guest time is inside user).
            idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
            total = sum(fields[:8])
            cpus.append((total - idle, total))
    return cpus


def _pid_cpu_seconds(pid: int) -> float:
    """User + system seconds of a live process (all its threads), 0 when it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0
    fields = text.rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICK


def _own_cpu_seconds(pids: Iterable[int]) -> float:
    """CPU seconds of this process, its reaped children and the live ``pids``."""
    me = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    total = me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime
    return total + sum(_pid_cpu_seconds(p) for p in pids)


class _Meter:
    """Busy time of every CPU and of our own processes between two readings."""

    def __init__(self, pids: Callable[[], Iterable[int]]) -> None:
        self._pids = pids
        self.reset()

    def reset(self) -> None:
        self.wall = self.own = 0.0
        self.busy: list[float] | None = None

    def read(self) -> tuple[float, list[tuple[int, int]] | None, float]:
        return time.perf_counter(), _proc_stat(), _own_cpu_seconds(self._pids())

    def add(self, first: tuple, last: tuple) -> dict[str, Any]:
        """Accumulate the interval ``first .. last``; return its own record."""
        wall = last[0] - first[0]
        own = max(0.0, last[2] - first[2])
        record: dict[str, Any] = {"wall_s": wall}
        if first[1] is not None and last[1] is not None:
            busy = [(b1 - b0) / _TICK for (b0, _), (b1, _) in zip(first[1], last[1], strict=True)]
            record["others_cores"] = max(0.0, sum(busy) - own) / wall if wall > 0 else 0.0
            if self.busy is None:
                self.busy = [0.0] * len(busy)
            self.busy = [a + b for a, b in zip(self.busy, busy, strict=True)]
        self.wall += wall
        self.own += own
        return record

    def summary(self, pinned: int | None) -> dict[str, Any]:
        out: dict[str, Any] = {"wall_s": self.wall, "own_cpu_s": self.own}
        if self.busy is None or self.wall <= 0:
            out["others_cores"] = None
            return out
        out["per_cpu_busy"] = [round(b / self.wall, 3) for b in self.busy]
        out["others_cores"] = max(0.0, sum(self.busy) - self.own) / self.wall
        if pinned is not None and pinned < len(self.busy):
            # Pinned: our processes ran on that CPU only, so the rest of its busy time is others'.
            out["others_on_pinned_cpu"] = max(0.0, self.busy[pinned] - self.own) / self.wall
        return out


def probe(seconds: float = 1.0, pids: Iterable[int] = ()) -> dict[str, Any]:
    """Load while this process sleeps ``seconds``: load averages, per-CPU busy, others in cores."""
    pids = list(pids)
    meter = _Meter(lambda: pids)
    first = meter.read()
    time.sleep(seconds)
    meter.add(first, meter.read())
    out = meter.summary(None)
    out["loadavg"] = list(os.getloadavg())
    return out


def _wait_quiet(limit_s: float, threshold: float, window_s: float) -> float:
    """Wait (up to ``limit_s``) for a window in which others use < ``threshold`` cores."""
    start = time.perf_counter()
    while time.perf_counter() - start < limit_s:
        others = probe(window_s)["others_cores"]
        if others is None or others < threshold:
            break
    return time.perf_counter() - start
