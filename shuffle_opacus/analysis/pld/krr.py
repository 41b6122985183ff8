"""Tight PLD accounting for shuffled k-randomised response, against a strong or a weak adversary.

Koskela, Heikkilä & Honkela, *Numerical Accounting in the Shuffle Model of Differential
Privacy* (arXiv:2106.00477; "KHH"), §4 and Appendix C. Each of ``n`` users applies the k-ary
randomised response of Balle, Bell, Gascón & Nissim, *The Privacy Blanket of the Shuffle Model*
(arXiv:1903.02837): its true value in ``[k]`` with probability ``1 - gamma``, a uniform one
otherwise (``eps0``-LDP, :func:`krr_eps0`); the server sees the shuffled reports. The PLD of
the view of adversary ``A_s`` (``"strong"``, KHH Def. 12) or ``A_w`` (``"weak"``, Def. 14 and
Theorem 15) is exact over the bulk of its latent counts; the mass left out is added to every
delta and losses are rounded up, so deltas are upper bounds (:func:`krr_pld`,
:func:`krr_delta`, :func:`krr_epsilon`, :func:`krr_results`). :func:`krr_tail_delta` is the
looser tail probability the paper plots (Theorems 13 and 16).

Derivation, truncation bounds, cost and small cases: docs/maths.md, "Shuffled k-randomised
response".
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence

import numpy as np
from dp_accounting.pld.privacy_loss_distribution import PrivacyLossDistribution
from scipy.special import gammaln, xlogy
from scipy.stats import binom

from ...common.validation import check_delta, check_int, check_nonnegative, check_probability
from ..options import KRR_ADVERSARIES
from ..results import AccountingResult
from .common import (
    DEFAULT_DISCRETIZATION,
    DEFAULT_TAIL,
    binom_logpmf,
    check_discretization,
    check_tail,
    default_tail,
    pld_delta,
    pld_epsilon,
    pld_results,
    pmf_from_losses,
    prebin_losses,
)

__all__ = [
    "KRR_ADVERSARIES",
    "krr_eps0",
    "krr_pld",
    "krr_delta",
    "krr_epsilon",
    "krr_tail_delta",
    "krr_results",
]

# Outcomes of the weak adversary enumerated per chunk (whole values of b per chunk).
_CHUNK_POINTS = 2_000_000
# Relative margin on the truncated mass computed from binom.cdf / binom.sf.
_TAIL_MARGIN = 1.0 + 1e-9


def _check_adversary(value: object) -> str:
    if not isinstance(value, str) or value not in KRR_ADVERSARIES:
        allowed = ", ".join(repr(a) for a in KRR_ADVERSARIES)
        raise ValueError(f"adversary must be one of {allowed}. Found {value!r}.")
    return value


def _check_common(n: object, k: object, gamma: object) -> tuple[int, int, float]:
    return (
        check_int("n", n, minimum=1),
        check_int("k", k, minimum=2),
        check_probability("gamma", gamma),
    )


def krr_eps0(*, k: int, gamma: float) -> float:
    """Local privacy level of k-randomised response: ``log(((1 - gamma) k + gamma) / gamma)``.

    The largest likelihood ratio of one report is ``(1 - gamma + gamma/k) / (gamma/k)``.

    Args:
        k: Domain size, an integer ``>= 2``.
        gamma: Probability of answering uniformly at random, in ``(0, 1]``.

    Returns:
        ``eps0`` (0 when ``gamma = 1``).

    Raises:
        ValueError: if an argument is out of range.
    """
    k = check_int("k", k, minimum=2)
    gamma = check_probability("gamma", gamma)
    return math.log(((1.0 - gamma) * k + gamma) / gamma)


def _binom_range(
    trials: np.ndarray, prob: float, side: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Exact quantile range ``[lo, hi]`` of ``Bin(trials, prob)`` and the mass outside it.

    ``lo`` is the smallest value with ``cdf(lo) >= side`` and ``hi`` the smallest with
    ``sf(hi) <= side``, so each side leaves out less than about ``side``; the mass left out,
    ``cdf(lo - 1) + sf(hi)``, is returned as evaluated (not the nominal ``2 side``).
    """
    trials = np.atleast_1d(np.asarray(trials, dtype=np.int64))
    lo = np.nan_to_num(binom.ppf(side, trials, prob), nan=0.0)
    hi = np.nan_to_num(binom.isf(side, trials, prob), nan=0.0)
    lo = np.clip(lo, 0, trials).astype(np.int64)
    hi = np.clip(hi, lo, trials).astype(np.int64)
    out = binom.cdf(lo - 1, trials, prob) + binom.sf(hi, trials, prob)
    return lo, hi, np.maximum(out, 0.0)


