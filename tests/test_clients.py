"""User-level training (shuffle_opacus.federated) against independent float64 oracles.

The oracle of a round is a plain Python loop over the round's clients: a deep copy of the model
per client, ``torch.autograd.grad`` on each local batch (the batches of
:func:`~shuffle_opacus.federated.local_batches`, tested on their own below), the update
``w - w_i``, its norm as one vector, Opacus's clip factor ``min(1, C / (norm + 1e-6))`` in
Python floats, the sum, the noise drawn as the protocol states (one Gaussian of std
``sigma C sqrt(B)`` per parameter tensor, from the same seeded generator), the average and the
server's SGD step. Everything runs in float64, so the vectorised trainer must agree to 1e-10.
"""

from __future__ import annotations

import copy
import functools
import itertools
import math
import pickle

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from opacus import PrivacyEngine
from torch import nn
from torch.nn import functional as F  # noqa: N812
from torch.utils.data import DataLoader, Dataset, TensorDataset

import shuffle_opacus
from shuffle_opacus import history_epsilon
from shuffle_opacus.engine.release_registry import REGISTRY
from shuffle_opacus.federated import (
    ClientPartition,
    LocalTraining,
    dirichlet_partition,
    iid_partition,
    local_batches,
    make_private_clients,
    shard_partition,
)

LOSS = functools.partial(F.cross_entropy, reduction="none")
SIZES = [1, 3, 7, 4, 12, 2, 9, 5, 6, 8]  # unequal clients: 57 examples
SIGMA, CLIP, SERVER_LR = 0.8, 1.0, 0.7


def data(n: int = sum(SIZES), seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 5, generator=g, dtype=torch.float64) * 2.0
    y = torch.randint(0, 3, (n,), generator=g)
    return x, y


def model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(5, 4), nn.Tanh(), nn.Linear(4, 3)).double()


def partition(sizes: list[int] = SIZES, seed: int = 3) -> ClientPartition:
    order = np.random.default_rng(seed).permutation(sum(sizes))
    bounds = np.cumsum([0, *sizes])
    return ClientPartition.from_indices(
        [order[a:b].tolist() for a, b in zip(bounds[:-1], bounds[1:], strict=True)]
    )


def trainer(net: nn.Module, part: ClientPartition, x, y, **kw):
    kw = {
        "noise_multiplier": SIGMA,
        "max_update_norm": CLIP,
        "rate": 0.5,
        "rounds": 4,
        "seed": 5,
        "noise_generator": torch.Generator().manual_seed(9),
        **kw,
    }
    accountant = kw.pop("accountant", "shuffled_checkin")
    engine = PrivacyEngine(accountant=accountant)
    optimizer = torch.optim.SGD(net.parameters(), lr=SERVER_LR)
    run = make_private_clients(
        engine, module=net, optimizer=optimizer, data=(x, y), partition=part, loss_fn=LOSS, **kw
    )
    return engine, optimizer, run


def oracle_rounds(
    part: ClientPartition,
    x: torch.Tensor,
    y: torch.Tensor,
    training: LocalTraining,
    participants: list[list[int]],
    *,
    seed: int,
    average: str,
    expected: float,
    noise_seed: int,
) -> nn.Module:
    """The rounds as a plain per-client loop (see the module docstring)."""
    net = model()
    noise = torch.Generator().manual_seed(noise_seed)
    for t, clients in enumerate(participants):
        base = [p.detach().clone() for p in net.parameters()]
        total = [torch.zeros_like(p) for p in base]
        for c in clients:
            local = copy.deepcopy(net)
            for batch in local_batches(part, c, training, seed=seed, round_index=t):
                idx = torch.as_tensor(batch)
                loss = F.cross_entropy(local(x[idx]), y[idx])  # mean over the batch
                grads = torch.autograd.grad(loss, list(local.parameters()))
                with torch.no_grad():
                    for p, g in zip(local.parameters(), grads, strict=True):
                        p -= training.client_lr * g
            update = [b - p.detach() for b, p in zip(base, local.parameters(), strict=True)]
            norm = math.sqrt(sum(float((u * u).sum()) for u in update))
            factor = min(1.0, CLIP / (norm + 1e-6))
            for s, u in zip(total, update, strict=True):
                s += factor * u
        denominator = expected if average == "expected" else max(len(clients), 1)
        std = SIGMA * CLIP * math.sqrt(len(clients))
        with torch.no_grad():
            for p, s in zip(net.parameters(), total, strict=True):
                draw = (
                    torch.normal(0.0, std, size=p.shape, generator=noise, dtype=p.dtype)
                    if clients
                    else torch.zeros_like(p)
                )
                p -= SERVER_LR * (s + draw) / denominator
    return net


