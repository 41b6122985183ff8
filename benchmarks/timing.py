"""Interleaved timing: the one helper every published comparison in ``benchmarks/`` uses.

A comparison measured in separate windows (A's rounds, then B's) compares the machine's load
at two times as much as A and B. This helper runs the contenders **round by round**: round
``r`` runs every contender once, in the given order on even rounds and reversed on odd rounds
(A B, B A, A B, ...: each contender runs as often first as last), after ``warmup`` rounds that
are run the same way and not kept. It records the load before, during and after, flags the
result **busy** when other processes used more than ``busy_threshold`` of a core, and reports
per contender the median, min and max seconds, and against a baseline the ratio of medians,
the ratio of minimums and the range of the per-round ratios (each round's two samples were
taken next to each other).

Stdlib only (no torch or numpy import), so that ``benchmarks/pfl_round.py`` can use it under
another interpreter and the start-up benchmark's parent stays light.

API
---
* :func:`per_core` pins this process to one CPU (the least busy one by default) and limits it
  and its children to ``threads`` threads; call it before importing torch or numpy so that
  their thread pools see the limits (``torch.set_num_threads`` is called too if torch is
  already imported).
* :func:`compare` ``(contenders, *, rounds, warmup=1, baseline=None, title="", ...)``:
  ``contenders`` maps a name to a callable taking no argument or the round index
  (``0 .. warmup + rounds - 1``, the same for every contender in a round, so that paths driven
  by the same seed train the same clients). The helper times each call with
  ``time.perf_counter``; a callable that times itself returns its seconds (a number) or a
  mapping with ``"seconds"`` and anything else worth keeping (stored per round under
  ``"extras"``). It prints a table and returns a JSON-ready dict (see :func:`compare`).
* :func:`compare_commands` ``(commands, *, rounds, warmup=1, ...)``: the whole-process mode;
  each contender is a command line run to completion in a fresh process per round (wall time
  from the start of the process to its exit, as a user sees it), with its peak RSS and exit
  status.
* :class:`RoundWorker` drives a contender living in another process (another interpreter, its
  own memory record) round by round over a pipe; :func:`serve_rounds` is the worker's side
  (:func:`next_round` and :func:`answer` for a worker whose framework runs its own loop).
  Their CPU time counts as this comparison's own when the load of other processes is computed.
  :func:`pin_pids` pins workers that were set up unpinned.
* :class:`ThreadedRounds` makes a framework that runs its own loop of rounds (with a callback
  at each round boundary) into a contender timed one round per call.
* :func:`probe` records the load while sleeping; :func:`write_json` writes a result (or
  several) to a file.

Load is read from ``/proc/stat`` (per-CPU busy time) and ``/proc/loadavg``: "others" is the
busy CPU time of the whole machine minus that of this process, its children and its workers,
in cores (1.0 = one core fully used by other processes). With a pinned run, "others on the
pinned CPU" is the same on that CPU alone: the share of our core someone else took. The busy
time comes in clock ticks (1/100 s), so a single short sample's figure is coarse; the flags use
sums over the whole run.

Run ``python benchmarks/timing.py`` for a self-check (two spin loops of known ratio, two
commands).
"""

from __future__ import annotations

import contextlib
import inspect
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = [
    "BUSY_THRESHOLD",
    "THREAD_VARS",
    "RoundWorker",
    "ThreadedRounds",
    "answer",
    "compare",
    "compare_commands",
    "machine",
    "next_round",
    "peak_rss_mib",
    "per_core",
    "pin_pids",
    "print_table",
    "probe",
    "serve_rounds",
    "thread_env",
    "write_json",
]

#: Environment variables that set the thread pools of OpenMP, OpenBLAS, MKL, Accelerate, numexpr.
THREAD_VARS = (
    "OMP_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "MKL_NUM_THREADS",
    "VECLIB_MAXIMUM_THREADS",
    "NUMEXPR_NUM_THREADS",
)
#: Other processes using more than this many cores (on average) make a result busy.
BUSY_THRESHOLD = 0.1
_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


from load import _Meter, _own_cpu_seconds, _proc_stat, _wait_quiet, probe  # noqa: E402, F401

# --------------------------------------------------------------------------- threads, pinning


