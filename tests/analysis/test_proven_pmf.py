"""The proven method's per-round PMFs: connect-the-dots of each pair's privacy profile.

Oracles: the pair's exact profile, summed directly over its enumerated outcomes (no grid); the
PMF's profile, summed over its grid points. The PMF must lie above the pair at every eps (on and
between grid points, negative ones included: composition uses the whole curve).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from shuffle_opacus.analysis.limits import PldRangeError, memory_limit
from shuffle_opacus.analysis.pld import proven, proven_pmf
from shuffle_opacus.analysis.pld.proven_pairs import PairTooLargeError
from shuffle_opacus.analysis.pld.rounds import ShuffleRound

TAIL = 1e-12


def _profile(loss: np.ndarray, mass: np.ndarray, infinity: float, eps: float) -> float:
    """``infinity + sum mass (1 - e^{eps - loss})_+``, term by term (the oracle)."""
    finite = np.isfinite(loss)
    above = finite & (loss > eps)
    terms = mass[above] * -np.expm1(eps - loss[above])
    return infinity + float(mass[~finite].sum()) + math.fsum(terms)


CASES = [
    # (setting, route, level index k): small populations and the README Opacus loop's setting
    (ShuffleRound(n=3, sigma=1.0, rate=0.5), "blanket", 10),
    (ShuffleRound(n=5, sigma=0.5, rate=1.0), "clones", 40),
    (ShuffleRound(n=20, sigma=1.0, m=8), "clones", 60),
    (ShuffleRound(n=1000, sigma=2.0, rate=0.05), "clones", 98),
    (ShuffleRound(n=1000, sigma=2.0, rate=0.05), "blanket", 90),
]


@pytest.mark.parametrize(("setting", "route", "k"), CASES)
def test_pmf_profile_lies_above_the_pairs_everywhere(setting, route, k):
    pair = proven._route_pair(route, setting, k, TAIL)
    step = proven._pair_grid(route, setting, k, TAIL)
    pmf = proven._pair_pmf(pair, step, TAIL / 4.0)
    probs = np.asarray(pmf._probs, dtype=float)
    grid = (int(pmf._lower_loss) + np.arange(probs.size)) * step
    assert np.all(probs >= 0.0)
    assert math.isclose(probs.sum() + pmf._infinity_mass, 1.0, abs_tol=1e-12)
    finite = pair.loss[np.isfinite(pair.loss) & (pair.mass > 0)]
    top = float(finite.max())
    # On the grid, half-way between grid points, below the grid and past its top.
    points = np.concatenate(
        (grid[:: max(1, grid.size // 200)], grid[:-1:37] + step / 2, [grid[0] - 0.3, top + 0.1])
    )
    for eps in points:
        exact = _profile(pair.loss, pair.mass, pair.left, float(eps))
        own = _profile(grid, probs, float(pmf._infinity_mass), float(eps))
        assert own >= exact - 1e-15, (float(eps), own, exact)


def test_grid_does_not_depend_on_the_round_count():
    """One grid at every count (it was about sd / (2 sqrt(R)): a new one each doubling)."""
    s = ShuffleRound(n=1000, sigma=2.0, rate=0.05)
    steps = {proven._evaluate("clones", [(s, r)], 98, 1e-5, TAIL)[3] for r in (20, 50, 200)}
    assert 0.0 not in steps  # every count is feasible at this level
    assert len(steps) == 1


def test_readme_opacus_setting_reference_and_tighter_than_rounding_up():
    """The README Opacus loop (n = 1,000, rate 0.05, noise multiplier 4, 50 rounds).

    1.6634454705806552 is this code's value (route clones, eps0 = 3.0625); with every loss
    rounded up to a grid of step about sd / (2 sqrt(R)) it was 1.6872413727907216.
    """
    s = ShuffleRound(n=1000, sigma=2.0, rate=0.05)
    result = proven.proven_rounds_epsilon([(s, 50)], delta=1e-5)
    assert result.route == "clones" and result.level == 3.0625
    assert result.epsilon == pytest.approx(1.6634454705806552, rel=1e-9)
    assert result.epsilon < 1.6872413727907216


@pytest.mark.parametrize("tail", [1e-12, 1.25e-14, 3e-9, 0.3])
def test_half_windows_are_the_windows_one_by_one(tail):
    """The vectorised lower ends give the integers of ``window`` called per count."""
    from shuffle_opacus.analysis.pld.proven_pairs import half_windows, window

    trials = np.arange(0, 1500)
    expected = [window(int(t), 0.5, tail)[0] for t in trials]
    assert half_windows(trials, tail).tolist() == expected


@pytest.mark.parametrize("trials", [60_000, 10**8, 10**9])
def test_binomial_log_masses_sum_to_one_at_any_population(trials):
    """The pairs' binomial log-masses stay accurate where scipy's logpmf does not.

    Oracle: the masses of a window holding all but about 1e-30 of the law sum to 1. scipy's
    ``binom.logpmf`` misses by about 2e-7 at 10^9 trials (it left that much of every round's
    pair out, and the proven route at n = 10^9 fell back to the local Gaussian).
    """
    from shuffle_opacus.analysis.pld.proven_pairs import binom_logpmf

    k = np.arange(18_000, 22_001) if trials > 60_000 else np.arange(0, 2_000)
    prob = 2e4 / trials if trials > 60_000 else 0.01
    total = math.fsum(np.exp(binom_logpmf(k, trials, prob)))
    assert total == pytest.approx(1.0, abs=1e-11)


@pytest.mark.parametrize(("setting", "route", "k"), CASES[3:])
def test_a_grid_over_the_memory_limit_is_bisected_to_the_same_pmf(setting, route, k):
    # Where the whole grid from the lowest to the highest loss would not fit, its end is found
    # by bisection and only [bottom, top] is evaluated: the same PMF, bit for bit.
    pair = proven._route_pair(route, setting, k, TAIL)
    step = proven._pair_grid(route, setting, k, TAIL)
    whole = proven._pair_pmf(pair, step, TAIL / 4.0)
    finite = pair.loss[np.isfinite(pair.loss) & (pair.mass > 0)]
    points = math.ceil(finite.max() / step) - math.floor(finite.min() / step) + 1
    kept = np.asarray(whole._probs).size
    assert kept < points  # the grid is cut, so the bisection has an end to find
    with memory_limit((points - 1) * proven_pmf.PROFILE_BYTES_PER_POINT):
        bisected = proven._pair_pmf(pair, step, TAIL / 4.0)
    assert int(bisected._lower_loss) == int(whole._lower_loss)
    assert np.asarray(bisected._probs).tobytes() == np.asarray(whole._probs).tobytes()
    assert bisected._infinity_mass == whole._infinity_mass
    # Even [bottom, top] over the limit: refused before allocating, and the route skipped.
    with memory_limit(kept * proven_pmf.PROFILE_BYTES_PER_POINT // 4):
        with pytest.raises(PairTooLargeError, match="loss grid would have"):
            proven._pair_pmf(pair, step, TAIL / 4.0)


def test_a_tiny_rate_is_refused_at_once_or_bounded_not_an_allocation_error():
    # At check-in rate 1e-9 the grids follow a tiny loss scale against losses of order one: the
    # pair's profile grid wanted 11 TiB (numpy's allocation error) and the local Gaussian's
    # 4.6e7 points (minutes in dp_accounting, then a composition over the memory limit).
    s = ShuffleRound(n=100, sigma=0.5, rate=1e-9)
    with pytest.raises(PldRangeError, match="local Gaussian would need about .* raise rate"):
        proven._gaussian_epsilon([(s, 10)], 1e-5)
    found = proven.proven_rounds_epsilon([(s, 10)], delta=1e-5)
    # The user reports in one of the 10 rounds with probability 1e-8, far below delta.
    assert found.epsilon == 0.0 and found.route == "blanket"
