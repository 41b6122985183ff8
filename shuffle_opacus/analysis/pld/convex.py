"""Lower bounds on a log-moment function at orders not computed, from the chords of those that are.

The log moment-generating function of a measure, ``K(t) = log sum_z mu(z) e^{t z}``, is convex in
the order ``t``. A Chernoff window minimises a bound built from ``K`` over a grid of orders; the
chords of the orders already computed bound ``K`` from below at every other order, so an order
whose bound cannot beat the best one found need not be computed. The lattice engine's windows
(:mod:`.shuffle_gaussian.chernoff`) and the compositions' windows (:mod:`.moments`) use these.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["chord_lower_bounds", "moment_error"]


def moment_error(log_mass_bound: float, span: float, size: int) -> float:
    """Return a generous bound on the rounding error of every computed ``K(t)`` of a measure.

    Each term ``e^{log m + t z - top}`` is computed with a relative error below about ``6 E
    2^-53`` (``E`` the largest ``|log m| + |t z|``), the pairwise sum adds at most a few dozen
    units in the last place, and the logarithm and the final addition of ``top`` (``|top|,
    |K| <= E + log(size)``) a few more: about ``1e-15 (E + 30)`` in all. The bound is a hundred
    times that.

    Args:
        log_mass_bound: The largest ``|log m|`` of a mass that enters the result.
        span: The largest ``|t z|`` over the orders and points.
        size: The number of points.

    Returns:
        The bound (absolute, on ``K``).
    """
    big = log_mass_bound + span + math.log(max(1, size))
    return 1e-13 * (2.0 * big + 64.0)


def chord_lower_bounds(
    abscissa: np.ndarray, done: np.ndarray, values: np.ndarray, error: float, unknown: np.ndarray
) -> np.ndarray:
    """Lower bounds on a convex ``K`` at the points ``unknown`` from the chords of computed ones.

    Outside the interval of two computed points ``K`` lies above their chord. Each unknown point
    takes the larger of the chords of its two nearest computed points on each side (``-inf``
    where a side has fewer than two), less the chord's share of the computed values' error and
    the unknown point's own.

    Args:
        abscissa: Every point's order, increasing.
        done: Which points are computed.
        values: ``K`` at the computed points (anything elsewhere).
        error: A bound on the rounding error of each computed value (:func:`moment_error`).
        unknown: Indices of points not computed.

    Returns:
        One lower bound per index of ``unknown`` (``-inf`` or ``nan`` where there is none).
    """
    known = np.flatnonzero(done)
    s_known, k_known = abscissa[known], values[known]
    x = abscissa[unknown]
    pos = np.searchsorted(known, unknown)
    best = np.full(unknown.size, -np.inf)
    with np.errstate(invalid="ignore", over="ignore"):
        for near, far, valid in (
            (pos - 1, pos - 2, pos >= 2),  # the two computed points below
            (pos, pos + 1, pos + 1 < known.size),  # the two above
        ):
            b = np.clip(near, 0, known.size - 1)
            a = np.clip(far, 0, known.size - 1)
            gap = s_known[b] - s_known[a]
            reach = np.abs(x - s_known[b]) / np.where(valid, np.abs(gap), 1.0)
            slope = (k_known[b] - k_known[a]) / np.where(valid, gap, 1.0)
            line = k_known[b] + slope * (x - s_known[b])
            # Rounding of the line itself: far below this relative slack.
            slack = 1e-12 * (np.abs(k_known[b]) + np.abs(slope * (x - s_known[b])) + 1.0)
            bound = line - error * (1.0 + 2.0 * reach) - slack
            best = np.where(valid, np.maximum(best, bound), best)
    return best - error
