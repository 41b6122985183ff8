"""Privacy loss distributions (PLDs) for shuffled eps0-LDP reports, via ``dp_accounting``.

Koskela, Heikkilä & Honkela, *Numerical Accounting in the Shuffle Model of Differential
Privacy* (arXiv:2106.00477; "KHH"), §3 and Appendices A–B: replace-one neighbours, every user
runs an ``eps0``-DP local randomiser (possibly chosen adaptively) and the server sees only the
shuffled reports, so a dominating pair of Feldman, McMillan & Talwar (:mod:`.ldp_pairs`)
bounds the shuffler. ``pair="clones"`` (default) is *Hiding Among the Clones*
(arXiv:2012.12803), Theorem 3.2, proven for every randomiser; ``pair="stronger"`` is *Stronger
Privacy Amplification by Shuffling* (arXiv:2208.04591), Theorem 3.1, which its errata restrict
to randomisers such as binary and k-ary randomised response
(:func:`~.ldp_pairs.stronger_pair_applies`). :func:`ldp_shuffle_pld`, :func:`ldp_shuffle_delta`,
:func:`ldp_shuffle_epsilon` and :func:`ldp_shuffle_results` compose rounds (also of different
``n`` or ``eps0``), :func:`ldp_shuffle_rdp` gives the pair's RDP, and
:func:`subsampled_ldp_shuffle_pld` / :func:`subsampled_profile` take ``m`` of ``n`` users (KHH
Lemma 7). The mass left out by KHH Lemma 11 is added to every delta and losses are rounded up,
so deltas are upper bounds for the pair; results also carry the optimistic end.

Derivations: docs/maths.md, "PLD accounting for shuffled ε0-LDP reports and k-RR".
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from dp_accounting.pld import pld_pmf
from dp_accounting.pld.privacy_loss_distribution import PrivacyLossDistribution
from scipy.special import logsumexp

from ...common.validation import check_delta, check_int, check_nonnegative, check_positive
from ..options import LDP_PAIRS, LDP_SHUFFLE_METHODS
from ..results import AccountingResult
from .common import (
    DEFAULT_DISCRETIZATION,
    DEFAULT_TAIL,
    MIN_TAIL,
    check_discretization,
    check_tail,
    compose_plds,
    default_tail,
    per_round,
    pld_delta,
    pld_epsilon,
    pld_results,
)
from .ldp_pairs import (
    MAX_EPS0,
    FeldmanPair,
    check_eps0,
    check_pair,
    feldman_pair,
    ldp_assumptions,
    pair_chunks,
    pair_pmfs,
)

__all__ = [
    "MAX_EPS0",
    "FeldmanPair",
    "feldman_pair",
    "ldp_assumptions",
    "ldp_shuffle_pld",
    "ldp_shuffle_delta",
    "ldp_shuffle_epsilon",
    "ldp_shuffle_rdp",
    "subsampled_ldp_shuffle_pld",
    "subsampled_profile",
    "ldp_shuffle_results",
]


def _plds(
    n: int, eps0: float, tail: float, discretization: float, pair: str, both: bool = True
) -> tuple[PrivacyLossDistribution, PrivacyLossDistribution]:
    """Pessimistic and optimistic PLDs of one round, from one enumeration.

    With ``both=False`` the optimistic PLD keeps the remove direction only: still a lower end
    (epsilon is the larger of the two directions), at half the cost of composing it, and equal
    to both here since ``Q`` is ``P`` swapped.
    """
    pmfs = pair_pmfs(n=n, eps0=eps0, tail=tail, discretization=discretization, pair=pair)
    return (
        PrivacyLossDistribution(pmfs.remove_upper, pmfs.add_upper),
        PrivacyLossDistribution(pmfs.remove_lower, pmfs.add_lower if both else None),
    )


def ldp_shuffle_pld(
    *,
    n: int,
    eps0: float,
    steps: int = 1,
    discretization: float = DEFAULT_DISCRETIZATION,
    tail: float = DEFAULT_TAIL,
    pair: str = "clones",
    pessimistic: bool = True,
) -> PrivacyLossDistribution:
    """PLD of ``steps`` adaptive rounds of shuffling ``n`` ``eps0``-LDP reports.

    KHH Corollaries 9–10: each round is dominated by the chosen pair; the composition by the
    product pair, whose PLD is the ``steps``-fold convolution (``dp_accounting`` FFT).

    Args:
        n: Users per round, ``>= 1``.
        eps0: Local privacy parameter of each report, in ``(0, MAX_EPS0]``.
        steps: Number of rounds, ``>= 1``.
        discretization: Loss grid step, in ``(0, 1]``.
        tail: Truncated mass per round (added to delta when pessimistic), in ``(0, 1)``.
        pair: ``"clones"`` (default, any eps0-LDP randomiser) or ``"stronger"`` (only the
            randomisers of arXiv:2208.04591's errata; see :mod:`.ldp_pairs`).
        pessimistic: Losses rounded up and the truncated mass at ``+inf`` (an upper bound on
            every delta, the default), or rounded down with the truncated mass dropped (a lower
            bound; a composition may add up to ``2e-15``, see :func:`~.common.lower_epsilon`).

    Returns:
        A ``dp_accounting`` ``PrivacyLossDistribution`` with remove and add directions.

    Raises:
        ValueError: if an argument is out of range.
    """
    n = check_int("n", n, minimum=1)
    eps0 = check_eps0(eps0)
    steps = check_int("steps", steps, minimum=1)
    discretization = check_discretization(discretization)
    tail = check_tail(tail)
    pair = check_pair(pair)
    upper, lower = _plds(n, eps0, tail, discretization, pair)
    pld = upper if pessimistic else lower
    return pld if steps == 1 else pld.self_compose(steps)


def _schedule(
    n: int | Sequence[int], eps0: float | Sequence[float], steps: int | Sequence[int]
) -> list[tuple[int, float, int]]:
    """Normalise scalar-or-sequence round parameters to ``[(n, eps0, steps), ...]``."""
    return [
        (check_int("n", ni, minimum=1), check_eps0(ei), check_int("steps", si, minimum=1))
        for ni, ei, si in per_round({"n": n, "eps0": eps0, "steps": steps})
    ]


def _schedule_pld(
    n: int | Sequence[int],
    eps0: float | Sequence[float],
    steps: int | Sequence[int],
    discretization: float,
    tail: float,
    pair: str,
) -> PrivacyLossDistribution:
    plan = _schedule(n, eps0, steps)
    discretization = check_discretization(discretization)
    tail = check_tail(tail)
    pair = check_pair(pair)
    return compose_plds(
        plds=[
            ldp_shuffle_pld(
                n=ni, eps0=ei, steps=si, discretization=discretization, tail=tail, pair=pair
            )
            for ni, ei, si in plan
        ]
    )


def ldp_shuffle_delta(
    eps: float,
    *,
    n: int | Sequence[int],
    eps0: float | Sequence[float],
    steps: int | Sequence[int] = 1,
    discretization: float = DEFAULT_DISCRETIZATION,
    tail: float = DEFAULT_TAIL,
    pair: str = "clones",
) -> float:
    """Upper bound on delta(eps) of composed shuffles of ``eps0``-LDP reports (PLD accounting).

    Per-round parameters may be sequences of equal length (heterogeneous composition: group
    ``i`` has ``steps[i]`` rounds of ``n[i]`` users at ``eps0[i]``); scalars broadcast.

    Args:
        eps: Target epsilon, ``>= 0``.
        n: Users per round (scalar or per group).
        eps0: Local privacy parameter (scalar or per group).
        steps: Rounds (scalar or per group).
        discretization: Loss grid step, in ``(0, 1]``.
        tail: Truncated mass per round, in ``(0, 1)``.
        pair: ``"clones"`` (default, any eps0-LDP randomiser) or ``"stronger"`` (only the
            randomisers of arXiv:2208.04591's errata; see :mod:`.ldp_pairs`).

    Returns:
        delta, the larger of the remove and add directions.

    Raises:
        ValueError: if an argument is out of range.
    """
    check_nonnegative("eps", eps)
    pld = _schedule_pld(n, eps0, steps, discretization, tail, pair)
    return pld_delta(pld, eps)


def ldp_shuffle_epsilon(
    delta: float,
    *,
    n: int | Sequence[int],
    eps0: float | Sequence[float],
    steps: int | Sequence[int] = 1,
    discretization: float = DEFAULT_DISCRETIZATION,
    tail: float | None = None,
    pair: str = "clones",
) -> float:
    """Smallest epsilon on the loss grid with delta(epsilon) <= ``delta`` (PLD accounting).

    Arguments as in :func:`ldp_shuffle_delta`, with ``delta`` in ``(0, 1)`` instead of ``eps``.
    The truncated mass is added to every delta, so by default ``tail`` is
    ``min(1e-12, 1e-3 delta / rounds)``, keeping it negligible against the target.

    Returns:
        epsilon (``inf`` if even the truncated mass exceeds ``delta``).

    Raises:
        ValueError: if an argument is out of range.
    """
    delta = check_delta(delta)
    if tail is None:
        rounds = sum(si for _, _, si in _schedule(n, eps0, steps))
        tail = default_tail(delta, rounds)
    pld = _schedule_pld(n, eps0, steps, discretization, tail, pair)
    return pld_epsilon(pld, delta)


def ldp_shuffle_rdp(
    *,
    n: int,
    eps0: float,
    orders: np.ndarray | Sequence[float],
    tail: float | None = None,
    pair: str = "clones",
) -> np.ndarray:
    """Rényi divergence ``D_l(P || Q)`` of a dominating pair, an RDP bound for the shuffler.

    ``D_l(P||Q) = log(sum P e^{(l-1) s}) / (l - 1)`` over the Lemma 11 outcomes, plus a bound
    for the neglected ones: they carry mass at most ``tail`` under ``P`` and loss at most
    ``eps0``, so they add at most ``tail * e^{(l-1) eps0}`` inside the logarithm. The result is
    also capped at ``eps0`` (``D_l <= D_inf = eps0``). Being a divergence of a dominating pair
    under post-processing, this bounds the RDP of the shuffler in both directions (the pair is
    symmetric). KHH §3.3 uses the same truncation heuristically; here its error is bounded.

    Args:
        n: Users, ``>= 1``.
        eps0: Local privacy parameter, ``> 0``.
        orders: Real orders ``> 1``.
        tail: Truncated mass; by default ``1e-12 e^{-(l_max - 1) eps0}`` (at least ``1e-290``),
            which keeps the bound term negligible for orders up to about ``640 / eps0``.
        pair: ``"clones"`` (default, any eps0-LDP randomiser) or ``"stronger"`` (only the
            randomisers of arXiv:2208.04591's errata, whose RDP results, Corollary 4.3 and
            Theorem 5.2, carry the same restriction).

    Returns:
        Array of RDP values, one per order (same order as given).

    Raises:
        ValueError: if an argument is out of range.
    """
    n = check_int("n", n, minimum=1)
    eps0 = check_eps0(eps0)
    pair = check_pair(pair)
    alphas = np.atleast_1d(np.asarray(orders, dtype=float))
    if alphas.ndim != 1 or alphas.size == 0 or np.any(~np.isfinite(alphas)) or np.any(alphas <= 1):
        raise ValueError(f"orders must be finite numbers > 1. Found {orders!r}.")
    if tail is None:
        tail = max(MIN_TAIL, 1e-12 * math.exp(-min(690.0, (alphas.max() - 1.0) * eps0)))
    tail = check_tail(tail)
    acc = np.full(alphas.size, -np.inf)
    for loss, log_p, _ in pair_chunks(n, eps0, tail, pair):
        for i, alpha in enumerate(alphas):
            acc[i] = np.logaddexp(acc[i], logsumexp(log_p + (alpha - 1.0) * loss))
    acc = np.logaddexp(acc, math.log(tail) + (alphas - 1.0) * eps0)
    return np.minimum(acc / (alphas - 1.0), eps0)


def _hockey_stick_curve(first: np.ndarray, second: np.ndarray, alphas: np.ndarray) -> np.ndarray:
    """``H_a(first || second) = sum (first - a second)_+`` at each ``a``."""
    # Divide only where ``second > 0`` (an outcome with ``second = 0`` has ratio inf, whatever
    # ``first`` is): dividing everywhere warns about the 0 / 0 of outcomes neither side reaches.
    ratio = np.full(first.shape, np.inf)
    np.divide(first, second, out=ratio, where=second > 0)
    order = np.argsort(-ratio)
    ratio, first, second = ratio[order], first[order], second[order]
    cum_first = np.concatenate(([0.0], np.cumsum(first)))
    cum_second = np.concatenate(([0.0], np.cumsum(second)))
    # Number of outcomes with ratio > a: they make up the positive part.
    count = np.searchsorted(-ratio, -alphas, side="left")
    return np.maximum(cum_first[count] - alphas * cum_second[count], 0.0)


def _check_rate(rate: object) -> float:
    r = check_positive("rate", rate)
    if r > 1.0:
        raise ValueError(f"rate must be in (0, 1]. Found {rate!r}.")
    return r


def _profile(pair: FeldmanPair, rate: float, a: np.ndarray) -> np.ndarray:
    """``h`` of KHH eq. 2.3 at the points ``a`` from an enumerated pair (``tail`` added)."""
    p, q = np.exp(pair.log_p), np.exp(pair.log_q)
    first = _hockey_stick_curve(rate * p + (1.0 - rate) * q, q, a)
    second = _hockey_stick_curve(p, rate * q + (1.0 - rate) * p, a)
    return np.minimum(np.maximum(first, second) + pair.tail, 1.0)


def subsampled_profile(
    alphas: np.ndarray | Sequence[float],
    *,
    m: int,
    eps0: float,
    rate: float,
    tail: float = DEFAULT_TAIL,
    pair: str = "clones",
) -> np.ndarray:
    """Privacy profile ``h(a)`` of KHH eq. 2.3 for a shuffle of a fixed-size subsample.

    KHH Lemma 7 (Zhu, Dong & Wang, arXiv:2106.08567, Proposition 30; substitute relation): if
    ``(P, Q)`` dominates the shuffler on datasets of ``m = rate * n`` users, the mechanism that
    shuffles a uniformly random subset of ``m`` of the ``n`` users satisfies ``H_a <= h(a)`` with

        h(a) = max{ H_a(rate P + (1 - rate) Q || Q),  H_a(P || rate Q + (1 - rate) P) }.

    The lemma needs nothing of ``(P, Q)`` but that it dominates the shuffler of ``m`` users for
    every pair of neighbouring datasets, which both pairs do (the stronger one within its
    class). ``(P, Q)`` is truncated as in Lemma 11; the neglected outcomes carry at most
    ``tail`` of the first argument's mass, so ``tail`` is added to ``h``.

    Args:
        alphas: Points ``a >= 0`` (``a = e^eps``).
        m: Users in each round's subsample, ``>= 1``.
        eps0: Local privacy parameter, in ``(0, MAX_EPS0]``.
        rate: Sampling ratio ``m / n`` in ``(0, 1]``.
        tail: Truncated mass, in ``(0, 1)``.
        pair: ``"clones"`` (default) or ``"stronger"`` (see :func:`ldp_shuffle_pld`).

    Returns:
        ``h`` at each point (clipped to ``[0, 1]``).

    Raises:
        ValueError: if an argument is out of range.
    """
    m = check_int("m", m, minimum=1)
    eps0 = check_eps0(eps0)
    rate = _check_rate(rate)
    tail = check_tail(tail)
    a = np.atleast_1d(np.asarray(alphas, dtype=float))
    if np.any(~np.isfinite(a)) or np.any(a < 0):
        raise ValueError(f"alphas must be finite numbers >= 0. Found {alphas!r}.")
    return _profile(feldman_pair(n=m, eps0=eps0, tail=tail, pair=pair), rate, a)


def _mixture_pld(
    pair: FeldmanPair, rate: float, discretization: float, both: bool = True
) -> PrivacyLossDistribution:
    """Optimistic PLD of ``(rate P + (1 - rate) Q, Q)`` (remove) and its reverse (add).

    By the symmetry of ``(P, Q)`` the add direction has the profile of the second term of
    ``h``; both lie below ``h``, and so does every composition of them below the composed
    connect-the-dots pair. Losses rounded down, the truncated mass dropped. ``both=False``
    keeps the remove direction only (a lower end still, and the larger one in practice).
    """
    with np.errstate(divide="ignore"):  # rate = 1: the mixture is P itself
        log_mix = np.logaddexp(math.log(rate) + pair.log_p, np.log1p(-rate) + pair.log_q)
    loss = log_mix - pair.log_q
    scaled = loss / discretization
    lo = int(np.floor(min(scaled.min(), -scaled.max())))
    pmfs = [
        pld_pmf.DensePLDPmf(
            discretization,
            lo,
            np.bincount(np.floor(x).astype(np.int64) - lo, weights=np.exp(w)),
            0.0,
            False,
        )
        for x, w in ((scaled, log_mix), (-scaled, pair.log_q))[: 2 if both else 1]
    ]
    return PrivacyLossDistribution(*pmfs)


def _subsampled_plds(
    n: int,
    m: int,
    eps0: float,
    points: int,
    eps_range: tuple[float, float] | None,
    discretization: float,
    tail: float,
    pair: str,
    both: bool = True,
) -> tuple[PrivacyLossDistribution, PrivacyLossDistribution]:
    """Connect-the-dots PLD (upper) and optimistic mixture PLD (lower) of one round."""
    rate = m / n
    if eps_range is None:
        top = math.log1p(rate * math.expm1(eps0))
        eps_range = (-top, top)
    try:
        lo, hi = (float(v) for v in eps_range)
    except (TypeError, ValueError):
        raise ValueError(f"eps_range must be a pair of numbers. Found {eps_range!r}.") from None
    if not (math.isfinite(lo) and math.isfinite(hi) and lo < hi):
        raise ValueError(f"eps_range must be (low, high) with low < high. Found {eps_range!r}.")
    enumerated = feldman_pair(n=m, eps0=eps0, tail=tail, pair=pair)
    grid = np.unique(np.round(np.linspace(lo, hi, points) / discretization).astype(np.int64))
    deltas = _profile(enumerated, rate, np.exp(grid * discretization))
    # h is nonincreasing; enforce it exactly against rounding before the dp_accounting check.
    deltas = np.minimum.accumulate(deltas)
    pmf = pld_pmf.create_pmf_pessimistic_connect_dots(discretization, grid, deltas)
    return (
        PrivacyLossDistribution(pmf.to_dense_pmf()),
        _mixture_pld(enumerated, rate, discretization, both),
    )


def subsampled_ldp_shuffle_pld(
    *,
    n: int,
    m: int,
    eps0: float,
    steps: int = 1,
    points: int = 1001,
    eps_range: tuple[float, float] | None = None,
    discretization: float = DEFAULT_DISCRETIZATION,
    tail: float = DEFAULT_TAIL,
    pair: str = "clones",
    pessimistic: bool = True,
) -> PrivacyLossDistribution:
    """PLD of ``steps`` rounds that each shuffle the reports of ``m`` users drawn from ``n``.

    KHH §3.4: the profile ``h`` of :func:`subsampled_profile` is turned into a discrete
    dominating pair by the pessimistic connect-the-dots algorithm of Doroshenko, Ghazi, Kamath,
    Kumar & Manurangsi, *Connect the Dots* (arXiv:2207.04380, Algorithm 1; ``dp_accounting``'s
    ``create_pmf_pessimistic_connect_dots``). ``h`` is convex in ``a = e^eps``, so the chords
    between grid points lie above it and the pair dominates. Past the last grid point the
    remaining ``h`` goes to loss ``+inf``.

    By default the grid spans ``[-eps_max, eps_max]`` with ``eps_max = log(1 + rate (e^eps0 - 1))``,
    the largest privacy loss of either mixture in ``h`` (``h`` is ``tail`` beyond it). KHH
    Figure 2 uses ``[-0.25, 0.25]``; pass ``eps_range`` to reproduce it.

    With ``pessimistic=False`` the result is instead the optimistic PLD of the mixture pair
    ``(rate P + (1 - rate) Q, Q)`` itself (losses rounded down, truncated mass dropped): the
    exact privacy of subsampling the pair, a lower end for what Lemma 7 can certify.

    Args:
        n: Users in the population, ``>= m``.
        m: Users drawn (uniformly, without replacement) per round, ``>= 1``.
        eps0: Local privacy parameter, in ``(0, MAX_EPS0]``.
        steps: Rounds, ``>= 1``.
        points: Grid size ``n_alpha``, ``>= 2``.
        eps_range: ``(eps_1, eps_{n_alpha})`` of the grid, ``eps_1 < eps_{n_alpha}``.
        discretization: Loss grid step of the PMF; grid points are rounded to multiples of it.
        tail: Truncated mass of the underlying pair, in ``(0, 1)``.
        pair: ``"clones"`` (default) or ``"stronger"`` (see :func:`ldp_shuffle_pld`).
        pessimistic: The connect-the-dots upper bound (default) or the optimistic lower end.

    Returns:
        A ``PrivacyLossDistribution`` (symmetric when pessimistic: ``h`` bounds both directions).

    Raises:
        ValueError: if an argument is out of range.
    """
    n = check_int("n", n, minimum=1)
    m = check_int("m", m, minimum=1, maximum=n)
    eps0 = check_eps0(eps0)
    steps = check_int("steps", steps, minimum=1)
    points = check_int("points", points, minimum=2)
    discretization = check_discretization(discretization)
    pair = check_pair(pair)
    upper, lower = _subsampled_plds(n, m, eps0, points, eps_range, discretization, tail, pair)
    pld = upper if pessimistic else lower
    return pld if steps == 1 else pld.self_compose(steps)


def ldp_shuffle_results(
    *,
    n: int,
    eps0: float,
    steps: Sequence[int],
    delta: float,
    m: int | None = None,
    pair: str = "clones",
) -> list[AccountingResult]:
    """Epsilon of shuffled ``eps0``-LDP reports after each round count, as result records.

    The PLDs of one round (:func:`ldp_shuffle_pld`, or :func:`subsampled_ldp_shuffle_pld` when
    ``m`` of the ``n`` users report per round) are built once with the truncated mass per round
    set by :func:`~.common.default_tail` for the largest count, then composed. Each record's
    ``epsilon`` is the pessimistic estimate and ``epsilon_lower`` the optimistic one of the same
    pair; its ``assumptions`` name the pair (:func:`ldp_assumptions`).

    Args:
        n: Users, ``>= 1``.
        eps0: Local privacy parameter, in ``(0, MAX_EPS0]``.
        steps: Round counts (integers >= 1), one result each.
        delta: Target delta in ``(0, 1)``.
        m: Users drawn per round (``1..n``), or ``None`` for all ``n``.
        pair: ``"clones"`` (default, method ``pld``) or ``"stronger"`` (method
            ``pld-stronger``; only for the randomisers of arXiv:2208.04591's errata).

    Returns:
        One :class:`~shuffle_opacus.analysis.AccountingResult` (``kind="pld"``) per count.

    Raises:
        ValueError: on an out-of-range argument.
    """
    counts = [check_int("steps", s, minimum=1) for s in steps]
    if not counts:
        raise ValueError("steps must list at least one round count.")
    pair = check_pair(pair)
    n = check_int("n", n, minimum=1)
    eps0 = check_eps0(eps0)
    delta = check_delta(delta)
    tail = default_tail(delta, max(counts))
    parameters: dict[str, object] = {"n": n, "eps0": eps0}
    # The lower ends keep one direction each (see _plds and _mixture_pld): half the cost.
    if m is None:
        upper, lower = _plds(n, eps0, tail, DEFAULT_DISCRETIZATION, pair, both=False)
    else:
        m = check_int("m", m, minimum=1, maximum=n)
        upper, lower = _subsampled_plds(
            n, m, eps0, 1001, None, DEFAULT_DISCRETIZATION, tail, pair, both=False
        )
        parameters["m"] = m
    return pld_results(
        upper,
        lower=lower,
        mechanism="ldp-shuffle",
        method=LDP_SHUFFLE_METHODS[LDP_PAIRS.index(pair)],
        parameters=parameters,
        steps=counts,
        delta=delta,
        tail=tail,
        assumptions=ldp_assumptions(pair, subsampled=m is not None),
        extra={"pair": pair},
    )
