"""Rényi DP of the shuffle Gaussian mechanism (Liew & Takahashi, Theorem 1 and Corollary 1).

Conventions shared by every function here:

* ``sigma`` is the paper's sigma: the standard deviation of each user's Gaussian noise divided
  by the L2 distance between the differing user's two possible inputs. Theorem 1 is stated for
  inputs 0 and 1, so with clipping norm ``C`` and replace-one adjacency (two clipped vectors can
  be ``2C`` apart) a local noise standard deviation ``s`` gives ``sigma = s / (2C)``.
* Neighbouring pair: ``n`` users, all holding the same value, one of whom switches to a value
  at distance 1 (the proof of Theorem 1 fixes ``D = (0, ..., 0)`` and ``D' = (1, 0, ..., 0)``).
  That this pair is the worst case is an assumption of the paper; ``docs/maths.md`` reports the
  numerical evidence we collected for it.
* Divergence direction: ``D_lambda(M(D') || M(D))``, the expectation taken under ``M(D)``
  (the paper's Eq. 8).
* Orders are integers ``>= 2``; results are per single use of the mechanism. RDP composes
  additively (Lemma 1), so ``steps`` uses cost ``steps * rdp``.
"""

from __future__ import annotations

import numpy as np

from ...common.validation import MAX_ORDER, check_int, check_orders, check_sigma
from .series import shuffle_log_excess

__all__ = ["shuffle_gaussian_rdp", "no_shuffle_rdp", "shuffle_gaussian_log_excess"]


def shuffle_gaussian_log_excess(*, n: int, sigma: float, max_order: int) -> np.ndarray:
    """Log of ``A_n(m) - 1`` where ``A_n(m)`` is the Theorem 1 moment ``E[L_n^m]``.

    ``A_n(m) = e^{-m/2sigma^2} n^{-m} sum_{k_1+..+k_n=m} C(m; k) e^{sum k_i^2 / 2sigma^2}``,
    evaluated as ``m! [x^m] h(x/n)^n`` (see :mod:`shuffle_opacus.analysis.rdp.series`), so that
    ``(m - 1) * rdp(m) = log1p(A_n(m) - 1)``.

    Args:
        n: Number of shuffled users (integer >= 1).
        sigma: Noise std divided by the L2 distance of the differing user's inputs (> 0).
        max_order: Largest order (integer >= 2).

    Returns:
        Array of length ``max_order + 1`` indexed by the order ``m``.

    Raises:
        ValueError: on an out-of-range argument.
    """
    n = check_int("n", n, minimum=1)
    sigma = check_sigma(sigma)
    max_order = check_int("max_order", max_order, minimum=2, maximum=MAX_ORDER)
    return shuffle_log_excess(n, sigma, max_order)


def shuffle_gaussian_rdp(*, n: int, sigma: float, orders: np.ndarray | list[int]) -> np.ndarray:
    """Shuffle Gaussian RDP of Theorem 1 (Liew & Takahashi) at integer orders.

    ``eps(lambda) = log(A_n(lambda)) / (lambda - 1)`` with ``A_n`` the multinomial sum of
    Theorem 1, computed exactly (no partition enumeration) in ``O(max_order^2)`` for
    ``n >= max_order`` and ``O(max_order^2 log n)`` otherwise. ``n = 1`` gives
    ``lambda / (2 sigma^2)`` exactly; ``lambda = 2`` gives
    ``log(1 + (e^{1/sigma^2} - 1)/n)``.

    Args:
        n: Number of users whose reports are shuffled together (integer >= 1).
        sigma: Noise std divided by the L2 distance of the differing user's inputs (> 0).
        orders: Integer Rényi orders >= 2.

    Returns:
        RDP of one use of the mechanism at each order, same order as ``np.unique(orders)``.

    Raises:
        ValueError: on an out-of-range argument.
    """
    orders_arr = check_orders(orders)
    log_e = shuffle_gaussian_log_excess(n=n, sigma=sigma, max_order=int(orders_arr[-1]))
    return np.logaddexp(0.0, log_e[orders_arr]) / (orders_arr - 1.0)


def no_shuffle_rdp(*, sigma: float, orders: np.ndarray | list[int]) -> np.ndarray:
    """Corollary 1 of Liew & Takahashi: the shuffle Gaussian RDP is at most ``lambda/(2 sigma^2)``.

    This is the RDP of the plain Gaussian mechanism (Mironov 2017, Proposition 7) for one
    user's report, i.e. what one gets with no amplification by shuffling.

    Args:
        sigma: Noise std divided by the L2 distance of the differing user's inputs (> 0).
        orders: Rényi orders (> 1; integers in this package).

    Returns:
        ``orders / (2 sigma^2)``.

    Raises:
        ValueError: on an out-of-range argument.
    """
    sigma = check_sigma(sigma)
    orders_arr = check_orders(orders)
    return orders_arr / (2.0 * sigma**2)
