"""Girgis et al. (CCS 2021) Theorem 3.1 and its subsampled version via Wang et al. Theorem 9.

Oracles: the exact Rényi divergence of shuffled binary randomized response (a concrete eps0-LDP
randomizer, so every valid bound must dominate it), and the formulas re-evaluated term by term
in 50-digit mpmath arithmetic.
"""

from __future__ import annotations

import math

import mpmath as mp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shuffle_opacus.analysis.rdp.conversion import rdp_to_dp
from shuffle_opacus.analysis.rdp.girgis import (
    DEFAULT_GIRGIS_ORDERS,
    girgis_epsilon,
    girgis_nbar,
    girgis_rdp,
    girgis_subsampled_rdp,
)

# ---- exact shuffled randomized response -------------------------------------------------------


def _binomial_pmf(trials: int, q: mp.mpf) -> list[mp.mpf]:
    return [mp.binomial(trials, c) * q**c * (1 - q) ** (trials - c) for c in range(trials + 1)]


def _convolve(a: list[mp.mpf], b: list[mp.mpf]) -> list[mp.mpf]:
    out = [mp.mpf(0)] * (len(a) + len(b) - 1)
    for i, x in enumerate(a):
        for j, y in enumerate(b):
            out[i + j] += x * y
    return out


def _flip_probability(eps0: float) -> mp.mpf:
    """Binary randomized response reports the other bit with probability 1/(e^eps0 + 1)."""
    return 1 / (mp.e ** mp.mpf(eps0) + 1)


def rr_shuffle_pair(n: int, ones: int, eps0: float) -> tuple[list[mp.mpf], list[mp.mpf]]:
    """Laws of the number of reported ones for X = (others, 0) and X' = (others, 1).

    ``others`` holds ``ones`` ones and ``n - 1 - ones`` zeros; the shuffled reports are
    equivalent to their count.
    """
    p = _flip_probability(eps0)
    others = _convolve(_binomial_pmf(ones, 1 - p), _binomial_pmf(n - 1 - ones, p))
    return _convolve(others, [1 - p, p]), _convolve(others, [p, 1 - p])


def rr_subsampled_pair(n: int, m: int, eps0: float) -> tuple[list[mp.mpf], list[mp.mpf]]:
    """The same with m of n users sampled without replacement; the other users hold 0.

    With probability g = m/n the differing user is in the sample (then m - 1 zeros join it);
    otherwise the sample is m zeros under both datasets.
    """
    p = _flip_probability(eps0)
    g = mp.mpf(m) / n
    absent = _binomial_pmf(m, p)
    zeros = _binomial_pmf(m - 1, p)
    present_0 = _convolve(zeros, [1 - p, p])
    present_1 = _convolve(zeros, [p, 1 - p])
    mix = lambda present: [(1 - g) * a + g * b for a, b in zip(absent, present, strict=True)]  # noqa: E731
    return mix(present_0), mix(present_1)


def renyi(P: list[mp.mpf], Q: list[mp.mpf], order: int) -> mp.mpf:
    return mp.log(mp.fsum(p**order * q ** (1 - order) for p, q in zip(P, Q, strict=True))) / (
        order - 1
    )


ORACLE_ORDERS = [2, 3, 4, 6, 8, 16, 32, 64]