def _log_trinomial(
    total: np.ndarray,
    m1: np.ndarray,
    m2: np.ndarray,
    log_p12: float,
    p_rest: float,
    log_fact: np.ndarray,
) -> np.ndarray:
    """Return ``log`` of the ``Multinomial(total; p, p, p_rest)`` pmf at ``(m1, m2, rest)``.

    ``rest = total - m1 - m2``, ``log_p12 = log p`` and ``log_fact[j] = log(j!)`` for every count
    that occurs. The value is ``-inf`` where a count is negative, or where ``p_rest = 0`` and
    ``rest > 0`` (``xlogy``).
    """
    rest = total - m1 - m2
    ok = (m1 >= 0) & (m2 >= 0) & (rest >= 0)
    m1c, m2c, rc = (np.where(ok, v, 0) for v in (m1, m2, rest))
    val = (
        log_fact[total]
        - log_fact[m1c]
        - log_fact[m2c]
        - log_fact[rc]
        + (m1c + m2c) * log_p12
        + xlogy(rc, p_rest)
    )
    return np.where(ok, val, -np.inf)


def _strong_latent(
    n: int, k: int, gamma: float, tail: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray, float]:
    """Enumerate ``(M1, M2)`` with ``log P(M1, M2)``; also return the mass of the pairs left out."""
    p = gamma / k
    lo, hi, out = _binom_range(np.array([n - 1]), p, tail / 4.0)
    vals = np.arange(int(lo[0]), int(hi[0]) + 1)
    m1, m2 = (a.ravel() for a in np.meshgrid(vals, vals, indexing="ij"))
    log_fact = gammaln(np.arange(n + 1) + 1.0)
    log_mass = _log_trinomial(
        np.full(m1.shape, n - 1), m1, m2, math.log(p), 1.0 - 2.0 * p, log_fact
    )
    keep = log_mass > -np.inf
    return m1[keep], m2[keep], log_mass[keep], 2.0 * float(out[0])


def _strong_outcomes(
    n: int, k: int, gamma: float, tail: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, float]:
    """Losses and masses of both directions for ``A_s``, plus the truncated-mass bound.

    Returns ``(loss_remove, mass_remove, loss_add, mass_add, neglected)``. The ``beta_n = 1``
    branch is the first entry (loss 0, mass ``gamma``).
    """
    m1, m2, log_mass, out = _strong_latent(n, k, gamma, tail)
    mass = np.concatenate([[gamma], (1.0 - gamma) * np.exp(log_mass)])
    safe_m1, safe_m2 = np.maximum(m1, 1), np.maximum(m2, 1)
    remove = np.where(m2 > 0, np.log((m1 + 1.0) / safe_m2), np.inf)
    add = np.where(m1 > 0, np.log((m2 + 1.0) / safe_m1), np.inf)
    loss_remove = np.concatenate([[0.0], remove])
    loss_add = np.concatenate([[0.0], add])
    return loss_remove, mass, loss_add, mass, (1.0 - gamma) * out * _TAIL_MARGIN


