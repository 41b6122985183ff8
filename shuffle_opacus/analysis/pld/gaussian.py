"""The privacy loss distribution of the shuffle Gaussian mechanism itself, at any ``n``.

Liew & Takahashi, *Shuffle Gaussian Mechanism for Differential Privacy* (arXiv:2206.09569),
analyse Theorem 1's neighbouring pair with Rényi DP; this module gives the tight ``(eps, delta)``
curve of the same pair, as a ``dp_accounting`` ``PrivacyLossDistribution`` that composes over
rounds (heterogeneous rounds too, by :func:`~.common.compose_plds`).

**The pair and the statistic.** ``N`` reports are shuffled; in units of the noise, every report
under ``D`` is ``x ~ N(0, 1)``, and under ``D'`` the differing user's report is ``x ~ N(a, 1)`` with
``a = 1/sigma`` (the paper's sigma: noise over the distance of the differing user's two inputs;
the other users hold a common value, Theorem 1's pair). With ``W(x) = exp(a x - a^2/2)`` the
likelihood ratio of the multiset of reports is ``1 + S/n`` with ``S = sum (W_j - 1)`` over the
round's reports, because the differing user is each report with the same probability:

* ``full`` (shuffle of all ``n`` users): ``N = n`` terms;
* ``subsampled`` (``m`` of ``n`` without replacement): ``N = m`` terms, still divided by ``n``
  (the differing user takes part with probability ``m/n``);
* ``checkin`` (each user with probability ``gamma``): ``N = n`` terms ``Z = B (W - 1)`` with
  ``B ~ Bernoulli(gamma)`` (given ``k`` participants the differing user is among them with
  probability ``k/n`` under both hypotheses, and ``k`` has the same law under both).

So ``S`` is a sum of ``N`` i.i.d. terms ``Z`` under ``Q = M(D)``, and ``dP/dQ = 1 + S/n``: ``S`` is
sufficient and ``P`` is ``Q`` tilted by ``1 + S/n``. Both hockey-stick divergences are then
expectations under ``Q`` of **convex** functions of ``S``:

    H_alpha(P || Q) = E_Q[(1 + S/n - alpha)_+],   H_alpha(Q || P) = E_Q[(1 - alpha (1 + S/n))_+].

**Convex order instead of rounding up.** Each term is moved to a lattice of step ``h`` (``1/h``
an integer) by splitting its mass between the two neighbouring lattice points so that its mean is
kept (the "hat" kernel). That is a mean-preserving spread, so the lattice term dominates ``Z``
in the convex order; sums of independent terms keep the order, so every expectation of a convex
function of the lattice ``S`` is at least the true one. The lattice pair ``Q~ = law of S~``,
``P~ = (1 + s/n) Q~`` is a genuine pair of measures whose two hockey-stick curves bound those of
``(P, Q)`` at every ``alpha >= 0``: it *dominates* the mechanism, and dominating pairs compose
(Zhu, Dong & Wang, *Optimal Accounting of Differential Privacy via Characteristic Function*,
arXiv:2106.08567). No rounding error accumulates over the ``N`` terms; the lattice only adds a
variance of at most ``h^2/4`` per non-zero term, a second-order effect (chosen here as 1e-4 of the
variance of ``S`` by default).

**What is bounded and added to delta** (all placed at loss ``+inf``):

1. the report coordinate is cut at ``x_max``: the event that some term has ``x > x_max`` has
   ``Q``-probability ``1 - (1 - gamma Phi(-x_max))^N`` (at most ``tail/4``) and ``P``-probability
   computed exactly from the tilt, about ``gamma Phi(a - x_max)`` (kept below ``25 tail``; the
   differing report is shifted by ``a`` under ``P``); below the cut ``W`` is bounded, so the
   lattice is finite;
2. ``S`` is computed by binary powering of the term's lattice measure with zero-padded FFT
   convolutions; after each one the sum is cut to a window outside which Chernoff bounds
   (from the term's exact lattice moment generating function) put at most ``tail/4`` in all,
   under ``Q`` and, tilted by ``(1 + T/n)`` with ``T`` the partial sum, under ``P`` (the other
   terms' mean is ``<= 0``, so the tilt of the partial sum bounds the ``P``-mass of the cut).
   For heavy tails (small sigma) the rare big values of ``W`` are split off first: ``S`` is the
   sum of ``N`` small terms, plus ``N`` times the sum of ``N - 1`` small terms and one big one,
   plus two or more big ones, whose probability is bounded and added;
3. the loss grid of the ``dp_accounting`` PMF stops where the remaining delta is below the
   budget; what is left is infinity mass.

**Discretisation of the loss.** The exact hockey-stick values of the lattice pair are evaluated
on a grid ``eps_j = j d`` and turned into a PMF by the pessimistic connect-the-dots algorithm of
Doroshenko, Ghazi, Kamath, Kumar & Manurangsi (*Connect the Dots*, arXiv:2207.04380,
Algorithm 1, ``dp_accounting``'s ``create_pmf_pessimistic_connect_dots_fixed_gap``): the curve is
convex in ``e^eps``, so its chords lie above it and the PMF dominates the lattice pair. Its error
is second order in ``d``.

Floating-point rounding of the FFT convolutions is not bounded rigorously (as in
``dp_accounting``'s own compositions); negative FFT noise is set to zero.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from dp_accounting.pld import pld_pmf
from dp_accounting.pld.privacy_loss_distribution import PrivacyLossDistribution
from scipy import signal
from scipy.special import logsumexp, ndtr, ndtri

from .._validation import (
    check_delta,
    check_int,
    check_nonnegative,
    check_positive,
    check_probability,
    check_sigma,
)
from .common import check_discretization, check_tail, compose_plds

__all__ = [
    "ShuffleGaussianPair",
    "shuffle_gaussian_pair",
    "shuffle_gaussian_pld",
    "shuffle_gaussian_delta",
    "shuffle_gaussian_epsilon",
    "pld_discretization",
    "pld_tail",
    "MAX_LATTICE_POINTS",
    "MAX_GRID_POINTS",
]

#: Largest lattice for one report's term (and for the sum); about 64 MB per array.
MAX_LATTICE_POINTS = 1 << 23
#: Largest loss grid of one round's PMF.
MAX_GRID_POINTS = 4_000_000
#: Extra variance the lattice may add to S, relative to Var(S), by default.
DEFAULT_SPREAD = 1e-3
#: Points of the lattice of S the step aims at (when the spread allows a coarser one).
LATTICE_TARGET = 1 << 18
#: Runs of lattice points the tail bounds merge a large term lattice into.
_MGF_BINS = 1 << 14
#: Loss grid step relative to the standard deviation of one round's privacy loss, by default.
_GRID_PER_SD = 256


@dataclass(frozen=True)
class ShuffleGaussianPair:
    """The lattice pair that dominates one round of the shuffle Gaussian.

    ``Q~`` puts mass ``masses[i]`` on ``s_i = (offset + i) * step``; ``P~`` puts
    ``(1 + s_i / n) masses[i]`` there; each direction adds its infinity mass.

    Attributes:
        n: Population (the ``n`` of the ratio ``1 + S/n``).
        terms: Number of terms ``N`` in ``S``.
        rate: Check-in rate of each term (1 for ``full`` and ``subsampled``).
        sigma: The paper's sigma.
        step: Lattice step ``h`` of ``S``.
        offset: Lattice index of ``masses[0]``.
        masses: ``Q~`` on the lattice.
        infinity_remove: Mass at loss ``+inf`` of ``P~`` (``H(P || Q)`` direction).
        infinity_add: Mass at loss ``+inf`` of ``Q~`` (``H(Q || P)`` direction).
        x_max: Where each report's coordinate was cut.
    """

    n: int
    terms: int
    rate: float
    sigma: float
    step: float
    offset: int
    masses: np.ndarray
    infinity_remove: float
    infinity_add: float
    x_max: float

    @property
    def sums(self) -> np.ndarray:
        """The lattice values ``s_i`` of ``S``."""
        return (self.offset + np.arange(self.masses.size)) * self.step

    @property
    def ratios(self) -> np.ndarray:
        """The likelihood ratios ``1 + s_i / n`` (never negative)."""
        return np.maximum(1.0 + self.sums / self.n, 0.0)

    def delta_remove(self, eps: np.ndarray | float) -> np.ndarray:
        """``H_{e^eps}(P~ || Q~)``: ``sum_s Q~(s) (1 + s/n - e^eps)_+`` plus infinity mass."""
        eps = np.atleast_1d(np.asarray(eps, dtype=float))
        s = self.sums
        m = self.masses
        # Suffix sums: above a threshold t, sum m (s - t) / n.
        mass_above = np.concatenate([np.cumsum(m[::-1])[::-1], [0.0]])
        first_above = np.concatenate([np.cumsum((m * s)[::-1])[::-1], [0.0]])
        threshold = self.n * np.expm1(eps)
        k = np.searchsorted(s, threshold, side="right")
        value = (first_above[k] - threshold * mass_above[k]) / self.n
        return np.clip(value, 0.0, None) + self.infinity_remove

    def delta_add(self, eps: np.ndarray | float) -> np.ndarray:
        """``H_{e^eps}(Q~ || P~)``: ``sum_s Q~(s) (1 - e^eps (1 + s/n))_+`` plus infinity mass."""
        eps = np.atleast_1d(np.asarray(eps, dtype=float))
        s = self.sums
        m = self.masses
        mass_below = np.concatenate([[0.0], np.cumsum(m)])
        first_below = np.concatenate([[0.0], np.cumsum(m * s)])
        alpha = np.exp(eps)
        threshold = self.n * np.expm1(-eps)  # (1 - alpha (1 + s/n)) > 0  <=>  s < threshold
        k = np.searchsorted(s, threshold, side="left")
        value = alpha / self.n * (threshold * mass_below[k] - first_below[k])
        return np.clip(value, 0.0, None) + self.infinity_add

    def loss_sd(self) -> float:
        """Return the sd of the remove-direction privacy loss ``log(1 + S/n)`` under ``P~``."""
        r = self.ratios
        weights = self.masses * r
        total = weights.sum()
        if total <= 0.0:
            return 0.0
        with np.errstate(divide="ignore"):
            loss = np.where(r > 0, np.log(np.where(r > 0, r, 1.0)), 0.0)
        mean = float((weights * loss).sum() / total)
        return float(math.sqrt(max(0.0, (weights * (loss - mean) ** 2).sum() / total)))


def _interval(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """``P(lo < X <= hi)`` for a standard normal ``X``, accurate in both tails."""
    return np.where(lo >= 0.0, ndtr(-lo) - ndtr(-hi), ndtr(hi) - ndtr(lo))


def _survival(x: float) -> float:
    return float(ndtr(-x))


def _term_lattice(a: float, rate: float, x_max: float, step: float) -> tuple[int, np.ndarray]:
    """One term ``Z = B (W - 1)`` (cut at ``x <= x_max``) spread onto the lattice ``step * Z``.

    The mass of ``W - 1`` between two lattice points is split between them so that its mean is
    kept: ``(w_{k+1} P - E)/h`` to the lower one and ``(E - w_k P)/h`` to the upper one, with
    ``P`` and ``E = E[W; interval]`` from the normal distribution function
    (``E[W 1{x <= t}] = Phi(t - a)``).
    """
    per_unit = round(1.0 / step)
    w_max = math.exp(a * x_max - a * a / 2.0)
    top = math.ceil((w_max - 1.0) / step)
    k = np.arange(-per_unit, top + 1, dtype=np.int64)
    w = 1.0 + k * step
    w[0] = 0.0  # exactly -1 + 1
    with np.errstate(divide="ignore"):
        t = np.where(w > 0.0, (np.log(np.where(w > 0.0, w, 1.0)) + a * a / 2.0) / a, -np.inf)
    t = np.minimum(t, x_max)
    lo, hi = t[:-1], t[1:]
    prob = _interval(lo, hi)
    first = _interval(lo - a, hi - a)  # E[W; interval]
    down = (w[1:] * prob - first) / step
    up = (first - w[:-1] * prob) / step
    masses = np.zeros(k.size)
    masses[:-1] += np.clip(down, 0.0, None)
    masses[1:] += np.clip(up, 0.0, None)
    masses *= rate
    masses[per_unit] += 1.0 - rate  # the atom at Z = 0 (no report, or rate = 1: nothing)
    return -per_unit, masses


def _convolve(a: tuple[int, np.ndarray], b: tuple[int, np.ndarray]) -> tuple[int, np.ndarray]:
    # FFT noise is left signed here (it averages out) and set to zero once, at the end.
    return a[0] + b[0], signal.convolve(a[1], b[1], method="auto")


class _Chernoff:
    """Tail bounds of a sum of ``J`` i.i.d. lattice terms, and of its tilted version.

    For a term's lattice measure ``mu`` (mass <= 1, mean <= 0) with ``M(t) = sum mu(z) e^{t z}``
    and ``T`` the sum of ``J`` terms: ``E[(1 + T/n) 1{T >= s}] <= e^{-t s} (M^J + J/n M^{J-1}
    M')`` for ``t > 0`` (the tilt that turns ``Q`` into ``P``; for ``s >= 0`` it also bounds the
    ``Q`` mass); below, ``(1 + T/n) <= 1`` for ``T <= 0`` and ``Q(T <= s) <= e^{t s} M(-t)^J``.
    Each bound is minimised over a grid of ``t``. A large lattice is first merged into at most
    ``_MGF_BINS`` runs of neighbouring points, each represented by the end that makes ``M`` and
    ``M'`` larger (``z e^{t z}`` is largest at an end of an interval), so the bounds stay valid.
    """

    def __init__(self, term: tuple[int, np.ndarray], step: float, n: int) -> None:
        offset, masses = term
        # The lowest points exactly (the lower tail needs them), the rest merged into runs.
        exact = min(masses.size, _MGF_BINS)
        rest = masses[exact:]
        width = max(1, math.ceil(rest.size / _MGF_BINS))
        pad = (-rest.size) % width
        grouped = np.concatenate([rest, np.zeros(pad)]).reshape(-1, width)
        first = offset + exact + np.arange(grouped.shape[0]) * width
        starts = np.concatenate([offset + np.arange(exact), first])
        ends = np.concatenate([offset + np.arange(exact), first + width - 1])
        mass = np.concatenate([masses[:exact], grouped.sum(axis=1)])
        keep = mass > 0
        self.mass = mass[keep]
        self.lo = starts[keep] * step
        self.hi = ends[keep] * step
        self.n = n
        # e^{t z} stays below e^60: above, z reaches the top of the lattice; below, z >= -1 for
        # every report, so the lower tail can use much larger t.
        span_up = max(float(self.hi.max()), step)
        span_down = max(-float(self.lo.min()), step)
        self.thetas = np.geomspace(1e-6, 60.0, 240) / span_up
        self.thetas_down = np.geomspace(1e-6, 60.0, 240) / span_down
        self._up = self._mgf(self.thetas)
        self._down = self._mgf(-self.thetas_down)

    def _mgf(self, theta: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Upper bounds on ``log M(t)`` and on ``M'(t) / M(t)`` at each ``t``."""
        log_mass = np.log(self.mass)
        log_m0 = np.empty(theta.size)
        ratio = np.empty(theta.size)
        for start in range(0, theta.size, 16):
            t = theta[start : start + 16, None]
            z0 = np.where(t > 0, self.hi[None, :], self.lo[None, :])
            log_m0[start : start + 16] = logsumexp(log_mass[None, :] + t * z0, axis=1)
            # z e^{t z} on a run is largest at one of its ends; scaled by e^{-log M} against
            # overflow.
            scale = log_m0[start : start + 16, None]
            g = np.maximum(
                self.lo * np.exp(t * self.lo - scale), self.hi * np.exp(t * self.hi - scale)
            )
            ratio[start : start + 16] = (self.mass[None, :] * g).sum(axis=1)
        return log_m0, ratio

    def window(self, count: int, budget: float) -> tuple[float, float, float, float]:
        """Return a range ``[low, high]`` of the sum of ``count`` terms and the masses outside.

        Returns:
            ``(low, high, q_out, p_out)``: bounds on the ``Q`` mass and on the tilted ``P`` mass
            of ``T < low`` plus ``T > high``, each at most ``budget``.
        """
        half = math.log(budget / 2.0)
        log_m0, ratio = self._up
        log_tilted = count * log_m0 + np.log(np.maximum(1.0 + count / self.n * ratio, 1e-300))
        highs = np.maximum((log_tilted - half) / self.thetas, 0.0)
        i = int(np.argmin(highs))
        high = float(highs[i])
        p_high = math.exp(log_tilted[i] - self.thetas[i] * high)
        log_down, _ = self._down
        lows = np.minimum(-(count * log_down - half) / self.thetas_down, 0.0)
        j = int(np.argmax(lows))
        low = float(lows[j])
        q_low = math.exp(count * log_down[j] + self.thetas_down[j] * low)
        return low, high, q_low + p_high, p_high + q_low


