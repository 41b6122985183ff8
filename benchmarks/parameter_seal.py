"""Cost of the parameter seal: one private step with it against the same step without it.

Run: ``python benchmarks/parameter_seal.py [--rounds 20]``. For each model, two private
optimizers over identical copies of the model step round by round, interleaved
(:func:`timing.compare`), on the same batches; the contender ``no seal`` has its seal removed
(``optimizer._seal = None``), so the ratio is what the bitwise copy and comparison of the
parameters add to a step (forward, backward, clipping, noise, update). The pre-hook that
refuses ``original_optimizer.step()`` outside the private step is on in both (a set lookup).

Models: the experiment's tanh CNN (26,010 parameters) at B = 256, a 784-128-10 MLP (101,770)
at B = 600, and a wide MLP 784-2048-2048-10 (5.8 million) at B = 16, the case where the
parameters are large next to the per-sample gradients.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
import warnings
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "experiments"))

import timing  # noqa: E402

timing.per_core(threads=1)

import torch  # noqa: E402
from opacus import PrivacyEngine  # noqa: E402
from shuffle_experiments.models import cnn  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

import shuffle_opacus  # noqa: E402
from shuffle_opacus.engine.parameter_seal import ParameterSeal  # noqa: E402


def models() -> dict[str, tuple[nn.Module, tuple[int, ...], int]]:
    """Name -> (model, input shape of one example, reports per round)."""
    torch.manual_seed(0)
    mlp = nn.Sequential(nn.Flatten(), nn.Linear(784, 128), nn.ReLU(), nn.Linear(128, 10))
    wide = nn.Sequential(
        nn.Flatten(),
        nn.Linear(784, 2048),
        nn.ReLU(),
        nn.Linear(2048, 2048),
        nn.ReLU(),
        nn.Linear(2048, 10),
    )
    return {
        "cnn (26,010), B=256": (cnn(), (1, 28, 28), 256),
        "mlp (101,770), B=600": (mlp, (784,), 600),
        "wide mlp (5.8M), B=16": (wide, (784,), 16),
    }


def private_step(net: nn.Module, shape: tuple[int, ...], batch: int, seed: int, sealed: bool):
    """Return a callable that runs one private round (its own sampler, same seed as its twin)."""
    n = batch * 4
    gen = torch.Generator().manual_seed(1)
    x, y = torch.randn(n, *shape, generator=gen), torch.randint(0, 10, (n,), generator=gen)
    engine = PrivacyEngine(accountant="subsampled_shuffle")
    module, optimizer, loader = shuffle_opacus.make_private(
        engine,
        module=net,
        optimizer=torch.optim.SGD(net.parameters(), lr=0.01),
        data_loader=DataLoader(TensorDataset(x, y), batch_size=1),
        noise_multiplier=5.0,
        max_grad_norm=1.0,
        sample_size=batch,
        rounds=10_000,
        seed=seed,
        noise_generator=torch.Generator().manual_seed(2),
    )
    if not sealed:
        optimizer._seal = None
    sampler: Any = loader.batch_sampler
    rounds = iter(sampler)  # the sampler's own rounds: each current at its release

    def one_round() -> None:
        index = torch.as_tensor(next(rounds))
        optimizer.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(module(x[index]), y[index]).backward()
        optimizer.step()

    return one_round


def seal_seconds(net: nn.Module, repeats: int = 15) -> float:
    """Median seconds of one record plus one comparison of ``net``'s parameters, alone."""
    params = list(net.parameters())
    seal = ParameterSeal()
    seal.record(params)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        assert not seal.changed(params)
        seal.record(params)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    """Time each model with and without the seal; print the tables."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args()
    warnings.filterwarnings("ignore")  # the twins share their seed on purpose
    for i, (name, (net, shape, batch)) in enumerate(models().items()):
        contenders = {
            "no seal": private_step(copy.deepcopy(net), shape, batch, 900 + i, sealed=False),
            "seal": private_step(copy.deepcopy(net), shape, batch, 900 + i, sealed=True),
        }
        result = timing.compare(
            contenders, rounds=args.rounds, warmup=2, title=name, progress=False
        )
        alone = seal_seconds(net)
        step = result["contenders"]["no seal"]["seconds"]
        print(
            f"the seal alone (compare + record): {alone * 1e3:.3f} ms, "
            f"{alone / min(step):.4f} of the fastest step without it"
        )


if __name__ == "__main__":
    main()
