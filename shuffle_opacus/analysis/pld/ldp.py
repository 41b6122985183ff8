"""Privacy loss distributions (PLDs) for shuffled eps0-LDP reports, via ``dp_accounting``.

Koskela, Heikkilä & Honkela, *Numerical Accounting in the Shuffle Model of Differential
Privacy* (arXiv:2106.00477; "KHH" below), §3 and Appendices A–B, account for shufflers with the
dominating pair of Feldman, McMillan & Talwar, *Stronger Privacy Amplification by Shuffling for
Rényi and Approximate Differential Privacy* (arXiv:2208.04591, Theorem 3.1; KHH eq. 3.1). With
``p = 1/(e^{eps0} + 1)``, ``q = e^{eps0} p = 1 - p``:

    P = (A + D1, C - A + D2),  Q = (A + D2, C - A + D1),
    C ~ Bin(n - 1, 2p),  A ~ Bin(C, 1/2),  D1 ~ Bern(q),  D2 ~ Bin(1 - D1, p / (1 - q)).

Written as mixtures (KHH §3.1), ``P = q P0 + (1-q) q~ P1 + (1-q)(1-q~) P2`` and
``Q = (1-q) q~ P0 + q P1 + (1-q)(1-q~) P2`` with ``P0 = (A+1, C-A)``, ``P1 = (A, C-A+1)``,
``P2 = (A, C-A)`` and ``q~ = p/(1 - q)``. For a pure ``eps0``-LDP randomiser ``q~ = 1``, so the
``P2`` component has weight zero and ``D2 = 1 - D1``. By KHH Lemma A.1, ``P0(a, b) = (a/b)
P1(a, b)`` and the privacy loss at an outcome ``(a, b)`` depends on ``a/b`` only:

    s(a, b) = log P(a, b) / Q(a, b) = log((e^{eps0} a + b) / (a + e^{eps0} b))  in [-eps0, eps0].

Assumptions, stated once for the module:

* Neighbouring datasets differ in one user's input (replace-one). Every user runs an
  ``eps0``-DP local randomiser (possibly chosen adaptively, FMT22 Theorem 3.1) and the server
  sees only the shuffled reports. By KHH Lemma 8 / Corollary 9 the pair ``(P, Q)`` dominates
  the shuffler: ``H_a(A_s(X) || A_s(X')) <= H_a(P || Q)`` for all ``a >= 0``.
* ``Q`` is ``P`` with its coordinates swapped (``C - A`` has the law of ``A``), so
  ``H_a(P || Q) = H_a(Q || P)``. Both directions are still built and composed; their agreement
  is a test.
* Compositions multiply dominating pairs (Zhu, Dong & Wang, arXiv:2106.08567; KHH Theorem 4),
  so PLDs of rounds with different ``n`` or ``eps0`` compose by convolution.

Truncation (KHH Lemma 11): outcomes are enumerated only for ``C`` in the Hoeffding set ``S_n``
and, given ``C = c``, for ``a`` in the Hoeffding set of ``Bin(c, 1/2)`` widened by one so that it
covers the ``A``-range of both mixture components. The neglected mass is at most ``tail`` under
``P`` and under ``Q``; it is placed at privacy loss ``+inf``, which adds it to every delta (the
``delta(inf)`` term of KHH Appendix B). ``O(n log(1/tail))`` outcomes remain.

Discretisation: each privacy loss is rounded *up* to a multiple of ``discretization`` before the
PMF is handed to ``dp_accounting.pld`` (pessimistic estimate), and compositions use its FFT
convolution with pessimistic tail truncation, so every delta returned is an upper bound on the
delta of the dominating pair (up to floating-point error).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
from dp_accounting.pld import pld_pmf
from dp_accounting.pld.privacy_loss_distribution import PrivacyLossDistribution
from scipy.special import gammaln, logsumexp
from scipy.stats import binom

from .._validation import check_delta, check_int, check_nonnegative, check_positive
from ..results import AccountingResult
from .common import (
    DEFAULT_DISCRETIZATION,
    DEFAULT_TAIL,
    check_discretization,
    check_tail,
    compose_plds,
    default_tail,
    pld_results,
)

__all__ = [
    "MAX_EPS0",
    "FeldmanPair",
    "feldman_pair",
    "ldp_shuffle_pld",
    "ldp_shuffle_delta",
    "ldp_shuffle_epsilon",
    "ldp_shuffle_rdp",
    "subsampled_ldp_shuffle_pld",
    "subsampled_profile",
    "ldp_shuffle_results",
]

# Outcomes enumerated per chunk; bounds the memory of the n = 10^6 case to a few hundred MB.
_CHUNK_POINTS = 2_000_000

MAX_EPS0 = 100.0
"""Largest local epsilon accepted: the loss grid spans [-eps0, eps0] (2e6 bins at eps0 = 100)."""


def _check_eps0(value: object) -> float:
    e = check_positive("eps0", value)
    if e > MAX_EPS0:
        raise ValueError(f"eps0 must be a finite number in (0, {MAX_EPS0:g}]. Found {value!r}.")
    return e


@dataclass(frozen=True)
class FeldmanPair:
    """Truncated support of the FMT22 dominating pair (KHH eq. 3.1 and Lemma 11).

    Attributes:
        loss: ``s(a, b) = log P(a,b)/Q(a,b)`` of each enumerated outcome.
        log_p: ``log P(a, b)``.
        log_q: ``log Q(a, b)``.
        tail: Bound on the mass of the outcomes not enumerated, under ``P`` and under ``Q``.
    """

    loss: np.ndarray
    log_p: np.ndarray
    log_q: np.ndarray
    tail: float


def _hoeffding_range(trials: int, prob: float, tail: float) -> tuple[int, int]:
    """Integer range outside which ``Bin(trials, prob)`` has mass at most ``tail / 2``.

    Hoeffding: ``P(|X - trials*prob| >= c*trials) <= 2 exp(-2 trials c^2)``, and
    ``2 exp(-2 trials c^2) <= tail/2`` for ``c = sqrt(log(4/tail) / (2 trials))`` (Lemma 11).
    """
    if trials == 0:
        return 0, 0
    c = math.sqrt(math.log(4.0 / tail) / (2.0 * trials))
    lo = max(0, math.ceil((prob - c) * trials))
    hi = min(trials, math.floor((prob + c) * trials))
    return lo, hi


def _chunks(n: int, eps0: float, tail: float) -> Iterator[tuple[np.ndarray, ...]]:
    """Yield ``(loss, log_p, log_q)`` over the Lemma 11 outcomes, in chunks of whole ``c``."""
    p = 1.0 / (math.exp(eps0) + 1.0)
    q = 1.0 - p
    log_p_w, log_q_w = math.log(p), math.log(q)
    c_lo, c_hi = _hoeffding_range(n - 1, 2.0 * p, tail)
    cs = np.arange(c_lo, c_hi + 1)
    log_pc = binom.logpmf(cs, n - 1, 2.0 * p)
    widths = np.empty(cs.size, dtype=np.int64)
    starts = np.empty(cs.size, dtype=np.int64)
    for k, count in enumerate(cs):
        a_lo, a_hi = _hoeffding_range(int(count), 0.5, tail)
        # P0 puts A = a - 1 at a, P1 puts A = a at a: cover both Hoeffding sets.
        starts[k] = a_lo
        widths[k] = a_hi + 1 - a_lo + 1
    ends = np.cumsum(widths)
    first = 0
    while first < cs.size:
        last = int(np.searchsorted(ends, ends[first] - widths[first] + _CHUNK_POINTS, "right"))
        last = max(last, first + 1)
        sel = slice(first, last)
        w = widths[sel]
        c = np.repeat(cs[sel], w)
        offsets = np.arange(int(w.sum())) - np.repeat(np.cumsum(w) - w, w)
        a = np.repeat(starts[sel], w) + offsets
        b = c + 1 - a
        log_norm = np.repeat(log_pc[sel] - cs[sel] * math.log(2.0), w) + gammaln(c + 1.0)
        with np.errstate(invalid="ignore"):
            # log binom(c, a - 1) and log binom(c, a); -inf where the coefficient is zero.
            lb0 = np.where(
                (a >= 1) & (a - 1 <= c), log_norm - gammaln(a) - gammaln(c - a + 2.0), -np.inf
            )
            lb1 = np.where(a <= c, log_norm - gammaln(a + 1.0) - gammaln(c - a + 1.0), -np.inf)
        log_p = np.logaddexp(log_q_w + lb0, log_p_w + lb1)
        log_q = np.logaddexp(log_p_w + lb0, log_q_w + lb1)
        e = math.exp(eps0)
        loss = np.log((e * a + b) / (a + e * b))
        yield loss, log_p, log_q
        first = last


def feldman_pair(*, n: int, eps0: float, tail: float = DEFAULT_TAIL) -> FeldmanPair:
    """Enumerate the truncated FMT22 dominating pair for ``n`` users (KHH Lemma 11).

    Args:
        n: Number of users, ``>= 1``.
        eps0: Local privacy parameter, ``> 0``.
        tail: Bound on the neglected mass under each of ``P`` and ``Q``, in ``(0, 1)``.

    Returns:
        A :class:`FeldmanPair`.

    Raises:
        ValueError: if an argument is out of range.
    """
    n = check_int("n", n, minimum=1)
    eps0 = _check_eps0(eps0)
    tail = check_tail(tail)
    parts = list(_chunks(n, eps0, tail))
    loss, log_p, log_q = (np.concatenate([part[i] for part in parts]) for i in range(3))
    return FeldmanPair(loss, log_p, log_q, tail)


def _pmfs(
    n: int, eps0: float, tail: float, discretization: float
) -> tuple[pld_pmf.DensePLDPmf, pld_pmf.DensePLDPmf]:
    """Remove (``P/Q`` under ``P``) and add (``Q/P`` under ``Q``) PMFs, binned chunk by chunk."""
    lo = math.floor(-eps0 / discretization) - 1
    hi = math.ceil(eps0 / discretization) + 1
    remove = np.zeros(hi - lo + 1)
    add = np.zeros(hi - lo + 1)
    for loss, log_p, log_q in _chunks(n, eps0, tail):
        idx_r = np.ceil(loss / discretization).astype(np.int64) - lo
        idx_a = np.ceil(-loss / discretization).astype(np.int64) - lo
        remove += np.bincount(idx_r, weights=np.exp(log_p), minlength=remove.size)
        add += np.bincount(idx_a, weights=np.exp(log_q), minlength=add.size)
    return (
        pld_pmf.DensePLDPmf(discretization, lo, remove, tail, True),
        pld_pmf.DensePLDPmf(discretization, lo, add, tail, True),
    )


def ldp_shuffle_pld(
    *,
    n: int,
    eps0: float,
    steps: int = 1,
    discretization: float = DEFAULT_DISCRETIZATION,
    tail: float = DEFAULT_TAIL,
) -> PrivacyLossDistribution:
    """PLD of ``steps`` adaptive rounds of shuffling ``n`` ``eps0``-LDP reports.

    KHH Corollaries 9–10: each round is dominated by the FMT22 pair; the composition by the
    product pair, whose PLD is the ``steps``-fold convolution (``dp_accounting`` FFT, pessimistic).

    Args:
        n: Users per round, ``>= 1``.
        eps0: Local privacy parameter of each report, ``> 0``.
        steps: Number of rounds, ``>= 1``.
        discretization: Loss grid step, in ``(0, 1]``.
        tail: Truncated mass per round (added to delta), in ``(0, 1)``.

    Returns:
        A ``dp_accounting`` ``PrivacyLossDistribution`` with remove and add directions.

    Raises:
        ValueError: if an argument is out of range.
    """
    n = check_int("n", n, minimum=1)
    eps0 = _check_eps0(eps0)
    steps = check_int("steps", steps, minimum=1)
    discretization = check_discretization(discretization)
    tail = check_tail(tail)
    pld = PrivacyLossDistribution(*_pmfs(n, eps0, tail, discretization))
    return pld if steps == 1 else pld.self_compose(steps)


def _schedule(
    n: int | Sequence[int], eps0: float | Sequence[float], steps: int | Sequence[int]
) -> list[tuple[int, float, int]]:
    """Normalise scalar-or-sequence round parameters to ``[(n, eps0, steps), ...]``."""
    seqs = [np.atleast_1d(np.asarray(v, dtype=object)) for v in (n, eps0, steps)]
    length = max(s.size for s in seqs)
    for name, s in zip(("n", "eps0", "steps"), seqs, strict=True):
        if s.size not in (1, length):
            raise ValueError(
                f"{name} must be a scalar or have the same length as the other per-round "
                f"parameters ({length}). Found length {s.size}."
            )
    seqs = [np.broadcast_to(s, (length,)) for s in seqs]
    return [
        (
            check_int("n", seqs[0][i], minimum=1),
            _check_eps0(seqs[1][i]),
            check_int("steps", seqs[2][i], minimum=1),
        )
        for i in range(length)
    ]


def _schedule_pld(
    n: int | Sequence[int],
    eps0: float | Sequence[float],
    steps: int | Sequence[int],
    discretization: float,
    tail: float,
) -> PrivacyLossDistribution:
    plan = _schedule(n, eps0, steps)
    discretization = check_discretization(discretization)
    tail = check_tail(tail)
    return compose_plds(
        plds=[
            ldp_shuffle_pld(n=ni, eps0=ei, steps=si, discretization=discretization, tail=tail)
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

    Returns:
        delta, the larger of the remove and add directions.

    Raises:
        ValueError: if an argument is out of range.
    """
    eps = check_nonnegative("eps", eps)
    pld = _schedule_pld(n, eps0, steps, discretization, tail)
    return float(min(1.0, pld.get_delta_for_epsilon(eps)))


