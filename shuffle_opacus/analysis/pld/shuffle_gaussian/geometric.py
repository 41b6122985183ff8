"""The geometric engine: few reports, every partial sum on a geometric grid.

See :mod:`shuffle_opacus.analysis.pld.shuffle_gaussian` and docs/maths.md.
"""

from __future__ import annotations

import math

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view
from scipy.stats import binom

from .pair import (
    _GEOMETRIC_MAX_STEP,
    _ROW_BLOCK,
    DEFAULT_SPREAD,
    GEOMETRIC_POINTS,
    ShuffleGaussianPair,
    _cells,
    _frozen_pair,
    _report_cut,
)

#: Products per ``bincount`` call of :func:`_geometric_add` (a chunk of rows that stays in cache).
_CHUNK_PRODUCTS = 1 << 17


def _geometric_term(a: float, x_max: float, step: float) -> tuple[int, np.ndarray, float]:
    """One report's ratio ``W = e^{a x - a^2/2}`` (cut at ``x <= x_max``) on a geometric grid.

    The grid is ``{0} U {e^{k step}: k0 <= k <= k1}``; the mass of ``W`` between two neighbouring
    points is split between them so that its mean is kept (as in :func:`_term_lattice`, with
    ``E[W 1{x <= t}] = Phi(t - a)``), so the grid term dominates ``W`` in the convex order.

    Returns:
        ``(k0, masses, zero)``: the masses on ``e^{(k0 + i) step}`` and the mass at 0.
    """
    k0 = math.floor((-a * x_max - a * a / 2.0) / step)
    k1 = math.ceil((a * x_max - a * a / 2.0) / step)
    logs = np.arange(k0, k1 + 1) * step
    points = np.concatenate([[0.0], np.exp(logs)])
    t = np.minimum(np.concatenate([[-np.inf], (logs + a * a / 2.0) / a]), x_max)
    prob = _cells(t)
    first = _cells(t - a)  # E[W; interval]
    width = points[1:] - points[:-1]
    masses = np.zeros(points.size)
    masses[:-1] += np.clip((points[1:] * prob - first) / width, 0.0, None)
    masses[1:] += np.clip((first - points[:-1] * prob) / width, 0.0, None)
    return k0, masses[1:], float(masses[0])


def _trim(
    part: tuple[int, np.ndarray, float], step: float, *, n: int, count: int, budget: float
) -> tuple[tuple[int, np.ndarray, float], float, float]:
    """Drop the outermost grid points of a partial sum of ``count`` reports, within a budget.

    Dropping the event "the partial sum ``Y`` lands on a dropped point" costs its ``Q`` mass
    ``q`` and its ``P`` mass ``E_Q[R; event] <= (sum q y + q (n - count)) / n`` (the remaining
    reports add at most their mean, 1 each, to ``n R = Y + rest + n - N``). Points are dropped
    from each end while the sum of both costs stays within ``budget / 2`` per end.

    Returns:
        The kept part and the ``Q`` and ``P`` masses dropped.
    """
    k0, masses, zero = part
    values = np.exp((k0 + np.arange(masses.size)) * step)
    cost_q = masses
    cost_p = masses * (values + (n - count)) / n
    cost = cost_q + cost_p
    lo = int(np.searchsorted(np.cumsum(cost), budget / 2.0, side="right"))
    hi = masses.size - int(np.searchsorted(np.cumsum(cost[::-1]), budget / 2.0, side="right"))
    if hi <= lo:
        return part, 0.0, 0.0
    dropped_q = float(cost_q[:lo].sum() + cost_q[hi:].sum())
    dropped_p = float(cost_p[:lo].sum() + cost_p[hi:].sum())
    return (k0 + lo, masses[lo:hi].copy(), zero), dropped_q, dropped_p


