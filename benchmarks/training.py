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
  ``fast`` is ``shuffle_opacus.clipping.ClippedSumModule``, the exact clipped sum in one forward
  and one backward pass without per-sample gradients (its numerics against the per-sample path
  are in ``tests/test_clipping.py``). The round's client indices come from
  ``loader.batch_sampler`` and the tensors are indexed directly, so data collation is not
  timed; samples/s counts the round's actual participants.

Every configuration of a B (mode x micro-batch setting) runs in its own worker process (this
script re-invoking itself with ``--worker``), so that each has its own peak resident set size
(``ru_maxrss``, reported when it stops), and the workers' rounds run **interleaved round by
round** by ``benchmarks/timing.py``: round ``r`` of every configuration, in alternating order,
so that every configuration meets the same load. By default one thread, every worker pinned
with the parent to one CPU (``--threads 2`` for two threads, unpinned). The load of other
processes is recorded before, during and after, and the result flagged busy when they used more
than a tenth of a core. MNIST is loaded by a separate child and handed over as a ``float32``
``.npy`` file that every worker maps read-only (one copy in memory for all). Every
configuration warms up 2 rounds and reports the median of the timed rounds (8 at B = 600, 6 at
B = 6000, ``--rounds`` to change; 2 with ``--quick``, which uses B = 600 and micro-batches of
500 only). Between its rounds a private worker drops its per-sample gradients (``zero_grad``,
not timed), so idle workers hold little memory. The workers are set up on every CPU and pinned
to the measurement's CPU before the first round.

A setting a user can apply to their own training is benchmarked as well, ``--micro-batch K
[K ...]`` (default 200 and 500; ``0`` turns it off): every mode is also run with each round
processed in chunks of at most ``K`` examples (rows ``mode/mbK``). Private rounds use Opacus
virtual steps (``signal_skip_step`` on every chunk but the last), so a round is still one noisy
step over all its participants and one accountant step; non-private rounds accumulate the
chunks' gradients weighted to the batch's mean loss. Chunking keeps the working set in cache.

``--floor`` adds ``floor`` rows (not private): ``fast``'s round with its per-sample norms and
clipped sums replaced by zeros, so forward pass, backward pass to the layer outputs, noise, step
and accountant only. ``fast`` minus ``floor`` at the same setting is what the per-sample work
costs; ``floor`` against the best non-private row bounds what any exact method that
differentiates to the layer outputs can reach. ``--modes fast`` leaves out Opacus's modes.

The ratio column divides a row's median samples/s by the plain (unchunked) non-private row's at
the same B. The summary compares the fastest private row with the fastest non-private row,
whole rounds against whole rounds and each side at its best setting ("best against best"),
with the range of the ratios of the same rounds; the goal is at least 80% best against best.

Usage::

    python benchmarks/training.py                    # full run (B = 600 and 6000)
    python benchmarks/training.py --quick            # smoke run
    python benchmarks/training.py --json out.json    # also write the results as JSON
    python benchmarks/training.py --micro-batch 0    # only the unchunked rounds
    python benchmarks/training.py --threads 2        # two threads, not pinned
    python benchmarks/training.py --batches 6000 --modes fast --floor   # the goal and its floor
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from timing import (
    RoundWorker,
    compare,
    per_core,
    pin_pids,
    serve_rounds,
    thread_env,
    write_json,
)

N_CLIENTS = 60_000
WARMUP = 2
PRIVATE_MODES = ("hooks", "functorch", "ew", "fast")
NOISE_MULTIPLIER = 5.0
MAX_GRAD_NORM = 0.01
LR = 0.1
GOAL = 0.80
DEFAULT_MICRO_BATCHES = (200, 500)
NON_PRIVATE = "non-private"
FLOOR = "floor"


