"""The per-round dominating pairs of the ``proven`` method, enumerated on bounded windows.

``blanket_pair``: Theorem 4.1 of Feldman, McMillan & Talwar, *Hiding Among the Clones*
(arXiv:2012.12803), with the Gaussian's own decomposition; ``proven_pair``: the clones pair of
their Theorem 3.2 behind the stand-ins of Theorem 3.8. Both with the sampling coins inside the
pair. Derivation: docs/maths.md, "A proven bound".
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy.special import gammaln

from .common import binom_logpmf, exact_sum
from .rounds import ShuffleRound

__all__ = [
    "CLONES_COUNT",
    "ProvenPair",
    "blanket_mass",
    "blanket_pair",
    "blanket_scale",
    "blanket_weight",
    "expected_others",
    "half_windows",
    "inclusion",
    "proven_pair",
    "window",
]

#: Slack added to each round's left-out mass for the floating-point error of summing the masses.
_SUM_SLACK = 1e-13


CLONES_COUNT = 20_000.0
"""Largest expected number of clones per round of the clones pair (its enumeration has about
``200 CLONES_COUNT`` outcomes); a smaller clone probability is always valid."""


@dataclass(frozen=True)
class ProvenPair:
    """One round's dominating pair, enumerated on a window symmetric under swapping the counts.

    Attributes:
        loss: An upper bound on ``log P / Q`` at each enumerated outcome (``Q`` is ``P`` with
            the two counts swapped; ``inf`` where it is unbounded).
        mass: ``P`` of each outcome.
        left: Mass of ``P`` outside the window (or where the bound on the loss does not
            hold), plus a rounding slack: it goes to infinite loss.
    """

    loss: np.ndarray
    mass: np.ndarray
    left: float


def inclusion(s: ShuffleRound) -> float:
    """Return the probability that the differing user reports in a round of ``s``."""
    if s.m is not None:
        return s.m / s.n
    return 1.0 if s.rate is None else s.rate


def expected_others(s: ShuffleRound) -> float:
    """Return the expected number of reports of the other users in a round of ``s``."""
    if s.m is not None:
        return s.m - s.m / s.n
    return (s.n - 1) * (1.0 if s.rate is None else s.rate)


MAX_PAIR_CELLS = 2.0e7
"""Largest number of cells a pair's enumeration may hold (a few arrays of 8 bytes each): beyond
it the pair is not built and its route gives no bound at that level (a smaller delta widens the
windows; at n = 1000, delta = 1e-50 the blanket windows held 5e8 cells)."""


class PairTooLargeError(ValueError):
    """A pair's enumeration would exceed :data:`MAX_PAIR_CELLS`; its route is skipped."""


def _check_cells(cells: float) -> None:
    if cells > MAX_PAIR_CELLS:
        raise PairTooLargeError(
            f"the pair would hold {cells:.3g} cells (at most {MAX_PAIR_CELLS:.3g})"
        )


def window(trials: int, prob: float, tail: float) -> tuple[int, int]:
    """Integer range outside which ``Bin(trials, prob)`` has mass at most ``tail``."""
    from scipy.stats import binom

    if trials == 0 or prob == 0.0:
        return 0, 0
    lo = int(binom.ppf(tail / 2.0, trials, prob))
    hi = int(binom.isf(tail / 2.0, trials, prob))
    return max(0, lo - 1), min(trials, hi + 1)


def half_windows(trials: np.ndarray, tail: float) -> np.ndarray:
    """``window(t, 0.5, tail)[0]`` for every ``t`` of ``trials`` at once (the same integers)."""
    from scipy.stats import binom

    trials = np.asarray(trials, dtype=np.int64)
    with np.errstate(invalid="ignore"):
        lo = binom.ppf(tail / 2.0, trials, 0.5)
    lo = np.where(trials > 0, np.nan_to_num(lo, nan=0.0), 0.0).astype(np.int64)
    return np.maximum(0, lo - 1)


def _log_binom_pmf(k: np.ndarray, trials: int, prob: float) -> np.ndarray:
    if trials == 0 or prob == 0.0:
        return np.where(k == 0, 0.0, -np.inf)
    with np.errstate(divide="ignore"):
        return np.where((k >= 0) & (k <= trials), binom_logpmf(k, trials, prob), -np.inf)


@dataclass(frozen=True)
class _Branch:
    """A branch of a round: its weight, the other users' count law, and whether it counts.

    ``adds``: the differing user's report falls among the counted ones.
    """

    weight: float
    trials: int
    prob: float
    adds: bool


