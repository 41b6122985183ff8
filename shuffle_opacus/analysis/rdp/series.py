"""Log-space power series for the moments of the shuffle Gaussian mechanism.

Liew & Takahashi, *Shuffle Gaussian Mechanism for Differential Privacy* (arXiv:2206.09569),
Theorem 1: the Rényi moment ``A_n(m) = E[L_n^m]`` of ``n`` shuffled Gaussian reports is
``m! [x^m] h(x / n)^n`` with ``h(x) = sum_a mu_a x^a / a!`` and ``mu_a = exp(a(a-1) / (2
sigma^2))``. Everything here works with exponential generating functions, whose products are
binomial convolutions of non-negative terms (:func:`egf_log_conv`), in log space. Since
``A_n(m)`` is very close to 1 for large ``n``, every routine returns the log of the *excess*
``A_n(m) - 1`` (``-inf`` where it is zero), from recurrences with the ``sigma -> infinity``
baseline subtracted: :func:`shuffle_log_excess` chooses between the Miller recurrence
(:func:`shuffle_log_excess_miller`), binary exponentiation
(:func:`shuffle_log_excess_binexp`) and the sequential sums
(:func:`shuffle_log_excess_sequential`); :func:`log_gaussian_excess` gives ``mu_a - 1``.

Derivations: docs/maths.md, "Theorem 1 as a power of a power series".
"""

from __future__ import annotations

import numpy as np

__all__ = [
    "log_expm1",
    "log_factorials",
    "log_gaussian_excess",
    "egf_log_conv",
    "shuffle_log_excess",
    "shuffle_log_excess_miller",
    "shuffle_log_excess_binexp",
    "shuffle_log_excess_sequential",
]

NEG_INF = -np.inf


def lse(x: np.ndarray, axis: int) -> np.ndarray:
    """``log(sum(exp(x)))`` along ``axis``; ``-inf`` where every entry is ``-inf``."""
    peak = np.max(x, axis=axis, keepdims=True)
    peak = np.where(np.isfinite(peak), peak, 0.0)
    with np.errstate(divide="ignore"):
        return np.log(np.sum(np.exp(x - peak), axis=axis)) + np.squeeze(peak, axis=axis)


def log_expm1(s: np.ndarray | float) -> np.ndarray:
    """Return ``log(exp(s) - 1)`` for ``s >= 0`` without overflow or cancellation.

    Args:
        s: Non-negative exponent(s); ``s = 0`` maps to ``-inf``.

    Returns:
        An array of the same shape as ``s``.
    """
    s = np.asarray(s, dtype=float)
    out = np.full(s.shape, NEG_INF)
    big = s > 30.0
    small = (s > 0.0) & ~big
    out[big] = s[big] + np.log1p(-np.exp(-s[big]))
    out[small] = np.log(np.expm1(s[small]))
    return out


def log_factorials(max_order: int) -> np.ndarray:
    """Return ``log(m!)`` for ``m = 0..max_order``."""
    # Imported here: scipy.special costs 0.15 s to import, which the command line's mechanisms
    # without a series (the central Gaussian, say) should not pay.
    from scipy.special import gammaln

    return gammaln(np.arange(max_order + 1, dtype=float) + 1.0)


def log_gaussian_excess(sigma: float, max_order: int) -> np.ndarray:
    """Log of ``mu_a - 1 = exp(a(a-1)/(2 sigma^2)) - 1`` for ``a = 0..max_order``.

    This is the excess moment of one Gaussian report, the ``n = 1`` case of Theorem 1
    (Corollary 1 is attained with equality there).

    Args:
        sigma: Noise standard deviation divided by the L2 distance of the two inputs (> 0).
        max_order: Largest moment index.

    Returns:
        Array of length ``max_order + 1``; entries 0 and 1 are ``-inf``.
    """
    a = np.arange(max_order + 1, dtype=float)
    return log_expm1(a * (a - 1.0) / (2.0 * sigma**2))