@pytest.mark.parametrize(
    ("training", "average"),
    [
        (LocalTraining(client_lr=1.3, local_steps=1), "expected"),  # FedSGD
        (LocalTraining(client_lr=0.4, local_steps=3, local_batch_size=2), "expected"),
        (LocalTraining(client_lr=0.4, local_epochs=2, local_batch_size=3), "reports"),
    ],
    ids=["fedsgd", "fedavg-steps", "fedavg-epochs"],
)
def test_rounds_equal_a_per_client_loop(training, average):
    x, y = data()
    part = partition()
    net = model()
    engine, optimizer, run = trainer(
        net,
        part,
        x,
        y,
        client_lr=training.client_lr,
        local_steps=training.local_steps,
        local_epochs=training.local_epochs,
        local_batch_size=training.local_batch_size,
        average=average,
        client_chunk=3,
    )
    participants = [run.sampler.batch(t) for t in range(4)]
    assert any(0 < len(p) < len(part) for p in participants), participants
    # Clipping is active for some clients and not for others in round 0, so C matters.
    updates, _ = run.local_updates(np.arange(len(part)), 0)
    norms = torch.stack([u.flatten(1).norm(dim=1) for u in updates], dim=1).norm(dim=1)
    assert norms.min() < CLIP < norms.max(), norms
    results = []
    for result in run:
        optimizer.step()
        results.append(result)
    assert [r.reports for r in results] == [len(p) for p in participants]
    expected = oracle_rounds(
        part,
        x,
        y,
        training,
        participants,
        seed=5,
        average=average,
        expected=0.5 * len(part),
        noise_seed=9,
    )
    for ours, theirs in zip(net.parameters(), expected.parameters(), strict=True):
        torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-10)
    assert len(engine.accountant) == 4


def test_the_oracle_comparison_can_fail():
    """Another local learning rate gives other weights: the comparison above is not vacuous."""
    x, y = data()
    part = partition()
    net = model()
    _, optimizer, run = trainer(net, part, x, y, client_lr=0.4, local_steps=3, local_batch_size=2)
    participants = [run.sampler.batch(t) for t in range(4)]
    for _ in run:
        optimizer.step()
    other = oracle_rounds(
        part,
        x,
        y,
        LocalTraining(client_lr=0.41, local_steps=3, local_batch_size=2),
        participants,
        seed=5,
        average="expected",
        expected=5.0,
        noise_seed=9,
    )
    assert not all(
        torch.allclose(a, b, atol=1e-6)
        for a, b in zip(net.parameters(), other.parameters(), strict=True)
    )


def test_chunks_do_not_change_the_result():
    x, y = data()
    part = partition()
    weights = []
    for chunk in (1, 4, 100):
        # Three separate trainings on the same coins: the process-wide release registry would
        # price each later one together with the earlier ones (a pld computation of seconds for
        # a warning this test is not about; tests/test_release_registry.py tests it).
        REGISTRY.clear()
        net = model()
        _, optimizer, run = trainer(
            net, part, x, y, client_lr=0.5, local_steps=2, local_batch_size=3, client_chunk=chunk
        )
        for _ in run:
            optimizer.step()
        weights.append(torch.cat([p.detach().flatten() for p in net.parameters()]))
    for w in weights[1:]:
        torch.testing.assert_close(w, weights[0], rtol=0, atol=1e-12)