def _cut(
    part: tuple[int, np.ndarray],
    count: int,
    bounds: _Chernoff,
    *,
    step: float,
    budget: float,
) -> tuple[tuple[int, np.ndarray], float, float]:
    """Keep the lattice points of a sum of ``count`` terms inside its Chernoff window.

    Returns:
        The kept part and the bounds on the ``Q`` mass and the tilted ``P`` mass cut off.
    """
    offset, masses = part
    low, high, q_out, p_out = bounds.window(count, budget)
    lo = max(0, math.floor(low / step) - offset)
    hi = min(masses.size, math.ceil(high / step) - offset + 1)
    if lo == 0 and hi == masses.size:
        return part, 0.0, 0.0
    return (offset + lo, masses[lo:hi].copy()), q_out, p_out


def _power(
    term: tuple[int, np.ndarray], count: int, bounds: _Chernoff, *, step: float, budget: float
) -> tuple[tuple[int, np.ndarray], float, float]:
    """``count``-fold convolution of the term by binary powering, cut to Chernoff windows."""
    per_cut = budget / max(1, 2 * count.bit_length())
    cut_q = cut_p = 0.0
    result: tuple[int, np.ndarray] | None = None
    result_terms = 0
    power, power_terms = term, 1
    remaining = count
    while remaining:
        if remaining & 1:
            if result is None:
                result, result_terms = power, power_terms
            else:
                result_terms += power_terms
                result, dq, dp = _cut(
                    _convolve(result, power), result_terms, bounds, step=step, budget=per_cut
                )
                cut_q, cut_p = cut_q + dq, cut_p + dp
        remaining >>= 1
        if remaining:
            power_terms *= 2
            power, dq, dp = _cut(
                _convolve(power, power), power_terms, bounds, step=step, budget=per_cut
            )
            cut_q, cut_p = cut_q + dq, cut_p + dp
            if power[1].size > MAX_LATTICE_POINTS:
                raise ValueError(
                    f"sigma is too small for the pld method at this n: the sum of reports would "
                    f"need more than {MAX_LATTICE_POINTS} lattice points; raise sigma or use an "
                    f"RDP method."
                )
    assert result is not None  # count >= 1
    offset, masses = result
    return (offset, np.clip(masses, 0.0, None)), cut_q, cut_p


