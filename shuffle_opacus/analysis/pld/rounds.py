"""Epsilon of a history of shuffle-Gaussian rounds by their privacy loss distributions.

The ``pld`` method of the shuffle, subsampled and check-in mechanisms. Each distinct round
setting gets two kinds of per-round PMF, built once and kept:

* the **pessimistic** one: the symmetrised dominating pair of
  :mod:`~shuffle_opacus.analysis.pld.shuffle_gaussian` by connect-the-dots, with every left-out
  mass at infinity. Composed, it gives the reported epsilon, an upper bound for replace-one
  adjacency with adaptive orientations (up to floating-point rounding);
* two **optimistic** ones, each orientation of the same lattice pair alone (``P~ || Q~`` and
  ``Q~ || P~``) with every loss rounded *down* to the grid and the left-out masses dropped
  (``dp_accounting``'s optimistic estimate), on a grid up to 32 times finer, so that the
  rounding costs about half a percent of epsilon or less. A fixed orientation is one adversary the
  replace-one guarantee must cover, so the larger of the two composed epsilons estimates the
  pair's epsilon from below: the pair's exact epsilon lies in ``[lower, upper]``.

Compositions go through :mod:`~shuffle_opacus.analysis.pld.powers` (spectra kept across round
counts), so asking again after one more round costs one inverse FFT.

The per-round PMFs are also kept on disk (:mod:`~shuffle_opacus.analysis.pld.disk_cache`), and
so is the optimistic estimate's epsilon of a composition (its compositions run on grids up to 32
times finer and take most of a query): a query asked again in a new process reads them back bit
for bit instead of building them. Nothing is read back unless its whole key matches: the
setting, the grid, the tail, :data:`CACHE_VERSION`, the package's and libraries' versions and
the source of the construction.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from ..limits import MemoryLimitError, memory_budget
from . import disk_cache
from .powers import DEFAULT_TRUNCATION, PmfPowers, cached_powers, compose_arrays, epsilon_for_delta
from .shuffle_gaussian.pair import pld_discretization, pld_tail

__all__ = ["ShuffleRound", "PldEstimate", "shuffle_rounds_epsilon", "LOWER_SHIFT", "LOWER_REFINE"]

LOWER_SHIFT = 2e-3
"""Target of the optimistic estimate's grid: rounds times its step at most this share of epsilon."""

LOWER_REFINE = 32
"""The optimistic estimate's grid is at most this many times finer than the reported one."""

CACHE_VERSION = 1
"""Code version of the cached per-round PMFs and optimistic epsilons: bump it whenever their
construction changes (the digest of :data:`CACHE_SOURCES` changes with any edit anyway)."""

CACHE_SOURCES = (
    "analysis/pld/rounds.py",
    "analysis/pld/powers.py",
    "analysis/pld/common.py",
    "analysis/pld/disk_cache.py",
    "analysis/pld/shuffle_gaussian",
)
"""The source files that build a cached entry (relative to the package); their digest keys it."""


@dataclass(frozen=True)
class ShuffleRound:
    """One round's setting: ``n`` users, the paper's ``sigma``, check-in ``rate`` or ``m``."""

    n: int
    sigma: float
    rate: float | None = None
    m: int | None = None


@dataclass(frozen=True)
class PldEstimate:
    """Epsilon of composed rounds, with how it was computed.

    Attributes:
        epsilon: The pessimistic estimate (an upper bound on the pair's epsilon).
        epsilon_lower: The optimistic estimate of the same pair (see the module docstring), or
            ``None`` when it was not asked for (or did not fit in the memory limit, even on the
            pessimistic estimate's grid).
        discretization: The loss grid step shared by the rounds.
        tail: The mass each round leaves out (added to delta in the pessimistic estimate).
        details: What else the method reports (the ``proven`` method: its route, level and how
            delta was spent), or ``None``.
    """

    epsilon: float
    epsilon_lower: float | None
    discretization: float
    tail: float
    details: Mapping[str, object] | None = None


