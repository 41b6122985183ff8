"""Speed of one training round of the MNIST experiment (run: ``python benchmarks/training.py``).

What is measured, on CPU with ``torch.set_num_threads(2)``, for the tanh CNN of
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

Each (B, mode) configuration runs in a fresh subprocess (this script re-invoking itself with
``--child``), which prints one JSON line including its peak resident set size
(``ru_maxrss``), so configurations do not pollute each other's memory or caches. MNIST is
loaded by a separate child and handed over as a ``uint8`` ``.npz`` file: on Linux a child's
``ru_maxrss`` starts from its parent's resident size, so the parent stays small. Every
configuration warms up 2 rounds and reports the median of the timed rounds (7 at B = 600, 5 at
B = 6000; 2 with ``--quick``, which uses B = 60 and 600).

A setting a user can apply to their own training is benchmarked as well, ``--micro-batch K
[K ...]`` (default 200 and 500; ``0`` turns it off): every mode is also run with each round
processed in chunks of at most ``K`` examples (rows ``mode/mbK``). Private rounds use Opacus
virtual steps (``signal_skip_step`` on every chunk but the last), so a round is still one noisy
step over all its participants and one accountant step; non-private rounds accumulate the
chunks' gradients weighted to the batch's mean loss. Chunking keeps the working set in cache.

The ratio column divides by the plain (unchunked) non-private row at the same B; the summary
compares the fastest private row with the fastest non-private row, whole rounds against whole
rounds and each side at its best setting.

Usage::

    python benchmarks/training.py                    # full run (B = 600 and 6000)
    python benchmarks/training.py --quick            # smoke run
    python benchmarks/training.py --json out.json    # also write the results as JSON
    python benchmarks/training.py --micro-batch 0    # only the unchunked rounds
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from opacus import PrivacyEngine
from shuffle_experiments.data import load_mnist
from shuffle_experiments.models import build_model
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import shuffle_opacus

N_CLIENTS = 60_000
MODEL = ["cnn"]  # the model of this process (set from --model)
THREADS = 2
WARMUP = 2
PRIVATE_MODES = ("hooks", "functorch", "ew", "fast")
NOISE_MULTIPLIER = 5.0
MAX_GRAD_NORM = 0.01
LR = 0.1
GOAL = 0.75
DEFAULT_MICRO_BATCHES = (200, 500)


def timed_rounds(batch: int, quick: bool) -> int:
    if quick:
        return 2
    return 7 if batch <= 600 else 5


def peak_rss_mib() -> float:
    # Linux reports ru_maxrss in KiB.
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def vm_hwm_mib() -> float | None:
    """Peak RSS of this process image since exec (Linux ``VmHWM``), a cross-check."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return None


def save_data(path: Path) -> None:
    """Write MNIST's training part (``uint8`` images, labels) for the children to read."""
    mnist = load_mnist()
    np.savez(path, images=mnist.train_images, labels=mnist.train_labels)


