"""The Opacus layer reports the tightest sound method by default, and any other by name.

Before, ``engine.get_epsilon(delta=1e-5, method="pld")`` raised a TypeError and every
default was the looser Rényi bound. These tests fail on that code.
"""

from __future__ import annotations

import pytest
import torch
from opacus import PrivacyEngine

import shuffle_opacus
from shuffle_opacus import history_epsilon
from tests.opacus_helpers import N_CLIENTS, loader, model, train


def _engine(**kwargs):
    engine = PrivacyEngine(accountant="shuffled_checkin")
    net = model()
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
    module, optimizer, data = shuffle_opacus.make_private(
        engine, module=net, optimizer=optimizer, data_loader=loader(),
        max_grad_norm=1.0, rate=0.25, rounds=6, **kwargs,
    )  # fmt: skip
    train(module, optimizer, data)
    return engine


def test_engine_get_epsilon_takes_the_method():
    engine = _engine(noise_multiplier=2.0)
    default = engine.get_epsilon(delta=1e-5)
    assert engine.accountant.epsilon_result(1e-5).method == "pld"
    assert engine.get_epsilon(delta=1e-5, method="pld") == default
    renyi = engine.get_epsilon(1e-5, method="exact")
    assert (
        renyi
        == history_epsilon(
            [(2.0, 0.25, 6)], protocol="checkin", delta=1e-5, population=N_CLIENTS, method="exact"
        ).epsilon
    )
    assert default < renyi
    with pytest.raises(ValueError, match="method must be one of pld, proven, exact, sum, theorem3"):
        engine.get_epsilon(1e-5, method="nope")


def test_a_setting_beyond_pld_falls_back_with_a_note():
    engine = _engine(noise_multiplier=0.06)  # analysis sigma 0.03, below pld's floor of 0.05
    result = engine.accountant.epsilon_result(1e-5)
    assert result.method == "exact" and "sigma >= 0.05" in result.note
    assert engine.get_epsilon(1e-5) == result.epsilon


def test_make_private_with_epsilon_calibrates_with_pld_and_meets_the_target():
    engine = PrivacyEngine(accountant="shuffled_checkin")
    net = model()
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
    module, optimizer, data = shuffle_opacus.make_private_with_epsilon(
        engine, module=net, optimizer=optimizer, data_loader=loader(), target_epsilon=4.0,
        target_delta=1e-5, max_grad_norm=1.0, rate=0.25, rounds=6,
    )  # fmt: skip
    sigma = optimizer.noise_multiplier
    renyi = shuffle_opacus.calibrate_noise_multiplier(
        target_epsilon=4.0, delta=1e-5, population=N_CLIENTS, rounds=6, rate=0.25,
        method="exact",
    )  # fmt: skip
    assert sigma < renyi  # the tighter accountant needs less noise for the same budget
    train(module, optimizer, data)
    assert engine.get_epsilon(1e-5) <= 4.0 < engine.get_epsilon(1e-5, method="exact")