@pytest.mark.parametrize("noise_mode", ["sum", "per_client"])
def test_one_example_clients_reproduce_the_example_level_path(noise_mode):
    """FedSGD with client_lr 1 on one-example clients is make_private's round: same sampler
    seed, same noise generator seed, same clipping norm, same server optimizer, same weights."""
    n = 40
    x, y = data(n)
    example_net = model()
    module, optimizer, loader = shuffle_opacus.make_private(
        PrivacyEngine(accountant="shuffled_checkin"),
        module=example_net,
        optimizer=torch.optim.SGD(example_net.parameters(), lr=SERVER_LR),
        data_loader=DataLoader(TensorDataset(x, y), batch_size=8),
        noise_multiplier=SIGMA,
        max_grad_norm=CLIP,
        rate=0.3,
        rounds=5,
        seed=4,
        noise_mode=noise_mode,
        noise_generator=torch.Generator().manual_seed(2),
    )
    for bx, by in loader:
        optimizer.zero_grad()
        F.cross_entropy(module(bx), by).backward()
        optimizer.step()
    user_net = model()
    engine, server, run = trainer(
        user_net,
        ClientPartition.from_client_ids(np.arange(n)),
        x,
        y,
        client_lr=1.0,
        local_steps=1,
        rate=0.3,
        rounds=5,
        seed=4,
        noise_mode=noise_mode,
        noise_generator=torch.Generator().manual_seed(2),
    )
    for _ in run:
        server.step()
    for a, b in zip(example_net.parameters(), user_net.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-10)
    assert engine.accountant.history == [(SIGMA, 0.3, 5)]


def test_the_clip_bound_holds_for_every_client():
    x, y = data()
    x = x * 50.0  # large inputs: large updates
    part = partition()
    net = model()
    _, _, run = trainer(net, part, x, y, client_lr=5.0, local_steps=3, local_batch_size=2)
    clipped = 0
    for c in range(len(part)):
        updates, _ = run.local_updates(np.array([c]), 1)
        norm = math.sqrt(sum(float((u * u).sum()) for u in updates))
        out = run.clip_sum(updates)
        out_norm = math.sqrt(sum(float((o * o).sum()) for o in out))
        assert out_norm <= CLIP * (1 + 1e-12)
        if norm > CLIP:
            clipped += 1
            # Same direction, norm C / (norm + 1e-6) * norm.
            cos = sum(float((o * u[0]).sum()) for o, u in zip(out, updates, strict=True))
            assert cos / (out_norm * norm) == pytest.approx(1.0, abs=1e-12)
            assert out_norm == pytest.approx(CLIP * norm / (norm + 1e-6), rel=1e-12)
        else:
            assert out_norm == pytest.approx(norm, rel=1e-12)
    assert clipped >= 3
    # A non-finite update is replaced by zero (which is inside the clipping ball).
    bad = [torch.full((2, *p.shape), math.nan, dtype=p.dtype) for p in net.parameters()]
    bad[0][1] = 1.0
    out = run.clip_sum(bad)
    assert all(torch.isfinite(o).all() for o in out)


@pytest.mark.parametrize("noise_mode", ["sum", "per_client"])
def test_the_noise_has_the_stated_distribution(noise_mode):
    """With a server learning rate of 0 every round has the same clipped sum S, so each round's
    ``grad * m - S`` is the noise alone: mean 0 and variance m sigma^2 C^2 per coordinate
    (protocol ``full`` with m = 4 clients, average over the expected m). 4,000 values;
    tolerances of 5 standard errors."""
    x, y = data(8)
    part = iid_partition(8, 4, seed=0)
    net = model()
    engine = PrivacyEngine(accountant="shuffle")
    optimizer = torch.optim.SGD(net.parameters(), lr=0.0)
    run = make_private_clients(
        engine,
        module=net,
        optimizer=optimizer,
        data=(x, y),
        partition=part,
        loss_fn=LOSS,
        noise_multiplier=SIGMA,
        max_update_norm=CLIP,
        client_lr=0.5,
        local_steps=1,
        rounds=125,
        seed=0,
        noise_mode=noise_mode,
        noise_generator=torch.Generator().manual_seed(1),
    )
    updates, _ = run.local_updates(np.arange(4), 0)
    clipped = torch.cat([s.flatten() for s in run.clip_sum(updates)])
    draws = []
    for _ in run:
        grads = torch.cat([p.grad.flatten() for p in net.parameters()])
        draws.append((grads * 4 - clipped).numpy())
    noise = np.concatenate(draws)
    var = 4 * (SIGMA * CLIP) ** 2
    se_mean = math.sqrt(var / noise.size)
    assert abs(noise.mean()) < 5 * se_mean
    se_var = var * math.sqrt(2 / noise.size)
    assert abs(noise.var() - var) < 5 * se_var
    assert len(engine.accountant) == 125


