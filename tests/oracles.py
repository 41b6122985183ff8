"""Independent reference implementations used only by the tests and benchmarks.

None of these share code with the package: the partition enumeration follows the paper's
Algorithm 1 (Liew & Takahashi, Appendix B), the mpmath oracle multiplies polynomials in
60-digit arithmetic, and the quadrature integrates the shuffled output densities directly.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterator, Sequence

import mpmath as mp
import numpy as np


def partitions(total: int, largest: int | None = None) -> Iterator[tuple[int, ...]]:
    """Integer partitions of ``total`` as non-increasing tuples."""
    largest = total if largest is None else largest
    if total == 0:
        yield ()
        return
    for first in range(min(total, largest), 0, -1):
        for rest in partitions(total - first, first):
            yield (first, *rest)


def theorem1_rdp_partitions(n: int, sigma: float, order: int) -> float:
    """Theorem 1 by enumerating the integer partitions of ``order`` (the paper's Algorithm 1).

    Each partition ``rho`` with at most ``n`` parts stands for the ``n! / (prod kappa! (n -
    parts)!)`` distinct exponent vectors that permute it, each contributing the multinomial
    coefficient times ``exp(sum k_i^2 / 2 sigma^2)``. Summed with log-sum-exp.
    """
    logs = []
    for rho in partitions(order):
        parts = len(rho)
        if parts > n:
            continue
        counts = Counter(rho)
        log_perm = math.lgamma(n + 1) - math.lgamma(n - parts + 1)
        log_perm -= sum(math.lgamma(c + 1) for c in counts.values())
        log_multi = math.lgamma(order + 1) - sum(math.lgamma(k + 1) for k in rho)
        logs.append(log_perm + log_multi + sum(k * k for k in rho) / (2 * sigma**2))
    peak = max(logs)
    log_sum = peak + math.log(sum(math.exp(v - peak) for v in logs))
    log_a = log_sum - order / (2 * sigma**2) - order * math.log(n)
    return log_a / (order - 1)


def theorem1_rdp_partitions_mp(n: int, sigma: float, order: int, dps: int = 50) -> mp.mpf:
    """Theorem 1 by partition enumeration in ``dps``-digit arithmetic (valid for huge ``n``)."""
    with mp.workdps(dps):
        total = mp.mpf(0)
        for rho in partitions(order):
            parts = len(rho)
            if parts > n:
                continue
            perm = mp.mpf(1)
            for i in range(parts):
                perm *= n - i
            for c in Counter(rho).values():
                perm /= mp.factorial(c)
            multi = mp.factorial(order)
            for k in rho:
                multi /= mp.factorial(k)
            total += (
                perm * multi * mp.e ** (mp.mpf(sum(k * k for k in rho)) / (2 * mp.mpf(sigma) ** 2))
            )
        moment = total * mp.e ** (-mp.mpf(order) / (2 * mp.mpf(sigma) ** 2)) / mp.mpf(n) ** order
        return mp.log(moment) / (order - 1)


def theorem1_rdp_mpmath(n: int, sigma: float, order: int, dps: int = 60) -> mp.mpf:
    """Theorem 1 from ``lambda! [x^lambda] f(x)^n / n^lambda`` by repeated polynomial products."""
    with mp.workdps(dps):
        s2 = 2 * mp.mpf(sigma) ** 2
        f = [mp.e ** (mp.mpf(k * k - k) / s2) / mp.factorial(k) for k in range(order + 1)]
        poly = [mp.mpf(1)] + [mp.mpf(0)] * order
        for _ in range(n):
            nxt = [mp.mpf(0)] * (order + 1)
            for i, pi in enumerate(poly):
                if pi == 0:
                    continue
                for j in range(order + 1 - i):
                    nxt[i + j] += pi * f[j]
            poly = nxt
        moment = mp.factorial(order) * poly[order] / mp.mpf(n) ** order
        return mp.log(moment) / (order - 1)


def _grid(sigma: float, lo: float, hi: float, points: int) -> tuple[np.ndarray, np.ndarray]:
    """Simpson weights on ``[lo - pad, hi + pad]`` with ``pad = 9 sigma + 8`` (covers the tilt
    of ``p^lambda q^(1-lambda)`` for the orders used in the tests)."""
    pad = 9 * sigma + 8
    x = np.linspace(lo - pad, hi + pad, points)
    h = x[1] - x[0]
    w = np.ones(points)
    w[1:-1:2] = 4.0
    w[2:-1:2] = 2.0
    return x, w * h / 3.0


def shuffled_density(
    values: Sequence[float], sigma: float, axes: Sequence[np.ndarray]
) -> np.ndarray:
    """Density of the shuffled reports ``values[i] + N(0, sigma^2)`` on a tensor grid.

    The shuffled (unordered) output is represented by the symmetrised density of the ordered
    tuple, which gives the same divergences.
    """
    from itertools import permutations

    n = len(values)
    dens = None
    perms = list(permutations(range(n)))
    for perm in perms:
        term = None
        for axis, idx in enumerate(perm):
            shape = [1] * n
            shape[axis] = -1
            g = np.exp(-((axes[axis] - values[idx]) ** 2) / (2 * sigma**2))
            g = (g / math.sqrt(2 * math.pi * sigma**2)).reshape(shape)
            term = g if term is None else term * g
        dens = term if dens is None else dens + term
    return dens / len(perms)


def shuffle_renyi_quadrature(
    user: tuple[float, float],
    others: Sequence[float],
    sigma: float,
    orders: Sequence[int],
    points: int = 401,
) -> tuple[np.ndarray, np.ndarray]:
    """Rényi divergences of the shuffle Gaussian in both directions by Simpson quadrature.

    The differing user holds ``user[1]`` in ``D'`` and ``user[0]`` in ``D``; the other users hold
    ``others`` in both. Returns ``(D_l(M(D') || M(D)), D_l(M(D) || M(D')))`` at ``orders``.
    """
    n = 1 + len(others)
    lo = min(*user, *others)
    hi = max(*user, *others)
    x, w = _grid(sigma, lo, hi, points)
    axes = [x] * n
    p = shuffled_density([user[1], *others], sigma, axes)
    q = shuffled_density([user[0], *others], sigma, axes)
    weight = w
    for _ in range(n - 1):
        weight = np.multiply.outer(weight, w)
    forward, backward = [], []
    log_p = np.log(np.maximum(p, 1e-300))
    log_q = np.log(np.maximum(q, 1e-300))
    for lam in orders:
        f = np.sum(weight * np.exp(lam * log_p + (1 - lam) * log_q))
        b = np.sum(weight * np.exp(lam * log_q + (1 - lam) * log_p))
        forward.append(math.log(f) / (lam - 1))
        backward.append(math.log(b) / (lam - 1))
    return np.array(forward), np.array(backward)


def _normal_cdf(x: np.ndarray) -> np.ndarray:
    from scipy.special import ndtr

    return ndtr(x)


def _call_put(strike: np.ndarray, a: float, *, put: bool) -> np.ndarray:
    """``E[(W - K)_+]`` (call) or ``E[(K - W)_+]`` (put) for ``W = e^{a x - a^2/2}``, x ~ N(0, 1).

    Closed forms from ``E[W 1{x > t}] = Phi(a - t)``, with ``t = (log K + a^2/2)/a``: the call is
    ``Phi(a - t) - K Phi(-t)`` (``1 - K`` when ``K <= 0``), the put ``K Phi(t) - Phi(t - a)``
    (0 when ``K <= 0``).
    """
    strike = np.asarray(strike, dtype=float)
    positive = strike > 0
    t = np.where(positive, (np.log(np.where(positive, strike, 1.0)) + a * a / 2.0) / a, 0.0)
    if put:
        value = strike * _normal_cdf(t) - _normal_cdf(t - a)
        return np.where(positive, np.maximum(value, 0.0), 0.0)
    value = _normal_cdf(a - t) - strike * _normal_cdf(-t)
    return np.where(positive, np.maximum(value, 0.0), 1.0 - strike)


def _normal_nodes(
    points: int, a: float, kinks: Sequence[float] = (), width: float = 0.25
) -> tuple[np.ndarray, np.ndarray]:
    """Composite Gauss-Legendre nodes and weights of the standard normal law on ``[-12, 12 + a]``.

    Panels of width at most ``width``, 16 nodes each (``points`` sets no more than a floor on the
    node count); around each ``kink`` (where a strike crosses zero and the integrand turns over
    a width of about ``1/(a W)``) panel ends are added at distances ``10^-12 .. 1`` on both
    sides, so each panel sees a smooth function however sharp the turn.
    """
    lo, hi = -12.0, 12.0 + a
    count = max(int(math.ceil((hi - lo) / width)), points // 16)
    ends = [np.linspace(lo, hi, count + 1)]
    for k in kinks:
        offsets = 10.0 ** -np.arange(0.0, 12.5, 0.5)
        ends.append(np.concatenate([[k], k - offsets, k + offsets]))
    ends_all = np.unique(np.concatenate(ends))
    ends_all = ends_all[(ends_all >= lo) & (ends_all <= hi)]
    g, gw = np.polynomial.legendre.leggauss(16)
    left, right = ends_all[:-1], ends_all[1:]
    half = (right - left) / 2.0
    x = ((left + right) / 2.0)[:, None] + half[:, None] * g[None, :]
    w = half[:, None] * gw[None, :]
    x, w = x.ravel(), w.ravel()
    return x, w * np.exp(-x * x / 2.0) / math.sqrt(2.0 * math.pi)


def _kink(strike: float, a: float) -> list[float]:
    """The coordinate where one report's ratio ``W`` reaches ``strike`` (none if ``<= 0``)."""
    return [(math.log(strike) + a * a / 2.0) / a] if strike > 0 else []


def shuffle_hockey_quadrature(
    n: int, sigma: float, eps: np.ndarray, direction: str, points: int = 1201
) -> np.ndarray:
    """Hockey-stick curve of Theorem 1's pair (plain shuffle, ``n <= 3``) by quadrature.

    Under ``Q`` every report is ``N(0, 1)`` in units of the noise and the likelihood ratio is
    ``R = (W_1 + ... + W_n)/n`` with ``W = e^{a x - a^2/2}``, ``a = 1/sigma``. ``H_alpha(P || Q)
    = E_Q[(R - alpha)_+]`` and ``H_alpha(Q || P) = E_Q[(1 - alpha R)_+]``: the last report's
    expectation is a closed-form call or put on ``W_n`` (:func:`_call_put`), the other ``n - 1``
    reports are integrated by composite Gauss-Legendre rules refined where a strike crosses
    zero (:func:`_normal_nodes`). Valid at every real ``eps``.
    """
    if direction not in ("remove", "add"):
        raise ValueError(direction)
    if n not in (1, 2, 3):
        raise ValueError("n must be 1, 2 or 3")
    a = 1.0 / sigma
    eps = np.atleast_1d(np.asarray(eps, dtype=float))
    out = np.empty(eps.size)
    for i, al in enumerate(np.exp(eps)):
        level = n * al if direction == "remove" else n / al  # the strike of the sum W_1 + ...

        def last(strike: np.ndarray, al: float = al) -> np.ndarray:
            if direction == "remove":
                return _call_put(strike, a, put=False) / n
            return al / n * _call_put(strike, a, put=True)

        if n == 1:
            out[i] = float(last(np.array([level]))[0])
            continue
        x1, w1 = _normal_nodes(points, a, _kink(level, a), width=0.25 if n == 2 else 1.0)
        ratio1 = np.exp(a * x1 - a * a / 2.0)
        if n == 2:
            out[i] = float(np.dot(w1, last(level - ratio1)))
            continue
        total = 0.0
        for r1, weight1 in zip(ratio1, w1, strict=True):
            x2, w2 = _normal_nodes(points, a, _kink(level - r1, a), width=1.0)
            total += weight1 * float(np.dot(w2, last(level - r1 - np.exp(a * x2 - a * a / 2.0))))
        out[i] = total
    return out


def adaptive_threshold_delta(
    n: int, sigma: float, eps: float, points: int = 1201, curve_points: int = 801
) -> float:
    """Delta at ``eps`` of two adaptive rounds of Theorem 1's pair (plain shuffle, ``n = 2``).

    Round 1 is the remove orientation (``P`` against ``Q``); round 2 is remove again if the
    round-1 privacy loss ``l1`` is at most ``eps`` and add (``Q`` against ``P``) otherwise: a
    query that, seeing a large loss, puts the other users at the differing user's second value.
    ``delta = E_P[H_2(eps - l1)]`` with ``H_2`` the chosen round-2 profile; ``l1 = log R`` under
    ``P`` is integrated as ``E_Q[R g(log R)]`` on a tensor trapezoid grid, the profiles are
    tabulated by :func:`shuffle_hockey_quadrature` and interpolated by cubic splines.
    """
    if n != 2:
        raise ValueError("n must be 2")
    a = 1.0 / sigma
    x, w = _normal_nodes(points, a)
    ratio = np.exp(a * x - a * a / 2.0)
    r = (ratio[:, None] + ratio[None, :]) / 2.0
    weight = w[:, None] * w[None, :]
    loss = np.log(r)
    grid = np.linspace(eps - loss.max() - 1e-9, eps - loss.min() + 1e-9, curve_points)
    remove = shuffle_hockey_quadrature(2, sigma, grid, "remove")
    add = shuffle_hockey_quadrature(2, sigma, grid, "add")
    from scipy.interpolate import CubicSpline

    second = np.where(
        loss <= eps, CubicSpline(grid, remove)(eps - loss), CubicSpline(grid, add)(eps - loss)
    )
    return float(np.sum(weight * r * second))


def quadrature_pair(n: int, sigma: float) -> tuple[np.ndarray, np.ndarray]:
    """Theorem 1's pair (plain shuffle, ``n = 2``) discretised by a tensor quadrature rule.

    Returns the likelihood ratios ``(W_1 + W_2)/2`` at the nodes of a composite Gauss-Legendre
    rule in both reports and their ``Q`` weights: a discrete pair whose hockey-stick curves
    approach the true ones as the rule is refined (the hinges make the error second order).
    """
    if n != 2:
        raise ValueError("n must be 2")
    a = 1.0 / sigma
    x, w = _normal_nodes(0, a, width=0.25)
    ratio = np.exp(a * x - a * a / 2.0)
    return ((ratio[:, None] + ratio[None, :]) / 2.0).ravel(), (w[:, None] * w[None, :]).ravel()