def timed_rounds(batch: int, quick: bool) -> int:
    if quick:
        return 2
    return 8 if batch <= 600 else 6


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
    model_name: str, x, y, batch: int, rounds: int, mode: str, micro_batch: int | None
) -> Callable[[int], dict[str, Any]]:
    """Set up one configuration; return its round: ``run(r) -> {"seconds", "participants"}``.

    Only the step is timed (the batch is indexed before). After the step the gradients (and a
    private optimizer's per-sample gradients) are dropped, untimed.
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
            seed=0,
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


def worker(args: argparse.Namespace) -> None:
    """One configuration as a round worker of ``timing.RoundWorker`` (``--worker``)."""
    import torch
    from timing import peak_rss_mib

    # Notices every private round would repeat (as in the test configuration).
    warnings.filterwarnings("ignore", "Secure RNG turned off")
    warnings.filterwarnings("ignore", "Full backward hook is firing")
    torch.set_num_threads(args.threads)
    batch, mode, micro = int(args.worker[0]), args.worker[1], int(args.worker[2]) or None
    x, y = load_data(args.data)
    try:
        run = build_rounds(args.model, x, y, batch, args.worker_rounds, mode, micro)
    except ValueError as err:
        serve_rounds(lambda r: None, hello={"refused": str(err)}, stdin=iter(()))
        return
    serve_rounds(
        run,
        final=lambda: {"peak_rss_mib": peak_rss_mib(), "vm_hwm_mib": vm_hwm_mib()},
        hello={"ready": True},
    )


def label(mode: str, micro_batch: int | None) -> str:
    return mode if micro_batch is None else f"{mode}/mb{micro_batch}"


def rate_stats(entry: dict[str, Any]) -> dict[str, float]:
    """Samples/s per timed round: median (the lower middle one), min, max."""
    rates = [e["participants"] / s for e, s in zip(entry["extras"], entry["seconds"], strict=True)]
    return {
        "median": statistics.median_low(rates),
        "min": min(rates),
        "max": max(rates),
        "rates": rates,
    }


def measure_batch(
    args: argparse.Namespace, batch: int, data: Path, cpu: int | None
) -> dict[str, Any]:
    """All configurations of one B, interleaved; returns the record with throughputs.

    The workers start on every CPU (their imports and set-up overlap) and are pinned to
    ``cpu`` once all of them are ready, before the first round.
    """
    micro = (None, *(k for k in args.micro_batch if k))
    modes = (NON_PRIVATE, *args.modes, *((FLOOR,) if args.floor else ()))
    configs = [(mode, mb) for mb in micro for mode in modes]
    rounds = args.rounds or timed_rounds(batch, args.quick)
    total = WARMUP + rounds
    env = thread_env(args.threads)
    workers: dict[str, RoundWorker] = {}
    refused: dict[str, str] = {}
    try:
        for mode, mb in configs:
            cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", str(batch), mode]
            cmd += [str(mb or 0), "--data", str(data), "--model", args.model]
            cmd += ["--threads", str(args.threads), "--worker-rounds", str(total)]
            workers[label(mode, mb)] = RoundWorker(cmd, env=env, hello=True)
        for name, w in list(workers.items()):
            hello = w.wait_hello() or {}
            if "refused" in hello:
                refused[name] = hello["refused"]
                w.close()
                del workers[name]
        if cpu is not None:
            per_core(args.threads, cpu=cpu)
            pin_pids([w.pid for w in workers.values() if w.pid is not None], cpu)
        result = compare(
            workers,
            rounds=rounds,
            warmup=WARMUP,
            baseline=NON_PRIVATE,
            title=(
                f"one MNIST training round, B = {batch}, {args.model}, {args.threads} thread(s); "
                "seconds of the step"
            ),
            probe_s=args.probe,
            wait_quiet_s=args.wait_quiet,
        )
    finally:
        finals = {name: w.close() for name, w in workers.items()}
    result["batch"] = batch
    result["refused"] = refused
    for name, entry in result["contenders"].items():
        entry["samples_per_s"] = rate_stats(entry)
        entry.update(finals.get(name) or {})
    return result


def print_throughput(result: dict[str, Any]) -> None:
    table = result["contenders"]
    base = table[NON_PRIVATE]["samples_per_s"]["median"]
    print(f"\nB = {result['batch']}: samples/s (participants / seconds of each round)\n")
    print("| configuration | median samples/s | min | max | ratio to non-private | peak RSS MiB |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, entry in table.items():
        rate = entry["samples_per_s"]
        rss = entry.get("peak_rss_mib")
        shown = f"{rss:.0f}" if rss is not None else "-"
        print(
            f"| {name} | {rate['median']:.0f} | {rate['min']:.0f} | {rate['max']:.0f} | "
            f"{rate['median'] / base:.2f} | {shown} |"
        )
    for name, why in result["refused"].items():
        print(f"| {name} | refused ({why}) | | | | |")


def summary(result: dict[str, Any]) -> list[dict[str, Any]]:
    """The fastest private configuration against the fastest non-private one, two ways."""
    table = result["contenders"]
    out = []

    def best(names: list[str]) -> str:
        return max(names, key=lambda n: table[n]["samples_per_s"]["median"])

    private = [n for n in table if not n.startswith((NON_PRIVATE, FLOOR))]
    public = [n for n in table if n.startswith(NON_PRIVATE)]
    for title, mine, theirs in (
        ("whole rounds", [n for n in private if "/mb" not in n], [NON_PRIVATE]),
        ("best against best (any setting, each side at its best)", private, public),
    ):
        if not mine or not theirs:
            continue
        a, b = best(mine), best(theirs)
        ra, rb = table[a]["samples_per_s"], table[b]["samples_per_s"]
        ratio = ra["median"] / rb["median"]
        per_round = [p / q for p, q in zip(ra["rates"], rb["rates"], strict=True)]
        verdict = "met" if ratio >= GOAL else "not met"
        line = {
            "comparison": title,
            "private": a,
            "non_private": b,
            "ratio_of_medians": ratio,
            "per_round": {"median": statistics.median(per_round), "min": min(per_round),
                          "max": max(per_round)},
            "goal": GOAL,
        }  # fmt: skip
        out.append(line)
        print(
            f"B={result['batch']}, {title}: {a} {ra['median']:.0f} samples/s = {ratio:.0%} of "
            f"{b} ({rb['median']:.0f}); per round {min(per_round):.0%}-{max(per_round):.0%}; "
            f">= {GOAL:.0%}: {verdict}"
        )
    floors = [n for n in table if n.startswith(FLOOR)]
    if floors and private and public:
        f, b, a = best(floors), best(public), best(private)
        mine = a.split("/", 1)[1] if "/" in a else None
        same = f"{FLOOR}/{mine}" if mine else FLOOR
        per_sample = None
        if same in table:
            per_sample = statistics.median(table[a]["seconds"]) - statistics.median(
                table[same]["seconds"]
            )
        rf, rb = table[f]["samples_per_s"]["median"], table[b]["samples_per_s"]["median"]
        line = {
            "comparison": "floor (not private: forward + backward to the layer outputs, step)",
            "floor": f,
            "non_private": b,
            "ratio_of_medians": rf / rb,
            "per_sample_work_s": per_sample,
        }
        out.append(line)
        shown = (
            ""
            if per_sample is None
            else (
                f"; the per-sample work of {a} takes {per_sample * 1e3:.0f} ms a round "
                f"({a} minus {same})"
            )
        )
        print(
            f"B={result['batch']}, floor without per-sample work (not private): {f} "
            f"{rf:.0f} samples/s = {rf / rb:.0%} of {b} ({rb:.0f}){shown}"
        )
    if result["busy"]:
        print("BUSY: " + "; ".join(result["busy_reasons"]))
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick", action="store_true", help="B = 600, micro-batch 500, 2 timed rounds"
    )
    parser.add_argument("--json", type=Path, help="also write the results to this file")
    parser.add_argument(
        "--micro-batch",
        type=int,
        nargs="+",
        help="also run every mode in chunks of these sizes (default 200 500; 0: none)",
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
    parser.add_argument("--probe", type=float, default=1.0, help="seconds of each load probe")
    parser.add_argument(
        "--wait-quiet", type=float, default=0.0, help="wait up to this long for a quiet machine"
    )
    parser.add_argument("--worker", nargs=3, metavar=("B", "MODE", "MB"), help=argparse.SUPPRESS)
    parser.add_argument("--worker-rounds", type=int, help=argparse.SUPPRESS)
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

    # The CPU of the measurement; workers start unpinned and are pinned to it once set up.
    cpu = per_core(args.threads, pin=args.threads == 1)
    started = time.perf_counter()
    sizes = args.batches or ((600,) if args.quick else (600, 6000))
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp)
        # A child loads MNIST, so that no worker's peak RSS holds the loader's copies.
        prepare = [sys.executable, str(Path(__file__).resolve()), "--prepare", str(data)]
        subprocess.run(prepare, check=True, env=thread_env(args.threads))
        for batch in sizes:
            per_core(args.threads, pin=False)  # the workers' set-up may use every CPU
            result = measure_batch(args, batch, data, cpu)
            print_throughput(result)
            result["summary"] = summary(result)
            results.append(result)
    elapsed = time.perf_counter() - started
    print(f"total benchmark time: {elapsed:.1f} s")
    if args.json is not None:
        payload = {
            "threads": args.threads,
            "pinned_cpu": cpu,
            "micro_batch": [k for k in args.micro_batch if k],
            "model": args.model,
            "warmup": WARMUP,
            "noise_multiplier": NOISE_MULTIPLIER,
            "max_grad_norm": MAX_GRAD_NORM,
            "elapsed_s": elapsed,
            "results": results,
        }
        write_json(args.json, payload)


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
