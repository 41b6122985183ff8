"""The secure-aggregation mode on Flower's SecAgg+: parameters, node, client mod and strategy.

:mod:`.parameters` derives SecAgg+'s set-up from C, σ, n, D and the model size (its names are
also here, where they were before the folder); :mod:`.node` and :mod:`.mod` are a node's side,
:mod:`.strategy`, :mod:`.workflow` and :mod:`.decode` the server's.
"""

from __future__ import annotations

from .parameters import (
    CLIPPING_TAIL,
    HONEST_SUM_TAIL,
    MAX_NODES,
    MIN_SHARES,
    MODULUS,
    SecAggParameters,
    round_onto_grid,
    secagg_parameters,
)

__all__ = [
    "CLIPPING_TAIL",
    "HONEST_SUM_TAIL",
    "MAX_NODES",
    "MIN_SHARES",
    "MODULUS",
    "SecAggParameters",
    "round_onto_grid",
    "secagg_parameters",
]