def _branches(s: ShuffleRound, count: float, present: float) -> tuple[_Branch, ...]:
    """Return the branches of one round.

    Args:
        s: The round.
        count: Probability that a *reporting* other user's report is counted (a clone).
        present: Probability that the differing user's report, when it reports, is counted.
    """
    if s.m is not None:
        inside = s.m / s.n
        return (
            _Branch(1.0 - inside, s.m, count, False),
            _Branch(inside * (1.0 - present), s.m - 1, count, False),
            _Branch(inside * present, s.m - 1, count, True),
        )
    rate = 1.0 if s.rate is None else s.rate
    return (
        _Branch(1.0 - rate * present, s.n - 1, rate * count, False),
        _Branch(rate * present, s.n - 1, rate * count, True),
    )


def _enumerate(
    branches: Sequence[_Branch], first: float, tail: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, float]:
    """Return ``(a, b, log P, log Q, left)`` of the two counts on a symmetric window.

    ``P(a, b) = sum_j w_j pi_j(t - [adds_j]) B_j(a, b)``, ``B_j`` the fair split of the clones
    with the differing report in the first count with probability ``first`` (second
    otherwise) when it is counted; ``Q(a, b) = P(b, a)``.
    """
    windows = [window(br.trials, br.prob, tail / (4.0 * len(branches))) for br in branches]
    t_lo = min(lo + br.adds for (lo, _), br in zip(windows, branches, strict=True))
    t_hi = max(hi + br.adds for (_, hi), br in zip(windows, branches, strict=True))
    t = np.arange(t_lo, t_hi + 1)
    half = half_windows(t, tail / 8.0)
    lo_a = np.maximum(half - 1, 0)
    widths = t - 2 * lo_a + 1
    _check_cells(float(widths.sum()))
    tt = np.repeat(t, widths)
    offsets = np.arange(int(widths.sum())) - np.repeat(np.cumsum(widths) - widths, widths)
    a = np.repeat(lo_a, widths) + offsets
    b = tt - a
    ln2 = math.log(2.0)
    log_first = math.log(first) if first > 0 else -math.inf
    log_second = math.log1p(-first) if first < 1 else -math.inf
    log_p = np.full(a.size, -np.inf)
    log_q = np.full(a.size, -np.inf)
    with np.errstate(invalid="ignore", divide="ignore"):
        lb = gammaln(tt + 1.0) - gammaln(a + 1.0) - gammaln(b + 1.0) - tt * ln2
        g_t1 = gammaln(tt + 0.0)
        lb_first = np.where(
            a >= 1, g_t1 - gammaln(a + 0.0) - gammaln(b + 1.0) - (tt - 1) * ln2, -np.inf
        )
        lb_second = np.where(
            b >= 1, g_t1 - gammaln(a + 1.0) - gammaln(b + 0.0) - (tt - 1) * ln2, -np.inf
        )
        for br in branches:
            if br.weight <= 0.0:
                continue
            log_w = math.log(br.weight)
            if br.adds:
                lpi = np.repeat(_log_binom_pmf(t - 1, br.trials, br.prob), widths) + log_w
                p_term = lpi + np.logaddexp(log_first + lb_first, log_second + lb_second)
                q_term = lpi + np.logaddexp(log_second + lb_first, log_first + lb_second)
            else:
                lpi = np.repeat(_log_binom_pmf(t, br.trials, br.prob), widths) + log_w
                p_term = q_term = lpi + lb
            log_p = np.logaddexp(log_p, p_term)
            log_q = np.logaddexp(log_q, q_term)
    keep = np.isfinite(log_p) | np.isfinite(log_q)
    a, b, log_p, log_q = a[keep], b[keep], log_p[keep], log_q[keep]
    left = max(0.0, 1.0 - exact_sum(np.exp(log_p))) + _SUM_SLACK
    return a, b, log_p, log_q, left