def test_the_accountant_counts_clients_not_examples():
    # Noise multiplier 2, not SIGMA = 0.8: each pld pair at the analysis sigma 1 costs 0.1-0.2 s
    # of CPU, at 0.4 about 1.5 s (epsilon at 10 clients and at 57 examples differ by 63%).
    x, y = data()
    part = partition()
    engine, optimizer, run = trainer(
        model(), part, x, y, client_lr=0.5, local_steps=1, rate=0.2, rounds=6, noise_multiplier=2.0
    )
    for _ in run:
        optimizer.step()
    assert engine.accountant.population == len(part) == 10
    eps = engine.get_epsilon(1e-5)
    clients = history_epsilon(
        [(2.0, 0.2, 6)], protocol="checkin", delta=1e-5, population=len(part)
    ).epsilon
    examples = history_epsilon(
        [(2.0, 0.2, 6)], protocol="checkin", delta=1e-5, population=part.num_examples
    ).epsilon
    assert eps == pytest.approx(clients, rel=1e-12)
    assert abs(examples - clients) > 0.1 * clients


def test_every_released_round_is_accounted_empty_ones_included():
    x, y = data()
    part = partition()
    net = model()
    engine, optimizer, run = trainer(
        net, part, x, y, client_lr=0.5, local_steps=1, rate=0.05, rounds=30
    )
    before = [p.detach().clone() for p in net.parameters()]
    sizes = [r.reports for r in run]
    assert 0 in sizes and len(sizes) == 30
    assert len(engine.accountant) == 30
    assert all(torch.equal(a, b) for a, b in zip(before, net.parameters(), strict=True))


def test_a_round_is_released_once_and_a_second_loop_continues():
    # Round t's clients depend only on the seed and t: releasing it again would reuse the same
    # check-in set, which independent-round composition does not cover.
    x, y = data()
    engine, optimizer, run = trainer(
        model(), partition(), x, y, client_lr=0.5, local_steps=1, rate=0.3, rounds=6
    )
    first = [r.round for r in itertools.islice(run, 4)]  # a loop left early
    assert first == [0, 1, 2, 3] and len(engine.accountant) == 4
    assert [r.round for r in run] == [4, 5]  # the next loop continues with new rounds
    assert [r.round for r in run] == [] and len(engine.accountant) == 6
    with pytest.raises(ValueError, match="round_index 2 was released already") as info:
        run.run_round(2)
    assert "\n" not in str(info.value) and len(engine.accountant) == 6


@pytest.mark.parametrize(
    ("accountant", "extra", "reports"),
    [("subsampled_shuffle", {"sample_size": 4}, 4), ("shuffle", {}, 10)],
)
def test_fixed_size_protocols(accountant, extra, reports):
    x, y = data()
    part = partition()
    engine, optimizer, run = trainer(
        model(), part, x, y, client_lr=0.5, local_steps=1, accountant=accountant, rate=None,
        **extra,
    )  # fmt: skip
    assert [r.reports for r in run] == [reports] * 4
    assert engine.accountant.population == 10


def test_local_batches_walk_epochs_of_the_client():
    part = partition()
    training = LocalTraining(client_lr=0.1, local_steps=7, local_batch_size=3)
    client = 4  # 12 examples: epochs of 4 batches
    batches = local_batches(part, client, training, seed=1, round_index=2)
    assert [len(b) for b in batches] == [3] * 7
    first = np.concatenate(batches[:4])
    assert sorted(first.tolist()) == sorted(part.client(client).tolist())
    assert set(np.concatenate(batches[4:]).tolist()) <= set(part.client(client).tolist())
    again = local_batches(part, client, training, seed=1, round_index=2)
    assert all(np.array_equal(a, b) for a, b in zip(batches, again, strict=True))
    other = local_batches(part, client, training, seed=1, round_index=3)
    assert not all(np.array_equal(a, b) for a, b in zip(batches, other, strict=True))
    epochs = LocalTraining(client_lr=0.1, local_epochs=2, local_batch_size=5)
    sizes = [len(b) for b in local_batches(part, 2, epochs, seed=1, round_index=0)]
    assert sizes == [5, 2, 5, 2]  # 7 examples
    whole = LocalTraining(client_lr=0.1, local_steps=2)
    assert [b.tolist() for b in local_batches(part, 2, whole, seed=1, round_index=0)] == [
        part.client(2).tolist()
    ] * 2


