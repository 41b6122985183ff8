"""Chernoff moments of a dense privacy-loss PMF, each computed the first time a window needs it.

A composition keeps the index window of its masses outside which at most the truncation lies:
for every order ``o`` of a grid, ``(sum_k count_k log M_k(o) + log(2/truncation)) / o`` bounds
the upper end (``o > 0``) or the lower end (``o < 0``), and the window is the tightest over the
grid. Each order's moment ``log M(o)`` is a pass over the PMF, and computing all of them took
about a fifth of a ``pld`` evaluation at the paper setting. :func:`window` computes only the
orders that can still move an end (``log M`` is convex in the order: :mod:`.convex`) and returns
the window of the full scan, bit for bit. Derivation: docs/maths.md, "Reporting epsilon every
round".
"""

from __future__ import annotations

import math
import threading
from collections.abc import Sequence

import numpy as np

from .convex import chord_lower_bounds, moment_error

__all__ = ["Moments", "chernoff_orders", "log_mgf", "window"]

#: Chernoff orders of the window, in units of the PMF's loss (the exponent's slope per unit of
#: privacy loss). Both signs; the window is the tightest bound over all of them.
_LOSS_ORDERS = np.concatenate((-np.geomspace(0.05, 400.0, 48), np.geomspace(0.05, 400.0, 48)))

#: Largest Chernoff order per grid step (the exponent's slope per index): at this order the bound
#: ``(log M + log(2/truncation)) / order`` lies within about 35 grid points of the support's end.
_MAX_INDEX_ORDER = 1.0

#: Orders per decade of the extension above ``_LOSS_ORDERS`` (as many as ``_LOSS_ORDERS`` has).
_ORDERS_PER_DECADE = 12

#: A PMF of at most this many points computes every order at its first window: each order
#: costs less than the search's own bookkeeping there.
_SCAN_SIZE = 1024
#: Orders computed first (positions in increasing order), so that every order has chords.
_SEEDS = 9
#: Orders computed per side and refinement of a window's search.
_BATCH = 2
#: The error bound of :func:`.convex.moment_error` is trusted only where the masses at both ends
#: of the support (the largest terms' weights) are at least this.
_SMALLEST_MASS = 1e-290


def chernoff_orders(discretization: float) -> np.ndarray:
    """Chernoff orders of a window, per grid index: :data:`_LOSS_ORDERS`, then up to the grid.

    :data:`_LOSS_ORDERS` is fixed per unit of loss, so on a fine grid (a round whose loss is
    small, as at large ``n``) its largest order is far below the slope a tight window needs
    (about the normal quantile of the truncation over the composed loss's standard deviation),
    and the window grew like ``1 / discretization``. The orders are therefore extended
    geometrically from its largest one up to :data:`_MAX_INDEX_ORDER` per grid index; every
    order gives a valid bound, the window is the tightest, and a grid whose fixed orders already
    reach that slope (``discretization >= 1/400``) gets none.

    Args:
        discretization: The loss grid step (> 0).

    Returns:
        The orders (per grid index), in a fixed order that does not depend on anything else.
    """
    orders = _LOSS_ORDERS * discretization
    start = float(_LOSS_ORDERS[-1]) * discretization
    if start >= _MAX_INDEX_ORDER:
        return orders
    count = max(2, math.ceil(_ORDERS_PER_DECADE * math.log10(_MAX_INDEX_ORDER / start)))
    extra = np.geomspace(start, _MAX_INDEX_ORDER, count + 1)[1:]
    return np.concatenate((orders, -extra, extra))


def _scaled_log(s: np.ndarray, m: np.ndarray, a_max: np.ndarray) -> np.ndarray:
    """``log(m + s) + a_max`` as scipy 1.17's ``logsumexp`` finishes (``nan`` for a negative sum).

    ``s`` is the sum of the scaled terms without the largest, ``m`` the largest one's weight.
    """
    s = np.where(s == 0, s, s / m)
    sign = np.sign(s + 1) * np.sign(m)
    s = np.where(s < -1, -s - 2, s)
    out = np.log1p(s) + np.log(np.abs(m)) + a_max
    out[sign < 0] = np.nan
    return out


