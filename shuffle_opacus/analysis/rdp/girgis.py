"""RDP of the shuffle model for eps0-LDP randomizers (Girgis et al., CCS 2021, Theorem 3.1).

Girgis, Data, Diggavi, Suresh & Kairouz, *On the Rényi Differential Privacy of the Shuffle
Model* (CCS 2021, arXiv:2105.05180): ``n`` users apply the same ``eps0``-LDP randomizer with a
*discrete* output set and only the shuffled reports are released; replace-one neighbours, the
bound holding in both directions. :func:`girgis_rdp` is Theorem 3.1 (Upper Bound 1) at integer
orders ``l >= 2`` only (real orders are refused), with :func:`girgis_nbar` its ``nbar``; every
value is capped at ``eps0``. :func:`girgis_subsampled_rdp` is the subsampled shuffle (``m =
rate * n`` users drawn without replacement): Wang, Balle & Kasiviswanathan's Theorem 9 applied
to Theorem 3.1, capped at ``log(1 + rate (e^{eps0} - 1))``. It is *not* the direct
subsampled-shuffle bound of Girgis, Data & Diggavi (NeurIPS 2021), which is not implemented.
:func:`girgis_epsilon` converts to ``(eps, delta)``.

Formulas, caps and why they hold: docs/maths.md, "Girgis et al. RDP".
"""

from __future__ import annotations

import math

import numpy as np
from scipy.special import gammaln

from ...common.validation import (
    check_delta,
    check_int,
    check_nonnegative,
    check_orders,
    check_probability,
)
from .conversion import rdp_to_dp
from .series import NEG_INF, egf_log_conv_at, log_expm1, lse

__all__ = [
    "DEFAULT_GIRGIS_ORDERS",
    "girgis_epsilon",
    "girgis_nbar",
    "girgis_rdp",
    "girgis_subsampled_rdp",
]

DEFAULT_GIRGIS_ORDERS = np.arange(2, 257)
DEFAULT_GIRGIS_ORDERS.setflags(write=False)
"""Orders ``2..256`` used by :func:`girgis_epsilon` when none are given."""

_RATE_TOL = 1e-9


def girgis_nbar(n: int, eps0: float) -> int:
    """``nbar = floor((n - 1) / (2 e^{eps0})) + 1`` of Theorem 3.1.

    Args:
        n: Number of shuffled users (integer >= 1).
        eps0: Local privacy parameter (finite, >= 0).

    Returns:
        ``nbar`` (an integer >= 1).

    Raises:
        ValueError: on an out-of-range argument.
    """
    n = check_int("n", n, minimum=1)
    eps0 = check_nonnegative("eps0", eps0)
    return math.floor(0.5 * (n - 1) * math.exp(-eps0)) + 1


def _log_excess(n: int, eps0: float, orders: np.ndarray) -> np.ndarray:
    """``log S(l)`` where Theorem 3.1 reads ``(l - 1) eps(l) <= log(1 + S(l))``."""
    nbar = girgis_nbar(n, eps0)
    lam = orders.astype(float)
    log_nbar = math.log(nbar)
    log_c2 = gammaln(lam + 1.0) - gammaln(lam - 1.0) - math.log(2.0)
    # C(l,2) (e^{eps0} - 1)^2 / (nbar e^{eps0}); log_expm1(0) = -inf, so eps0 = 0 is exact.
    first = log_c2 + 2.0 * float(log_expm1(eps0)) - log_nbar - eps0
    # sum_{i=3..l} C(l,i) i Gamma(i/2) x^{i/2}, x = (e^{2 eps0} - 1)^2 / (2 e^{2 eps0} nbar).
    log_x = 2.0 * float(log_expm1(2.0 * eps0)) - math.log(2.0) - 2.0 * eps0 - log_nbar
    size = int(orders[-1]) + 1
    i = np.arange(3, size, dtype=float)
    terms = np.full(size, NEG_INF)
    terms[3:] = np.log(i) + gammaln(0.5 * i) + 0.5 * i * log_x
    middle = egf_log_conv_at(np.zeros(size), terms, orders)[0]
    # e^{eps0 l - (n - 1) / (8 e^{eps0})}
    last = eps0 * lam - 0.125 * (n - 1) * math.exp(-eps0)
    return lse(np.stack([first, middle, last]), axis=0)


def girgis_rdp(*, n: int, eps0: float, orders: np.ndarray | list[int]) -> np.ndarray:
    """RDP of ``n`` shuffled ``eps0``-LDP reports, Theorem 3.1 of Girgis et al. (CCS 2021).

    Replace-one neighbours; the bound holds in both directions of the divergence. Valid for
    discrete local randomizers and integer orders ``l >= 2`` (formula: docs/maths.md, "Girgis
    et al. RDP"); each value is capped at ``eps0`` (post-processing of ``eps0``-DP reports).

    Args:
        n: Number of shuffled users (integer >= 1).
        eps0: Local privacy parameter of each report (finite, >= 0).
        orders: Integer Rényi orders >= 2.

    Returns:
        Per-round RDP upper bound at each order of ``np.unique(orders)``.

    Raises:
        ValueError: on an out-of-range argument (for example a non-integer order).
    """
    n = check_int("n", n, minimum=1)
    eps0 = check_nonnegative("eps0", eps0)
    orders_arr = check_orders(orders)
    bound = np.logaddexp(0.0, _log_excess(n, eps0, orders_arr)) / (orders_arr - 1.0)
    return np.minimum(bound, eps0)


