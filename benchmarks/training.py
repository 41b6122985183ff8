"""Speed of one training round of the MNIST experiment (run: ``python benchmarks/training.py``).

What is measured, on CPU with one thread (``--threads``), for the tanh CNN of
``shuffle_experiments.models.build_model`` (``cnn``, 26,010 parameters, or ``--model cnn_small``)
on real MNIST (``shuffle_experiments.data.load_mnist``), cross-entropy loss with mean
reduction, plain SGD:

* ``non-private``: one round is forward + backward + ``SGD.step`` on a batch of exactly ``B``
  random training examples.
* ``hooks`` / ``functorch`` / ``ew`` / ``fast``: one check-in round of
  ``shuffle_opacus.make_private`` with ``PrivacyEngine(accountant="shuffled_checkin")``,
  n = 60,000 clients, rate = ``B / 60000``, ``noise_multiplier=5.0``, ``max_grad_norm=0.01``,
  ``sensitivity="paper"`` and the given ``grad_sample_mode``: clipping, local noise, accounting
  hook and the SGD step. ``hooks``/``functorch``/``ew`` are Opacus's per-sample gradients;
  ``fast`` is ``shuffle_opacus.engine.clipping.ClippedSumModule``, the exact clipped sum in one
  forward and one backward pass without per-sample gradients (its numerics against the per-sample
  path are in ``tests/test_clipping.py``). The round's client indices come from
  ``loader.batch_sampler`` and the tensors are indexed directly, so data collation is not
  timed; samples/s counts the round's actual participants.

Micro-batches. Every mode, private or not, is offered the same settings: the whole round and
the round in chunks of at most ``K`` examples for each ``--micro-batch K`` (default 200 and
500; ``0`` offers the whole round only). Private rounds use Opacus virtual steps
(``signal_skip_step`` on every chunk but the last), so a round is still one noisy step over all
its participants and one accountant step; non-private rounds accumulate the chunks' gradients
weighted to the batch's mean loss.

Processes. A process's speed can differ from another's by tens of percent for the same work
(memory layout, allocator state): non-private rounds in micro-batches of 500 took 0.69 s in a
process of their own against 0.48 s for micro-batches of 200 in theirs, and 0.47-0.49 s both in
one process. So every configuration of a B runs in **one** worker process (this script
re-invoking itself with ``--worker``), interleaved round by round by ``benchmarks/timing.py``
(round ``r`` of every configuration, in alternating order), and a B is measured in ``--runs``
fresh worker processes (default 2), the order of the configurations rotated from one run to the
next. The ratios are given with their spread over every round of every run. By default one
thread, the worker pinned with the parent to one CPU (``--threads 2`` for two threads,
unpinned). MNIST is loaded by a separate child and handed over as ``float32`` ``.npy`` files that
the workers map read-only. Every run warms up 2 rounds and times 8 at B <= 600, 6 above
(``--rounds``; 2 with ``--quick``, which uses B = 600 and micro-batches of 500 only). Between its
rounds a private configuration drops its per-sample gradients (``zero_grad``, not timed).

Comparisons (private samples/s over non-private samples/s, paired round by round: the two
rounds of a pair ran next to each other in the same process):

* **same setting**: each private mode against non-private at each setting;
* **best against best**: each private mode at its best setting against non-private at its best
  setting, both chosen (by the median over every run) from the same set of settings.

The goal is at least 80% best against best for ``fast``, the package's mode, named here in
advance (the best of four private modes against the one non-private mode would favour the
private side). The ratio is the median of the paired per-round ratios over all runs, shown with
their interquartile range, their min-max and each run's ratio of medians, with as many digits
as it takes for the printed number to sit on the same side of the goal as the verdict.

Load. The run is **busy**, and gets no verdict ("busy: no verdict"), when the 1-minute load
average is above ``LOADAVG_LIMIT`` (0.5) before the benchmark starts or above ``LOADAVG_LIMIT``
plus the benchmark's own threads after it (the average still holds the benchmark's own
process for a minute or so), or when ``timing.compare`` flags a run (other processes used more
than a tenth of a core before, during or after it). Both load averages are printed.

``--floor`` adds ``floor`` rows (not private): ``fast``'s round with its per-sample norms and
clipped sums replaced by zeros, so forward pass, backward pass to the layer outputs, noise, step
and accountant only, reported in the same-setting table. ``--modes fast`` leaves out Opacus's
modes.

Usage::

    python benchmarks/training.py                    # full run (B = 600 and 6000, 2 runs)
    python benchmarks/training.py --quick            # smoke run
    python benchmarks/training.py --json out.json    # also write the results as JSON
    python benchmarks/training.py --micro-batch 0    # only whole rounds
    python benchmarks/training.py --threads 2        # two threads, not pinned
    python benchmarks/training.py --batches 6000 --modes fast --runs 3   # the goal
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
import zlib
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from timing import compare, per_core, thread_env, write_json

N_CLIENTS = 60_000
WARMUP = 2
PRIVATE_MODES = ("hooks", "functorch", "ew", "fast")
NOISE_MULTIPLIER = 5.0
MAX_GRAD_NORM = 0.01
LR = 0.1
GOAL = 0.80
GOAL_MODE = "fast"
DEFAULT_MICRO_BATCHES = (200, 500)
DEFAULT_RUNS = 2
NON_PRIVATE = "non-private"
FLOOR = "floor"
#: A 1-minute load average above this before the benchmark (above it plus the benchmark's own
#: threads after it) makes the run busy: no verdict.
LOADAVG_LIMIT = 0.5


def timed_rounds(batch: int, quick: bool) -> int:
    """Timed rounds of one run at batch size ``batch``."""
    if quick:
        return 2
    return 8 if batch <= 600 else 6


def beside(value: float, threshold: float, *, scale: float = 100.0, digits: int = 2) -> str:
    """``value * scale`` with ``digits`` decimals, or more where fewer would cross ``threshold``.

    The printed number is always on the same side of ``threshold`` (compared as ``>=``) as
    ``value`` itself: 0.7996 against 0.8 prints ``79.96``, 0.79996 prints ``79.996``, never
    ``80.00`` beside "not met".
    """
    for places in range(digits, 17):
        text = f"{value * scale:.{places}f}"
        if (float(text) / scale >= threshold) == (value >= threshold):
            return text
    return repr(value * scale)


def loadavg() -> float | None:
    """The 1-minute load average, ``None`` where the platform has none."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return None


