"""Privacy amplification by shuffling for epsilon0-LDP randomizers: the clones reduction.

Feldman, McMillan & Talwar, *Hiding Among the Clones* (FOCS 2021, arXiv:2012.12803): shuffling
the reports of ``n`` users, each from an ``eps0``-DP local randomizer (adaptively chosen,
replace-one neighbours), is ``(eps, delta)``-DP whenever a pair ``(P, Q)`` of distributions on
two counts is ``(eps, delta)``-indistinguishable (Theorem 3.2). :func:`clones_delta` evaluates
that pair's hockey-stick divergence exactly over the bulk of the clone count (two binomial
calls per count): a lower bound, and with the omitted mass an upper one (:class:`CloneBounds`);
:func:`clones_epsilon` inverts it by bisection (0.13 s at ``n = 10^6``, ``eps0 = 4``).
:func:`clones_closed_form` is the closed form of Theorem 3.1, ``None`` with a
:class:`ClonesValidityWarning` outside its validity condition (:func:`closed_form_limit`);
:func:`clones_gaussian` handles Gaussian reports through Theorem 3.8
(:class:`GaussianClonesResult`).

The pair, the exact evaluation, the validity condition and timings: docs/maths.md, "Numerical
clones bound for ε0-LDP reports".
"""

from __future__ import annotations

import functools
import math
import warnings
from dataclasses import dataclass

import numpy as np

from ...common.validation import (
    check_delta,
    check_int,
    check_nonnegative,
    check_positive,
    check_sigma,
)
from ..options import CLONES_METHODS
from ._binomial import binom_cdf, binom_isf, binom_pmf, binom_ppf, binom_sf, half_pmf_sf
from ._minimize import minimize_bounded
from .analytic_gaussian import gaussian_dp_epsilon

__all__ = [
    "CLONES_METHODS",
    "CloneBounds",
    "ClonesValidityWarning",
    "GaussianClonesResult",
    "closed_form_limit",
    "clones_closed_form",
    "clones_delta",
    "clones_epsilon",
    "clones_gaussian",
]


@dataclass(frozen=True)
class CloneBounds:
    """A two-sided result of the numerical clones analysis.

    Attributes:
        lower: Lower bound (on delta, or on epsilon).
        upper: Upper bound; the one to use as a privacy guarantee.
    """

    lower: float
    upper: float


MAX_EPS0 = 100.0
"""Largest local epsilon accepted (as for the PLD of shuffled reports): beyond it a report hides
nothing, ``e^eps0`` leaves the float range near 709, and the bound is ``eps0`` itself."""


def _check(n: object, eps0: object) -> tuple[int, float]:
    n = check_int("n", n, minimum=1)
    eps0 = check_positive("eps0", eps0)
    if eps0 > MAX_EPS0:
        raise ValueError(f"eps0 must be a finite number in (0, {MAX_EPS0:g}]. Found {eps0!r}.")
    return n, eps0


@functools.lru_cache(maxsize=64)
def _mixing_weights(n: int, eps0: float, tail: float) -> tuple[np.ndarray, np.ndarray, float]:
    """Bulk values of ``C ~ Bin(n - 1, e^{-eps0})``, their masses, and the mass left out.

    Cached: a bisection on epsilon evaluates the same ``(n, eps0)`` many times.
    """
    p = math.exp(-eps0)
    lo, hi = _bulk(n - 1, p, tail)
    omitted = float(binom_cdf(lo - 1, n - 1, p) + binom_sf(hi, n - 1, p))
    c = np.arange(lo, hi + 1, dtype=float)
    weights = binom_pmf(c, n - 1, p)
    c.setflags(write=False)
    weights.setflags(write=False)
    return c, weights, omitted


def _bulk(trials: int, p: float, tail: float) -> tuple[int, int]:
    """Range of ``Bin(trials, p)`` outside which each side holds at most ``tail`` mass."""
    with warnings.catch_warnings():
        # boost's quantile search warns (and returns nan) when the mass is far in one corner.
        warnings.simplefilter("ignore", RuntimeWarning)
        lo_q = float(binom_ppf(tail, trials, p))
        hi_q = float(binom_isf(tail, trials, p))
    lo = max(0, int(lo_q)) if math.isfinite(lo_q) else 0
    hi = min(trials, int(hi_q)) if math.isfinite(hi_q) else trials
    return lo, max(lo, hi)


