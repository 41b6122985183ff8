"""Proven epsilon of shuffled Gaussian reports (method ``proven``): no assumption on the others.

Each round's reports are replaced by stand-ins within a small total variation, whose shuffle is
dominated by a pair of count distributions (Feldman, McMillan & Talwar, *Hiding Among the
Clones*, arXiv:2012.12803): route ``blanket`` (Theorem 4.1, with the Gaussian's own
decomposition) or ``clones`` (Lemma 3.7 and the proof of Theorem 3.8). The pairs are composed by
privacy loss distribution, the stand-ins' total variation over every report of every round is
added to delta with its ``e^eps`` factor (their Lemma C.1), and the level of the stand-ins is
chosen on a grid. Route ``gaussian`` (the local Gaussian alone) is the fallback where shuffling
does not beat it. Derivation: docs/maths.md, "A proven bound".
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from dp_accounting.pld import pld_pmf
from dp_accounting.pld.privacy_loss_distribution import from_gaussian_mechanism
from scipy.special import gammaln
from scipy.stats import binom

from ..._validation import check_delta
from ..approximate.analytic_gaussian import gaussian_dp_delta, gaussian_dp_epsilon
from .common import default_tail
from .powers import PmfPowers, compose_powers
from .rounds import ShuffleRound

__all__ = [
    "EPS0_STEP",
    "ProvenEstimate",
    "ProvenPair",
    "stand_in_costs",
    "blanket_pair",
    "blanket_mass",
    "blanket_weight",
    "ROUTES",
    "epsilon_with_coupling",
    "proven_pair",
    "proven_rounds_epsilon",
]

EPS0_STEP = 1.0 / 32.0
"""Step of the grid on which ``eps0`` is chosen (any grid point gives a valid bound)."""

_MAX_LEVEL = 60.0

#: Slack added to each round's left-out mass for the floating-point error of summing the masses.
_SUM_SLACK = 1e-13


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


def _inclusion(s: ShuffleRound) -> float:
    """Return the probability that the differing user reports in a round of ``s``."""
    if s.m is not None:
        return s.m / s.n
    return 1.0 if s.rate is None else s.rate


def _expected_others(s: ShuffleRound) -> float:
    """Return the expected number of reports of the other users in a round of ``s``."""
    if s.m is not None:
        return s.m - s.m / s.n
    return (s.n - 1) * (1.0 if s.rate is None else s.rate)


def _window(trials: int, prob: float, tail: float) -> tuple[int, int]:
    """Integer range outside which ``Bin(trials, prob)`` has mass at most ``tail``."""
    if trials == 0 or prob == 0.0:
        return 0, 0
    lo = int(binom.ppf(tail / 2.0, trials, prob))
    hi = int(binom.isf(tail / 2.0, trials, prob))
    return max(0, lo - 1), min(trials, hi + 1)


def _log_binom_pmf(k: np.ndarray, trials: int, prob: float) -> np.ndarray:
    if trials == 0 or prob == 0.0:
        return np.where(k == 0, 0.0, -np.inf)
    with np.errstate(divide="ignore"):
        return np.where((k >= 0) & (k <= trials), binom.logpmf(k, trials, prob), -np.inf)


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
    windows = [_window(br.trials, br.prob, tail / (4.0 * len(branches))) for br in branches]
    t_lo = min(lo + br.adds for (lo, _), br in zip(windows, branches, strict=True))
    t_hi = max(hi + br.adds for (_, hi), br in zip(windows, branches, strict=True))
    t = np.arange(t_lo, t_hi + 1)
    half = np.array([_window(int(c), 0.5, tail / 8.0)[0] for c in t])
    lo_a = np.maximum(half - 1, 0)
    widths = t - 2 * lo_a + 1
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
    left = max(0.0, 1.0 - math.fsum(np.exp(log_p))) + _SUM_SLACK
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
    _, _, log_p, log_q, left = _enumerate(_branches(setting, math.exp(-eps0), 1.0), first, tail)
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


def _blanket_scale(q: float) -> float:
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
    t_lo, t_hi = _window(top, 2.0 * share, piece)
    c_lo, c_hi = _window(top, share, piece)
    t_hi += 1
    c_hi += 1
    cs = np.arange(c_lo, c_hi + 1)
    # Conditional law of the blanket count: among the users not counted, each is blanket with
    # probability share / (1 - 2 share).
    cond = share / (1.0 - 2.0 * share)
    parts_a, parts_b, parts_c, parts_m = [], [], [], []
    ln2 = math.log(2.0)
    for t in range(t_lo, t_hi + 1):
        half = _window(t, 0.5, piece)[0]
        a = np.arange(max(half - 1, 0), t - max(half - 1, 0) + 1)
        b = t - a
        log_total = np.full((a.size, cs.size), -np.inf)
        for weight, trials, kind in branches:
            if weight <= 0.0:
                continue
            t_o = t - (kind == 1)
            if t_o < 0 or t_o > trials:
                continue
            c_o = cs - (kind == 2)
            log_t = float(binom.logpmf(t_o, trials, 2.0 * share)) + math.log(weight)
            with np.errstate(divide="ignore"):
                log_c = np.where(c_o >= 0, binom.logpmf(c_o, trials - t_o, cond), -np.inf)
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
    left = max(0.0, 1.0 - math.fsum(mass)) + _SUM_SLACK + extra
    k = np.where(a >= b, base_lo, base_hi) + (1.0 - q) * c
    with np.errstate(divide="ignore", invalid="ignore"):
        loss = np.log(k + q * a) - np.log(k + q * b)
    keep = mass > 0
    infinite = keep & ~np.isfinite(loss) & (a > b)
    left += float(mass[infinite].sum())
    keep &= np.isfinite(loss)
    return ProvenPair(loss=loss[keep], mass=mass[keep], left=min(left, 1.0))


ROUTES: tuple[str, ...] = ("blanket", "clones", "gaussian")
"""The proven routes, each a valid bound; the smallest epsilon is reported.

