"""Two engines in one process releasing the same check-ins (issue 41, part 3)."""

from __future__ import annotations

import math
import warnings

import pytest
import torch
from opacus import PrivacyEngine
from torch.utils.data import DataLoader, TensorDataset

import shuffle_opacus
from shuffle_opacus.engine.accountants import ShuffledCheckInAccountant
from shuffle_opacus.engine.release_registry import (
    REGISTRY,
    SharedCoinsError,
    SharedCoinsWarning,
    data_identity,
)
from shuffle_opacus.federated import make_private_clients

from .opacus_helpers import dataset, model

ISSUE = {"noise_multiplier": 5.0, "max_grad_norm": 1.0, "rate": 0.1, "rounds": 50, "seed": 0}


def one_client() -> DataLoader:
    """A fresh loader over a fresh data set object with the same single example."""
    return DataLoader(dataset(1), batch_size=1)


def prepare(data: DataLoader | None = None, **change):
    engine = PrivacyEngine(accountant="shuffled_checkin")
    net = model()
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
    args = {**ISSUE, **change}
    loader = shuffle_opacus.make_private(
        engine,
        module=net,
        optimizer=optimizer,
        data_loader=data if data is not None else one_client(),
        **args,
    )[2]
    return engine, loader


def release_all(loader: DataLoader) -> None:
    for _ in loader:
        pass  # released and accounted, stepped or not


def test_a_rerun_cell_is_warned_with_the_epsilon_of_both_models_together():
    first, loader = prepare()
    release_all(loader)
    assert first.get_epsilon(1e-5) == pytest.approx(4.930, abs=5e-4)
    with pytest.warns(SharedCoinsWarning) as caught:
        second, loader = prepare()
    (warning,) = [w for w in caught if w.category is SharedCoinsWarning]
    text = str(warning.message)
    assert "\n" not in text
    assert "engine #1 (make_private at test_release_registry.py:" in text
    assert "engine #2" in text and "round 0 of seed 0" in text
    assert "together are worth epsilon 7.575 at delta 1e-05" in text
    assert warning.filename.endswith("test_release_registry.py")
    with warnings.catch_warnings():
        warnings.simplefilter("error", SharedCoinsWarning)  # named once, not every round
        release_all(loader)
    assert second.get_epsilon(1e-5) == pytest.approx(4.930, abs=5e-4)


def test_the_epsilon_together_is_one_round_at_sigma_over_root_two_per_shared_round():
    """Two noisy sums of one subset are one sum at sigma / sqrt(2); not 100 independent rounds."""
    acc = ShuffledCheckInAccountant().configure(population=1)
    acc.history = [(5.0 / math.sqrt(2.0), 0.1, 50)]
    assert acc.get_epsilon(1e-5) == pytest.approx(7.575, abs=5e-4)
    acc.history = [(5.0, 0.1, 100)]
    assert acc.get_epsilon(1e-5) == pytest.approx(6.829, abs=5e-4)  # what a replay was counted as


def test_strict_refuses_the_rerun_before_anything_changes():
    first, loader = prepare()
    release_all(loader)
    engine = PrivacyEngine(accountant="shuffled_checkin")
    net = model()
    with pytest.raises(
        SharedCoinsError, match=r"^engine #2 .* engine #1 .*refused \(strict=True\)"
    ):
        shuffle_opacus.make_private(
            engine,
            module=net,
            optimizer=torch.optim.SGD(net.parameters(), lr=0.1),
            data_loader=one_client(),
            strict=True,
            **ISSUE,
        )
    assert not engine.accountant.is_configured and len(engine.accountant) == 0


def test_strict_refuses_each_shared_round_of_engines_prepared_side_by_side():
    first, loader_a = prepare(rounds=6)
    second, loader_b = prepare(rounds=6, strict=True)  # nothing released yet: no warning
    batches = iter(loader_a)
    for _ in range(3):
        next(batches)
    with pytest.raises(SharedCoinsError, match="round 0 of seed 0"):
        next(iter(loader_b))
    assert len(second.accountant) == 0 and len(first.accountant) == 3


def test_other_seeds_or_other_data_are_independent():
    release_all(prepare(rounds=5)[1])
    with warnings.catch_warnings():
        warnings.simplefilter("error", SharedCoinsWarning)
        release_all(prepare(rounds=5, seed=1)[1])
        other = DataLoader(dataset(1, seed=3), batch_size=1)
        release_all(prepare(other, rounds=5)[1])


def test_the_same_coins_with_other_sampling_are_warned_without_an_epsilon():
    release_all(prepare(rounds=5)[1])
    with pytest.warns(SharedCoinsWarning, match="other sampling: the check-ins come from the same"):
        prepare(rounds=5, rate=0.2)


def test_a_rerun_at_user_level_is_warned():
    x = torch.randn(12, 3, generator=torch.Generator().manual_seed(0))
    y = torch.randint(0, 2, (12,), generator=torch.Generator().manual_seed(1))

    def users():
        engine = PrivacyEngine(accountant="shuffled_checkin")
        net = torch.nn.Linear(3, 2)
        optimizer = torch.optim.SGD(net.parameters(), lr=1.0)
        run = make_private_clients(
            engine,
            module=net,
            optimizer=optimizer,
            data=(x.clone(), y.clone()),
            partition=[[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]],
            loss_fn=lambda out, target: torch.nn.functional.cross_entropy(
                out, target, reduction="none"
            ),
            noise_multiplier=2.0,
            max_update_norm=1.0,
            client_lr=0.1,
            local_steps=1,
            rounds=4,
            rate=0.5,
            seed=0,
        )
        for _ in run:
            optimizer.step()

    users()
    with pytest.warns(SharedCoinsWarning, match="make_private_clients at test_release_registry"):
        users()


def test_what_counts_as_the_same_data():
    data = dataset(10)
    assert data_identity(data).same(data_identity(data))
    assert data_identity(data).same(data_identity(dataset(10)))  # same length and values
    assert not data_identity(data).same(data_identity(dataset(10, seed=1)))
    assert not data_identity(data).same(data_identity(dataset(11)))

    class Noisy(TensorDataset):
        def __getitem__(self, i):
            return torch.randn(3), 0

    noisy = Noisy(torch.zeros(4, 3))
    assert data_identity(noisy).fingerprint is None
    assert data_identity(noisy).same(data_identity(noisy))  # the same object
    assert not data_identity(noisy).same(data_identity(Noisy(torch.zeros(4, 3))))


def test_the_registry_is_emptied_between_tests():
    assert REGISTRY.bindings == []