def egf_log_conv(log_f: np.ndarray, log_g: np.ndarray) -> np.ndarray:
    """Binomial convolution of two EGF coefficient sequences given in log space.

    Computes ``log sum_j C(m, j) F_j G_{m-j}`` for ``m = 0..L`` where ``L + 1`` is the length
    of the inputs. All terms are non-negative, so the result has full relative precision.

    Args:
        log_f: ``log F_j``, shape ``(L + 1,)`` (``-inf`` for zero coefficients).
        log_g: ``log G_j``, same shape.

    Returns:
        ``log (F*G)_m`` for ``m = 0..L``.
    """
    size = log_f.shape[0]
    lf = log_factorials(size - 1)
    a = np.concatenate([log_f - lf, [NEG_INF]])  # slot `size` is -inf
    b = log_g - lf
    j = np.arange(size)
    out = np.empty(size)
    step = max(1, 4_000_000 // size)  # bound the work array to ~32 MB
    for m0 in range(0, size, step):
        m = np.arange(m0, min(size, m0 + step))
        diff = m[:, None] - j[None, :]
        diff = np.where(diff >= 0, diff, size)
        out[m] = lse(a[diff] + b[None, :], axis=1)
    return out + lf


def _log_exp_series(log_base: float, size: int) -> np.ndarray:
    """EGF coefficients of ``exp(b x)`` in log space: ``m log b``."""
    m = np.arange(size, dtype=float)
    out = m * log_base
    out[0] = 0.0
    return out


def _excess_product(
    left: tuple[float, np.ndarray], right: tuple[float, np.ndarray]
) -> tuple[float, np.ndarray]:
    """Multiply two series of the form ``exp(b x) + X(x)`` with ``X >= 0`` coefficientwise.

    ``(e^{b1 x} + X1)(e^{b2 x} + X2) = e^{(b1+b2) x} + [e^{b1 x} X2 + e^{b2 x} X1 + X1 X2]``,
    so the excess of the product is a sum of three non-negative convolutions.
    """
    b1, x1 = left
    b2, x2 = right
    size = x1.shape[0]
    parts = [
        egf_log_conv(_log_exp_series(np.log(b1), size), x2),
        egf_log_conv(_log_exp_series(np.log(b2), size), x1),
        egf_log_conv(x1, x2),
    ]
    return b1 + b2, lse(np.stack(parts), axis=0)


def shuffle_log_excess_binexp(n: int, log_c: np.ndarray, max_order: int) -> np.ndarray:
    """``log E_n(m)`` for ``m = 0..max_order`` by binary exponentiation of ``h(x)``.

    Works for every ``n >= 1``; costs ``O(log n)`` convolutions of length ``max_order + 1``.
    Used when ``n < max_order``, where the Miller recurrence would have negative terms.

    Args:
        n: Number of shuffled users (>= 1).
        log_c: ``log(E[W^a] - 1)`` of one report's likelihood-ratio factor ``W`` (``E[W] = 1``),
            ``a = 0..max_order``; :func:`log_gaussian_excess` for the shuffle Gaussian.
        max_order: Largest moment index.

    Returns:
        Array of length ``max_order + 1`` with ``log(A_n(m) - 1)``.
    """
    base = (1.0, np.asarray(log_c[: max_order + 1], dtype=float))
    result: tuple[float, np.ndarray] | None = None
    power = base
    k = int(n)
    while k:
        if k & 1:
            result = power if result is None else _excess_product(result, power)
        k >>= 1
        if k:
            power = _excess_product(power, power)
    assert result is not None  # n >= 1 guarantees one factor
    total, log_x = result
    # Unnormalised moments of S_n = Y_1 + ... + Y_n are n^m + X_m; divide by n^m.
    return log_x - np.arange(max_order + 1) * np.log(total)


def shuffle_log_excess_sequential(max_n: int, log_c: np.ndarray, max_order: int) -> np.ndarray:
    """``log E_k(m)`` for every ``k = 1..max_n`` by adding one user at a time.

    ``S_k = S_{k-1} + Y_k`` gives ``X^{(k)} = e^{(k-1)x} C + X^{(k-1)} M`` where ``C`` and ``M``
    are the EGFs of ``mu_a - 1`` and ``mu_a``. Cheaper than repeated binary exponentiation
    when all small ``k`` are needed (check-in tails with few participants).

    Args:
        max_n: Largest number of users (>= 1).
        log_c: ``log(E[W^a] - 1)`` of one report's factor, ``a = 0..max_order``.
        max_order: Largest moment index.

    Returns:
        Array of shape ``(max_n, max_order + 1)``; row ``k - 1`` holds ``log E_k(m)``.
    """
    size = max_order + 1
    log_c = np.asarray(log_c[:size], dtype=float)
    log_mu = np.logaddexp(0.0, log_c)
    out = np.empty((max_n, size))
    log_x = log_c.copy()  # k = 1: X = C
    out[0] = log_x
    m = np.arange(size, dtype=float)
    for k in range(2, max_n + 1):
        part_a = egf_log_conv(_log_exp_series(np.log(k - 1.0), size), log_c)
        part_b = egf_log_conv(log_x, log_mu)
        log_x = np.logaddexp(part_a, part_b)
        out[k - 1] = log_x - m * np.log(k)
    return out


def shuffle_log_excess_miller(ns: np.ndarray, log_c: np.ndarray, max_order: int) -> np.ndarray:
    """``log E_n(m)`` for several ``n >= max_order`` at once (J.C.P. Miller recurrence).

    For ``P = F^n`` with ``F_0 = 1`` the EGF form of Miller's recurrence is
    ``P_m = (1/m) sum_{k=1..m} ((n+1)k - m) C(m,k) F_k P_{m-k}``; with ``F_k = mu_k / n^k`` and
    the ``sigma = inf`` baseline subtracted it becomes

        E_m = (1/m) sum_k ((n+1)k - m) C(m,k) n^{-k} [c_k + E_{m-k} + c_k E_{m-k}],

    ``c_k = mu_k - 1``. Every term is non-negative when ``n + 1 > m``.

    Args:
        ns: 1-D integer array of user counts, each ``>= max_order``.
        log_c: ``log(E[W^a] - 1)`` of one report's factor, ``a = 0..max_order``.
        max_order: Largest moment index.

    Returns:
        Array of shape ``(len(ns), max_order + 1)``.
    """
    ns = np.asarray(ns, dtype=float)
    if np.any(ns < max_order):
        raise ValueError(f"Miller recurrence needs n >= max_order={max_order}. Found {ns.min()}.")
    size = max_order + 1
    count = ns.shape[0]
    log_c = np.asarray(log_c[:size], dtype=float)
    lf = log_factorials(max_order)
    log_n = np.log(ns)[:, None]
    n_plus_1 = ns[:, None] + 1.0
    # Stored in reverse order of m so that E_{m-k}, k = 1..m, is a contiguous slice.
    rev_e = np.full((count, size), NEG_INF)  # rev_e[:, size-1-i] = log E_i
    rev_p = np.zeros((count, size))  # log(1 + E_i), same layout
    for m in range(2, size):
        k = np.arange(1, m + 1, dtype=float)
        log_weight = (
            np.log(n_plus_1 * k[None, :] - m)
            + (lf[m] - np.log(m) - lf[1 : m + 1] - lf[m - 1 :: -1][:m])[None, :]
            - k[None, :] * log_n
        )
        start = size - m  # position of E_{m-1}
        prev_e = rev_e[:, start : start + m]
        prev_p = rev_p[:, start : start + m]
        # (1 + c_k)(1 + E_{m-k}) - 1 = c_k (1 + E_{m-k}) + E_{m-k}
        inner = np.logaddexp(log_c[1 : m + 1][None, :] + prev_p, prev_e)
        value = lse(log_weight + inner, axis=1)
        rev_e[:, size - 1 - m] = value
        rev_p[:, size - 1 - m] = np.logaddexp(0.0, value)
    log_e = rev_e[:, ::-1].copy()
    return log_e


def shuffle_log_excess(
    ns: np.ndarray | int, sigma: float, max_order: int, *, log_c: np.ndarray | None = None
) -> np.ndarray:
    """``log(A_n(m) - 1)`` of Theorem 1 for each ``n`` in ``ns`` and ``m = 0..max_order``.

    Chooses the Miller recurrence for ``n >= max_order`` (vectorised over ``n``), a single
    sequential pass when several ``n < max_order`` are requested, and binary exponentiation
    for one small ``n``.

    Args:
        ns: Integer or 1-D array of user counts (each >= 1).
        sigma: Noise standard deviation divided by the L2 distance of the two inputs (> 0).
        max_order: Largest moment index (>= 1).
        log_c: Optional one-report excess moments ``log(E[W^a] - 1)`` replacing the Gaussian
            ones (``sigma`` is then ignored); the result is then the excess moment of the mean
            of ``n`` independent copies of ``W``.

    Returns:
        Array of shape ``(len(ns), max_order + 1)`` (or ``(max_order + 1,)`` for scalar ``ns``).
    """
    if log_c is None:
        log_c = log_gaussian_excess(sigma, max_order)
    scalar = np.ndim(ns) == 0
    ns_arr = np.atleast_1d(np.asarray(ns, dtype=np.int64))
    out = np.full((ns_arr.shape[0], max_order + 1), NEG_INF)
    big = ns_arr >= max_order
    if big.any():
        out[big] = shuffle_log_excess_miller(ns_arr[big], log_c, max_order)
    small_idx = np.flatnonzero(~big)
    if small_idx.size == 1:
        i = small_idx[0]
        out[i] = shuffle_log_excess_binexp(int(ns_arr[i]), log_c, max_order)
    elif small_idx.size > 1:
        table = shuffle_log_excess_sequential(int(ns_arr[small_idx].max()), log_c, max_order)
        out[small_idx] = table[ns_arr[small_idx] - 1]
    return out[0] if scalar else out


def egf_log_conv_at(
    log_f: np.ndarray, log_g: np.ndarray, orders: np.ndarray, *, block_elements: int = 4_000_000
) -> np.ndarray:
    """Row-wise binomial convolution ``log sum_j C(l, j) F_{l-j} G_j`` at selected ``l``.

    Args:
        log_f: ``(R, S)`` or ``(S,)`` array of ``log F`` (broadcast against ``log_g``).
        log_g: ``(R, S)`` or ``(S,)`` array of ``log G``.
        orders: Integer indices ``l`` (each ``< S``) at which to evaluate.
        block_elements: Memory cap for the ``(rows, orders, S)`` work array.

    Returns:
        ``(R, len(orders))`` array (``R = 1`` when both inputs are 1-D).
    """
    log_f = np.atleast_2d(log_f)
    log_g = np.atleast_2d(log_g)
    rows = max(log_f.shape[0], log_g.shape[0])
    log_f = np.broadcast_to(log_f, (rows, log_f.shape[1]))
    log_g = np.broadcast_to(log_g, (rows, log_g.shape[1]))
    size = log_f.shape[1]
    orders = np.asarray(orders, dtype=np.int64)
    lf = log_factorials(size - 1)
    a = log_f - lf  # F_i / i!
    b = log_g - lf  # G_j / j!
    a = np.concatenate([a, np.full((rows, 1), NEG_INF)], axis=1)  # slot `size` is -inf
    j = np.arange(size)
    out = np.empty((rows, orders.shape[0]))
    # Block over orders and rows so that no work array exceeds ``block_elements``.
    order_step = max(1, min(orders.shape[0], block_elements // size))
    row_step = max(1, block_elements // (order_step * size))
    for o0 in range(0, orders.shape[0], order_step):
        cols = slice(o0, min(orders.shape[0], o0 + order_step))
        idx = orders[cols, None] - j[None, :]  # index l - j
        idx = np.where(idx >= 0, idx, size)
        for r0 in range(0, rows, row_step):
            sl = slice(r0, min(rows, r0 + row_step))
            out[sl, cols] = lse(a[sl][:, idx] + b[sl][:, None, :], axis=2)
    return out + lf[orders][None, :]


def mixture_log_excess(
    rates: np.ndarray | float, log_excess: np.ndarray, orders: np.ndarray
) -> np.ndarray:
    """Excess moment of a mixture likelihood ratio ``(1 - q) + q L`` with ``E[L] = 1``.

    ``E[((1-q) + qL)^l] - 1 = sum_{j>=2} C(l, j) (1-q)^{l-j} q^j (E[L^j] - 1)`` because the
    binomial weights sum to one; every term is non-negative. This is the exact moment of a
    subsampled mechanism whose "absent" branch equals the reference distribution (Mironov,
    Talwar & Zhang 2019, Sec. 3.3 for the Gaussian case).

    Args:
        rates: Mixture weight(s) ``q`` in ``[0, 1]``, shape ``(R,)`` or scalar.
        log_excess: ``log(E[L^j] - 1)``, shape ``(R, S)`` or ``(S,)``.
        orders: Integer orders ``l`` (each ``< S``).

    Returns:
        ``(R, len(orders))`` array of ``log(E[((1-q)+qL)^l] - 1)``.
    """
    rates = np.atleast_1d(np.asarray(rates, dtype=float))
    log_excess = np.atleast_2d(log_excess)
    size = log_excess.shape[1]
    j = np.arange(size, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        log_q = np.log(rates)[:, None]
        log_1mq = np.log1p(-rates)[:, None]
        left = np.where(j[None, :] == 0, 0.0, j[None, :] * log_1mq)
        right = np.where(j[None, :] == 0, NEG_INF, j[None, :] * log_q + log_excess)
    right = np.where(np.isnan(right), NEG_INF, right)
    left = np.where(np.isnan(left), NEG_INF, left)
    return egf_log_conv_at(left, right, orders)