_NEIGHBOURS = np.array([[-1.0], [0.0], [1.0]])
_NEIGHBOURS.setflags(write=False)


def _delta_given_c(eps: float, c: np.ndarray, q: float) -> np.ndarray:
    """``sum_x max(0, P(x | C=c) - e^eps Q(x | C=c))`` for every ``c``, in closed form.

    Given ``C = c`` the first coordinate ``X`` determines the pair, with
    ``P(x) = q b(x-1) + (1-q) b(x)`` and ``Q(x) = q b(x) + (1-q) b(x-1)``, ``b`` the
    ``Bin(c, 1/2)`` pmf. ``P(x)/Q(x)`` increases with ``r = b(x-1)/b(x) = x/(c+1-x)`` (as
    ``q > 1/2``), so the positive terms are exactly ``x >= s`` for a threshold ``s``, and
    ``sum_{x >= s} P(x) - e^eps Q(x) = a b(s-1) + (1 - e^eps) T(s)``
    with ``a = q - e^eps (1-q)`` and ``T(s) = Pr[Bin(c, 1/2) >= s]``. The sum over ``x >= s`` is
    largest at the true threshold, so taking the maximum over the computed threshold and its
    two neighbours guards against rounding in the threshold itself.
    """
    ratio = math.exp(eps)
    a = q - ratio * (1.0 - q)
    if a <= 0.0:  # e^eps >= e^eps0: no x has P > e^eps Q
        return np.zeros_like(c)
    r_star = (ratio * q - (1.0 - q)) / a  # >= 1
    s0 = np.floor(r_star * (c + 1.0) / (1.0 + r_star)) + 1.0
    # The three candidates s0 - 1, s0, s0 + 1 (s0 + (-1.0) is s0 - 1.0 to the bit) as the rows
    # of one array, every operation below being elementwise; then the points s - 1.
    k = (s0 + _NEIGHBOURS).clip(1.0, c + 2.0) - 1.0
    if math.isfinite(r_star):  # then k holds integers in [0, c + 1], as half_pmf_sf needs
        pmf, sf = half_pmf_sf(k, c)
    else:
        pmf, sf = binom_pmf(k, c, 0.5), binom_sf(k, c, 0.5)
    terms = a * pmf - math.expm1(eps) * sf
    best = np.zeros_like(c)
    for term in terms:
        best = np.maximum(best, term)
    return best


def clones_delta(eps: float, *, n: int, eps0: float, tail: float = 1e-16) -> CloneBounds:
    """Hockey-stick divergence ``delta(eps)`` between the clones pair ``P`` and ``Q``.

    Args:
        eps: Epsilon at which to evaluate (>= 0).
        n: Number of shuffled users (integer >= 1).
        eps0: Local privacy parameter of each randomizer (> 0).
        tail: Binomial mass of ``C`` left out on each side (in ``(0, 1e-3]``); it is added to
            the upper bound.

    Returns:
        :class:`CloneBounds` with ``lower <= delta(eps) <= upper``.

    Raises:
        ValueError: on an out-of-range argument.
    """
    n, eps0 = _check(n, eps0)
    eps = check_nonnegative("eps", eps)
    if not (0 < tail <= 1e-3):
        raise ValueError(f"tail must be in (0, 1e-3]. Found {tail!r}.")
    return _Pair(n, eps0, tail).bounds(eps)


class _Pair:
    """The clones pair at ``(n, eps0, tail)``, checked, for evaluating ``delta`` many times.

    What depends on ``eps`` alone is recomputed at each :meth:`bounds`; the rest (``q``, the
    grid of ``C`` and its weights) is looked up once: the same floats :func:`clones_delta`
    computes at every call.
    """

    def __init__(self, n: int, eps0: float, tail: float) -> None:
        self.q = 1.0 / (1.0 + math.exp(-eps0))  # Pr[D = 1]
        self.c, self.weights, self.omitted = _mixing_weights(n, eps0, tail)

    def bounds(self, eps: float) -> CloneBounds:
        """:func:`clones_delta` at ``eps`` (a finite float >= 0)."""
        bulk = float(np.dot(self.weights, _delta_given_c(eps, self.c, self.q)))
        return CloneBounds(lower=bulk, upper=min(1.0, bulk + self.omitted))


