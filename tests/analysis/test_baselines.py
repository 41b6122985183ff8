"""Approximate-DP baselines: clones per round, check-in subsampling, optimal composition."""

from __future__ import annotations

import functools
import math

import pytest

from shuffle_opacus.analysis.approximate.baselines import (
    RoundProfile,
    composed_epsilon,
    composed_epsilons,
    round_profile,
)
from shuffle_opacus.analysis.approximate.clones import clones_epsilon, clones_gaussian
from shuffle_opacus.analysis.approximate.composition import compose_optimal_epsilon


def test_one_round_is_the_one_round_bound():
    eps = composed_epsilons(n=2000, sigma=2.0, steps=[1], delta=1e-6)[0]
    assert eps == pytest.approx(clones_gaussian(n=2000, sigma=2.0, delta=1e-6).epsilon, rel=1e-9)
    eps0 = composed_epsilons(n=5000, eps0=2.0, steps=[1], delta=1e-6)[0]
    assert eps0 == clones_epsilon(n=5000, eps0=2.0, delta=1e-6).upper


def test_composition_picks_the_best_grid_point():
    import numpy as np

    profile = RoundProfile(np.array([1e-9, 1e-8]), np.array([0.30, 0.25]), users=10)
    expected = min(
        compose_optimal_epsilon(eps=0.30, delta=1e-9, k=10, delta_total=1e-6),
        compose_optimal_epsilon(eps=0.25, delta=1e-8, k=10, delta_total=1e-6),
    )
    assert composed_epsilon(profile, steps=10, delta=1e-6) == expected
    # A per-round delta that leaves no room for ten rounds is skipped, not used.
    tight = RoundProfile(np.array([2e-7]), np.array([0.1]), users=10)
    assert composed_epsilon(tight, steps=10, delta=1e-6) == math.inf


# The eps0 = 2 curves below, each computed once for the three tests that read them (a numerical
# curve costs 24 clones bounds, 1.5-2 s at these n, and each round count an optimal composition
# per grid point, 0.2 s): n = 5,000 and 20,000 users, 1 to 10 rounds.
CURVE_STEPS = (1, 3, 10)
CURVE_USERS = (5_000, 20_000)


@functools.cache
def _eps0_curve(n: int, method: str) -> tuple[float, ...]:
    """Composed epsilons of eps0 = 2 reports at delta = 1e-6 for each of CURVE_STEPS."""
    return tuple(
        composed_epsilons(n=n, eps0=2.0, steps=list(CURVE_STEPS), delta=1e-6, method=method)
    )


@pytest.mark.parametrize("method", ["numerical", "closed-form"])
def test_grows_with_rounds_and_falls_with_n(method):
    small, large = (_eps0_curve(n, method) for n in CURVE_USERS)
    assert all(a < b for a, b in zip(small, small[1:], strict=False))
    assert all(big < sm for big, sm in zip(large, small, strict=True))


def test_numerical_is_tighter_than_closed_form():
    for n in CURVE_USERS:
        numerical = _eps0_curve(n, "numerical")
        closed = _eps0_curve(n, "closed-form")
        assert all(a < b for a, b in zip(numerical, closed, strict=True))


def test_checkin_rate_one_is_plain_shuffling_and_small_rates_amplify():
    kw = {"n": 2000, "eps0": 2.0, "steps": [1, 10], "delta": 1e-6}
    assert composed_epsilons(**kw, rate=1.0) == composed_epsilons(**kw)
    # Per round: log(1 + rate (e^eps - 1)) of the bound for the m_low + 1 users that check in
    # except with probability tau = 1e-3 delta, at delta_shuffle = (delta - tau) / rate.
    profile = round_profile(n=2000, eps0=2.0, delta_max=1e-6, rate=0.5, points=2, decades=1)
    assert 800 < profile.users < 1000  # 1000 - about 6 standard deviations
    shuffle = clones_epsilon(n=profile.users, eps0=2.0, delta=(1e-6 - 1e-9) / 0.5).upper
    assert profile.epsilons[-1] == pytest.approx(math.log1p(0.5 * math.expm1(shuffle)))
    assert profile.epsilons[-1] < clones_epsilon(n=2000, eps0=2.0, delta=1e-6).upper


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"n": 10, "steps": [1], "delta": 1e-6}, "exactly one of sigma"),
        ({"n": 10, "sigma": 1.0, "eps0": 1.0, "steps": [1], "delta": 1e-6}, "exactly one of"),
        ({"n": 10, "eps0": 1.0, "steps": [], "delta": 1e-6}, "steps must list"),
        ({"n": 10, "eps0": 1.0, "steps": [0], "delta": 1e-6}, "steps must be"),
        ({"n": 10, "eps0": 1.0, "steps": [1], "delta": 2.0}, "delta must be"),
        ({"n": 10, "eps0": 1.0, "steps": [1], "delta": 1e-6, "rate": 0.0}, "rate must be"),
        ({"n": 10, "eps0": 1.0, "steps": [1], "delta": 1e-6, "method": "x"}, "method must be"),
    ],
)
def test_bad_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        composed_epsilons(**kwargs)