def _check_setting(
    n: object, sigma: object, rate: object, m: object
) -> tuple[int, float, float, int]:
    n = check_int("n", n, minimum=1)
    sigma = check_sigma(sigma)
    if rate is not None and m is not None:
        raise ValueError(
            f"give rate (check-in) or m (subsampled), not both. Found {rate!r}, {m!r}."
        )
    gamma = 1.0 if rate is None else check_probability("rate", rate)
    terms = n if m is None else check_int("m", m, minimum=1, maximum=n)
    if sigma < 0.05:
        raise ValueError(
            f"sigma must be at least 0.05 for the pld method (each report's likelihood ratio "
            f"spans more than e^170 below that). Found {sigma!r}."
        )
    return n, sigma, gamma, terms


def pld_tail(delta: float, rounds: int) -> float:
    """Return the per-round mass the pld method leaves out: at most 1e-13 and 1e-3 delta/rounds.

    Rounded down to a power of ten, so that one round's PLD can be reused while a history grows.

    Args:
        delta: Target delta in ``(0, 1)``.
        rounds: Number of rounds composed (integer >= 1).

    Returns:
        The per-round budget of mass added to delta.

    Raises:
        ValueError: on an out-of-range argument.
    """
    delta = check_delta(delta)
    rounds = check_int("rounds", rounds, minimum=1)
    return 10.0 ** math.floor(math.log10(min(1e-13, 1e-3 * delta / rounds)))