``blanket``: Theorem 4.1 of arXiv:2012.12803 with the Gaussian's own decomposition;
``clones``: Theorem 3.8's reduction (any ``(eps0, delta0)``-LDP randomiser); ``gaussian``: the
local Gaussian alone, no shuffle."""


def _level(k: int) -> float:
    return k * EPS0_STEP


@functools.lru_cache(maxsize=4)
def _route_pair(route: str, setting: ShuffleRound, k: int, tail: float) -> ProvenPair:
    if route == "clones":
        return proven_pair(setting, _level(k), tail)
    return blanket_pair(setting, blanket_weight(setting.sigma, _level(k)), tail)


def blanket_weight(sigma: float, level: float) -> float:
    """Return the blanket weight ``p = 1/(2 c e^level)``: stand-ins cost ``delta_G(level)/e^level``.

    Args:
        sigma: Noise std over the domain's diameter.
        level: ``log`` of the likelihood-ratio level the stand-ins are cut at, ``>= 0``.

    Returns:
        ``p`` in ``(0, 1/3]``.
    """
    return 1.0 / (2.0 * _blanket_scale(blanket_mass(sigma)) * math.exp(level))


BLANKET_COUNT = 64.0
"""Largest expected count per kind of the blanket pair: its enumeration has about
``6000 BLANKET_COUNT^1.5`` cells, so the blanket weight is capped there (a smaller weight is
always valid, at some cost in tightness where the population could hide more)."""


def blanket_floor(parts: Sequence[tuple[ShuffleRound, int]]) -> int:
    """Return the lowest blanket level on the grid whose weight keeps every count small.

    The weight ``p = 1/(2 c e^level)`` falls with the level; each kind of the pair counts about
    ``users * rate * p`` reports, kept at most :data:`BLANKET_COUNT`.
    """
    sigma = parts[0][0].sigma
    users = max((s.m if s.m is not None else s.n * (s.rate or 1.0)) for s, _ in parts)
    p_cap = BLANKET_COUNT / max(users, 1.0)
    if p_cap >= blanket_weight(sigma, 0.0):
        return 0
    level = math.log(1.0 / (2.0 * _blanket_scale(blanket_mass(sigma)) * p_cap))
    return math.ceil(level / EPS0_STEP)


def stand_in_costs(
    route: str, rounds: Sequence[tuple[ShuffleRound, int]], level: float
) -> tuple[float, float, float]:
    """Total variation between the real reports and their stand-ins, summed over all rounds.

    Args:
        route: ``"clones"`` or ``"blanket"``.
        rounds: ``(setting, count)`` pairs sharing ``sigma``.
        level: ``eps0`` (clones) or the blanket's level (see :func:`blanket_weight`).

    Returns:
        ``(eta0, eta1, per_report)``: on the dataset whose differing input is the reference and
        on the other one, and the bound per report of another user. ``clones``: each other
        report ``(1 + e^{-eps0}/2) delta0``, the differing user's own ``delta0`` on one side
        (proof of Theorem 3.8, arXiv:2012.12803). ``blanket``: each other report
        ``delta_G(level) / e^level``, the differing user's none (its decomposition is exact).
        Summed over the expected number of reports (a union bound over a random number of
        randomiser calls).
    """
    sigma = rounds[0][0].sigma
    others = sum(c * _expected_others(s) for s, c in rounds)
    own = sum(c * _inclusion(s) for s, c in rounds)
    delta_g = gaussian_dp_delta(level, sigma=sigma)
    if route == "clones":
        per = (1.0 + 0.5 * math.exp(-level)) * delta_g
        return others * per, others * per + own * delta_g, per
    per = delta_g * math.exp(-level)
    return others * per, others * per, per


def _pair_pmf(pair: ProvenPair, discretization: float, budget: float) -> pld_pmf.DensePLDPmf:
    """Losses rounded up to the grid, the left-out mass at infinity (pessimistic).

    The largest losses holding at most ``budget`` of mass also go to infinity, and the smallest
    ones holding at most ``budget`` are raised to the lowest loss kept (both raise every
    delta), so the grid spans the bulk of the distribution only.
    """
    if pair.loss.size == 0:
        return pld_pmf.DensePLDPmf(discretization, 0, np.zeros(1), pair.left, True)
    order = np.argsort(pair.loss, kind="stable")
    loss, mass = pair.loss[order], pair.mass[order]
    below = np.cumsum(mass)
    above = below[-1] - below  # mass strictly after each index
    first = int(np.searchsorted(below, budget, side="right"))
    first = min(first, loss.size - 1)
    last = int(np.flatnonzero(above > budget)[-1]) + 1 if np.any(above > budget) else 0
    last = max(last, first)
    infinity = pair.left + float(mass[last + 1 :].sum())
    index = np.ceil(loss[: last + 1] / discretization).astype(np.int64)
    index[:first] = index[first]
    low = int(index[0])
    probs = np.bincount(index - low, weights=mass[: last + 1])
    return pld_pmf.DensePLDPmf(discretization, low, probs, min(infinity, 1.0), True)


def _grid(sd: float, rounds: int) -> float:
    """Loss grid step: a power of two, so that rounding up costs at most ``sd sqrt(R) / 2``.

    ``R`` is ``rounds`` rounded up to a power of two, so the grid changes only when the round
    count doubles (an accountant asked every round reuses its per-round PMFs).
    """
    step = sd / (2.0 * math.sqrt(rounds))
    return 2.0 ** min(-10, max(-26, math.floor(math.log2(max(step, 2.0**-26)))))


def _scale(rounds: int) -> int:
    return 1 << max(rounds - 1, 0).bit_length()


@functools.lru_cache(maxsize=32)
def _pair_stats(route: str, setting: ShuffleRound, k: int, tail: float) -> tuple[float, float]:
    """Return ``(sd, span)``: the loss's standard deviation and the width of its bulk."""
    pair = _route_pair(route, setting, k, tail)
    if pair.mass.size == 0:
        return 1.0, 1.0
    mean = float(np.dot(pair.mass, pair.loss))
    sd = math.sqrt(max(float(np.dot(pair.mass, (pair.loss - mean) ** 2)), 1e-30))
    order = np.argsort(pair.loss)
    cum = np.cumsum(pair.mass[order])
    lo = pair.loss[order][min(int(np.searchsorted(cum, tail / 4.0)), cum.size - 1)]
    hi = pair.loss[order][min(int(np.searchsorted(cum, cum[-1] - tail / 4.0)), cum.size - 1)]
    return sd, float(hi - lo)