def load_verdict(
    before: float | None, after: float | None, own_threads: int, flagged: Iterable[str] = ()
) -> list[str]:
    """Why a run is busy (empty when it is quiet), from the load averages and other flags.

    Args:
        before: 1-minute load average read before the benchmark started any process.
        after: The same read after its last process ended; it still holds about
            ``own_threads`` of the benchmark's own load, which is allowed.
        own_threads: Threads the benchmark ran (its own share of ``after``).
        flagged: Reasons found by other means (``timing.compare``'s busy flags).
    """
    reasons = []
    if before is None or after is None:
        reasons.append("load average unknown")
    else:
        if before > LOADAVG_LIMIT:
            reasons.append(f"load average {before:.2f} before (limit {LOADAVG_LIMIT})")
        if after > LOADAVG_LIMIT + own_threads:
            reasons.append(
                f"load average {after:.2f} after (limit {LOADAVG_LIMIT} + {own_threads} own)"
            )
    reasons.extend(flagged)
    return reasons


def spread(values: Sequence[float]) -> dict[str, float]:
    """Median, quartiles (inclusive method) and min-max of ``values``."""
    if len(values) >= 2:
        q1, _, q3 = statistics.quantiles(values, n=4, method="inclusive")
    else:
        q1 = q3 = values[0]
    return {
        "median": statistics.median(values),
        "q1": q1,
        "q3": q3,
        "min": min(values),
        "max": max(values),
        "n": len(values),
    }


def vm_hwm_mib() -> float | None:
    """Peak RSS of this process image since exec (Linux ``VmHWM``), a cross-check."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return None


def save_data(folder: Path) -> None:
    """Write MNIST's training images (``float32`` in [0, 1], (N, 1, 28, 28)) and labels."""
    import numpy as np
    from shuffle_experiments.data import load_mnist

    train_x, train_y, _, _ = load_mnist().normalized()
    np.save(folder / "x.npy", np.ascontiguousarray(train_x, dtype=np.float32)[:, None])
    np.save(folder / "y.npy", np.asarray(train_y, dtype=np.int64))


def load_data(folder: Path):
    """Map the parent's arrays (copy-on-write: the pages stay shared between the workers)."""
    import numpy as np
    import torch

    x = torch.from_numpy(np.load(folder / "x.npy", mmap_mode="c"))
    y = torch.from_numpy(np.load(folder / "y.npy"))
    return x, y


