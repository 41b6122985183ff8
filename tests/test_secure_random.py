"""The operating system's draws of secure mode: exact coins, unbiased integers and cohorts, noise.

Statistical checks use a false-positive rate of 1e-6 each (a p-value below it fails).
"""

from __future__ import annotations

import itertools
import os
from collections import Counter

import numpy as np
import pytest
from scipy import stats

from shuffle_opacus.common import secure_random
from shuffle_opacus.common.secure_random import (
    SecureGenerator,
    below,
    bernoulli,
    normal,
    sample,
    uniforms,
)

ALPHA = 1e-6


def test_uniforms_are_53_bit_grid_points_in_the_unit_interval():
    u = uniforms((3, 1000))
    assert u.shape == (3, 1000) and u.dtype == np.float64
    assert u.min() >= 0.0 and u.max() < 1.0
    assert np.array_equal(u * 2.0**53, np.floor(u * 2.0**53))
    assert stats.kstest(u.ravel(), "uniform").pvalue > ALPHA
    assert uniforms().shape == () and uniforms(0).shape == (0,)


def test_coins_follow_the_rate():
    heads = int(bernoulli(200_000, 0.3).sum())
    assert stats.binomtest(heads, 200_000, 0.3).pvalue > ALPHA
    assert bernoulli(5, 1.0).all() and bernoulli(0, 0.5).shape == (0,)
    with pytest.raises(ValueError, match="rate"):
        bernoulli(3, 0.0)


def test_a_coin_is_exact_beyond_64_bits(monkeypatch):
    """rate = 3 * 2**-66: heads only when the word is 0 (the first 64 bits of the rate) and then
    with probability 3/4 (the rest of its expansion), so P(heads) = 3 * 2**-66 exactly."""
    monkeypatch.setattr(secure_random, "_words", lambda count: np.zeros(count, dtype=np.uint64))
    asked = []

    def randbelow(bound):
        asked.append(bound)
        return len(asked) - 1  # 0, 1, 2, 3: heads for the first three

    monkeypatch.setattr(secure_random.secrets, "randbelow", randbelow)
    assert bernoulli(4, 3 * 2.0**-66).tolist() == [True, True, True, False]
    assert asked == [4, 4, 4, 4]
    monkeypatch.setattr(secure_random, "_words", lambda count: np.ones(count, dtype=np.uint64))
    assert not bernoulli(4, 3 * 2.0**-66).any()  # a word above the rate's first 64 bits


def test_a_coin_compares_the_whole_word_with_the_rate(monkeypatch):
    threshold = int(0.25 * 2**64)
    words = np.array([0, threshold - 1, threshold, 2**64 - 1], dtype=np.uint64)
    monkeypatch.setattr(secure_random, "_words", lambda count: words[:count].copy())
    assert bernoulli(4, 0.25).tolist() == [True, True, False, False]


def test_integers_are_rejection_sampled(monkeypatch):
    """A masked word at or above the bound is drawn again, never folded onto the range."""
    queue = [np.array([6, 2], dtype=np.uint64), np.array([7], dtype=np.uint64)]
    queue.append(np.array([4], dtype=np.uint64))
    monkeypatch.setattr(secure_random, "_words", lambda count: queue.pop(0)[:count])
    assert below(np.array([5, 5])).tolist() == [4, 2]  # 6 and 7 rejected, 2 and 4 kept
    assert not queue


@pytest.mark.parametrize("bound", [1, 3, 5, 7, 12])
def test_integers_are_uniform(bound):
    draws = below(np.full(6000 * bound, bound))
    assert draws.min() >= 0 and draws.max() < bound
    if bound > 1:
        counts = np.bincount(draws, minlength=bound)
        assert stats.chisquare(counts).pvalue > ALPHA


def test_bounds_are_checked():
    with pytest.raises(ValueError, match=r"bounds must be integers in \[1, 2\*\*63 - 1\]"):
        below(np.array([0]))
    big = below(np.array([2**63 - 1], dtype=np.int64))
    assert 0 <= int(big[0]) < 2**63 - 1


def test_a_cohort_is_a_uniform_ordered_sample():
    """All 12 ordered pairs of 4 items, 24,000 draws: chi-square against uniform."""
    counts = Counter(tuple(sample(4, 2).tolist()) for _ in range(24_000))
    assert set(counts) == set(itertools.permutations(range(4), 2))
    assert stats.chisquare(list(counts.values())).pvalue > ALPHA
    full = sample(50, 50)
    assert sorted(full.tolist()) == list(range(50))
    assert sample(0, 0).size == 0 and sample(1, 1).tolist() == [0]
    with pytest.raises(ValueError, match="m"):
        sample(3, 4)


def test_noise_is_gaussian_with_the_scale():
    x = normal(1.5, 2.0, size=200_000)
    assert stats.kstest((x - 1.5) / 2.0, "norm").pvalue > ALPHA
    assert normal(0.0, 0.0, size=(2, 2)).tolist() == [[0.0, 0.0], [0.0, 0.0]]
    with pytest.raises(ValueError, match="scale must be a finite number >= 0"):
        normal(0.0, -1.0, size=3)


def test_the_generator_reads_the_os_and_no_numpy_stream(monkeypatch):
    reads = []
    real = os.urandom
    monkeypatch.setattr(os, "urandom", lambda k: reads.append(k) or real(k))
    monkeypatch.setattr(np.random, "PCG64", None)  # any use would raise
    monkeypatch.setattr(np.random, "default_rng", None)
    rng = SecureGenerator()
    assert rng.normal(0.0, 1.0, size=(3, 4)).shape == (3, 4)
    assert rng.random((5,)).shape == (5,)
    assert reads == [8 * 4 * 12, 8 * 5]  # four Box-Muller draws per value, one word per uniform
    assert repr(rng) == "SecureGenerator()"
