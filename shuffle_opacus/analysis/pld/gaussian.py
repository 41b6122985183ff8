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

**Replace-one and adaptive orientations.** The pair is asymmetric, and under replace-one a
round's query may put the other users at either of the differing user's two values, chosen from
what was released so far: each round is ``(P, Q)`` or ``(Q, P)``, adaptively. Composing each
orientation on its own does not cover such mixes. Every round is therefore represented by one
*symmetrised* pair whose privacy profile is ``max(H(P || Q), H(Q || P))`` at every real eps
(the profile of ``min(f, f^-1)**``, Dong, Roth & Su, arXiv:1905.02383), which dominates both
orientations; its PMF is composed for both adjacency directions (a symmetric
``PrivacyLossDistribution``), and by Zhu, Dong & Wang (arXiv:2106.08567, Theorem 10) the product
dominates every adaptive mix. docs/maths.md gives the argument.

**Two engines for the law of S.** Rounds with many reports use the uniform lattice below. Rounds
with few reports (at most :data:`GEOMETRIC_MAX_TERMS`, or up to
:data:`GEOMETRIC_FALLBACK_TERMS` when the lattice's step would exceed
:data:`COARSE_LATTICE_STEP`) put each report's ratio ``W`` and every partial sum on a geometric
grid instead (:func:`_geometric_pair`): the same mean-preserving spread, so the same convex-order
domination, but resolving both ``W`` near 0 and ``W`` near ``e^{a x_max}``.

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