def clones_epsilon(
    *, n: int, eps0: float, delta: float, tol: float = 1e-6, tail: float = 1e-16
) -> CloneBounds:
    """Epsilon of ``n`` shuffled ``eps0``-LDP reports at ``delta`` (clones reduction, exact).

    ``upper`` is the smallest epsilon found (to ``tol``) whose *upper* bound on
    ``delta(eps)`` is ``<= delta``: a valid guarantee. ``lower`` is the largest epsilon found
    whose *lower* bound on ``delta(eps)`` exceeds ``delta``: no smaller epsilon can be proved
    from this pair. Never more than ``eps0`` (shuffling is post-processing of ``eps0``-DP
    reports).

    Args:
        n: Number of shuffled users (integer >= 1).
        eps0: Local privacy parameter (> 0).
        delta: Target delta in ``(0, 1)``.
        tol: Bisection tolerance on epsilon (> 0).
        tail: See :func:`clones_delta`.

    Returns:
        :class:`CloneBounds` on epsilon.

    Raises:
        ValueError: on an out-of-range argument.
    """
    n, eps0 = _check(n, eps0)
    delta = check_delta(delta)
    tol = check_positive("tol", tol)
    if clones_delta(0.0, n=n, eps0=eps0, tail=tail).upper <= delta:  # also checks tail
        return CloneBounds(lower=0.0, upper=0.0)
    pair = _Pair(n, eps0, tail)  # clones_delta(mid, ...) without its checks: mid is a float
    # Upper bound: bisection on the certified (upper) delta.
    lo, hi = 0.0, eps0
    while hi - lo > tol:
        mid = 0.5 * (lo + hi)
        if pair.bounds(mid).upper <= delta:
            hi = mid
        else:
            lo = mid
    upper = hi
    # Lower bound: bisection on the lower delta, below the upper bound.
    lo2, hi2 = 0.0, upper
    while hi2 - lo2 > tol:
        mid = 0.5 * (lo2 + hi2)
        if pair.bounds(mid).lower > delta:
            lo2 = mid
        else:
            hi2 = mid
    return CloneBounds(lower=lo2, upper=upper)


class ClonesValidityWarning(UserWarning):
    """The closed form of the clones theorem was asked for outside its validity condition."""


def closed_form_limit(*, n: int, delta: float) -> float:
    """Largest ``eps0`` the closed form accepts: ``log(n / (16 log(4 / delta)))``.

    Theorem 3.1 states the condition with ``log(2 / delta)``, but its proof (Appendix A, the
    Chernoff step needs ``e^{-eps0} >= 16 log(4 / delta) / n``) and the authors' published
    implementation use ``log(4 / delta)``, which is the stricter of the two; that is the one
    enforced here.

    Args:
        n: Number of shuffled users (integer >= 1).
        delta: Target delta in ``(0, 1)``.

    Returns:
        The limit (may be negative: then no ``eps0`` qualifies).

    Raises:
        ValueError: on an out-of-range argument.
    """
    n = check_int("n", n, minimum=1)
    delta = check_delta(delta)
    return math.log(n / (16.0 * math.log(4.0 / delta)))


def clones_closed_form(*, n: int, eps0: float, delta: float) -> float | None:
    """Closed-form clones bound (Feldman, McMillan & Talwar 2021, Theorem 3.1 / Eq. (1)).

    With ``a = 8 sqrt(e^{eps0} log(4/delta) / n) + 8 e^{eps0} / n`` and ``e^{eps'} = 1 + a``,
    this returns

        eps = log(1 + (1 - e^{-eps0}) / (1 + e^{-eps0 - eps'}) * a),

    the form of the authors' published implementation (0.5378 at ``n = 100,000``,
    ``eps0 = 4``, ``delta = 1e-6``). Eq. (1) as printed has ``(e^{eps0} - 1)/(e^{eps0} + 1)``
    in place of the fraction and gives 0.53463 there; the fraction used here is the larger of
    the two for every ``eps' >= 0``, so the value returned is the more conservative.
    Neighbouring relation: replace one user's input (each report from an ``eps0``-DP local
    randomizer over the whole input domain).

    Args:
        n: Number of shuffled users (integer >= 1).
        eps0: Local privacy parameter (> 0).
        delta: Target delta in ``(0, 1)``.

    Returns:
        Epsilon, or ``None`` (with a :class:`ClonesValidityWarning`) when
        ``eps0 > log(n / (16 log(4 / delta)))``, where the theorem says nothing.

    Raises:
        ValueError: on an out-of-range argument.
    """
    n, eps0 = _check(n, eps0)
    limit = closed_form_limit(n=n, delta=delta)
    if eps0 > limit:
        warnings.warn(
            f"the closed form needs eps0 <= log(n / (16 log(4/delta))) = {limit:.6g}; "
            f"got eps0 = {eps0:g}, so it gives no bound (use the numerical method)",
            ClonesValidityWarning,
            stacklevel=2,
        )
        return None
    return _closed_form(n, eps0, delta)