def non_private_step(model, optimizer, xb, yb, micro_batch: int | None) -> None:
    """One round; with ``micro_batch``, gradients are accumulated chunk by chunk."""
    from torch import nn

    size = xb.shape[0]
    optimizer.zero_grad()
    if micro_batch is None or size <= micro_batch:
        nn.functional.cross_entropy(model(xb), yb).backward()
    else:
        for start in range(0, size, micro_batch):
            xc, yc = xb[start : start + micro_batch], yb[start : start + micro_batch]
            # Weight each chunk's mean loss by its share so the sum is the batch's mean loss.
            loss = nn.functional.cross_entropy(model(xc), yc) * (xc.shape[0] / size)
            loss.backward()
    optimizer.step()


def private_step(model, optimizer, xb, yb, micro_batch: int | None) -> None:
    """One round; with ``micro_batch``, per-sample gradients are computed chunk by chunk."""
    from torch import nn

    size = xb.shape[0]
    optimizer.zero_grad()
    if micro_batch is None or size <= micro_batch:
        nn.functional.cross_entropy(model(xb), yb).backward()
        optimizer.step()
        return
    for start in range(0, size, micro_batch):
        last = start + micro_batch >= size
        loss = nn.functional.cross_entropy(
            model(xb[start : start + micro_batch]), yb[start : start + micro_batch]
        )
        loss.backward()
        # Every chunk but the last only clips and accumulates; the last adds the noise of all
        # the round's reports, scales, steps and calls the accountant once.
        optimizer.signal_skip_step(do_skip=not last)
        optimizer.step()
        if not last:
            # Drops this chunk's per-sample gradients; the clipped sum is kept.
            optimizer.zero_grad()


def outputs_only(clipper: Any) -> None:
    """Make ``clipper`` stop after the backward pass to the layer outputs (the "floor" rows).

    What stays is everything the fast clipper's round shares with any exact method that
    differentiates to the layer outputs: the forward pass with its hooks, the backward pass to
    the outputs, the noise, the step and the accountant. The per-sample norms and clipped sums
    are replaced by zeros, so these rounds are **not private**: they measure what the
    per-sample work adds on top of them (``fast`` minus ``floor`` at the same setting).
    """
    import torch

    def clip_records(records, root, root_grad, max_norm, n):  # noqa: ARG001 - same signature
        torch.autograd.grad(root, [r.output for r in records], grad_outputs=root_grad)
        zeros = torch.zeros(n, dtype=root.dtype)
        return zeros, zeros, {p: torch.zeros_like(p) for p in clipper.parameters}

    clipper.clip_records = clip_records


def build_rounds(
    model_name: str,
    x,
    y,
    batch: int,
    rounds: int,
    mode: str,
    micro_batch: int | None,
    seed: int = 0,
) -> Callable[[int], dict[str, Any]]:
    """Set up one configuration; return its round: ``run(r) -> {"seconds", "participants"}``.

    Only the step is timed (the batch is indexed before). After the step the gradients (and a
    private optimizer's per-sample gradients) are dropped, untimed. Configurations sharing a
    process take distinct ``seed`` values: engines releasing the same data with the same seed
    are checked against each other every round (``SharedCoinsWarning``), which is not part of
    a private round.
    """
    import torch
    from opacus import PrivacyEngine
    from shuffle_experiments.models import build_model
    from torch.utils.data import DataLoader, TensorDataset

    import shuffle_opacus

    torch.manual_seed(0)
    model = build_model(model_name)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    if mode == NON_PRIVATE:
        generator = torch.Generator().manual_seed(0)

        def batches():
            for _ in range(rounds):
                yield torch.randperm(x.shape[0], generator=generator)[:batch]

        step = non_private_step
        order = batches()
    else:
        loader = DataLoader(TensorDataset(x, y), batch_size=batch)
        engine = PrivacyEngine(accountant="shuffled_checkin")
        floor = mode == FLOOR
        model, optimizer, loader = shuffle_opacus.make_private(
            engine,
            module=model,
            optimizer=optimizer,
            data_loader=loader,
            noise_multiplier=NOISE_MULTIPLIER,
            max_grad_norm=MAX_GRAD_NORM,
            rate=batch / N_CLIENTS,
            rounds=rounds,
            seed=seed,
            sensitivity="paper",
            grad_sample_mode="fast" if floor else mode,
        )
        if floor:
            outputs_only(model.clipper)
        step = private_step
        order = (torch.as_tensor(i, dtype=torch.long) for i in loader.batch_sampler)
    done = [0]

    def run(r: int) -> dict[str, Any]:
        if r != done[0]:
            raise RuntimeError(f"round {r} asked for, {done[0]} expected (rounds run in order)")
        idx = next(order)
        xb, yb = x[idx], y[idx]
        start = time.perf_counter()
        step(model, optimizer, xb, yb, micro_batch)
        seconds = time.perf_counter() - start
        optimizer.zero_grad(set_to_none=True)
        done[0] += 1
        return {"seconds": seconds, "participants": int(idx.numel())}

    return run


