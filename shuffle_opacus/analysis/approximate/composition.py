"""Composition and subsampling theorems for approximate (epsilon, delta)-DP (baselines).

Each function bounds the homogeneous ``k``-fold adaptive composition of ``(eps, delta)``-DP
mechanisms (same neighbouring relation for all), so the results are worst-case baselines for
the whole class: :func:`compose_basic` (Dwork & Roth 2014, Theorem 3.16),
:func:`compose_advanced` (Dwork, Rothblum & Vadhan 2010; Dwork & Roth, Theorem 3.20),
:func:`compose_optimal_delta` and :func:`compose_optimal_epsilon`, the optimal composition of
Kairouz, Oh & Viswanath, *The Composition Theorem for Differential Privacy* (ICML 2015,
arXiv:1311.0776, Theorem 3.3), exact at every ``eps_total`` and computed in log space in
``O(k)``, and :func:`compose_best_epsilon`, the smallest of the three. :func:`subsample_dp` is
amplification by Poisson subsampling (Li, Qardaji & Su 2012; Balle, Barthe & Gaboardi 2018)
for the add/remove relation. All accept ``delta = 0`` (pure DP).

Formulas, the hockey-stick form of the optimal bound and the references: docs/maths.md,
"Composition and subsampling".
"""

from __future__ import annotations

import math

import numpy as np
from scipy.special import gammaln, logsumexp

from ...common.validation import (
    check_delta,
    check_int,
    check_nonnegative,
    check_positive,
    check_probability,
)

__all__ = [
    "compose_advanced",
    "compose_basic",
    "compose_best_epsilon",
    "compose_optimal_delta",
    "compose_optimal_epsilon",
    "subsample_dp",
]

_LOG2 = math.log(2.0)


def _check_delta0(name: str, value: object) -> float:
    """Return ``value`` as ``float`` if it lies in ``[0, 1)`` (``check_delta`` excludes 0)."""
    try:
        fvalue = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be in [0, 1). Found {value!r}.") from None
    if not (0.0 <= fvalue < 1.0):
        raise ValueError(f"{name} must be in [0, 1). Found {value!r}.")
    return fvalue


def _check_common(eps: object, delta: object, k: object) -> tuple[float, float, int]:
    return (
        check_nonnegative("eps", eps),
        _check_delta0("delta", delta),
        check_int("k", k, minimum=1),
    )


def _log1mexp(x: np.ndarray) -> np.ndarray:
    """``log(1 - e^x)`` for ``x < 0``, accurate at both ends."""
    out = np.empty_like(x)
    near = x > -_LOG2
    out[near] = np.log(-np.expm1(x[near]))
    out[~near] = np.log1p(-np.exp(x[~near]))
    return out


def _delta_rr(eps: float, k: int, eps_total: float) -> float:
    """Hockey-stick divergence ``delta_rr(eps_total)`` of ``k`` eps-randomized responses."""
    ell = np.arange(k + 1, dtype=float)
    # Term l is positive iff x_l = eps_total - (k - 2l) eps < 0; x_l is increasing in l.
    x = eps_total + (2.0 * ell - k) * eps
    positive = x < 0.0
    if not positive.any():
        return 0.0
    ell, x = ell[positive], x[positive]
    # log[C(k,l) p^{k-l} (1-p)^l] = log C(k,l) - k log(1 + e^-eps) - l eps.
    log_weight = (
        gammaln(k + 1.0) - gammaln(ell + 1.0) - gammaln(k - ell + 1.0)
        - k * math.log1p(math.exp(-eps))
        - ell * eps
    )  # fmt: skip
    return min(1.0, float(np.exp(logsumexp(log_weight + _log1mexp(x)))))


def _pure_part(delta: float, k: int) -> tuple[float, float]:
    """``(1 - (1 - delta)^k, (1 - delta)^k)``, the first capped at ``k delta`` against rounding."""
    log_keep = k * math.log1p(-delta)
    return min(k * delta, -math.expm1(log_keep)), math.exp(log_keep)


def _optimal_delta(eps: float, delta: float, k: int, eps_total: float) -> float:
    base, keep = _pure_part(delta, k)
    return min(1.0, base + keep * _delta_rr(eps, k, eps_total))


