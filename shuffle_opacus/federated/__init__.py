"""User-level shuffle-model DP: clients with many examples train locally, vectorised over clients.

Here a client is a **user holding many examples** (one example in
:func:`shuffle_opacus.make_private`). Each round the protocol's sampler picks clients of a
:class:`~shuffle_opacus.federated.partition.ClientPartition`; every participant trains locally from
the global weights with plain SGD (:class:`LocalTraining`, :func:`local_batches`), clips its whole
update as one vector to ``C = max_update_norm`` and adds its own ``N(0, sigma^2 C^2 I)``; the
server writes the averaged sum into ``.grad`` and the user's optimizer steps (SGD at learning
rate 1 is FedAvg, Adam is FedAdam). :func:`make_private_clients` builds the
:class:`FederatedTrainer`, which returns a :class:`RoundResult` per round and trains a round's
participants together in one :func:`torch.func.vmap`. Privacy: replace-one of **all** the
examples of one client, over the ``n`` clients; two clipped updates are at most ``2C`` apart,
so the default analysis sigma is ``noise_multiplier / 2``. It assumes a trusted shuffler (or
secure aggregation) and check-in coins independent of the data.

A round step by step, the guarantee and the vectorisation: docs/opacus.md, "User-level DP:
clients with many examples".
"""

from __future__ import annotations

from .local import LocalTraining, local_batches
from .partition import ClientPartition, dirichlet_partition, iid_partition, shard_partition
from .setup import make_private_clients
from .trainer import AVERAGES, DEFAULT_CLIENT_CHUNK, FederatedTrainer, RoundResult

__all__ = [
    "AVERAGES",
    "DEFAULT_CLIENT_CHUNK",
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