def _key(
    setting: ShuffleRound, discretization: float, tail: float
) -> dict[str, disk_cache.KeyValue]:
    return {
        "n": setting.n,
        "sigma": setting.sigma,
        "rate": setting.rate,
        "m": setting.m,
        "discretization": discretization,
        "tail": tail,
        # A pair over the memory limit is refused, not built: an entry serves only the same limit.
        "memory": memory_budget(),
    }


def _build_upper(setting: ShuffleRound, discretization: float, tail: float) -> list[PmfPowers]:
    from .shuffle_gaussian.pmf import shuffle_gaussian_pair, symmetric_masses

    pair = shuffle_gaussian_pair(
        n=setting.n, sigma=setting.sigma, rate=setting.rate, m=setting.m, tail=tail
    )
    # symmetric_pmf's masses, without importing dp_accounting.
    lower, probs, infinity = symmetric_masses(pair, discretization, tail / 4.0)
    return [
        PmfPowers.from_arrays(
            discretization=discretization,
            lower=lower,
            probs=probs,
            infinity=infinity,
            pessimistic=True,
        )
    ]


@functools.lru_cache(maxsize=16)
def _upper(setting: ShuffleRound, discretization: float, tail: float) -> PmfPowers:
    (upper,) = cached_powers(
        "shuffle-upper",
        CACHE_VERSION,
        _key(setting, discretization, tail),
        lambda: _build_upper(setting, discretization, tail),
        sources=CACHE_SOURCES,
    )
    return upper


def _rounded_down(
    losses: np.ndarray, masses: np.ndarray, discretization: float, infinity: float
) -> PmfPowers:
    keep = masses > 0
    losses, masses = losses[keep], masses[keep]
    infinity = min(infinity, 1.0)
    if losses.size == 0:
        return PmfPowers.from_arrays(
            discretization=discretization,
            lower=0,
            probs=np.zeros(1),
            infinity=infinity,
            pessimistic=False,
        )
    index = np.floor(losses / discretization).astype(np.int64)
    low = int(index.min())
    probs = np.bincount(index - low, weights=masses)
    return PmfPowers.from_arrays(
        discretization=discretization, lower=low, probs=probs, infinity=infinity, pessimistic=False
    )


def _build_lower(setting: ShuffleRound, discretization: float, tail: float) -> list[PmfPowers]:
    from .shuffle_gaussian.pmf import shuffle_gaussian_pair

    pair = shuffle_gaussian_pair(
        n=setting.n, sigma=setting.sigma, rate=setting.rate, m=setting.m, tail=tail
    )
    ratios, masses = pair.ratios, pair.masses
    positive = ratios > 0
    log_ratio = np.log(ratios[positive])
    remove = _rounded_down(log_ratio, ratios[positive] * masses[positive], discretization, 0.0)
    # Q~ mass where P~ has none is a genuine infinite loss of the add direction, not a cut.
    add = _rounded_down(
        -log_ratio, masses[positive], discretization, float(masses[~positive].sum())
    )
    return [remove, add]


@functools.lru_cache(maxsize=8)
def _lower(setting: ShuffleRound, discretization: float, tail: float) -> tuple[PmfPowers, ...]:
    return cached_powers(
        "shuffle-lower",
        CACHE_VERSION,
        _key(setting, discretization, tail),
        lambda: _build_lower(setting, discretization, tail),
        sources=CACHE_SOURCES,
    )


def _compose_lower(
    merged: Mapping[ShuffleRound, int], fine: float, coarsest: float, tail: float, delta: float
) -> float | None:
    """Return the optimistic epsilon on grid ``fine``, coarsened while over the memory limit.

    A coarser grid rounds each loss further down, so the estimate stays below the pair's
    epsilon, only looser. ``None`` when even the grid of the pessimistic estimate does not fit.
    """
    while True:
        try:
            sides = [_lower(s, fine, tail) for s in merged]
            low = 0.0
            for side in range(2):
                pmf = compose_arrays(
                    [(pair[side], k) for pair, k in zip(sides, merged.values(), strict=True)]
                )
                low = max(low, epsilon_for_delta(pmf, delta))
            return low
        except MemoryLimitError:
            if fine >= coarsest:
                return None
            fine *= 2.0