def thread_env(threads: int = 1, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """Return a copy of ``base`` (default ``os.environ``), every thread pool set to ``threads``."""
    env = dict(os.environ if base is None else base)
    env.update({var: str(threads) for var in THREAD_VARS})
    return env


def _least_busy_cpu(allowed: Sequence[int], seconds: float) -> int:
    first = _proc_stat()
    time.sleep(seconds)
    last = _proc_stat()
    if first is None or last is None:
        return allowed[0]
    busy = {i: last[i][0] - first[i][0] for i in allowed if i < len(first)}
    return min(allowed, key=lambda i: (busy.get(i, 0), i))


def _set_affinity(cpus: set[int], pid: int | None = None) -> None:
    """Set the CPUs of every thread of a process (``sched_setaffinity`` acts per thread)."""
    try:
        tids = [int(t) for t in os.listdir(f"/proc/{pid or 'self'}/task")]
    except OSError:
        tids = [pid or 0]
    for tid in tids:
        with contextlib.suppress(OSError):
            os.sched_setaffinity(tid, cpus)
    if pid is None:
        os.sched_setaffinity(0, cpus)


def pin_pids(pids: Iterable[int], cpu: int | None) -> None:
    """Pin running processes (every thread) to ``cpu``; ``None`` leaves them as they are.

    For workers started unpinned, so that their set-up used every CPU, before their rounds are
    timed on the parent's CPU.
    """
    if cpu is None or not hasattr(os, "sched_setaffinity"):
        return
    for pid in pids:
        _set_affinity({cpu}, pid)


_ALLOWED = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []


def per_core(threads: int = 1, cpu: int | None = None, *, pin: bool = True) -> int | None:
    """Set up a per-core measurement: pin this process to one CPU and limit its threads.

    Sets the variables of :data:`THREAD_VARS` (seen by libraries imported later and by child
    processes, which also inherit the pinning) and calls ``torch.set_num_threads`` when torch
    is imported already. Call it before importing torch or numpy. Every thread of the process
    is moved; threads started later inherit it.

    Args:
        threads: Threads of every pool.
        cpu: The CPU to pin to; ``None`` picks the least busy allowed CPU over 0.3 s.
        pin: ``False`` gives the process back every CPU it was allowed when this module was
            imported (for multi-thread measurements) and only limits the threads.

    Returns:
        The CPU pinned to, or ``None`` when not pinned (or pinning is unavailable).
    """
    os.environ.update({var: str(threads) for var in THREAD_VARS})
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(threads)
    if not hasattr(os, "sched_setaffinity"):
        return None
    if not pin:
        _set_affinity(set(_ALLOWED))
        return None
    chosen = _least_busy_cpu(_ALLOWED, 0.3) if cpu is None else cpu
    _set_affinity({chosen})
    return chosen


def _pinned_cpu() -> int | None:
    if not hasattr(os, "sched_getaffinity"):
        return None
    cpus = os.sched_getaffinity(0)
    return next(iter(cpus)) if len(cpus) == 1 else None


def machine() -> dict[str, Any]:
    """The CPU model, core counts, Python and (if imported) torch and numpy versions."""
    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    out: dict[str, Any] = {
        "cpu": cpu,
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "affinity": sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "thread_env": {v: os.environ.get(v) for v in THREAD_VARS},
    }
    for name in ("torch", "numpy"):
        if name in sys.modules:
            out[name] = getattr(sys.modules[name], "__version__", "?")
    if "torch" in sys.modules:
        out["torch_threads"] = sys.modules["torch"].get_num_threads()
    return out


# --------------------------------------------------------------------------- interleaving


def _takes_round(fn: Callable[..., Any]) -> bool:
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return True
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return any(
        p.kind == inspect.Parameter.VAR_POSITIONAL
        or (p.kind in positional and p.default is inspect.Parameter.empty)
        for p in params
    )


def _stats(values: Sequence[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def compare(
    contenders: Mapping[str, Callable[..., Any]],
    *,
    rounds: int,
    warmup: int = 1,
    baseline: str | None = None,
    title: str = "",
    probe_s: float = 1.0,
    busy_threshold: float = BUSY_THRESHOLD,
    wait_quiet_s: float = 0.0,
    pids: Callable[[], Iterable[int]] | None = None,
    show: bool = True,
    progress: bool = True,
) -> dict[str, Any]:
    """Time ``contenders`` interleaved round by round; print a table, return the record.

    Round ``r`` (warm-up rounds first) calls every contender once: in the given order when
    ``r`` is even, reversed when odd. Nothing about the process is changed here: pin and limit
    threads first with :func:`per_core`; the record says what was in force.

    Args:
        contenders: Name -> callable of no argument or of the round index. It returns ``None``
            (timed here), its own seconds, or a mapping with ``"seconds"`` (``None``: timed
            here) and extras kept per round.
        rounds: Timed rounds (an even number balances the order).
        warmup: Rounds run first and not kept.
        baseline: The contender ratios are against (default: the first).
        title: Printed above the table and kept in the record.
        probe_s: Seconds of the idle load probes before and after.
        busy_threshold: Cores of other processes' use above which the result is flagged busy.
        wait_quiet_s: Before starting, wait up to this long for a quiet probe window.
        pids: Returns the ids of live processes doing the contenders' work (their CPU time is
            ours); :class:`RoundWorker` contenders are added automatically.
        show: Print the table.
        progress: Print one line per round to stderr.

    Returns:
        ``{"title", "rounds", "warmup", "order", "baseline", "machine", "pinned_cpu",
        "load": {"before", "during", "after"}, "busy", "busy_reasons",
        "contenders": {name: {"seconds": [...], "median", "min", "max", "others_cores": [...],
        "extras"?}}, "ratios": {name: {"median", "min", "per_round": {"median", "min", "max"}}}}``;
        seconds are per timed round in round order; ratios are contender / baseline times.
    """
    if not contenders:
        raise ValueError("contenders must name at least one callable. Found none.")
    if rounds < 1 or warmup < 0:
        raise ValueError(f"rounds must be >= 1 and warmup >= 0. Found {rounds}, {warmup}.")
    names = list(contenders)
    baseline = names[0] if baseline is None else baseline
    if baseline not in contenders:
        raise ValueError(f"baseline must be one of {names}. Found {baseline!r}.")
    workers = [c for c in contenders.values() if isinstance(c, RoundWorker)]

    def live_pids() -> list[int]:
        extra = list(pids()) if pids is not None else []
        return extra + [w.pid for w in workers if w.pid is not None]

    calls = {n: (fn, _takes_round(fn)) for n, fn in contenders.items()}
    pinned = _pinned_cpu()
    waited = _wait_quiet(wait_quiet_s, busy_threshold, probe_s) if wait_quiet_s > 0 else 0.0
    before = probe(probe_s, live_pids())
    before["waited_for_quiet_s"] = waited
    during = _Meter(live_pids)
    seconds: dict[str, list[float]] = {n: [] for n in names}
    others: dict[str, list[float | None]] = {n: [] for n in names}
    extras: dict[str, list[Any]] = {n: [] for n in names}
    started = time.time()
    for r in range(warmup + rounds):
        order = names if r % 2 == 0 else names[::-1]
        for name in order:
            fn, with_round = calls[name]
            first = during.read()
            t0 = time.perf_counter()
            out = fn(r) if with_round else fn()
            wall = time.perf_counter() - t0
            last = during.read()
            if r < warmup:
                continue
            record = during.add(first, last)
            extra = None
            if isinstance(out, Mapping):
                extra = {k: v for k, v in out.items() if k != "seconds"}
                out = out.get("seconds")
            number = isinstance(out, (int, float)) and not isinstance(out, bool)
            took = float(out) if number else wall
            seconds[name].append(took)
            others[name].append(record.get("others_cores"))
            extras[name].append(extra)
        if progress:
            kind = "warm-up" if r < warmup else "round"
            shown = ", ".join(f"{n} {seconds[n][-1]:.4g}" for n in names if r >= warmup)
            print(f"  [{title or 'timing'}] {kind} {r + 1}/{warmup + rounds} {shown}",
                  file=sys.stderr, flush=True)  # fmt: skip
    after = probe(probe_s, live_pids())
    load = {"before": before, "during": during.summary(pinned), "after": after}
    reasons = _busy_reasons(load, busy_threshold)
    table: dict[str, Any] = {}
    for name in names:
        entry: dict[str, Any] = {"seconds": seconds[name], **_stats(seconds[name])}
        entry["others_cores"] = others[name]
        if any(e is not None for e in extras[name]):
            entry["extras"] = extras[name]
        table[name] = entry
    base = seconds[baseline]
    ratios = {}
    for name in names:
        mine = seconds[name]
        paired = [a / b for a, b in zip(mine, base, strict=True) if b > 0]
        ratios[name] = {
            "median": statistics.median(mine) / statistics.median(base),
            "min": min(mine) / min(base),
            "per_round": _stats(paired) if paired else None,
        }
    result = {
        "title": title,
        "started": time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(started)),
        "rounds": rounds,
        "warmup": warmup,
        "order": "interleaved round by round, alternating (ABBA)",
        "baseline": baseline,
        "machine": machine(),
        "pinned_cpu": pinned,
        "busy_threshold_cores": busy_threshold,
        "load": load,
        "busy": bool(reasons),
        "busy_reasons": reasons,
        "contenders": table,
        "ratios": ratios,
    }
    if show:
        print_table(result)
    return result


def _busy_reasons(load: Mapping[str, Any], threshold: float) -> list[str]:
    reasons = []
    for when in ("before", "during", "after"):
        cores = load[when].get("others_cores")
        if cores is not None and cores > threshold:
            reasons.append(f"{when}: other processes used {cores:.2f} cores")
    pinned = load["during"].get("others_on_pinned_cpu")
    if pinned is not None and pinned > threshold:
        reasons.append(f"during: other processes took {pinned:.0%} of the pinned CPU")
    if load["before"].get("others_cores") is None:
        reasons.append("load unknown (no /proc/stat)")
    return reasons


def _load_line(load: Mapping[str, Any]) -> str:
    def part(when: str) -> str:
        rec = load[when]
        cores = rec.get("others_cores")
        text = f"others {cores:.2f} cores" if cores is not None else "others ?"
        if "per_cpu_busy" in rec:
            text += " (CPU busy " + ", ".join(f"{b:.0%}" for b in rec["per_cpu_busy"]) + ")"
        if "loadavg" in rec:
            text += f", loadavg {rec['loadavg'][0]:.2f}"
        if rec.get("others_on_pinned_cpu") is not None:
            text += f", {rec['others_on_pinned_cpu']:.0%} of the pinned CPU"
        return f"{when}: {text}"

    return "; ".join(part(w) for w in ("before", "during", "after"))


def print_table(result: Mapping[str, Any], file: Any = None) -> None:
    """Print a record of :func:`compare` as a Markdown table with its load line and flag."""
    file = sys.stdout if file is None else file
    m = result["machine"]
    pinned = result["pinned_cpu"]
    where = f"pinned to CPU {pinned}" if pinned is not None else f"CPUs {m.get('affinity')}"
    threads = m.get("torch_threads", m["thread_env"].get("OMP_NUM_THREADS"))
    print(f"\n## {result['title']}" if result["title"] else "", file=file)
    print(
        f"{m['cpu']}; {where}, {threads} thread(s); median of {result['rounds']} rounds after "
        f"{result['warmup']} warm-up, {result['order']}; baseline: {result['baseline']}\n",
        file=file,
    )
    print("| contender | median s | min s | max s | x baseline (medians) | x baseline (mins) "
          "| x baseline per round |", file=file)  # fmt: skip
    print("|---|---:|---:|---:|---:|---:|---:|", file=file)
    for name, entry in result["contenders"].items():
        ratio = result["ratios"][name]
        per = ratio["per_round"]
        span = f"{per['min']:.2f}-{per['max']:.2f}" if per else ""
        print(
            f"| {name} | {entry['median']:.4f} | {entry['min']:.4f} | {entry['max']:.4f} | "
            f"{ratio['median']:.2f} | {ratio['min']:.2f} | {span} |",
            file=file,
        )
    print(f"\nload: {_load_line(result['load'])}", file=file)
    if result["busy"]:
        print("BUSY: " + "; ".join(result["busy_reasons"]) + " -- treat the timings with care",
              file=file)  # fmt: skip
    else:
        print(f"quiet: other processes stayed under {result['busy_threshold_cores']} of a core",
              file=file)  # fmt: skip


# --------------------------------------------------------------------------- whole processes


def compare_commands(
    commands: Mapping[str, Sequence[str]],
    *,
    rounds: int,
    warmup: int = 1,
    env: Mapping[str, str] | None = None,
    baseline: str | None = None,
    **options: Any,
) -> dict[str, Any]:
    """Time whole processes interleaved: each round runs every command once, to its exit.

    Output is discarded. The seconds are the wall time from the start of the process to its
    exit as this process sees it. Each contender's record also gets ``peak_rss_mib`` (the
    largest of its runs, from ``wait4``) and ``returncode`` (which must be the same in every
    run, else ``RuntimeError``).

    Args:
        commands: Name -> argument vector.
        rounds: Timed rounds; warmup: untimed rounds first.
        env: Environment of the commands (default: :func:`thread_env` of 1 thread).
        baseline: As in :func:`compare`.
        **options: Passed on to :func:`compare`.

    Returns:
        The record of :func:`compare`, with ``"commands"`` and the two fields above.
    """
    env = dict(thread_env(1) if env is None else env)
    peaks: dict[str, float] = {}
    codes: dict[str, int] = {}

    def runner(name: str, argv: Sequence[str]) -> Callable[[], float]:
        def run() -> float:
            start = time.perf_counter()
            proc = subprocess.Popen(
                list(argv), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
            )
            _, status, usage = os.wait4(proc.pid, 0)
            took = time.perf_counter() - start
            proc.returncode = os.waitstatus_to_exitcode(status)
            peaks[name] = max(peaks.get(name, 0.0), usage.ru_maxrss / 1024)
            if codes.setdefault(name, proc.returncode) != proc.returncode:
                raise RuntimeError(
                    f"{name}: exit status {proc.returncode}, earlier {codes[name]} ({argv})"
                )
            return took

        return run

    result = compare(
        {name: runner(name, argv) for name, argv in commands.items()},
        rounds=rounds,
        warmup=warmup,
        baseline=baseline,
        **options,
    )
    for name, entry in result["contenders"].items():
        entry["peak_rss_mib"] = peaks.get(name)
        entry["returncode"] = codes.get(name)
    result["commands"] = {name: list(argv) for name, argv in commands.items()}
    result["mode"] = "whole process"
    return result


from workers import (  # noqa: E402 - re-exported for the scripts
    RoundWorker,
    ThreadedRounds,
    answer,
    next_round,
    peak_rss_mib,
    serve_rounds,
)


def write_json(path: str | os.PathLike[str], payload: Any) -> None:
    """Write ``payload`` (records of :func:`compare`, settings) as indented JSON."""

    def default(value: Any) -> Any:
        if hasattr(value, "item"):
            return value.item()
        if isinstance(value, (set, tuple)):
            return list(value)
        if isinstance(value, float) and not math.isfinite(value):
            return None
        return str(value)

    Path(path).write_text(json.dumps(payload, indent=2, default=default) + "\n")


# --------------------------------------------------------------------------- self-check


def _spin(seconds: float) -> Callable[[], None]:
    def run() -> None:
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            pass

    return run


def main() -> None:
    """Self-check: two spin loops of known ratio, the order, two whole processes."""
    cpu = per_core(1)
    calls: list[str] = []

    def traced(name: str, fn: Callable[[], None]) -> Callable[[int], None]:
        def run(r: int) -> None:
            calls.append(name)
            fn()

        return run

    result = compare(
        {"spin 20 ms": traced("a", _spin(0.02)), "spin 40 ms": traced("b", _spin(0.04))},
        rounds=4,
        warmup=1,
        title="self-check: spin loops",
        probe_s=0.3,
        progress=False,
    )
    assert calls == ["a", "b", "b", "a", "a", "b", "b", "a", "a", "b"], calls
    ratio = result["ratios"]["spin 40 ms"]["median"]
    print(f"pinned to CPU {cpu}; ratio of the spin loops {ratio:.3f} (expected 2)")
    commands = {
        "python -c pass": [sys.executable, "-c", "pass"],
        "python -c 'import json'": [sys.executable, "-c", "import json"],
    }
    out = compare_commands(commands, rounds=4, title="self-check: processes", probe_s=0.3,
                           progress=False)  # fmt: skip
    peak = out["contenders"]["python -c pass"]["peak_rss_mib"]
    print(f"peak RSS of python -c pass: {peak:.0f} MiB")


if __name__ == "__main__":
    main()
