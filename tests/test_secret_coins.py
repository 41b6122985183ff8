"""Secret coins: without a seed the check-in coins come from the operating system's entropy.

The guarantee needs the rounds' participants to be unknown to the adversary. A given seed is
recorded (``seed_given``), and such a run is a reproducible simulation; the README's snippets
give none.
"""

from __future__ import annotations

import functools
import itertools
import os
import re
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from opacus import PrivacyEngine
from torch.nn import functional as F  # noqa: N812
from torch.utils.data import DataLoader

import shuffle_opacus
from shuffle_opacus.engine.releases import ReplayError
from shuffle_opacus.engine.sampling import FixedSizeShuffledSampler, ShuffledCheckInSampler
from tests.opacus_helpers import dataset, loader, model, train

README = (Path(__file__).resolve().parents[1] / "README.md").read_text()


def _private(seed: int | None):
    engine = PrivacyEngine(accountant="shuffled_checkin")
    net = model()
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
    _, _, data = shuffle_opacus.make_private(
        engine, module=net, optimizer=optimizer, data_loader=loader(), noise_multiplier=2.0,
        max_grad_norm=1.0, rate=0.25, rounds=3, seed=seed,
    )  # fmt: skip
    return data.batch_sampler


def _clients(seed: int | None):
    x = torch.randn(40, 6)
    y = (x[:, 0] > 0).long()
    net = model()
    trainer = shuffle_opacus.make_private_clients(
        PrivacyEngine(accountant="shuffled_checkin"),
        module=net,
        optimizer=torch.optim.SGD(net.parameters(), lr=1.0),
        data=(x, y),
        partition=[list(range(i, i + 4)) for i in range(0, 40, 4)],
        loss_fn=functools.partial(F.cross_entropy, reduction="none"),
        noise_multiplier=2.0,
        max_update_norm=1.0,
        client_lr=0.1,
        local_steps=1,
        rate=0.5,
        rounds=3,
        seed=seed,
    )
    return trainer.sampler


@pytest.mark.parametrize("build", [_private, _clients])
def test_without_a_seed_the_coins_come_from_the_os_and_differ(build):
    first, second = build(None), build(None)
    assert not first.seed_given and not second.seed_given
    assert first.seed != second.seed  # 128 fresh bits each: equal with probability 2^-128


@pytest.mark.parametrize("build", [_private, _clients])
def test_a_given_seed_is_recorded(build):
    sampler = build(7)
    assert sampler.seed_given and sampler.seed == 7
    with pytest.raises(AttributeError, match="fixed once it is built"):
        sampler.seed_given = False


@pytest.mark.parametrize("snippet", ["opacus-loop", "clients-api"])
def test_the_readme_snippets_keep_the_coins_secret(snippet):
    code = re.search(rf"<!-- {snippet} -->\n```python\n(.+?)\n```", README, re.S).group(1)
    call = re.search(r"make_private(?:_clients)?\((.+?)\n\)", code, re.S).group(1)
    assert "seed=" not in call


# -- secure_mode: which generator each path uses ------------------------------------------------


@pytest.fixture
def draws(monkeypatch):
    """Count reads of ``os.urandom`` and constructions of numpy's PCG64 (``np.random``'s)."""
    counts: Counter = Counter()
    real_urandom, real_pcg = os.urandom, np.random.PCG64

    def urandom(k):
        counts["urandom"] += 1
        return real_urandom(k)

    def pcg64(*args, **kwargs):
        counts["PCG64"] += 1
        return real_pcg(*args, **kwargs)

    monkeypatch.setattr(os, "urandom", urandom)
    monkeypatch.setattr(np.random, "PCG64", pcg64)
    return counts


def secure_engine(accountant: str = "shuffled_checkin") -> PrivacyEngine:
    """An engine in secure mode. ``PrivacyEngine(secure_mode=True)`` needs torchcsprng, which
    has no build for this torch; its ``/dev/urandom`` generator is a ``torch.Generator``, so a
    plain one stands in for it (the tests check that the noise uses it, not what it is)."""
    engine = PrivacyEngine(accountant=accountant)
    engine.secure_mode = True
    engine.secure_rng = torch.Generator()
    return engine


SAMPLERS = {
    "checkin": lambda **kw: ShuffledCheckInSampler(200, 0.1, 4, **kw),
    "subsampled": lambda **kw: FixedSizeShuffledSampler(200, 17, 4, **kw),
    "full": lambda **kw: FixedSizeShuffledSampler(30, 30, 4, **kw),
}


@pytest.mark.parametrize("kind", sorted(SAMPLERS))
def test_a_secure_sampler_reads_the_os_and_never_builds_a_pcg64(kind, draws):
    sampler = SAMPLERS[kind](secure=True)
    assert sampler.secure and not sampler.seed_given and 0 <= sampler.seed < 2**128
    batches = list(sampler)
    assert draws["PCG64"] == 0 and draws["urandom"] >= len(batches) == 4
    for batch in batches:
        assert len(set(batch)) == len(batch) and all(0 <= i < sampler.n for i in batch)
    if kind != "checkin":
        assert all(len(b) == sampler.m for b in batches)
    assert "secure=True" in repr(sampler) and str(sampler.seed) not in repr(sampler)


@pytest.mark.parametrize("kind", sorted(SAMPLERS))
def test_a_seeded_sampler_still_draws_from_pcg64_alone(kind, draws):
    sampler = SAMPLERS[kind](seed=7)
    list(sampler)
    assert draws["PCG64"] == 4 and draws["urandom"] == 0 and not sampler.secure


