"""Which generator each Flower path draws from: the operating system's unless given a seed."""

from __future__ import annotations

import os
import random
from collections import Counter

import numpy as np
import pytest

pytest.importorskip("flwr")

from flwr.app import Array, ArrayRecord  # noqa: E402

from shuffle_opacus.common.secure_random import SecureGenerator  # noqa: E402
from shuffle_opacus.flower import (  # noqa: E402
    InProcessGrid,
    LocalShuffleDPMod,
    SecAggCheckInFedAvg,
    SecAggCheckInMod,
    ShuffleCheckInFedAvg,
    ShufflePrivacyConfig,
    check_in,
    make_rng,
)
from shuffle_opacus.flower.secagg import mod as secagg_mod_module  # noqa: E402

from .helpers import context, instruction, model, numpy_app, shift_update  # noqa: E402


@pytest.fixture
def draws(monkeypatch):
    """Count reads of ``os.urandom`` and numpy generators built (PCG64 or ``default_rng``)."""
    counts: Counter = Counter()
    real_urandom, real_pcg, real_default = os.urandom, np.random.PCG64, np.random.default_rng

    def urandom(k):
        counts["urandom"] += 1
        return real_urandom(k)

    def pcg64(*args, **kwargs):
        counts["numpy"] += 1
        return real_pcg(*args, **kwargs)

    def default_rng(*args, **kwargs):
        counts["numpy"] += 1
        return real_default(*args, **kwargs)

    monkeypatch.setattr(os, "urandom", urandom)
    monkeypatch.setattr(random, "_urandom", urandom)  # random.SystemRandom's own reference
    monkeypatch.setattr(np.random, "PCG64", pcg64)
    monkeypatch.setattr(np.random, "default_rng", default_rng)
    return counts


def privacy(rate: float = 1.0) -> ShufflePrivacyConfig:
    return ShufflePrivacyConfig(
        noise_multiplier=1.0, clip_norm=0.5, rate=rate, delta=1e-5, method="exact"
    )


def _train_once(mod: LocalShuffleDPMod) -> np.ndarray:
    arrays = ArrayRecord({"w": Array(np.zeros(20, dtype=np.float64))})
    app = numpy_app(lambda pid, received: received, mod=mod)
    msg = instruction(arrays, {**privacy().to_config(), "server-round": 1}, node=1001)
    return app(msg, context(0, 4)).content["arrays"]["w"].numpy()


def test_the_trusted_server_mod_draws_its_noise_from_the_os(draws):
    noised = _train_once(LocalShuffleDPMod(min_noise_multiplier=0.0))
    assert draws["numpy"] == 0 and draws["urandom"] >= 1
    assert np.all(noised != 0.0)


def test_a_seeded_trusted_server_mod_draws_from_numpy_alone(draws):
    first = _train_once(LocalShuffleDPMod(min_noise_multiplier=0.0, noise_seed=3))
    assert draws["numpy"] >= 1 and draws["urandom"] == 0
    assert np.array_equal(
        first, _train_once(LocalShuffleDPMod(min_noise_multiplier=0.0, noise_seed=3))
    )


def test_the_secagg_mod_flips_its_coin_and_draws_its_noise_from_the_os(monkeypatch):
    """A round of four nodes without a seed: every node's generator is the OS's (four nodes at
    σ = 1, γ = 1: the proven epsilon of the last round is that of test_strategy.py, cached)."""
    monkeypatch.setattr(secagg_mod_module, "_SLEEP", lambda seconds: None)
    seen: list = []
    real = SecAggCheckInMod._draw

    def spy(self, ctx, rate, server_round):
        rng, coin = real(self, ctx, rate, server_round)
        seen.append((type(rng), coin))
        return rng, coin

    monkeypatch.setattr(SecAggCheckInMod, "_draw", spy)
    mod = SecAggCheckInMod(min_noise_multiplier=0.0, reply_after=30.0)
    grid = InProcessGrid(numpy_app(shift_update(0.04), mod=mod), 4)
    SecAggCheckInFedAvg(privacy=privacy(), num_nodes=4).start(grid, model(), num_rounds=1)
    assert seen == [(SecureGenerator, True)] * 4  # rate 1: every coin is heads
    seeded = SecAggCheckInMod(min_noise_multiplier=0.0, reply_after=30.0, seed=1)
    assert isinstance(seeded._draw(context(0, 3), 0.5, 1)[0], np.random.Generator)


def test_the_strategys_coins_and_shuffle_read_the_os_without_a_seed(draws):
    coins = check_in(range(50), 0.5, make_rng())
    assert draws["urandom"] >= 50 and draws["numpy"] == 0
    assert set(coins) <= set(range(50))
    reads = draws["urandom"]
    check_in(range(50), 0.5, make_rng(4))
    assert draws["urandom"] == reads  # a seeded strategy: Python's Mersenne Twister
    strategy = ShuffleCheckInFedAvg(privacy=privacy(0.5), num_nodes=4)
    assert type(strategy._rng).__name__ == "SystemRandom"