def _weak_plan(
    n: int, k: int, gamma: float, tail: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, float]:
    """Enumerate ``b`` with ``log P(B = b)`` and each ``M``-range; return the left-out mass too."""
    b_lo, b_hi, b_out = _binom_range(np.array([n - 1]), gamma, tail / 4.0)
    bs = np.arange(int(b_lo[0]), int(b_hi[0]) + 1)
    log_pb = binom_logpmf(bs, n - 1, gamma)
    m_lo, m_hi, m_out = _binom_range(bs, 1.0 / k, tail / 8.0)
    neglected = float(b_out[0]) + 2.0 * float(np.sum(np.exp(log_pb) * m_out))
    return bs, log_pb, m_lo, m_hi, neglected * _TAIL_MARGIN


def _weak_chunks(n: int, k: int, gamma: float, tail: float) -> Iterator[tuple[np.ndarray, ...]]:
    """Yield ``(b, n1, n2, log_p, log_q)`` over the enumerated ``A_w`` outcomes, by whole ``b``.

    Outcomes ``(n1, n2)`` range over ``[lo(b), hi(b) + 1]^2`` with ``n1 + n2 <= b + 1``, which
    contains every outcome of an enumerated latent ``(b, M1, M2)``.
    """
    bs, log_pb, m_lo, m_hi, _ = _weak_plan(n, k, gamma, tail)
    w_true = math.log(1.0 - gamma + gamma / k)
    w_other = math.log(gamma / k)
    # (1 - 2/k) for the rest of the b random reports, (k - 2) gamma/k for Y outside {1, 2}.
    log_p12 = -math.log(k)
    p_rest = 1.0 - 2.0 / k
    w_rest = math.log((k - 2) * gamma / k) if k > 2 else -np.inf
    log_fact = gammaln(np.arange(n + 2) + 1.0)
    widths = (m_hi - m_lo + 2) ** 2
    ends = np.cumsum(widths)
    first = 0
    while first < bs.size:
        last = int(np.searchsorted(ends, ends[first] - widths[first] + _CHUNK_POINTS, "right"))
        last = max(last, first + 1)
        parts = []
        for i in range(first, last):
            vals = np.arange(int(m_lo[i]), int(m_hi[i]) + 2)
            a1, a2 = (a.ravel() for a in np.meshgrid(vals, vals, indexing="ij"))
            keep = a1 + a2 <= bs[i] + 1
            parts.append((np.full(int(keep.sum()), bs[i]), a1[keep], a2[keep]))
        b, n1, n2 = (np.concatenate([p[j] for p in parts]) for j in range(3))
        base = np.repeat(log_pb[first:last], [p[0].size for p in parts])
        t_y1 = _log_trinomial(b, n1 - 1, n2, log_p12, p_rest, log_fact)  # Y = 1
        t_y2 = _log_trinomial(b, n1, n2 - 1, log_p12, p_rest, log_fact)  # Y = 2
        t_rest = _log_trinomial(b, n1, n2, log_p12, p_rest, log_fact)  # Y elsewhere
        mix_rest = w_rest + t_rest if k > 2 else np.full(b.shape, -np.inf)
        log_p = base + np.logaddexp(np.logaddexp(w_true + t_y1, w_other + t_y2), mix_rest)
        log_q = base + np.logaddexp(np.logaddexp(w_other + t_y1, w_true + t_y2), mix_rest)
        keep = (log_p > -np.inf) | (log_q > -np.inf)
        yield b[keep], n1[keep], n2[keep], log_p[keep], log_q[keep]
        first = last


def _weak_loss(log_p: np.ndarray, log_q: np.ndarray) -> np.ndarray:
    """``log P - log Q`` with ``+inf`` where only ``Q`` vanishes (never both, by construction)."""
    return np.where(log_q > -np.inf, log_p - np.where(log_q > -np.inf, log_q, 0.0), np.inf)