def _lower_epsilon(
    merged: Mapping[ShuffleRound, int], fine: float, coarsest: float, tail: float, delta: float
) -> float | None:
    """:func:`_compose_lower`, kept on disk: its compositions take most of a query's time."""
    key: dict[str, disk_cache.KeyValue] = {
        "rounds": [[s.n, s.sigma, s.rate, s.m, k] for s, k in merged.items()],
        "fine": fine,
        "coarsest": coarsest,
        "tail": tail,
        "delta": delta,
        "truncation": DEFAULT_TRUNCATION,
        "memory": memory_budget(),
    }
    found = disk_cache.load("shuffle-lower-epsilon", CACHE_VERSION, key, sources=CACHE_SOURCES)
    if found is not None and "epsilon" in found.scalars:
        value = found.scalars["epsilon"]
        if value is None or isinstance(value, float):
            return value
    low = _compose_lower(merged, fine, coarsest, tail, delta)
    disk_cache.store(
        "shuffle-lower-epsilon", CACHE_VERSION, key, {}, {"epsilon": low}, sources=CACHE_SOURCES
    )
    return low


def shuffle_rounds_epsilon(
    rounds: Sequence[tuple[ShuffleRound, int]], *, delta: float, lower: bool = False
) -> PldEstimate:
    """Epsilon at ``delta`` of adaptively composed shuffle-Gaussian rounds (``pld`` method).

    Neighbouring relation: replace one user, the other users at a common value (Theorem 1's
    pair), either orientation in each round. The rounds share the finest default grid step of
    their settings (:func:`~.shuffle_gaussian.pld_discretization`); each leaves out
    :func:`~.shuffle_gaussian.pld_tail` of ``delta`` and the total number of rounds.

    Args:
        rounds: ``(setting, count)`` pairs with counts >= 1 (validated settings).
        delta: Target delta in ``(0, 1)``.
        lower: Also compute the optimistic estimate (three compositions instead of one); its
            grid is coarsened (a looser estimate from below) while its composition would
            exceed the memory limit (:func:`~shuffle_opacus.analysis.limits.memory_limit`).

    Returns:
        A :class:`PldEstimate`.

    Raises:
        ValueError: on an empty ``rounds``, or a setting the pair's engines cannot evaluate
            (see :func:`~.shuffle_gaussian.shuffle_gaussian_pair`), including a
            :class:`~shuffle_opacus.analysis.limits.MemoryLimitError` when the pair or the
            pessimistic composition would exceed the memory limit.
    """
    merged: dict[ShuffleRound, int] = {}  # rounds with one setting compose as one block
    for setting, count in rounds:
        merged[setting] = merged.get(setting, 0) + int(count)
    if not merged:
        raise ValueError("rounds must hold at least one (setting, count) pair. Found none.")
    discretization = min(
        pld_discretization(n=s.n, sigma=s.sigma, rate=s.rate, m=s.m) for s in merged
    )
    tail = pld_tail(delta, sum(merged.values()))
    upper = compose_arrays([(_upper(s, discretization, tail), k) for s, k in merged.items()])
    epsilon = epsilon_for_delta(upper, delta)
    low: float | None = None
    if lower:
        # Rounding down shifts each round's loss by up to a grid step: a finer grid keeps the
        # composed shift (about rounds * step / 2) near LOWER_SHIFT of epsilon.
        fine = discretization
        if math.isfinite(epsilon) and epsilon > 0:
            wanted = LOWER_SHIFT * epsilon / sum(merged.values())
            while fine > wanted and fine > discretization / LOWER_REFINE:
                fine /= 2.0
        low = _lower_epsilon(merged, fine, discretization, tail, delta)
    return PldEstimate(epsilon=epsilon, epsilon_lower=low, discretization=discretization, tail=tail)