def test_partitions_cover_every_example_once():
    labels = np.repeat(np.arange(10), 30)
    for part in (
        iid_partition(300, 7, seed=0),
        dirichlet_partition(labels, 30, alpha=0.5, seed=0),
        shard_partition(labels, 15, shards_per_client=2, seed=0),
    ):
        assert sorted(part.order.tolist()) == list(range(300))
        assert part.sizes.min() >= 1
    assert sorted(iid_partition(300, 7, seed=0).sizes.tolist()) == [42] + [43] * 6
    assert dirichlet_partition(labels, 30, alpha=0.5, seed=0).sizes.tolist() == [10] * 30
    shards = shard_partition(labels, 15, shards_per_client=2, seed=0)
    assert max(len(set(labels[shards.client(c)].tolist())) for c in range(15)) <= 2
    skewed = dirichlet_partition(labels, 30, alpha=0.05, seed=1)
    even = dirichlet_partition(labels, 30, alpha=100.0, seed=1)

    def distinct(p):
        return np.mean([len(set(labels[p.client(c)].tolist())) for c in range(30)])

    assert distinct(skewed) < 3.0 < 6.0 < distinct(even)


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: ClientPartition.from_indices([[0, 1], [2]], 4), "misses 1 of the 4 examples"),
        (lambda: ClientPartition.from_indices([[0, 1], [1, 2]]), "repeats 1 example"),
        (lambda: ClientPartition.from_indices([[0, 1], []], 2), "hold no example"),
        (lambda: ClientPartition.from_indices([[0, 5]], 2), "must be in [0, 1]"),
        (lambda: ClientPartition.from_client_ids([0, 2, 2], 3), "client 1 first"),
        (lambda: ClientPartition.from_client_ids([0, -1]), "integers in [0, 0]"),
        # More clients (or examples) than indices: refused before any array of that size.
        (
            lambda: ClientPartition.from_client_ids([0, 1, 2], num_clients=10**12),
            "num_clients must be an integer in [1, 3] (every client holds",
        ),
        (lambda: ClientPartition.from_client_ids([0, 10**12]), "ids are at most 1 for 2 examples"),
        (
            lambda: ClientPartition.from_indices([[0, 1]], 10**12),
            "misses 999999999998 of the 1000000000000 examples (example 2 first)",
        ),
        (
            lambda: ClientPartition.from_client_ids(np.array([0, 2**64 - 1], dtype=np.uint64)),
            "client_ids must hold integers in [0, 9223372036854775807]",
        ),
        (lambda: ClientPartition.from_indices([[0, 1], [2, [3]]]), "client 1's indices must be"),
        (lambda: LocalTraining(client_lr=0.1, local_steps=0), "local_steps must be an integer"),
        (lambda: LocalTraining(client_lr=0.0, local_steps=1), "client_lr must be"),
        (lambda: LocalTraining(client_lr=-1.0, local_steps=1), "client_lr must be"),
        (lambda: LocalTraining(client_lr=0.1), "exactly one of local_steps and local_epochs"),
        (lambda: dirichlet_partition([0, 1], 3, alpha=1.0, seed=0), "num_clients must be"),
        (lambda: dirichlet_partition([0, 1], 2, alpha=0.0, seed=0), "alpha must be"),
        (lambda: shard_partition([0, 1, 2], 2, shards_per_client=2, seed=0), "shards_per_client"),
    ],
)
def test_bad_partitions_and_settings_fail_in_one_line(build, message):
    with pytest.raises(ValueError) as info:
        build()
    assert message in str(info.value)
    assert "\n" not in str(info.value)


def _bad_loss(out, target):
    return F.cross_entropy(out, target)  # a mean, not one loss per example


class _Examples(Dataset):
    """The 57 examples of ``data()`` as a map-style dataset with one broken example."""

    def __init__(self, fail_at=None, ragged_at=None, single_at=None):
        self.x, self.y = data()
        self.fail_at, self.ragged_at, self.single_at = fail_at, ragged_at, single_at

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        if i == self.fail_at:
            raise KeyError(i)  # e.g. a dict-backed dataset without this key
        if i == self.single_at:
            return self.x[i]
        x = self.x[i, :3] if i == self.ragged_at else self.x[i]
        return x, self.y[i]