@functools.lru_cache(maxsize=32)
def _cached_pair(
    n: int, terms: int, gamma: float, sigma: float, tail: float, spread: float
) -> ShuffleGaussianPair:
    a = 1.0 / sigma
    # 1. the report coordinate: every term above x_max has Q-probability gamma Phi(-x_max).
    # Under P the differing report is shifted by a, so the same cut weighs Phi(a - x_max); it
    # is kept below 25 tail (it is added to delta as it is).
    x_max = float(-ndtri(tail / 4.0 / (gamma * terms)))
    x_max = max(x_max, a - float(ndtri(min(0.5, 25.0 * tail / gamma))), a / 2.0 + 1.0)
    p_cut = gamma * _survival(x_max)
    mean_cut = -gamma * (_survival(x_max - a) - _survival(x_max))  # E[Z; kept] <= 0
    log_keep = terms * math.log1p(-p_cut)
    infinity_add = -math.expm1(log_keep)
    kept_p = math.exp((terms - 1) * math.log1p(-p_cut)) * ((1.0 - p_cut) + terms / n * mean_cut)
    infinity_remove = max(0.0, 1.0 - kept_p)
    # 2. the lattice: fine enough that the sum's window has about LATTICE_TARGET points, and
    # never so coarse that it adds more than spread * Var(S) to the variance of S.
    variance_w = math.expm1(a * a)
    w_max = math.exp(a * x_max - a * a / 2.0)
    width = min(terms * (w_max + 1.0), w_max + 1.0 + 20.0 * math.sqrt(terms * gamma * variance_w))
    target = min(2.0 * math.sqrt(spread * variance_w), width / LATTICE_TARGET)
    target = max(target, (w_max + 1.0) / MAX_LATTICE_POINTS, 1e-12)
    if target >= 1.0:
        raise ValueError(
            f"sigma={sigma!r} is too small for the pld method: one report's likelihood ratio "
            f"reaches {w_max:.3g}, more than the {MAX_LATTICE_POINTS}-point lattice can hold; "
            f"raise sigma or use an RDP method."
        )
    step = 1.0 / math.ceil(1.0 / target)
    term = _term_lattice(a, gamma, x_max, step)
    # 3. the rare big values: split the term at u, where two big terms among all N are far
    # less likely than one cut's budget. Then S = (N small terms) + N x (N - 1 small terms and one
    # big term) + (two or more big terms, bounded). Only heavy tails (small sigma) have any.
    budget = tail / 4.0
    per_cut = budget / (2 * terms.bit_length() + 2)
    p_target = math.sqrt(per_cut / 8.0) / terms
    above = np.cumsum(term[1][::-1])[::-1]
    big_from = max(int(np.searchsorted(-above, -p_target, side="left")), -term[0] + 1)
    small = (term[0], term[1][:big_from])
    big = (term[0] + big_from, term[1][big_from:])
    p_big = float(big[1].sum())
    bounds = _Chernoff(small, step, n)
    if terms > 1:
        rest, cut_q, cut_p = _power(small, terms - 1, bounds, step=step, budget=budget)
        whole, dq, dp = _cut(_convolve(rest, small), terms, bounds, step=step, budget=per_cut)
    else:
        rest, cut_q, cut_p = (0, np.ones(1)), 0.0, 0.0
        whole, dq, dp = small, 0.0, 0.0
    offset, masses = whole[0], np.clip(whole[1], 0.0, None)
    infinity_add += cut_q + dq
    infinity_remove += cut_p + dp
    if p_big > 0.0:
        z_top = (big[0] + big[1].size - 1) * step
        one_big = _convolve(rest, big)
        start = min(offset, one_big[0])
        stop = max(offset + masses.size, one_big[0] + one_big[1].size)
        combined = np.zeros(stop - start)
        combined[offset - start : offset - start + masses.size] += masses
        combined[one_big[0] - start : one_big[0] - start + one_big[1].size] += terms * np.clip(
            one_big[1], 0.0, None
        )
        offset, masses = start, combined
        # The cuts of the N - 1 small terms also removed the one-big-term part, and two or more
        # big terms (at most (Np)^2/2 e^{Np}) go to infinity; with the tilt (1 + T/n), the big
        # term adds at most z_top/n, and E[Z; big] <= gamma Phi(a - x_u) (Z + h <= W).
        jp = terms * p_big
        several = 0.5 * jp * jp * math.exp(jp)
        z_split = (big[0] - 1) * step
        big_mean = gamma * _survival((math.log1p(z_split) + a * a / 2.0) / a - a)
        infinity_add += jp * cut_q + several
        infinity_remove += jp * (cut_p + z_top / n * cut_q) + several
        infinity_remove += terms / n * (big_mean * jp + gamma * several)
    masses.setflags(write=False)
    return ShuffleGaussianPair(
        n=n,
        terms=terms,
        rate=gamma,
        sigma=sigma,
        step=step,
        offset=offset,
        masses=masses,
        infinity_remove=min(1.0, infinity_remove),
        infinity_add=min(1.0, infinity_add),
        x_max=x_max,
    )


