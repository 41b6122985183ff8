"""Seconds per round of user-level training: ours, the same without privacy, a loop, pfl, Flower.

Run: ``python benchmarks/users.py [--threads 1 2] [--clients 1000] [--rounds 6]`` (on an idle
machine; every path runs in this process except pfl and the memory run, which get their own).

Setting: N = 1,000 clients, each holding 60 MNIST training images (IID), check-in
rate 0.1 (about 100 reports per round), every participant taking 5 local SGD steps of batch 10
(learning rate 0.1) from the global model; the model is the experiment's ``cnn_small`` (5,154
weights, as in the Flower app); C = 1, noise multiplier 1. Paths:

* ``ours, private round``: :func:`shuffle_opacus.clients.make_private_clients` with the
  ``shuffled_checkin`` accountant: vectorised local training, whole-update clipping, local
  noise (``noise_mode="sum"``), average, the server's SGD step and the accountant's step;
* ``ours, local training only``: the same vectorised local training
  (:meth:`~shuffle_opacus.clients.FederatedTrainer.local_updates`), the plain mean of the
  updates and the server step: no clipping, no noise, no shuffle, no accounting. The
  difference to the private round is what clip + noise + shuffle cost;
* ``per-client torch loop``: the same clients and local batches, one ``deepcopy`` of the model
  per client and ordinary ``loss.backward()`` / ``SGD.step()`` calls, then the mean (no
  privacy);
* ``pfl 0.6``: Apple's pfl (``benchmarks/pfl_round.py``) under ``--pfl-python`` (its own
  virtual environment), FedAvg with its local ``GaussianMechanism``; skipped with a message
  when that interpreter is missing or pfl does not import;
* ``Flower objects in one process``: :class:`~shuffle_opacus.flower.ShuffleCheckInFedAvg`, a
  ``ClientApp`` with :class:`~shuffle_opacus.flower.LocalShuffleDPMod` doing the same local
  training, on :class:`~shuffle_opacus.flower.InProcessGrid` (no Ray, no network): a lower
  bound of a Flower simulation, whose runtime adds the rest;
* ``Flower simulation``: the MNIST Flower app (``experiments/flower_mnist``) with N nodes of
  the same size, ``local-steps`` of the same batch, run by ``flwr run`` on a SuperLink with the
  simulation engine (Ray given as many CPUs as the measurement's threads, one per ClientApp);
  the median of rounds 2 to ``--flower-rounds`` from the app's ``rounds.csv``.

s/round is the median over the timed rounds after one warm-up round (for pfl and Flower, the
median over rounds 2 onwards). The memory run trains N = 60,000 one-example clients (all of
MNIST) at the same rate and local steps in a fresh process and reports its peak resident set
size.
"""

from __future__ import annotations

import argparse
import copy
import csv
import functools
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402
from torch.nn import functional as F  # noqa: E402, N812

ROOT = Path(__file__).resolve().parents[1]
LOSS = functools.partial(F.cross_entropy, reduction="none")
CLIENT_LR = 0.1


def mnist(count: int) -> tuple[torch.Tensor, torch.Tensor]:
    from shuffle_experiments.data import load_mnist

    data = load_mnist()
    order = np.random.default_rng(0).permutation(len(data.train_labels))[:count]
    x = torch.from_numpy(data.train_images[order].astype(np.float32) / 255.0).unsqueeze(1)
    return x, torch.from_numpy(data.train_labels[order].astype(np.int64))


def make_trainer(args: argparse.Namespace, clients: int, examples: int, rounds: int):
    from opacus import PrivacyEngine
    from shuffle_experiments.models import build_model

    from shuffle_opacus.clients import iid_partition, make_private_clients

    x, y = mnist(clients * examples)
    torch.manual_seed(0)
    model = build_model("cnn_small")
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    trainer = make_private_clients(
        PrivacyEngine(accountant="shuffled_checkin"),
        module=model,
        optimizer=optimizer,
        data=(x, y),
        partition=iid_partition(clients * examples, clients, seed=0),
        loss_fn=LOSS,
        noise_multiplier=1.0,
        max_update_norm=1.0,
        client_lr=CLIENT_LR,
        local_steps=args.steps,
        local_batch_size=args.batch,
        rate=args.rate,
        rounds=rounds,
        seed=0,
        client_chunk=args.chunk,
    )
    return trainer, optimizer


