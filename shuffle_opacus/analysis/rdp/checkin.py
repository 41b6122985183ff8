"""Rényi DP of the shuffled check-in Gaussian mechanism.

Liew & Takahashi, *Shuffle Gaussian Mechanism for Differential Privacy* (arXiv:2206.09569),
§4.2: each of ``n`` users checks in independently with probability ``rate`` (``gamma``), the
users who check in add Gaussian noise to their value, and the reports are shuffled. The number
of reports ``K ~ Bin(n, gamma)`` is public, so the Rényi moment is the ``K``-average of
Theorem 1's conditional moments. :func:`checkin_rdp` bounds it by one of
:data:`CHECKIN_METHODS`:

* ``exact``: the whole binomial average in closed form (Theorem 1's series with its excess
  moments scaled by ``gamma``, :func:`checkin_log_excess_exact`); no conjecture, no truncation;
* ``sum``: the paper's Eq. 17 summed, with the conditional rate ``k/n`` in place of ``gamma``
  and rigorous bounds on both tails of the binomial;
* ``theorem3``: the paper's Theorem 3 as written; it relies on the paper's Conjecture 1.

Derivations: docs/maths.md, "Shuffled check-in".
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np

from ...common.validation import MAX_ORDER, check_int, check_orders, check_probability, check_sigma
from ..approximate._binomial import binom_logcdf, binom_logpmf, binom_logsf
from .series import NEG_INF, log_gaussian_excess, lse, mixture_log_excess, shuffle_log_excess
from .subsampling import wang_log_excess

__all__ = ["checkin_rdp", "checkin_log_excess_exact", "CHECKIN_METHODS"]

CHECKIN_METHODS = ("exact", "sum", "theorem3")

_CHUNK_RATIO = 0.9


def _kl_bernoulli(p: float, q: float) -> float:
    """KL divergence between Bernoulli(p) and Bernoulli(q) in nats (``inf`` if unbounded)."""
    if (q >= 1.0 and p < 1.0) or (q <= 0.0 and p > 0.0):
        return math.inf
    out = 0.0
    if p > 0:
        out += p * math.log(p / q)
    if p < 1:
        out += (1 - p) * math.log((1 - p) / (1 - q))
    return out


def _log_binom_lower(k: int, n: int, rate: float) -> float:
    """Upper bound on ``log Pr[K <= k]`` for ``K ~ Bin(n, rate)``."""
    if k < 0:
        return NEG_INF
    if k >= n:
        return 0.0
    value = float(binom_logcdf(k, n, rate))
    if value > -700.0:
        return min(value, 0.0)
    if k < n * rate:  # Chernoff: Pr[K <= k] <= exp(-n KL(k/n || rate))
        return -n * _kl_bernoulli(k / n, rate)
    return 0.0


def _log_binom_upper(k: int, n: int, rate: float) -> float:
    """Upper bound on ``log Pr[K > k]`` for ``K ~ Bin(n, rate)``."""
    if k >= n:
        return NEG_INF
    if k < 0:
        return 0.0
    value = float(binom_logsf(k, n, rate))
    if value > -700.0:
        return min(value, 0.0)
    if k + 1 > n * rate:  # Chernoff: Pr[K >= k+1] <= exp(-n KL((k+1)/n || rate))
        return -n * _kl_bernoulli((k + 1) / n, rate)
    return 0.0


def _log_binom_range(lo: int, hi: int, n: int, rate: float) -> float:
    """Upper bound on ``log Pr[lo <= K <= hi]``."""
    if hi < lo:
        return NEG_INF
    # Pr[lo <= K <= hi] <= min(Pr[K <= hi], Pr[K >= lo]).
    return min(_log_binom_lower(hi, n, rate), _log_binom_upper(lo - 1, n, rate))


def _theorem3(
    n: int, rate: float, sigma: float, orders: np.ndarray, chernoff_delta: float
) -> np.ndarray:
    max_order = int(orders[-1])
    mean = n * rate
    # Exact rational arithmetic on the given floats: the paper assumes (1 - Delta) n gamma is an
    # integer; in general the first part is k <= floor((1 - Delta) n gamma).
    threshold = math.floor((1 - Fraction(chernoff_delta)) * n * Fraction(rate))
    m_big = min(n, threshold + 1)
    log_s1 = wang_log_excess(rate, log_gaussian_excess(sigma, max_order), orders)[0]
    log_s2 = wang_log_excess(rate, shuffle_log_excess(m_big, sigma, max_order), orders)[0]
    first = np.logaddexp(0.0, log_s1) - chernoff_delta**2 * mean / 2.0
    second = np.logaddexp(0.0, log_s2)
    return np.logaddexp(first, second) / (orders - 1.0)


def _lower_chunks(lo: int, max_order: int) -> list[tuple[int, int]]:
    """Chunks ``[a, b)`` covering ``[1, lo)``: geometric above ``max_order``, one chunk below."""
    chunks: list[tuple[int, int]] = []
    b = lo
    while b > 1:
        a = max(1, min(b - 1, int(math.floor(b * _CHUNK_RATIO))))
        if a < max_order:
            a = 1
        chunks.append((a, b))
        b = a
    return chunks


_BULK_BUDGET = 1.0e8  # series element operations allowed for the bulk of ``sum``


def _sum_bound(
    n: int, rate: float, sigma: float, orders: np.ndarray, tail_tolerance: float
) -> np.ndarray:
    """Log excess of ``sum_k Pr[K=k] M_k`` with Wang's bound in the bulk and rigorous tails."""
    max_order = int(orders[-1])
    mean = n * rate
    sd = math.sqrt(max(n * rate * (1.0 - rate), 1e-300))
    gauss = log_gaussian_excess(sigma, max_order)
    z = 6.0
    while True:
        lo = max(1, int(math.floor(mean - z * sd)))
        hi = min(n, int(math.ceil(mean + z * sd)))
        width = hi - lo + 1
        step = max(1, math.ceil(width * (max_order + 1) ** 2 / _BULK_BUDGET))
        starts = np.arange(lo, hi + 1, step)
        ends = np.minimum(starts + step, hi + 1)  # chunk [start, end)
        chunks = _lower_chunks(lo, max_order)
        chunk_starts = np.array([a for a, _ in chunks if a > 1], dtype=np.int64)
        needed = np.unique(np.concatenate([starts, chunk_starts, [hi]]))
        log_e = shuffle_log_excess(needed, sigma, max_order)
        index = {int(k): i for i, k in enumerate(needed)}

        ks = np.arange(lo, hi + 1)
        log_pmf = binom_logpmf(ks, n, rate)
        if step == 1:
            log_mass = log_pmf
        else:
            log_mass = np.array(
                [lse(log_pmf[a - lo : b - lo], axis=0) for a, b in zip(starts, ends, strict=True)]
            )
        rows = log_e[[index[int(a)] for a in starts]]
        bound = wang_log_excess((ends - 1) / n, rows, orders)
        bulk = lse(log_mass[:, None] + bound, axis=0)

        tail_terms = []
        for a, b in chunks:
            log_chunk = _log_binom_range(a, b - 1, n, rate)
            if log_chunk == NEG_INF:
                continue
            base = gauss if a == 1 else log_e[index[a]]
            tail_terms.append(log_chunk + mixture_log_excess((b - 1) / n, base, orders)[0])
        log_upper = _log_binom_upper(hi, n, rate)
        if log_upper > NEG_INF:
            tail_terms.append(log_upper + log_e[index[hi]][orders])
        if tail_terms:
            tails = lse(np.stack(tail_terms), axis=0)
        else:
            tails = np.full(orders.shape, NEG_INF)
        total = np.logaddexp(bulk, tails)
        covered = lo == 1 and hi == n
        with np.errstate(invalid="ignore"):
            fraction = np.where(total > NEG_INF, np.exp(tails - total), 0.0)
        if covered or np.nanmax(fraction) <= tail_tolerance:
            return total
        z *= 2.0


