"""The lattice engine: the law of S on a uniform lattice, by binary powering with Chernoff cuts.

See :mod:`shuffle_opacus.analysis.pld.shuffle_gaussian` and docs/maths.md.
"""

from __future__ import annotations

import math

import numpy as np

from ...memory import PldRangeError, check_memory
from .chernoff import _Chernoff
from .pair import (
    MAX_LATTICE_POINTS,
    ShuffleGaussianPair,
    _cells,
    _frozen_pair,
    _lattice_step,
    _report_cut,
    _survival,
)

#: Peak bytes per point of the sum's lattice: the FFT convolutions of the powering (complex
#: spectra, the product and its copy) and the pair's arrays (ratios, masses, their prefix and
#: suffix sums). Measured 139 at 1.0e7 points (shuffle n = 1e9, sigma 5: 1.39 GB) and 130 at
#: 8.4e6 (check-in n = 60000, rate 0.05, sigma 0.5, quick.yaml: 1.09 GB); rounded up.
LATTICE_BYTES_PER_POINT = 176


def _lattice_points(a: float, gamma: float, terms: int, x_max: float, step: float) -> float:
    """Points of the largest lattice: the sum's window, which includes one report's range.

    With heavy tails (small sigma) the largest array is the one-big-term part (the window of
    the other reports convolved with the big values), about as wide as this.
    """
    w_max = math.exp(a * x_max - a * a / 2.0)
    variance_w = math.expm1(a * a)
    width = min(terms * (w_max + 1.0), w_max + 1.0 + 20.0 * math.sqrt(terms * gamma * variance_w))
    return width / step


def lattice_points(
    *, n: int, terms: int, rate: float, sigma: float, tail: float, spread: float = 1e-3
) -> float:
    """Estimated points of the largest lattice one round's pair builds (for the work limits).

    Args:
        n: Population (integer >= 1).
        terms: Reports ``N`` in ``S`` (``n``, or ``m`` for the subsampled shuffle).
        rate: Check-in rate ``gamma`` (1 without check-in).
        sigma: The paper's sigma (> 0).
        tail: Mass per round left out.
        spread: Variance the lattice may add to ``S``, relative to ``Var(S)``.

    Returns:
        The estimate, ``inf`` where the lattice engine cannot hold the setting.
    """
    a = 1.0 / sigma
    if a * a > 700.0:
        return math.inf
    x_max = _report_cut(a, rate, terms, n, tail)[0]
    step = _lattice_step(a, rate, terms, x_max, spread)[0]
    if step is None:
        return math.inf
    return _lattice_points(a, rate, terms, x_max, step)


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
    # Imported here: the work limits' estimate (lattice_points) loads this module on its own.
    from .convolve import convolve_full

    # FFT noise is left signed here (it averages out) and set to zero once, at the end.
    return a[0] + b[0], convolve_full(a[1], b[1])


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
    check_memory(
        LATTICE_BYTES_PER_POINT * _lattice_points(a, gamma, terms, x_max, step),
        f"the lattice of one round ({terms} reports at rate {gamma:g}, sigma {sigma:g})",
        "the reports per round (n, m or rate)",
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