def proven_pair(setting: ShuffleRound, eps0: float, tail: float) -> ProvenPair:
    """One round's clones pair for ``eps0``-LDP reports, with the participation coins inside.

    Route ``clones`` (Feldman, McMillan & Talwar, arXiv:2012.12803, proof of Theorem 3.2):
    every report of another user is, with probability ``e^{-eps0}``, a clone (half the time of
    the first component of the differing user's report, half of the second). The differing
    user reports with probability ``rate`` (``m/n``, or 1), and its report is the first
    component with probability ``e^{eps0}/(e^{eps0}+1)`` under ``P`` (the second under ``Q``).
    The observer sees ``(a, b)``, the two clone counts with the differing report added:

        P(a, b) = (1 - q) pi0(t) B(t, a) + q pi1(t - 1) [p1 B(t-1, a-1) + p0 B(t-1, a)],

    ``t = a + b``, ``B(c, a) = C(c, a) / 2^c``, and ``Q(a, b) = P(b, a)``.

    Args:
        setting: The round (validated: ``n``, and ``rate`` or ``m`` or neither).
        eps0: Local epsilon of the ``eps0``-LDP stand-ins, ``> 0``.
        tail: Bound on the mass left out of the window, in ``(0, 1)``.

    Returns:
        A :class:`ProvenPair` with the exact losses.
    """
    first = 1.0 / (1.0 + math.exp(-eps0))
    # Any clone probability below e^{-eps0} is valid too (the left-over absorbs the rest):
    # capping the expected clones keeps the enumeration bounded whatever the population.
    clone = min(math.exp(-eps0), CLONES_COUNT / max(inclusion(setting) * setting.n, 1.0))
    _, _, log_p, log_q, left = _enumerate(_branches(setting, clone, 1.0), first, tail)
    finite = np.isfinite(log_p)
    return ProvenPair(
        loss=log_p[finite] - log_q[finite], mass=np.exp(log_p[finite]), left=min(left, 1.0)
    )


def blanket_mass(sigma: float) -> float:
    """``q``: total variation between two reports whose inputs are the domain's diameter apart.

    ``2 Phi(1 / (2 sigma)) - 1`` (``sigma`` in units of the diameter); nearer inputs are
    closer, and a larger ``q`` also decomposes them.
    """
    return math.erf(1.0 / (2.0 * math.sqrt(2.0) * sigma))


def blanket_scale(q: float) -> float:
    """``c`` with ``Q1(x0) + Q1(x1) + Q0 <= c (R(x0) + R(x1))`` for every pair of inputs.

    ``1/q + max(0, 1/(1 - q) - 2/q) / 2`` (docs/maths.md, "A proven bound"): ``1/q`` for
    ``q <= 2/3``.
    """
    return 1.0 / q + 0.5 * max(0.0, 1.0 / (1.0 - q) - 2.0 / q)