def label(mode: str, micro_batch: int | None) -> str:
    """The row name of a configuration: ``mode`` or ``mode/mbK``."""
    return mode if micro_batch is None else f"{mode}/mb{micro_batch}"


def configurations(args: argparse.Namespace, run: int) -> list[tuple[str, int | None]]:
    """Every (mode, micro-batch) of a B, in an order rotated by ``run``.

    Every mode gets the same settings: the whole round (``None``) and each ``--micro-batch``.
    """
    micro = (None, *(k for k in args.micro_batch if k))
    modes = (NON_PRIVATE, *args.modes, *((FLOOR,) if args.floor else ()))
    configs = [(mode, mb) for mb in micro for mode in modes]
    shift = run % len(configs)
    return configs[shift:] + configs[:shift]


def worker(args: argparse.Namespace) -> None:
    """One run of one B (``--worker B RUN``): every configuration in this one process.

    Writes the record of ``timing.compare`` (with refusals and this process's peak RSS) to
    ``--worker-out``; the table is left to the parent.
    """
    import torch
    from timing import peak_rss_mib

    # Notices every private round would repeat (as in the test configuration).
    warnings.filterwarnings("ignore", "Secure RNG turned off")
    warnings.filterwarnings("ignore", "Full backward hook is firing")
    torch.set_num_threads(args.threads)
    batch, run = int(args.worker[0]), int(args.worker[1])
    rounds = args.rounds or timed_rounds(batch, args.quick)
    x, y = load_data(args.data)
    contenders: dict[str, Callable[[int], dict[str, Any]]] = {}
    refused: dict[str, str] = {}
    for mode, mb in configurations(args, run):
        name = label(mode, mb)
        try:
            contenders[name] = build_rounds(
                args.model, x, y, batch, WARMUP + rounds, mode, mb, seed=zlib.crc32(name.encode())
            )
        except ValueError as err:
            refused[name] = str(err)
    result = compare(
        contenders,
        rounds=rounds,
        warmup=WARMUP,
        baseline=NON_PRIVATE,
        title=f"B = {batch}, run {run + 1}, {args.model}, {args.threads} thread(s)",
        probe_s=args.probe,
        wait_quiet_s=args.wait_quiet,
        show=False,
    )
    result.update(batch=batch, run=run, refused=refused, peak_rss_mib=peak_rss_mib(),
                  vm_hwm_mib=vm_hwm_mib())  # fmt: skip
    write_json(args.worker_out, result)


def rates(entry: dict[str, Any]) -> list[float]:
    """Samples/s of each timed round of a configuration (participants / seconds)."""
    return [e["participants"] / s for e, s in zip(entry["extras"], entry["seconds"], strict=True)]


def paired(runs: list[dict[str, Any]], mine: str, theirs: str) -> dict[str, Any]:
    """Ratios ``mine / theirs`` of samples/s: per round (pooled over runs) and per run."""
    per_round: list[float] = []
    per_run: list[float] = []
    for result in runs:
        a, b = rates(result["contenders"][mine]), rates(result["contenders"][theirs])
        per_round += [p / q for p, q in zip(a, b, strict=True)]
        per_run.append(statistics.median(a) / statistics.median(b))
    return {"private": mine, "non_private": theirs, "per_round": spread(per_round),
            "per_run": per_run}  # fmt: skip


def pooled_median(runs: list[dict[str, Any]], name: str) -> float:
    """Median samples/s of a configuration over every timed round of every run."""
    return statistics.median(r for result in runs for r in rates(result["contenders"][name]))


def show_ratio(line: dict[str, Any], goal: float | None = None) -> str:
    """``median% (IQR q1-q3%, min-max a-b%; runs x%, y%)`` of a :func:`paired` record."""
    s = line["per_round"]
    g = GOAL if goal is None else goal
    runs = ", ".join(f"{beside(v, g)}%" for v in line["per_run"])
    return (
        f"{beside(s['median'], g)}% (IQR {s['q1']:.1%}-{s['q3']:.1%}, min-max "
        f"{s['min']:.1%}-{s['max']:.1%} over {s['n']} rounds; per run {runs})"
    )


