"""Approximate-DP baselines for many rounds of shuffled reports (Gaussian or eps0-LDP).

What a conservative (epsilon, delta) analysis without RDP does, assembled from :mod:`.clones`
and :mod:`.composition`: each round by the clones method of Feldman, McMillan & Talwar, *Hiding
Among the Clones* (arXiv:2012.12803; Theorem 3.8 for Gaussian reports, Theorems 3.1/3.2 for
``eps0``-LDP reports), for check-in amplified by the Poisson-subsampling formula, and ``T``
rounds by the optimal composition theorem of Kairouz, Oh & Viswanath, the best per-round delta
of a log grid kept (:func:`round_profile`, :class:`RoundProfile`, :func:`composed_epsilon`,
:func:`composed_epsilons`, :func:`clones_results`). ``sigma`` is over the L2 *diameter* of the
input domain (``2 C`` for gradients clipped to ``C``), with replace-one neighbours.

This is a **comparison curve, not a certified bound**, never used to account for training: the
check-in step applies an add/remove formula to a replace-one analysis (our reading of the
baseline of Liew, Hasegawa & Takahashi 2022). Steps and assumptions: docs/maths.md, "The
composed baseline".
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ...common.validation import (
    check_delta,
    check_int,
    check_positive,
    check_probability,
    check_sigma,
)
from ..results import AccountingResult
from ._binomial import binom_ppf
from .clones import (
    CLONES_METHODS,
    ClonesValidityWarning,
    clones_closed_form,
    clones_epsilon,
    clones_gaussian,
    closed_form_limit,
)
from .composition import compose_optimal_epsilon

__all__ = [
    "RoundProfile",
    "composed_epsilon",
    "composed_epsilons",
    "round_profile",
    "clones_results",
]


@dataclass(frozen=True)
class RoundProfile:
    """One round's ``(eps, delta)`` pairs on a grid of per-round deltas.

    Attributes:
        deltas: Per-round delta of each pair (after subsampling, if any).
        epsilons: Per-round epsilon of each pair.
        users: Number of users the shuffle bound was computed for (at the largest delta;
            smaller for check-in, where it is a low quantile of the participants).
    """

    deltas: np.ndarray
    epsilons: np.ndarray
    users: int


def _one_round(
    n: int, sigma: float | None, eps0: float | None, delta: float, method: str
) -> float | None:
    if sigma is not None:
        return clones_gaussian(n=n, sigma=sigma, delta=delta, method=method).epsilon
    assert eps0 is not None
    if method == "numerical":
        return clones_epsilon(n=n, eps0=eps0, delta=delta).upper
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ClonesValidityWarning)
        return clones_closed_form(n=n, eps0=eps0, delta=delta)


def round_profile(
    *,
    n: int,
    sigma: float | None = None,
    eps0: float | None = None,
    delta_max: float,
    rate: float | None = None,
    method: str = "numerical",
    points: int = 24,
    decades: float = 10.0,
) -> RoundProfile:
    """Per-round ``(eps, delta)`` pairs for shuffled reports by the clones method.

    Give exactly one of ``sigma`` (Gaussian reports, Theorem 3.8) and ``eps0`` (``eps0``-DP
    local randomizers, Theorems 3.1/3.2).

    Args:
        n: Population (integer >= 1). Without ``rate`` all ``n`` users report every round.
        sigma: Noise std over the input domain's L2 diameter (> 0).
        eps0: Local epsilon of each report (> 0).
        delta_max: Largest per-round delta on the grid, in ``(0, 1)``.
        rate: Check-in rate in ``(0, 1]``; ``None`` for plain shuffling.
        method: ``"numerical"`` or ``"closed-form"`` (see :func:`.clones.clones_gaussian`).
        points: Grid points (integer >= 1; one point is ``delta_max`` alone).
        decades: Span of the grid below ``delta_max`` in powers of ten (> 0).

    Returns:
        :class:`RoundProfile`; pairs without a bound (closed form outside its validity
        condition) are left out.

    Raises:
        ValueError: on an out-of-range argument.
    """
    n = check_int("n", n, minimum=1)
    if (sigma is None) == (eps0 is None):
        raise ValueError("give exactly one of sigma (Gaussian reports) and eps0 (eps0-LDP).")
    if sigma is not None:
        sigma = check_sigma(sigma)
    else:
        eps0 = check_positive("eps0", eps0)
    delta_max = check_delta(delta_max, "delta_max")
    points = check_int("points", points, minimum=1)
    decades = check_positive("decades", decades)
    if rate is not None:
        rate = check_probability("rate", rate)
    if method not in CLONES_METHODS:
        raise ValueError(f"method must be one of {', '.join(CLONES_METHODS)}. Found {method!r}.")
    deltas, epsilons = [], []
    users = n
    if points == 1:
        grid = np.array([delta_max])
    else:
        grid = np.logspace(math.log10(delta_max) - decades, math.log10(delta_max), points)
        grid[-1] = delta_max  # exactly, so that one round at delta_max is on the grid
    for d in grid:
        d = float(d)
        if rate is None or rate == 1.0:
            eps = _one_round(n, sigma, eps0, d, method)
            if eps is not None:
                deltas.append(d)
                epsilons.append(eps)
            continue
        # Check-in: spend delta_shuffle on the round's shuffle and tau on too few participants,
        # so that gamma * delta_shuffle + tau = d.
        tau = 1e-3 * d
        delta_shuffle = (d - tau) / rate
        if delta_shuffle >= 1.0:
            continue
        others = int(binom_ppf(tau, n - 1, rate))  # Pr[Bin(n - 1, rate) < others] < tau
        users = max(1, others + 1)
        eps = _one_round(users, sigma, eps0, delta_shuffle, method)
        if eps is not None:
            deltas.append(d)
            epsilons.append(math.log1p(rate * math.expm1(eps)))
    return RoundProfile(np.asarray(deltas), np.asarray(epsilons), users)


def composed_epsilon(profile: RoundProfile, *, steps: int, delta: float) -> float:
    """Epsilon after ``steps`` rounds at total ``delta`` (optimal composition, best split).

    Args:
        profile: From :func:`round_profile` (its ``delta_max`` should be at least
            ``delta / steps`` for the best split to be on the grid).
        steps: Number of rounds (integer >= 1).
        delta: Total delta in ``(0, 1)``.

    Returns:
        The smallest epsilon over the grid points whose per-round delta leaves room for the
        composition (``inf`` if none does).

    Raises:
        ValueError: on an out-of-range argument.
    """
    steps = check_int("steps", steps, minimum=1)
    delta = check_delta(delta)
    best = math.inf
    for d, e in zip(profile.deltas, profile.epsilons, strict=True):
        if -math.expm1(steps * math.log1p(-d)) > delta:
            continue
        try:
            best = min(
                best,
                compose_optimal_epsilon(eps=float(e), delta=float(d), k=steps, delta_total=delta),
            )
        except ValueError:  # no room left for the composition at this grid point
            continue
    return best


def composed_epsilons(
    *,
    n: int,
    sigma: float | None = None,
    eps0: float | None = None,
    steps: Sequence[int],
    delta: float,
    rate: float | None = None,
    method: str = "numerical",
) -> list[float]:
    """Clones + (check-in) + optimal composition for each round count in ``steps``.

    Args:
        n: Population (integer >= 1).
        sigma: Noise std over the input domain's L2 diameter (> 0), for Gaussian reports.
        eps0: Local epsilon (> 0), for ``eps0``-DP reports (give one of the two).
        steps: Round counts (integers >= 1).
        delta: Total delta in ``(0, 1)``.
        rate: Check-in rate, or ``None`` for every user in every round.
        method: ``"numerical"`` or ``"closed-form"``.

    Returns:
        Epsilon for each entry of ``steps``.

    Raises:
        ValueError: on an out-of-range argument.
    """
    delta = check_delta(delta)
    counts = [check_int("steps", s, minimum=1) for s in steps]
    if not counts:
        raise ValueError("steps must list at least one round count.")
    smallest = delta / max(counts) / 10.0
    decades = max(2.0, math.log10(delta / smallest) + 6.0)
    # One round needs no split of delta, so a single grid point (delta itself) is enough.
    points = 1 if max(counts) == 1 else 24
    profile = round_profile(
        n=n,
        sigma=sigma,
        eps0=eps0,
        delta_max=delta,
        rate=rate,
        method=method,
        points=points,
        decades=decades,
    )
    return [composed_epsilon(profile, steps=s, delta=delta) for s in counts]


_COMPOSITION = "optimal (Kairouz-Oh-Viswanath)"


def _clones_assumptions(gaussian: bool, rate: float | None) -> tuple[str, ...]:
    """Return what a clones result rests on besides replace-one adjacency."""
    report = (
        "every user adds Gaussian noise of this sigma (relative to the diameter of the input "
        "domain) to its own report"
        if gaussian
        else "every user's report comes from an eps0-LDP local randomiser"
    )
    out: tuple[str, ...] = (
        report,
        "the shuffle is secret: the server sees the reports only as an anonymous multiset",
    )
    if rate is not None:
        out += ("the check-in coins are secret: no adversary knows which users report in a round",)
    return out


def clones_results(
    *,
    n: int,
    steps: Sequence[int],
    delta: float,
    eps0: float | None = None,
    sigma: float | None = None,
    rate: float | None = None,
    method: str = "numerical",
) -> list[AccountingResult]:
    """Return the clones baseline as result records, one per round count.

    Give ``eps0`` for ``eps0``-LDP reports (mechanism ``clones``) or ``sigma`` for Gaussian
    reports (``clones-gaussian``; ``sigma`` over the input domain's diameter, optionally with a
    check-in ``rate``). One round is the clones bound itself; more rounds compose by the optimal
    composition theorem with the best per-round delta (:func:`composed_epsilons`). A one-round
    numerical ``eps0`` result carries the method's certified lower end (``epsilon_lower``); a
    closed form outside its validity condition gives ``epsilon = inf`` with a note saying why.

    Args:
        n: Population (integer >= 1).
        steps: Round counts (integers >= 1), one result each.
        delta: Total delta in ``(0, 1)``.
        eps0: Local epsilon of each report (> 0).
        sigma: Noise std over the input domain's L2 diameter (> 0).
        rate: Check-in rate (Gaussian reports only), or ``None`` for every user every round.
        method: ``"numerical"`` or ``"closed-form"``.

    Returns:
        One :class:`~shuffle_opacus.analysis.AccountingResult` (``kind="approximate"``) per
        entry of ``steps``.

    Raises:
        ValueError: on an out-of-range or inconsistent argument.
    """
    gaussian = sigma is not None
    if gaussian == (eps0 is not None):
        raise ValueError("give exactly one of sigma (Gaussian reports) and eps0 (eps0-LDP).")
    if rate is not None and not gaussian:
        raise ValueError(f"rate applies to Gaussian reports (sigma) only. Found {rate!r}.")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ClonesValidityWarning)
        epsilons = composed_epsilons(
            n=n, sigma=sigma, eps0=eps0, steps=steps, delta=delta, rate=rate, method=method
        )
    key, value = ("sigma", sigma) if gaussian else ("eps0", eps0)
    results = []
    for count, eps in zip(steps, epsilons, strict=True):
        note = None
        if not math.isfinite(eps):
            note = "no bound"
            if method == "closed-form":
                limit = closed_form_limit(n=n, delta=delta)
                note = f"closed form invalid: needs eps0 <= log(n/(16 log(4/delta))) = {limit:.4g}"
        lower = None
        if count == 1 and not gaussian and method == "numerical":
            lower = clones_epsilon(n=n, eps0=eps0, delta=delta).lower  # type: ignore[arg-type]
        results.append(
            AccountingResult(
                mechanism="clones-gaussian" if gaussian else "clones",
                method=method,
                epsilon=eps,
                delta=delta,
                steps=int(count),
                parameters={"n": n, key: value, "rate": rate},
                kind="approximate",
                accounting="clones bound per round, optimal composition over rounds",
                neighbouring="replace-one user",
                epsilon_lower=lower,
                note=note,
                assumptions=_clones_assumptions(gaussian, rate),
                extra={"composition": "none" if count == 1 else _COMPOSITION},
            )
        )
    return results
