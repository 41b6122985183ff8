"""Seconds per round of user-level training: ours, the vmap floor, plain loops, pfl, Flower.

Run: ``python benchmarks/users.py [--threads 1] [--clients 1000] [--rounds 10] [--json PATH]``
(``--quick`` for a run of seconds). Every path is timed by ``benchmarks/timing.py``: the paths
run **interleaved round by round** (round ``r`` of every path, in alternating order), with one
thread pinned to one CPU for ``--threads 1``, the load of other processes recorded before,
during and after and the result flagged busy when they used more than a tenth of a core.

Setting (the issue's): N = 1,000 clients, each holding 60 MNIST training images (IID), a
**fixed cohort of 100 clients a round** for every path (ours through the ``subsampled_shuffle``
accountant, ``sample_size = 100``; ``--sampling checkin`` gives ours check-in at rate
cohort / N instead, about 100 a round), every participant taking 5 local SGD steps of batch 10
(learning rate 0.1) from the global model; the model is the experiment's ``cnn_small`` (5,154
weights, as in the Flower app); C = 1, noise multiplier 1; the server takes an SGD step of
learning rate 1 on the average. In a round every path below except pfl and Flower trains the
same clients on the same mini-batches (the round index seeds both). Paths:

* ``ours, private round``: :func:`shuffle_opacus.federated.make_private_clients`: vectorised
  local training, whole-update clipping, local noise (``noise_mode="sum"``), average, the
  accountant's step and the server's step;
* ``ours, local training only``: the same vectorised local training
  (:meth:`~shuffle_opacus.federated.FederatedTrainer.local_updates`), the plain mean and the
  server step: no clipping, no noise, no shuffle, no accounting;
* ``torch.func vmap floor``: the same local steps written bare, ``vmap(grad(loss))`` over the
  cohort with per-client weights, the batches' indices computed before timing: the compute
  that any vectorised implementation of this round has to do (no schedule, clip, noise);
* ``plain per-client loop``: one model and plain ``loss.backward()`` with an in-place SGD
  update, client after client, each reset to the global weights (no privacy);
* ``per-client loop, deepcopy``: the loop the earlier benchmark had: a ``deepcopy`` of the
  model and a new ``torch.optim.SGD`` per client (no privacy);
* ``pfl 0.6``: Apple's pfl (``benchmarks/pfl_round.py``) under ``--pfl-python`` (its own
  virtual environment; a round worker held at each round boundary), FedAvg with its local
  ``GaussianMechanism`` on a cohort of exactly 100; skipped with a message when that
  interpreter is missing or pfl does not import. Its model pools with ``nn.MaxPool2d``;
* ``pfl 0.6, FastMaxPool2d``: the same with the experiment's ``FastMaxPool2d`` (the pooling our
  ``cnn_small`` uses; the same numbers bit for bit, a faster forward pass on large batches), for
  a comparison on the same model code;
* ``Flower objects in one process`` (only with ``--paths``):
  :class:`~shuffle_opacus.flower.ShuffleCheckInFedAvg`, a ``ClientApp`` with
  :class:`~shuffle_opacus.flower.LocalShuffleDPMod` doing the same local training, on
  :class:`~shuffle_opacus.flower.InProcessGrid`, held at each round by its ``evaluate_fn``. The
  strategy has check-in only: about 100 clients a round, not exactly 100;
* ``Flower simulation`` (only with ``--paths``): the MNIST Flower app
  (``experiments/flower_mnist``) run by ``flwr run`` on a SuperLink with Ray; it runs its own
  rounds in other processes and cannot be interleaved: it is timed **in its own window** and
  printed apart, with its load record.

The memory run (skip it with ``--no-memory``) trains N = 60,000 one-example clients (all of
MNIST) with the same cohort fraction and local steps in a fresh process and reports its peak
resident set size; it is a size, not a comparison.
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
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402
from timing import (  # noqa: E402
    BUSY_THRESHOLD,
    RoundWorker,
    ThreadedRounds,
    compare,
    per_core,
    probe,
    thread_env,
    write_json,
)
from torch.nn import functional as F  # noqa: E402, N812

ROOT = Path(__file__).resolve().parents[1]
LOSS = functools.partial(F.cross_entropy, reduction="none")
CLIENT_LR = 0.1
BASELINE = "ours, private round"
SIMULATION = "Flower simulation"
FAST_PFL = "pfl 0.6, FastMaxPool2d"


@functools.lru_cache(maxsize=2)
def mnist(count: int) -> tuple[torch.Tensor, torch.Tensor]:
    from shuffle_experiments.data import load_mnist

    data = load_mnist()
    order = np.random.default_rng(0).permutation(len(data.train_labels))[:count]
    x = torch.from_numpy(data.train_images[order].astype(np.float32) / 255.0).unsqueeze(1)
    return x, torch.from_numpy(data.train_labels[order].astype(np.int64))


def cohort_of(args: argparse.Namespace, clients: int) -> int:
    """Clients a round among ``clients``: ``--cohort``, scaled to a population of another size."""
    return max(1, round(clients * args.cohort / args.clients))


def make_trainer(args: argparse.Namespace, clients: int, examples: int, rounds: int):
    from opacus import PrivacyEngine
    from shuffle_experiments.models import build_model

    from shuffle_opacus.federated import iid_partition, make_private_clients

    x, y = mnist(clients * examples)
    torch.manual_seed(0)
    model = build_model("cnn_small")
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    cohort = cohort_of(args, clients)
    if args.sampling == "fixed":
        engine = PrivacyEngine(accountant="subsampled_shuffle")
        sampling: dict[str, Any] = {"sample_size": cohort}
    else:
        engine = PrivacyEngine(accountant="shuffled_checkin")
        sampling = {"rate": cohort / clients}
    trainer = make_private_clients(
        engine,
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
        rounds=rounds,
        seed=0,
        client_chunk=args.chunk,
        **sampling,
    )
    return trainer, optimizer


def training(args: argparse.Namespace):
    from shuffle_opacus.federated import LocalTraining

    return LocalTraining(client_lr=CLIENT_LR, local_steps=args.steps, local_batch_size=args.batch)


def ours_private(args: argparse.Namespace, rounds: int) -> Callable[[int], dict]:
    trainer, optimizer = make_trainer(args, args.clients, args.examples, rounds)

    def run(r: int) -> dict:
        result = trainer.run_round(r)
        optimizer.step()
        return {"reports": result.reports}

    return run


def ours_training_only(args: argparse.Namespace, rounds: int) -> Callable[[int], dict]:
    trainer, optimizer = make_trainer(args, args.clients, args.examples, rounds)
    params = list(trainer.module.parameters())

    def run(r: int) -> dict:
        clients = np.asarray(trainer.sampler.batch(r), dtype=np.int64)
        sums = [torch.zeros_like(p) for p in params]
        for first in range(0, clients.size, trainer.client_chunk):
            updates, _ = trainer.local_updates(clients[first : first + trainer.client_chunk], r)
            for s, u in zip(sums, updates, strict=True):
                s += u.sum(dim=0)
        for p, s in zip(params, sums, strict=True):
            p.grad = s / max(clients.size, 1)
        optimizer.step()
        return {"reports": int(clients.size)}

    return run


def vmap_floor(args: argparse.Namespace, rounds: int) -> Callable[[int], dict]:
    """The round's local steps as bare ``torch.func`` code; the schedule is built beforehand."""
    from torch.func import functional_call, grad, vmap

    from shuffle_opacus.federated import local_batches

    trainer, optimizer = make_trainer(args, args.clients, args.examples, rounds)
    model, x, y, part = trainer.module, trainer.inputs, trainer.targets, trainer.partition
    names = [k for k, _ in model.named_parameters()]
    params = [p for _, p in model.named_parameters()]
    plan = training(args)
    seed = trainer.sampler.seed
    schedules = []
    for r in range(rounds):
        clients = trainer.sampler.batch(r)
        rows = [np.stack(local_batches(part, c, plan, seed=seed, round_index=r)) for c in clients]
        schedules.append(torch.as_tensor(np.stack(rows)))  # (clients, steps, batch), all full

    def loss(weights: tuple[torch.Tensor, ...], xb: torch.Tensor, yb: torch.Tensor):
        out = functional_call(model, dict(zip(names, weights, strict=True)), (xb,))
        return F.cross_entropy(out, yb)

    step = vmap(grad(loss))

    def run(r: int) -> dict:
        index = schedules[r]
        base = [p.detach() for p in params]
        local = tuple(b.unsqueeze(0).expand(index.shape[0], *b.shape) for b in base)
        for s in range(index.shape[1]):
            rows = index[:, s]
            grads = step(local, x[rows], y[rows])
            local = tuple(w - CLIENT_LR * g for w, g in zip(local, grads, strict=True))
        for p, b, w in zip(params, base, local, strict=True):
            p.grad = (b.unsqueeze(0) - w).mean(dim=0)
        optimizer.step()
        return {"reports": int(index.shape[0])}

    return run


