"""A loop over the private loader left early, then a new one: with and without worker processes.

Workers fetch rounds ahead of the loop, so the rounds released and the batches delivered run
apart; each iteration must pair its own batches with its own rounds (issue 41, part 5).
"""

from __future__ import annotations

import warnings
from collections import deque

import pytest
import torch
from opacus import PrivacyEngine
from torch.nn import functional as F  # noqa: N812
from torch.utils.data import DataLoader

import shuffle_opacus
from shuffle_opacus.engine.step_guard import RoundQueue, StepGuard

from .opacus_helpers import SETTINGS, dataset, model


def private(num_workers: int, rounds: int = 8):
    engine = PrivacyEngine(accountant="shuffled_checkin")
    net = model()
    data = DataLoader(dataset(), batch_size=8, num_workers=num_workers)
    net, opt, private_loader = shuffle_opacus.make_private(
        engine,
        module=net,
        optimizer=torch.optim.SGD(net.parameters(), lr=0.1),
        data_loader=data,
        noise_multiplier=2.0,
        max_grad_norm=1.0,
        rounds=rounds,
        seed=4201 + num_workers,
        **SETTINGS["shuffled_checkin"][0],
    )
    return engine, net, opt, private_loader


def step(net, opt, x: torch.Tensor, y: torch.Tensor) -> None:
    opt.zero_grad()
    F.cross_entropy(net(x), y).backward()
    opt.step()


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_loop_left_early_and_a_new_one_steps_every_batch(num_workers):
    engine, net, opt, private_loader = private(num_workers)
    steps = 0
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for i, (x, y) in enumerate(private_loader):
            step(net, opt, x, y)
            steps += 1
            if i == 1:
                break
    abandoned = [w for w in caught if "ended before" in str(w.message)]
    for x, y in private_loader:  # before the fix, with workers: steps refused for the size
        step(net, opt, x, y)
        steps += 1
    assert len(engine.accountant) == 8  # every released round counted, the abandoned too
    if num_workers == 0:
        assert steps == 8 and not abandoned
    else:  # 2 workers x prefetch_factor 2 fetched rounds 2-5 ahead; the new loop gets 6, 7
        assert steps == 4
        assert len(abandoned) == 1
        message = str(abandoned[0].message)
        assert "rounds 2-5" in message and "counts them as released" in message
        assert "\n" not in message


def test_two_open_iterations_keep_their_own_rounds():
    guard = StepGuard("shuffled_checkin")
    first: RoundQueue = deque()
    second: RoundQueue = deque()
    with guard.collecting(first):  # the first loop's workers fetch rounds 0 and 1 ahead
        guard.on_release(0, 3)
        guard.on_release(1, 5)
    guard.on_deliver(first)
    assert guard.check_step(3) == 0
    with guard.collecting(second):  # a second loop, opened while the first is alive
        guard.on_release(2, 7)
    guard.on_deliver(second)
    assert guard.check_step(7) == 2
    guard.on_deliver(first)  # back to the first loop: its round 1, not the second's
    assert guard.check_step(5) == 1
    guard.on_release(3, 4)  # the sampler iterated directly: current at once
    assert guard.check_step(4) == 3
    assert (guard.released, guard.stepped) == (4, 4)


def test_a_delivery_without_a_released_round_leaves_nothing_to_step():
    guard = StepGuard("shuffled_checkin")
    guard.on_release(0, 3)
    guard.on_deliver(deque())
    with pytest.raises(ValueError, match="has no round to process"):
        guard.check_step(3)