def _weak_binned(
    n: int, k: int, gamma: float, tail: float, discretization: float
) -> tuple[dict[tuple[str, bool], tuple[np.ndarray, np.ndarray]], float]:
    """Pre-binned ``(loss, mass)`` of ``A_w`` per (direction, rounding); the neglected mass."""
    parts: dict[tuple[str, bool], list[tuple[np.ndarray, np.ndarray]]] = {
        (d, e): [] for d in ("remove", "add") for e in (True, False)
    }
    for _, _, _, log_p, log_q in _weak_chunks(n, k, gamma, tail):
        for direction, loss, mass in (
            ("remove", _weak_loss(log_p, log_q), np.exp(log_p)),
            ("add", _weak_loss(log_q, log_p), np.exp(log_q)),
        ):
            for est in (True, False):
                parts[direction, est].append(
                    prebin_losses(loss, mass, discretization=discretization, pessimistic=est)
                )
    binned = {
        key: (np.concatenate([x[0] for x in v]), np.concatenate([x[1] for x in v]))
        for key, v in parts.items()
    }
    return binned, _weak_plan(n, k, gamma, tail)[4]


def _krr_plds(
    n: int,
    k: int,
    gamma: float,
    adversary: str,
    tail: float,
    discretization: float,
    both: bool = True,
) -> tuple[PrivacyLossDistribution, PrivacyLossDistribution]:
    """Pessimistic and optimistic PLDs of one round (arguments taken as validated).

    The pessimistic PMFs put the neglected mass at ``+inf``; the optimistic ones drop it and
    keep only the genuinely infinite losses (e.g. ``M2 = 0`` for ``A_s``). With ``both=False``
    the optimistic PLD has the remove direction only: a lower end still, at half the cost of
    composing it, and the same for these symmetric pairs (labels 1 and 2 exchange).
    """
    if adversary == "strong":
        loss_r, mass_r, loss_a, mass_a, neglected = _strong_outcomes(n, k, gamma, tail)
        binned = {
            (d, e): (loss, mass)
            for d, loss, mass in (("remove", loss_r, mass_r), ("add", loss_a, mass_a))
            for e in (True, False)
        }
    else:
        binned, neglected = _weak_binned(n, k, gamma, tail, discretization)
    plds = []
    for est in (True, False):
        pmfs = [
            pmf_from_losses(
                *binned[direction, est],
                infinity_mass=neglected if est else 0.0,
                discretization=discretization,
                pessimistic=est,
            )
            for direction in (("remove", "add") if est or both else ("remove",))
        ]
        plds.append(PrivacyLossDistribution(*pmfs))
    return plds[0], plds[1]


def krr_pld(
    *,
    n: int,
    k: int,
    gamma: float,
    adversary: str = "strong",
    steps: int = 1,
    discretization: float = DEFAULT_DISCRETIZATION,
    tail: float = DEFAULT_TAIL,
    pessimistic: bool = True,
) -> PrivacyLossDistribution:
    """PLD of ``steps`` rounds of shuffled k-RR against adversary ``A_s`` or ``A_w``.

    Args:
        n: Users per round, ``>= 1``.
        k: Domain size, an integer ``>= 2``.
        gamma: Probability that a user answers uniformly at random, in ``(0, 1]``.
        adversary: ``"strong"`` (``A_s``, knows every ``beta_i``) or ``"weak"`` (``A_w``, not
            ``beta_n``).
        steps: Number of rounds, ``>= 1``.
        discretization: Loss grid step, in ``(0, 1]``.
        tail: Budget for the truncated mass per round, in ``(0, 1)``; the bound on the mass
            actually left out (at most about ``tail``) is added to every delta.
        pessimistic: Losses rounded up and the truncated mass at ``+inf`` (an upper bound on
            every delta, the default), or rounded down with it dropped (a lower bound; a
            composition may add up to ``2e-15``, see :func:`~.common.lower_epsilon`).

    Returns:
        A ``dp_accounting`` ``PrivacyLossDistribution`` with remove (``log P/Q`` under ``P``)
        and add (``log Q/P`` under ``Q``) directions.

    Raises:
        ValueError: if an argument is out of range.
    """
    n, k, gamma = _check_common(n, k, gamma)
    adversary = _check_adversary(adversary)
    steps = check_int("steps", steps, minimum=1)
    discretization = check_discretization(discretization)
    tail = check_tail(tail)
    upper, lower = _krr_plds(n, k, gamma, adversary, tail, discretization)
    pld = upper if pessimistic else lower
    return pld if steps == 1 else pld.self_compose(steps)