def plain_loop(args: argparse.Namespace, rounds: int) -> Callable[[int], dict]:
    """Client after client on one local model, reset to the global weights, in-place SGD."""
    from shuffle_opacus.federated import local_batches

    trainer, optimizer = make_trainer(args, args.clients, args.examples, rounds)
    model, x, y, part = trainer.module, trainer.inputs, trainer.targets, trainer.partition
    local = copy.deepcopy(model)  # once, before timing
    weights = list(local.parameters())
    plan = training(args)
    seed = trainer.sampler.seed

    def run(r: int) -> dict:
        clients = trainer.sampler.batch(r)
        base = [p.detach() for p in model.parameters()]
        sums = [torch.zeros_like(p) for p in base]
        for c in clients:
            with torch.no_grad():
                for w, b in zip(weights, base, strict=True):
                    w.copy_(b)
            for batch in local_batches(part, c, plan, seed=seed, round_index=r):
                index = torch.as_tensor(batch)
                F.cross_entropy(local(x[index]), y[index]).backward()
                with torch.no_grad():
                    for w in weights:
                        w.sub_(w.grad, alpha=CLIENT_LR)
                        w.grad = None
            with torch.no_grad():
                for s, b, w in zip(sums, base, weights, strict=True):
                    s += b - w
        for p, s in zip(model.parameters(), sums, strict=True):
            p.grad = s / max(len(clients), 1)
        optimizer.step()
        return {"reports": len(clients)}

    return run