def _pair_grid(route: str, setting: ShuffleRound, k: int, tail: float, scale: int) -> float:
    """Return the pair's grid step: :func:`_grid`, coarsened to 2^21 points over the bulk."""
    sd, span = _pair_stats(route, setting, k, tail)
    step = _grid(sd, scale)
    while span / step > 2.0**21:
        step *= 2.0
    return step


@functools.lru_cache(maxsize=48)
def _pair_powers(
    route: str, setting: ShuffleRound, k: int, tail: float, discretization: float
) -> PmfPowers:
    return PmfPowers(_pair_pmf(_route_pair(route, setting, k, tail), discretization, tail / 4.0))


@functools.lru_cache(maxsize=16)
def _gaussian_powers(setting: ShuffleRound, discretization: float) -> PmfPowers:
    """Build one round of the local Gaussian alone, without the shuffle.

    The differing report is seen with probability ``q``, nothing of it otherwise (loss 0
    under both datasets).
    """
    q = _inclusion(setting)
    pld = from_gaussian_mechanism(
        standard_deviation=setting.sigma,
        sensitivity=1.0,
        pessimistic_estimate=True,
        value_discretization_interval=discretization,
    )
    dense = pld._pmf_remove.to_dense_pmf()  # the Gaussian's PLD is symmetric
    probs = np.array(dense._probs, dtype=float) * q
    low = int(dense._lower_loss)
    if q < 1.0:
        if low > 0:
            probs = np.concatenate((np.zeros(low), probs))
            low = 0
        top = low + probs.size - 1
        if top < 0:
            probs = np.concatenate((probs, np.zeros(-top)))
        probs[-low] += 1.0 - q
    return PmfPowers(
        pld_pmf.DensePLDPmf(discretization, low, probs, q * float(dense._infinity_mass), True)
    )


