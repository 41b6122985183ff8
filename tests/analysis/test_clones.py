"""The clones method (Feldman, McMillan & Talwar 2021): Theorems 3.1, 3.2 and 3.8."""

from __future__ import annotations

import functools
import itertools
import math
import warnings
from collections import defaultdict

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shuffle_opacus.analysis.approximate.analytic_gaussian import gaussian_dp_epsilon
from shuffle_opacus.analysis.approximate.clones import (
    ClonesValidityWarning,
    clones_closed_form,
    clones_delta,
    clones_epsilon,
    clones_gaussian,
    closed_form_limit,
)


def brute_force_delta(eps: float, n: int, eps0: float) -> float:
    """Enumerate C, A and D one by one and build P and Q as dictionaries."""
    p, q = math.exp(-eps0), math.exp(eps0) / (math.exp(eps0) + 1)
    dist_p: dict[tuple[int, int], float] = defaultdict(float)
    dist_q: dict[tuple[int, int], float] = defaultdict(float)
    for c in range(n):
        pc = math.comb(n - 1, c) * p**c * (1 - p) ** (n - 1 - c)
        for a, d in itertools.product(range(c + 1), (0, 1)):
            w = pc * math.comb(c, a) / 2**c * (q if d else 1 - q)
            dist_p[(a + d, c - a + 1 - d)] += w
            dist_q[(a + 1 - d, c - a + d)] += w
    keys = set(dist_p) | set(dist_q)
    return sum(max(0.0, dist_p[k] - math.exp(eps) * dist_q[k]) for k in keys)


@pytest.mark.parametrize(("n", "eps0"), [(1, 1.0), (2, 0.5), (5, 1.0), (8, 2.0), (12, 3.0)])
@pytest.mark.parametrize("eps", [0.0, 0.1, 0.4, 1.0])
def test_small_n_against_enumeration(n, eps0, eps):
    got = clones_delta(eps, n=n, eps0=eps0)
    expected = brute_force_delta(eps, n, eps0)
    assert got.lower == pytest.approx(expected, rel=1e-10, abs=1e-15)
    assert got.lower <= got.upper <= got.lower + 2e-16 + 1e-12


def test_reference_values_of_the_authors():
    # Feldman, McMillan & Talwar's published numerical bounds for n = 100,000, eps0 = 4,
    # delta = 1e-6: upper 0.1728, lower 0.1675. The exact value must lie between them.
    res = clones_epsilon(n=100_000, eps0=4.0, delta=1e-6)
    assert 0.1675 <= res.lower <= res.upper <= 0.1728
    assert res.upper - res.lower < 1e-5


def test_no_loss_beyond_eps0():
    # P / Q is at most e^{eps0} pointwise, so delta(eps0) = 0 (shuffling is post-processing).
    assert clones_delta(2.0, n=50, eps0=2.0).lower == 0.0


@settings(max_examples=25, deadline=None)
@given(
    n=st.integers(min_value=2, max_value=400),
    eps0=st.floats(min_value=0.2, max_value=4.0),
    eps=st.floats(min_value=0.0, max_value=1.0),
)
def test_delta_is_monotone(n, eps0, eps):
    base = clones_delta(eps, n=n, eps0=eps0).lower
    assert clones_delta(eps + 0.05, n=n, eps0=eps0).lower <= base + 1e-15  # falls with eps
    assert clones_delta(eps, n=n + 50, eps0=eps0).lower <= base + 1e-12  # falls with n
    assert clones_delta(eps, n=n, eps0=eps0 + 0.3).lower >= base - 1e-12  # grows with eps0


def test_epsilon_falls_with_n_and_stays_below_eps0():
    values = [clones_epsilon(n=n, eps0=2.0, delta=1e-6).upper for n in (100, 1000, 10_000)]
    assert values[0] > values[1] > values[2] > 0
    assert values[0] <= 2.0


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"n": 0, "eps0": 1.0, "delta": 1e-6}, "n must be"),
        ({"n": 10, "eps0": -1.0, "delta": 1e-6}, "eps0 must be"),
        ({"n": 10, "eps0": 1.0, "delta": 1.5}, "delta must be"),
    ],
)
def test_bad_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        clones_epsilon(**kwargs)


# ---- closed form (Theorem 3.1) ---------------------------------------------------------------


def test_closed_form_reference_value_of_the_authors():
    # Published with the authors' code for n = 100,000, eps0 = 4, delta = 1e-6: 0.5378.
    assert clones_closed_form(n=100_000, eps0=4.0, delta=1e-6) == pytest.approx(0.5378, abs=5e-5)