def _logsumexp(a: np.ndarray, b: np.ndarray, zero: np.ndarray) -> np.float64:
    """``scipy.special.logsumexp(a, b=b)`` for 1-D float arrays with ``b >= 0``, bit for bit.

    The operations of scipy 1.17's ``logsumexp`` (the largest term taken out of the sum, then
    ``log1p(s) + log(m) + max``, the direct ``log(sum(b e^a))`` where that is not finite) in
    the same order on arrays of the same shapes, without its dispatch, which took most of a
    PMF's construction. ``a`` is overwritten; ``zero`` is ``b == 0``.
    """
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        original = a.copy()
        a[zero] = -np.inf
        a_max = np.max(a, keepdims=True)
        i_max = a == a_max
        a[i_max] = -np.inf
        m = np.sum(b * i_max.astype(a.dtype), keepdims=True, dtype=a.dtype)
        terms = b * np.exp(a - a_max)
        s = np.sum(terms, keepdims=True, dtype=terms.dtype)
        out = _scaled_log(s, m, a_max)
        if not np.isfinite(out[0]):
            out = np.log(np.sum(b * np.exp(original), keepdims=True))
    return np.float64(out[0])


def _logsumexp_at(
    index: np.ndarray, order: float, b: np.ndarray, zero: np.ndarray, top: int
) -> np.float64:
    """:func:`_logsumexp` of ``index * order``, whose only largest value where ``b > 0`` is at top.

    The same values with fewer passes over the arrays: the largest term is ``a[top]`` (no
    search), and its weight ``m``, which :func:`_logsumexp` sums over an indicator (every other
    product ``b * 0.0`` is ``+0.0``, so every partial sum is ``0`` or ``b[top]``), is
    ``b[top]``; the terms are computed in place. ``b`` must be finite.
    """
    a = index * order
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        a_max = a[top : top + 1].copy()
        a[zero] = -np.inf
        a[top] = -np.inf
        m = b[top : top + 1].copy()
        terms = np.multiply(b, np.exp(np.subtract(a, a_max, out=a), out=a), out=a)
        s = np.sum(terms, keepdims=True, dtype=terms.dtype)
        out = _scaled_log(s, m, a_max)
        if not np.isfinite(out[0]):  # _logsumexp's direct sum, on the same exponents
            out = np.log(np.sum(b * np.exp(index * order), keepdims=True))
    return np.float64(out[0])


def _fill(probs: np.ndarray, orders: np.ndarray, which: np.ndarray, out: np.ndarray) -> None:
    """Write ``log sum_i probs[i] e^{o i}`` for the orders ``orders[which]`` into ``out[which]``.

    ``i o`` is monotone in ``i`` and its values at distinct ``i`` differ (by at least ``|o|``,
    far above their rounding), so the largest exponent where ``probs > 0`` is at the last such
    index for ``o > 0`` and at the first for ``o < 0``, and it is the only one:
    :func:`_logsumexp_at` then gives :func:`_logsumexp`'s values with fewer passes. Each order's
    value depends on that order alone, not on which others are computed with it.
    """
    index = np.arange(probs.size, dtype=float)
    zero = probs == 0
    support = np.flatnonzero(~zero)
    general = support.size == 0 or not np.all(np.isfinite(probs)) or probs.size >= 1 << 50
    for k in which:
        o = orders[k]
        if general or o == 0:
            out[k] = _logsumexp(index * o, probs, zero)
        else:
            out[k] = _logsumexp_at(index, o, probs, zero, int(support[-1 if o > 0 else 0]))


def log_mgf(probs: np.ndarray, orders: np.ndarray) -> np.ndarray:
    """Return ``log sum_i probs[i] e^{o i}`` at every order ``o`` (scipy's ``logsumexp``'s bits).

    Args:
        probs: Masses on the grid (1-D, >= 0).
        orders: The orders (per grid index).

    Returns:
        One value per order.
    """
    values = np.empty(orders.size)
    _fill(probs, orders, np.arange(orders.size), values)
    return values