def epsilon_with_coupling(
    pmf: pld_pmf.DensePLDPmf, delta: float, eta0: float, eta1: float
) -> tuple[float, float]:
    """Smallest epsilon with ``delta_pld(eps) + eta0 + e^eps eta1 <= delta``.

    ``delta_pld`` is the hockey-stick divergence of the composed PMF (with its mass at
    infinity). Between grid points the total is ``U + eta0 + e^eps (eta1 - W)``, solved there
    in closed form.

    Returns:
        ``(epsilon, delta_pld(epsilon))``; ``(inf, 1.0)`` when no epsilon qualifies.
    """
    probs = np.asarray(pmf._probs, dtype=float)
    disc = float(pmf._discretization)
    losses = (int(pmf._lower_loss) + np.arange(probs.size)) * disc
    infinity = float(pmf._infinity_mass)
    with np.errstate(over="ignore"):
        weighted = probs * np.exp(-losses)
    # upper[j], lower[j]: mass and sum of p e^{-l} over indices j.. (j = size: none).
    upper = infinity + np.concatenate((np.cumsum(probs[::-1])[::-1], [0.0]))
    lower = np.concatenate((np.cumsum(weighted[::-1])[::-1], [0.0]))
    start = int(np.searchsorted(losses, 0.0, side="right"))  # losses > 0
    if upper[start] - lower[start] + eta0 + eta1 <= delta:
        return 0.0, max(float(upper[start] - lower[start]), 0.0)
    with np.errstate(over="ignore", invalid="ignore"):
        grow = np.exp(losses)
        at_grid = upper[1:] - grow * lower[1:] + eta0 + grow * eta1
    ok = np.flatnonzero((losses > 0.0) & (at_grid <= delta))
    if ok.size == 0:
        return math.inf, 1.0
    j = int(ok[0])
    # On (l_{j-1}, l_j] the losses above eps are those of indices j..: solve for eps there.
    u, w = float(upper[j]), float(lower[j])
    below = max(float(losses[j - 1]) if j > start else 0.0, 0.0)
    eps = float(losses[j])
    if w > eta1:
        root = (u + eta0 - delta) / (w - eta1)
        if root > 0:
            eps = min(max(math.log(root), below), eps)
        else:
            eps = below
    d_pld = u - math.exp(eps) * w if eps < losses[j] else float(at_grid[j]) - eta0 - grow[j] * eta1
    return eps, max(float(d_pld), 0.0)


