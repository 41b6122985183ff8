"""Round samplers: distribution of batch sizes, shuffled order, reproducibility, resumption."""

from __future__ import annotations

import copy
import itertools
import math
from collections import Counter

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats
from torch.utils.data import DataLoader, TensorDataset

from shuffle_opacus.engine.sampling import FixedSizeShuffledSampler, ShuffledCheckInSampler


def test_checkin_mean_batch_size_within_four_standard_errors():
    n, rate, rounds = 2000, 0.03, 400
    sizes = np.array([len(b) for b in ShuffledCheckInSampler(n, rate, rounds, seed=11)])
    se = math.sqrt(n * rate * (1 - rate) / rounds)
    assert abs(sizes.mean() - n * rate) < 4 * se
    # Binomial variance too (4 standard errors of the sample variance, normal approximation).
    var = n * rate * (1 - rate)
    assert abs(sizes.var(ddof=1) - var) < 4 * var * math.sqrt(2 / (rounds - 1))
    assert len(set(sizes.tolist())) > 5


def test_checkin_batches_are_distinct_clients_in_random_order():
    sampler = ShuffledCheckInSampler(500, 0.2, 50, seed=3)
    sorted_batches = 0
    for batch in sampler:
        assert len(set(batch)) == len(batch)
        assert all(0 <= i < 500 for i in batch)
        sorted_batches += batch == sorted(batch)
    assert sorted_batches == 0


def test_checkin_each_client_included_with_probability_rate():
    n, rate, rounds = 20, 0.3, 3000
    counts = np.zeros(n)
    for batch in ShuffledCheckInSampler(n, rate, rounds, seed=5):
        counts[batch] += 1
    # Each count is Binomial(rounds, rate); chi-square goodness of fit across clients.
    expected = rounds * rate
    chi2 = ((counts - expected) ** 2 / (expected * (1 - rate))).sum()
    assert stats.chi2.sf(chi2, df=n) > 1e-4


def test_fixed_size_order_is_uniform_over_permutations():
    counts = Counter(tuple(b) for b in FixedSizeShuffledSampler(3, 3, 6000, seed=2))
    assert set(counts) == set(itertools.permutations(range(3)))
    _, p = stats.chisquare(list(counts.values()))
    assert p > 1e-4


def test_fixed_size_subsets_are_uniform():
    counts = Counter(frozenset(b) for b in FixedSizeShuffledSampler(5, 2, 5000, seed=9))
    assert len(counts) == 10
    _, p = stats.chisquare(list(counts.values()))
    assert p > 1e-4


def test_same_seed_same_rounds_different_seed_different_rounds():
    a = list(ShuffledCheckInSampler(300, 0.1, 20, seed=1))
    assert a == list(ShuffledCheckInSampler(300, 0.1, 20, seed=1))
    assert a != list(ShuffledCheckInSampler(300, 0.1, 20, seed=2))
    b = list(FixedSizeShuffledSampler(300, 30, 20, seed=1))
    assert b == list(FixedSizeShuffledSampler(300, 30, 20, seed=1))
    assert b != list(FixedSizeShuffledSampler(300, 30, 20, seed=2))


def test_unseeded_sampler_records_its_seed():
    s = ShuffledCheckInSampler(300, 0.1, 5)
    assert list(s) == list(ShuffledCheckInSampler(300, 0.1, 5, seed=s.seed))


def test_start_round_resumes_the_same_sequence():
    full = list(ShuffledCheckInSampler(400, 0.05, 30, seed=7))
    tail = ShuffledCheckInSampler(400, 0.05, 30, seed=7, start_round=12)
    assert len(tail) == 18
    assert list(tail) == full[12:]


def test_len_is_rounds_and_empty_rounds_are_empty_lists():
    s = ShuffledCheckInSampler(10, 0.01, 200, seed=0)
    batches = list(s)
    assert len(s) == 200 == len(batches)
    assert sum(b == [] for b in batches) > 100


def test_full_protocol_and_sample_rates():
    full = FixedSizeShuffledSampler(10, 10, 3, seed=0)
    assert full.protocol == "full" and full.sample_rate == 1.0
    assert all(sorted(b) == list(range(10)) for b in full)
    sub = FixedSizeShuffledSampler(10, 4, 3, seed=0)
    assert sub.protocol == "subsampled" and sub.sample_rate == 0.4
    assert all(len(b) == 4 for b in sub)
    assert ShuffledCheckInSampler(10, 0.3, 3).expected_batch_size == pytest.approx(3.0)


