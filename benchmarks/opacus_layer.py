"""Timings of the Opacus layer on this machine (run: ``python benchmarks/opacus_layer.py``).

* ``get_epsilon`` of the ``shuffled_checkin`` accountant at the paper's MNIST setting, since the
  experiment asks for epsilon every round;
* calibration of the local noise multiplier to a target epsilon at that setting;
* the check-in sampler, one round of n = 60,000 clients;
* one private round (forward, backward, clipping, noise, update) of a 784-128-10 MLP with
  ``noise_mode="sum"`` and ``noise_mode="per_client"`` at B = 600 reports.

Timings use one thread (``torch.set_num_threads(1)``) and report the median of repeats.
"""

from __future__ import annotations

import itertools
import os
import statistics
import time
from collections.abc import Callable

import torch
from opacus import PrivacyEngine
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import shuffle_opacus
from shuffle_opacus.analysis.mechanisms import _step_table as _cached_step_rdp
from shuffle_opacus.engine.accountants import ShuffledCheckInAccountant
from shuffle_opacus.engine.sampling import FixedSizeShuffledSampler, ShuffledCheckInSampler

# Time the computation, not the on-disk PMF cache (docs/accounting.md), unless asked to.
os.environ.setdefault("SHUFFLE_OPACUS_CACHE_DIR", "off")


def median_time(fn: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def accountant_timings() -> None:
    # The Rényi bound by name (the default is pld; benchmarks/reporting.py times that).
    acc = ShuffledCheckInAccountant().configure(
        population=60000, sensitivity="paper", method="exact"
    )
    print("get_epsilon, shuffled_checkin exact, n=60000, rate=0.1, sigma=5 (paper convention)")
    print("  (first call computes the per-round RDP; later calls reuse it from a cache)")
    for steps in (1, 100, 5540):
        _cached_step_rdp.cache_clear()
        acc.history = [(5.0, 0.1, steps)]
        start = time.perf_counter()
        eps = acc.get_epsilon(1e-5)
        first = time.perf_counter() - start
        sec = median_time(lambda: acc.get_epsilon(1e-5), 5)
        print(
            f"  rounds={steps:5d}  epsilon={eps:.6f}  first {first * 1e3:6.1f} ms, "
            f"then {sec * 1e3:6.2f} ms"
        )
    start = time.perf_counter()
    sigma = shuffle_opacus.calibrate_noise_multiplier(
        target_epsilon=1.0,
        delta=1e-5,
        population=60000,
        rounds=5540,
        rate=0.1,
        sensitivity="paper",
        method="exact",
    )
    print(
        f"calibrate to epsilon=1 (5540 rounds): noise_multiplier={sigma:.6g} "
        f"in {time.perf_counter() - start:.2f} s"
    )
    sampler = ShuffledCheckInSampler(60000, 0.1, 100, seed=0)
    sec = median_time(lambda: sampler.batch(3), 20)
    print(f"ShuffledCheckInSampler.batch, n=60000, rate=0.1: {sec * 1e3:.2f} ms per round")


def training_timings(batch: int = 600) -> None:
    torch.manual_seed(0)
    n = batch * 4
    data = TensorDataset(torch.randn(n, 784), torch.randint(0, 10, (n,)))
    print(f"one private round of a 784-128-10 MLP, B={batch} reports, 1 thread")
    for mode in ("sum", "per_client"):
        net = nn.Sequential(nn.Linear(784, 128), nn.ReLU(), nn.Linear(128, 10))
        engine = PrivacyEngine(accountant="subsampled_shuffle")
        module, optimizer, loader = shuffle_opacus.make_private(
            engine,
            module=net,
            optimizer=torch.optim.SGD(net.parameters(), lr=0.1),
            data_loader=DataLoader(
                data, batch_sampler=FixedSizeShuffledSampler(n, batch, 10_000, seed=0)
            ),
            noise_multiplier=5.0,
            max_grad_norm=0.01,
            noise_mode=mode,
        )
        # One released round per step (the accountant refuses a step without one); the
        # batches are drawn before the timing.
        batches = iter(list(itertools.islice(loader, 8)))

        def one_round(module=module, optimizer=optimizer, batches=batches) -> None:
            x, y = next(batches)
            optimizer.zero_grad()
            nn.functional.cross_entropy(module(x), y).backward()
            optimizer.step()

        one_round()
        sec = median_time(one_round, 7)
        print(
            f"  noise_mode={mode:10s}  {sec * 1e3:8.1f} ms per round  "
            f"({batch / sec:,.0f} samples/s)"
        )


if __name__ == "__main__":
    torch.set_num_threads(1)
    accountant_timings()
    training_timings()