def ldp_shuffle_epsilon(
    delta: float,
    *,
    n: int | Sequence[int],
    eps0: float | Sequence[float],
    steps: int | Sequence[int] = 1,
    discretization: float = DEFAULT_DISCRETIZATION,
    tail: float | None = None,
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
    pld = _schedule_pld(n, eps0, steps, discretization, tail)
    return max(0.0, float(pld.get_epsilon_for_delta(delta)))


def ldp_shuffle_rdp(
    *, n: int, eps0: float, orders: np.ndarray | Sequence[float], tail: float | None = None
) -> np.ndarray:
    """Rényi divergence ``D_l(P || Q)`` of the FMT22 pair, an RDP bound for the shuffler.

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
        tail: Truncated mass; by default ``1e-12 e^{-(l_max - 1) eps0}`` (at least ``1e-300``),
            which keeps the bound term negligible for orders up to about ``690 / eps0``.

    Returns:
        Array of RDP values, one per order (same order as given).

    Raises:
        ValueError: if an argument is out of range.
    """
    n = check_int("n", n, minimum=1)
    eps0 = _check_eps0(eps0)
    alphas = np.atleast_1d(np.asarray(orders, dtype=float))
    if alphas.ndim != 1 or alphas.size == 0 or np.any(~np.isfinite(alphas)) or np.any(alphas <= 1):
        raise ValueError(f"orders must be finite numbers > 1. Found {orders!r}.")
    if tail is None:
        tail = max(1e-300, 1e-12 * math.exp(-min(690.0, (alphas.max() - 1.0) * eps0)))
    tail = check_tail(tail)
    acc = np.full(alphas.size, -np.inf)
    for loss, log_p, _ in _chunks(n, eps0, tail):
        for i, alpha in enumerate(alphas):
            acc[i] = np.logaddexp(acc[i], logsumexp(log_p + (alpha - 1.0) * loss))
    acc = np.logaddexp(acc, math.log(tail) + (alphas - 1.0) * eps0)
    return np.minimum(acc / (alphas - 1.0), eps0)


def _hockey_stick_curve(first: np.ndarray, second: np.ndarray, alphas: np.ndarray) -> np.ndarray:
    """``H_a(first || second) = sum (first - a second)_+`` at each ``a``."""
    with np.errstate(divide="ignore"):
        ratio = np.where(second > 0, first / second, np.inf)
    order = np.argsort(-ratio)
    ratio, first, second = ratio[order], first[order], second[order]
    cum_first = np.concatenate(([0.0], np.cumsum(first)))
    cum_second = np.concatenate(([0.0], np.cumsum(second)))
    # Number of outcomes with ratio > a: they make up the positive part.
    count = np.searchsorted(-ratio, -alphas, side="left")
    return np.maximum(cum_first[count] - alphas * cum_second[count], 0.0)


def subsampled_profile(
    alphas: np.ndarray | Sequence[float],
    *,
    m: int,
    eps0: float,
    rate: float,
    tail: float = DEFAULT_TAIL,
) -> np.ndarray:
    """Privacy profile ``h(a)`` of KHH eq. 2.3 for a shuffle of a fixed-size subsample.

    KHH Lemma 7 (Zhu, Dong & Wang, arXiv:2106.08567, Proposition 30; substitute relation): if
    ``(P, Q)`` dominates the shuffler on datasets of ``m = rate * n`` users, the mechanism that
    shuffles a uniformly random subset of ``m`` of the ``n`` users satisfies ``H_a <= h(a)`` with

        h(a) = max{ H_a(rate P + (1 - rate) Q || Q),  H_a(P || rate Q + (1 - rate) P) }.

    ``(P, Q)`` is the FMT22 pair for ``m`` users, truncated as in Lemma 11; the neglected outcomes
    carry at most ``tail`` of the first argument's mass, so ``tail`` is added to ``h``.

    Args:
        alphas: Points ``a >= 0`` (``a = e^eps``).
        m: Users in each round's subsample, ``>= 1``.
        eps0: Local privacy parameter, ``> 0``.
        rate: Sampling ratio ``m / n`` in ``(0, 1]``.
        tail: Truncated mass, in ``(0, 1)``.

    Returns:
        ``h`` at each point (clipped to ``[0, 1]``).

    Raises:
        ValueError: if an argument is out of range.
    """
    m = check_int("m", m, minimum=1)
    eps0 = _check_eps0(eps0)
    rate = check_positive("rate", rate)
    if rate > 1.0:
        raise ValueError(f"rate must be in (0, 1]. Found {rate!r}.")
    tail = check_tail(tail)
    a = np.atleast_1d(np.asarray(alphas, dtype=float))
    if np.any(~np.isfinite(a)) or np.any(a < 0):
        raise ValueError(f"alphas must be finite numbers >= 0. Found {alphas!r}.")
    pair = feldman_pair(n=m, eps0=eps0, tail=tail)
    p, q = np.exp(pair.log_p), np.exp(pair.log_q)
    first = _hockey_stick_curve(rate * p + (1.0 - rate) * q, q, a)
    second = _hockey_stick_curve(p, rate * q + (1.0 - rate) * p, a)
    return np.minimum(np.maximum(first, second) + tail, 1.0)


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

    Args:
        n: Users in the population, ``>= m``.
        m: Users drawn (uniformly, without replacement) per round, ``>= 1``.
        eps0: Local privacy parameter, ``> 0``.
        steps: Rounds, ``>= 1``.
        points: Grid size ``n_alpha``, ``>= 2``.
        eps_range: ``(eps_1, eps_{n_alpha})`` of the grid, ``eps_1 < eps_{n_alpha}``.
        discretization: Loss grid step of the PMF; grid points are rounded to multiples of it.
        tail: Truncated mass of the underlying pair, in ``(0, 1)``.

    Returns:
        A symmetric ``PrivacyLossDistribution`` (``h`` bounds both directions).

    Raises:
        ValueError: if an argument is out of range.
    """
    n = check_int("n", n, minimum=1)
    m = check_int("m", m, minimum=1, maximum=n)
    eps0 = _check_eps0(eps0)
    steps = check_int("steps", steps, minimum=1)
    points = check_int("points", points, minimum=2)
    discretization = check_discretization(discretization)
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
    grid = np.unique(np.round(np.linspace(lo, hi, points) / discretization).astype(np.int64))
    deltas = subsampled_profile(np.exp(grid * discretization), m=m, eps0=eps0, rate=rate, tail=tail)
    # h is nonincreasing; enforce it exactly against rounding before the dp_accounting check.
    deltas = np.minimum.accumulate(deltas)
    pmf = pld_pmf.create_pmf_pessimistic_connect_dots(discretization, grid, deltas)
    pld = PrivacyLossDistribution(pmf.to_dense_pmf())
    return pld if steps == 1 else pld.self_compose(steps)


def ldp_shuffle_results(
    *, n: int, eps0: float, steps: Sequence[int], delta: float, m: int | None = None
) -> list[AccountingResult]:
    """Epsilon of shuffled ``eps0``-LDP reports after each round count, as result records.

    The PLD of one round (:func:`ldp_shuffle_pld`, or :func:`subsampled_ldp_shuffle_pld` when
    ``m`` of the ``n`` users report per round) is built once with the truncated mass per round
    set by :func:`~.common.default_tail` for the largest count, then composed.

    Args:
        n: Users, ``>= 1``.
        eps0: Local privacy parameter, ``> 0``.
        steps: Round counts (integers >= 1), one result each.
        delta: Target delta in ``(0, 1)``.
        m: Users drawn per round (``1..n``), or ``None`` for all ``n``.

    Returns:
        One :class:`~shuffle_opacus.analysis.AccountingResult` (``kind="pld"``) per count.

    Raises:
        ValueError: on an out-of-range argument.
    """
    counts = [check_int("steps", s, minimum=1) for s in steps]
    if not counts:
        raise ValueError("steps must list at least one round count.")
    tail = default_tail(delta, max(counts))
    parameters: dict[str, object] = {"n": n, "eps0": eps0}
    if m is None:
        base = ldp_shuffle_pld(n=n, eps0=eps0, tail=tail)
    else:
        base = subsampled_ldp_shuffle_pld(n=n, m=m, eps0=eps0, tail=tail)
        parameters["m"] = m
    return pld_results(
        base, mechanism="ldp-shuffle", parameters=parameters, steps=counts, delta=delta, tail=tail
    )
