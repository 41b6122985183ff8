"""One round's pair and its privacy loss distribution (pessimistic connect-the-dots).

See :mod:`shuffle_opacus.analysis.pld.shuffle_gaussian` and docs/maths.md.
"""

from __future__ import annotations

import functools
import math
from typing import TYPE_CHECKING

import numpy as np

from ....common.validation import (
    check_int,
    check_positive,
)
from ...memory import PldRangeError
from ..common import check_discretization, check_tail
from .lattice import _lattice_pair
from .pair import (
    COARSE_LATTICE_STEP,
    DEFAULT_SPREAD,
    GEOMETRIC_FALLBACK_TERMS,
    GEOMETRIC_MAX_TERMS,
    MAX_GRID_POINTS,
    ShuffleGaussianPair,
    _check_setting,
    _lattice_step,
    _report_cut,
    pld_discretization,
)

if TYPE_CHECKING:  # dp_accounting (and scipy.signal, which it imports) load only where used
    from dp_accounting.pld import pld_pmf
    from dp_accounting.pld.privacy_loss_distribution import PrivacyLossDistribution

#: dp_accounting's largest connect-the-dots slope rise it accepts as rounding (``deltas`` must
#: not increase by more between neighbours); its ``_DELTA_DIFF_TOLERANCE``.
_DELTA_RISE_TOLERANCE = 1e-12


@functools.lru_cache(maxsize=4)  # the PLDs built from a pair have their own cache
def _cached_pair(
    n: int, terms: int, gamma: float, sigma: float, tail: float, spread: float
) -> ShuffleGaussianPair:
    """Choose the engine: geometric for few reports, or when the lattice would be coarse."""
    # The geometric engine is imported where used: it needs scipy.stats, the lattice does not.
    if terms <= GEOMETRIC_MAX_TERMS:
        from .geometric import _geometric_pair

        return _geometric_pair(n, terms, gamma, sigma, tail, spread)
    if terms <= GEOMETRIC_FALLBACK_TERMS:
        x_max = _report_cut(1.0 / sigma, gamma, terms, n, tail)[0]
        step = _lattice_step(1.0 / sigma, gamma, terms, x_max, spread)[0]
        if step is None or step > COARSE_LATTICE_STEP:
            from .geometric import _geometric_pair

            return _geometric_pair(n, terms, gamma, sigma, tail, spread)
    return _lattice_pair(n, terms, gamma, sigma, tail, spread)


def shuffle_gaussian_pair(
    *,
    n: int,
    sigma: float,
    rate: float | None = None,
    m: int | None = None,
    tail: float = 1e-13,
    spread: float = DEFAULT_SPREAD,
) -> ShuffleGaussianPair:
    """Build the lattice pair that dominates one round of the shuffle Gaussian.

    Args:
        n: Number of users (integer >= 1).
        sigma: The paper's sigma (noise std over the distance of the differing user's inputs),
            at least 0.05.
        rate: Check-in rate ``gamma`` in ``(0, 1]`` (shuffled check-in), or ``None``.
        m: Users per round drawn without replacement (subsampled shuffle), or ``None``.
        tail: Mass left out (added to delta, split over the cut report coordinate, the cut
            lattice and the loss grid), in ``(0, 1)``.
        spread: Variance the lattice may add to ``S``, relative to ``Var(S)``, in ``(0, 1)``.

    Returns:
        A :class:`ShuffleGaussianPair` (cached: the same arguments return the same object).

    Raises:
        ValueError: on an out-of-range argument, or a setting whose lattice would not fit in
            :data:`MAX_LATTICE_POINTS`.
    """
    n, sigma, gamma, terms = _check_setting(n, sigma, rate, m)
    tail = check_tail(tail)
    spread = check_positive("spread", spread)
    if spread >= 1.0:
        raise ValueError(f"spread must be in (0, 1). Found {spread!r}.")
    return _cached_pair(n, terms, gamma, sigma, tail, spread)