def test_a_map_style_dataset_is_read_once_in_order():
    """The dataset path the refusals above guard gives the tensors of the pair path."""
    x, y = data()
    net = model()
    run = make_private_clients(
        PrivacyEngine(accountant="shuffled_checkin"),
        module=net,
        optimizer=torch.optim.SGD(net.parameters(), lr=1.0),
        data=_Examples(),
        partition=partition(),
        loss_fn=LOSS,
        noise_multiplier=SIGMA,
        max_update_norm=CLIP,
        client_lr=0.5,
        local_steps=1,
        rate=0.5,
        rounds=1,
        noise_generator=torch.Generator().manual_seed(0),
    )
    assert torch.equal(run.inputs, x) and torch.equal(run.targets, y)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"partition": [[0, 1], [2]]}, "misses"),
        ({"partition": [[0, 1, 2], [2, *range(3, 57)]]}, "repeats"),
        ({"partition": [list(range(57)), []]}, "hold no example"),
        ({"partition": np.arange(50)}, "covers 50 examples but the dataset holds 57"),
        ({"local_steps": 0}, "local_steps must be an integer in [1, "),
        ({"client_lr": 0.0}, "client_lr must be a finite number > 0"),
        ({"client_lr": -0.1}, "client_lr must be a finite number > 0"),
        ({"max_update_norm": 0.0}, "max_update_norm must be"),
        ({"noise_multiplier": -1.0}, "noise_multiplier must be"),
        ({"average": "mean"}, "average must be one of"),
        ({"rate": 1.5}, "rate must be in (0, 1]"),
        ({"accountant": "rdp"}, "engine.accountant must be one of"),
        ({"accountant": "subsampled_shuffle", "rate": None, "sample_size": 10}, "sample_size"),
        ({"loss_fn": _bad_loss}, "one loss per example"),
        ({"local_steps": 1, "local_epochs": 1}, "exactly one of local_steps and local_epochs"),
        ({"data": _Examples(fail_at=3)}, "data[3] cannot be read (data is read once, indices 0 .."),
        ({"data": _Examples(fail_at=0)}, "data[0] cannot be read"),
        ({"data": _Examples(ragged_at=5)}, "data's examples must stack into an inputs tensor"),
        ({"data": _Examples(single_at=2)}, "must be (input, target) pairs. Found data[2] of type"),
        ({"noise_generator": "gen"}, "noise_generator must be a torch.Generator"),
        ({"noise_generator": np.random.default_rng(0)}, "noise_generator must be a torch.Gen"),
    ],
)
def test_bad_input_changes_nothing(change, message):
    x, y = data()
    net = model()
    before = [p.detach().clone() for p in net.parameters()]
    kw = {
        "data": (x, y),
        "noise_multiplier": SIGMA,
        "max_update_norm": CLIP,
        "client_lr": 0.5,
        "local_steps": 1,
        "rate": 0.5,
        "rounds": 3,
        "seed": 0,
        "partition": partition(),
        "loss_fn": LOSS,
    }
    kw.update(change)
    engine = PrivacyEngine(accountant=kw.pop("accountant", "shuffled_checkin"))
    optimizer = torch.optim.SGD(net.parameters(), lr=1.0)
    with pytest.raises(ValueError) as info:
        make_private_clients(engine, module=net, optimizer=optimizer, **kw)
    assert message in str(info.value), str(info.value)
    assert "\n" not in str(info.value)
    assert all(torch.equal(a, b) for a, b in zip(before, net.parameters(), strict=True))
    assert all(p.grad is None for p in net.parameters())
    if hasattr(engine.accountant, "population"):
        assert engine.accountant.population is None and engine.accountant.history == []


def test_an_accountant_holding_rounds_of_another_population_is_refused():
    x, y = data()
    engine = PrivacyEngine(accountant="shuffled_checkin")
    engine.accountant.configure(population=57)  # as if it had accounted the examples
    engine.accountant.step(noise_multiplier=SIGMA, sample_rate=0.5)
    net = model()
    with pytest.raises(ValueError, match="already holds 1 rounds"):
        make_private_clients(
            engine,
            module=net,
            optimizer=torch.optim.SGD(net.parameters(), lr=1.0),
            data=(x, y),
            partition=partition(),
            loss_fn=LOSS,
            noise_multiplier=SIGMA,
            max_update_norm=CLIP,
            client_lr=0.5,
            local_steps=1,
            rate=0.5,
            rounds=3,
        )
    assert engine.accountant.population == 57 and len(engine.accountant) == 1


