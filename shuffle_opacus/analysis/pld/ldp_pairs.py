"""The two dominating pairs of shuffled eps0-LDP reports, enumerated and binned.

Feldman, McMillan & Talwar reduce the shuffle of ``n`` eps0-LDP reports to a pair ``(P, Q)`` of
distributions over two counts (``C ~ Bin(n - 1, r)`` clones split at random between them, plus
the differing report). Their two pairs (:data:`LDP_PAIRS`) differ only in the clone probability
``r`` (:func:`clone_probability`). ``"clones"`` (default, ``r = e^{-eps0}``): *Hiding Among the
Clones* (arXiv:2012.12803), Theorem 3.2, proven for every sequence of adaptively chosen
eps0-LDP randomisers. ``"stronger"`` (``r = 2 / (e^{eps0} + 1)``, so a smaller epsilon):
*Stronger Privacy Amplification by Shuffling for Rényi and Approximate Differential Privacy*
(arXiv:2208.04591), Theorem 3.1, which the errata of its later arXiv versions restrict to
randomisers with ``R(x) >= (R(x0) + R(x1)) / (e^{eps0} + 1)`` for all inputs
(:data:`STRONGER_PAIR_CONDITION`, :func:`stronger_pair_applies`): binary and k-ary randomised
response qualify, not every eps0-LDP randomiser does. :func:`feldman_pair`, :func:`pair_chunks`
and :func:`pair_pmfs` enumerate the Hoeffding sets of Koskela, Heikkilä & Honkela
(arXiv:2106.00477, Lemma 11) and bin the losses up (pessimistic, the mass left out at ``+inf``)
or down (optimistic, that mass dropped).

Derivations: docs/maths.md, "PLD accounting for shuffled ε0-LDP reports and k-RR".
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
from dp_accounting.pld import pld_pmf
from scipy.special import gammaln

from ...common.validation import check_int, check_positive
from ..options import LDP_PAIRS
from .common import DEFAULT_TAIL, binom_logpmf, check_discretization, check_tail

__all__ = [
    "LDP_PAIRS",
    "MAX_EPS0",
    "STRONGER_PAIR_CONDITION",
    "FeldmanPair",
    "PairPmfs",
    "check_pair",
    "clone_probability",
    "feldman_pair",
    "ldp_assumptions",
    "pair_chunks",
    "pair_pmfs",
    "stronger_pair_applies",
]

# Outcomes enumerated per chunk; bounds the memory of the n = 10^6 case to a few hundred MB.
_CHUNK_POINTS = 2_000_000

MAX_EPS0 = 100.0
"""Largest local epsilon accepted: the loss grid spans [-eps0, eps0] (2e6 bins at eps0 = 100)."""

STRONGER_PAIR_CONDITION = (
    "every user's local randomiser R lies in the restricted class of the errata of Feldman, "
    "McMillan & Talwar, Stronger Privacy Amplification by Shuffling (arXiv:2208.04591, later "
    "versions): R(x) >= (R(x0) + R(x1)) / (e^eps0 + 1) for all inputs x, x0, x1, i.e. Lemma "
    "3.5 holds with p = 1/(e^eps0 + 1) (true of binary and k-ary randomised response, not of "
    "every eps0-LDP randomiser)"
)
"""The assumption the ``stronger`` pair adds, in the words result records use."""


def check_pair(value: object) -> str:
    """Return ``value`` if it names a pair of :data:`LDP_PAIRS`.

    Raises:
        ValueError: otherwise.
    """
    if not isinstance(value, str) or value not in LDP_PAIRS:
        allowed = ", ".join(repr(v) for v in LDP_PAIRS)
        raise ValueError(f"pair must be one of {allowed}. Found {value!r}.")
    return value


def check_eps0(value: object) -> float:
    """Return ``value`` if it is a local epsilon in ``(0, MAX_EPS0]``.

    Raises:
        ValueError: otherwise.
    """
    e = check_positive("eps0", value)
    if e > MAX_EPS0:
        raise ValueError(f"eps0 must be a finite number in (0, {MAX_EPS0:g}]. Found {value!r}.")
    return e


def clone_probability(eps0: float, pair: str = "clones") -> float:
    """Probability that another user's report is a clone of the differing user's.

    Args:
        eps0: Local privacy parameter, in ``(0, MAX_EPS0]``.
        pair: ``"clones"`` (``e^{-eps0}``) or ``"stronger"`` (``2 / (e^{eps0} + 1)``).

    Returns:
        The parameter ``r`` of ``C ~ Bin(n - 1, r)``.

    Raises:
        ValueError: if an argument is out of range.
    """
    eps0 = check_eps0(eps0)
    if check_pair(pair) == "clones":
        return math.exp(-eps0)
    return 2.0 / (math.exp(eps0) + 1.0)


@dataclass(frozen=True)
class FeldmanPair:
    """Truncated support of one of the dominating pairs (Koskela et al. Lemma 11).

    Attributes:
        loss: ``s(a, b) = log P(a,b)/Q(a,b)`` of each enumerated outcome.
        log_p: ``log P(a, b)``.
        log_q: ``log Q(a, b)``.
        tail: Bound on the mass of the outcomes not enumerated, under ``P`` and under ``Q``.
        pair: Which pair, ``"clones"`` or ``"stronger"``.
    """

    loss: np.ndarray
    log_p: np.ndarray
    log_q: np.ndarray
    tail: float
    pair: str = "clones"


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


def pair_chunks(
    n: int, eps0: float, tail: float, pair: str = "clones"
) -> Iterator[tuple[np.ndarray, ...]]:
    """Yield ``(loss, log_p, log_q)`` over the Lemma 11 outcomes, in chunks of whole ``c``.

    Arguments are taken as validated (see :func:`feldman_pair`).
    """
    e = math.exp(eps0)
    log_p_w = -math.log1p(e)  # log P(D = 0) = log 1/(e^eps0 + 1)
    log_q_w = eps0 + log_p_w  # log P(D = 1) = log e^eps0/(e^eps0 + 1)
    prob = clone_probability(eps0, pair)
    c_lo, c_hi = _hoeffding_range(n - 1, prob, tail)
    cs = np.arange(c_lo, c_hi + 1)
    log_pc = binom_logpmf(cs, n - 1, prob)
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
        # log Gamma at the integers this chunk needs, evaluated once each and looked up: the
        # same values as gammaln at every outcome, bit for bit, with a few tables no longer
        # than the chunk (c + 1 per c; a and a + 1; c - a + 1 and c - a + 2).
        r = c - a
        a_low, r_low = int(a.min()), int(r.min()) + 1
        by_a = gammaln(np.arange(a_low, int(a.max()) + 2, dtype=float))
        by_r = gammaln(np.arange(r_low, int(r.max()) + 3, dtype=float))
        log_norm = np.repeat(log_pc[sel] - cs[sel] * math.log(2.0), w) + np.repeat(
            gammaln(cs[sel] + 1.0), w
        )
        with np.errstate(invalid="ignore"):
            # log binom(c, a - 1) and log binom(c, a); -inf where the coefficient is zero.
            lb0 = np.where(
                (a >= 1) & (a - 1 <= c),
                log_norm - by_a[a - a_low] - by_r[r + 2 - r_low],
                -np.inf,
            )
            lb1 = np.where(a <= c, log_norm - by_a[a + 1 - a_low] - by_r[r + 1 - r_low], -np.inf)
        log_p = np.logaddexp(log_q_w + lb0, log_p_w + lb1)
        log_q = np.logaddexp(log_p_w + lb0, log_q_w + lb1)
        loss = np.log((e * a + b) / (a + e * b))
        yield loss, log_p, log_q
        first = last


def feldman_pair(
    *, n: int, eps0: float, tail: float = DEFAULT_TAIL, pair: str = "clones"
) -> FeldmanPair:
    """Enumerate a truncated dominating pair for ``n`` users (Koskela et al. Lemma 11).

    Args:
        n: Number of users, ``>= 1``.
        eps0: Local privacy parameter, in ``(0, MAX_EPS0]``.
        tail: Bound on the neglected mass under each of ``P`` and ``Q``, in ``(0, 1)``.
        pair: ``"clones"`` (default; Hiding Among the Clones, arXiv:2012.12803, Theorem 3.2,
            any eps0-LDP randomiser) or ``"stronger"`` (arXiv:2208.04591, Theorem 3.1, only
            for the errata's class: :data:`STRONGER_PAIR_CONDITION`).

    Returns:
        A :class:`FeldmanPair`.

    Raises:
        ValueError: if an argument is out of range.
    """
    n = check_int("n", n, minimum=1)
    eps0 = check_eps0(eps0)
    tail = check_tail(tail)
    pair = check_pair(pair)
    parts = list(pair_chunks(n, eps0, tail, pair))
    loss, log_p, log_q = (np.concatenate([part[i] for part in parts]) for i in range(3))
    return FeldmanPair(loss, log_p, log_q, tail, pair)


@dataclass(frozen=True)
class PairPmfs:
    """The remove (``P/Q`` under ``P``) and add (``Q/P`` under ``Q``) PMFs of one pair.

    Attributes:
        remove_upper: Losses rounded up, left-out mass at ``+inf`` (pessimistic).
        add_upper: The same for the add direction.
        remove_lower: Losses rounded down, left-out mass dropped (optimistic).
        add_lower: The same for the add direction.
    """

    remove_upper: pld_pmf.DensePLDPmf
    add_upper: pld_pmf.DensePLDPmf
    remove_lower: pld_pmf.DensePLDPmf
    add_lower: pld_pmf.DensePLDPmf


def pair_pmfs(
    *, n: int, eps0: float, tail: float, discretization: float, pair: str = "clones"
) -> PairPmfs:
    """Bin one pair's outcomes both ways, chunk by chunk.

    Rounding a loss up can only raise every hockey-stick divergence, and placing the left-out
    mass at ``+inf`` adds it to every delta: the upper PMFs bound the pair from above. Rounding
    down and dropping the left-out mass can only lower them: the lower PMFs bound it from below.

    Args:
        n: Number of users, ``>= 1``.
        eps0: Local privacy parameter, in ``(0, MAX_EPS0]``.
        tail: Bound on the neglected mass, in ``(0, 1)``.
        discretization: Loss grid step, in ``(0, 1]``.
        pair: ``"clones"`` or ``"stronger"`` (see :func:`feldman_pair`).

    Returns:
        A :class:`PairPmfs`.

    Raises:
        ValueError: if an argument is out of range.
    """
    n = check_int("n", n, minimum=1)
    eps0 = check_eps0(eps0)
    tail = check_tail(tail)
    discretization = check_discretization(discretization)
    pair = check_pair(pair)
    lo = math.floor(-eps0 / discretization) - 1
    hi = math.ceil(eps0 / discretization) + 1
    bins = {key: np.zeros(hi - lo + 1) for key in ("ru", "au", "rl", "al")}
    for loss, log_p, log_q in pair_chunks(n, eps0, tail, pair):
        scaled = loss / discretization
        mass_p, mass_q = np.exp(log_p), np.exp(log_q)
        for key, idx, mass in (
            ("ru", np.ceil(scaled), mass_p),
            ("au", np.ceil(-scaled), mass_q),
            ("rl", np.floor(scaled), mass_p),
            ("al", np.floor(-scaled), mass_q),
        ):
            bins[key] += np.bincount(idx.astype(np.int64) - lo, weights=mass, minlength=hi - lo + 1)
    return PairPmfs(
        pld_pmf.DensePLDPmf(discretization, lo, bins["ru"], tail, True),
        pld_pmf.DensePLDPmf(discretization, lo, bins["au"], tail, True),
        pld_pmf.DensePLDPmf(discretization, lo, bins["rl"], 0.0, False),
        pld_pmf.DensePLDPmf(discretization, lo, bins["al"], 0.0, False),
    )


def stronger_pair_applies(probabilities: np.ndarray, *, eps0: float, rtol: float = 1e-9) -> bool:
    """Whether a finite randomiser lies in the class where the stronger pair is proven.

    The errata of arXiv:2208.04591 restrict its Theorems 3.1 and 3.2 to randomisers for which
    Lemma 3.5's decomposition exists with ``p = 1/(e^{eps0} + 1)``. With that ``p`` the two
    components of the differing inputs are determined, ``Q0 = (e^{eps0} R(x0) - R(x1)) /
    ((e^{2 eps0} - 1) p)`` and ``Q1`` likewise, and every other input needs
    ``R(x) - p (Q0 + Q1) >= 0``, that is ``R(x) >= (R(x0) + R(x1)) / (e^{eps0} + 1)``
    output by output, for all inputs ``x, x0, x1``. The randomiser must also be
    ``eps0``-LDP.

    Args:
        probabilities: Array of shape ``(inputs, outputs)``: row ``x`` is the output law of
            ``R(x)`` (rows sum to 1).
        eps0: The local privacy parameter the accounting uses, in ``(0, MAX_EPS0]``.
        rtol: Relative tolerance of the comparisons (floating-point rows).

    Returns:
        True when ``R`` is eps0-LDP and satisfies the condition for every triple of inputs.

    Raises:
        ValueError: if ``probabilities`` is not a 2-d array of probabilities whose rows sum
            to 1, or ``eps0`` is out of range.
    """
    eps0 = check_eps0(eps0)
    r = np.asarray(probabilities, dtype=float)
    if (
        r.ndim != 2
        or r.size == 0
        or np.any(~np.isfinite(r))
        or np.any(r < 0)
        or not np.allclose(r.sum(axis=1), 1.0, rtol=0.0, atol=1e-9)
    ):
        raise ValueError(
            "probabilities must be a 2-d array of output laws (rows >= 0 summing to 1). "
            f"Found shape {r.shape}."
        )
    e = math.exp(eps0)
    low, high = r.min(axis=0), r.max(axis=0)
    if np.any(high > e * low * (1.0 + rtol)):
        return False
    # The binding triple for each output: x at the smallest mass, x0 and x1 at the two largest.
    top_two = np.sort(r, axis=0)[-2:].sum(axis=0) if r.shape[0] > 1 else 2.0 * high
    return bool(np.all(low * (e + 1.0) * (1.0 + rtol) >= top_two))


def ldp_assumptions(pair: str = "clones", *, subsampled: bool = False) -> tuple[str, ...]:
    """Return what an ``ldp-shuffle`` guarantee rests on, one sentence each (for records).

    Args:
        pair: ``"clones"`` or ``"stronger"``.
        subsampled: Whether ``m`` of the ``n`` users are drawn each round.

    Returns:
        The assumptions, the randomisers' first.

    Raises:
        ValueError: for an unknown pair.
    """
    out = [
        "every user's report comes from an eps0-LDP local randomiser (possibly chosen "
        "adaptively from earlier reports) and the server sees only the shuffled reports"
    ]
    if check_pair(pair) == "clones":
        out.append(
            "dominating pair of Feldman, McMillan & Talwar, Hiding Among the Clones "
            "(arXiv:2012.12803), Theorem 3.2, proven for every eps0-LDP randomiser"
        )
    else:
        out.append(
            "dominating pair of Feldman, McMillan & Talwar, Stronger Privacy Amplification by "
            "Shuffling (arXiv:2208.04591), Theorem 3.1, which by the paper's errata holds only "
            "for a restricted class of randomisers"
        )
        out.append(STRONGER_PAIR_CONDITION)
    if subsampled:
        out.append(
            "each round m of the n users are drawn uniformly without replacement, and who was "
            "drawn stays secret (Koskela, Heikkilä & Honkela, arXiv:2106.00477, Lemma 7)"
        )
    return tuple(out)
