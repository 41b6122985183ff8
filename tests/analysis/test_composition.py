"""Composition and subsampling baselines for (epsilon, delta)-DP: hand values, oracles, laws."""

from __future__ import annotations

import itertools
import math
import warnings

import mpmath as mp
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shuffle_opacus.analysis.approximate.composition import (
    compose_advanced,
    compose_basic,
    compose_best_epsilon,
    compose_optimal_delta,
    compose_optimal_epsilon,
    subsample_dp,
)


def rr_hockey_stick_brute_force(eps: float, k: int, eps_total: float) -> float:
    """Enumerate all 2^k outcomes of k independent eps-randomized responses.

    Under P each bit is 1 with probability e^eps / (1 + e^eps), under Q with 1 / (1 + e^eps);
    the result is sum over outcomes of max(0, P(x) - e^eps_total Q(x)).
    """
    p1 = math.exp(eps) / (1 + math.exp(eps))
    q1 = 1 / (1 + math.exp(eps))
    total = 0.0
    for bits in itertools.product((0, 1), repeat=k):
        p = math.prod(p1 if b else 1 - p1 for b in bits)
        q = math.prod(q1 if b else 1 - q1 for b in bits)
        total += max(0.0, p - math.exp(eps_total) * q)
    return total


def kov_pair_hockey_stick_brute_force(eps: float, delta: float, k: int, eps_total: float) -> float:
    """Hockey-stick divergence of k copies of the four-outcome pair of Kairouz, Oh & Viswanath.

    The pair P = (delta, (1-delta) e^eps/(1+e^eps), (1-delta)/(1+e^eps), 0) and Q = its reverse is
    (eps, delta)-DP and dominates every (eps, delta)-DP mechanism; 4^k outcomes enumerated.
    """
    e = math.exp(eps)
    single_p = (delta, (1 - delta) * e / (1 + e), (1 - delta) / (1 + e), 0.0)
    single_q = tuple(reversed(single_p))
    total = 0.0
    for outcome in itertools.product(range(4), repeat=k):
        p = math.prod(single_p[o] for o in outcome)
        q = math.prod(single_q[o] for o in outcome)
        total += max(0.0, p - math.exp(eps_total) * q)
    return total


def kov_delta_i(eps: float, delta: float, k: int, i: int) -> float:
    """Kairouz, Oh & Viswanath (2015), Theorem 3.3, at eps_total = (k - 2i) eps, as printed."""
    delta_i = (
        sum(
            math.comb(k, ell) * (math.exp((k - ell) * eps) - math.exp((k - 2 * i + ell) * eps))
            for ell in range(i)
        )
        / (1 + math.exp(eps)) ** k
    )
    return 1 - (1 - delta) ** k * (1 - delta_i)


def rr_hockey_stick_mpmath(eps: float, k: int, eps_total: float) -> float:
    """The binomial form of delta_rr summed term by term in 50-digit arithmetic."""
    with mp.workdps(50):
        e, t = mp.e ** mp.mpf(eps), mp.e ** mp.mpf(eps_total)
        total = mp.mpf(0)
        for ell in range(k + 1):
            total += mp.binomial(k, ell) * max(0, e ** (k - ell) - t * e**ell)
        return float(total / (1 + e) ** k)


# --- hand-computed cases -----------------------------------------------------------------


def test_basic():
    assert compose_basic(eps=0.5, delta=1e-6, k=10) == pytest.approx((5.0, 1e-5), rel=1e-15)
    assert compose_basic(eps=0.0, delta=0.0, k=1) == (0.0, 0.0)


def test_advanced_by_hand():
    # eps = 0.1, k = 10, delta' = 1e-5:
    #   sqrt(2 * 10 * ln(1e5)) = sqrt(20 * 11.512925464970229) = 15.174271293851463
    #   first term 0.1 * 15.174271293851463 = 1.5174271293851463
    #   second term 10 * 0.1 * (e^0.1 - 1) = 0.10517091807564771
    #   total 1.622598047460794
    eps_total, delta_total = compose_advanced(eps=0.1, delta=2e-7, k=10, delta_slack=1e-5)
    assert eps_total == pytest.approx(1.622598047460794, rel=1e-14)
    assert eps_total == pytest.approx(
        0.1 * math.sqrt(2 * 10 * math.log(1 / 1e-5)) + 10 * 0.1 * (math.exp(0.1) - 1), rel=1e-14
    )
    assert delta_total == pytest.approx(10 * 2e-7 + 1e-5, rel=1e-14)