def test_batchnorm_and_foreign_optimizers_are_refused():
    x, y = data()
    net = nn.Sequential(nn.Linear(5, 4), nn.BatchNorm1d(4), nn.Linear(4, 3)).double()
    kw = {
        "data": (x, y),
        "partition": partition(),
        "loss_fn": LOSS,
        "noise_multiplier": SIGMA,
        "max_update_norm": CLIP,
        "client_lr": 0.5,
        "local_steps": 1,
        "rate": 0.5,
        "rounds": 3,
    }
    engine = PrivacyEngine(accountant="shuffled_checkin")
    with pytest.raises(ValueError, match="running statistics"):
        make_private_clients(
            engine, module=net, optimizer=torch.optim.SGD(net.parameters(), lr=1.0), **kw
        )
    plain = model()
    with pytest.raises(ValueError, match="exactly the module's trainable parameters"):
        make_private_clients(
            engine, module=plain, optimizer=torch.optim.SGD(model().parameters(), lr=1.0), **kw
        )


def test_the_noise_generator_must_be_of_the_data_device():
    """The check itself, without a GPU: a CPU generator for CUDA data is refused in one line."""
    from shuffle_opacus.engine.privacy import check_noise_generator

    check_noise_generator(None, torch.device("cuda", 0))
    check_noise_generator(torch.Generator(), torch.device("cpu"))
    with pytest.raises(ValueError) as info:
        check_noise_generator(torch.Generator(), torch.device("cuda", 0))
    assert str(info.value) == (
        "noise_generator must be a generator of the device cuda:0 (the noise is drawn "
        "there). Found a generator of cpu; use torch.Generator(device='cuda:0')."
    )


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a second device type (CUDA)")
def test_a_noise_generator_of_another_device_is_refused():
    x, y = data()
    net = model()
    with pytest.raises(ValueError, match="noise_generator must be a generator of the device"):
        make_private_clients(
            PrivacyEngine(accountant="shuffled_checkin"),
            module=net,
            optimizer=torch.optim.SGD(net.parameters(), lr=1.0),
            data=(x, y),
            partition=partition(),
            loss_fn=LOSS,
            noise_multiplier=SIGMA,
            max_update_norm=CLIP,
            client_lr=0.5,
            local_steps=1,
            rate=0.5,
            rounds=1,
            noise_generator=torch.Generator(device="cuda"),
        )


@pytest.mark.parametrize(
    ("order", "offsets", "message"),
    [
        # One example in two clients (and example 3 in none): outside testing's finding.
        ([0, 1, 0, 2], [0, 2, 4], "order must be a permutation of the example indices 0 .. 3"),
        ([0, 1, 2], [0, 2, 1, 3], "client 1 would hold -1 examples"),  # decreasing offsets
        ([0, 1, 7], [0, 2, 3], "order must be a permutation of the example indices 0 .. 2"),
        ([0, -1, 2], [0, 2, 3], "Found -1"),
        ([0, 1, 2], [0, 2, 2, 3], "offsets must be strictly increasing"),  # an empty client
        ([0, 1, 2], [1, 3], "offsets must start at 0 and end at 3"),
        ([0, 1, 2], [0, 2], "offsets must start at 0 and end at 3"),
        ([0, 1, 2], [0, 4], "offsets must start at 0 and end at 3"),
        ([0, 1, 2], [3], "offsets must be a one-dimensional array of num_clients + 1 >= 2"),
        ([0, 1, 2], [[0, 3]], "offsets must be a one-dimensional array"),
        ([], [0], "order must be a non-empty one-dimensional array"),
        ([[0, 1], [2, 3]], [0, 4], "order must be a non-empty one-dimensional array"),
        ([0.0, 1.0], [0, 2], "order must hold integers. Found dtype float64"),
        ([True, False], [0, 2], "order must hold integers. Found dtype bool"),
        ([0, 1], [0.0, 2.0], "offsets must hold integers"),
        ([0, 1], "ab", "offsets must hold integers"),
        ([0, [1]], [0, 2], "order must be an array of integers"),
        (np.array([0, 2**63], dtype=np.uint64), [0, 2], "order must hold integers in [0, 9223"),
    ],
)
def test_the_direct_constructor_checks_order_and_offsets(order, offsets, message):
    with pytest.raises(ValueError) as info:
        ClientPartition(order, offsets)
    assert message in str(info.value), str(info.value)
    assert "\n" not in str(info.value)