def shuffle_gaussian_pair(
    *,
    n: int,
    sigma: float,
    rate: float | None = None,
    m: int | None = None,
    tail: float = 1e-13,
    spread: float = DEFAULT_SPREAD,
) -> ShuffleGaussianPair:
    """Build the lattice pair that dominates one round of the shuffle Gaussian.

    Args:
        n: Number of users (integer >= 1).
        sigma: The paper's sigma (noise std over the distance of the differing user's inputs),
            at least 0.05.
        rate: Check-in rate ``gamma`` in ``(0, 1]`` (shuffled check-in), or ``None``.
        m: Users per round drawn without replacement (subsampled shuffle), or ``None``.
        tail: Mass left out (added to delta, split over the cut report coordinate, the cut
            lattice and the loss grid), in ``(0, 1)``.
        spread: Variance the lattice may add to ``S``, relative to ``Var(S)``, in ``(0, 1)``.

    Returns:
        A :class:`ShuffleGaussianPair` (cached: the same arguments return the same object).

    Raises:
        ValueError: on an out-of-range argument, or a setting whose lattice would not fit in
            :data:`MAX_LATTICE_POINTS`.
    """
    n, sigma, gamma, terms = _check_setting(n, sigma, rate, m)
    tail = check_tail(tail)
    spread = check_positive("spread", spread)
    if spread >= 1.0:
        raise ValueError(f"spread must be in (0, 1). Found {spread!r}.")
    return _cached_pair(n, terms, gamma, sigma, tail, spread)