def _connect_dots(
    curve: np.ndarray, lo: int, discretization: float, tail: float, infinity: float
) -> tuple[int, np.ndarray, float]:
    """Connect-the-dots masses of a hockey-stick curve given on the grid ``(lo + j) d``.

    ``dp_accounting``'s ``create_pmf_pessimistic_connect_dots_fixed_gap`` (version 0.6.0), the
    same operations on the same arrays, without importing ``dp_accounting`` (which imports
    ``scipy.signal`` and ``scipy.stats``, most of a cold query's imports).

    Returns:
        ``(lower, probs, infinity_mass)``: the first grid index, the masses from there on and
        the mass at infinity, bit for bit those of ``dp_accounting``'s PMF.

    Raises:
        ValueError: as ``dp_accounting`` does, on deltas outside ``[0, 1]`` or increasing.
    """
    # Stop the grid where the remaining finite part of delta is within the budget.
    keep = np.flatnonzero(curve - infinity > tail)
    end = int(keep[-1]) + 2 if keep.size else 1
    end = min(end, curve.size)
    deltas = np.minimum.accumulate(np.minimum(curve[:end], 1.0))
    if deltas.size == 1:
        return lo, np.array([1.0 - deltas[0]]), deltas[0]
    deltas = np.asarray(deltas, dtype=np.float64)
    if np.any(deltas < 0) or np.any(deltas > 1):
        raise ValueError(f"deltas are not between 0 and 1 : deltas={deltas}.")
    if np.any(np.diff(deltas) > _DELTA_RISE_TOLERANCE):
        raise ValueError(f"deltas are not in non-increasing order: deltas={deltas}.")
    deltas = np.minimum.accumulate(deltas)
    delta_diffs = np.diff(deltas)
    probs = np.zeros_like(deltas)
    # Algorithm 1 of Doroshenko et al. (arXiv:2207.04380) with d = discretization.
    expm1 = math.expm1(discretization)
    probs[0] = 1 - deltas[0] + delta_diffs[0] / expm1
    probs[1:-1] = (delta_diffs[1:] - delta_diffs[:-1] * math.exp(discretization)) / expm1
    probs[-1] = delta_diffs[-1] / math.expm1(-discretization)
    return lo, np.maximum(0.0, probs), deltas[-1]


def _relevant_span(pair: ShuffleGaussianPair, tail: float) -> float | None:
    """Return an ``L`` above which neither direction's finite delta exceeds ``tail``.

    Each direction's finite part decreases in eps and vanishes above the largest ``|log r|`` of
    the support. It is evaluated on 256 points up to there, then three times more on 256 points
    between the last point above ``tail`` and the next, and ``L`` is the first point within
    ``tail`` (at most 256^-4 of that largest ``|log r|`` above the exact point). ``None`` when
    the pair has no mass at a positive finite ratio.
    """
    r = pair.ratios[(pair.masses > 0) & (pair.ratios > 0)]
    if r.size == 0:
        return None
    low, high = 0.0, max(abs(float(np.log(r[0]))), abs(float(np.log(r[-1]))))
    for _ in range(4):
        grid = np.linspace(low, high, 257)
        above = (pair.delta_remove(grid) - pair.infinity_remove > tail) | (
            pair.delta_add(grid) - pair.infinity_add > tail
        )
        last = np.flatnonzero(above)
        if last.size == 0:  # within tail from ``low`` on
            return low
        if last[-1] == grid.size - 1:  # still above at the end of the support: keep it
            return high
        low, high = float(grid[last[-1]]), float(grid[last[-1] + 1])
    return high


def _grid(low: float, high: float, discretization: float) -> tuple[int, np.ndarray]:
    lo = math.floor(low / discretization) - 1
    hi = math.ceil(high / discretization) + 1
    if hi - lo + 1 > MAX_GRID_POINTS:
        raise PldRangeError(
            f"discretization={discretization!r} is too fine for this setting: the loss grid "
            f"would have {hi - lo + 1} points (at most {MAX_GRID_POINTS}); raise discretization."
        )
    return lo, np.arange(lo, hi + 1) * discretization


def symmetric_masses(
    pair: ShuffleGaussianPair, discretization: float, tail: float
) -> tuple[int, np.ndarray, float]:
    """Return the masses of :func:`symmetric_pmf`'s PMF, without ``dp_accounting``.

    Args:
        pair: The dominating pair of one round.
        discretization: Loss grid step ``d``.
        tail: Budget of finite delta moved to infinity at the top of the grid.

    Returns:
        ``(lower, probs, infinity_mass)``: the index of the first grid point, the masses on the
        grid from there and the mass at infinite loss.

    Raises:
        ValueError: if the grid would exceed :data:`MAX_GRID_POINTS`.
    """
    span = _relevant_span(pair, tail)
    if span is None:  # everything at infinity
        return 0, np.zeros(1), 1.0
    lo, grid = _grid(-span, span, discretization)
    curve = pair.delta_symmetric(grid)
    infinity = max(pair.infinity_remove, pair.infinity_add)
    keep = np.flatnonzero(curve - infinity > tail)
    top = int(keep[-1]) + 1 if keep.size else -lo
    bottom = max(0, -2 * lo - top)  # index of -(lo + top) d, the mirror of the top point
    bottom = min(bottom, max(0, top - 1))
    return _connect_dots(curve[bottom:], lo + bottom, discretization, tail, infinity)