def ours_private(args: argparse.Namespace) -> list[float]:
    trainer, optimizer = make_trainer(args, args.clients, args.examples, args.rounds + 1)
    times = []
    for t in range(args.rounds + 1):
        start = time.perf_counter()
        trainer.run_round(t)
        optimizer.step()
        times.append(time.perf_counter() - start)
    return times[1:]


def ours_training_only(args: argparse.Namespace) -> list[float]:
    trainer, optimizer = make_trainer(args, args.clients, args.examples, args.rounds + 1)
    params = [p for p in trainer.module.parameters()]
    times = []
    for t in range(args.rounds + 1):
        clients = np.asarray(trainer.sampler.batch(t), dtype=np.int64)
        start = time.perf_counter()
        sums = [torch.zeros_like(p) for p in params]
        for first in range(0, clients.size, trainer.client_chunk):
            updates, _ = trainer.local_updates(clients[first : first + trainer.client_chunk], t)
            for s, u in zip(sums, updates, strict=True):
                s += u.sum(dim=0)
        for p, s in zip(params, sums, strict=True):
            p.grad = s / max(clients.size, 1)
        optimizer.step()
        times.append(time.perf_counter() - start)
    return times[1:]


def torch_loop(args: argparse.Namespace) -> list[float]:
    from shuffle_opacus.clients import LocalTraining, local_batches

    trainer, optimizer = make_trainer(args, args.clients, args.examples, args.rounds + 1)
    model, x, y, part = trainer.module, trainer.inputs, trainer.targets, trainer.partition
    training = LocalTraining(
        client_lr=CLIENT_LR, local_steps=args.steps, local_batch_size=args.batch
    )
    times = []
    for t in range(args.rounds + 1):
        clients = trainer.sampler.batch(t)
        start = time.perf_counter()
        base = [p.detach().clone() for p in model.parameters()]
        sums = [torch.zeros_like(p) for p in base]
        for c in clients:
            local = copy.deepcopy(model)
            local_opt = torch.optim.SGD(local.parameters(), lr=CLIENT_LR)
            for batch in local_batches(part, c, training, seed=0, round_index=t):
                index = torch.as_tensor(batch)
                local_opt.zero_grad()
                F.cross_entropy(local(x[index]), y[index]).backward()
                local_opt.step()
            for s, b, p in zip(sums, base, local.parameters(), strict=True):
                s += b - p.detach()
        for p, s in zip(model.parameters(), sums, strict=True):
            p.grad = s / max(len(clients), 1)
        optimizer.step()
        times.append(time.perf_counter() - start)
    return times[1:]


def flower_inprocess(args: argparse.Namespace) -> list[float]:
    from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
    from flwr.clientapp import ClientApp
    from shuffle_experiments.models import build_model

    from shuffle_opacus.clients import LocalTraining, local_batches
    from shuffle_opacus.flower import (
        InProcessGrid,
        LocalShuffleDPMod,
        ShuffleCheckInFedAvg,
        ShufflePrivacyConfig,
    )

    trainer, _ = make_trainer(args, args.clients, args.examples, args.rounds + 1)
    x, y, part = trainer.inputs, trainer.targets, trainer.partition
    training = LocalTraining(
        client_lr=CLIENT_LR, local_steps=args.steps, local_batch_size=args.batch
    )
    app = ClientApp(mods=[LocalShuffleDPMod(min_noise_multiplier=0.5)])

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        i = int(context.node_config["partition-id"])
        t = int(msg.content["config"]["server-round"]) - 1
        model = build_model("cnn_small")
        model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
        optimizer = torch.optim.SGD(model.parameters(), lr=CLIENT_LR)
        for batch in local_batches(part, i, training, seed=0, round_index=t):
            index = torch.as_tensor(batch)
            optimizer.zero_grad()
            F.cross_entropy(model(x[index]), y[index]).backward()
            optimizer.step()
        content = {
            "arrays": ArrayRecord(model.state_dict()),
            "metrics": MetricRecord({"num-examples": 1}),
        }
        return Message(RecordDict(content), reply_to=msg)

    privacy = ShufflePrivacyConfig(noise_multiplier=1.0, clip_norm=1.0, rate=args.rate, delta=1e-5)
    strategy = ShuffleCheckInFedAvg(privacy=privacy, num_nodes=args.clients, seed=0)
    grid = InProcessGrid(app, args.clients)
    stamps: list[float] = []

    def stamp(server_round: int, arrays: ArrayRecord) -> None:
        stamps.append(time.perf_counter())

    import logging

    logging.getLogger("flwr").setLevel(logging.WARNING)
    torch.manual_seed(0)
    strategy.start(
        grid,
        ArrayRecord(build_model("cnn_small").state_dict()),
        num_rounds=args.rounds + 1,
        evaluate_fn=stamp,
    )
    return list(np.diff(stamps))[1:]