def deepcopy_loop(args: argparse.Namespace, rounds: int) -> Callable[[int], dict]:
    """The earlier benchmark's loop: a deepcopy of the model and an optimizer per client."""
    from shuffle_opacus.federated import local_batches

    trainer, optimizer = make_trainer(args, args.clients, args.examples, rounds)
    model, x, y, part = trainer.module, trainer.inputs, trainer.targets, trainer.partition
    plan = training(args)
    seed = trainer.sampler.seed

    def run(r: int) -> dict:
        clients = trainer.sampler.batch(r)
        base = [p.detach().clone() for p in model.parameters()]
        sums = [torch.zeros_like(p) for p in base]
        for c in clients:
            local = copy.deepcopy(model)
            local_opt = torch.optim.SGD(local.parameters(), lr=CLIENT_LR)
            for batch in local_batches(part, c, plan, seed=seed, round_index=r):
                index = torch.as_tensor(batch)
                local_opt.zero_grad()
                F.cross_entropy(local(x[index]), y[index]).backward()
                local_opt.step()
            for s, b, p in zip(sums, base, local.parameters(), strict=True):
                s += b - p.detach()
        for p, s in zip(model.parameters(), sums, strict=True):
            p.grad = s / max(len(clients), 1)
        optimizer.step()
        return {"reports": len(clients)}

    return run


def pfl_worker(args: argparse.Namespace, rounds: int, pool: str = "nn") -> RoundWorker | str:
    python = Path(args.pfl_python)
    if not python.exists():
        return f"skipped: {python} does not exist (install pfl[pytorch] in its own venv)"
    probe_ = subprocess.run([str(python), "-c", "import pfl"], capture_output=True, text=True)
    if probe_.returncode != 0:
        return f"skipped: pfl does not import under {python}"
    x, y = mnist(args.clients * args.examples)
    path = Path(args.tmp) / "pfl-data.npz"
    np.savez(path, x=x.numpy(), y=y.numpy())
    command = [
        str(python),
        str(ROOT / "benchmarks" / "pfl_round.py"),
        *map(str, [args.threads_now, args.clients, args.examples, cohort_of(args, args.clients)]),
        *map(str, [args.steps, args.batch, rounds, path, pool]),
    ]
    return RoundWorker(command, env=thread_env(args.threads_now))


