"""Theorem 1's pair in one dimension: the record of a discretised round and its shared pieces.

See :mod:`shuffle_opacus.analysis.pld.shuffle_gaussian` and docs/maths.md.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np
from scipy.special import ndtr, ndtri

from ....common.validation import (
    check_delta,
    check_int,
    check_probability,
    check_sigma,
)
from ...memory import PldRangeError

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


def _frozen_pair(**fields: object) -> ShuffleGaussianPair:
    for name in ("ratios", "masses"):
        fields[name] = np.ascontiguousarray(fields[name], dtype=float)
        fields[name].setflags(write=False)  # type: ignore[attr-defined]
    for name in ("infinity_remove", "infinity_add"):
        fields[name] = min(1.0, float(fields[name]))  # type: ignore[arg-type]
    return ShuffleGaussianPair(**fields)  # type: ignore[arg-type]


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


#: Finest default loss grid step (see :func:`pld_discretization`).
_FINEST_GRID = 2.0**-40


def pld_discretization(
    *, n: int, sigma: float, rate: float | None = None, m: int | None = None
) -> float:
    """Default loss grid step: about 1/64 of one round's privacy-loss standard deviation.

    A power of two between ``2^-40`` and ``2^-10``, computed from the variance of ``S``
    (``N gamma (e^{1/sigma^2} - 1)``), so that rounds with nearby settings share a grid. The
    step follows the loss scale, not ``n``: the grids of one round and of their composition then
    hold about as many points at ``n = 10^9`` as at ``10^5`` (docs/maths.md, "Cost at large
    n"). The floor ``2^-40`` (about ``1e-12``) stays far above the rounding of a loss
    ``log(1 + s/n)`` in double precision (about ``1e-16``); it was ``2^-27`` (``7e-9``), which
    at check-in with ``n = 10^9``, rate ``10^-4`` and sigma 5 left a round's loss standard
    deviation 8.6 grid steps wide instead of 64.

    Returns:
        The grid step ``d`` of the loss.

    Raises:
        ValueError: on an out-of-range argument.
    """
    n, sigma, gamma, terms = _check_setting(n, sigma, rate, m)
    sd = math.sqrt(terms * gamma * math.expm1(1.0 / sigma**2)) / n
    sd = min(sd, 1.0)  # n = 1: the loss of one Gaussian report has sd 1/sigma
    exponent = math.floor(math.log2(max(sd / _GRID_PER_SD, _FINEST_GRID)))
    return 2.0 ** min(exponent, -10)


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