def _closed_form(n: int, eps0: float, delta: float) -> float:
    a = 8.0 * math.sqrt(math.exp(eps0) * math.log(4.0 / delta) / n) + 8.0 * math.exp(eps0) / n
    eps_prime = math.log1p(a)
    fraction = -math.expm1(-eps0) / (1.0 + math.exp(-eps0 - eps_prime))
    return math.log1p(fraction * a)


@dataclass(frozen=True)
class GaussianClonesResult:
    """Shuffled Gaussian reports analysed by the clones method (Theorem 3.8).

    Attributes:
        epsilon: Epsilon of the shuffled output at the requested delta; ``None`` only for the
            closed form when no ``delta0`` satisfies its validity condition.
        delta: Total delta of the guarantee (the requested one).
        eps0: Local epsilon of each report at ``delta0`` (analytic Gaussian).
        delta0: Local delta chosen by the scan.
        delta_shuffle: The part of ``delta`` spent on the shuffle bound itself.
        method: ``"numerical"`` or ``"closed-form"``.
        amplified: False when no ``delta0`` beat the unshuffled Gaussian; ``epsilon`` is
            then that of a single report at ``delta`` (shuffling is post-processing).
    """

    epsilon: float | None
    delta: float
    eps0: float
    delta0: float
    delta_shuffle: float
    method: str
    amplified: bool


def _gaussian_at(
    log_delta0: float, n: int, sigma: float, delta: float, method: str, tol: float
) -> tuple[float, float, float]:
    """Epsilon (``inf`` if infeasible), eps0 and delta_shuffle for one ``delta0``."""
    delta0 = math.exp(log_delta0)
    # A (0, delta0) randomizer is also (eps0, delta0) for any eps0 > 0: floor eps0 so that the
    # clones pair (which needs eps0 > 0) stays defined; a larger eps0 only weakens the bound.
    eps0 = max(gaussian_dp_epsilon(delta0, sigma=sigma), 1e-9)
    factor = (1.0 + 0.5 * math.exp(-eps0)) * n * delta0  # Theorem 3.8: delta + (e^eps+1) factor
    if (math.exp(eps0) + 1.0) * factor >= delta:
        return math.inf, eps0, 0.0
    if method == "numerical":
        # clones_delta(eps, n=n, eps0=eps0) without repeating its checks at every eps (all
        # finite floats >= 0 here): they raise, if at all, where the first one would.
        pair = _Pair(*_check(n, eps0), 1e-16)

        def spent(eps: float) -> float:
            return pair.bounds(eps).upper + (math.exp(eps) + 1.0) * factor

        if spent(0.0) <= delta:
            return 0.0, eps0, delta - 2.0 * factor
        if spent(eps0) > delta:  # only the omitted binomial mass can make this happen
            return math.inf, eps0, 0.0
        lo, hi = 0.0, eps0
        while hi - lo > tol:
            mid = 0.5 * (lo + hi)
            if spent(mid) <= delta:
                hi = mid
            else:
                lo = mid
        return hi, eps0, delta - (math.exp(hi) + 1.0) * factor
    # Closed form: the largest delta_shuffle with delta_s + (e^{eps(delta_s)} + 1) factor <= delta.
    limit_ok = lambda d: eps0 <= math.log(n / (16.0 * math.log(4.0 / d)))  # noqa: E731
    fits = lambda d: d + (math.exp(_closed_form(n, eps0, d)) + 1.0) * factor <= delta  # noqa: E731
    lo_l, hi_l = math.log(delta) - 200.0, math.log(delta - 2.0 * factor)
    if not (limit_ok(math.exp(hi_l)) and fits(math.exp(lo_l))):
        return math.inf, eps0, 0.0
    for _ in range(60):
        mid = 0.5 * (lo_l + hi_l)
        if fits(math.exp(mid)):
            lo_l = mid
        else:
            hi_l = mid
    d_s = math.exp(lo_l)
    if not limit_ok(d_s):
        return math.inf, eps0, 0.0
    return _closed_form(n, eps0, d_s), eps0, d_s


