"""User-level shuffle-model DP: clients with many examples train locally (the public names).

The partitions live in :mod:`shuffle_opacus.partition`, the training in
:mod:`shuffle_opacus.federated` (its docstring states the round, the privacy statement and the
units); this module gathers the names users import.
"""

from __future__ import annotations

from .federated import (
    AVERAGES,
    FederatedTrainer,
    LocalTraining,
    RoundResult,
    local_batches,
    make_private_clients,
)
from .partition import ClientPartition, dirichlet_partition, iid_partition, shard_partition

__all__ = [
    "AVERAGES",
    "ClientPartition",
    "FederatedTrainer",
    "LocalTraining",
    "RoundResult",
    "dirichlet_partition",
    "iid_partition",
    "local_batches",
    "make_private_clients",
    "shard_partition",
]