def load_data(path: Path | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Return the training images as floats in [0, 1], shape (N, 1, 28, 28), and the labels.

    Reading the parent's ``uint8`` copy keeps loading's memory peak (the pickle source holds
    float copies) out of the child's peak RSS; without ``path`` MNIST is loaded here.
    """
    if path is None:
        train_x, train_y, _, _ = load_mnist().normalized()
    else:
        with np.load(path) as data:
            train_x = data["images"].astype(np.float32) / np.float32(255.0)
            train_y = data["labels"]
    x = torch.from_numpy(train_x).unsqueeze(1).contiguous()
    y = torch.from_numpy(train_y).long()
    return x, y


def non_private_step(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    xb: torch.Tensor,
    yb: torch.Tensor,
    micro_batch: int | None,
) -> None:
    """One round; with ``micro_batch``, gradients are accumulated chunk by chunk."""
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


def non_private_rounds(
    x: torch.Tensor,
    y: torch.Tensor,
    batch: int,
    rounds: int,
    micro_batch: int | None,
) -> list[tuple[int, float]]:
    torch.manual_seed(0)
    model = build_model(MODEL[0])
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    generator = torch.Generator().manual_seed(0)
    results = []
    for _ in range(rounds):
        idx = torch.randperm(x.shape[0], generator=generator)[:batch]
        xb, yb = x[idx], y[idx]
        start = time.perf_counter()
        non_private_step(model, optimizer, xb, yb, micro_batch)
        results.append((batch, time.perf_counter() - start))
    return results


def private_step(
    model: nn.Module,
    optimizer: Any,
    xb: torch.Tensor,
    yb: torch.Tensor,
    micro_batch: int | None,
) -> None:
    """One round; with ``micro_batch``, per-sample gradients are computed chunk by chunk."""
    size = xb.shape[0]
    if micro_batch is None or size <= micro_batch:
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(model(xb), yb)
        loss.backward()
        optimizer.step()
        return
    optimizer.zero_grad()
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


def private_rounds(
    x: torch.Tensor,
    y: torch.Tensor,
    batch: int,
    rounds: int,
    mode: str,
    micro_batch: int | None,
) -> list[tuple[int, float]]:
    torch.manual_seed(0)
    model = build_model(MODEL[0])
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    loader = DataLoader(TensorDataset(x, y), batch_size=batch)
    engine = PrivacyEngine(accountant="shuffled_checkin")
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
        grad_sample_mode=mode,
    )
    results = []
    for indices in loader.batch_sampler:
        idx = torch.as_tensor(indices, dtype=torch.long)
        xb, yb = x[idx], y[idx]
        start = time.perf_counter()
        private_step(model, optimizer, xb, yb, micro_batch)
        results.append((len(idx), time.perf_counter() - start))
    if len(results) != rounds:
        raise RuntimeError(f"sampler produced {len(results)} rounds, expected {rounds}")
    return results


def run_child(
    batch: int,
    mode: str,
    timed: int,
    micro_batch: int | None,
    data: Path | None,
) -> dict[str, Any]:
    """Measure one configuration in this process and return its record."""
    record: dict[str, Any] = {"batch": batch, "mode": mode, "micro_batch": micro_batch}
    x, y = load_data(data)
    rounds = WARMUP + timed
    try:
        if mode == "non-private":
            results = non_private_rounds(x, y, batch, rounds, micro_batch)
        else:
            results = private_rounds(x, y, batch, rounds, mode, micro_batch)
    except ValueError as err:
        record["refused"] = str(err)
        record["peak_rss_mib"] = peak_rss_mib()
        return record
    timed_results = results[WARMUP:]
    seconds = [s for _, s in timed_results]
    record["participants"] = [p for p, _ in timed_results]
    record["seconds"] = seconds
    # The median round by throughput (the lower one for an even count), so that its seconds
    # and samples/s describe the same round.
    median_round = statistics.median_low((p / s, s) for p, s in timed_results)
    record["samples_per_s"], record["seconds_per_round"] = median_round
    record["peak_rss_mib"] = peak_rss_mib()
    record["vm_hwm_mib"] = vm_hwm_mib()
    return record


def spawn(
    batch: int,
    mode: str,
    timed: int,
    micro_batch: int | None,
    data: Path,
) -> dict[str, Any]:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", str(batch), mode, str(timed)]
    cmd += ["--data", str(data)]
    cmd += ["--micro-batch", str(micro_batch or 0), "--model", MODEL[0]]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return {"batch": batch, "mode": mode, "micro_batch": micro_batch, "failed": tail}
    return json.loads(lines[-1])


def label(record: dict[str, Any]) -> str:
    mode = record["mode"]
    if record.get("micro_batch") is not None:
        mode += f"/mb{record['micro_batch']}"
    return mode


def print_table(records: list[dict[str, Any]]) -> None:
    base = {
        r["batch"]: r["samples_per_s"]
        for r in records
        if r["mode"] == "non-private" and r.get("micro_batch") is None and "samples_per_s" in r
    }
    header = (
        f"{'B':>6}  {'mode':<18} {'s/round':>9} {'samples/s':>10} {'ratio':>6} {'peak RSS MiB':>12}"
    )
    print(header)
    print("-" * len(header))
    for r in records:
        rss = f"{r['peak_rss_mib']:12.0f}" if "peak_rss_mib" in r else f"{'-':>12}"
        if "samples_per_s" in r:
            ratio = r["samples_per_s"] / base[r["batch"]] if r["batch"] in base else float("nan")
            r["ratio"] = ratio
            print(
                f"{r['batch']:>6}  {label(r):<18} {r['seconds_per_round']:9.4f} "
                f"{r['samples_per_s']:10.0f} {ratio:6.2f} {rss}"
            )
        else:
            why = f"refused ({r['refused']})" if "refused" in r else f"failed ({r['failed']})"
            print(f"{r['batch']:>6}  {label(r):<18} {why}")


def summary(records: list[dict[str, Any]], batch: int) -> None:
    """Print the fastest private mode against non-private rounds, like for like and overall."""
    at_batch = [r for r in records if r["batch"] == batch and "samples_per_s" in r]
    private = [r for r in at_batch if r["mode"] != "non-private"]
    public = [r for r in at_batch if r["mode"] == "non-private"]
    if not private or not public:
        print(f"no private or no non-private mode completed at B={batch}")
        return

    def best(rows: list[dict[str, Any]]) -> dict[str, Any]:
        return max(rows, key=lambda r: r["samples_per_s"])

    for title, mine, theirs in (
        (
            "whole rounds",
            [r for r in private if r.get("micro_batch") is None],
            [r for r in public if r.get("micro_batch") is None],
        ),
        ("any setting, each side at its best", private, public),
    ):
        if not mine or not theirs:
            continue
        a, b = best(mine), best(theirs)
        ratio = a["samples_per_s"] / b["samples_per_s"]
        verdict = "yes" if ratio >= GOAL else "no"
        print(
            f"B={batch}, {title}: fastest private {label(a)} {a['samples_per_s']:.0f} samples/s "
            f"= {ratio:.0%} of fastest non-private {label(b)}; >= {GOAL:.0%}: {verdict}"
        )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="B = 60 and 600, 2 timed rounds")
    parser.add_argument("--json", type=Path, help="also write the results to this file")
    parser.add_argument(
        "--micro-batch",
        type=int,
        nargs="+",
        default=list(DEFAULT_MICRO_BATCHES),
        help="also run every mode in chunks of these sizes (default 200 500; 0: none)",
    )
    parser.add_argument(
        "--model", choices=("cnn", "cnn_small"), default="cnn", help="model (default cnn)"
    )
    parser.add_argument("--child", nargs=3, metavar=("B", "MODE", "TIMED"), help=argparse.SUPPRESS)
    parser.add_argument("--data", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--prepare", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    torch.set_num_threads(THREADS)
    MODEL[0] = args.model

    if args.prepare:
        save_data(args.prepare)
        return
    if args.child:
        batch, mode, timed = int(args.child[0]), args.child[1], int(args.child[2])
        micro_batch = args.micro_batch[0] or None
        record = run_child(batch, mode, timed, micro_batch, args.data)
        print(json.dumps(record), flush=True)
        return

    started = time.perf_counter()
    load_before = os.getloadavg()
    sizes = (60, 600) if args.quick else (600, 6000)
    micro = (None, *(k for k in args.micro_batch if k))
    records = []
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "mnist_train.npz"
        # A child loads MNIST: on Linux a child's ru_maxrss starts from the parent's resident
        # size at the fork, so the parent must never hold the loader's large float copies.
        prepare = [sys.executable, str(Path(__file__).resolve()), "--prepare", str(data)]
        subprocess.run(prepare, check=True)
        for batch in sizes:
            timed = timed_rounds(batch, args.quick)
            configs = [(mode, mb) for mb in micro for mode in ("non-private", *PRIVATE_MODES)]
            for mode, mb in configs:
                record = spawn(batch, mode, timed, mb, data)
                records.append(record)
                print(f"  done B={batch} {label(record)}", file=sys.stderr, flush=True)
    print(
        f"One MNIST training round, tanh CNN (26,010 params), torch {torch.__version__}, "
        f"{THREADS} threads; warm-up {WARMUP}, "
        "median timed round; ratio = samples/s / non-private samples/s at the same B"
    )
    print_table(records)
    load_after = os.getloadavg()
    print(
        "1-min load average before/after: "
        f"{load_before[0]:.2f}/{load_after[0]:.2f} ({os.cpu_count()} CPUs; other CPU-heavy "
        "processes make the timings unreliable)"
    )
    summary(records, sizes[-1])
    elapsed = time.perf_counter() - started
    print(f"total benchmark time: {elapsed:.1f} s")
    if args.json is not None:
        payload = {
            "torch": torch.__version__,
            "threads": THREADS,
            "micro_batch": [k for k in args.micro_batch if k],
            "model": args.model,
            "warmup": WARMUP,
            "elapsed_s": elapsed,
            "load_average_before_after": [load_before[0], load_after[0]],
            "records": records,
        }
        args.json.write_text(json.dumps(payload, indent=2) + "\n")


if __name__ == "__main__":
    main()