def test_advanced_uses_expm1_for_tiny_eps():
    # k eps (e^eps - 1) = 1e-24 for eps = 1e-12, k = 1; exp(eps) - 1 would lose it entirely.
    eps_total, _ = compose_advanced(
        eps=1e-12, delta=0.0, k=1, delta_slack=math.exp(-0.5)
    )  # sqrt(2 ln(1/d')) = 1
    assert eps_total == pytest.approx(1e-12 + 1e-24, rel=1e-15)


@pytest.mark.parametrize("eps", [0.0, 0.3, 1.0, 4.0])
@pytest.mark.parametrize("eps_total", [0.0, 0.2, 1.0, 5.0])
@pytest.mark.parametrize("delta", [0.0, 1e-3])
def test_optimal_single_mechanism(eps, eps_total, delta):
    # k = 1: the two outcomes of one randomized response give
    #   max(0, e^eps - e^t) / (1 + e^eps)  +  max(0, 1 - e^t e^eps) / (1 + e^eps),
    # the second term is 0 for t >= 0; then delta_total = delta + (1 - delta) * delta_rr.
    delta_rr = max(0.0, math.exp(eps) - math.exp(eps_total)) / (1 + math.exp(eps))
    expected = delta + (1 - delta) * delta_rr
    assert compose_optimal_delta(eps=eps, delta=delta, k=1, eps_total=eps_total) == pytest.approx(
        expected, rel=1e-13, abs=1e-300
    )


@pytest.mark.parametrize(("eps", "eps_total"), [(0.5, 0.0), (0.5, 0.3), (1.0, 1.0), (2.0, 3.9)])
def test_optimal_two_mechanisms_four_outcomes(eps, eps_total):
    p = math.exp(eps) / (1 + math.exp(eps))  # P(bit = 1); Q(bit = 1) = 1 - p
    t = math.exp(eps_total)
    outcomes = {  # outcome: (P, Q)
        (1, 1): (p * p, (1 - p) * (1 - p)),
        (1, 0): (p * (1 - p), (1 - p) * p),
        (0, 1): ((1 - p) * p, p * (1 - p)),
        (0, 0): ((1 - p) * (1 - p), p * p),
    }
    expected = sum(max(0.0, pp - t * qq) for pp, qq in outcomes.values())
    assert compose_optimal_delta(eps=eps, delta=0.0, k=2, eps_total=eps_total) == pytest.approx(
        expected, rel=1e-13
    )