def compose_basic(*, eps: float, delta: float, k: int) -> tuple[float, float]:
    """Compose ``k`` adaptively chosen ``(eps, delta)``-DP mechanisms by basic composition.

    The homogeneous k-fold adaptive composition of ``(eps, delta)``-DP mechanisms (same
    neighbouring relation for all) is ``(k eps, k delta)``-DP (Dwork & Roth 2014, Theorem 3.16).

    Args:
        eps: Per-mechanism epsilon (finite, >= 0).
        delta: Per-mechanism delta in ``[0, 1)``.
        k: Number of mechanisms (integer >= 1).

    Returns:
        ``(k * eps, k * delta)``; a delta above 1 is a vacuous guarantee.

    Raises:
        ValueError: on an out-of-range argument.
    """
    eps, delta, k = _check_common(eps, delta, k)
    return k * eps, k * delta


def compose_advanced(
    *, eps: float, delta: float, k: int, delta_slack: float
) -> tuple[float, float]:
    """Advanced composition of Dwork, Rothblum & Vadhan (Dwork & Roth 2014, Theorem 3.20).

    The homogeneous k-fold adaptive composition of ``(eps, delta)``-DP mechanisms (same
    neighbouring relation for all) is ``(eps_total, k delta + delta_slack)``-DP with
    ``eps_total = eps sqrt(2 k log(1 / delta_slack)) + k eps (e^eps - 1)``. For large ``eps``
    or small ``k`` it can exceed the basic ``k eps``.

    Args:
        eps: Per-mechanism epsilon (finite, >= 0).
        delta: Per-mechanism delta in ``[0, 1)``.
        k: Number of mechanisms (integer >= 1).
        delta_slack: The extra delta ``delta'`` of the theorem, in ``(0, 1)``.

    Returns:
        ``(eps_total, delta_total)``; ``eps_total`` is ``inf`` if ``e^eps`` overflows.

    Raises:
        ValueError: on an out-of-range argument.
    """
    eps, delta, k = _check_common(eps, delta, k)
    delta_slack = check_delta(delta_slack, "delta_slack")
    try:
        drift = k * eps * math.expm1(eps)
    except OverflowError:
        drift = math.inf
    eps_total = eps * math.sqrt(2.0 * k * -math.log(delta_slack)) + drift
    return eps_total, k * delta + delta_slack


def compose_optimal_delta(*, eps: float, delta: float, k: int, eps_total: float) -> float:
    """Smallest delta of k-fold composition at ``eps_total`` (Kairouz, Oh & Viswanath 2015).

    For the homogeneous k-fold adaptive composition of ``(eps, delta)``-DP mechanisms (same
    neighbouring relation for all), returns ``1 - (1 - delta)^k (1 - delta_rr(eps_total))``
    with ``delta_rr`` the hockey-stick divergence of ``k`` eps-randomized responses
    (docs/maths.md, "Composition and subsampling"). The bound is tight for the class of
    ``(eps, delta)``-DP mechanisms, so no composition theorem for that class can give a
    smaller delta. It is non-increasing in
    ``eps_total`` and equals ``1 - (1 - delta)^k`` for ``eps_total >= k eps``.

    Args:
        eps: Per-mechanism epsilon (finite, >= 0).
        delta: Per-mechanism delta in ``[0, 1)``.
        k: Number of mechanisms (integer >= 1).
        eps_total: Epsilon of the composition (finite, >= 0).

    Returns:
        The optimal ``delta_total`` in ``[0, 1]``.

    Raises:
        ValueError: on an out-of-range argument.
    """
    eps, delta, k = _check_common(eps, delta, k)
    eps_total = check_nonnegative("eps_total", eps_total)
    return _optimal_delta(eps, delta, k, eps_total)