def checkin_log_excess_exact(*, n: int, rate: float, sigma: float, max_order: int) -> np.ndarray:
    """Log of ``E[(P/Q)^l] - 1`` for the shuffled check-in Gaussian, ``l = 0..max_order``.

    Exact average over the binomial number of participants (see the module docstring).

    Args:
        n: Number of users (integer >= 1).
        rate: Check-in probability in ``(0, 1]``.
        sigma: Noise std divided by the L2 distance of the differing user's inputs (> 0).
        max_order: Largest order (integer >= 2).

    Returns:
        Array of length ``max_order + 1``.

    Raises:
        ValueError: on an out-of-range argument.
    """
    n = check_int("n", n, minimum=1)
    rate = check_probability("rate", rate)
    sigma = check_sigma(sigma)
    max_order = check_int("max_order", max_order, minimum=2, maximum=MAX_ORDER)
    log_c = math.log(rate) + log_gaussian_excess(sigma, max_order)
    return shuffle_log_excess(n, sigma, max_order, log_c=log_c)


def checkin_rdp(
    *,
    n: int,
    rate: float,
    sigma: float,
    orders: np.ndarray | list[int],
    method: str = "exact",
    chernoff_delta: float = 0.5,
    tail_tolerance: float = 1e-6,
) -> np.ndarray:
    """Per-round RDP of the shuffled check-in Gaussian mechanism.

    Args:
        n: Number of users (integer >= 1).
        rate: Check-in probability ``gamma`` in ``(0, 1]``.
        sigma: Noise std divided by the L2 distance of the differing user's inputs (> 0).
        orders: Integer Rényi orders >= 2.
        method: ``"exact"`` (default, the tightest Rényi bound), ``"sum"`` or ``"theorem3"``;
            see the module docstring for what each assumes.
        chernoff_delta: ``Delta`` in ``[0, 1]`` of Theorem 3 (``theorem3`` only).
        tail_tolerance: Target share of the tail bounds in the total excess moment (``sum``
            only); a looser value is faster and still an upper bound.

    Returns:
        RDP upper bound of one round at each order of ``np.unique(orders)``.

    Raises:
        ValueError: on an out-of-range argument or unknown method.
    """
    n = check_int("n", n, minimum=1)
    rate = check_probability("rate", rate)
    sigma = check_sigma(sigma)
    orders_arr = check_orders(orders)
    if method not in CHECKIN_METHODS:
        raise ValueError(f"method must be one of {', '.join(CHECKIN_METHODS)}. Found {method!r}.")
    if not (0.0 <= float(chernoff_delta) <= 1.0):
        raise ValueError(f"chernoff_delta must be in [0, 1]. Found {chernoff_delta!r}.")
    if not (0.0 < float(tail_tolerance) < 1.0):
        raise ValueError(f"tail_tolerance must be in (0, 1). Found {tail_tolerance!r}.")
    if method == "theorem3":
        return _theorem3(n, rate, sigma, orders_arr, float(chernoff_delta))
    if method == "exact":
        total = checkin_log_excess_exact(
            n=n, rate=rate, sigma=sigma, max_order=int(orders_arr[-1])
        )[orders_arr]
    else:
        total = _sum_bound(n, rate, sigma, orders_arr, float(tail_tolerance))
    return np.logaddexp(0.0, total) / (orders_arr - 1.0)