Floating-point rounding (of the kernel masses and of the FFT convolutions, here and in
``dp_accounting``'s compositions) is not bounded; negative FFT noise is set to zero. Measured as
the defect of the pair's total masses it is at most a few 1e-11 per round. Results say so: "an
upper bound in exact arithmetic, floating-point rounding not bounded".
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from dp_accounting.pld import pld_pmf
from dp_accounting.pld.privacy_loss_distribution import PrivacyLossDistribution
from scipy import signal
from scipy.special import ndtr, ndtri
from scipy.stats import binom

from .._validation import (
    check_delta,
    check_int,
    check_nonnegative,
    check_positive,
    check_probability,
    check_sigma,
)
from ..limits import PldRangeError
from .common import check_discretization, check_tail, compose_plds

__all__ = [
    "PldRangeError",
    "ShuffleGaussianPair",
    "shuffle_gaussian_pair",
    "shuffle_gaussian_pld",
    "symmetric_pmf",
    "shuffle_gaussian_delta",
    "shuffle_gaussian_epsilon",
    "pld_discretization",
    "pld_tail",
    "MAX_LATTICE_POINTS",
    "MAX_GRID_POINTS",
    "GEOMETRIC_MAX_TERMS",
    "GEOMETRIC_FALLBACK_TERMS",
]

#: Largest lattice for one report's term (and for the sum); about 64 MB per array.
MAX_LATTICE_POINTS = 1 << 23
#: Rounds of at most this many reports use the geometric grid (engine ``geometric``).
GEOMETRIC_MAX_TERMS = 12
#: ... and up to this many when the lattice's step would exceed COARSE_LATTICE_STEP.
GEOMETRIC_FALLBACK_TERMS = 64
#: Lattice step (in units of one report's ratio) above which few reports use the geometric grid.
COARSE_LATTICE_STEP = 0.05
#: Grid points across one report's range for a single report (engine ``geometric``).
GEOMETRIC_POINTS = 8000
#: Largest log-step of the geometric grid.
_GEOMETRIC_MAX_STEP = 0.02
#: Rows of the outer sum handled at once by the geometric engine (bounds its memory).
_ROW_BLOCK = 256
#: Largest loss grid of one round's PMF.
MAX_GRID_POINTS = 4_000_000
#: Extra variance the lattice may add to S, relative to Var(S), by default.
DEFAULT_SPREAD = 1e-3
#: Points of the lattice of S the step aims at (when the spread allows a coarser one).
LATTICE_TARGET = 1 << 18
#: Runs of lattice points the tail bounds merge a large term lattice into.
_MGF_BINS = 1 << 14
#: Loss grid step relative to the standard deviation of one round's privacy loss, by default.
#: 1/64: at the quick.yaml setting (1,400 rounds) epsilon is within 1e-6 of a four times finer
#: grid's, and a composition costs a sixteenth (docs/maths.md, "Reporting epsilon every round").
_GRID_PER_SD = 64


@dataclass(frozen=True)
class ShuffleGaussianPair:
    """A discrete pair that dominates one round of the shuffle Gaussian, both orientations.

    ``Q~`` puts mass ``masses[i]`` on the likelihood ratio ``ratios[i]`` (ascending, ``>= 0``);
    ``P~`` puts ``ratios[i] * masses[i]`` there; the remove direction adds ``infinity_remove``
    (mass of ``P~`` at loss ``+inf``), the add direction ``infinity_add`` (mass of ``Q~`` there).

    Attributes:
        n: Population (the ``n`` of the ratio ``1 + S/n``).
        terms: Number of terms ``N`` in ``S``.
        rate: Check-in rate of each term (1 for ``full`` and ``subsampled``).
        sigma: The paper's sigma.
        engine: ``"lattice"`` (``S`` on a uniform lattice, FFT convolutions) or ``"geometric"``
            (each sum of reports on a geometric grid, for few terms; see the module docstring).
        step: Lattice step ``h`` of ``S`` (``lattice``) or log-step ``s`` of the grid
            (``geometric``).
        ratios: Likelihood ratios ``1 + s/n`` of the support, ascending.
        masses: ``Q~`` on ``ratios``.
        infinity_remove: Mass at loss ``+inf`` of ``P~`` (``H(P || Q)`` direction).
        infinity_add: Mass at loss ``+inf`` of ``Q~`` (``H(Q || P)`` direction).
        x_max: Where each report's coordinate was cut.
    """

    n: int
    terms: int
    rate: float
    sigma: float
    engine: str
    step: float
    ratios: np.ndarray
    masses: np.ndarray
    infinity_remove: float
    infinity_add: float
    x_max: float

    @property
    def sums(self) -> np.ndarray:
        """The values ``s_i = n (ratio_i - 1)`` of ``S``."""
        return self.n * (self.ratios - 1.0)

    @functools.cached_property
    def _suffix(self) -> tuple[np.ndarray, np.ndarray]:
        m = self.masses
        return (
            np.concatenate([np.cumsum(m[::-1])[::-1], [0.0]]),
            np.concatenate([np.cumsum((m * self.ratios)[::-1])[::-1], [0.0]]),
        )

    @functools.cached_property
    def _prefix(self) -> tuple[np.ndarray, np.ndarray]:
        m = self.masses
        return (
            np.concatenate([[0.0], np.cumsum(m)]),
            np.concatenate([[0.0], np.cumsum(m * self.ratios)]),
        )

    def delta_remove(self, eps: np.ndarray | float) -> np.ndarray:
        """``H_{e^eps}(P~ || Q~)``: ``sum Q~ (ratio - e^eps)_+`` plus infinity mass (any eps)."""
        eps = np.atleast_1d(np.asarray(eps, dtype=float))
        mass_above, first_above = self._suffix
        alpha = np.exp(eps)
        k = np.searchsorted(self.ratios, alpha, side="right")
        value = first_above[k] - alpha * mass_above[k]
        return np.clip(value, 0.0, None) + self.infinity_remove

    def delta_add(self, eps: np.ndarray | float) -> np.ndarray:
        """``H_{e^eps}(Q~ || P~)``: ``sum Q~ (1 - e^eps ratio)_+`` plus infinity mass (any eps)."""
        eps = np.atleast_1d(np.asarray(eps, dtype=float))
        mass_below, first_below = self._prefix
        alpha = np.exp(eps)
        k = np.searchsorted(self.ratios, np.exp(-eps), side="left")
        value = mass_below[k] - alpha * first_below[k]
        return np.clip(value, 0.0, None) + self.infinity_add

    def delta_symmetric(self, eps: np.ndarray | float) -> np.ndarray:
        """Privacy profile of the symmetrised pair: the larger of the two directions at ``eps``.

        Valid at every real ``eps``: this is the profile of the trade-off function
        ``min(f, f^-1)**`` (the symmetrisation of Dong, Roth & Su, arXiv:1905.02383, through
        the conjugacy ``(min(f, g))* = max(f*, g*)``), which dominates both orientations.
        """
        return np.maximum(self.delta_remove(eps), self.delta_add(eps))

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


def _cells(t: np.ndarray) -> np.ndarray:
    """``P(t_i < X <= t_{i+1})`` for sorted ``t``: :func:`_interval` of its neighbours.

    The same values, with each distribution function evaluated once per point instead of four
    times per cell: a cell whose lower end is ``>= 0`` uses the upper tail ``ndtr(-t)`` at both
    ends (both are ``>= 0``), any other cell ``ndtr(t)``.
    """
    cells = t.size - 1
    if cells <= 0:
        return np.zeros(0)
    first_pos = int(np.searchsorted(t[:-1], 0.0, side="left"))  # cells i >= it have t_i >= 0
    out = np.empty(cells)
    if first_pos:
        lower = ndtr(t[: first_pos + 1])
        out[:first_pos] = lower[1:] - lower[:-1]
    if first_pos < cells:
        upper = ndtr(-t[first_pos:])
        out[first_pos:] = upper[:-1] - upper[1:]
    return out


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
    prob = _cells(t)
    first = _cells(t - a)  # E[W; interval]
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
            # The exponent at each run's end that makes M larger (all t of a block share a sign).
            z0 = self.hi if t[0, 0] > 0 else self.lo
            exponent = log_mass[None, :] + t * z0[None, :]
            top = exponent.max(axis=1, keepdims=True)
            scaled = np.exp(exponent - top)
            log_m0[start : start + 16] = np.log(scaled.sum(axis=1)) + top[:, 0]
            # z e^{t z} on a run is largest at one of its ends: at the end z0, mass * z0 * e^{t z0}
            # is scaled[...] * z0 * e^{top - log M}; the other end is evaluated directly. Scaled by
            # e^{-log M} against overflow.
            shift = np.exp(top[:, 0] - log_m0[start : start + 16])[:, None]
            other = self.lo if t[0, 0] > 0 else self.hi
            at_z0 = scaled * shift * z0[None, :]
            at_other = (
                self.mass[None, :]
                * other[None, :]
                * np.exp(t * other[None, :] - log_m0[start : start + 16, None])
            )
            ratio[start : start + 16] = np.maximum(at_z0, at_other).sum(axis=1)
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
                raise PldRangeError(
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
        raise PldRangeError(
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


def _geometric_term(a: float, x_max: float, step: float) -> tuple[int, np.ndarray, float]:
    """One report's ratio ``W = e^{a x - a^2/2}`` (cut at ``x <= x_max``) on a geometric grid.

    The grid is ``{0} U {e^{k step}: k0 <= k <= k1}``; the mass of ``W`` between two neighbouring
    points is split between them so that its mean is kept (as in :func:`_term_lattice`, with
    ``E[W 1{x <= t}] = Phi(t - a)``), so the grid term dominates ``W`` in the convex order.

    Returns:
        ``(k0, masses, zero)``: the masses on ``e^{(k0 + i) step}`` and the mass at 0.
    """
    k0 = math.floor((-a * x_max - a * a / 2.0) / step)
    k1 = math.ceil((a * x_max - a * a / 2.0) / step)
    logs = np.arange(k0, k1 + 1) * step
    points = np.concatenate([[0.0], np.exp(logs)])
    t = np.minimum(np.concatenate([[-np.inf], (logs + a * a / 2.0) / a]), x_max)
    prob = _cells(t)
    first = _cells(t - a)  # E[W; interval]
    width = points[1:] - points[:-1]
    masses = np.zeros(points.size)
    masses[:-1] += np.clip((points[1:] * prob - first) / width, 0.0, None)
    masses[1:] += np.clip((first - points[:-1] * prob) / width, 0.0, None)
    return k0, masses[1:], float(masses[0])


def _trim(
    part: tuple[int, np.ndarray, float], step: float, *, n: int, count: int, budget: float
) -> tuple[tuple[int, np.ndarray, float], float, float]:
    """Drop the outermost grid points of a partial sum of ``count`` reports, within a budget.

    Dropping the event "the partial sum ``Y`` lands on a dropped point" costs its ``Q`` mass
    ``q`` and its ``P`` mass ``E_Q[R; event] <= (sum q y + q (n - count)) / n`` (the remaining
    reports add at most their mean, 1 each, to ``n R = Y + rest + n - N``). Points are dropped
    from each end while the sum of both costs stays within ``budget / 2`` per end.

    Returns:
        The kept part and the ``Q`` and ``P`` masses dropped.
    """
    k0, masses, zero = part
    values = np.exp((k0 + np.arange(masses.size)) * step)
    cost_q = masses
    cost_p = masses * (values + (n - count)) / n
    cost = cost_q + cost_p
    lo = int(np.searchsorted(np.cumsum(cost), budget / 2.0, side="right"))
    hi = masses.size - int(np.searchsorted(np.cumsum(cost[::-1]), budget / 2.0, side="right"))
    if hi <= lo:
        return part, 0.0, 0.0
    dropped_q = float(cost_q[:lo].sum() + cost_q[hi:].sum())
    dropped_p = float(cost_p[:lo].sum() + cost_p[hi:].sum())
    return (k0 + lo, masses[lo:hi].copy(), zero), dropped_q, dropped_p


def _geometric_add(
    y: tuple[int, np.ndarray, float], w: tuple[int, np.ndarray, float], step: float
) -> tuple[int, np.ndarray, float]:
    """Law of ``Y + W`` for independent ``Y``, ``W`` on the geometric grid, spread back onto it.

    With ``y_i = e^{(ky + i) s}`` and ``w_j = e^{(kw + j) s}``, ``y_i + w_j = y_i (1 + e^{d s})``
    with ``d = kw + j - ky - i``: its grid cell ``i + f(d)`` and its split between the cell's two
    ends depend on ``d`` only, so they are computed once per ``d``. Each sum's mass is split
    between the two neighbouring grid points keeping its mean (a mean-preserving spread).
    """
    if y[0] > w[0]:
        y, w = w, y
    ky, qy, zy = y
    kw, qw, zw = w
    d_min = kw - (ky + qy.size - 1)
    d = np.arange(d_min, kw + qw.size - ky)
    log_ratio = np.logaddexp(0.0, d * step)  # log(1 + e^{d s})
    f = np.floor(log_ratio / step).astype(np.int64)
    frac = np.clip(np.expm1(log_ratio - f * step) / math.expm1(step), 0.0, 1.0)
    size = qy.size + int(f.max()) + 2
    out = np.zeros(size)
    j = np.arange(qw.size)
    for start in range(0, qy.size, _ROW_BLOCK):
        i = np.arange(start, min(qy.size, start + _ROW_BLOCK))[:, None]
        index = (kw + j[None, :]) - (ky + i) - d_min
        cell = (i + f[index]).ravel()
        mass = (qy[i] * qw[None, :]).ravel()
        up = frac[index].ravel() * mass
        out += np.bincount(cell, weights=mass - up, minlength=size)
        out += np.bincount(cell + 1, weights=up, minlength=size)
    # Atoms at zero: 0 + w = w (cells kw - ky + j), y + 0 = y, 0 + 0 = 0.
    out[kw - ky : kw - ky + qw.size] += zy * qw
    out[: qy.size] += zw * qy
    nonzero = np.flatnonzero(out)
    first, last = int(nonzero[0]), int(nonzero[-1])
    return ky + first, out[first : last + 1].copy(), zy * zw


def _geometric_pair(
    n: int, terms: int, gamma: float, sigma: float, tail: float, spread: float
) -> ShuffleGaussianPair:
    """Build the pair of a round with few reports, their sum on a geometric grid.

    ``1 + S/n = (Y + n - K) / n`` with ``K`` the number of reports and ``Y`` the sum of their
    ratios ``W``: ``K = N`` for ``full`` and ``subsampled``, ``K ~ Binomial(N, gamma)`` for
    check-in (the law of ``Y`` given ``K = k`` is that of ``k`` reports, so the pair is the
    binomial mixture of the ``k``-report pairs). ``Y_k = Y_{k-1} + W`` is spread back onto the
    geometric grid after each addition (mean kept: convex order); the outermost points are dropped
    within a budget and their masses added to both infinity masses.
    """
    a = 1.0 / sigma
    x_max, infinity_add, infinity_remove = _report_cut(a, gamma, terms, n, tail)
    # About GEOMETRIC_POINTS / sqrt(N) points across one report's range 2 a x_max: the grid's
    # error is second order in the step and grows with the number of additions; the cost is
    # N times the square of the grid size. ``spread`` scales the step like the lattice's.
    points = GEOMETRIC_POINTS / math.sqrt(terms) * math.sqrt(DEFAULT_SPREAD / spread)
    step = min(_GEOMETRIC_MAX_STEP, 2.0 * a * x_max / points)
    budget = tail / 8.0 / terms
    # One report's term, trimmed; every report of the round uses it, so its cost counts N times.
    term, dropped_q, dropped_p = _trim(
        _geometric_term(a, x_max, step), step, n=n, count=1, budget=budget / terms
    )
    infinity_add += terms * dropped_q
    infinity_remove += terms * dropped_p
    sums = [term]
    for count in range(2, terms + 1):
        part, dropped_q, dropped_p = _trim(
            _geometric_add(sums[-1], term, step), step, n=n, count=count, budget=budget
        )
        infinity_add += dropped_q
        infinity_remove += dropped_p
        sums.append(part)
    if gamma == 1.0:
        weights = {terms: 1.0}
    else:
        counts = np.arange(terms + 1)
        weights = dict(zip(counts.tolist(), binom.pmf(counts, terms, gamma).tolist(), strict=True))
    ratios = []
    masses_out = []
    for count, weight in weights.items():
        if weight <= 0.0:
            continue
        if count == 0:
            ratios.append(np.array([1.0]))
            masses_out.append(np.array([weight]))
            continue
        k0, masses, zero = sums[count - 1]
        values = np.concatenate([[0.0], np.exp((k0 + np.arange(masses.size)) * step)])
        ratios.append((values + (n - count)) / n)
        masses_out.append(weight * np.concatenate([[zero], masses]))
    r = np.concatenate(ratios)
    q = np.concatenate(masses_out)
    order = np.argsort(r, kind="stable")
    return _frozen_pair(
        n=n,
        terms=terms,
        rate=gamma,
        sigma=sigma,
        engine="geometric",
        step=step,
        ratios=r[order],
        masses=q[order],
        infinity_remove=infinity_remove,
        infinity_add=infinity_add,
        x_max=x_max,
    )


def _report_cut(
    a: float, gamma: float, terms: int, n: int, tail: float
) -> tuple[float, float, float]:
    """Cut of each report's coordinate at ``x_max``, and the masses of "some report was cut".

    Every term above ``x_max`` has ``Q``-probability ``gamma Phi(-x_max)``, kept at ``tail/4`` in
    all; under ``P`` the differing report is shifted by ``a``, so the same cut weighs about
    ``gamma Phi(a - x_max)``, kept below ``25 tail`` (both are added to delta as they are).

    Returns:
        ``(x_max, infinity_add, infinity_remove)``: the cut, its ``Q`` mass and its ``P`` mass.
    """
    # min(0.5, .): a tiny gamma * terms would ask for a quantile above 1 (NaN).
    x_max = float(-ndtri(min(0.5, tail / 4.0 / (gamma * terms))))
    x_max = max(x_max, a - float(ndtri(min(0.5, 25.0 * tail / gamma))), a / 2.0 + 1.0)
    p_cut = gamma * _survival(x_max)
    mean_cut = -gamma * (_survival(x_max - a) - _survival(x_max))  # E[Z; kept] <= 0
    log_keep = terms * math.log1p(-p_cut)
    infinity_add = -math.expm1(log_keep)
    kept_p = math.exp((terms - 1) * math.log1p(-p_cut)) * ((1.0 - p_cut) + terms / n * mean_cut)
    return x_max, infinity_add, max(0.0, 1.0 - kept_p)


def _frozen_pair(**fields: object) -> ShuffleGaussianPair:
    for name in ("ratios", "masses"):
        fields[name] = np.ascontiguousarray(fields[name], dtype=float)
        fields[name].setflags(write=False)  # type: ignore[attr-defined]
    for name in ("infinity_remove", "infinity_add"):
        fields[name] = min(1.0, float(fields[name]))  # type: ignore[arg-type]
    return ShuffleGaussianPair(**fields)  # type: ignore[arg-type]


def _lattice_step(
    a: float, gamma: float, terms: int, x_max: float, spread: float
) -> tuple[float | None, float]:
    """Step ``h`` of the uniform lattice of ``S`` (``1/h`` an integer), or ``None`` if above 1.

    Fine enough that the sum's window has about ``LATTICE_TARGET`` points, and never so coarse
    that it adds more than ``spread * Var(S)`` to the variance of ``S``; at least the largest
    ratio over ``MAX_LATTICE_POINTS``.

    Returns:
        ``(step or None, w_max)`` with ``w_max`` the largest ratio of one report.
    """
    variance_w = math.expm1(a * a)
    w_max = math.exp(a * x_max - a * a / 2.0)
    width = min(terms * (w_max + 1.0), w_max + 1.0 + 20.0 * math.sqrt(terms * gamma * variance_w))
    target = min(2.0 * math.sqrt(spread * variance_w), width / LATTICE_TARGET)
    target = max(target, (w_max + 1.0) / MAX_LATTICE_POINTS, 1e-12)
    if target >= 1.0:
        return None, w_max
    return 1.0 / math.ceil(1.0 / target), w_max


@functools.lru_cache(maxsize=4)  # the PLDs built from a pair have their own cache
def _cached_pair(
    n: int, terms: int, gamma: float, sigma: float, tail: float, spread: float
) -> ShuffleGaussianPair:
    """Choose the engine: geometric for few reports, or when the lattice would be coarse."""
    if terms <= GEOMETRIC_MAX_TERMS:
        return _geometric_pair(n, terms, gamma, sigma, tail, spread)
    if terms <= GEOMETRIC_FALLBACK_TERMS:
        x_max = _report_cut(1.0 / sigma, gamma, terms, n, tail)[0]
        step = _lattice_step(1.0 / sigma, gamma, terms, x_max, spread)[0]
        if step is None or step > COARSE_LATTICE_STEP:
            return _geometric_pair(n, terms, gamma, sigma, tail, spread)
    return _lattice_pair(n, terms, gamma, sigma, tail, spread)


def _lattice_pair(
    n: int, terms: int, gamma: float, sigma: float, tail: float, spread: float
) -> ShuffleGaussianPair:
    a = 1.0 / sigma
    # 1. the report coordinate (see _report_cut).
    x_max, infinity_add, infinity_remove = _report_cut(a, gamma, terms, n, tail)
    # 2. the lattice (see _lattice_step).
    step, w_max = _lattice_step(a, gamma, terms, x_max, spread)
    if step is None:
        raise PldRangeError(
            f"sigma={sigma!r} is too small for the pld method at n={n}: one report's likelihood "
            f"ratio reaches {w_max:.3g}, more than the {MAX_LATTICE_POINTS}-point lattice can "
            f"hold; raise sigma or use an RDP method."
        )
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
    ratios = np.maximum(1.0 + (offset + np.arange(masses.size)) * step / n, 0.0)
    return _frozen_pair(
        n=n,
        terms=terms,
        rate=gamma,
        sigma=sigma,
        engine="lattice",
        step=step,
        ratios=ratios,
        masses=masses,
        infinity_remove=infinity_remove,
        infinity_add=infinity_add,
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
    """Default loss grid step: about 1/64 of one round's privacy-loss standard deviation.

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


def _relevant_span(pair: ShuffleGaussianPair, tail: float) -> float | None:
    """Return an ``L`` above which neither direction's finite delta exceeds ``tail``.

    Each direction's finite part decreases in eps and vanishes above the largest ``|log r|`` of
    the support. It is evaluated on 256 points up to there, then three times more on 256 points
    between the last point above ``tail`` and the next, and ``L`` is the first point within
    ``tail`` (at most 256^-4 of that largest ``|log r|`` above the exact point). ``None`` when
    the pair has no mass at a positive finite ratio.
    """
    r = pair.ratios[(pair.masses > 0) & (pair.ratios > 0)]
    if r.size == 0:
        return None
    low, high = 0.0, max(abs(float(np.log(r[0]))), abs(float(np.log(r[-1]))))
    for _ in range(4):
        grid = np.linspace(low, high, 257)
        above = (pair.delta_remove(grid) - pair.infinity_remove > tail) | (
            pair.delta_add(grid) - pair.infinity_add > tail
        )
        last = np.flatnonzero(above)
        if last.size == 0:  # within tail from ``low`` on
            return low
        if last[-1] == grid.size - 1:  # still above at the end of the support: keep it
            return high
        low, high = float(grid[last[-1]]), float(grid[last[-1] + 1])
    return high


def _grid(low: float, high: float, discretization: float) -> tuple[int, np.ndarray]:
    lo = math.floor(low / discretization) - 1
    hi = math.ceil(high / discretization) + 1
    if hi - lo + 1 > MAX_GRID_POINTS:
        raise PldRangeError(
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
    """PLD of ``steps`` adaptive rounds of the shuffle Gaussian (plain, subsampled or check-in).

    Neighbouring relation: replace one user (the unit of privacy), the other users at a common
    value, either of the differing user's two values in each round (chosen adaptively). One
    symmetric PMF per round (:func:`symmetric_pmf`: ``max(H(P || Q), H(Q || P))`` of the
    dominating pair by pessimistic connect-the-dots) serves both adjacency directions; see the
    module docstring for every approximation and its bound.

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
    return PrivacyLossDistribution(symmetric_pmf(pair, discretization, tail / 4.0))


def symmetric_pmf(pair: ShuffleGaussianPair, discretization: float, tail: float) -> pld_pmf.PLDPmf:
    """One PMF whose profile is at least ``max(H(P~ || Q~), H(Q~ || P~))`` at every eps.

    The symmetrised profile (:meth:`ShuffleGaussianPair.delta_symmetric`) is evaluated on the
    grid ``j d`` of ``[-L, L]``, ``L`` the largest ``|log ratio|`` of the pair, and turned into a
    PMF by pessimistic connect-the-dots. The grid stops above where the finite part of delta is
    below ``tail`` (the rest goes to infinity) and starts at the mirror of that point: below its
    first point a connect-the-dots PMF follows the chord from ``(alpha, delta) = (0, 1)``, which
    lies above the convex profile, so starting late is pessimistic too.

    Args:
        pair: The dominating pair of one round.
        discretization: Loss grid step ``d``.
        tail: Budget of finite delta moved to infinity at the top of the grid.

    Returns:
        A ``dp_accounting`` PMF to be used for both adjacency directions.

    Raises:
        ValueError: if the grid would exceed :data:`MAX_GRID_POINTS`.
    """
    span = _relevant_span(pair, tail)
    if span is None:  # everything at infinity
        return pld_pmf.DensePLDPmf(discretization, 0, np.zeros(1), 1.0, True)
    lo, grid = _grid(-span, span, discretization)
    curve = pair.delta_symmetric(grid)
    infinity = max(pair.infinity_remove, pair.infinity_add)
    keep = np.flatnonzero(curve - infinity > tail)
    top = int(keep[-1]) + 1 if keep.size else -lo
    bottom = max(0, -2 * lo - top)  # index of -(lo + top) d, the mirror of the top point
    bottom = min(bottom, max(0, top - 1))
    return _pmf(curve[bottom:], lo + bottom, discretization, tail, infinity)


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
    # One column per parameter; the columns differ in element type.
    out: list[list[Any]] = []
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