def test_works_as_a_dataloader_batch_sampler():
    ds = TensorDataset(torch.arange(50.0).reshape(50, 1))
    sampler = FixedSizeShuffledSampler(50, 5, 4, seed=0)
    batches = [x for (x,) in DataLoader(ds, batch_sampler=sampler)]
    assert [b.shape[0] for b in batches] == [5] * 4
    assert [b[:, 0].int().tolist() for b in batches] == [sampler.batch(t) for t in range(4)]


@pytest.mark.parametrize(
    ("factory", "message"),
    [
        (lambda: ShuffledCheckInSampler(10, 0.0, 5), r"rate must be in \(0, 1\]"),
        (lambda: ShuffledCheckInSampler(10, 1.5, 5), r"rate must be in \(0, 1\]"),
        (lambda: ShuffledCheckInSampler(0, 0.5, 5), r"n must be an integer >= 1"),
        (lambda: ShuffledCheckInSampler(10, 0.5, 0), r"rounds must be an integer >= 1"),
        (
            lambda: ShuffledCheckInSampler(10, 0.5, 5, seed=-1),
            r"seed must be an integer in \[0, 2\*\*128 - 1\]",
        ),
        (lambda: ShuffledCheckInSampler(10, 0.5, 5, start_round=-1), r"start_round"),
        (lambda: ShuffledCheckInSampler(10, True, 5), r"rate must be a number in \(0, 1\]"),
        (lambda: ShuffledCheckInSampler(10, "0.1", 5), r"rate must be a number in \(0, 1\]"),
        (lambda: FixedSizeShuffledSampler(10, 11, 5), r"m must be an integer in \[1, 10\]"),
        (lambda: FixedSizeShuffledSampler(10, 0, 5), r"m must be an integer in \[1, 10\]"),
    ],
)
def test_bad_arguments_name_the_parameter(factory, message):
    with pytest.raises(ValueError, match=message):
        factory()


@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(1, 200),
    rate=st.floats(0.001, 1.0),
    rounds=st.integers(1, 20),
    seed=st.integers(0, 2**32),
    t=st.integers(0, 19),
)
def test_batch_t_matches_iteration(n, rate, rounds, seed, t):
    s = ShuffledCheckInSampler(n, rate, rounds, seed=seed)
    batches = list(s)
    assert len(batches) == rounds
    if t < rounds:
        assert s.batch(t) == batches[t]
    if rate == 1.0:
        assert all(sorted(b) == list(range(n)) for b in batches)


def test_iteration_never_repeats_a_round():
    """A later ``for`` continues from the cursor: the rest of the pass, then a whole new pass."""
    s = ShuffledCheckInSampler(300, 0.1, 6, seed=3)
    first = []
    for batch in s:
        first.append(batch)
        if len(first) == 2:
            break
    assert s.next_round == 2 and len(s) == 4
    rest = list(s)  # finishes the first pass
    assert len(s) == 6 and s.next_round == 6
    second = list(s)  # a new pass: rounds 6..11
    assert first + rest + second == [s.batch(t) for t in range(12)]
    assert s.released == 12


def test_parameters_are_fixed_and_one_release_hook_per_sampler():
    s = FixedSizeShuffledSampler(20, 5, 4, seed=0)
    for name, value in [("m", 10), ("n", 40), ("rounds", 8), ("start_round", 2)]:
        with pytest.raises(AttributeError, match=f"{name} of a FixedSizeShuffledSampler is fixed"):
            setattr(s, name, value)
    with pytest.raises(AttributeError, match="round state"):
        s._next_round = 0
    released = []
    s.attach_release_hook(lambda t, batch: released.append((t, batch)))
    with pytest.raises(ValueError, match="already reports its rounds"):
        s.attach_release_hook(print)
    assert list(s) == [b for _, b in released] and [t for t, _ in released] == [0, 1, 2, 3]
    with pytest.raises(TypeError, match="would release the same rounds"):
        copy.deepcopy(s)
    free = ShuffledCheckInSampler(20, 0.5, 3, seed=1)
    twin = copy.copy(free)
    assert list(twin) == list(free) and twin.rate == free.rate