def flower_simulation(args: argparse.Namespace) -> list[float] | str:
    """A real Flower simulation of the setting: SuperLink, Ray, ``flwr run`` of the MNIST app.

    The app of ``experiments/flower_mnist`` in the trusted-server mode with N nodes of
    ``examples`` images, check-in rate ``rate``, ``local-steps`` mini-batches of ``batch``
    (learning rate 0.1), noise multiplier 1, C = 1, no evaluation. Ray gets as many CPUs as
    this measurement's threads, one per ClientApp. The round time is the gap between
    consecutive rows of the app's ``rounds.csv``, from round 2 on: the first round holds Ray's
    start, the imports and each Ray worker's one read of MNIST (cached in the worker after
    that; a node's first round still slices its images out of it, a millisecond).
    """
    try:
        import tomllib
    except ImportError:  # Python 3.10: flwr depends on tomli
        import tomli as tomllib

    from shuffle_opacus.flower.launch import LocalFederation

    app = ROOT / "experiments" / "flower_mnist"
    base = tomllib.loads((app / "pyproject.toml").read_text())["tool"]["flwr"]["app"]["config"]
    with tempfile.TemporaryDirectory(prefix="users-flower-") as tmp:
        out = Path(tmp) / "out"
        config = {
            **base,
            "num-nodes": args.clients,
            "examples-per-node": args.examples,
            "rate": args.rate,
            "noise-multiplier": 1.0,
            "clip-norm": 1.0,
            "local-steps": args.steps,
            "local-batch-size": args.batch,
            "local-lr": CLIENT_LR,
            "evaluate-every": 0,
            "checkin-seed": 0,
            "model": "cnn_small",
            "num-server-rounds": args.flower_rounds,
            "out-dir": str(out),
        }
        federation = LocalFederation(
            "simulation",
            num_nodes=args.clients,
            work_dir=Path(tmp) / "federation",
            ray_cpus=args.threads_now,
            client_cpus=1,
        )
        with federation as fed:
            outcome = fed.run(app, config, timeout=3600)
        if not outcome.completed:
            return f"failed: run {outcome.status}"
        (run_dir,) = out.iterdir()
        with (run_dir / "rounds.csv").open() as fh:
            stamps = [float(row["seconds"]) for row in csv.DictReader(fh)]
    return list(np.diff(stamps))


def pfl(args: argparse.Namespace) -> list[float] | str:
    python = Path(args.pfl_python)
    if not python.exists():
        return f"skipped: {python} does not exist (install pfl[pytorch] in its own venv)"
    probe = subprocess.run([str(python), "-c", "import pfl"], capture_output=True, text=True)
    if probe.returncode != 0:
        return f"skipped: pfl does not import under {python}"
    x, y = mnist(args.clients * args.examples)
    with tempfile.TemporaryDirectory(prefix="users-bench-") as tmp:
        path = Path(tmp) / "data.npz"
        np.savez(path, x=x.numpy(), y=y.numpy())
        cohort = round(args.clients * args.rate)
        command = [
            str(python),
            str(ROOT / "benchmarks" / "pfl_round.py"),
            *map(str, [args.threads_now, args.clients, args.examples, cohort]),
            *map(str, [args.steps, args.batch, args.rounds + 1, path]),
        ]
        env = {**os.environ, "OMP_NUM_THREADS": str(args.threads_now)}
        done = subprocess.run(command, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        return f"failed: {done.stderr.strip().splitlines()[-1]}"
    return json.loads(done.stdout.strip().splitlines()[-1])["per_round"][1:]


def memory_worker(args: argparse.Namespace) -> None:
    torch.set_num_threads(args.threads_now)
    trainer, optimizer = make_trainer(args, 60000, 1, 4)
    times = []
    for t in range(4):
        start = time.perf_counter()
        trainer.run_round(t)
        optimizer.step()
        times.append(time.perf_counter() - start)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"per_round": times[1:], "peak_rss_mib": peak}))


