"""How a participant trains locally: the schedule of its mini-batches, a function of the seed.

A client's batch order in round ``t`` comes from ``SeedSequence(seed, spawn_key=(t, client,
tag))``: it depends on the seed, the round and the client, never on who else takes part.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..common.validation import check_int, check_positive
from .partition import ClientPartition

__all__ = ["LocalTraining", "local_batches"]


#: Spawn-key tag of the local mini-batch streams: ``SeedSequence(seed, spawn_key=(t, client,
#: tag))`` never coincides with the check-in stream ``SeedSequence(seed, spawn_key=(t,))``.
_LOCAL_STREAM = 0x6C6F63616C


@dataclass(frozen=True)
class LocalTraining:
    """How a participant trains locally: plain SGD on mini-batches of its own examples.

    A client walks through its examples in epochs, each a fresh uniformly random order cut into
    batches of ``local_batch_size`` (the last batch of an epoch may be smaller); it takes the
    first ``local_steps`` batches of that walk, or all the batches of ``local_epochs`` epochs
    (so clients of different sizes take different numbers of steps). A batch's loss is the mean
    of its examples' losses. ``local_batch_size=None`` (or a size >= the client's) makes every
    batch the whole client, in example order, with nothing drawn; ``local_steps=1`` with it is
    FedSGD.

    Attributes:
        client_lr: Local SGD learning rate (> 0).
        local_steps: Local steps per round (integer >= 1), or ``None`` with ``local_epochs``.
        local_epochs: Local epochs per round (integer >= 1), or ``None`` with ``local_steps``.
        local_batch_size: Examples per local batch (integer >= 1), ``None`` for the whole client.
    """

    client_lr: float
    local_steps: int | None = None
    local_epochs: int | None = None
    local_batch_size: int | None = None

    def __post_init__(self) -> None:
        """Check the fields (one-line ``ValueError`` naming the field)."""
        check_positive("client_lr", self.client_lr)
        if (self.local_steps is None) == (self.local_epochs is None):
            raise ValueError(
                "give exactly one of local_steps and local_epochs (integers >= 1). Found "
                f"local_steps={self.local_steps!r}, local_epochs={self.local_epochs!r}."
            )
        if self.local_steps is not None:
            check_int("local_steps", self.local_steps, minimum=1, maximum=1 << 20)
        if self.local_epochs is not None:
            check_int("local_epochs", self.local_epochs, minimum=1, maximum=1 << 20)
        if self.local_batch_size is not None:
            check_int("local_batch_size", self.local_batch_size, minimum=1)

    def batch_size(self, size: int) -> int:
        """Return the batch size of a client holding ``size`` examples."""
        b = self.local_batch_size
        return size if b is None else min(int(b), size)

    def steps(self, size: int) -> int:
        """Return the number of local steps of a client holding ``size`` examples."""
        if self.local_steps is not None:
            return int(self.local_steps)
        assert self.local_epochs is not None, "__post_init__ sets local_steps or local_epochs"
        per_epoch = -(-size // self.batch_size(size))
        return int(self.local_epochs) * per_epoch


def _client_rng(seed: int, round_index: int, client: int) -> np.random.Generator:
    sequence = np.random.SeedSequence(seed, spawn_key=(round_index, client, _LOCAL_STREAM))
    return np.random.Generator(np.random.PCG64(sequence))


def _local_positions(
    size: int, training: LocalTraining, seed: int, round_index: int, client: int
) -> np.ndarray:
    """Return a ``(steps, batch)`` array of positions in ``0 .. size - 1``, ``-1`` padded."""
    b = training.batch_size(size)
    steps = training.steps(size)
    if b == size:
        return np.broadcast_to(np.arange(size, dtype=np.int64), (steps, size))
    per_epoch = -(-size // b)
    epochs = -(-steps // per_epoch)
    rng = _client_rng(seed, round_index, client)
    walks = rng.permuted(np.tile(np.arange(size, dtype=np.int64), (epochs, 1)), axis=1)
    padded = np.full((epochs, per_epoch * b), -1, dtype=np.int64)
    padded[:, :size] = walks
    return padded.reshape(epochs * per_epoch, b)[:steps]


def local_batches(
    partition: ClientPartition,
    client: int,
    training: LocalTraining,
    *,
    seed: int,
    round_index: int,
) -> list[np.ndarray]:
    """Return the example indices of each local step of ``client`` in round ``round_index``.

    The walk of :class:`LocalTraining`; the order is drawn from numpy's PCG64 seeded with
    ``SeedSequence(seed, spawn_key=(round_index, client, tag))``, so it depends on the seed,
    the round and the client only (not on who else takes part), and differs from the check-in
    stream of the sampler.

    Args:
        partition: The clients.
        client: The client (in ``[0, num_clients)``).
        training: The local training.
        seed: The trainer's seed (integer >= 0).
        round_index: The round (integer >= 0).

    Returns:
        One array of dataset indices per local step.

    Raises:
        ValueError: on an out-of-range argument.
    """
    examples = partition.client(client)
    seed = check_int("seed", seed, minimum=0)
    t = check_int("round_index", round_index, minimum=0)
    positions = _local_positions(examples.size, training, seed, t, int(client))
    return [examples[row[row >= 0]] for row in positions]
