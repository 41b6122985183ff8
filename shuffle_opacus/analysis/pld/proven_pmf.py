"""One round's proven pair as a PMF, and epsilon with the stand-ins' cost (method ``proven``).

:func:`_pair_pmf` turns a pair's privacy profile into a pessimistic connect-the-dots PMF whose
profile lies above the pair's everywhere; :func:`epsilon_with_coupling` finds the smallest
epsilon of a composition once the stand-ins' total variation is added to delta. Derivation:
docs/maths.md, "Composition, stand-ins and delta".
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from ..memory import memory_budget
from .common import exact_sum
from .powers import ComposedPmf
from .proven_pairs import PairTooLargeError, ProvenPair

if TYPE_CHECKING:  # imported where used: an answer from the disk cache needs no dp_accounting
    from dp_accounting.pld import pld_pmf

__all__ = ["epsilon_with_coupling"]

#: Peak bytes per grid point of evaluating a profile on a grid (the indices, the losses, the
#: search's positions and the profile's temporaries), rounded up.
PROFILE_BYTES_PER_POINT = 80


def _pair_pmf(pair: ProvenPair, discretization: float, budget: float) -> pld_pmf.DensePLDPmf:
    """Pessimistic connect-the-dots PMF of the pair's privacy profile.

    The profile ``delta(eps) = left + sum_{loss > eps} mass (1 - e^{eps - loss})`` bounds the
    pair's hockey-stick divergence from above (the losses are upper bounds). It is evaluated on
    the grid and turned into a PMF by ``dp_accounting``'s pessimistic connect-the-dots
    (Doroshenko, Ghazi, Kamath, Kumar & Manurangsi, arXiv:2207.04380, Algorithm 1), whose
    profile lies above the evaluated one at every eps (it interpolates a profile that is convex
    in ``e^eps``). The grid stops where the profile's finite part is at most ``budget`` (the rest
    goes to infinity) and starts at the mirror of that point or at the lowest loss, whichever is
    higher. Rounding is then settled by :func:`_settled`.

    Where the grid from the lowest to the highest loss would not fit in the memory limit (a
    very fine grid against the pair's losses, as at a tiny check-in rate), the end is found by
    bisection on the profile, which does not increase, and only ``[bottom, top]`` is evaluated;
    if even that would not fit, :class:`~.proven_pairs.PairTooLargeError` says so before
    anything is allocated (the route then gives no bound at this level).
    """
    from dp_accounting.pld import pld_pmf

    keep = pair.mass > 0
    loss, mass = pair.loss[keep], pair.mass[keep]
    finite = np.isfinite(loss)
    infinity = pair.left + float(mass[~finite].sum())
    loss, mass = loss[finite], mass[finite]
    if loss.size == 0:
        return pld_pmf.DensePLDPmf(discretization, 0, np.zeros(1), min(infinity, 1.0), True)
    if not np.all(loss[1:] >= loss[:-1]):  # the route's pairs come sorted (:func:`_route_pair`)
        order = np.argsort(loss, kind="stable")
        loss, mass = loss[order], mass[order]
    lo = math.floor(float(loss[0]) / discretization)
    hi = math.ceil(float(loss[-1]) / discretization)
    limit = memory_budget() // PROFILE_BYTES_PER_POINT
    if hi - lo + 1 <= limit:
        index = np.arange(lo, hi + 1)
        finite_part = _profile(loss, mass, index * discretization)
        above = np.flatnonzero(finite_part > budget)
        top = min(max(int(index[above[-1]]) + 1 if above.size else lo, lo), hi)
        bottom = min(max(lo, -top), top)
        curve = finite_part[bottom - lo : top - lo + 1] + infinity
    else:
        top = _top(loss, mass, lo, hi, discretization, budget)
        bottom = min(max(lo, -top), top)
        if top - bottom + 1 > limit:
            raise PairTooLargeError(
                f"the proven pair's loss grid would have {top - bottom + 1} points (at most "
                f"{limit} in the memory limit)"
            )
        curve = _profile(loss, mass, np.arange(bottom, top + 1) * discretization) + infinity
    deltas = np.minimum.accumulate(np.minimum(curve, 1.0))
    if deltas.size == 1:
        probs = np.array([1.0 - deltas[0]])
        return pld_pmf.DensePLDPmf(discretization, bottom, probs, float(deltas[0]), True)
    dense = pld_pmf.create_pmf_pessimistic_connect_dots_fixed_gap(
        discretization, bottom, top, deltas
    ).to_dense_pmf()
    probs = np.array(dense._probs, dtype=float)
    low = int(dense._lower_loss)
    if low != bottom or probs.size != deltas.size:  # pragma: no cover - dp_accounting contract
        raise ArithmeticError("connect-the-dots returned a PMF off the profile's grid")
    return _settled(probs, float(dense._infinity_mass), low, discretization, deltas)


def _top(
    loss: np.ndarray, mass: np.ndarray, lo: int, hi: int, discretization: float, budget: float
) -> int:
    """Return the grid index after the last one in ``[lo, hi]`` whose profile exceeds ``budget``.

    A bisection (the profile does not increase with epsilon), clipped to ``[lo, hi]``, with
    ``lo`` where no index exceeds it: the end :func:`_pair_pmf`'s scan of the whole grid finds.
    """

    def over(i: int) -> bool:
        return bool(_profile(loss, mass, np.array([i * discretization]))[0] > budget)

    if not over(lo):
        return lo
    a, b = lo, hi + 1  # over(a); b is past the end or not over
    while b - a > 1:
        mid = (a + b) // 2
        a, b = (mid, b) if over(mid) else (a, mid)
    return min(a + 1, hi)


def _settled(
    probs: np.ndarray, infinity: float, low: int, discretization: float, deltas: np.ndarray
) -> pld_pmf.DensePLDPmf:
    """Make a connect-the-dots PMF a distribution whose profile is at least ``deltas``.

    Connect-the-dots sets negative masses (from rounding in a profile that is convex in exact
    arithmetic) to zero, which can leave the total a little above 1: the excess is taken off the
    lowest grid points. Then, while the PMF's profile at a grid point lies below ``deltas``
    (rounding again), the largest shortfall moves from the lowest points to infinity, which never
    lowers the profile and raises it by the full amount at every point above those touched.
    """
    from dp_accounting.pld import pld_pmf

    excess = exact_sum(probs) + infinity - 1.0
    if excess > 0.0:
        probs = probs - np.minimum(probs, np.maximum(excess - (np.cumsum(probs) - probs), 0.0))
    grid = np.arange(low, low + probs.size) * discretization
    for _ in range(16):
        own = infinity + _profile(grid, probs, grid)
        shortfall = float(np.max(deltas[: probs.size] - own[: deltas.size], initial=0.0))
        if shortfall <= 0.0:
            break
        taken = np.minimum(probs, np.maximum(shortfall - (np.cumsum(probs) - probs), 0.0))
        probs = probs - taken
        infinity += float(taken.sum())
    else:  # pragma: no cover - rounding larger than every mass the lowest points hold
        raise ArithmeticError("the proven PMF's profile stays below its pair's after rounding")
    return pld_pmf.DensePLDPmf(discretization, low, probs, min(infinity, 1.0), True)


def _profile(loss: np.ndarray, mass: np.ndarray, eps: np.ndarray) -> np.ndarray:
    """``sum_{loss > eps} mass (1 - e^{eps - loss})`` at each ``eps`` (both sorted ascending)."""
    j = np.searchsorted(loss, eps, side="right")  # the losses above eps are j..
    first = int(j[0]) if j.size else loss.size
    suffix_mass = np.concatenate((np.cumsum(mass[::-1])[::-1], [0.0]))
    suffix = np.zeros(loss.size + 1)
    with np.errstate(over="ignore", under="ignore"):
        suffix[first:-1] = np.cumsum((mass[first:] * np.exp(-loss[first:]))[::-1])[::-1]
        value = suffix_mass[j] - np.exp(eps) * suffix[j]
    return np.clip(np.nan_to_num(value, nan=0.0, posinf=0.0, neginf=0.0), 0.0, None)


def epsilon_with_coupling(
    pmf: pld_pmf.DensePLDPmf | ComposedPmf, delta: float, eta0: float, eta1: float
) -> tuple[float, float]:
    """Smallest epsilon with ``delta_pld(eps) + eta0 + e^eps eta1 <= delta``.

    ``delta_pld`` is the hockey-stick divergence of the composed PMF (with its mass at
    infinity). Between grid points the total is ``U + eta0 + e^eps (eta1 - W)``, solved there
    in closed form.

    Args:
        pmf: The composed PMF (``dp_accounting``'s dense PMF or a :class:`~.powers.ComposedPmf`).
        delta: Target delta.
        eta0: The stand-ins' total variation paid once.
        eta1: The stand-ins' total variation paid with the factor ``e^eps``.

    Returns:
        ``(epsilon, delta_pld(epsilon))``; ``(inf, 1.0)`` when no epsilon qualifies.
    """
    if isinstance(pmf, ComposedPmf):
        probs, disc, lowest = np.asarray(pmf.probs, dtype=float), pmf.discretization, pmf.lower
        infinity = float(pmf.infinity)
    else:
        probs, disc = np.asarray(pmf._probs, dtype=float), float(pmf._discretization)
        lowest, infinity = int(pmf._lower_loss), float(pmf._infinity_mass)
    # Only losses above 0 enter delta at epsilon >= 0 (and the sums run from the top down), so
    # the grid below the first positive loss is dropped before any exponential is taken.
    cut = min(max(0, 1 - lowest), probs.size)
    probs = probs[cut:]
    losses = (lowest + cut + np.arange(probs.size)) * disc
    with np.errstate(over="ignore"):
        weighted = probs * np.exp(-losses)
    # upper[j], lower[j]: mass and sum of p e^{-l} over indices j.. (j = size: none).
    upper = infinity + np.concatenate((np.cumsum(probs[::-1])[::-1], [0.0]))
    lower = np.concatenate((np.cumsum(weighted[::-1])[::-1], [0.0]))
    start = int(np.searchsorted(losses, 0.0, side="right"))  # losses > 0
    if upper[start] - lower[start] + eta0 + eta1 <= delta:
        return 0.0, max(float(upper[start] - lower[start]), 0.0)
    with np.errstate(over="ignore", invalid="ignore"):
        grow = np.exp(losses)
        at_grid = upper[1:] - grow * lower[1:] + eta0 + grow * eta1
    ok = np.flatnonzero((losses > 0.0) & (at_grid <= delta))
    if ok.size == 0:
        return math.inf, 1.0
    j = int(ok[0])
    # On (l_{j-1}, l_j] the losses above eps are those of indices j..: solve for eps there.
    u, w = float(upper[j]), float(lower[j])
    below = max(float(losses[j - 1]) if j > start else 0.0, 0.0)
    eps = float(losses[j])
    if w > eta1:
        root = (u + eta0 - delta) / (w - eta1)
        if root > 0:
            eps = min(max(math.log(root), below), eps)
        else:
            eps = below
    d_pld = u - math.exp(eps) * w if eps < losses[j] else float(at_grid[j]) - eta0 - grow[j] * eta1
    return eps, max(float(d_pld), 0.0)