@dataclass(frozen=True)
class ProvenEstimate:
    """A proven epsilon with how delta was spent.

    Attributes:
        epsilon: The proven epsilon at ``delta``.
        delta: The target delta.
        route: Which route gave it (:data:`ROUTES`).
        level: ``eps0`` (``clones``) or the blanket's level (``blanket``); ``None`` for
            ``gaussian``.
        weight: The blanket weight ``p`` (``blanket``), else ``None``.
        per_report: Total variation of one other user's report from its stand-in.
        delta_pld: The part of delta spent by the composed privacy loss distribution.
        delta_coupling: The part spent on the stand-ins, ``eta0 + e^eps eta1``.
        discretization: The loss grid step.
        tail: The mass each round's pair leaves out (inside ``delta_pld``).
    """

    epsilon: float
    delta: float
    route: str
    level: float | None
    weight: float | None
    per_report: float
    delta_pld: float
    delta_coupling: float
    discretization: float
    tail: float


def _evaluate(
    route: str,
    parts: Sequence[tuple[ShuffleRound, int]],
    k: int,
    delta: float,
    tail: float,
    scale: int,
) -> tuple[float, float, float, float, float]:
    """``(epsilon, delta_pld, coupling, discretization, per_report)`` at level ``k``."""
    level = _level(k)
    eta0, eta1, per = stand_in_costs(route, parts, level)
    if eta0 + eta1 >= delta:
        return math.inf, 1.0, eta0 + eta1, 0.0, per
    if sum(_route_pair(route, s, k, tail).left * c for s, c in parts) >= delta:
        return math.inf, 1.0, eta0 + eta1, 0.0, per  # the pairs' own tails exceed delta
    disc = min(_pair_grid(route, s, k, tail, scale) for s, _ in parts)
    powers = [(_pair_powers(route, s, k, tail, disc), c) for s, c in parts]
    eps, d_pld = epsilon_with_coupling(compose_powers(powers), delta, eta0, eta1)
    coupling = eta0 + math.exp(min(eps, 700.0)) * eta1 if math.isfinite(eps) else eta0 + eta1
    return eps, d_pld, coupling, disc, per


def _search(
    route: str,
    parts: Sequence[tuple[ShuffleRound, int]],
    delta: float,
    tail: float,
    scale: int,
    give_up: float = math.inf,
) -> tuple[int, tuple[float, float, float, float, float]]:
    """Return the best level of ``route`` on the grid: up past infeasible ones, then downhill.

    Stops at the first feasible level if its epsilon exceeds ``give_up`` (another route's
    best is already far smaller).
    """
    sigma = parts[0][0].sigma
    reports = sum(c * (_inclusion(s) + _expected_others(s)) for s, c in parts)
    # Below this level the stand-ins alone cost more than delta.
    floor = gaussian_dp_epsilon(min(0.5, delta / (3.0 * max(reports, 1.0))), sigma=sigma)
    k_min = max(1 if route == "clones" else 0, math.floor(floor / EPS0_STEP) - 8)
    if route == "blanket":
        k_min = max(k_min, blanket_floor(parts))
    k_max = max(k_min + 1, math.ceil(_MAX_LEVEL / EPS0_STEP))
    k = k_min
    while k < k_max and sum(stand_in_costs(route, parts, _level(k))[:2]) >= delta / 2.0:
        k += 1  # the first level whose stand-ins leave half of delta (no pair needed)
    k = min(k + 2, k_max)
    cache: dict[int, tuple[float, float, float, float, float]] = {}

    def value(i: int) -> float:
        if i not in cache:
            cache[i] = _evaluate(route, parts, i, delta, tail, scale)
        return cache[i][0]

    tries = 0
    while not math.isfinite(value(k)) and k < k_max and tries < 3:
        k, tries = min(k + 4, k_max), tries + 1
    if not math.isfinite(value(k)) or value(k) > give_up:
        return k, cache[k]  # this route gives no bound here, or none near the best one
    # Every grid level is a valid bound; epsilon has been unimodal in the level in every case
    # examined, so a local minimum would cost tightness only. Coarse steps, then fine ones.
    for step in (4, 1):
        for direction in (-1, 1):
            while k_min <= k + direction * step <= k_max and value(k + direction * step) < value(k):
                k += direction * step
    best = min(cache, key=lambda i: cache[i][0])
    return best, cache[best]


