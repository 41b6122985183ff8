"""The plan checks before round 0: the optimizer's learning rate, the ranges in messages, and
:func:`check_plan_values` with the caller's own names (issue 41, part 6)."""

from __future__ import annotations

import functools

import pytest
import torch
from opacus import PrivacyEngine
from torch import nn
from torch.nn import functional as F  # noqa: N812

import shuffle_opacus
from shuffle_opacus.engine.plan_checks import check_plan_values, optimizer_lr
from shuffle_opacus.federated import make_private_clients

from .opacus_helpers import loader, model

X = torch.randn(20, 3, generator=torch.Generator().manual_seed(0))
Y = torch.randint(0, 2, (20,), generator=torch.Generator().manual_seed(1))
CLIENTS = [list(range(0, 5)), list(range(5, 10)), list(range(10, 20))]


def weights(net: nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in net.parameters()]


@pytest.mark.parametrize("make", [torch.optim.SGD, torch.optim.Adam])
def test_an_overflowing_learning_rate_is_refused_before_round_0(make):
    # Before: accepted; the first step raised "value cannot be converted to type float without
    # overflow" after the round's noisy sum had been released.
    engine = PrivacyEngine(accountant="shuffled_checkin")
    net = model()
    before = weights(net)
    with pytest.raises(ValueError, match=r"^the optimizer's lr must be at most 1\.84e\+19 .*"):
        shuffle_opacus.make_private(
            engine,
            module=net,
            optimizer=make(net.parameters(), lr=1e300),
            data_loader=loader(),
            noise_multiplier=2.0,
            max_grad_norm=1.0,
            rounds=4,
            rate=0.5,
            seed=0,
        )
    assert all(torch.equal(a, b) for a, b in zip(before, weights(net), strict=True))
    assert len(engine.accountant) == 0 and not engine.accountant.is_configured


def test_the_server_learning_rate_is_checked_at_user_level():
    engine = PrivacyEngine(accountant="shuffled_checkin")
    net = nn.Linear(3, 2)
    with pytest.raises(ValueError, match=r"^the optimizer's lr must be at most"):
        make_private_clients(
            engine,
            module=net,
            optimizer=torch.optim.SGD(net.parameters(), lr=1e30),
            data=(X, Y),
            partition=CLIENTS,
            loss_fn=functools.partial(F.cross_entropy, reduction="none"),
            noise_multiplier=2.0,
            max_update_norm=1.0,
            client_lr=0.1,
            local_steps=1,
            rounds=3,
            rate=0.5,
            seed=0,
        )
    assert len(engine.accountant) == 0


def test_optimizer_lr_is_the_largest_group_rate():
    a, b = nn.Linear(2, 2), nn.Linear(2, 2)
    sgd = torch.optim.SGD(
        [{"params": a.parameters(), "lr": 0.1}, {"params": b.parameters(), "lr": 3.0}]
    )
    assert optimizer_lr(sgd) == 3.0
    assert optimizer_lr(torch.optim.SGD(a.parameters(), lr=torch.tensor(0.5))) == 0.5


PLAN = {
    "noise_multiplier": 1.0,
    "max_norm": 1.0,
    "population": 60_000,
    "sample_rate": 0.1,
    "sensitivity": "replace-one",
    "rounds": 5,
    "protocol": "checkin",
    "dtype": torch.float32,
}
NAMES = {
    "noise_multiplier": "privacy.noise_multiplier",
    "max_norm": "privacy.clipping_norm",
    "lr": "optimizer.lr",
    "client_lr": "clients.client_lr",
}


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"lr": 1e300}, r"^optimizer\.lr must be at most 1\.84e\+19 \(.*\)\. Found 1e\+300\.$"),
        ({"client_lr": 1e300}, r"^clients\.client_lr must be at most 1\.84e\+19 "),
        ({"max_norm": 1e300}, r"^privacy\.clipping_norm must be at most 1\.84e\+19 "),
        (
            {"noise_multiplier": 1e300},
            r"^privacy\.noise_multiplier must keep .*: privacy\.noise_multiplier <= 7\.53e\+16 "
            r"with privacy\.clipping_norm 1 and n = 60000\. Found 1e\+300\.$",
        ),
        (
            {"noise_multiplier": 1e-300},
            r"^privacy\.noise_multiplier=1e-300: .* privacy\.noise_multiplier must be in "
            r"\[2e-150, 2e\+150\] ",
        ),
    ],
)
def test_plan_values_name_the_callers_parameters_and_the_range(change, message):
    with pytest.raises(ValueError, match=message) as caught:
        check_plan_values(**{**PLAN, **change}, names=NAMES)
    text = str(caught.value)
    assert "\n" not in text
    assert not any(word in text for word in ("max_grad_norm", "max_update_norm", "sigma must"))


def test_plan_values_accept_a_sound_plan():
    check_plan_values(**PLAN, lr=0.3, client_lr=0.1, names=NAMES)
