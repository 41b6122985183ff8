"""Seconds per round against the number of nodes: Flower path and one-process path.

Run: ``python benchmarks/flower.py [--nodes 20 100 500] [--rounds 4]`` (pin it to the cores you
want measured, e.g. ``taskset -c 1``; every process it starts inherits that).

Workload, identical on every path: the MNIST app of ``experiments/flower_mnist`` (model
``cnn_small``, 5,154 parameters), **one image per node**, rate 1 (every node reports every
round), one local SGD step (batch 1), noise multiplier 1, clipping norm 1, so a round carries N
reports of one example each, like a round of the one-process path with B = N:

* ``flower simulation``: :class:`shuffle_opacus.flower.launch.LocalFederation` with the
  simulation engine (a SuperLink with ``--simulation``, Ray, one ClientApp at a time on one CPU)
  and ``flwr run``; s/round is the median over rounds 2.. of the time between rounds in the
  app's ``rounds.csv`` (round 1 includes Ray's start and the ClientApp's imports, reported as
  "first round"); "total" is the whole ``flwr run`` with SuperLink start and stop;
* ``flower in-process``: the same ServerApp and ClientApp objects driven by
  :class:`shuffle_opacus.flower.InProcessGrid` in this process (no Ray, no network): what the
  strategy, the mod and the ClientApp cost without Flower's runtime;
* ``one-process make_private``: :func:`shuffle_opacus.make_private` (``shuffled_checkin``,
  rate 1, ``noise_mode="sum"``, ``grad_sample_mode="hooks"``) on the same N images: one
  batched forward/backward with per-sample clipping and local noise; median of the timed
  rounds after one warm-up.

torch uses one thread everywhere (``OMP_NUM_THREADS=1``).
"""

from __future__ import annotations

import argparse
import csv
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

try:
    import tomllib
except ImportError:  # Python 3.10: flwr depends on tomli
    import tomli as tomllib

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402
from tqdm import tqdm  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
APP = ROOT / "experiments" / "flower_mnist"
WORKLOAD = {
    "examples-per-node": 1,
    "rate": 1.0,
    "noise-multiplier": 1.0,
    "clip-norm": 1.0,
    "local-epochs": 1,
    "local-batch-size": 1,
    "evaluate-every": 0,
    "checkin-seed": 0,
    "model": "cnn_small",
}


def app_config(nodes: int, rounds: int, out: Path) -> dict:
    config = tomllib.loads((APP / "pyproject.toml").read_text())["tool"]["flwr"]["app"]["config"]
    return {
        **config,
        **WORKLOAD,
        "num-nodes": nodes,
        "num-server-rounds": rounds,
        "out-dir": str(out),
    }


def round_times(out: Path) -> list[float]:
    (run_dir,) = out.iterdir()
    with (run_dir / "rounds.csv").open() as fh:
        seconds = [float(row["seconds"]) for row in csv.DictReader(fh)]
    return list(np.diff(seconds))


def flower_simulation(nodes: int, rounds: int) -> dict:
    from shuffle_opacus.flower.launch import LocalFederation

    with tempfile.TemporaryDirectory(prefix="flower-bench-") as tmp:
        out = Path(tmp) / "out"
        started = time.monotonic()
        with LocalFederation("simulation", num_nodes=nodes, work_dir=Path(tmp) / "f") as fed:
            outcome = fed.run(APP, app_config(nodes, rounds, out), timeout=3000)
        total = time.monotonic() - started
        if not outcome.completed:
            raise RuntimeError(f"run {outcome.status}: {outcome.log_path.read_text()[-2000:]}")
        times = round_times(out)
    return {"per_round": statistics.median(times[1:]), "first": times[0], "total": total}


def flower_inprocess(nodes: int, rounds: int) -> dict:
    sys.path.insert(0, str(APP))
    from flower_mnist.client_app import app as client_app
    from flower_mnist.server_app import app as server_app
    from flwr.app import Context, RecordDict

    from shuffle_opacus.flower import InProcessGrid

    with tempfile.TemporaryDirectory(prefix="flower-bench-") as tmp:
        out = Path(tmp) / "out"
        config = app_config(nodes, rounds, out)
        grid = InProcessGrid(client_app, nodes, run_config=config)
        started = time.monotonic()
        server_app(grid, Context(1, 0, {}, RecordDict(), config))
        total = time.monotonic() - started
        times = round_times(out)
    return {"per_round": statistics.median(times[1:]), "first": times[0], "total": total}


def one_process(nodes: int, rounds: int) -> dict:
    from opacus import PrivacyEngine
    from shuffle_experiments.data import load_mnist
    from shuffle_experiments.models import build_model
    from torch.utils.data import DataLoader, TensorDataset

    import shuffle_opacus

    torch.set_num_threads(1)
    mnist = load_mnist()
    order = np.random.default_rng(0).permutation(len(mnist.train_labels))[:nodes]
    x = torch.from_numpy(mnist.train_images[order].astype(np.float32) / 255.0).unsqueeze(1)
    y = torch.from_numpy(mnist.train_labels[order].astype(np.int64))
    torch.manual_seed(0)
    net = build_model("cnn_small")
    module, optimizer, loader = shuffle_opacus.make_private(
        PrivacyEngine(accountant="shuffled_checkin"),
        module=net,
        optimizer=torch.optim.SGD(net.parameters(), lr=0.1),
        data_loader=DataLoader(TensorDataset(x, y), batch_size=nodes),
        noise_multiplier=1.0,
        max_grad_norm=1.0,
        rate=1.0,
        rounds=rounds + 1,
        seed=0,
    )
    times = []
    started = time.monotonic()
    for bx, by in loader:
        start = time.perf_counter()
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(module(bx), by).backward()
        optimizer.step()
        times.append(time.perf_counter() - start)
    total = time.monotonic() - started
    return {"per_round": statistics.median(times[1:]), "first": times[0], "total": total}


PATHS = {
    "flower simulation": flower_simulation,
    "flower in-process": flower_inprocess,
    "one-process make_private": one_process,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[20, 100, 500])
    parser.add_argument("--rounds", type=int, default=4, help="rounds per run (>= 2)")
    parser.add_argument("--paths", nargs="+", default=list(PATHS), choices=list(PATHS))
    args = parser.parse_args()
    rows = []
    jobs = [(path, n) for n in args.nodes for path in args.paths]
    for path, nodes in tqdm(jobs, desc="configurations"):
        rows.append((path, nodes, PATHS[path](nodes, args.rounds)))
    cpus = len(os.sched_getaffinity(0))
    print(f"\n{cpus} CPU core(s), torch {torch.__version__}, {args.rounds} rounds per run\n")
    print("| path | nodes N | s/round | first round (s) | total (s) |")
    print("|---|---:|---:|---:|---:|")
    for path, nodes, r in rows:
        print(f"| {path} | {nodes} | {r['per_round']:.3f} | {r['first']:.2f} | {r['total']:.1f} |")


if __name__ == "__main__":
    main()