@functools.lru_cache(maxsize=32)
def _plan(
    settings: tuple[ShuffleRound, ...], weights: tuple[float, ...], delta: float, scale: int
) -> tuple[str, int]:
    """Choose the route and level for rounds in these proportions at ``scale`` rounds.

    Depends on the request only (not on earlier calls), so a resumed run reproduces its
    numbers; an accountant asked every round searches once each time the count doubles.
    """
    counts = [max(1, round(w * scale)) for w in weights]
    parts = list(zip(settings, counts, strict=True))
    tail = default_tail(delta, sum(counts))
    best: tuple[float, str, int] = (math.inf, "gaussian", 0)
    for route in ROUTES[:2]:
        k, values = _search(route, parts, delta, tail, scale, give_up=2.0 * best[0])
        if values[0] < best[0]:
            best = (values[0], route, k)
    gaussian = _gaussian_epsilon(parts, delta, scale)[0]
    if gaussian <= best[0]:
        return "gaussian", 0
    return best[1], best[2]


def _gaussian_epsilon(
    parts: Sequence[tuple[ShuffleRound, int]], delta: float, scale: int
) -> tuple[float, float, float]:
    """``(epsilon, delta_pld, discretization)`` of the local Gaussian alone."""
    q_max = max(_inclusion(s) for s, _ in parts)
    disc = _grid(math.sqrt(q_max) / parts[0][0].sigma, scale)
    composed = compose_powers([(_gaussian_powers(s, disc), c) for s, c in parts])
    eps, d_pld = epsilon_with_coupling(composed, delta, 0.0, 0.0)
    return eps, d_pld, disc


def proven_rounds_epsilon(
    rounds: Sequence[tuple[ShuffleRound, int]], *, delta: float
) -> ProvenEstimate:
    """Proven epsilon at ``delta`` of adaptively composed shuffled-Gaussian rounds.

    Neighbouring relation: replace one user; its two inputs and every other user's input
    anywhere in a domain whose L2 diameter is the unit of ``sigma``. The rounds share
    ``sigma``. Three routes (:data:`ROUTES`), each a bound from published theorems: the route
    and its level are chosen where they give the smallest epsilon for the same proportions of
    rounds at the next power of two of the count (once per doubling), then evaluated at the
    count asked for.

    Args:
        rounds: ``(setting, count)`` pairs with counts >= 1 (validated settings).
        delta: Target delta in ``(0, 1)``.

    Returns:
        A :class:`ProvenEstimate`.

    Raises:
        ValueError: on an empty ``rounds`` or rounds of different ``sigma``.
    """
    delta = check_delta(delta)
    merged: dict[ShuffleRound, int] = {}
    for setting, count in rounds:
        merged[setting] = merged.get(setting, 0) + int(count)
    if not merged:
        raise ValueError("rounds must hold at least one (setting, count) pair. Found none.")
    if len({s.sigma for s in merged}) != 1:
        found = ", ".join(sorted({f"{s.sigma:g}" for s in merged}))
        raise ValueError(f"rounds must share sigma for the proven method. Found {found}.")
    parts = sorted(merged.items(), key=lambda item: (item[0].n, item[0].rate or 0, item[0].m or 0))
    total = sum(merged.values())
    scale = _scale(total)
    route, k = _plan(tuple(s for s, _ in parts), tuple(c / total for _, c in parts), delta, scale)
    if route == "gaussian":
        eps, d_pld, disc = _gaussian_epsilon(parts, delta, scale)
        return ProvenEstimate(eps, delta, route, None, None, 0.0, d_pld, 0.0, disc, 0.0)
    tail = default_tail(delta, total)
    eps, d_pld, coupling, disc, per = _evaluate(route, parts, k, delta, tail, scale)
    level = _level(k)
    weight = blanket_weight(parts[0][0].sigma, level) if route == "blanket" else None
    return ProvenEstimate(eps, delta, route, level, weight, per, d_pld, coupling, disc, tail)