def test_the_seeded_draws_are_unchanged():
    """Pinned before secure mode existed: every shipped number rests on these streams."""
    assert ShuffledCheckInSampler(30, 0.2, 3, seed=7).batch(2) == [
        5, 10, 25, 16, 13, 2, 15, 6, 14, 18, 23,
    ]  # fmt: skip
    assert FixedSizeShuffledSampler(20, 5, 3, seed=2**100).batch(1) == [15, 19, 9, 17, 12]


def test_a_secure_sampler_takes_no_seed():
    with pytest.raises(ValueError, match=r"^seed must be None with secure=True .* Found 3\.$"):
        ShuffledCheckInSampler(10, 0.5, 2, 3, secure=True)
    with pytest.raises(ValueError, match="secure must be True or False"):
        FixedSizeShuffledSampler(10, 5, 2, secure=1)
    sampler = FixedSizeShuffledSampler(10, 5, 2, secure=True)
    with pytest.raises(AttributeError, match="fixed once it is built"):
        sampler.secure = False


def test_make_private_in_secure_mode_draws_rounds_and_noise_secretly(draws, monkeypatch):
    engine = secure_engine()
    net = model()
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
    module, dp_optimizer, data = shuffle_opacus.make_private(
        engine, module=net, optimizer=optimizer, data_loader=loader(), noise_multiplier=2.0,
        max_grad_norm=1.0, rate=0.25, rounds=3,
    )  # fmt: skip
    assert data.batch_sampler.secure
    assert dp_optimizer.generator is engine.secure_rng and dp_optimizer.secure_mode
    generators = []
    real_normal = torch.normal

    def normal(*args, **kwargs):
        generators.append(kwargs.get("generator"))
        return real_normal(*args, **kwargs)

    monkeypatch.setattr(torch, "normal", normal)
    train(module, dp_optimizer, data)
    assert draws["PCG64"] == 0 and draws["urandom"] >= 3
    assert generators and all(g is engine.secure_rng for g in generators)
    assert len(engine.accountant) == 3 and engine.accountant.releases.secret == 3


def test_secure_mode_refuses_a_seed_a_pcg64_sampler_and_a_missing_secure_rng():
    def prepare(engine, data=None, **kw):
        net = model()
        return shuffle_opacus.make_private(
            engine, module=net, optimizer=torch.optim.SGD(net.parameters(), lr=0.1),
            data_loader=data or loader(), noise_multiplier=2.0, max_grad_norm=1.0, rate=0.25,
            rounds=3, **kw,
        )  # fmt: skip

    with pytest.raises(ValueError, match=r"^seed must be None with secure_mode=True: .* 5\.$"):
        prepare(secure_engine(), seed=5)
    seeded = DataLoader(dataset(), batch_sampler=ShuffledCheckInSampler(64, 0.25, 3, seed=1))
    with pytest.raises(ValueError, match=r"draws its rounds from numpy's PCG64; with secure_mode"):
        prepare(secure_engine(), data=seeded)
    engine = secure_engine()
    engine.secure_rng = None
    with pytest.raises(ValueError, match=r"^engine.secure_rng must be Opacus's secure generator"):
        prepare(engine)
    secure = DataLoader(dataset(), batch_sampler=ShuffledCheckInSampler(64, 0.25, 3, secure=True))
    prepare(secure_engine(), data=secure)  # a secure sampler of the user's is taken as it is


def _secure_clients(engine, **kw):
    x = torch.randn(40, 6, generator=torch.Generator().manual_seed(0))
    y = (x[:, 0] > 0).long()
    net = model()
    args = {
        "module": net,
        "optimizer": torch.optim.SGD(net.parameters(), lr=1.0),
        "data": (x, y),
        "partition": [list(range(i, i + 4)) for i in range(0, 40, 4)],
        "loss_fn": functools.partial(F.cross_entropy, reduction="none"),
        "noise_multiplier": 2.0,
        "max_update_norm": 1.0,
        "client_lr": 0.1,
        "local_steps": 1,
        "rate": 0.5,
        "rounds": 4,
        **kw,
    }
    return shuffle_opacus.make_private_clients(engine, **args)


def test_secure_rounds_are_never_released_again_after_a_resume(draws):
    engine = secure_engine()
    trainer = _secure_clients(engine)
    assert trainer.sampler.secure
    for _ in itertools.islice(trainer, 2):
        trainer.optimizer.step()
    assert draws["urandom"] >= 2
    saved = engine.accountant.state_dict()
    assert saved["released_secret"] == 2
    resumed = secure_engine()
    resumed.accountant.load_state_dict(saved)
    message = (
        r"^start_round=0: the shuffled_checkin accountant released rounds up to 1 from the "
        r"operating system's coins \(secure mode\), .* continue with start_round=2 or later\.$"
    )
    with pytest.raises(ReplayError, match=message):
        _secure_clients(resumed)
    plain = PrivacyEngine(accountant="shuffled_checkin")
    plain.accountant.load_state_dict(saved)
    with pytest.raises(ReplayError, match="continue with start_round=2"):
        _secure_clients(plain, seed=9)  # the record holds, whatever the seed
    trainer = _secure_clients(resumed, start_round=2)
    for _ in trainer:
        trainer.optimizer.step()
    assert len(resumed.accountant) == 4 and resumed.accountant.releases.secret == 4
    with pytest.raises(ValueError, match=r"^seed must be None with secure_mode=True"):
        _secure_clients(secure_engine(), seed=1)
