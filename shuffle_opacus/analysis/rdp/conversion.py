"""RDP to (epsilon, delta)-DP conversion, minimised over integer orders.

Lemma 2 of Liew & Takahashi (Canonne, Kamath & Steinke 2020, Proposition 12; Balle et al. 2020,
Theorem 21): a mechanism that is ``(l, eps(l))``-RDP for every order ``l`` is
``(epsilon, delta)``-DP with

    epsilon = min_l  eps(l) + (log(1/delta) + (l - 1) log(1 - 1/l) - log(l)) / (l - 1).

The expression can be negative when the RDP is essentially zero; since (epsilon, delta)-DP
implies (epsilon', delta)-DP for every epsilon' >= epsilon, such values are reported as 0.

Without a cap the order range starts at 2..64 and doubles up to 2..4096 (``order_limit``); past
that the cost of the series grows quadratically, so a warning asks for an explicit
``max_order`` instead.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np

from ...common.validation import MAX_ORDER, check_delta, check_int, check_nonnegative, check_orders

__all__ = [
    "delta_from_rdp",
    "rdp_to_dp",
    "epsilon_from_rdp",
    "EpsilonResult",
    "OrderCapWarning",
    "DEFAULT_START_ORDER",
    "DEFAULT_ORDER_LIMIT",
]

DEFAULT_START_ORDER = 64
DEFAULT_ORDER_LIMIT = 4096


class OrderCapWarning(UserWarning):
    """The minimising order sits at the largest order evaluated; epsilon may be loose."""


@dataclass(frozen=True)
class EpsilonResult:
    """An (epsilon, delta) guarantee together with how it was obtained.

    Attributes:
        epsilon: The epsilon of the (epsilon, delta)-DP guarantee.
        delta: The delta it holds for.
        order: The integer Rényi order that achieved ``epsilon``.
        max_order: The largest order evaluated.
        at_cap: True when ``order == max_order`` (the optimum may lie beyond).
        method: The method that produced it, when a method of a mechanism did (``pld``,
            ``exact``, ...); ``None`` for a bare conversion or a reference curve.
        note: Why the method is not the one asked for (the default's fallback), or ``None``.
        epsilon_lower: The optimistic estimate of a ``pld`` result, when computed.
        details: What else the method reports (``proven``: route, level, delta's split).
    """

    epsilon: float
    delta: float
    order: int
    max_order: int
    at_cap: bool
    method: str | None = None
    note: str | None = None
    epsilon_lower: float | None = None
    details: Mapping[str, object] | None = None


def _orders_and_rdp(
    orders: np.ndarray | list[int], rdp: np.ndarray | list[float]
) -> tuple[np.ndarray, np.ndarray]:
    """Validate integer orders and return them with the float RDP values of the same length."""
    orders_arr = np.asarray(orders)
    checked = check_orders(orders_arr)
    rdp_arr = np.asarray(rdp, dtype=float)
    if rdp_arr.shape != checked.shape or orders_arr.shape != checked.shape:
        raise ValueError(
            "orders must be sorted unique integers >= 2 and rdp must have the same length. "
            f"Found {orders_arr.size} orders and {rdp_arr.size} rdp values."
        )
    return checked, rdp_arr


def rdp_to_dp(
    *, orders: np.ndarray | list[int], rdp: np.ndarray | list[float], delta: float
) -> tuple[float, int]:
    """Convert RDP values at integer orders to ``(epsilon, order)`` via Lemma 2.

    Args:
        orders: Integer Rényi orders >= 2 (sorted ascending, no duplicates).
        rdp: Total RDP at each order (same length as ``orders``).
        delta: Target delta in ``(0, 1)``.

    Returns:
        ``(epsilon, order)``: the smallest epsilon over the orders and the order achieving it.

    Raises:
        ValueError: if ``orders`` and ``rdp`` differ in length or an argument is out of range.
    """
    delta = check_delta(delta)
    checked, rdp_arr = _orders_and_rdp(orders, rdp)
    lam = checked.astype(float)
    eps = rdp_arr + (np.log(1.0 / delta) + (lam - 1.0) * np.log1p(-1.0 / lam) - np.log(lam)) / (
        lam - 1.0
    )
    if np.all(np.isnan(eps)):
        return float("inf"), int(checked[0])
    idx = int(np.nanargmin(eps))
    return max(0.0, float(eps[idx])), int(checked[idx])


def epsilon_from_rdp(
    rdp_fn: Callable[[np.ndarray], np.ndarray],
    *,
    delta: float,
    max_order: int | None = None,
    start_order: int = DEFAULT_START_ORDER,
    order_limit: int = DEFAULT_ORDER_LIMIT,
) -> EpsilonResult:
    """Minimise Lemma 2 over integer orders ``2..L``, growing ``L`` until the optimum is interior.

    Args:
        rdp_fn: Maps an int array of orders ``2..L`` to the *total* RDP at those orders.
        delta: Target delta in ``(0, 1)``.
        max_order: A user cap ``L`` (at most :data:`~shuffle_opacus.analysis.limits.MAX_ORDER`);
            when given only ``2..max_order`` are evaluated and an :class:`OrderCapWarning` is
            issued if the optimum sits at the cap.
        start_order: First ``L`` tried when no cap is given.
        order_limit: Largest ``L`` the automatic growth may reach (then it warns as above).

    Returns:
        An :class:`EpsilonResult`.

    Raises:
        ValueError: on an out-of-range argument.
    """
    delta = check_delta(delta)
    if max_order is not None:
        cap = check_int("max_order", max_order, minimum=2, maximum=MAX_ORDER)
        limit = cap
        current = cap
    else:
        limit = check_int("order_limit", order_limit, minimum=2, maximum=MAX_ORDER)
        current = min(check_int("start_order", start_order, minimum=2), limit)
    while True:
        orders = np.arange(2, current + 1)
        eps, order = rdp_to_dp(orders=orders, rdp=rdp_fn(orders), delta=delta)
        at_cap = order == current
        if not at_cap or current >= limit:
            break
        current = min(limit, 2 * current)
    if at_cap:
        who = "max_order" if max_order is not None else "order_limit"
        warnings.warn(
            f"The optimal Rényi order is the largest evaluated ({current}); raise {who} "
            "for a possibly smaller epsilon.",
            OrderCapWarning,
            stacklevel=2,
        )
    return EpsilonResult(
        epsilon=eps, delta=delta, order=order, max_order=current, at_cap=bool(at_cap)
    )


def delta_from_rdp(
    *, orders: np.ndarray | list[int], rdp: np.ndarray | list[float], eps: float
) -> tuple[float, int]:
    """Smallest delta Lemma 2 gives at a fixed ``eps``: the same bound solved for delta.

    ``log delta = min_l (l - 1)(eps(l) - eps) + (l - 1) log(1 - 1/l) - log(l)``, capped at 1.

    Args:
        orders: Integer Rényi orders >= 2 (sorted ascending, no duplicates).
        rdp: Total RDP at each order (same length as ``orders``).
        eps: Epsilon (finite, >= 0).

    Returns:
        ``(delta, order)``: the smallest delta over the orders and the order achieving it.

    Raises:
        ValueError: if ``orders`` and ``rdp`` differ in length or ``eps`` is out of range.
    """
    eps = check_nonnegative("eps", eps)
    checked, rdp_arr = _orders_and_rdp(orders, rdp)
    lam = checked.astype(float)
    log_delta = (lam - 1.0) * (rdp_arr - eps + np.log1p(-1.0 / lam)) - np.log(lam)
    idx = int(np.nanargmin(log_delta))
    return float(min(1.0, np.exp(log_delta[idx]))), int(checked[idx])