def krr_delta(
    eps: float,
    *,
    n: int,
    k: int,
    gamma: float,
    adversary: str = "strong",
    steps: int = 1,
    discretization: float = DEFAULT_DISCRETIZATION,
    tail: float = DEFAULT_TAIL,
) -> float:
    """Upper bound on the tight ``delta(eps)`` of ``steps`` rounds of shuffled k-RR.

    Args:
        eps: Target epsilon, ``>= 0``.
        n: Users per round, ``>= 1``.
        k: Domain size, an integer ``>= 2``.
        gamma: Probability that a user answers uniformly at random, in ``(0, 1]``.
        adversary: One of :data:`KRR_ADVERSARIES` (see :func:`krr_pld`).
        steps: Number of rounds, ``>= 1``.
        discretization: Loss grid step, in ``(0, 1]``.
        tail: Budget for the truncated mass per round, in ``(0, 1)``.

    Returns:
        delta, the larger of the remove and add directions (at most 1).

    Raises:
        ValueError: if an argument is out of range.
    """
    eps = check_nonnegative("eps", eps)
    pld = krr_pld(
        n=n,
        k=k,
        gamma=gamma,
        adversary=adversary,
        steps=steps,
        discretization=discretization,
        tail=tail,
    )
    return pld_delta(pld, eps)


def krr_epsilon(
    delta: float,
    *,
    n: int,
    k: int,
    gamma: float,
    adversary: str = "strong",
    steps: int = 1,
    discretization: float = DEFAULT_DISCRETIZATION,
    tail: float | None = None,
) -> float:
    """Smallest epsilon on the loss grid with ``delta(epsilon) <= delta`` for shuffled k-RR.

    Args:
        delta: Target delta, in ``(0, 1)``.
        n: Users per round, ``>= 1``.
        k: Domain size, an integer ``>= 2``.
        gamma: Probability that a user answers uniformly at random, in ``(0, 1]``.
        adversary: One of :data:`KRR_ADVERSARIES` (see :func:`krr_pld`).
        steps: Number of rounds, ``>= 1``.
        discretization: Loss grid step, in ``(0, 1]``.
        tail: Budget for the truncated mass per round, in ``(0, 1)``; by default
            ``min(1e-12, 1e-3 delta / steps)`` (:func:`~.common.default_tail`).

    Returns:
        epsilon, clamped at 0 (``inf`` if ``delta`` is below the mass at infinite loss, e.g.
        ``1 - gamma`` for the strong adversary with ``n = 1``).

    Raises:
        ValueError: if an argument is out of range.
    """
    delta = check_delta(delta)
    if tail is None:
        tail = default_tail(delta, check_int("steps", steps, minimum=1))
    pld = krr_pld(
        n=n,
        k=k,
        gamma=gamma,
        adversary=adversary,
        steps=steps,
        discretization=discretization,
        tail=tail,
    )
    return pld_epsilon(pld, delta)


