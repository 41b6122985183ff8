"""Central-DP references: the Gaussian and the Poisson-subsampled Gaussian mechanisms.

A shuffler's output determines the sum of the reports, so any shuffle guarantee can be no
better than the central mechanism that releases the sum with the same aggregate noise. These
functions give that floor. Here ``sigma`` is the aggregate noise standard deviation divided by
the L2 sensitivity of the sum (for ``k`` local reports with paper-sigma ``s`` each, the sum
carries ``sigma = s * sqrt(k)``).

The Poisson-subsampled Gaussian RDP is the exact integer-order expression of Mironov, Talwar &
Zhang (2019), Sec. 3.3, for the pair ``((1-q) N(0, s^2) + q N(1, s^2), N(0, s^2))``,

    (l - 1) eps(l) = log sum_{j=0..l} C(l, j) (1-q)^{l-j} q^j exp(j(j-1) / (2 s^2)),

which is also what Opacus's ``compute_rdp`` evaluates at integer orders.
"""

from __future__ import annotations

import numpy as np

from ...common.validation import check_orders, check_probability, check_sigma
from .series import log_gaussian_excess, mixture_log_excess

__all__ = ["gaussian_rdp", "poisson_subsampled_gaussian_rdp"]


def gaussian_rdp(*, sigma: float, orders: np.ndarray | list[int]) -> np.ndarray:
    """RDP of the Gaussian mechanism, ``lambda / (2 sigma^2)`` (Mironov 2017, Proposition 7).

    Args:
        sigma: Noise standard deviation divided by the L2 sensitivity (> 0).
        orders: Integer Rényi orders >= 2.

    Returns:
        RDP at each order of ``np.unique(orders)``.

    Raises:
        ValueError: on an out-of-range argument.
    """
    sigma = check_sigma(sigma)
    orders_arr = check_orders(orders)
    return orders_arr / (2.0 * sigma**2)


def poisson_subsampled_gaussian_rdp(
    *, rate: float, sigma: float, orders: np.ndarray | list[int]
) -> np.ndarray:
    """RDP of the Poisson-subsampled Gaussian mechanism at integer orders (exact).

    Args:
        rate: Poisson sampling rate ``q`` in ``(0, 1]``.
        sigma: Noise standard deviation divided by the L2 sensitivity (> 0).
        orders: Integer Rényi orders >= 2.

    Returns:
        Per-step RDP at each order of ``np.unique(orders)``.

    Raises:
        ValueError: on an out-of-range argument.
    """
    rate = check_probability("rate", rate)
    sigma = check_sigma(sigma)
    orders_arr = check_orders(orders)
    log_e = log_gaussian_excess(sigma, int(orders_arr[-1]))
    log_s = mixture_log_excess(rate, log_e, orders_arr)[0]
    return np.logaddexp(0.0, log_s) / (orders_arr - 1.0)
