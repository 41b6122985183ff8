"""Seconds per round against the number of nodes: Flower (both trust modes), one-process path.

Run: ``python benchmarks/flower.py [--nodes 20 100 500] [--rounds 4] [--paths ...]`` (pin it to
the cores you want measured, e.g. ``taskset -c 1``; every process it starts inherits that), and
``python benchmarks/flower.py --quantisation [--nodes 100] [--rounds 3]`` for the quantisation
error of the secure-aggregation mode.

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
* ``flower secagg simulation`` and ``flower secagg in-process``: the same two, with the app's
  ``mode = "secagg"``: every round is one run of Flower's SecAgg+ over all N nodes (four
  exchanges with every node: set-up, key sharing, masked vectors, unmasking), each node draws
  its own coin (rate 1: every node checks in, so the reports are those of the other paths);
* ``one-process make_private``: :func:`shuffle_opacus.make_private` (``shuffled_checkin``,
  rate 1, ``noise_mode="sum"``, ``grad_sample_mode="hooks"``) on the same N images: one
  batched forward/backward with per-sample clipping and local noise; median of the timed
  rounds after one warm-up.

torch uses one thread everywhere (``OMP_NUM_THREADS=1``).

``--quantisation`` runs the MNIST app's training code (``cnn_small``, 600 images per node, the
app's defaults: rate 0.5, noise multiplier 1.5, clipping norm 0.1) under the secure-aggregation
mode in this process, with every node's plain report recorded on the node before SecAgg+
masks it, and prints, per round, the largest and the root-mean-square difference per
coordinate between the model update the server decoded and the plain mean of the
participants' reports, next to the bound ``m Δ / K`` and to the standard deviation of the
noise of the mean, ``σC / √K``.
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
    # secagg: the padding of every node's masked-vector step (one image trains in milliseconds).
    "reply-after": 0.05,
}


def app_config(nodes: int, rounds: int, out: Path, mode: str = "trusted-server") -> dict:
    config = tomllib.loads((APP / "pyproject.toml").read_text())["tool"]["flwr"]["app"]["config"]
    return {
        **config,
        **WORKLOAD,
        "mode": mode,
        "num-nodes": nodes,
        "num-server-rounds": rounds,
        "out-dir": str(out),
    }


def round_times(out: Path) -> list[float]:
    (run_dir,) = out.iterdir()
    with (run_dir / "rounds.csv").open() as fh:
        seconds = [float(row["seconds"]) for row in csv.DictReader(fh)]
    return list(np.diff(seconds))


def flower_simulation(nodes: int, rounds: int, mode: str = "trusted-server") -> dict:
    from shuffle_opacus.flower.launch import LocalFederation

    with tempfile.TemporaryDirectory(prefix="flower-bench-") as tmp:
        out = Path(tmp) / "out"
        started = time.monotonic()
        with LocalFederation("simulation", num_nodes=nodes, work_dir=Path(tmp) / "f") as fed:
            outcome = fed.run(APP, app_config(nodes, rounds, out, mode), timeout=3000)
        total = time.monotonic() - started
        if not outcome.completed:
            raise RuntimeError(f"run {outcome.status}: {outcome.log_path.read_text()[-2000:]}")
        times = round_times(out)
    return {"per_round": statistics.median(times[1:]), "first": times[0], "total": total}


def flower_inprocess(nodes: int, rounds: int, mode: str = "trusted-server") -> dict:
    sys.path.insert(0, str(APP))
    from flower_mnist.client_app import app as client_app
    from flower_mnist.server_app import app as server_app
    from flwr.app import Context, RecordDict

    from shuffle_opacus.flower import InProcessGrid

    with tempfile.TemporaryDirectory(prefix="flower-bench-") as tmp:
        out = Path(tmp) / "out"
        config = app_config(nodes, rounds, out, mode)
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


def quantisation(nodes: int, rounds: int) -> list[dict]:
    """The decoded update against the plain mean of the reports, per round (see the docstring)."""
    sys.path.insert(0, str(APP))
    from flower_mnist.client_app import train
    from flower_mnist.task import initial_model
    from flwr.app import ArrayRecord
    from flwr.clientapp import ClientApp

    import shuffle_opacus.flower.secagg.mod as secagg_mod
    import shuffle_opacus.flower.secagg.strategy as secagg_strategy
    from shuffle_opacus.flower import (
        InProcessGrid,
        SecAggCheckInFedAvg,
        SecAggCheckInMod,
        ShufflePrivacyConfig,
    )

    config = tomllib.loads((APP / "pyproject.toml").read_text())["tool"]["flwr"]["app"]["config"]
    config = {**config, "num-nodes": nodes}
    reports: list = []
    decoded: dict = {}
    round_onto_grid, decode_sum = secagg_mod.round_onto_grid, secagg_strategy.decode_sum

    def plain(values, parameters, rng):
        # The node's report before it is rounded onto SecAgg+'s grid (in node order).
        reports.append([np.array(v, dtype=np.float64) for v in values])
        return round_onto_grid(values, parameters, rng)

    def recording(aggregate, num_in_sum, shapes, parameters):
        result = decode_sum(aggregate, num_in_sum, shapes, parameters)
        decoded[len(decoded) + 1] = (
            np.concatenate([a.ravel() for a in result.sums]),
            result.count,
            num_in_sum,
        )
        return result

    secagg_mod.round_onto_grid, secagg_strategy.decode_sum = plain, recording
    # The padding (0.5 s, sequential in one process) is above the training of 600 images.
    app = ClientApp(mods=[SecAggCheckInMod(min_noise_multiplier=0.5, reply_after=0.5)])
    app.train()(train)
    privacy = ShufflePrivacyConfig(
        noise_multiplier=config["noise-multiplier"],
        clip_norm=config["clip-norm"],
        rate=config["rate"],
        delta=config["delta"],
    )

    strategy = SecAggCheckInFedAvg(privacy=privacy, num_nodes=nodes)
    torch.set_num_threads(1)
    initial = ArrayRecord(initial_model(config["model"], config["model-seed"]).state_dict())
    grid = InProcessGrid(app, nodes, run_config=config)
    try:
        strategy.start(grid, initial, num_rounds=rounds)
    finally:
        secagg_mod.round_onto_grid, secagg_strategy.decode_sum = round_onto_grid, decode_sum
    params = strategy.parameters
    rows = []
    for r in range(1, rounds + 1):
        total, k, m = decoded[r]
        mine = reports[(r - 1) * nodes : r * nodes]
        ins = [rep for rep in mine if rep[-1][0] > 0]
        assert len(ins) == k, "the secure count is the number of participants"
        plain = np.sum([np.concatenate([a.ravel() for a in rep[:-1]]) for rep in ins], 0)
        error = (total - plain) / k  # the error of the averaged update, in float64
        rows.append(
            {
                "round": r,
                "checked_in": k,
                "max": float(np.max(np.abs(error))),
                "rms": float(np.sqrt(np.mean(error**2))),
                "bound": params.sum_error_bound(m) / k,
                "noise": privacy.noise_std / np.sqrt(k),
            }
        )
    print(
        f"\nSecAgg+ parameters: {params.num_shares} shares, threshold {params.threshold}, "
        f"clipping range c = {params.clipping_range:.6g}, quantisation range T = "
        f"{params.quantization_range}, modulus M = {params.modulus_range}, step "
        f"Delta = {params.step:.3g}, clipping bias bound {params.clipping_bias_bound():.3g}"
    )
    return rows


PATHS = {
    "flower simulation": flower_simulation,
    "flower secagg simulation": lambda n, r: flower_simulation(n, r, "secagg"),
    "flower in-process": flower_inprocess,
    "flower secagg in-process": lambda n, r: flower_inprocess(n, r, "secagg"),
    "one-process make_private": one_process,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[20, 100, 500])
    parser.add_argument("--rounds", type=int, default=4, help="rounds per run (>= 2)")
    parser.add_argument("--paths", nargs="+", default=list(PATHS), choices=list(PATHS))
    parser.add_argument("--quantisation", action="store_true", help="quantisation error only")
    args = parser.parse_args()
    if args.quantisation:
        for nodes in args.nodes:
            rows = quantisation(nodes, args.rounds)
            print(f"\n{nodes} nodes, 600 images each, {args.rounds} rounds\n")
            print(
                "| round | K | max error | rms error | bound m*Delta/K | noise sd sigma*C/sqrt(K) |"
            )
            print("|---:|---:|---:|---:|---:|---:|")
            for r in rows:
                print(
                    f"| {r['round']} | {r['checked_in']} | {r['max']:.2e} | {r['rms']:.2e} | "
                    f"{r['bound']:.2e} | {r['noise']:.2e} |"
                )
        return
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