def pld_discretization(
    *, n: int, sigma: float, rate: float | None = None, m: int | None = None
) -> float:
    """Default loss grid step: about 1/256 of one round's privacy-loss standard deviation.

    A power of two between ``2^-27`` and ``2^-10``, computed from the variance of ``S``
    (``N gamma (e^{1/sigma^2} - 1)``), so that rounds with nearby settings share a grid.

    Returns:
        The grid step ``d`` of the loss.

    Raises:
        ValueError: on an out-of-range argument.
    """
    n, sigma, gamma, terms = _check_setting(n, sigma, rate, m)
    sd = math.sqrt(terms * gamma * math.expm1(1.0 / sigma**2)) / n
    sd = min(sd, 1.0)  # n = 1: the loss of one Gaussian report has sd 1/sigma
    exponent = math.floor(math.log2(max(sd / _GRID_PER_SD, 2.0**-27)))
    return 2.0 ** min(exponent, -10)


def _pmf(
    curve: np.ndarray, lo: int, discretization: float, tail: float, infinity: float
) -> pld_pmf.PLDPmf:
    """Connect-the-dots PMF of a hockey-stick curve given on the grid ``(lo + j) d``."""
    # Stop the grid where the remaining finite part of delta is within the budget.
    keep = np.flatnonzero(curve - infinity > tail)
    end = int(keep[-1]) + 2 if keep.size else 1
    end = min(end, curve.size)
    deltas = np.minimum.accumulate(np.minimum(curve[:end], 1.0))
    if deltas.size == 1:
        return pld_pmf.DensePLDPmf(discretization, lo, np.array([1.0 - deltas[0]]), deltas[0], True)
    return pld_pmf.create_pmf_pessimistic_connect_dots_fixed_gap(
        discretization, lo, lo + deltas.size - 1, deltas
    )