def test_a_partition_keeps_its_own_read_only_arrays():
    order, offsets = np.array([2, 0, 1, 3]), np.array([0, 1, 4])
    part = ClientPartition(order, offsets)
    order[:] = 0  # the caller's arrays change afterwards; the partition does not
    offsets[1] = 3
    assert part.order.tolist() == [2, 0, 1, 3] and part.offsets.tolist() == [0, 1, 4]
    assert part.order.dtype == part.offsets.dtype == np.int64
    with pytest.raises(ValueError, match="read-only"):
        part.order[0] = 0
    with pytest.raises(ValueError, match="read-only"):
        part.offsets[1] = 2
    mine = part.client(1)  # a copy the caller may change
    mine[0] = 99
    assert part.client(1).tolist() == [0, 1, 3]
    ids = torch.tensor([1, 0, 1])
    from_tensor = ClientPartition.from_client_ids(ids)
    ids[0] = 0
    assert from_tensor.client(1).tolist() == [0, 2]
    for copied in (copy.copy(part), copy.deepcopy(part), pickle.loads(pickle.dumps(part))):
        assert copied.order.tolist() == [2, 0, 1, 3] and copied.offsets.tolist() == [0, 1, 4]
        assert not copied.order.flags.writeable and not copied.offsets.flags.writeable


def test_a_rebuilt_partition_is_checked_again():
    """Pickles go through the constructor: a tampered one is refused, not trusted."""
    part = ClientPartition.from_client_ids([0, 0, 1])
    tampered = pickle.dumps(part).replace(
        np.array([0, 2, 3], dtype=np.int64).tobytes(), np.array([0, 3, 3], dtype=np.int64).tobytes()
    )
    assert tampered != pickle.dumps(part)
    with pytest.raises(ValueError, match="offsets must be strictly increasing"):
        pickle.loads(tampered)


@st.composite
def _client_ids(draw):
    """One client id per example, every client of ``0 .. k - 1`` holding at least one."""
    k = draw(st.integers(1, 12))
    extra = draw(st.lists(st.integers(0, k - 1), max_size=30))
    ids = list(range(k)) + extra
    return draw(st.permutations(ids)), k


@given(_client_ids())
def test_factory_partitions_round_trip_through_the_direct_constructor(drawn):
    ids, k = drawn
    part = ClientPartition.from_client_ids(ids)
    again = ClientPartition(part.order, part.offsets)
    assert np.array_equal(again.order, part.order)
    assert np.array_equal(again.offsets, part.offsets)
    assert again.num_clients == k and again.num_examples == len(ids)
    for c in range(k):
        assert np.flatnonzero(np.asarray(ids) == c).tolist() == again.client(c).tolist()


@given(_client_ids(), st.data())
def test_every_corrupted_order_or_offsets_is_refused(drawn, draws):
    ids, k = drawn
    part = ClientPartition.from_client_ids(ids)
    order, offsets = part.order.copy(), part.offsets.copy()
    n = order.size
    kind = draws.draw(st.sampled_from(["repeat", "range", "offset", "end", "start"]))
    if kind == "repeat" and n >= 2:  # one example twice (and so another one missing)
        i, j = draws.draw(st.lists(st.integers(0, n - 1), min_size=2, max_size=2, unique=True))
        order[i] = order[j]
    elif kind == "range" or kind == "repeat":  # an index outside 0 .. n - 1
        i = draws.draw(st.integers(0, n - 1))
        order[i] = draws.draw(st.one_of(st.integers(-(2**40), -1), st.integers(n, 2**40)))
    elif kind == "offset" and k >= 2:  # an inner offset moved onto or past a neighbour
        c = draws.draw(st.integers(1, k - 1))
        offsets[c] = draws.draw(
            st.one_of(st.integers(-5, int(offsets[c - 1])), st.integers(int(offsets[c + 1]), n + 5))
        )
    elif kind == "start" or kind == "offset":
        offsets[0] = draws.draw(st.integers(-5, 5).filter(lambda v: v != 0))
    else:
        offsets[-1] = draws.draw(st.integers(-5, n + 5).filter(lambda v: v != n))
    with pytest.raises(ValueError) as info:
        ClientPartition(order, offsets)
    assert "\n" not in str(info.value)
    assert str(info.value).startswith(("order must", "offsets must"))
