"""The privacy loss distribution of the shuffle Gaussian mechanism (method ``pld``), at any ``n``.

Liew & Takahashi, *Shuffle Gaussian Mechanism for Differential Privacy* (arXiv:2206.09569),
analyse Theorem 1's neighbouring pair with Rényi DP; this package gives the tight ``(eps,
delta)`` curve of the same pair as a ``dp_accounting`` ``PrivacyLossDistribution`` that composes
over rounds. One round's pair is reduced to the law of one statistic ``S``, moved onto a lattice
(:mod:`.lattice`) or, for few reports, a geometric grid (:mod:`.geometric`) by mean-preserving
spreads, so the discrete pair dominates the mechanism in both orientations (:mod:`.pair`); its
symmetrised profile becomes a PMF by pessimistic connect-the-dots (:mod:`.pmf`), and schedules
of rounds compose (:mod:`.queries`). Every left-out mass is added to delta. The derivation, the
bounds and the evidence are in docs/maths.md ("The privacy loss distribution of the shuffle
Gaussian"). Results are upper bounds in exact arithmetic; floating-point rounding is not
bounded (measured at a few 1e-11 per round).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ....common.lazy import lazy_exports

if TYPE_CHECKING:  # the names below, for type checkers; at run time they load on first use
    from ...memory import PldRangeError
    from .pair import (
        GEOMETRIC_FALLBACK_TERMS,
        GEOMETRIC_MAX_TERMS,
        MAX_GRID_POINTS,
        MAX_LATTICE_POINTS,
        ShuffleGaussianPair,
        pld_discretization,
        pld_tail,
    )
    from .pmf import shuffle_gaussian_pair, shuffle_gaussian_pld, symmetric_pmf
    from .queries import shuffle_gaussian_delta, shuffle_gaussian_epsilon

# The grid and tail choices (.pair) load without dp_accounting or scipy's statistics, so that a
# query answered from the on-disk cache (.rounds) never imports them.
_LAZY: dict[str, str] = {
    "PldRangeError": "...limits",
    "GEOMETRIC_FALLBACK_TERMS": ".pair",
    "GEOMETRIC_MAX_TERMS": ".pair",
    "MAX_GRID_POINTS": ".pair",
    "MAX_LATTICE_POINTS": ".pair",
    "ShuffleGaussianPair": ".pair",
    "pld_discretization": ".pair",
    "pld_tail": ".pair",
    "shuffle_gaussian_pair": ".pmf",
    "shuffle_gaussian_pld": ".pmf",
    "symmetric_pmf": ".pmf",
    "shuffle_gaussian_delta": ".queries",
    "shuffle_gaussian_epsilon": ".queries",
}

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

# PEP 562: each public name is imported from its module on first use.
__getattr__, __dir__ = lazy_exports(__name__, _LAZY, globals())