class Moments:
    """The moments ``log M(o)`` of one PMF at its Chernoff orders, each computed when first needed.

    Args:
        probs: The PMF's masses (1-D, finite, >= 0; not copied: do not change them).
        orders: Its Chernoff orders (:func:`chernoff_orders`).
        known: Moments already computed (``nan`` where not), as :meth:`known` gives them, or
            ``None``.

    Attributes:
        orders: The orders.
        trusted: Whether a window may rule orders out by the chords: a PMF of more than
            :data:`_SCAN_SIZE` finite, non-negative masses whose end masses are at least
            :data:`_SMALLEST_MASS` (where :func:`.convex.moment_error` bounds the rounding);
            else a window computes every order.
    """

    def __init__(self, probs: np.ndarray, orders: np.ndarray, known: np.ndarray | None) -> None:
        self._probs = probs
        self.orders = orders
        self._values = np.full(orders.size, np.nan) if known is None else known.astype(float)
        self._done = ~np.isnan(self._values)
        self._lock = threading.Lock()
        #: The chords' bounds at every order from the orders computed so far (``None``: stale).
        self._chords: np.ndarray | None = None
        # Increasing orders (the chords' abscissa) and each order's rank among them.
        self._sorted = np.argsort(orders, kind="stable")
        self._rank = np.empty(orders.size, dtype=np.intp)
        self._rank[self._sorted] = np.arange(orders.size)
        self._abscissa = orders[self._sorted]
        support = np.flatnonzero(probs)
        self.trusted = bool(
            support.size > 0
            and probs.size > _SCAN_SIZE
            and probs.size < 1 << 50
            and np.all(np.isfinite(probs))
            and float(probs.min()) >= 0.0  # a measure: else log M need not be convex
            and min(probs[support[0]], probs[support[-1]]) >= _SMALLEST_MASS
            and np.all(np.isfinite(orders))
        )
        self.error = math.inf
        if self.trusted:
            ends = min(float(probs[support[0]]), float(probs[support[-1]]))
            span = float(np.max(np.abs(orders))) * float(support[-1])
            self.error = moment_error(abs(math.log(ends)), span, probs.size)

    @property
    def done(self) -> np.ndarray:
        """Which orders are computed (a copy)."""
        return self._done.copy()

    def fill(self, which: np.ndarray) -> None:
        """Compute the orders ``which`` (indices into :attr:`orders`) not yet computed."""
        with self._lock:
            todo = np.unique(which[~self._done[which]])
            if todo.size:
                _fill(self._probs, self.orders, todo, self._values)
                self._done[todo] = True
                self._chords = None

    def values(self, which: np.ndarray) -> np.ndarray:
        """Return the moments at ``which``, computing those not yet known."""
        self.fill(which)
        return self._values[which]

    def known(self) -> np.ndarray:
        """Return the moments computed so far, ``nan`` elsewhere (a read-only copy)."""
        with self._lock:
            out = self._values.copy()
        out.setflags(write=False)
        return out

    def full(self) -> np.ndarray:
        """Return every order's moment, computing those not yet known (a read-only copy)."""
        self.fill(np.arange(self.orders.size))
        return self.known()

    def lower_bounds(self, which: np.ndarray) -> np.ndarray:
        """Lower bounds on the moments at the orders ``which``: chords, or the values computed.

        At an order not computed yet the bound lies below the exact moment and below the value
        :meth:`fill` would compute there (``-inf`` or ``nan`` where the chords give none); at a
        computed order it is that value. They depend on the orders computed, not on the window
        asked for, and are kept until another order is computed.
        """
        with self._lock:
            if self._chords is None:
                done = self._done[self._sorted]
                unknown = np.flatnonzero(~done)
                chords = self._values.copy()  # a computed order bounds itself
                if unknown.size:
                    values = self._values[self._sorted]
                    chords[self._sorted[unknown]] = chord_lower_bounds(
                        self._abscissa, done, values, self.error, unknown
                    )
                self._chords = chords
            return self._chords[which]