def _grid(low: float, high: float, discretization: float) -> tuple[int, np.ndarray]:
    lo = math.floor(low / discretization) - 1
    hi = math.ceil(high / discretization) + 1
    if hi - lo + 1 > MAX_GRID_POINTS:
        raise ValueError(
            f"discretization={discretization!r} is too fine for this setting: the loss grid "
            f"would have {hi - lo + 1} points (at most {MAX_GRID_POINTS}); raise discretization."
        )
    return lo, np.arange(lo, hi + 1) * discretization


def shuffle_gaussian_pld(
    *,
    n: int,
    sigma: float,
    rate: float | None = None,
    m: int | None = None,
    steps: int = 1,
    discretization: float | None = None,
    tail: float = 1e-13,
) -> PrivacyLossDistribution:
    """PLD of ``steps`` rounds of the shuffle Gaussian (plain, subsampled or check-in).

    Both directions (remove: ``log P/Q`` under ``P``; add: ``log Q/P`` under ``Q``) are built from
    the exact hockey-stick curves of the dominating lattice pair by pessimistic
    connect-the-dots; see the module docstring for every approximation and its bound.

    Args:
        n: Number of users (integer >= 1).
        sigma: The paper's sigma, at least 0.05.
        rate: Check-in rate ``gamma`` (shuffled check-in), or ``None``.
        m: Users per round (subsampled shuffle), or ``None``.
        steps: Number of identical rounds (integer >= 1).
        discretization: Loss grid step; :func:`pld_discretization` by default. Rounds to be
            composed with :func:`~.common.compose_plds` must share it.
        tail: Mass per round left out and added to delta, in ``(0, 1)``.

    Returns:
        A ``dp_accounting`` ``PrivacyLossDistribution``.

    Raises:
        ValueError: on an out-of-range argument or a setting too large to evaluate.
    """
    steps = check_int("steps", steps, minimum=1)
    if discretization is None:
        discretization = pld_discretization(n=n, sigma=sigma, rate=rate, m=m)
    discretization = check_discretization(discretization)
    pld = _cached_pld(n, sigma, rate, m, discretization, check_tail(tail))
    return pld if steps == 1 else pld.self_compose(steps)


@functools.lru_cache(maxsize=32)
def _cached_pld(
    n: int, sigma: float, rate: float | None, m: int | None, discretization: float, tail: float
) -> PrivacyLossDistribution:
    pair = shuffle_gaussian_pair(n=n, sigma=sigma, rate=rate, m=m, tail=tail)
    ratios = pair.ratios
    positive = ratios[(pair.masses > 0) & (ratios > 0)]
    low, high = float(np.log(positive.min())), float(np.log(positive.max()))
    lo_r, grid_r = _grid(low, high, discretization)
    remove = _pmf(pair.delta_remove(grid_r), lo_r, discretization, tail / 4.0, pair.infinity_remove)
    lo_a, grid_a = _grid(-high, -low, discretization)
    add = _pmf(pair.delta_add(grid_a), lo_a, discretization, tail / 4.0, pair.infinity_add)
    return PrivacyLossDistribution(remove, add)