def memory(args: argparse.Namespace) -> dict:
    command = [sys.executable, __file__, "--memory-worker", "--threads", str(args.threads_now)]
    command += ["--chunk", str(args.chunk), "--steps", str(args.steps), "--batch", str(args.batch)]
    command += ["--rate", str(args.rate)]
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads_now)}
    done = subprocess.run(command, capture_output=True, text=True, env=env, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


PATHS = {
    "ours, private round": ours_private,
    "ours, local training only": ours_training_only,
    "per-client torch loop": torch_loop,
    "pfl 0.6": pfl,
    "Flower objects in one process": flower_inprocess,
    "Flower simulation": flower_simulation,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--clients", type=int, default=1000)
    parser.add_argument("--examples", type=int, default=60)
    parser.add_argument("--rate", type=float, default=0.1)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--batch", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=6, help="timed rounds (after a warm-up)")
    parser.add_argument(
        "--flower-rounds", type=int, default=8, help="rounds of the Flower simulation"
    )
    parser.add_argument("--chunk", type=int, default=128, help="client_chunk of the trainer")
    parser.add_argument("--paths", nargs="+", default=list(PATHS), choices=list(PATHS))
    parser.add_argument("--no-memory", action="store_true", help="skip the N = 60,000 run")
    parser.add_argument("--pfl-python", default="/work/venv-pfl/bin/python")
    parser.add_argument("--memory-worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT / "experiments"))
    if args.memory_worker:
        args.threads_now = args.threads[0]
        memory_worker(args)
        return
    rows = []
    for threads in args.threads:
        args.threads_now = threads
        torch.set_num_threads(threads)
        for name in args.paths:
            result = PATHS[name](args)
            rows.append((name, threads, result))
            shown = result if isinstance(result, str) else f"{statistics.median(result):.3f}"
            print(f"  {name}, {threads} thread(s): {shown}", file=sys.stderr)
        if not args.no_memory:
            rows.append(("memory", threads, memory(args)))
    cpus = len(os.sched_getaffinity(0))
    print(
        f"\n{cpus} CPU core(s), torch {torch.__version__}; N = {args.clients} clients x "
        f"{args.examples} images, rate {args.rate}, {args.steps} local steps of {args.batch}, "
        f"cnn_small; median of {args.rounds} rounds\n"
    )
    print("| path | threads | s/round | vs ours, private |")
    print("|---|---:|---:|---:|")
    mine = {t: statistics.median(r) for n, t, r in rows if n == "ours, private round"}
    for name, threads, result in rows:
        if name == "memory":
            continue
        if isinstance(result, str):
            print(f"| {name} | {threads} | {result} | |")
            continue
        median = statistics.median(result)
        ratio = f"{median / mine[threads]:.2f}x" if threads in mine else ""
        print(f"| {name} | {threads} | {median:.3f} | {ratio} |")
    for name, threads, result in rows:
        if name == "memory":
            print(
                f"\nN = 60,000 one-example clients, {threads} thread(s): "
                f"{statistics.median(result['per_round']):.3f} s/round, peak RSS "
                f"{result['peak_rss_mib']:,.0f} MiB"
            )
    only = {t: statistics.median(r) for n, t, r in rows if n == "ours, local training only"}
    for threads, private in mine.items():
        if threads in only:
            share = (private - only[threads]) / private
            print(f"clip + noise + shuffle, {threads} thread(s): {share:.1%} of the private round")


if __name__ == "__main__":
    main()