def test_theorem31_dominates_exact_shuffled_randomized_response():
    mp.mp.dps = 40
    informative = 0
    for n in (2, 7, 20, 40, 100, 200):
        for eps0 in (0.1, 0.3, 1.0, 2.0):
            bound = girgis_rdp(n=n, eps0=eps0, orders=ORACLE_ORDERS)
            for ones in sorted({0, (n - 1) // 2, n - 1}):
                P, Q = rr_shuffle_pair(n, ones, eps0)
                for order, b in zip(ORACLE_ORDERS, bound, strict=True):
                    exact = max(renyi(P, Q, order), renyi(Q, P, order))
                    assert exact > 0
                    assert b >= float(exact) * (1 + 1e-12), (n, eps0, ones, order)
                    informative += b < eps0
    # The eps0 cap alone would pass the test; make sure the formula itself was compared often.
    assert informative >= 60


@pytest.mark.parametrize(
    ("n", "rate"), [(20, 0.5), (40, 0.25), (100, 0.1), (100, 0.5), (400, 0.25), (1000, 0.1)]
)
def test_subsampled_bound_dominates_exact_subsampled_randomized_response(n, rate):
    mp.mp.dps = 40
    m = round(n * rate)
    for eps0 in (0.3, 1.0, 2.0, 4.0):
        bound = girgis_subsampled_rdp(n=n, eps0=eps0, rate=rate, orders=ORACLE_ORDERS)
        P, Q = rr_subsampled_pair(n, m, eps0)
        for order, b in zip(ORACLE_ORDERS, bound, strict=True):
            exact = max(renyi(P, Q, order), renyi(Q, P, order))
            assert b >= float(exact) * (1 + 1e-12), (n, rate, eps0, order)


# ---- the formulas in mpmath ---------------------------------------------------------------------


def theorem31_mp(n: int, eps0: float, order: int) -> mp.mpf:
    """Theorem 3.1 written out term by term, then capped at eps0."""
    e = mp.e ** mp.mpf(eps0)
    nbar = mp.floor((n - 1) / (2 * e)) + 1
    total = 1 + mp.binomial(order, 2) * (e - 1) ** 2 / (nbar * e)
    x = (e**2 - 1) ** 2 / (2 * e**2 * nbar)
    for i in range(3, order + 1):
        total += mp.binomial(order, i) * i * mp.gamma(mp.mpf(i) / 2) * x ** (mp.mpf(i) / 2)
    total += mp.e ** (mp.mpf(eps0) * order - (n - 1) / (8 * e))
    return min(mp.log(total) / (order - 1), mp.mpf(eps0))


def wang_mp(n: int, m: int, eps0: float, order: int) -> mp.mpf:
    """Wang et al. Theorem 9 with eps(j) = theorem31_mp(m, ., j), eps(inf) = eps0, then capped."""
    g = mp.mpf(m) / n
    e0 = mp.e ** mp.mpf(eps0)
    eps = {j: theorem31_mp(m, eps0, j) for j in range(2, order + 1)}
    total = 1 + g**2 * mp.binomial(order, 2) * min(
        4 * (mp.e ** eps[2] - 1), mp.e ** eps[2] * min(2, (e0 - 1) ** 2)
    )
    for j in range(3, order + 1):
        total += g**j * mp.binomial(order, j) * mp.e ** ((j - 1) * eps[j]) * min(2, (e0 - 1) ** j)
    return min(mp.log(total) / (order - 1), mp.log(1 + g * (e0 - 1)))


@pytest.mark.parametrize(
    ("n", "eps0", "orders"),
    [
        (1000, 1.0, [2, 3, 5]),
        (10_000, 3.0, [2, 4, 8, 16, 32]),
        (10**6, 0.5, [2, 17, 64, 200]),
        (50, 0.2, [2, 3, 10]),
    ],
)
def test_theorem31_against_mpmath(n, eps0, orders):
    mp.mp.dps = 50
    got = girgis_rdp(n=n, eps0=eps0, orders=orders)
    for order, value in zip(orders, got, strict=True):
        assert value == pytest.approx(float(theorem31_mp(n, eps0, order)), rel=1e-10)


def test_hand_values_at_n1000_eps1():
    # nbar = floor(999 / (2e)) + 1 = floor(183.75...) + 1 = 184.
    assert girgis_nbar(1000, 1.0) == 184
    e = math.e
    x = (e**2 - 1) ** 2 / (2 * e**2 * 184)
    last = lambda order: math.exp(order - 999 / (8 * e))  # noqa: E731
    order2 = math.log(1 + (e - 1) ** 2 / (184 * e) + last(2))
    order3 = math.log(1 + 3 * (e - 1) ** 2 / (184 * e) + 3 * math.gamma(1.5) * x**1.5 + last(3))
    order3 /= 2
    got = girgis_rdp(n=1000, eps0=1.0, orders=[2, 3, 5])
    assert got[0] == pytest.approx(order2, rel=1e-12)
    assert got[1] == pytest.approx(order3, rel=1e-12)
    # Pinned values (the third also follows from theorem31_mp); none reaches the eps0 cap.
    np.testing.assert_allclose(
        got, [0.005885695640312226, 0.01117385431491489, 0.026679976919863492], rtol=1e-12
    )
    assert np.all(got < 1.0)


@pytest.mark.parametrize(
    ("n", "rate", "eps0", "orders"),
    [
        (2000, 0.5, 1.0, [2, 3, 5]),  # the Wang sum itself
        (100, 0.5, 1.0, [2, 8]),  # at the pure-DP cap log(1 + g(e - 1))
        (1000, 0.1, 0.3, [2, 4, 16, 64]),
        (10_000, 0.01, 3.0, [2, 4, 8, 16, 32]),
    ],
)
def test_subsampled_against_mpmath(n, rate, eps0, orders):
    mp.mp.dps = 50
    got = girgis_subsampled_rdp(n=n, eps0=eps0, rate=rate, orders=orders)
    m = round(n * rate)
    for order, value in zip(orders, got, strict=True):
        assert value == pytest.approx(float(wang_mp(n, m, eps0, order)), rel=1e-10)


def test_caps():
    # Few users: the formula exceeds eps0, so the post-processing cap is returned exactly.
    assert np.all(girgis_rdp(n=10, eps0=3.0, orders=[2, 64]) == 3.0)
    cap = math.log1p(0.5 * math.expm1(1.0))
    np.testing.assert_allclose(
        girgis_subsampled_rdp(n=100, eps0=1.0, rate=0.5, orders=[2, 256]), cap, rtol=1e-14
    )
    # The cap binds there: with the base eps(2) of the m = 50 shuffle, Wang's order-2 value
    # log(1 + g^2 min{4(e^eps(2) - 1), e^eps(2) min{2, (e - 1)^2}}) is larger than the cap.
    eps2 = girgis_rdp(n=50, eps0=1.0, orders=[2])[0]
    e = math.e
    wang2 = math.log(1 + 0.25 * min(4 * math.expm1(eps2), math.exp(eps2) * min(2, (e - 1) ** 2)))
    assert wang2 > cap


def test_large_n_limit_of_order_two():
    # For n -> inf, eps(2) ~ C(2,2)(e^eps0 - 1)^2 / (nbar e^eps0) with nbar ~ n / (2 e^eps0).
    n, eps0 = 10**12, 1.0
    (value,) = girgis_rdp(n=n, eps0=eps0, orders=[2])
    assert value == pytest.approx(2 * math.expm1(eps0) ** 2 / n, rel=1e-9)


def test_eps0_zero_gives_zero():
    assert np.all(girgis_rdp(n=5, eps0=0.0, orders=[2, 10]) == 0.0)
    assert np.all(girgis_subsampled_rdp(n=10, eps0=0.0, rate=0.5, orders=[2, 10]) == 0.0)


def test_no_overflow_for_large_orders_and_eps0():
    got = girgis_rdp(n=10**9, eps0=40.0, orders=[2, 1000, 4096])
    assert np.all(np.isfinite(got)) and np.all(got <= 40.0)
    sub = girgis_subsampled_rdp(n=10**9, eps0=40.0, rate=1e-3, orders=[2, 1000])
    assert np.all(np.isfinite(sub))
    assert np.all(sub <= 40.0 + math.log(1e-3 + (1 - 1e-3) * math.exp(-40.0)) + 1e-12)


def test_subsampled_cap_past_exp_overflow():
    # e^{800} overflows a float; the cap is then computed as eps0 + log(g + (1 - g) e^{-eps0}).
    # With g = 1 the cap is eps0 and Wang's bound, 2 e^{(l-1) eps0} and more, lies above it.
    assert np.all(girgis_subsampled_rdp(n=1000, eps0=800.0, rate=1.0, orders=[2, 64]) == 800.0)
    # With g = 1e-3 Wang's bound stays just below the cap 800 + log(1e-3) and approaches it.
    got = girgis_subsampled_rdp(n=10**6, eps0=800.0, rate=1e-3, orders=[2, 64, 1024])
    cap = 800.0 + math.log(1e-3)
    assert np.all(np.diff(got) > 0) and got[-1] <= cap
    assert got[-1] == pytest.approx(cap, abs=0.01)


def test_orders_are_sorted_and_deduplicated():
    np.testing.assert_array_equal(
        girgis_rdp(n=500, eps0=1.0, orders=[5, 2, 3, 3]),
        girgis_rdp(n=500, eps0=1.0, orders=[2, 3, 5]),
    )


# ---- monotonicity ----------------------------------------------------------------------------

ORDERS = np.arange(2, 65)


@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(min_value=1, max_value=10**7),
    extra=st.integers(min_value=1, max_value=10**7),
    eps0=st.floats(min_value=0.0, max_value=8.0),
    bump=st.floats(min_value=1e-3, max_value=2.0),
)
def test_theorem31_monotone(n, extra, eps0, bump):
    base = girgis_rdp(n=n, eps0=eps0, orders=ORDERS)
    # nbar and (n - 1)/(8 e^eps0) grow with n; every term grows with eps0.
    assert np.all(girgis_rdp(n=n + extra, eps0=eps0, orders=ORDERS) <= base * (1 + 1e-12))
    assert np.all(girgis_rdp(n=n, eps0=eps0 + bump, orders=ORDERS) >= base * (1 - 1e-12))
    # (l - 1) eps(l) = min(log(1 + S(l)), (l - 1) eps0) and S(l) grows with l.
    scaled = (ORDERS - 1) * base
    assert np.all(np.diff(scaled) >= -1e-12 * scaled[1:])


@settings(max_examples=30, deadline=None)
@given(
    m=st.integers(min_value=1, max_value=5000),
    factor=st.integers(min_value=1, max_value=100),
    extra=st.integers(min_value=1, max_value=10**5),
    eps0=st.floats(min_value=0.0, max_value=6.0),
    bump=st.floats(min_value=1e-3, max_value=2.0),
)
def test_subsampled_monotone(m, factor, extra, eps0, bump):
    n = m * factor
    base = girgis_subsampled_rdp(n=n, eps0=eps0, rate=m / n, orders=ORDERS)
    # Same sample size, larger population: the same base RDP with a smaller g.
    more = girgis_subsampled_rdp(n=n + extra, eps0=eps0, rate=m / (n + extra), orders=ORDERS)
    assert np.all(more <= base * (1 + 1e-12))
    bigger = girgis_subsampled_rdp(n=n, eps0=eps0 + bump, rate=m / n, orders=ORDERS)
    assert np.all(bigger >= base * (1 - 1e-12))
    scaled = (ORDERS - 1) * base
    assert np.all(np.diff(scaled) >= -1e-12 * scaled[1:])
    assert np.all(base <= math.log1p(m / n * math.expm1(eps0)) * (1 + 1e-12))


# ---- composition -----------------------------------------------------------------------------


def test_epsilon_is_lemma2_on_the_composed_rdp():
    orders = np.arange(2, 257)
    lam = orders.astype(float)
    for rate, per_round in [
        (None, girgis_rdp(n=10_000, eps0=1.0, orders=orders)),
        (0.05, girgis_subsampled_rdp(n=10_000, eps0=1.0, rate=0.05, orders=orders)),
    ]:
        by_hand = np.min(
            50 * per_round
            + (math.log(1e6) + (lam - 1) * np.log(1 - 1 / lam) - np.log(lam)) / (lam - 1)
        )
        got = girgis_epsilon(n=10_000, eps0=1.0, delta=1e-6, steps=50, rate=rate)
        assert got == pytest.approx(by_hand, rel=1e-12)
    np.testing.assert_array_equal(DEFAULT_GIRGIS_ORDERS, orders)


def test_epsilon_orders_argument_and_trends():
    orders = [2, 4, 8, 16, 32]
    rdp = 10 * girgis_rdp(n=5000, eps0=1.0, orders=orders)
    expected, _ = rdp_to_dp(orders=orders, rdp=rdp, delta=1e-5)
    assert girgis_epsilon(n=5000, eps0=1.0, delta=1e-5, steps=10, orders=orders) == pytest.approx(
        expected
    )
    values = [girgis_epsilon(n=n, eps0=1.0, delta=1e-5, steps=10) for n in (10**3, 10**4, 10**5)]
    assert values[0] > values[1] > values[2] > 0
    one, many = (girgis_epsilon(n=10**4, eps0=1.0, delta=1e-5, steps=s) for s in (1, 100))
    assert one < many


# ---- bad input -------------------------------------------------------------------------------

GOOD = {"n": 100, "eps0": 1.0, "orders": [2, 3]}
GOOD_SUB = {**GOOD, "rate": 0.1}
GOOD_EPS = {"n": 100, "eps0": 1.0, "delta": 1e-5, "steps": 3}


@pytest.mark.parametrize(
    ("fn", "kwargs", "name"),
    [
        (girgis_rdp, {**GOOD, "n": 0}, "n"),
        (girgis_rdp, {**GOOD, "n": 2.5}, "n"),
        (girgis_rdp, {**GOOD, "n": True}, "n"),
        (girgis_rdp, {**GOOD, "eps0": -0.1}, "eps0"),
        (girgis_rdp, {**GOOD, "eps0": math.inf}, "eps0"),
        (girgis_rdp, {**GOOD, "eps0": math.nan}, "eps0"),
        (girgis_rdp, {**GOOD, "orders": [1, 2]}, "orders"),
        (girgis_rdp, {**GOOD, "orders": [2, 2.5]}, "orders"),
        (girgis_rdp, {**GOOD, "orders": []}, "orders"),
        (girgis_subsampled_rdp, {**GOOD_SUB, "n": -3}, "n"),
        (girgis_subsampled_rdp, {**GOOD_SUB, "eps0": -1.0}, "eps0"),
        (girgis_subsampled_rdp, {**GOOD_SUB, "rate": 0.0}, "rate"),
        (girgis_subsampled_rdp, {**GOOD_SUB, "rate": 1.5}, "rate"),
        (girgis_subsampled_rdp, {**GOOD_SUB, "rate": math.nan}, "rate"),
        (girgis_subsampled_rdp, {**GOOD_SUB, "rate": 0.013}, "rate"),  # rate * n = 1.3
        (girgis_subsampled_rdp, {**GOOD_SUB, "rate": 0.001}, "rate"),  # rate * n = 0.1
        (girgis_subsampled_rdp, {**GOOD_SUB, "orders": [0]}, "orders"),
        (girgis_epsilon, {**GOOD_EPS, "delta": 0.0}, "delta"),
        (girgis_epsilon, {**GOOD_EPS, "delta": 1.0}, "delta"),
        (girgis_epsilon, {**GOOD_EPS, "steps": 0}, "steps"),
        (girgis_epsilon, {**GOOD_EPS, "rate": 2.0}, "rate"),
        (girgis_epsilon, {**GOOD_EPS, "orders": [1.5]}, "orders"),
        (girgis_epsilon, {**GOOD_EPS, "n": 0}, "n"),
    ],
)
def test_bad_arguments(fn, kwargs, name):
    with pytest.raises(ValueError, match=rf"^{name} must ") as info:
        fn(**kwargs)
    assert "\n" not in str(info.value)
    assert "Found" in str(info.value)


def test_rate_tolerates_float_rounding():
    # 0.07 * 100 = 7.000000000000001 in floating point.
    np.testing.assert_array_equal(
        girgis_subsampled_rdp(n=100, eps0=1.0, rate=0.07, orders=[2, 3]),
        girgis_subsampled_rdp(n=100, eps0=1.0, rate=7 / 100, orders=[2, 3]),
    )