def _sample_size(n: int, rate: float) -> int:
    """``m = rate * n`` as an integer in ``[1, n]``, allowing for float rounding of ``rate``."""
    exact = rate * n
    m = round(exact)
    if m < 1 or abs(exact - m) > _RATE_TOL * max(1.0, exact):
        raise ValueError(
            f"rate must make rate * n an integer >= 1 (the sample size). "
            f"Found rate={rate!r} with n={n}, rate * n={exact!r}."
        )
    return int(m)


def _pure_subsampled(eps0: float, gamma: float) -> float:
    """``log(1 + g (e^{eps0} - 1))``, as ``eps0 + log(g + (1 - g) e^{-eps0})`` past overflow."""
    if eps0 < 700.0:
        return math.log1p(gamma * math.expm1(eps0))
    return eps0 + math.log(gamma + (1.0 - gamma) * math.exp(-eps0))


def girgis_subsampled_rdp(
    *, n: int, eps0: float, rate: float, orders: np.ndarray | list[int]
) -> np.ndarray:
    """RDP of the subsampled shuffle: Wang et al. (2019) Theorem 9 over Theorem 3.1.

    Each round ``m = rate * n`` of the ``n`` users are drawn uniformly without replacement
    (a fixed-size sample) and their ``eps0``-LDP reports are shuffled. Replace-one neighbours;
    the bound holds in both directions. Formula and caps: docs/maths.md, "Girgis et al. RDP".

    Args:
        n: Population size (integer >= 1).
        eps0: Local privacy parameter of each report (finite, >= 0).
        rate: Sampling rate in ``(0, 1]``; ``rate * n`` must be an integer (up to a relative
            rounding tolerance of 1e-9), the sample size ``m >= 1``.
        orders: Integer Rényi orders >= 2.

    Returns:
        Per-round RDP upper bound at each order of ``np.unique(orders)``.

    Raises:
        ValueError: on an out-of-range argument (for example ``rate * n`` not an integer).
    """
    n = check_int("n", n, minimum=1)
    eps0 = check_nonnegative("eps0", eps0)
    rate = check_probability("rate", rate)
    orders_arr = check_orders(orders)
    m = _sample_size(n, rate)
    gamma = m / n
    size = int(orders_arr[-1]) + 1
    # Base RDP eps(j) of the m-user shuffle for j = 0..L (entries 0 and 1 unused).
    base = np.zeros(size)
    base[2:] = girgis_rdp(n=m, eps0=eps0, orders=np.arange(2, size))
    j = np.arange(size, dtype=float)
    log_g = math.log(gamma)
    # log min{2, (e^{eps0} - 1)^j} for j >= 1 (j = 0 is unused; kept finite).
    log_min = np.zeros(size)
    log_min[1:] = np.minimum(math.log(2.0), j[1:] * float(log_expm1(eps0)))
    # j = 2: g^2 C(l,2) min{4 (e^{eps(2)} - 1), e^{eps(2)} min{2, (e^{eps0} - 1)^2}}.
    eps2 = float(base[2])
    log_two = min(math.log(4.0) + float(log_expm1(eps2)), eps2 + float(log_min[2]))
    lam = orders_arr.astype(float)
    log_c2 = gammaln(lam + 1.0) - gammaln(lam - 1.0) - math.log(2.0)
    head = 2.0 * log_g + log_two + log_c2
    # j >= 3: g^j C(l,j) e^{(j-1) eps(j)} min{2, (e^{eps0} - 1)^j}.
    terms = j * log_g + (j - 1.0) * base + log_min
    terms[:3] = NEG_INF
    tail = egf_log_conv_at(np.zeros(size), terms, orders_arr)[0]
    bound = np.logaddexp(0.0, np.logaddexp(head, tail)) / (lam - 1.0)
    return np.minimum(bound, _pure_subsampled(eps0, gamma))


def girgis_epsilon(
    *,
    n: int,
    eps0: float,
    delta: float,
    steps: int,
    rate: float | None = None,
    orders: np.ndarray | list[int] | None = None,
) -> float:
    """Epsilon after ``steps`` rounds of the (subsampled) shuffle, via RDP composition.

    The per-round RDP (:func:`girgis_rdp`, or :func:`girgis_subsampled_rdp` when ``rate`` is
    given) is multiplied by ``steps`` (RDP adds up under adaptive composition) and converted
    with :func:`~shuffle_opacus.analysis.rdp.conversion.rdp_to_dp` (Lemma 2), minimised over the
    orders. The minimising order is not reported; if it is the largest order the result may
    improve with more orders.

    Args:
        n: Population size (integer >= 1); all of them are shuffled when ``rate`` is None.
        eps0: Local privacy parameter of each report (finite, >= 0).
        delta: Target delta in ``(0, 1)``.
        steps: Number of composed rounds (integer >= 1).
        rate: Sampling rate per round (see :func:`girgis_subsampled_rdp`), or None for none.
        orders: Integer Rényi orders >= 2; default :data:`DEFAULT_GIRGIS_ORDERS` (2..256).

    Returns:
        The epsilon of the ``(epsilon, delta)``-DP guarantee.

    Raises:
        ValueError: on an out-of-range argument.
    """
    delta = check_delta(delta)
    steps = check_int("steps", steps, minimum=1)
    orders_arr = DEFAULT_GIRGIS_ORDERS if orders is None else check_orders(orders)
    if rate is None:
        per_round = girgis_rdp(n=n, eps0=eps0, orders=orders_arr)
    else:
        per_round = girgis_subsampled_rdp(n=n, eps0=eps0, rate=rate, orders=orders_arr)
    eps, _ = rdp_to_dp(orders=orders_arr, rdp=steps * per_round, delta=delta)
    return eps
