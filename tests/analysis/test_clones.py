"""The clones reduction (Feldman, McMillan & Talwar 2021, Theorem 3.2), computed exactly."""

from __future__ import annotations

import itertools
import math
from collections import defaultdict

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shuffle_opacus.analysis.clones import clones_delta, clones_epsilon


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