def compose_optimal_epsilon(
    *, eps: float, delta: float, k: int, delta_total: float, tol: float = 1e-9
) -> float:
    """Smallest epsilon of k-fold composition at ``delta_total`` (Kairouz, Oh & Viswanath 2015).

    For the homogeneous k-fold adaptive composition of ``(eps, delta)``-DP mechanisms (same
    neighbouring relation for all), bisects ``eps_total`` on ``[0, k eps]`` for the smallest
    value with :func:`compose_optimal_delta` ``<= delta_total``. The value returned is the
    upper end of the final bracket, so it is a valid guarantee and at most ``tol`` above the
    exact optimum.

    Args:
        eps: Per-mechanism epsilon (finite, >= 0).
        delta: Per-mechanism delta in ``[0, 1)``.
        k: Number of mechanisms (integer >= 1).
        delta_total: Target delta in ``[0, 1)``; at least ``1 - (1 - delta)^k``.
        tol: Bisection tolerance on epsilon (> 0).

    Returns:
        The optimal ``eps_total`` (to ``tol``), between 0 and ``k eps``.

    Raises:
        ValueError: on an out-of-range argument, or if ``delta_total < 1 - (1 - delta)^k``
            (no epsilon reaches it).
    """
    eps, delta, k = _check_common(eps, delta, k)
    delta_total = _check_delta0("delta_total", delta_total)
    tol = check_positive("tol", tol)
    base, _ = _pure_part(delta, k)
    if delta_total < base:
        raise ValueError(
            f"delta_total must be >= 1 - (1 - delta)^k = {base:.6g} (about k * delta = "
            f"{k * delta:.6g}) for k = {k} mechanisms with delta = {delta!r}. "
            f"Found {delta_total!r}."
        )
    if _optimal_delta(eps, delta, k, 0.0) <= delta_total:
        return 0.0
    lo, hi = 0.0, k * eps  # delta(lo) > delta_total >= delta(hi) = base
    while hi - lo > tol:
        mid = 0.5 * (lo + hi)
        if mid in (lo, hi):  # bracket narrower than the float spacing
            break
        if _optimal_delta(eps, delta, k, mid) <= delta_total:
            hi = mid
        else:
            lo = mid
    return hi


def compose_best_epsilon(*, eps: float, delta: float, k: int, delta_total: float) -> float:
    """Smallest epsilon at ``delta_total`` over basic, advanced and optimal composition.

    For the homogeneous k-fold adaptive composition of ``(eps, delta)``-DP mechanisms (same
    neighbouring relation for all). Candidates: basic ``k eps`` when ``k delta <= delta_total``;
    advanced with ``delta_slack = delta_total - k delta`` when that is positive; and
    :func:`compose_optimal_epsilon`. The optimal one is never larger than the others (up to
    its bisection tolerance), since it is tight for the class; the minimum is returned anyway.

    Args:
        eps: Per-mechanism epsilon (finite, >= 0).
        delta: Per-mechanism delta in ``[0, 1)``.
        k: Number of mechanisms (integer >= 1).
        delta_total: Target delta in ``[0, 1)``; at least ``1 - (1 - delta)^k``.

    Returns:
        The smallest ``eps_total`` found.

    Raises:
        ValueError: on an out-of-range argument or an unreachable ``delta_total``.
    """
    eps, delta, k = _check_common(eps, delta, k)
    delta_total = _check_delta0("delta_total", delta_total)
    candidates = [compose_optimal_epsilon(eps=eps, delta=delta, k=k, delta_total=delta_total)]
    if k * delta <= delta_total:
        candidates.append(compose_basic(eps=eps, delta=delta, k=k)[0])
    if delta_total - k * delta > 0.0:
        candidates.append(
            compose_advanced(eps=eps, delta=delta, k=k, delta_slack=delta_total - k * delta)[0]
        )
    return min(candidates)


def subsample_dp(*, eps: float, delta: float, rate: float) -> tuple[float, float]:
    """Amplification by Poisson subsampling of an ``(eps, delta)``-DP mechanism.

    If ``M`` is ``(eps, delta)``-DP with respect to adding or removing one record, then ``M``
    run on a Poisson subsample (each record kept independently with probability ``rate``) is
    ``(log(1 + rate (e^eps - 1)), rate delta)``-DP with respect to add/remove (Li, Qardaji &
    Su 2012; Balle, Barthe & Gaboardi 2018). Balle et al. state the same formula, with
    ``rate = m / n``, for sampling ``m`` of ``n`` records without replacement under the
    replace-one relation; that case is not checked here. Both guarantees are one-shot; compose
    them with the functions above.

    Args:
        eps: Epsilon of ``M`` (finite, >= 0).
        delta: Delta of ``M`` in ``[0, 1)``.
        rate: Sampling probability in ``(0, 1]``.

    Returns:
        ``(eps', delta')``, with ``eps' <= eps`` and equality at ``rate = 1``.

    Raises:
        ValueError: on an out-of-range argument.
    """
    eps = check_nonnegative("eps", eps)
    delta = _check_delta0("delta", delta)
    rate = check_probability("rate", rate)
    if eps <= 1.0:
        eps_sub = math.log1p(rate * math.expm1(eps))
    else:  # log(rate e^eps + 1 - rate) without overflow for large eps
        eps_sub = eps + math.log(rate + (1.0 - rate) * math.exp(-eps))
    return min(eps, eps_sub), rate * delta