def clones_gaussian(
    *, n: int, sigma: float, delta: float, method: str = "numerical", tol: float = 1e-6
) -> GaussianClonesResult:
    """Epsilon of ``n`` shuffled Gaussian reports by the clones method (Theorem 3.8).

    Each report adds ``N(0, sigma^2 D^2 I)`` where ``D`` bounds the L2 distance between *any*
    two inputs of the domain (a local randomizer must hide every input, so for gradients
    clipped to norm ``C`` take ``D = 2 C``). It is then ``(eps0, delta0)``-LDP along the whole
    analytic-Gaussian curve (Balle & Wang 2018). Feldman, McMillan & Talwar (2021),
    Theorem 3.8, make the shuffled output ``(eps, delta_s + (e^eps + 1)(1 + e^{-eps0}/2) n
    delta0)``-DP for replace-one neighbours, where ``(eps, delta_s)`` is any pair for which the
    clones pair of Theorem 3.2 at ``eps0`` is indistinguishable: the proof of Theorem 3.8
    reduces to exactly that pair, so both the closed form (as stated) and the numerical bound
    (:func:`clones_delta`) may be used. ``delta0`` is scanned (log grid, then a bounded scalar
    search) so that the total equals ``delta``, and the smallest epsilon found is returned.
    The answer is never worse than a single report at ``delta`` (post-processing).

    Args:
        n: Number of shuffled users (integer >= 1).
        sigma: Noise standard deviation divided by the input domain's L2 diameter (> 0).
        delta: Total delta in ``(0, 1)`` (the shuffle-Gaussian paper uses ``1/n``).
        method: ``"numerical"`` (default) or ``"closed-form"``.
        tol: Tolerance of the epsilon bisection (numerical method, > 0).

    Returns:
        :class:`GaussianClonesResult`.

    Raises:
        ValueError: on an out-of-range argument.
    """
    n = check_int("n", n, minimum=1)
    sigma = check_sigma(sigma)
    delta = check_delta(delta)
    tol = check_positive("tol", tol)
    if method not in CLONES_METHODS:
        raise ValueError(f"method must be one of {', '.join(CLONES_METHODS)}. Found {method!r}.")
    top = math.log(delta / (3.0 * n))  # (e^eps + 1)(1 + e^-eps0/2) n delta0 < delta needs this
    grid = top - np.linspace(0.0, 80.0, 11)
    # The search returns a point it evaluated: remember its answers instead of recomputing the
    # one asked for again (_gaussian_at is a function of its arguments alone).
    seen: dict[float, tuple[float, float, float]] = {}

    def at(log_delta0: float) -> tuple[float, float, float]:
        if log_delta0 not in seen:
            seen[log_delta0] = _gaussian_at(log_delta0, n, sigma, delta, method, tol)
        return seen[log_delta0]

    values = [_gaussian_at(g, n, sigma, delta, method, tol) for g in grid]
    best = min(range(len(grid)), key=lambda i: values[i][0])
    if math.isfinite(values[best][0]):
        lo_g = grid[min(best + 1, len(grid) - 1)]
        hi_g = grid[max(best - 1, 0)]
        found = minimize_bounded(
            lambda g: min(at(g)[0], 1e6),
            float(lo_g),
            float(hi_g),
            xatol=1e-2,
        )
        refined = at(found)
        choice, log_d0 = (
            (refined, found)
            if refined[0] < values[best][0]
            else (
                values[best],
                float(grid[best]),
            )
        )
    else:
        choice, log_d0 = values[best], float(grid[best])
    eps, eps0, d_s = choice
    plain = gaussian_dp_epsilon(delta, sigma=sigma)
    if not math.isfinite(eps):
        if method == "closed-form":
            warnings.warn(
                "the closed form's validity condition eps0 <= log(n / (16 log(4/delta_s))) "
                f"fails for every delta0 at n={n}, sigma={sigma:g}, delta={delta:g}; no bound",
                ClonesValidityWarning,
                stacklevel=2,
            )
            return GaussianClonesResult(None, delta, eps0, math.exp(log_d0), 0.0, method, False)
        return GaussianClonesResult(plain, delta, plain, delta, 0.0, method, False)
    if plain <= eps:
        return GaussianClonesResult(plain, delta, plain, delta, 0.0, method, False)
    return GaussianClonesResult(eps, delta, eps0, math.exp(log_d0), d_s, method, True)