def symmetric_pmf(pair: ShuffleGaussianPair, discretization: float, tail: float) -> pld_pmf.PLDPmf:
    """One PMF whose profile is at least ``max(H(P~ || Q~), H(Q~ || P~))`` at every eps.

    The symmetrised profile (:meth:`ShuffleGaussianPair.delta_symmetric`) is evaluated on the
    grid ``j d`` of ``[-L, L]``, ``L`` the largest ``|log ratio|`` of the pair, and turned into a
    PMF by pessimistic connect-the-dots. The grid stops above where the finite part of delta is
    below ``tail`` (the rest goes to infinity) and starts at the mirror of that point: below its
    first point a connect-the-dots PMF follows the chord from ``(alpha, delta) = (0, 1)``, which
    lies above the convex profile, so starting late is pessimistic too. The masses are those of
    :func:`symmetric_masses`.

    Args:
        pair: The dominating pair of one round.
        discretization: Loss grid step ``d``.
        tail: Budget of finite delta moved to infinity at the top of the grid.

    Returns:
        A ``dp_accounting`` PMF to be used for both adjacency directions (dense for a single
        grid point, else as ``dp_accounting``'s ``create_pmf`` chooses).

    Raises:
        ValueError: if the grid would exceed :data:`MAX_GRID_POINTS`.
    """
    from dp_accounting.pld import pld_pmf

    lower, probs, infinity = symmetric_masses(pair, discretization, tail)
    if probs.size == 1:
        return pld_pmf.DensePLDPmf(discretization, lower, probs, infinity, True)
    return pld_pmf.create_pmf(
        loss_probs=dict(zip(range(lower, lower + probs.size), probs, strict=True)),
        discretization=discretization,
        infinity_mass=infinity,
        pessimistic_estimate=True,
    )


@functools.lru_cache(maxsize=32)
def _cached_pld(
    n: int, sigma: float, rate: float | None, m: int | None, discretization: float, tail: float
) -> PrivacyLossDistribution:
    from dp_accounting.pld.privacy_loss_distribution import PrivacyLossDistribution

    pair = shuffle_gaussian_pair(n=n, sigma=sigma, rate=rate, m=m, tail=tail)
    return PrivacyLossDistribution(symmetric_pmf(pair, discretization, tail / 4.0))


def shuffle_gaussian_pld(
    *,
    n: int,
    sigma: float,
    rate: float | None = None,
    m: int | None = None,
    steps: int = 1,
    discretization: float | None = None,
    tail: float = 1e-13,
) -> PrivacyLossDistribution:
    """PLD of ``steps`` adaptive rounds of the shuffle Gaussian (plain, subsampled or check-in).

    Neighbouring relation: replace one user (the unit of privacy), the other users at a common
    value, either of the differing user's two values in each round (chosen adaptively). One
    symmetric PMF per round (:func:`symmetric_pmf`: ``max(H(P || Q), H(Q || P))`` of the
    dominating pair by pessimistic connect-the-dots) serves both adjacency directions; see the
    module docstring for every approximation and its bound.

    Args:
        n: Number of users (integer >= 1).
        sigma: The paper's sigma, at least 0.05.
        rate: Check-in rate ``gamma`` (shuffled check-in), or ``None``.
        m: Users per round (subsampled shuffle), or ``None``.
        steps: Number of identical rounds (integer >= 1).
        discretization: Loss grid step; :func:`pld_discretization` by default. Rounds to be
            composed with :func:`~.common.compose_plds` must share it.
        tail: Mass per round left out and added to delta, in ``(0, 1)``.

    Returns:
        A ``dp_accounting`` ``PrivacyLossDistribution``.

    Raises:
        ValueError: on an out-of-range argument or a setting too large to evaluate.
    """
    steps = check_int("steps", steps, minimum=1)
    if discretization is None:
        discretization = pld_discretization(n=n, sigma=sigma, rate=rate, m=m)
    discretization = check_discretization(discretization)
    pld = _cached_pld(n, sigma, rate, m, discretization, check_tail(tail))
    return pld if steps == 1 else pld.self_compose(steps)