def _schedule(
    n: int | Sequence[int],
    sigma: float | Sequence[float],
    rate: float | None | Sequence[float | None],
    m: int | None | Sequence[int | None],
    steps: int | Sequence[int],
) -> list[tuple[int, float, float | None, int | None, int]]:
    values = [n, sigma, rate, m, steps]
    seqs = [list(v) if isinstance(v, (list, tuple, np.ndarray)) else None for v in values]
    length = max((len(s) for s in seqs if s is not None), default=1)
    names = ("n", "sigma", "rate", "m", "steps")
    out = []
    for name, value, seq in zip(names, values, seqs, strict=True):
        if seq is not None and len(seq) != length:
            raise ValueError(
                f"{name} must be a scalar or have the same length as the other per-round "
                f"parameters ({length}). Found length {len(seq)}."
            )
        out.append(seq if seq is not None else [value] * length)
    return [
        (out[0][i], out[1][i], out[2][i], out[3][i], check_int("steps", out[4][i], minimum=1))
        for i in range(length)
    ]


def _schedule_pld(
    plan: list[tuple[int, float, float | None, int | None, int]],
    discretization: float | None,
    tail: float,
) -> PrivacyLossDistribution:
    if discretization is None:
        discretization = min(
            pld_discretization(n=ni, sigma=si, rate=ri, m=mi) for ni, si, ri, mi, _ in plan
        )
    return compose_plds(
        plds=[
            shuffle_gaussian_pld(
                n=ni, sigma=si, rate=ri, m=mi, steps=k, discretization=discretization, tail=tail
            )
            for ni, si, ri, mi, k in plan
        ]
    )


def shuffle_gaussian_delta(
    eps: float,
    *,
    n: int | Sequence[int],
    sigma: float | Sequence[float],
    rate: float | None | Sequence[float | None] = None,
    m: int | None | Sequence[int | None] = None,
    steps: int | Sequence[int] = 1,
    discretization: float | None = None,
    tail: float = 1e-13,
) -> float:
    """Upper bound on ``delta(eps)`` of composed shuffle-Gaussian rounds (PLD accounting).

    Per-round parameters may be sequences of equal length (group ``i`` has ``steps[i]`` rounds
    with ``n[i]``, ``sigma[i]``, ``rate[i]``, ``m[i]``); scalars broadcast.

    Args:
        eps: Target epsilon, ``>= 0``.
        n: Users (scalar or per group).
        sigma: The paper's sigma (scalar or per group).
        rate: Check-in rate or ``None`` (scalar or per group).
        m: Users per round or ``None`` (scalar or per group).
        steps: Rounds (scalar or per group).
        discretization: Common loss grid step (the finest default of the groups by default).
        tail: Mass per round left out and added to delta.

    Returns:
        delta, the larger of the two directions.

    Raises:
        ValueError: on an out-of-range argument.
    """
    eps = check_nonnegative("eps", eps)
    pld = _schedule_pld(_schedule(n, sigma, rate, m, steps), discretization, check_tail(tail))
    return float(min(1.0, pld.get_delta_for_epsilon(eps)))


def shuffle_gaussian_epsilon(
    delta: float,
    *,
    n: int | Sequence[int],
    sigma: float | Sequence[float],
    rate: float | None | Sequence[float | None] = None,
    m: int | None | Sequence[int | None] = None,
    steps: int | Sequence[int] = 1,
    discretization: float | None = None,
    tail: float | None = None,
) -> float:
    """Smallest epsilon on the loss grid with ``delta(epsilon) <= delta`` (PLD accounting).

    Arguments as in :func:`shuffle_gaussian_delta`, with ``delta`` in ``(0, 1)``; ``tail``
    defaults to :func:`pld_tail` of ``delta`` and the total number of rounds.

    Returns:
        epsilon (``inf`` if the mass at infinite loss exceeds ``delta``).

    Raises:
        ValueError: on an out-of-range argument.
    """
    delta = check_delta(delta)
    plan = _schedule(n, sigma, rate, m, steps)
    if tail is None:
        tail = pld_tail(delta, sum(k for *_, k in plan))
    pld = _schedule_pld(plan, discretization, check_tail(tail))
    return max(0.0, float(pld.get_epsilon_for_delta(delta)))