def flower_inprocess(args: argparse.Namespace, rounds: int) -> ThreadedRounds:
    import logging

    from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
    from flwr.clientapp import ClientApp
    from shuffle_experiments.models import build_model

    from shuffle_opacus.federated import local_batches
    from shuffle_opacus.flower import (
        InProcessGrid,
        LocalShuffleDPMod,
        ShuffleCheckInFedAvg,
        ShufflePrivacyConfig,
    )

    trainer, _ = make_trainer(args, args.clients, args.examples, rounds)
    x, y, part = trainer.inputs, trainer.targets, trainer.partition
    plan = training(args)
    app = ClientApp(mods=[LocalShuffleDPMod(min_noise_multiplier=0.5)])

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        i = int(context.node_config["partition-id"])
        t = int(msg.content["config"]["server-round"]) - 1
        model = build_model("cnn_small")
        model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
        optimizer = torch.optim.SGD(model.parameters(), lr=CLIENT_LR)
        for batch in local_batches(part, i, plan, seed=0, round_index=t):
            index = torch.as_tensor(batch)
            optimizer.zero_grad()
            F.cross_entropy(model(x[index]), y[index]).backward()
            optimizer.step()
        content = {
            "arrays": ArrayRecord(model.state_dict()),
            "metrics": MetricRecord({"num-examples": 1}),
        }
        return Message(RecordDict(content), reply_to=msg)

    rate = cohort_of(args, args.clients) / args.clients
    privacy = ShufflePrivacyConfig(noise_multiplier=1.0, clip_norm=1.0, rate=rate, delta=1e-5)
    strategy = ShuffleCheckInFedAvg(privacy=privacy, num_nodes=args.clients, seed=0)
    grid = InProcessGrid(app, args.clients)
    logging.getLogger("flwr").setLevel(logging.WARNING)
    torch.manual_seed(0)
    initial = ArrayRecord(build_model("cnn_small").state_dict())

    def driver(boundary: Callable[[], None]) -> None:
        def at_boundary(server_round: int, arrays: ArrayRecord) -> None:
            boundary()

        strategy.start(grid, initial, num_rounds=rounds, evaluate_fn=at_boundary)

    return ThreadedRounds(driver)