def summarise(runs: list[dict[str, Any]], args: argparse.Namespace) -> dict[str, Any]:
    """Print the tables of one B (all its runs) and return its comparisons."""
    batch = runs[0]["batch"]
    names = [n for n in runs[0]["contenders"] if all(n in r["contenders"] for r in runs)]
    settings = [None, *(k for k in args.micro_batch if k)]
    print(f"\n## B = {batch}: {len(runs)} run(s), each every configuration in one process\n")
    print("| configuration | median samples/s (all rounds of all runs) | min | max |")
    print("|---|---:|---:|---:|")
    for name in names:
        all_rates = [r for result in runs for r in rates(result["contenders"][name])]
        print(f"| {name} | {statistics.median(all_rates):.0f} | {min(all_rates):.0f} | "
              f"{max(all_rates):.0f} |")  # fmt: skip
    peaks = ", ".join(f"{r['peak_rss_mib']:.0f} MiB" for r in runs)
    print(f"\npeak RSS of each run's worker process (every configuration): {peaks}")
    for result in runs:
        for name, why in result["refused"].items():
            print(f"refused in run {result['run'] + 1}: {name} ({why})")
    same: list[dict[str, Any]] = []
    print("\nSame setting (private / non-private samples/s, paired rounds):\n")
    for mode in (*args.modes, *((FLOOR,) if args.floor else ())):
        for mb in settings:
            mine, theirs = label(mode, mb), label(NON_PRIVATE, mb)
            if mine in names and theirs in names:
                line = paired(runs, mine, theirs)
                same.append(line)
                print(f"- {mine} / {theirs}: {show_ratio(line)}")
    best: list[dict[str, Any]] = []
    public = [label(NON_PRIVATE, mb) for mb in settings if label(NON_PRIVATE, mb) in names]
    theirs = max(public, key=lambda n: pooled_median(runs, n))
    print(f"\nBest against best (each side's best of the same {len(settings)} settings; "
          f"non-private's best: {theirs}):\n")  # fmt: skip
    for mode in args.modes:
        own = [label(mode, mb) for mb in settings if label(mode, mb) in names]
        if not own:
            continue
        mine = max(own, key=lambda n: pooled_median(runs, n))
        line = paired(runs, mine, theirs)
        line["mode"] = mode
        best.append(line)
        print(f"- {mode}: {mine} / {theirs}: {show_ratio(line)}")
    return {"batch": batch, "same_setting": same, "best_against_best": best}


def verdict(summary: dict[str, Any], busy: list[str]) -> str:
    """The goal's line for one B: met, not met, or ``busy: no verdict``."""
    line = next((b for b in summary["best_against_best"] if b["mode"] == GOAL_MODE), None)
    if line is None:
        return f"B = {summary['batch']}: {GOAL_MODE} not run, no verdict"
    ratio = line["per_round"]["median"]
    head = (
        f"B = {summary['batch']}, {GOAL_MODE} best against best: {beside(ratio, GOAL)}% "
        f"(median of paired rounds) against the goal of {GOAL:.0%}"
    )
    if busy:
        return f"{head}: busy: no verdict ({'; '.join(busy)})"
    return f"{head}: {'met' if ratio >= GOAL else 'not met'}"