def krr_tail_delta(
    eps: float,
    *,
    n: int,
    k: int,
    gamma: float,
    adversary: str = "strong",
    tail: float = DEFAULT_TAIL,
) -> float:
    """Return the paper's one-round bound ``P(Z >= eps)`` (KHH Theorems 13 and 16).

    Strong adversary (Theorem 13, eq. C.7): ``Z = log(N1/N2)`` with ``N1 = M1 + 1``, ``N2 = M2``
    and ``(M1, M2)`` *jointly* multinomial, ``Multinomial(n - 1; gamma/k, gamma/k, ...)``: both
    count the random reports of the same ``n - 1`` users, one of whom cannot report both 1 and
    2, which is the law Balle et al.'s proof conditions on (the paper's "``Bin(n-1, gamma/k)``"
    gives the marginals only). As in the paper, the ``beta_n = 1`` branch is ignored: the
    probability is not multiplied by ``1 - gamma`` (``Z = +inf`` when ``M2 = 0``).

    Weak adversary (Theorem 16): ``Z`` is the privacy loss ``log P(b, n1, n2)/Q(b, n1, n2)`` under
    ``P``, with the joint law of ``(B, n1, n2)`` of the proof of Theorem 15 (eq. C.2).

    This is what KHH plots (Figure 4, through its Fourier accountant). It bounds the
    hockey-stick delta of :func:`krr_delta` from above: ``H_{e^eps} = E[(1 - e^{eps - L})_+]
    <= P(L >= eps)`` (and for ``A_s`` the omitted factor ``1 - gamma`` only adds). The PLD route
    is therefore tighter. Ties ``Z = eps`` count (relative tolerance ``1e-12``), and the bound on
    the truncated mass is added, so the value returned is an upper bound on ``P(Z >= eps)``.

    Args:
        eps: Target epsilon, ``>= 0``.
        n: Users per round, ``>= 1``.
        k: Domain size, an integer ``>= 2``.
        gamma: Probability that a user answers uniformly at random, in ``(0, 1]``.
        adversary: One of :data:`KRR_ADVERSARIES` (see :func:`krr_pld`).
        tail: Budget for the truncated mass, in ``(0, 1)``.

    Returns:
        ``P(Z >= eps)`` plus the truncated-mass bound, at most 1.

    Raises:
        ValueError: if an argument is out of range.
    """
    eps = check_nonnegative("eps", eps)
    n, k, gamma = _check_common(n, k, gamma)
    adversary = _check_adversary(adversary)
    tail = check_tail(tail)
    threshold = eps - 1e-12 * max(1.0, eps)
    if adversary == "strong":
        m1, m2, log_mass, out = _strong_latent(n, k, gamma, tail)
        z = np.where(m2 > 0, np.log((m1 + 1.0) / np.maximum(m2, 1)), np.inf)
        total = float(np.exp(log_mass[z >= threshold]).sum()) + out * _TAIL_MARGIN
    else:
        total = _weak_plan(n, k, gamma, tail)[4]
        for _, _, _, log_p, log_q in _weak_chunks(n, k, gamma, tail):
            z = _weak_loss(log_p, log_q)
            total += float(np.exp(log_p[z >= threshold]).sum())
    return min(1.0, total)


def krr_results(
    *,
    n: int,
    k: int,
    gamma: float,
    steps: Sequence[int],
    delta: float,
    adversary: str = "strong",
) -> list[AccountingResult]:
    """Epsilon of shuffled k-RR after each round count, as result records.

    The PLDs of one round (:func:`krr_pld`, pessimistic and optimistic) are built once with
    the truncated mass per round set by :func:`~.common.default_tail` for the largest count,
    then composed: ``epsilon`` is the upper end and ``epsilon_lower`` the lower end for the
    exact pair of the chosen adversary.

    Args:
        n: Users per round, ``>= 1``.
        k: Domain size, an integer ``>= 2``.
        gamma: Probability that a user answers uniformly at random, in ``(0, 1]``.
        steps: Round counts (integers >= 1), one result each.
        delta: Target delta in ``(0, 1)``.
        adversary: One of :data:`KRR_ADVERSARIES`.

    Returns:
        One :class:`~shuffle_opacus.analysis.AccountingResult` (``kind="pld"``) per count.

    Raises:
        ValueError: on an out-of-range argument.
    """
    counts = [check_int("steps", s, minimum=1) for s in steps]
    if not counts:
        raise ValueError("steps must list at least one round count.")
    tail = default_tail(delta, max(counts))
    n, k, gamma = _check_common(n, k, gamma)
    adversary = _check_adversary(adversary)
    upper, lower = _krr_plds(n, k, gamma, adversary, tail, DEFAULT_DISCRETIZATION, both=False)
    parameters = {"n": n, "k": k, "gamma": gamma, "adversary": adversary}
    return pld_results(
        upper,
        lower=lower,
        mechanism="krr",
        parameters=parameters,
        steps=counts,
        delta=delta,
        tail=tail,
        assumptions=(
            "every user reports through k-randomised response with this k and gamma (secret "
            "coins) and the server sees only the shuffled reports",
        ),
    )