def flower_simulation(args: argparse.Namespace) -> list[float] | str:
    """A real Flower simulation of the setting: SuperLink, Ray, ``flwr run`` of the MNIST app.

    The app of ``experiments/flower_mnist`` in the trusted-server mode with N nodes of
    ``examples`` images, check-in rate cohort / N, ``local-steps`` mini-batches of ``batch``
    (learning rate 0.1), noise multiplier 1, C = 1, no evaluation. Ray gets as many CPUs as
    this measurement's threads, one per ClientApp. The round time is the gap between
    consecutive rows of the app's ``rounds.csv``, from round 2 on: the first round holds Ray's
    start, the imports and each Ray worker's one read of MNIST.
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
            "rate": cohort_of(args, args.clients) / args.clients,
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


def flower_simulation_window(args: argparse.Namespace) -> dict[str, Any]:
    """The simulation in its own window (it cannot be interleaved), with its load record."""
    before = probe(args.probe)
    started = time.perf_counter()
    result = flower_simulation(args)
    wall = time.perf_counter() - started
    after = probe(args.probe)
    record: dict[str, Any] = {"wall_s": wall, "load": {"before": before, "after": after}}
    # Its processes are not ours to count, so only the idle probes around it can flag it.
    others = [p["others_cores"] for p in (before, after) if p["others_cores"] is not None]
    record["busy"] = not others or max(others) > BUSY_THRESHOLD
    if isinstance(result, str):
        record["skipped"] = result
    else:
        record.update(seconds=result, median=statistics.median(result))
    return record


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
    command += ["--clients", str(args.clients), "--cohort", str(args.cohort)]
    command += ["--sampling", args.sampling]
    env = thread_env(args.threads_now)
    done = subprocess.run(command, capture_output=True, text=True, env=env, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


PATHS: dict[str, Callable[[argparse.Namespace, int], Any]] = {
    BASELINE: ours_private,
    "ours, local training only": ours_training_only,
    "torch.func vmap floor": vmap_floor,
    "plain per-client loop": plain_loop,
    "per-client loop, deepcopy": deepcopy_loop,
    "pfl 0.6": pfl_worker,
    FAST_PFL: functools.partial(pfl_worker, pool="fast"),
    "Flower objects in one process": flower_inprocess,
}
DEFAULT_PATHS = [n for n in PATHS if n != "Flower objects in one process"]


def ratio_line(result: dict[str, Any], name: str, against: str) -> str | None:
    """``name`` against ``against``: ratio of medians, of minimums, range of per-round ratios."""
    table = result["contenders"]
    if name not in table or against not in table:
        return None
    mine, theirs = table[name]["seconds"], table[against]["seconds"]
    per = [a / b for a, b in zip(mine, theirs, strict=True)]
    return (
        f"{name} / {against}: {statistics.median(mine) / statistics.median(theirs):.2f}x "
        f"(medians), {min(mine) / min(theirs):.2f}x (minimums), per round "
        f"{min(per):.2f}-{max(per):.2f}"
    )


def summarise(result: dict[str, Any]) -> list[str]:
    lines = []
    table = result["contenders"]
    counts = []
    for name, entry in table.items():
        reports = [e.get("reports") for e in entry.get("extras", []) if e and "reports" in e]
        if reports:
            counts.append(f"{name} {statistics.mean(reports):.1f}")
    if counts:
        lines.append("clients a round (mean over the timed rounds): " + ", ".join(counts))
    for name, against in (
        ("pfl 0.6", BASELINE),
        (BASELINE, "torch.func vmap floor"),
        ("ours, local training only", "torch.func vmap floor"),
        ("pfl 0.6", "torch.func vmap floor"),
        (FAST_PFL, BASELINE),
        (FAST_PFL, "pfl 0.6"),
        ("per-client loop, deepcopy", "plain per-client loop"),
        ("plain per-client loop", BASELINE),
        ("Flower objects in one process", BASELINE),
    ):
        line = ratio_line(result, name, against)
        if line:
            lines.append(line)
    if BASELINE in table and "ours, local training only" in table:
        private, only = table[BASELINE]["median"], table["ours, local training only"]["median"]
        lines.append(
            f"clip + noise + shuffle + accounting: {(private - only) / private:+.1%} of the "
            "private round (difference of medians)"
        )
    if "pfl 0.6" in table and BASELINE in table:
        speedup = table["pfl 0.6"]["median"] / table[BASELINE]["median"]
        verdict = "met" if speedup >= 2 else "not met"
        lines.append(f"goal: a user-level round >= 2x pfl's speed: {speedup:.2f}x, {verdict}")
        if "torch.func vmap floor" in table:
            floor = table["pfl 0.6"]["median"] / table["torch.func vmap floor"]["median"]
            lines.append(f"  the vmap floor itself is {floor:.2f}x pfl's speed")
        if FAST_PFL in table:
            fast = table[FAST_PFL]["median"] / table[BASELINE]["median"]
            lines.append(f"  against pfl with the same pooling (FastMaxPool2d): {fast:.2f}x")
    if result["busy"]:
        lines.append("BUSY: " + "; ".join(result["busy_reasons"]))
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, nargs="+", default=[1])
    parser.add_argument("--clients", type=int, default=1000)
    parser.add_argument("--examples", type=int, default=60)
    parser.add_argument(
        "--cohort", type=int, default=None, help="clients a round (default: clients x rate)"
    )
    parser.add_argument(
        "--rate", type=float, default=0.1, help="cohort as a fraction of the clients (0.1)"
    )
    parser.add_argument(
        "--sampling",
        choices=("fixed", "checkin"),
        default="fixed",
        help="ours: a fixed-size cohort (subsampled_shuffle) or check-in at rate cohort / N",
    )
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--batch", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=10, help="timed rounds (after warm-up)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed rounds first")
    parser.add_argument(
        "--flower-rounds", type=int, default=8, help="rounds of the Flower simulation"
    )
    parser.add_argument("--chunk", type=int, default=128, help="client_chunk of the trainer")
    parser.add_argument("--paths", nargs="+", default=DEFAULT_PATHS, choices=[*PATHS, SIMULATION])
    parser.add_argument("--no-memory", action="store_true", help="skip the N = 60,000 run")
    parser.add_argument("--no-pin", action="store_true", help="do not pin one-thread runs")
    parser.add_argument("--pfl-python", default="/work/venv-pfl/bin/python")
    parser.add_argument("--probe", type=float, default=1.0, help="seconds of each load probe")
    parser.add_argument(
        "--wait-quiet", type=float, default=0.0, help="wait up to this long for a quiet machine"
    )
    parser.add_argument("--json", type=Path, help="also write the results to this file")
    parser.add_argument(
        "--quick", action="store_true", help="200 clients, 2 rounds, no memory run (seconds)"
    )
    parser.add_argument("--memory-worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.quick:
        args.clients, args.rounds, args.no_memory, args.probe = 200, 2, True, 0.3
    if args.cohort is None:
        args.cohort = max(1, round(args.clients * args.rate))
    sys.path.insert(0, str(ROOT / "experiments"))
    if args.memory_worker:
        args.threads_now = args.threads[0]
        memory_worker(args)
        return
    payload: dict[str, Any] = {"settings": {k: v for k, v in vars(args).items()}, "runs": []}
    for threads in args.threads:
        args.threads_now = threads
        cpu = per_core(threads, pin=threads == 1 and not args.no_pin)
        total = args.warmup + args.rounds
        run: dict[str, Any] = {"threads": threads, "pinned_cpu": cpu, "skipped": {}}
        with tempfile.TemporaryDirectory(prefix="users-bench-") as tmp:
            args.tmp = tmp
            contenders = {}
            for name in args.paths:
                if name == SIMULATION:
                    continue
                built = PATHS[name](args, total)
                if isinstance(built, str):
                    run["skipped"][name] = built
                    print(f"  {name}: {built}", file=sys.stderr)
                else:
                    contenders[name] = built
            title = (
                f"user-level round, N = {args.clients} x {args.examples}, cohort "
                f"{args.cohort} ({args.sampling} for ours), {args.steps} local steps of "
                f"{args.batch}, cnn_small, {threads} thread(s)"
            )
            try:
                run["comparison"] = compare(
                    contenders,
                    rounds=args.rounds,
                    warmup=args.warmup,
                    baseline=BASELINE if BASELINE in contenders else None,
                    title=title,
                    probe_s=args.probe,
                    wait_quiet_s=args.wait_quiet,
                )
            finally:
                for name, fn in contenders.items():
                    if isinstance(fn, RoundWorker):
                        run.setdefault("workers", {})[name] = fn.close()
                    elif isinstance(fn, ThreadedRounds):
                        fn.close()
        for name, why in run["skipped"].items():
            print(f"{name}: {why}")
        for line in summarise(run["comparison"]):
            print(line)
        if SIMULATION in args.paths:
            record = flower_simulation_window(args)
            run["flower_simulation"] = record
            shown = record.get("skipped") or f"{record['median']:.3f} s/round (median)"
            flag = "; BUSY before or after" if record["busy"] else ""
            print(
                f"\n{SIMULATION}, {threads} thread(s), own window (not interleaved): {shown}{flag}"
            )
        if not args.no_memory:
            record = memory(args)
            run["memory"] = record
            print(
                f"\nN = 60,000 one-example clients, {threads} thread(s): "
                f"{statistics.median(record['per_round']):.3f} s/round, peak RSS "
                f"{record['peak_rss_mib']:,.0f} MiB"
            )
        payload["runs"].append(run)
    if args.json is not None:
        write_json(args.json, payload)


if __name__ == "__main__":
    main()
