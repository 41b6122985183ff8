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