def _geometric_add(
    y: tuple[int, np.ndarray, float], w: tuple[int, np.ndarray, float], step: float
) -> tuple[int, np.ndarray, float]:
    """Law of ``Y + W`` for independent ``Y``, ``W`` on the geometric grid, spread back onto it.

    With ``y_i = e^{(ky + i) s}`` and ``w_j = e^{(kw + j) s}``, ``y_i + w_j = y_i (1 + e^{d s})``
    with ``d = kw + j - ky - i``: its grid cell ``i + f(d)`` and its split between the cell's two
    ends depend on ``d`` only, so they are computed once per ``d``. Each sum's mass is split
    between the two neighbouring grid points keeping its mean (a mean-preserving spread).

    Row ``i`` reads ``f`` and the split at ``d - d_min = c - i + j`` (``c`` fixed): a Toeplitz
    matrix, read as reversed sliding windows without an index array. The sums are added in
    blocks of :data:`_ROW_BLOCK` rows, each block's per-cell sums (one ``bincount`` per end,
    over the window of cells the block reaches) added to the result. A block's products are
    made a chunk of rows at a time, to stay in cache: each chunk's ``bincount`` starts with one
    seed per cell, the cell's sum so far (``0.0 + p == p``: sums from ``+0.0`` are never
    ``-0.0``), so every cell's sum is added in the same order as one ``bincount`` over the
    block and is the same to the bit.
    """
    if y[0] > w[0]:
        y, w = w, y
    ky, qy, zy = y
    kw, qw, zw = w
    d_min = kw - (ky + qy.size - 1)
    d = np.arange(d_min, kw + qw.size - ky)
    log_ratio = np.logaddexp(0.0, d * step)  # log(1 + e^{d s})
    f = np.floor(log_ratio / step).astype(np.int64)
    frac = np.clip(np.expm1(log_ratio - f * step) / math.expm1(step), 0.0, 1.0)
    size = qy.size + int(f.max()) + 2
    out = np.zeros(size)
    m = qw.size
    f_rows = sliding_window_view(f, m)[::-1]  # f_rows[i, j] = f[qy.size - 1 - i + j]
    frac_rows = sliding_window_view(frac, m)[::-1]
    chunk = max(1, min(qy.size, _ROW_BLOCK, _CHUNK_PRODUCTS // m))
    rows = np.arange(chunk)[:, None]
    for start in range(0, qy.size, _ROW_BLOCK):
        stop = min(qy.size, start + _ROW_BLOCK)
        # The block's cells lie in a window [lo, lo + width): its rows read f at d - d_min from
        # qy.size - stop to qy.size - 1 - start + m - 1 (narrow, while f itself may be ~1e6).
        reach = f[qy.size - stop : qy.size - start + m - 1]
        lo = start + int(reach.min())
        width = stop + int(reach.max()) - lo
        # Buffers: [one seed per cell of the window | a chunk's products, row by row]; seed k
        # is cell lo + k, and the cells are stored as offsets from lo.
        cell = np.empty(width + chunk * m, dtype=np.int64)
        cell[:width] = np.arange(width)
        down = np.empty(cell.size)  # mass kept at the cell's lower end
        up = np.empty(cell.size)  # mass moved to its upper end
        seeds = width  # the block's first chunk has none
        for row in range(start, stop, chunk):
            row_end = min(stop, row + chunk)
            end = width + (row_end - row) * m
            chunk_cell = cell[width:end].reshape(-1, m)
            mass = down[width:end].reshape(-1, m)
            moved = up[width:end].reshape(-1, m)
            np.add(rows[: row_end - row] + (row - lo), f_rows[row:row_end], out=chunk_cell)
            np.multiply(qy[row:row_end, None], qw[None, :], out=mass)
            np.multiply(frac_rows[row:row_end], mass, out=moved)
            np.subtract(mass, moved, out=mass)
            sums_down = np.bincount(cell[seeds:end], weights=down[seeds:end], minlength=width)
            sums_up = np.bincount(cell[seeds:end], weights=up[seeds:end], minlength=width)
            down[:width] = sums_down
            up[:width] = sums_up
            seeds = 0
        # Cells outside the window get +0.0 from the block: adding it changes nothing.
        out[lo : lo + width] += sums_down
        out[lo + 1 : lo + 1 + width] += sums_up  # the upper end: cell + 1
    # Atoms at zero: 0 + w = w (cells kw - ky + j), y + 0 = y, 0 + 0 = 0.
    out[kw - ky : kw - ky + qw.size] += zy * qw
    out[: qy.size] += zw * qy
    nonzero = np.flatnonzero(out)
    first, last = int(nonzero[0]), int(nonzero[-1])
    return ky + first, out[first : last + 1].copy(), zy * zw


def _geometric_pair(
    n: int, terms: int, gamma: float, sigma: float, tail: float, spread: float
) -> ShuffleGaussianPair:
    """Build the pair of a round with few reports, their sum on a geometric grid.

    ``1 + S/n = (Y + n - K) / n`` with ``K`` the number of reports and ``Y`` the sum of their
    ratios ``W``: ``K = N`` for ``full`` and ``subsampled``, ``K ~ Binomial(N, gamma)`` for
    check-in (the law of ``Y`` given ``K = k`` is that of ``k`` reports, so the pair is the
    binomial mixture of the ``k``-report pairs). ``Y_k = Y_{k-1} + W`` is spread back onto the
    geometric grid after each addition (mean kept: convex order); the outermost points are dropped
    within a budget and their masses added to both infinity masses.
    """
    a = 1.0 / sigma
    x_max, infinity_add, infinity_remove = _report_cut(a, gamma, terms, n, tail)
    # About GEOMETRIC_POINTS / sqrt(N) points across one report's range 2 a x_max: the grid's
    # error is second order in the step and grows with the number of additions; the cost is
    # N times the square of the grid size. ``spread`` scales the step like the lattice's.
    points = GEOMETRIC_POINTS / math.sqrt(terms) * math.sqrt(DEFAULT_SPREAD / spread)
    step = min(_GEOMETRIC_MAX_STEP, 2.0 * a * x_max / points)
    budget = tail / 8.0 / terms
    # One report's term, trimmed; every report of the round uses it, so its cost counts N times.
    term, dropped_q, dropped_p = _trim(
        _geometric_term(a, x_max, step), step, n=n, count=1, budget=budget / terms
    )
    infinity_add += terms * dropped_q
    infinity_remove += terms * dropped_p
    sums = [term]
    for count in range(2, terms + 1):
        part, dropped_q, dropped_p = _trim(
            _geometric_add(sums[-1], term, step), step, n=n, count=count, budget=budget
        )
        infinity_add += dropped_q
        infinity_remove += dropped_p
        sums.append(part)
    if gamma == 1.0:
        weights = {terms: 1.0}
    else:
        counts = np.arange(terms + 1)
        weights = dict(zip(counts.tolist(), binom.pmf(counts, terms, gamma).tolist(), strict=True))
    ratios = []
    masses_out = []
    for count, weight in weights.items():
        if weight <= 0.0:
            continue
        if count == 0:
            ratios.append(np.array([1.0]))
            masses_out.append(np.array([weight]))
            continue
        k0, masses, zero = sums[count - 1]
        values = np.concatenate([[0.0], np.exp((k0 + np.arange(masses.size)) * step)])
        ratios.append((values + (n - count)) / n)
        masses_out.append(weight * np.concatenate([[zero], masses]))
    r = np.concatenate(ratios)
    q = np.concatenate(masses_out)
    order = np.argsort(r, kind="stable")
    return _frozen_pair(
        n=n,
        terms=terms,
        rate=gamma,
        sigma=sigma,
        engine="geometric",
        step=step,
        ratios=r[order],
        masses=q[order],
        infinity_remove=infinity_remove,
        infinity_add=infinity_add,
        x_max=x_max,
    )
