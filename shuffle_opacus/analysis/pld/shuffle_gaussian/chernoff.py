"""The lattice engine's Chernoff windows, with each order's moment computed only where it can win.

:class:`_Chernoff` bounds the tails of a sum of ``J`` i.i.d. lattice terms by minimising a
Chernoff bound over a fixed grid of :data:`ORDERS` orders per tail. Every order's moment costs a
pass over the term's (up to ``2 _MGF_BINS``) runs, and a lattice pair asks for about thirty
windows, each at a different ``J``; evaluating all orders up front took about half of a pair's
construction. Here an order's moment is computed the first time a window needs it and kept
(:class:`_Moments`), and a window evaluates only the orders that can still be its minimiser
(:func:`_first_minimum`): the log-MGF ``K`` of a measure is convex in the order, so the chords
of the orders already evaluated bound ``K``, hence the bound, from below at every other order,
and an order whose lower bound lies above the best value found cannot be the minimiser. The
order chosen, and so the window, is the one the scan of all orders chooses, bit for bit: each
order's moment is computed by the same operations on the same values as in that scan, and the
lower bounds carry margins far above the floating-point rounding of the moments
(:func:`_moment_error`). Where the margins cannot be justified (a tiny mass, a huge lattice
value) or a value is not finite, and on a small lattice, every order is evaluated, as in the
scan.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from ..convex import chord_lower_bounds, moment_error
from .pair import _MGF_BINS

#: Orders of each tail's grid (geometric, from 1e-6 to 60 over the lattice's span).
ORDERS = 240
#: Orders whose moments are computed in one array operation (the scan's block).
_BLOCK = 16
#: Orders evaluated first on a tail, spread over the grid so that every order has chords.
_SEEDS = np.array([0, 60, 120, 180, 239])
#: Orders evaluated per refinement of a window's search.
_BATCH = 2
#: A tail with at most this many runs computes every order at its first window, like the scan:
#: each order costs less than the search's own bookkeeping there.
_SCAN_RUNS = 2048
#: The moments' error bound is trusted only above this mass and below this lattice value
#: (with them every term and sum of :meth:`_Moments.fill` is finite).
_SMALLEST_MASS = 1e-290
_LARGEST_VALUE = 1e7


def _moment_error(log_mass: np.ndarray, theta: np.ndarray, z0: np.ndarray) -> float:
    """:func:`.convex.moment_error` of a tail: its masses, orders ``theta`` and points ``z0``."""
    span = float(np.max(np.abs(theta))) * float(np.max(np.abs(z0)))
    return moment_error(float(np.max(np.abs(log_mass))), span, log_mass.size)


class _Moments:
    """One tail's ``log M(t)`` (and, above, a bound on ``M'(t)/M(t)``) at a grid of orders.

    Computed on demand (:meth:`fill`) and kept. ``M`` puts each run's mass at its end ``z0``
    (the end that makes ``M`` larger); ``other`` is the other end.
    """

    def __init__(
        self,
        mass: np.ndarray,
        z0: np.ndarray,
        other: np.ndarray,
        theta: np.ndarray,
        *,
        ratio: bool,
    ) -> None:
        self.mass = mass
        self.log_mass = np.log(mass)
        self.z0 = z0
        self.other = other
        self.theta = theta
        #: The positive orders ``|t|``, the abscissa along which ``log M`` is convex.
        self.orders = np.abs(theta)
        self.log_m = np.zeros(theta.size)
        self.ratio = np.zeros(theta.size) if ratio else None
        self.done = np.zeros(theta.size, dtype=bool)
        self.error = _moment_error(self.log_mass, theta, z0)
        #: Whether the chords' lower bounds may be used: with these masses and values every
        #: term and sum of :meth:`fill` is finite (see :data:`_SMALLEST_MASS`).
        self.trusted = (
            float(mass.min()) >= _SMALLEST_MASS
            and float(np.max(np.abs(z0))) <= _LARGEST_VALUE
            and float(np.max(np.abs(other))) <= _LARGEST_VALUE
        )

    def fill(self, index: np.ndarray) -> None:
        """Compute the orders ``index`` not yet computed (the full scan's operations per order)."""
        todo = np.unique(index[~self.done[index]])
        log_mass, mass, z0, other = self.log_mass, self.mass, self.z0, self.other
        for start in range(0, todo.size, _BLOCK):
            rows = todo[start : start + _BLOCK]
            t = self.theta[rows][:, None]
            exponent = log_mass[None, :] + t * z0[None, :]
            top = exponent.max(axis=1, keepdims=True)
            scaled = np.exp(exponent - top)
            log_m0 = np.log(scaled.sum(axis=1)) + top[:, 0]
            self.log_m[rows] = log_m0
            if self.ratio is not None:
                # z e^{t z} on a run is largest at one of its ends: at the end z0, mass * z0 *
                # e^{t z0} is scaled[...] * z0 * e^{top - log M}; the other end is evaluated
                # directly. Scaled by e^{-log M} against overflow.
                shift = np.exp(top[:, 0] - log_m0)[:, None]
                at_z0 = scaled * shift * z0[None, :]
                at_other = (
                    mass[None, :] * other[None, :] * np.exp(t * other[None, :] - log_m0[:, None])
                )
                self.ratio[rows] = np.maximum(at_z0, at_other).sum(axis=1)
            self.done[rows] = True

    def fill_all(self) -> None:
        """Compute every order."""
        self.fill(np.arange(self.theta.size))


def _chord_lower_bounds(moments: _Moments, unknown: np.ndarray) -> np.ndarray:
    """Lower bounds on ``log M`` at the orders ``unknown`` (:func:`.convex.chord_lower_bounds`)."""
    return chord_lower_bounds(moments.orders, moments.done, moments.log_m, moments.error, unknown)


def _first_minimum(
    moments: _Moments,
    keys: Callable[[np.ndarray], np.ndarray],
    lower: Callable[[np.ndarray, np.ndarray], np.ndarray],
) -> int:
    """Return ``argmin`` (first minimiser) of ``keys`` over every order, evaluating few of them.

    Args:
        moments: The tail's moments; orders are computed into it as needed.
        keys: The window's values at computed orders (the scan's formula, elementwise).
        lower: Lower bounds on ``keys`` at unknown orders from lower bounds on ``log M``
            there (:func:`_chord_lower_bounds`), with the keys' own rounding margin.

    Returns:
        The index of the scan's ``argmin``.
    """
    size = moments.theta.size
    if not moments.trusted or moments.mass.size <= _SCAN_RUNS:
        moments.fill_all()
    elif not moments.done.any():
        moments.fill(_SEEDS[_SEEDS < size])
    while True:
        known = np.flatnonzero(moments.done)
        values = keys(known)
        if not np.all(np.isfinite(values)):
            moments.fill_all()
            return int(np.argmin(keys(np.arange(size))))
        k = int(np.argmin(values))
        best, value = int(known[k]), float(values[k])
        unknown = np.flatnonzero(~moments.done)
        if unknown.size == 0:
            return best
        bounds = lower(unknown, _chord_lower_bounds(moments, unknown))
        # Below the minimiser a tie would move the first minimum: strictly above it there.
        open_ = np.where(unknown < best, ~(bounds > value), ~(bounds >= value))
        if not open_.any():
            return best
        candidates = unknown[open_]
        moments.fill(candidates[np.argsort(bounds[open_], kind="stable")[:_BATCH]])


class _Chernoff:
    """Tail bounds of a sum of ``J`` i.i.d. lattice terms, and of its tilted version.

    For a term's lattice measure ``mu`` (mass <= 1, mean <= 0) with ``M(t) = sum mu(z) e^{t z}``
    and ``T`` the sum of ``J`` terms: ``E[(1 + T/n) 1{T >= s}] <= e^{-t s} (M^J + J/n M^{J-1}
    M')`` for ``t > 0`` (the tilt that turns ``Q`` into ``P``; for ``s >= 0`` it also bounds the
    ``Q`` mass); below, ``(1 + T/n) <= 1`` for ``T <= 0`` and ``Q(T <= s) <= e^{t s} M(-t)^J``.
    Each bound is minimised over a grid of ``t`` (see the module docstring for how). A large
    lattice is first merged into at most ``_MGF_BINS`` runs of neighbouring points, each
    represented by the end that makes ``M`` and ``M'`` larger (``z e^{t z}`` is largest at an
    end of an interval), so the bounds stay valid.
    """

    def __init__(self, term: tuple[int, np.ndarray], step: float, n: int) -> None:
        offset, masses = term
        # The lowest points exactly (the lower tail needs them), the rest merged into runs.
        exact = min(masses.size, _MGF_BINS)
        rest = masses[exact:]
        width = max(1, math.ceil(rest.size / _MGF_BINS))
        pad = (-rest.size) % width
        grouped = np.concatenate([rest, np.zeros(pad)]).reshape(-1, width)
        first = offset + exact + np.arange(grouped.shape[0]) * width
        starts = np.concatenate([offset + np.arange(exact), first])
        ends = np.concatenate([offset + np.arange(exact), first + width - 1])
        mass = np.concatenate([masses[:exact], grouped.sum(axis=1)])
        keep = mass > 0
        self.mass = mass[keep]
        self.lo = starts[keep] * step
        self.hi = ends[keep] * step
        self.n = n
        # e^{t z} stays below e^60: above, z reaches the top of the lattice; below, z >= -1 for
        # every report, so the lower tail can use much larger t.
        span_up = max(float(self.hi.max()), step)
        span_down = max(-float(self.lo.min()), step)
        self.thetas = np.geomspace(1e-6, 60.0, ORDERS) / span_up
        self.thetas_down = np.geomspace(1e-6, 60.0, ORDERS) / span_down
        # Upward the runs sit at their upper ends (t > 0), downward at their lower ends.
        self._up = _Moments(self.mass, self.hi, self.lo, self.thetas, ratio=True)
        self._down = _Moments(self.mass, self.lo, self.hi, -self.thetas_down, ratio=False)
        # d/dt log M at t = 0+, a lower bound on every M'(t)/M(t) bound of the upper tail.
        self._slope_up = float(np.dot(self.mass, self.hi) / self.mass.sum())

    def _tilted(self, count: int, index: np.ndarray) -> np.ndarray:
        up = self._up
        assert up.ratio is not None
        return count * up.log_m[index] + np.log(
            np.maximum(1.0 + count / self.n * up.ratio[index], 1e-300)
        )

    def _high_index(self, count: int, half: float) -> int:
        """Return the scan's ``argmin`` of the upper end over the orders (module docstring)."""
        up = self._up

        def keys(index: np.ndarray) -> np.ndarray:
            return np.maximum((self._tilted(count, index) - half) / self.thetas[index], 0.0)

        # log(1 + (J/n) M'/M) >= log(1 + (J/n) slope(0+)), less generous margins.
        low_ratio = self._slope_up - 1e-9 * (1.0 + float(np.max(np.abs(self.hi))))
        low_ratio -= 1e-9 * float(np.max(np.abs(self.lo)))
        tilt = math.log(max(1.0 + count / self.n * low_ratio - 1e-12, 1e-300)) - 1e-12

        def lower(index: np.ndarray, log_m: np.ndarray) -> np.ndarray:
            return _key_bound(count, log_m, tilt, half, self.thetas[index])

        return _first_minimum(up, keys, lower)

    def _low_index(self, count: int, half: float) -> int:
        """Return the scan's ``argmax`` of the lower end over the orders (argmin of minus it)."""

        def keys(index: np.ndarray) -> np.ndarray:
            lows = np.minimum(
                -(count * self._down.log_m[index] - half) / self.thetas_down[index], 0.0
            )
            return -lows

        def lower(index: np.ndarray, log_m: np.ndarray) -> np.ndarray:
            return _key_bound(count, log_m, 0.0, half, self.thetas_down[index])

        return _first_minimum(self._down, keys, lower)

    def window(self, count: int, budget: float) -> tuple[float, float, float, float]:
        """Return a range ``[low, high]`` of the sum of ``count`` terms and the masses outside.

        Returns:
            ``(low, high, q_out, p_out)``: bounds on the ``Q`` mass and on the tilted ``P`` mass
            of ``T < low`` plus ``T > high``, each at most ``budget``.
        """
        half = math.log(budget / 2.0)
        i = self._high_index(count, half)
        at = np.array([i])
        log_tilted = self._tilted(count, at)
        highs = np.maximum((log_tilted - half) / self.thetas[at], 0.0)
        high = float(highs[0])
        p_high = math.exp(log_tilted[0] - self.thetas[i] * high)
        j = self._low_index(count, half)
        at = np.array([j])
        log_down = self._down.log_m[at]
        lows = np.minimum(-(count * log_down - half) / self.thetas_down[at], 0.0)
        low = float(lows[0])
        q_low = math.exp(count * log_down[0] + self.thetas_down[j] * low)
        return low, high, q_low + p_high, p_high + q_low


def _key_bound(
    count: int, log_m: np.ndarray, tilt: float, half: float, orders: np.ndarray
) -> np.ndarray:
    """Lower bounds on ``max((count log M + tilt - half) / t, 0)`` as the scan computes it.

    ``log_m`` bounds ``log M`` from below; the slack covers the rounding of the scan's own
    arithmetic (a few units in the last place of the numerator's terms) many times over.
    """
    with np.errstate(invalid="ignore", over="ignore"):
        numerator = count * log_m + tilt - half
        slack = 1e-12 * (np.abs(numerator) + abs(tilt) + abs(half) + 1.0)
        bound = (numerator - slack) / orders
    return np.maximum(np.where(np.isnan(bound), -np.inf, bound), 0.0)
