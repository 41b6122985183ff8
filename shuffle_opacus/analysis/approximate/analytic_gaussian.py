"""The Gaussian mechanism as an (eps, delta)-DP mechanism: its exact privacy profile.

Balle & Wang, *Improving the Gaussian Mechanism for Differential Privacy: Analytical
Calibration and Optimal Denoising* (ICML 2018), Theorem 8: adding ``N(0, s^2 I)`` to a function
whose value moves by at most ``Delta`` in L2 between neighbours is ``(eps, delta)``-DP exactly
when

    delta >= Phi(Delta / (2 s) - eps s / Delta) - e^eps Phi(-Delta / (2 s) - eps s / Delta).

The right-hand side is the hockey-stick divergence between ``N(0, s^2)`` and ``N(Delta, s^2)``,
so it holds in both directions and is tight: no smaller delta is true for the Gaussian. Here
``sigma = s / Delta`` (noise standard deviation in units of the L2 distance between the two
inputs being compared). For a *local* randomizer that distance must be the diameter of the
input domain (any two users' inputs may be compared), e.g. ``2 C`` for gradients clipped to
norm ``C``.

Unlike the classical calibration ``sigma = sqrt(2 log(1.25 / delta)) / eps`` (Dwork & Roth,
Theorem A.1, proved only for ``eps < 1``), the profile is valid for every ``eps >= 0``.
"""

from __future__ import annotations

import math

import numpy as np
from scipy.special import log_ndtr

from ...common.validation import check_delta, check_nonnegative, check_sigma

__all__ = ["gaussian_dp_delta", "gaussian_dp_epsilon"]


def _log_delta(eps: float, sigma: float) -> float:
    """``log delta(eps)``, computed from ``log Phi`` so that tiny deltas keep their digits."""
    a = 0.5 / sigma - eps * sigma
    b = -0.5 / sigma - eps * sigma
    log_first = float(log_ndtr(a))
    log_second = eps + float(log_ndtr(b))
    gap = log_second - log_first  # < 0 for every sigma > 0
    if gap >= 0.0:
        return -math.inf
    return log_first + (math.log(-math.expm1(gap)) if gap > -0.693 else math.log1p(-math.exp(gap)))


def gaussian_dp_delta(eps: float, *, sigma: float) -> float:
    """Smallest delta for which the Gaussian mechanism is ``(eps, delta)``-DP.

    Args:
        eps: Epsilon (finite, >= 0).
        sigma: Noise standard deviation divided by the L2 sensitivity (> 0).

    Returns:
        The exact delta (Balle & Wang 2018, Theorem 8).

    Raises:
        ValueError: on an out-of-range argument.
    """
    sigma = check_sigma(sigma)
    eps = check_nonnegative("eps", eps)
    return math.exp(_log_delta(float(eps), sigma))


def gaussian_dp_epsilon(delta: float, *, sigma: float) -> float:
    """Smallest epsilon for which the Gaussian mechanism is ``(eps, delta)``-DP.

    The root of ``delta(eps) = delta`` is bracketed and solved to about 1e-12 relative; the
    returned value is then nudged up until ``delta(eps) <= delta`` holds in floating point, so
    it is never below the true epsilon by more than rounding of the profile itself.

    Args:
        delta: Target delta in ``(0, 1)``.
        sigma: Noise standard deviation divided by the L2 sensitivity (> 0).

    Returns:
        Epsilon (0 when even ``eps = 0`` meets ``delta``).

    Raises:
        ValueError: on an out-of-range argument.
    """
    sigma = check_sigma(sigma)
    delta = check_delta(delta)
    target = math.log(delta)
    if _log_delta(0.0, sigma) <= target:
        return 0.0
    hi = 1.0
    while _log_delta(hi, sigma) > target:
        hi *= 2.0
    from scipy.optimize import brentq  # here: the clones bound of eps0-LDP reports needs none

    eps = brentq(lambda e: _log_delta(e, sigma) - target, 0.0, hi, xtol=1e-14, rtol=1e-13)
    # Check in the units the caller sees (exp of the log profile), so that
    # gaussian_dp_delta(result) <= delta holds exactly in floating point.
    while _log_delta(eps, sigma) > target or math.exp(_log_delta(eps, sigma)) > delta:
        eps = float(np.nextafter(eps, math.inf)) * (1 + 1e-13)
    return float(eps)
