"""Side doors around the guarded step: the wrapped optimizer, other optimizers, direct writes.

Issue 41, part 4: after a refused second step the round's noisy gradient stayed in ``p.grad``
and ``optimizer.original_optimizer.step()`` applied it; stepping ``original_optimizer`` in the
loop applied the plain gradient while the engine reported the private ε.
"""

from __future__ import annotations

import math

import pytest
import torch
from opacus import PrivacyEngine
from torch import nn
from torch.nn import functional as F  # noqa: N812

import shuffle_opacus
from shuffle_opacus.engine.parameter_seal import ParameterSeal, refuse_outside_steps

from .opacus_helpers import SETTINGS, loader, model


def private(seed: int, grad_sample_mode: str = "hooks"):
    """A private SGD with momentum; each test its own seed (one engine per seed and data)."""
    engine = PrivacyEngine(accountant="shuffled_checkin")
    net = model()
    net, opt, private_loader = shuffle_opacus.make_private(
        engine,
        module=net,
        optimizer=torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9),
        data_loader=loader(),
        noise_multiplier=2.0,
        max_grad_norm=1.0,
        rounds=8,
        seed=seed,
        grad_sample_mode=grad_sample_mode,
        **SETTINGS["shuffled_checkin"][0],
    )
    return engine, net, opt, private_loader


def backward(net: nn.Module, opt, x: torch.Tensor, y: torch.Tensor) -> None:
    opt.zero_grad()
    F.cross_entropy(net(x), y).backward()


def weights(net: nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in net.parameters()]


def same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return all(torch.equal(u, v) for u, v in zip(a, b, strict=True))


@pytest.mark.parametrize("grad_sample_mode", ["hooks", "fast"])
def test_a_refused_step_leaves_no_noisy_gradient_for_the_wrapped_optimizer(grad_sample_mode):
    engine, net, opt, private_loader = private(
        4101 + (grad_sample_mode == "fast"), grad_sample_mode
    )
    x, y = next(iter(private_loader))
    backward(net, opt, x, y)
    opt.step()
    epsilon = engine.get_epsilon(1e-5)
    backward(net, opt, x, y)
    with pytest.raises(ValueError, match="was stepped already"):
        opt.step()
    for p in opt.params:  # before: p.grad held round 0's fresh noisy gradient
        assert p.grad is None and p.summed_grad is None and p.grad_sample is None
    before = weights(net)
    with pytest.raises(ValueError, match=r"^optimizer.original_optimizer.step\(\) was called"):
        opt.original_optimizer.step()  # before: applied the refused round's noise
    assert same(before, weights(net))
    assert engine.get_epsilon(1e-5) == epsilon


def test_stepping_the_wrapped_optimizer_in_the_loop_is_refused_before_the_weights_change():
    engine, net, opt, private_loader = private(4103)
    before = weights(net)
    x, y = next(iter(private_loader))
    backward(net, opt, x, y)
    with pytest.raises(ValueError, match="no accountant checked"):
        opt.original_optimizer.step()  # before: the plain gradient, 8 times, at epsilon 1.19
    assert same(before, weights(net))
    opt.step()  # the guarded step on the same round still goes through
    assert not same(before, weights(net))


def test_the_optimizer_keeps_working_under_opacus_and_torch():
    engine, net, opt, private_loader = private(4104)
    schedule = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    steps = 0
    for x, y in private_loader:
        backward(net, opt, x, y)
        opt.step()
        schedule.step()
        steps += 1
    state = opt.state_dict()
    opt.load_state_dict(state)
    assert steps == len(engine.accountant) == 8
    assert math.isclose(opt.param_groups[0]["lr"], 0.1 * 0.5**4)


@pytest.mark.parametrize("how", ["another optimizer", "p.data", "zero-sum"])
def test_parameters_changed_outside_a_step_are_refused_at_the_next(how):
    seeds = {"another optimizer": 4105, "p.data": 4107, "zero-sum": 4108}
    engine, net, opt, private_loader = private(seeds[how])
    batches = iter(private_loader)
    x, y = next(batches)
    backward(net, opt, x, y)
    opt.step()
    left = weights(net)
    x, y = next(batches)
    backward(net, opt, x, y)
    params = list(net.parameters())
    if how == "another optimizer":  # the plain gradient of round 1
        torch.optim.SGD(params, lr=0.1).step()
    elif how == "p.data":  # a manual update that bumps no version counter
        params[0].data.add_(params[0].grad, alpha=-0.1)
    else:  # keeps the sum of the last bias (a checksum of sums would miss it)
        with torch.no_grad():
            params[-1][0] += 0.25
            params[-1][1] -= 0.25
    changed = weights(net)
    with pytest.raises(
        ValueError, match="^optimizer.step\\(\\) #2: parameters .* changed since"
    ) as e:
        opt.step()
    assert "counts 2 released rounds and covers only the 1 steps" in str(e.value)
    assert same(changed, weights(net))
    assert all(p.grad is None for p in opt.params)
    with torch.no_grad():  # restored as step #1 left them: the round steps
        for p, w in zip(params, left, strict=True):
            p.copy_(w)
    backward(net, opt, x, y)
    opt.step()
    assert len(engine.accountant) == 2


def test_micro_batches_of_one_round_are_one_guarded_step():
    engine, net, opt, private_loader = private(4106)
    for x, y in private_loader:
        opt.zero_grad(set_to_none=True)
        chunks = [(x[:3], y[:3]), (x[3:], y[3:])]
        for i, (xc, yc) in enumerate(chunks):
            F.cross_entropy(net(xc), yc, reduction="sum").backward()
            opt.signal_skip_step(do_skip=i == 0)
            opt.step()
            if i == 0:
                opt.zero_grad(set_to_none=True)
    assert opt.step_hook.guard.stepped == 8


def test_two_private_optimizers_over_one_optimizer_share_one_pre_hook():
    net = model()
    inner = torch.optim.SGD(net.parameters(), lr=0.1)
    refuse_outside_steps(inner)
    refuse_outside_steps(inner)
    assert len(inner._optimizer_step_pre_hooks) == 1


def test_the_seal_compares_bits():
    seal = ParameterSeal()
    p = torch.tensor([0.0, math.nan, 1.0])
    assert seal.changed([p]) == []  # nothing recorded yet
    seal.record([p])
    assert seal.changed([p.clone()]) == []  # NaN equals itself bit for bit
    assert seal.changed([torch.tensor([-0.0, math.nan, 1.0])]) == [0]
    assert seal.changed([p, p]) == [0, 1]
    assert seal.changed([p.double()]) == [0]
    seal.record([p.double()])  # a new copy of the new shape
    assert seal.changed([p.double()]) == []
