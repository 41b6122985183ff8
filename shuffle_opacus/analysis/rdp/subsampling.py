"""Subsampled shuffle Gaussian RDP (Liew & Takahashi, Theorem 2).

``m`` of ``n`` users are drawn uniformly without replacement each round; the drawn users add
Gaussian noise and their reports are shuffled. Theorem 2 applies the general bound for
subsampling without replacement of Wang, Balle & Kasiviswanathan (AISTATS 2019, Theorem 9;
replace-one adjacency) to the shuffle Gaussian RDP of Theorem 1 with ``m`` users, using
``eps(inf) = inf`` so that the ``min{2, (e^{eps(inf)} - 1)^j}`` factors equal 2:

    eps(l) <= log(1 + g^2 C(l,2) min{4(e^{eps_m(2)} - 1), 2 e^{eps_m(2)}}
                    + sum_{j=3..l} 2 g^j C(l,j) e^{(j-1) eps_m(j)}) / (l - 1),   g = m / n.

``sigma`` is the paper's sigma (noise std divided by the L2 distance of the differing user's two
inputs); the neighbouring pair and divergence direction are those of Theorem 1.
"""

from __future__ import annotations

import numpy as np
from scipy.special import gammaln

from ...common.validation import check_int, check_orders, check_probability, check_sigma
from .series import NEG_INF, egf_log_conv_at, log_gaussian_excess, shuffle_log_excess

__all__ = ["subsampled_shuffle_rdp", "subsampled_gaussian_rdp", "wang_log_excess"]


def wang_log_excess(
    rates: np.ndarray | float, log_excess: np.ndarray, orders: np.ndarray
) -> np.ndarray:
    """Log of the sum ``S(l)`` in Wang et al. (2019) Theorem 9 with ``eps(inf) = inf``.

    The bound reads ``(l - 1) eps'(l) <= log(1 + S(l))``. The base mechanism enters through its
    excess moments ``E_j = e^{(j-1) eps(j)} - 1`` (``j = 0..max_order``).

    Args:
        rates: Sampling rate(s) ``g = m / n`` in ``(0, 1]``, scalar or shape ``(R,)``.
        log_excess: ``log E_j``, shape ``(S,)`` or ``(R, S)``.
        orders: Integer orders ``l >= 2`` (each ``< S``).

    Returns:
        ``(R, len(orders))`` array of ``log S(l)``.
    """
    rates = np.atleast_1d(np.asarray(rates, dtype=float))
    log_excess = np.atleast_2d(log_excess)
    rows = max(rates.shape[0], log_excess.shape[0])
    log_excess = np.broadcast_to(log_excess, (rows, log_excess.shape[1]))
    rates = np.broadcast_to(rates, (rows,))
    size = log_excess.shape[1]
    orders = np.asarray(orders, dtype=np.int64)
    j = np.arange(size, dtype=float)
    log_g = np.log(rates)[:, None]
    # j >= 3 terms: 2 g^j e^{(j-1) eps(j)} = 2 g^j (1 + E_j), convolved with all-ones weights.
    right = np.log(2.0) + j[None, :] * log_g + np.logaddexp(0.0, log_excess)
    right[:, :3] = NEG_INF
    tail = egf_log_conv_at(np.zeros(size), right, orders)
    # j = 2 term: g^2 C(l, 2) min{4 E_2, 2 (1 + E_2)}.
    log_e2 = log_excess[:, 2]
    log_min = np.minimum(np.log(4.0) + log_e2, np.log(2.0) + np.logaddexp(0.0, log_e2))
    log_c2 = gammaln(orders + 1.0) - gammaln(orders - 1.0) - np.log(2.0)
    head = 2.0 * log_g + log_min[:, None] + log_c2[None, :]
    return np.logaddexp(head, tail)


def subsampled_shuffle_rdp(
    *, n: int, m: int, sigma: float, orders: np.ndarray | list[int]
) -> np.ndarray:
    """RDP of the subsampled shuffle Gaussian mechanism, Theorem 2 of Liew & Takahashi.

    Args:
        n: Population size (integer >= 1).
        m: Users drawn uniformly without replacement per round (integer in ``[1, n]``).
        sigma: Noise std divided by the L2 distance of the differing user's inputs (> 0).
        orders: Integer Rényi orders >= 2.

    Returns:
        Per-round RDP upper bound at each order of ``np.unique(orders)``.

    Raises:
        ValueError: on an out-of-range argument (for example ``m > n``).
    """
    n = check_int("n", n, minimum=1)
    m = check_int("m", m, minimum=1, maximum=n)
    sigma = check_sigma(sigma)
    orders_arr = check_orders(orders)
    log_e = shuffle_log_excess(m, sigma, int(orders_arr[-1]))
    log_s = wang_log_excess(m / n, log_e, orders_arr)[0]
    return np.logaddexp(0.0, log_s) / (orders_arr - 1.0)


def subsampled_gaussian_rdp(
    *, rate: float, sigma: float, orders: np.ndarray | list[int]
) -> np.ndarray:
    """Wang et al. (Theorem 9) bound for the Gaussian run on ``m = rate * n`` of ``n`` users.

    The same subsampling-without-replacement bound as :func:`subsampled_shuffle_rdp`, applied
    to the plain Gaussian (``(j - 1) eps(j) = j (j - 1) / (2 sigma^2)``) instead of the shuffle:
    the ``no-shuffle`` reference of the subsampled protocol (Corollary 1 in place of
    Theorem 1) and, with the noise of the sum, its ``central`` reference.

    Args:
        rate: Sampling ratio ``m / n`` in ``(0, 1]``.
        sigma: Noise std divided by the L2 distance of the differing user's inputs (> 0).
        orders: Integer Rényi orders >= 2.

    Returns:
        Per-round RDP upper bound at each order of ``np.unique(orders)``.

    Raises:
        ValueError: on an out-of-range argument.
    """
    rate = check_probability("rate", rate)
    sigma = check_sigma(sigma)
    orders_arr = check_orders(orders)
    log_e = log_gaussian_excess(sigma, int(orders_arr[-1]))
    log_s = wang_log_excess(rate, log_e, orders_arr)[0]
    return np.logaddexp(0.0, log_s) / (orders_arr - 1.0)