def blanket_pair(setting: ShuffleRound, p: float, tail: float) -> ProvenPair:
    """One round's pair of Theorem 4.1 of arXiv:2012.12803, with the participation coins.

    The differing user's report is ``q Q1(x_b) + (1 - q) Q0`` (``q`` from
    :func:`blanket_mass`); every other report is, in its stand-in, ``p`` of each of
    ``Q1(x_0)``, ``Q1(x_1)``, ``Q0`` and ``1 - 3p`` of a left-over. The observer sees the counts
    ``(a, b, c, d)`` of the four kinds. Under check-in (and full participation, rate 1) the
    silent users are folded into the randomiser, so ``q' = rate q`` and ``p' = rate p`` and the
    loss is ``log(q'a + (1 - q')c) - log(q'b + (1 - q')c)``; under fixed-size sampling it is
    ``log(K + q a) - log(K + q b)`` with ``K = (n - m) p + (1 - q) c``. ``(a, b, c)`` are
    enumerated exactly, the mass outside the windows added at infinity. Derivation:
    docs/maths.md, "A proven bound".

    Args:
        setting: The round.
        p: The blanket weight of each of the three components, in ``(0, 1/3]``.
        tail: Bound on the mass left out of the windows, in ``(0, 1)``.

    Returns:
        A :class:`ProvenPair` with upper bounds on the losses.
    """
    q = blanket_mass(setting.sigma)
    piece = tail / 8.0
    if setting.m is not None:
        inside = setting.m / setting.n
        # (weight, other users counted, differing report: 0 none, 1 first count, 2 blanket)
        branches = [
            (1.0 - inside, setting.m, 0),
            (inside * (1.0 - q), setting.m - 1, 2),
            (inside * q, setting.m - 1, 1),
        ]
        share = p
        base_lo = base_hi = (setting.n - setting.m) * p
    else:
        # Theorem 4.1 as stated, for the randomiser that stays silent with probability
        # 1 - rate: its decomposition has q' = rate q and p' = rate p (silence goes to the
        # common part and the left-over), and every user runs it.
        rate = 1.0 if setting.rate is None else setting.rate
        q = rate * q
        branches = [(1.0 - q, setting.n - 1, 2), (q, setting.n - 1, 1)]
        share = rate * p
        base_lo = base_hi = 0.0
    extra = 0.0
    top = max(trials for _, trials, _ in branches)
    t_lo, t_hi = window(top, 2.0 * share, piece)
    c_lo, c_hi = window(top, share, piece)
    t_hi += 1
    c_hi += 1
    cs = np.arange(c_lo, c_hi + 1)
    halves = half_windows(np.arange(t_lo, t_hi + 1), piece)
    cells = 0.0
    for t in range(t_lo, t_hi + 1):
        edge = max(int(halves[t - t_lo]) - 1, 0)
        cells += (t - 2 * edge + 1) * cs.size
    _check_cells(cells)
    # Conditional law of the blanket count: among the users not counted, each is blanket with
    # probability share / (1 - 2 share).
    cond = share / (1.0 - 2.0 * share)
    ts = np.arange(t_lo, t_hi + 1)
    # Each branch's binomial log-masses for every count at once (elementwise the same values
    # as one call per count): the counted users' law, then the blanket count's given them.
    laws = []
    for _, trials, kind in branches:
        counted = np.clip(ts - (kind == 1), 0, trials)
        blanket = cs - (kind == 2)
        with np.errstate(divide="ignore", invalid="ignore"):
            law_t = binom_logpmf(counted, trials, 2.0 * share)
            law_c = np.where(
                blanket[None, :] >= 0,
                binom_logpmf(blanket[None, :], (trials - counted)[:, None], cond),
                -np.inf,
            )
        laws.append((law_t, law_c))
    parts_a, parts_b, parts_c, parts_m = [], [], [], []
    ln2 = math.log(2.0)
    for t in range(t_lo, t_hi + 1):
        half = int(halves[t - t_lo])
        a = np.arange(max(half - 1, 0), t - max(half - 1, 0) + 1)
        b = t - a
        log_total = np.full((a.size, cs.size), -np.inf)
        for (weight, trials, kind), (log_ts, log_cs) in zip(branches, laws, strict=True):
            if weight <= 0.0:
                continue
            t_o = t - (kind == 1)
            if t_o < 0 or t_o > trials:
                continue
            log_t = float(log_ts[t - t_lo]) + math.log(weight)
            log_c = log_cs[t - t_lo]
            if kind == 1:  # the differing report is in the first count under P
                split = np.where(a >= 1, gammaln(t) - gammaln(a) - gammaln(b + 1.0), -np.inf)
                split = split - (t - 1) * ln2
            else:
                split = gammaln(t + 1.0) - gammaln(a + 1.0) - gammaln(b + 1.0) - t * ln2
            log_total = np.logaddexp(log_total, log_t + split[:, None] + log_c[None, :])
        parts_a.append(np.repeat(a, cs.size))
        parts_b.append(np.repeat(b, cs.size))
        parts_c.append(np.tile(cs, a.size))
        parts_m.append(log_total.ravel())
    a = np.concatenate(parts_a)
    b = np.concatenate(parts_b)
    c = np.concatenate(parts_c)
    mass = np.exp(np.concatenate(parts_m))
    left = max(0.0, 1.0 - exact_sum(mass)) + _SUM_SLACK + extra
    k = np.where(a >= b, base_lo, base_hi) + (1.0 - q) * c
    with np.errstate(divide="ignore", invalid="ignore"):
        loss = np.log(k + q * a) - np.log(k + q * b)
    keep = mass > 0
    infinite = keep & ~np.isfinite(loss) & (a > b)
    left += float(mass[infinite].sum())
    keep &= np.isfinite(loss)
    return ProvenPair(loss=loss[keep], mass=mass[keep], left=min(left, 1.0))


def blanket_weight(sigma: float, level: float) -> float:
    """Return the blanket weight ``p = 1/(2 c e^level)``: stand-ins cost ``delta_G(level)/e^level``.

    Args:
        sigma: Noise std over the domain's diameter.
        level: ``log`` of the likelihood-ratio level the stand-ins are cut at, ``>= 0``.

    Returns:
        ``p`` in ``(0, 1/3]``.
    """
    return 1.0 / (2.0 * blanket_scale(blanket_mass(sigma)) * math.exp(level))