@pytest.mark.parametrize("k", [1, 2, 3, 6, 11])
@pytest.mark.parametrize("eps", [0.1, 0.7, 2.5])
@pytest.mark.parametrize("delta", [0.0, 1e-4])
def test_kov_grid_points(k, eps, delta):
    for i in range(k // 2 + 1):
        got = compose_optimal_delta(eps=eps, delta=delta, k=k, eps_total=(k - 2 * i) * eps)
        assert got == pytest.approx(kov_delta_i(eps, delta, k, i), rel=1e-12, abs=1e-15)


def test_beyond_k_eps_only_the_delta_part_remains():
    base = 1 - (1 - 1e-3) ** 7
    assert compose_optimal_delta(eps=0.4, delta=1e-3, k=7, eps_total=7 * 0.4) == pytest.approx(
        base, rel=1e-13
    )
    assert compose_optimal_delta(eps=0.4, delta=1e-3, k=7, eps_total=50.0) == pytest.approx(
        base, rel=1e-13
    )
    assert compose_optimal_delta(eps=0.0, delta=0.0, k=7, eps_total=0.0) == 0.0


# --- brute-force and high-precision oracles ----------------------------------------------


@settings(max_examples=40, deadline=None)
@given(
    k=st.integers(min_value=1, max_value=8),
    eps=st.floats(min_value=0.0, max_value=3.0),
    eps_total=st.floats(min_value=0.0, max_value=12.0),
)
def test_randomized_response_enumeration(k, eps, eps_total):
    expected = rr_hockey_stick_brute_force(eps, k, eps_total)
    got = compose_optimal_delta(eps=eps, delta=0.0, k=k, eps_total=eps_total)
    assert got == pytest.approx(expected, rel=1e-10, abs=1e-14)


@settings(max_examples=25, deadline=None)
@given(
    k=st.integers(min_value=1, max_value=4),
    eps=st.floats(min_value=0.0, max_value=2.0),
    delta=st.floats(min_value=0.0, max_value=0.2),
    eps_total=st.floats(min_value=0.0, max_value=6.0),
)
def test_kov_dominating_pair_enumeration(k, eps, delta, eps_total):
    expected = kov_pair_hockey_stick_brute_force(eps, delta, k, eps_total)
    got = compose_optimal_delta(eps=eps, delta=delta, k=k, eps_total=eps_total)
    assert got == pytest.approx(expected, rel=1e-10, abs=1e-14)


@pytest.mark.parametrize(
    ("k", "eps", "eps_total"),
    [(1000, 0.05, 5.0), (800, 0.5, 150.0), (300, 6.0, 1750.0), (2000, 0.01, 1.5)],
)
def test_log_space_against_mpmath(k, eps, eps_total):
    expected = rr_hockey_stick_mpmath(eps, k, eps_total)
    assert 1e-300 < expected < 1  # a non-trivial point
    assert compose_optimal_delta(eps=eps, delta=0.0, k=k, eps_total=eps_total) == pytest.approx(
        expected, rel=1e-8
    )


# --- the inverse and its properties ------------------------------------------------------


@settings(max_examples=30, deadline=None)
@given(
    k=st.integers(min_value=1, max_value=300),
    eps=st.floats(min_value=0.01, max_value=3.0),
    delta=st.sampled_from([0.0, 1e-9, 1e-7]),
    delta_total=st.floats(min_value=1e-4, max_value=0.5),  # above k * delta <= 3e-5
)
def test_optimal_epsilon_inverts_delta(k, eps, delta, delta_total):
    tol = 1e-9
    got = compose_optimal_epsilon(eps=eps, delta=delta, k=k, delta_total=delta_total, tol=tol)
    assert 0.0 <= got <= k * eps
    assert compose_optimal_delta(eps=eps, delta=delta, k=k, eps_total=got) <= delta_total
    if got > 2 * tol:
        assert (
            compose_optimal_delta(eps=eps, delta=delta, k=k, eps_total=got - 2 * tol) > delta_total
        )


@settings(max_examples=30, deadline=None)
@given(
    k=st.integers(min_value=1, max_value=300),
    eps=st.floats(min_value=0.01, max_value=3.0),
    delta=st.sampled_from([0.0, 1e-9, 1e-7]),
    delta_total=st.floats(min_value=1e-4, max_value=0.5),
)
def test_optimal_beats_basic_and_advanced(k, eps, delta, delta_total):
    optimal = compose_optimal_epsilon(eps=eps, delta=delta, k=k, delta_total=delta_total)
    assert optimal <= compose_basic(eps=eps, delta=delta, k=k)[0]
    advanced = compose_advanced(eps=eps, delta=delta, k=k, delta_slack=delta_total - k * delta)[0]
    assert optimal <= advanced + 1e-8
    assert compose_best_epsilon(
        eps=eps, delta=delta, k=k, delta_total=delta_total
    ) == pytest.approx(optimal, abs=1e-8)


@settings(max_examples=20, deadline=None)
@given(
    k=st.integers(min_value=1, max_value=200),
    eps=st.floats(min_value=0.01, max_value=2.0),
    delta_total=st.floats(min_value=1e-6, max_value=0.3),
)
def test_optimal_epsilon_monotone(k, eps, delta_total):
    base = compose_optimal_epsilon(eps=eps, delta=1e-9, k=k, delta_total=delta_total)
    assert (
        compose_optimal_epsilon(eps=eps, delta=1e-9, k=k + 7, delta_total=delta_total)
        >= base - 1e-8
    )
    assert (
        compose_optimal_epsilon(eps=eps, delta=1e-9, k=k, delta_total=delta_total * 1.5)
        <= base + 1e-8
    )


def test_delta_total_at_the_delta_part_gives_k_eps():
    # delta = 0, delta_total = 0: only eps_total = k eps has delta_rr = 0.
    assert compose_optimal_epsilon(eps=0.3, delta=0.0, k=5, delta_total=0.0) == pytest.approx(
        1.5, abs=1e-9
    )
    assert compose_best_epsilon(eps=0.3, delta=0.0, k=5, delta_total=0.0) == pytest.approx(
        1.5, abs=1e-9
    )


def test_large_k_is_finite_without_warnings():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for eps in (0.01, 1.0, 10.0):
            value = compose_optimal_epsilon(eps=eps, delta=1e-10, k=10_000, delta_total=1e-5)
            assert math.isfinite(value)
            assert 0 < value <= 10_000 * eps
            assert math.isfinite(
                compose_optimal_delta(eps=eps, delta=1e-10, k=10_000, eps_total=value / 2)
            )
        # Small eps: the optimum is far below basic composition (about 1.0 here vs 100).
        assert (
            compose_optimal_epsilon(eps=0.01, delta=0.0, k=10_000, delta_total=1e-5)
            < 0.1 * 10_000 * 0.01
        )


def test_unreachable_delta_total_names_the_threshold():
    # 1 - (1 - 1e-6)^100 = 9.99950...e-05 > 1e-5.
    with pytest.raises(ValueError, match=r"delta_total must be >= 1 - \(1 - delta\)\^k = 9\.9995"):
        compose_optimal_epsilon(eps=0.1, delta=1e-6, k=100, delta_total=1e-5)
    with pytest.raises(ValueError, match="delta_total must be"):
        compose_best_epsilon(eps=0.1, delta=1e-6, k=100, delta_total=1e-5)


# --- subsampling -------------------------------------------------------------------------


def test_subsampling_by_hand():
    # log(1 + 0.1 (e - 1)) = log(1.1718281828459045) = 0.15856507874042912
    eps_sub, delta_sub = subsample_dp(eps=1.0, delta=1e-5, rate=0.1)
    assert eps_sub == pytest.approx(0.15856507874042912, rel=1e-14)
    assert delta_sub == pytest.approx(1e-6, rel=1e-14)
    # Tiny eps: about rate * eps, kept by log1p / expm1.
    assert subsample_dp(eps=1e-12, delta=0.0, rate=0.5)[0] == pytest.approx(5e-13, rel=1e-9)
    # Large eps does not overflow: eps + log(rate) + O(e^-eps).
    assert subsample_dp(eps=800.0, delta=0.0, rate=0.01)[0] == pytest.approx(
        800 + math.log(0.01), rel=1e-15
    )


@settings(max_examples=50, deadline=None)
@given(
    eps=st.floats(min_value=0.0, max_value=50.0),
    delta=st.floats(min_value=0.0, max_value=0.5),
    rate=st.floats(min_value=1e-6, max_value=1.0),
)
def test_subsampling_properties(eps, delta, rate):
    eps_sub, delta_sub = subsample_dp(eps=eps, delta=delta, rate=rate)
    assert 0.0 <= eps_sub <= eps
    assert delta_sub <= delta
    assert subsample_dp(eps=eps, delta=delta, rate=1.0) == pytest.approx((eps, delta), rel=1e-15)
    assert subsample_dp(eps=eps, delta=delta, rate=rate / 2)[0] <= eps_sub


# --- argument checks ---------------------------------------------------------------------

GOOD = {"eps": 0.5, "delta": 1e-8, "k": 10}


@pytest.mark.parametrize(
    ("function", "kwargs", "message"),
    [
        (compose_basic, {**GOOD, "eps": -0.1}, r"^eps must be a finite number >= 0"),
        (compose_basic, {**GOOD, "eps": math.inf}, r"^eps must be a finite number >= 0"),
        (compose_basic, {**GOOD, "delta": 1.0}, r"^delta must be in \[0, 1\)"),
        (compose_basic, {**GOOD, "delta": -1e-9}, r"^delta must be in \[0, 1\)"),
        (compose_basic, {**GOOD, "k": 0}, r"^k must be an integer >= 1"),
        (compose_basic, {**GOOD, "k": 2.5}, r"^k must be an integer"),
        (compose_advanced, {**GOOD, "delta_slack": 0.0}, r"^delta_slack must be in \(0, 1\)"),
        (compose_advanced, {**GOOD, "delta_slack": 1.0}, r"^delta_slack must be in \(0, 1\)"),
        (compose_advanced, {**GOOD, "k": -3, "delta_slack": 1e-5}, r"^k must be"),
        (compose_optimal_delta, {**GOOD, "eps_total": -1.0}, r"^eps_total must be .* >= 0"),
        (compose_optimal_delta, {**GOOD, "eps": -1.0, "eps_total": 1.0}, r"^eps must be"),
        (compose_optimal_epsilon, {**GOOD, "delta_total": 1.0}, r"^delta_total must be in"),
        (
            compose_optimal_epsilon,
            {**GOOD, "delta_total": 1e-3, "tol": 0},
            r"^tol must be a finite",
        ),
        (compose_optimal_epsilon, {**GOOD, "delta": 2.0, "delta_total": 1e-3}, r"^delta must be"),
        (compose_best_epsilon, {**GOOD, "delta_total": -0.1}, r"^delta_total must be in"),
        (compose_best_epsilon, {**GOOD, "k": True, "delta_total": 0.1}, r"^k must be"),
        (subsample_dp, {"eps": 1.0, "delta": 0.0, "rate": 0.0}, r"^rate must be in \(0, 1\]"),
        (subsample_dp, {"eps": 1.0, "delta": 0.0, "rate": 1.5}, r"^rate must be in \(0, 1\]"),
        (subsample_dp, {"eps": -1.0, "delta": 0.0, "rate": 0.5}, r"^eps must be"),
        (subsample_dp, {"eps": 1.0, "delta": 1.0, "rate": 0.5}, r"^delta must be"),
    ],
)
def test_bad_arguments(function, kwargs, message):
    with pytest.raises(ValueError, match=message):
        function(**kwargs)