def main(argv: list[str] | None = None) -> None:
    """Parse the options; run the benchmark, a worker (``--worker``) or the data child."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick", action="store_true", help="B = 600, micro-batch 500, 2 timed rounds"
    )
    parser.add_argument("--json", type=Path, help="also write the results to this file")
    parser.add_argument(
        "--micro-batch",
        type=int,
        nargs="+",
        help="settings offered to every mode besides the whole round (default 200 500; 0: none)",
    )
    parser.add_argument(
        "--model", choices=("cnn", "cnn_small"), default="cnn", help="model (default cnn)"
    )
    parser.add_argument(
        "--threads", type=int, default=1, help="threads (default 1: pinned to one CPU)"
    )
    parser.add_argument(
        "--modes",
        nargs="+",
        choices=PRIVATE_MODES,
        default=list(PRIVATE_MODES),
        help="private modes to run (default all four)",
    )
    parser.add_argument(
        "--floor",
        action="store_true",
        help="also run 'floor' rows: fast's round without its per-sample work (not private)",
    )
    parser.add_argument("--batches", type=int, nargs="+", help="values of B (default 600 6000)")
    parser.add_argument("--rounds", type=int, help="timed rounds (default 8 at B <= 600, else 6)")
    parser.add_argument(
        "--runs", type=int, default=DEFAULT_RUNS, help="fresh worker processes per B (default 2)"
    )
    parser.add_argument("--probe", type=float, default=1.0, help="seconds of each load probe")
    parser.add_argument(
        "--wait-quiet", type=float, default=0.0, help="wait up to this long for a quiet machine"
    )
    parser.add_argument("--worker", nargs=2, metavar=("B", "RUN"), help=argparse.SUPPRESS)
    parser.add_argument("--worker-out", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--data", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--prepare", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.micro_batch is None:
        args.micro_batch = [500] if args.quick else list(DEFAULT_MICRO_BATCHES)
    if args.prepare:
        save_data(args.prepare)
        return
    if args.worker:
        worker(args)
        return
    if args.runs < 1:
        parser.error(f"--runs must be >= 1. Found {args.runs}.")

    before = loadavg()
    # The CPU of the measurement: the workers inherit it (and the thread limits).
    cpu = per_core(args.threads, pin=args.threads == 1)
    started = time.perf_counter()
    sizes = args.batches or ((600,) if args.quick else (600, 6000))
    measured: list[tuple[list[dict[str, Any]], dict[str, Any]]] = []
    here = str(Path(__file__).resolve())
    passthrough = ["--model", args.model, "--threads", str(args.threads), "--probe",
                   str(args.probe), "--wait-quiet", str(args.wait_quiet), "--modes", *args.modes,
                   "--micro-batch", *map(str, args.micro_batch or [0])]  # fmt: skip
    passthrough += ["--floor"] if args.floor else []
    passthrough += ["--quick"] if args.quick else []
    passthrough += ["--rounds", str(args.rounds)] if args.rounds else []
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp)
        # A child loads MNIST, so that no worker holds the loader's copies.
        prepare = [sys.executable, here, "--prepare", str(data)]
        subprocess.run(prepare, check=True, env=thread_env(args.threads))
        for batch in sizes:
            runs = []
            for run in range(args.runs):
                out = data / f"run-{batch}-{run}.json"
                cmd = [sys.executable, here, "--worker", str(batch), str(run), "--data",
                       str(data), "--worker-out", str(out), *passthrough]  # fmt: skip
                subprocess.run(cmd, check=True, env=thread_env(args.threads))
                result = json.loads(out.read_text())
                flag = "busy" if result["busy"] else "quiet"
                print(f"B = {batch}, run {run + 1}/{args.runs}: {flag}; others used "
                      f"{result['load']['during']['others_cores']:.2f} cores during it",
                      flush=True)  # fmt: skip
                runs.append(result)
            measured.append((runs, summarise(runs, args)))
    after = loadavg()
    elapsed = time.perf_counter() - started
    flagged = [
        f"B = {r['batch']} run {r['run'] + 1}: {reason}"
        for runs, _ in measured
        for r in runs
        for reason in r["busy_reasons"]
    ]
    busy = load_verdict(before, after, args.threads, flagged)
    shown = [f"{v:.2f}" if v is not None else "?" for v in (before, after)]
    print(
        f"\nload average (1 min): {shown[0]} before, {shown[1]} after; limit {LOADAVG_LIMIT} "
        f"before, {LOADAVG_LIMIT} + {args.threads} after; pinned CPU {cpu}"
    )
    print("busy: no verdict" if busy else "quiet")
    for _, summary in measured:
        print(verdict(summary, busy))
    print(f"total benchmark time: {elapsed:.1f} s")
    if args.json is not None:
        payload = {
            "threads": args.threads,
            "pinned_cpu": cpu,
            "micro_batch": [k for k in args.micro_batch if k],
            "model": args.model,
            "warmup": WARMUP,
            "runs": args.runs,
            "noise_multiplier": NOISE_MULTIPLIER,
            "max_grad_norm": MAX_GRAD_NORM,
            "loadavg": {"before": before, "after": after, "limit": LOADAVG_LIMIT},
            "busy": busy,
            "elapsed_s": elapsed,
            "summaries": [s for _, s in measured],
            "results": [r for runs, _ in measured for r in runs],
        }
        write_json(args.json, payload)


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
