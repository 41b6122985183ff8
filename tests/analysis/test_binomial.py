"""The binomial functions of the clones bound against ``scipy.stats.binom``, bit for bit.

``shuffle_opacus.analysis.approximate._binomial`` calls the Boost kernels that
``scipy.stats.binom`` calls, without importing ``scipy.stats``; every value, in the bulk, deep in
the tails and at the edges of the support and of the parameters, must be the same float (the
clones bound is an upper bound computed from them, and the numbers it prints must not move).
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from scipy.stats import binom

from shuffle_opacus.analysis.approximate import _binomial
from shuffle_opacus.analysis.approximate._binomial import (
    binom_cdf,
    binom_isf,
    binom_logcdf,
    binom_logpmf,
    binom_logsf,
    binom_pmf,
    binom_ppf,
    binom_sf,
)

AT_POINTS = [
    (binom_pmf, binom.pmf),
    (binom_cdf, binom.cdf),
    (binom_sf, binom.sf),
    (binom_logpmf, binom.logpmf),
    (binom_logcdf, binom.logcdf),
    (binom_logsf, binom.logsf),
]
QUANTILES = [(binom_ppf, binom.ppf), (binom_isf, binom.isf)]


def _same(got, expected):
    """Equal floats (``nan`` where ``nan``), the same shape, a scalar for a scalar."""
    assert np.ndim(got) == np.ndim(expected)
    assert np.shape(got) == np.shape(expected)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(expected))


def _compare(ours, theirs, *args):
    """The same values, and the same warnings (Boost's, where a quantile search gives up)."""
    with warnings.catch_warnings(record=True) as ours_warned:
        warnings.simplefilter("always")
        got = ours(*args)
    with warnings.catch_warnings(record=True) as theirs_warned:
        warnings.simplefilter("always")
        expected = theirs(*args)
    _same(got, expected)
    assert {str(w.message) for w in ours_warned} == {str(w.message) for w in theirs_warned}


def _random_laws(rng: np.random.Generator, size: int) -> tuple[np.ndarray, np.ndarray]:
    """Numbers of trials from 0 to 10^7 and success probabilities from 1e-300 to 1 - 1e-16."""
    n = np.floor(10.0 ** rng.uniform(0.0, 7.0, size)) - rng.integers(0, 2, size)
    p = 10.0 ** rng.uniform(-300.0, 0.0, size)
    p = np.where(rng.random(size) < 0.3, 1.0 - 10.0 ** rng.uniform(-16.0, -0.3, size), p)
    p = np.where(rng.random(size) < 0.2, 0.5, p)
    return n, p


def test_the_kernels_of_scipy_special_are_there():
    # Without them the functions fall back on scipy.stats (same values, slower to import); this
    # scipy must have them, or the clones path loads scipy.stats again.
    assert _binomial._kernels() is not None


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize(("ours", "theirs"), AT_POINTS)
def test_masses_and_tails_in_the_bulk_and_the_far_tails(seed, ours, theirs):
    rng = np.random.default_rng(seed)
    n, p = _random_laws(rng, 3000)
    mean, sd = n * p, np.sqrt(n * p * (1.0 - p))
    # From 60 standard deviations below the mean to 60 above, and the ends of the support.
    k = np.floor(mean + sd * rng.uniform(-60.0, 60.0, n.size))
    k = np.where(rng.random(n.size) < 0.1, rng.choice([0.0, 1.0], n.size) * n, k)
    k = np.clip(k, -2.0, n + 2.0)
    _compare(ours, theirs, k, n, p)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize(("ours", "theirs"), QUANTILES)
def test_quantiles_from_tiny_to_near_one(seed, ours, theirs):
    rng = np.random.default_rng(100 + seed)
    n, p = _random_laws(rng, 1500)
    q = 10.0 ** rng.uniform(-300.0, 0.0, n.size)
    q = np.where(rng.random(n.size) < 0.3, 1.0 - q * 0.5, q)
    q = np.where(rng.random(n.size) < 0.2, 1e-16, q)  # the clones bound's default tail
    _compare(ours, theirs, q, n, p)


@pytest.mark.parametrize(("ours", "theirs"), AT_POINTS)
def test_edges_of_the_support_and_bad_parameters(ours, theirs):
    k = np.array([-np.inf, -1.0, -0.5, 0.0, 0.5, 1.0, 2.0, 2.5, 3.0, 3.5, 4.0, np.inf, np.nan])
    laws = [(3, 0.3), (0, 0.3), (1, 0.0), (3, 1.0), (3, 0.5), (-1, 0.3), (2.5, 0.3), (3, -0.1),
            (3, 1.1), (np.nan, 0.3), (3, np.nan), (np.inf, 0.3)]  # fmt: skip
    for n, p in laws:
        _compare(ours, theirs, k, n, p)
        for point in k:  # scalars give scalars
            _compare(ours, theirs, point, n, p)


@pytest.mark.parametrize(("ours", "theirs"), QUANTILES)
def test_quantiles_at_their_ends_and_out_of_range(ours, theirs):
    q = np.array([-0.5, 0.0, 1e-300, 1e-16, 0.3, 0.5, 1.0 - 1e-16, 1.0, 1.5, np.nan, np.inf])
    for n, p in [(3, 0.3), (0, 0.3), (1, 0.0), (3, 1.0), (-1, 0.3), (3, 1.1), (10**6, 1e-12)]:
        _compare(ours, theirs, q, n, p)
        for point in q:
            _compare(ours, theirs, point, n, p)


def test_the_calls_of_the_clones_bound():
    # As clones.py calls them: many laws Bin(c, 1/2) at once, and Bin(n - 1, e^-eps0) over c.
    c = np.arange(0.0, 5000.0)
    s = np.floor(0.7 * (c + 1.0)) + 1.0
    for shift in (-2.0, -1.0, 0.0, 1.0):
        k = np.clip(s + shift, 1.0, c + 2.0) - 1.0
        _compare(binom_pmf, binom.pmf, k, c, 0.5)
        _compare(binom_sf, binom.sf, k, c, 0.5)
    for n, eps0 in [(1, 1.0), (10**5, 4.0), (10**6, 0.5), (10**7, 8.0), (50, 100.0)]:
        p = float(np.exp(-eps0))
        _compare(binom_ppf, binom.ppf, 1e-16, n - 1, p)
        _compare(binom_isf, binom.isf, 1e-16, n - 1, p)
        lo, hi = binom.ppf(1e-16, n - 1, p), binom.isf(1e-16, n - 1, p)
        _compare(binom_cdf, binom.cdf, lo - 1, n - 1, p)
        _compare(binom_sf, binom.sf, hi, n - 1, p)
        bulk = np.arange(lo, hi + 1.0)
        _compare(binom_pmf, binom.pmf, bulk, n - 1, p)


def test_the_calls_of_the_checkin_bounds():
    # As rdp/checkin.py calls them: log masses over the bulk, log tails at chunk edges.
    for n, rate in [(60000, 0.1), (10**6, 0.01), (1000, 0.5), (10**8, 1e-4), (50, 0.9)]:
        mean, sd = n * rate, (n * rate * (1 - rate)) ** 0.5
        ks = np.arange(max(1, int(mean - 40 * sd)), min(n, int(mean + 40 * sd)) + 1)
        _compare(binom_logpmf, binom.logpmf, ks, n, rate)
        for k in (0, 1, int(mean - 12 * sd), int(mean), int(mean + 12 * sd), n - 1, n):
            _compare(binom_logcdf, binom.logcdf, k, n, rate)
            _compare(binom_logsf, binom.logsf, k, n, rate)


def test_without_the_kernels_scipy_stats_answers(monkeypatch):
    # An older scipy (< 1.14) has the kernels in scipy.stats only: the functions delegate.
    monkeypatch.setattr(_binomial, "_kernels", lambda: None)
    k, n, p = np.array([-1.0, 0.0, 2.0, 7.0]), 6, 0.25
    for ours, theirs in AT_POINTS:
        _compare(ours, theirs, k, n, p)
    for ours, theirs in QUANTILES:
        _compare(ours, theirs, 0.1, n, p)
