"""A composition's Chernoff window computes few moments yet is the full scan's, bit for bit.

Oracle: the scan over every order as ``powers`` computed it before the search (every moment by
``moments.log_mgf``, whose bits ``test_disk_cache`` checks against scipy's ``logsumexp``).
"""

from __future__ import annotations

import math
from unittest import mock

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from shuffle_opacus.analysis.pld import moments, powers, rounds
from shuffle_opacus.analysis.pld.moments import Moments, chernoff_orders, log_mgf, window


def _scan(parts, truncation):
    """The window of every order (``powers._window`` before the search), from fresh moments."""
    first = parts[0][0]
    upper = sum((p.size - 1) * k for p, k in parts)
    lower = 0
    total = np.zeros(first.orders.size)
    for p, k in parts:
        total = total + k * log_mgf(p.probs, p.orders)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        bounds = (total + math.log(2.0 / truncation)) / first.orders
    for order, bound in zip(first.orders, bounds, strict=True):
        if not math.isfinite(bound):
            continue
        if order > 0:
            upper = min(upper, math.ceil(bound))
        else:
            lower = max(lower, math.floor(bound))
    return lower, max(upper, lower)


def _window(parts, truncation):
    support = sum((p.size - 1) * k for p, k in parts)
    return window([(p.moments, k) for p, k in parts], support, truncation)


def _pmf(probs, discretization):
    return powers.PmfPowers.from_arrays(
        discretization=discretization, lower=-7, probs=probs, infinity=0.0, pessimistic=True
    )


def _random_probs(rng, size, spread, tiny_end):
    """Masses like a per-round PMF's: a bump, zeros and tiny values at the ends."""
    x = np.linspace(-1.0, 1.0, size)
    probs = np.exp(-spread * (x - rng.uniform(-0.5, 0.5)) ** 2) * rng.uniform(0.5, 1.0, size)
    probs[: int(rng.integers(0, 5))] = 0.0
    probs[size - int(rng.integers(0, 5)) :] = 0.0
    probs /= probs.sum() * (1.0 + rng.uniform(0.0, 1e-6))  # a little mass at infinity
    if tiny_end:
        probs[np.flatnonzero(probs)[-1]] = 10.0 ** rng.uniform(-280, -30)
    return probs


@settings(max_examples=20, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    size=st.integers(moments._SCAN_SIZE + 1, 6000),
    spread=st.floats(0.5, 3000.0),
    tiny_end=st.booleans(),
    shift=st.integers(4, 16),
    counts=st.lists(st.integers(1, 10**6), min_size=1, max_size=3),
)
def test_windows_equal_the_full_scan_on_random_pmfs(seed, size, spread, tiny_end, shift, counts):
    rng = np.random.default_rng(seed)
    discretization = 2.0**-shift
    parts = [(_pmf(_random_probs(rng, size, spread, tiny_end), discretization), k) for k in counts]
    for truncation in (1e-15, 1e-3, 1e-40):
        assert _window(parts, truncation) == _scan(parts, truncation), truncation


def test_a_real_round_computes_few_orders_and_reports_every_round_as_the_scan():
    # A per-round pair of the lattice engine (n = 1000, sigma 1), composed round after round as
    # an accountant reporting every round asks.
    (pmf,) = [rounds._upper(rounds.ShuffleRound(n=1000, sigma=1.0), 1e-3, 1e-13)]
    fresh = powers.PmfPowers.from_arrays(**{**pmf.fields(), "log_mgf": None})
    assert fresh.moments.trusted and fresh.size > moments._SCAN_SIZE
    for count in (1, 2, 3, 10, 100, 1000, 5540, 10**5):
        assert _window([(fresh, count)], 1e-15) == _scan([(fresh, count)], 1e-15), count
    # The search computed a minority of the orders (else it saves nothing).
    assert fresh.moments.done.sum() < 0.5 * fresh.orders.size


def test_an_untrusted_pmf_computes_every_order():
    rng = np.random.default_rng(7)
    probs = _random_probs(rng, 3000, 20.0, False)
    probs[np.flatnonzero(probs)[-1]] = 1e-300  # below the error bound's range
    pmf = _pmf(probs, 2.0**-10)
    assert not pmf.moments.trusted
    assert _window([(pmf, 40)], 1e-15) == _scan([(pmf, 40)], 1e-15)
    assert pmf.moments.done.all()


def test_a_pmf_with_a_negative_mass_computes_every_order():
    # Not a measure (log M need not be convex there): the chords are not used.
    probs = _random_probs(np.random.default_rng(13), 3000, 20.0, False)
    probs[1500] = -1e-12
    pmf = _pmf(probs, 2.0**-10)
    assert not pmf.moments.trusted
    assert _window([(pmf, 40)], 1e-15) == _scan([(pmf, 40)], 1e-15)
    assert pmf.moments.done.all()


def test_a_small_pmf_computes_every_order():
    pmf = _pmf(_random_probs(np.random.default_rng(8), moments._SCAN_SIZE, 5.0, False), 1e-2)
    assert _window([(pmf, 9)], 1e-15) == _scan([(pmf, 9)], 1e-15)
    assert pmf.moments.done.all()


def test_a_search_that_trusts_bad_bounds_gives_other_windows():
    # Chords claiming every order is out leave the seeds alone: the windows then differ from the
    # scan's, so the comparisons above can fail.
    rng = np.random.default_rng(9)
    parts = [(_pmf(_random_probs(rng, 4000, 300.0, False), 2.0**-12), 5000)]

    def too_high(self, which):
        return np.full(which.size, 1e300)

    with mock.patch.object(Moments, "lower_bounds", too_high):
        assert _window(parts, 1e-15) != _scan(parts, 1e-15)
    assert parts[0][0].moments.done.sum() < parts[0][0].orders.size


def test_moments_do_not_depend_on_which_orders_are_computed_together():
    probs = _random_probs(np.random.default_rng(10), 5000, 50.0, True)
    orders = chernoff_orders(2.0**-14)
    m = Moments(probs, orders, None)
    rng = np.random.default_rng(11)
    for which in (rng.permutation(orders.size)[:37], np.array([orders.size - 1, 0, 5])):
        m.fill(which)
    assert m.full().tobytes() == log_mgf(probs, orders).tobytes()


def test_partial_moments_travel_through_the_fields():
    probs = _random_probs(np.random.default_rng(12), 3000, 80.0, False)
    pmf = _pmf(probs, 2.0**-12)
    _window([(pmf, 77)], 1e-15)
    known = pmf.fields()["log_mgf"]
    assert 0 < np.count_nonzero(~np.isnan(known)) < known.size
    again = powers.PmfPowers.from_arrays(**pmf.fields())
    assert again.moments.done.tolist() == pmf.moments.done.tolist()
    assert again.log_mgf.tobytes() == pmf.log_mgf.tobytes() == log_mgf(probs, pmf.orders).tobytes()