def test_closed_form_is_at_least_eq1_as_printed():
    # Eq. (1) as printed, written out by hand: log(1 + tanh(eps0/2) * a).
    for n, eps0, delta in [(100_000, 4.0, 1e-6), (10_000, 1.0, 1e-5), (10**6, 2.0, 1e-8)]:
        a = 8 * math.sqrt(math.exp(eps0) * math.log(4 / delta) / n) + 8 * math.exp(eps0) / n
        printed = math.log1p((math.exp(eps0) - 1) / (math.exp(eps0) + 1) * a)
        e_prime = math.log(1 + a)
        code = math.log(1 + (1 - math.exp(-eps0)) / (1 + math.exp(-eps0 - e_prime)) * a)
        got = clones_closed_form(n=n, eps0=eps0, delta=delta)
        assert got == pytest.approx(code, rel=1e-12)
        assert printed < got


def test_closed_form_is_above_the_numerical_bound():
    for n, eps0 in [(100_000, 4.0), (10_000, 1.0), (50_000, 2.5)]:
        closed = clones_closed_form(n=n, eps0=eps0, delta=1e-6)
        assert closed is not None
        assert clones_epsilon(n=n, eps0=eps0, delta=1e-6).upper < closed


def test_closed_form_outside_its_condition_warns_and_gives_no_number():
    limit = closed_form_limit(n=1000, delta=1e-6)
    assert limit == pytest.approx(math.log(1000 / (16 * math.log(4e6))))
    with pytest.warns(ClonesValidityWarning, match="eps0 <= log"):
        assert clones_closed_form(n=1000, eps0=limit + 1e-9, delta=1e-6) is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert clones_closed_form(n=1000, eps0=limit, delta=1e-6) is not None


# ---- Gaussian reports (Theorem 3.8) ----------------------------------------------------------


# Gaussian-report results are frozen records; the numerical one at n = 20,000 (0.8 s) serves
# two tests below.
_clones_gaussian = functools.cache(clones_gaussian)


def _theorem38_total(res, n):
    return res.delta_shuffle + (math.exp(res.epsilon) + 1) * (1 + math.exp(-res.eps0) / 2) * n * (
        res.delta0
    )


@pytest.mark.parametrize("method", ["numerical", "closed-form"])
def test_gaussian_result_spends_exactly_the_budget_it_claims(method):
    n, sigma, delta = 20_000, 3.0, 1e-6
    res = _clones_gaussian(n=n, sigma=sigma, delta=delta, method=method)
    assert res.amplified
    # The reported pieces are consistent with Theorem 3.8 and with each other.
    assert _theorem38_total(res, n) <= delta * (1 + 1e-9)
    assert res.eps0 == pytest.approx(gaussian_dp_epsilon(res.delta0, sigma=sigma), rel=1e-9)
    if method == "numerical":
        assert clones_delta(res.epsilon, n=n, eps0=res.eps0).upper <= res.delta_shuffle * (1 + 1e-9)
    else:
        assert res.epsilon == pytest.approx(
            clones_closed_form(n=n, eps0=res.eps0, delta=res.delta_shuffle), rel=1e-12
        )


def test_gaussian_numerical_beats_closed_form_and_falls_with_n():
    # n = 20,000 is the setting of the test above, whose numerical result is reused (cached); the
    # bound's cost grows with n (0.6 s at 2,000 and 5,000, 2 s at 200,000).
    values = [_clones_gaussian(n=n, sigma=3.0, delta=1e-6).epsilon for n in (2000, 5000, 20_000)]
    assert values[0] > values[1] > values[2] > 0
    closed = clones_gaussian(n=20_000, sigma=3.0, delta=1e-6, method="closed-form").epsilon
    assert values[2] < closed


def test_gaussian_never_worse_than_one_report():
    # Little noise and few users: no amplification is provable; the answer is the local one.
    res = clones_gaussian(n=50, sigma=0.3, delta=1e-6)
    assert not res.amplified
    assert res.epsilon == pytest.approx(gaussian_dp_epsilon(1e-6, sigma=0.3))


def test_gaussian_closed_form_with_no_valid_delta0_warns():
    with pytest.warns(ClonesValidityWarning, match="fails for every delta0"):
        res = clones_gaussian(n=50, sigma=0.3, delta=1e-6, method="closed-form")
    assert res.epsilon is None


def test_gaussian_bad_method():
    with pytest.raises(ValueError, match="method must be one of numerical, closed-form"):
        clones_gaussian(n=50, sigma=1.0, delta=1e-6, method="exact")