def _scan(
    parts: Sequence[tuple[Moments, int]], log_term: float, which: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Return the full scan's bounds at the orders ``which`` (elementwise: the same values)."""
    orders = parts[0][0].orders[which]
    total = np.zeros(which.size)
    for m, k in parts:
        total = total + k * m.values(which)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        return orders, (total + log_term) / orders


def _ends(orders: np.ndarray, bounds: np.ndarray, upper: int, lower: int) -> tuple[int, int]:
    """Return the full scan's ends over the given orders, from the ends so far."""
    for order, bound in zip(orders, bounds, strict=True):
        if not math.isfinite(bound):
            continue
        if order > 0:
            upper = min(upper, math.ceil(bound))
        else:
            lower = max(lower, math.floor(bound))
    return upper, lower


def window(
    parts: Sequence[tuple[Moments, int]], support: int, truncation: float
) -> tuple[int, int]:
    """Index range of the composed masses outside which at most ``truncation`` lies (Chernoff).

    Indices count from the sum of the parts' first grid points. For every order ``o`` (the same
    orders for all parts, which share the grid), ``P(I >= b) <= truncation/2`` for ``b = (sum_k
    count_k log M_k(o) + log(2/truncation)) / o`` when ``o > 0``, and the same for the lower
    end when ``o < 0``. The ends are those of the scan of every order: the upper is the least
    ``ceil(b)`` over the positive orders (at most ``support``), the lower the largest
    ``floor(b)`` over the negative ones (at least 0), orders with a bound that is not finite
    left out. Only orders that can still move an end are computed: for every other one, the
    chords of the computed moments (:meth:`Moments.lower_bounds`, with margins far above the
    rounding of the scan's arithmetic) put its bound at or beyond the end found.

    Args:
        parts: ``(moments, count)`` pairs with the same orders.
        support: The largest index of the composed support (the upper end's cap).
        truncation: The mass left out, in ``(0, 1)``.

    Returns:
        ``(lower, upper)`` with ``lower <= upper``.
    """
    log_term = math.log(2.0 / truncation)
    size = parts[0][0].orders.size
    every = np.arange(size)
    if not all(m.trusted for m, _ in parts):
        upper, lower = _ends(*_scan(parts, log_term, every), support, 0)
        return lower, max(upper, lower)
    first = parts[0][0]
    seeds = first._sorted[np.unique(np.linspace(0, size - 1, _SEEDS).round().astype(np.intp))]
    for m, _ in parts:
        m.fill(seeds)
    while True:
        done = np.logical_and.reduce([m.done for m, _ in parts])
        known = np.flatnonzero(done)
        orders, bounds = _scan(parts, log_term, known)
        if not all(np.all(np.isfinite(m.values(known))) for m, _ in parts):
            upper, lower = _ends(*_scan(parts, log_term, every), support, 0)  # as the scan
            return lower, max(upper, lower)
        upper, lower = _ends(orders, bounds, support, 0)
        unknown = np.flatnonzero(~done)
        if unknown.size == 0:
            return lower, max(upper, lower)
        total = np.zeros(unknown.size)
        scale = np.zeros(unknown.size)
        for m, k in parts:
            low = k * m.lower_bounds(unknown)
            total = total + low
            scale = scale + np.abs(low)
        o = first.orders[unknown]
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            numerator = total + log_term
            # The scan's numerator is at least this: its rounding, many times over.
            numerator = numerator - 1e-12 * (np.abs(numerator) + scale + log_term + 1.0)
            edge = numerator / o  # below the scan's bound where o > 0, above it where o < 0
            edge = edge - np.sign(o) * (1e-12 * np.abs(edge) + 1e-9)
        # An order stays open unless its bound is sure to leave the end where it is.
        rise = (o > 0) & ~(edge > upper - 1)
        fall = (o < 0) & ~(edge < lower + 1)
        if not (rise.any() or fall.any()):
            return lower, max(upper, lower)
        edge = np.where(np.isnan(edge), np.where(o > 0, -np.inf, np.inf), edge)
        take = [unknown[rise][np.argsort(edge[rise], kind="stable")[:_BATCH]]]
        take.append(unknown[fall][np.argsort(-edge[fall], kind="stable")[:_BATCH]])
        chosen = np.concatenate(take)
        for m, _ in parts:
            m.fill(chosen)
