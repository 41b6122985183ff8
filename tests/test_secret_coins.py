"""Secret coins: without a seed the check-in coins come from the operating system's entropy.

The guarantee needs the rounds' participants to be unknown to the adversary. A given seed is
recorded (``seed_given``), and such a run is a reproducible simulation; the README's snippets
give none.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path

import pytest
import torch
from opacus import PrivacyEngine
from torch.nn import functional as F  # noqa: N812

import shuffle_opacus
from tests.opacus_helpers import loader, model

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
