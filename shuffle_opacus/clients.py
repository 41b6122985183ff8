"""User-level shuffle-model DP: clients with many examples train locally, vectorised over clients.

In the example-level layer (:func:`shuffle_opacus.make_private`) one dataset example is one
client. Here a client is a **user holding many examples**, and the unit of privacy is the user.
A round of the protocol:

1. the protocol's sampler picks the round's clients among the ``n`` clients of a
   :class:`ClientPartition` (check-in with probability ``rate``, ``m`` of ``n``, or all ``n``;
   the samplers of :mod:`shuffle_opacus.sampling`, round ``t`` a function of ``(seed, t)``);
2. every participant starts from the current global weights ``w`` and trains locally on its own
   examples with plain SGD (``local_steps`` or ``local_epochs`` mini-batches of
   ``local_batch_size``, learning rate ``client_lr``), reaching ``w_i``;
3. its report is the update ``u_i = w - w_i`` (the negated model change, a pseudo-gradient),
   clipped as **one vector over all trainable parameters** to norm ``C = max_update_norm`` with
   Opacus's factor ``min(1, C / (||u_i|| + 1e-6))``, plus its own ``N(0, sigma^2 C^2 I)``
   (``sigma = noise_multiplier``); a non-finite update is replaced by zero, which lies in the
   clipping ball;
4. the shuffler forwards the reports anonymously; the server sums them, divides by the expected
   number of reports (``average="expected"``, as the example-level path does) or by the actual
   number (``average="reports"``, FedAvg's mean; the count is public in the shuffle model), and
   writes the result into ``.grad`` of the global parameters. The user's own optimizer then
   steps: SGD with learning rate 1 is FedAvg (McMahan, Moore, Ramage, Hampson & Agüera y Arcas,
   *Communication-Efficient Learning of Deep Networks from Decentralized Data*,
   arXiv:1602.05629), Adam gives FedAdam (Reddi et al., *Adaptive Federated Optimization*,
   arXiv:2003.00295).

FedSGD is ``local_steps=1, local_batch_size=None`` (one step on the whole client); with one
example per client, ``client_lr=1`` and ``max_update_norm = max_grad_norm`` a round is the
example-level round of :func:`shuffle_opacus.make_private` (same sampler seed, same noise
generator: same weights; tested).

Privacy statement. Neighbouring datasets differ in **all the examples of one client**
(replace-one at the level of clients); the population ``n`` of the accountant is the number of
clients. Any two datasets of a client give clipped updates at most ``2C`` apart, so under the
default ``sensitivity="replace-one"`` the analysis sigma is ``noise_multiplier / 2``
(:func:`shuffle_opacus.analysis_sigma`); ``"paper"`` assumes ``C``. The accountant of the
engine (``shuffle``, ``subsampled_shuffle`` or ``shuffled_checkin``) records one round for every
round the sampler released, empty ones included, at the moment its aggregate is written. The
guarantee covers everything computed from the aggregates (the weights, the optimizer's state).
It assumes a trusted shuffler (or secure aggregation) and check-in coins independent of the
data; :attr:`RoundResult.local_loss` is a statistic of the clients' data that the protocol does
not release, for monitoring simulations only.

Speed. All participants of a round (in chunks of ``client_chunk``) train together: the local
SGD step is one :func:`torch.func.vmap` over clients of :func:`torch.func.grad` of
:func:`torch.func.functional_call`, on mini-batches padded to a common size and masked by
per-example weights (``1 / batch size`` for real examples, ``0`` for padding), so clients of
unequal sizes and step counts share one kernel call. Only the drawing of each client's
mini-batch order loops over clients (it needs a generator per client, see
:func:`local_batches`); clients whose batches hold all their examples draw nothing.
"""

from __future__ import annotations

import copy
import math
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from opacus import PrivacyEngine
from opacus.grad_sample import AbstractGradSampleModule
from torch import Tensor, nn
from torch.func import functional_call, grad, vmap
from torch.utils.data import Dataset, TensorDataset, default_collate

from .accountants import ShuffleAccountantBase
from .analysis._validation import check_int, check_positive
from .clipping import clip_factors
from .noise import NOISE_MODES, local_noise_sum
from .plan_checks import check_release_plan
from .privacy import (
    PrivacyOptions,
    _check_noise_generator,
    _shuffle_accountant,
    bind_get_epsilon,
    new_sampler,
)
from .protocols import resolve_sensitivity
from .sampling import FixedSizeShuffledSampler, ShuffleRoundSampler

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

#: Denominators of the server's average: the expected number of reports per round (``n * rate``,
#: ``m`` or ``n``; as the example-level path with a mean loss) or the round's actual number.
AVERAGES: tuple[str, ...] = ("expected", "reports")

#: Spawn-key tag of the local mini-batch streams: ``SeedSequence(seed, spawn_key=(t, client,
#: tag))`` never coincides with the check-in stream ``SeedSequence(seed, spawn_key=(t,))``.
_LOCAL_STREAM = 0x6C6F63616C

#: Default number of clients trained together in one vectorised call.
DEFAULT_CLIENT_CHUNK = 128


def _int_array(name: str, values: Any) -> np.ndarray:
    """Return ``values`` (array, tensor or nested sequence of integers) as an ``int64`` array.

    The result may share memory with ``values``; callers that keep it copy it.

    Args:
        name: What the values are, for the message.
        values: The integers.

    Returns:
        The ``int64`` array (an empty float array counts as an empty integer one).

    Raises:
        ValueError: if the values are not integers (bools included) or do not fit ``int64``.
    """
    if isinstance(values, Tensor):
        values = values.detach().cpu().numpy()
    try:
        array = np.asarray(values)
    except (TypeError, ValueError):
        raise ValueError(
            f"{name} must be an array of integers. Found a {type(values).__name__} that numpy "
            "cannot read as one (ragged or mixed entries)."
        ) from None
    if array.dtype == bool or not (
        np.issubdtype(array.dtype, np.integer) or (array.size == 0 and array.dtype == float)
    ):
        raise ValueError(f"{name} must hold integers. Found dtype {array.dtype}.")
    if array.size and not np.can_cast(array.dtype, np.int64) and int(array.max()) > _INT64_MAX:
        raise ValueError(
            f"{name} must hold integers in [0, {_INT64_MAX}] (int64). Found {int(array.max())}."
        )
    return array.astype(np.int64, copy=False)


_INT64_MAX = int(np.iinfo(np.int64).max)


def _private(array: np.ndarray) -> np.ndarray:
    """Return a read-only ``int64`` copy of ``array`` that nobody else holds."""
    copy = np.array(array, dtype=np.int64, copy=True)
    copy.setflags(write=False)
    return copy


@dataclass(frozen=True, eq=False)
class ClientPartition:
    """A partition of the examples ``0 .. num_examples - 1`` into non-empty clients.

    Every example belongs to exactly one client and every client holds at least one example;
    every constructor checks it (the direct one ``ClientPartition(order, offsets)`` included)
    and refuses anything else with one line. Client ``c`` holds
    ``order[offsets[c]:offsets[c + 1]]``; the factories store each block in increasing example
    order, the direct constructor keeps the order it is given.

    The partition keeps read-only ``int64`` copies of the arrays it is given, so changing those
    arrays afterwards does not change it; copies and pickles are checked again when rebuilt.

    Attributes:
        order: Example indices grouped by client (``int64``, a permutation of
            ``0 .. num_examples - 1``; read-only).
        offsets: Start of each client's block in ``order``; ``num_clients + 1`` strictly
            increasing entries from ``0`` to ``num_examples`` (``int64``; read-only).
    """

    order: np.ndarray
    offsets: np.ndarray

    def __post_init__(self) -> None:
        """Check ``order`` and ``offsets`` and replace them by read-only private copies.

        Raises:
            ValueError: one line naming the field, if ``order`` is not a one-dimensional
                permutation of ``0 .. N - 1`` (``N >= 1``), or ``offsets`` is not a
                one-dimensional integer array starting at 0, strictly increasing (no empty
                client) and ending at ``N``. Nothing is stored then.
        """
        order = _int_array("order", self.order)
        if order.ndim != 1 or order.size == 0:
            raise ValueError(
                "order must be a non-empty one-dimensional array of example indices (a "
                f"permutation of 0 .. N - 1). Found shape {order.shape}."
            )
        offsets = _int_array("offsets", self.offsets)
        if offsets.ndim != 1 or offsets.size < 2:
            raise ValueError(
                "offsets must be a one-dimensional array of num_clients + 1 >= 2 integers. "
                f"Found shape {offsets.shape}."
            )
        order, offsets = _private(order), _private(offsets)
        _check_permutation(order)
        _check_offsets(offsets, order.size)
        object.__setattr__(self, "order", order)
        object.__setattr__(self, "offsets", offsets)

    def __reduce__(self) -> tuple[type[ClientPartition], tuple[np.ndarray, np.ndarray]]:
        """Rebuild copies and pickles through the constructor, which checks them again."""
        return (type(self), (self.order, self.offsets))

    @classmethod
    def from_client_ids(cls, client_ids: Any, num_clients: int | None = None) -> ClientPartition:
        """Build a partition from the client id of every example.

        Args:
            client_ids: One integer per example (array, tensor or list), in ``[0, num_clients)``.
            num_clients: Number of clients, in ``[1, len(client_ids)]`` (every client holds an
                example); ``max(client_ids) + 1`` by default.

        Returns:
            The partition.

        Raises:
            ValueError: if an id is not an integer in range, ``num_clients`` exceeds the number
                of examples, or a client holds no example.
        """
        ids = _int_array("client_ids", client_ids)
        if ids.ndim != 1 or ids.size == 0:
            raise ValueError(
                f"client_ids must be a non-empty one-dimensional sequence (one id per example). "
                f"Found shape {ids.shape}."
            )
        low, high = int(ids.min()), int(ids.max())
        if num_clients is None:
            if high >= ids.size:  # more clients than examples: some would be empty
                raise ValueError(
                    f"client_ids must number the clients 0 .. k - 1 with every client holding an "
                    f"example, so ids are at most {ids.size - 1} for {ids.size} examples. "
                    f"Found {high}."
                )
            k = high + 1
        else:
            k = check_int("num_clients", num_clients, minimum=1)
            if k > ids.size:
                raise ValueError(
                    f"num_clients must be an integer in [1, {ids.size}] (every client holds at "
                    f"least one of the {ids.size} examples). Found {num_clients!r}."
                )
        if low < 0 or high >= k:
            bad = low if low < 0 else high
            raise ValueError(f"client_ids must be integers in [0, {k - 1}]. Found {bad}.")
        counts = np.bincount(ids, minlength=k)
        _check_nonempty(counts)
        order = np.argsort(ids, kind="stable").astype(np.int64)
        offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        return cls(order, offsets)

    @classmethod
    def from_indices(
        cls, clients: Sequence[Sequence[int]], num_examples: int | None = None
    ) -> ClientPartition:
        """Build a partition from each client's list of example indices.

        Args:
            clients: One sequence of example indices per client.
            num_examples: Size of the dataset; the total number of indices by default. The
                lists must cover ``0 .. num_examples - 1`` exactly once.

        Returns:
            The partition.

        Raises:
            ValueError: if a client is empty, an index is out of range, or the lists miss or
                repeat an example.
        """
        if isinstance(clients, (np.ndarray, Tensor)) or not isinstance(clients, Sequence):
            raise ValueError(
                "clients must be a list of index lists (one per client); for one client id per "
                "example use ClientPartition.from_client_ids."
            )
        if len(clients) == 0:
            raise ValueError("clients must hold at least one client. Found an empty list.")
        blocks = []
        for c, indices in enumerate(clients):
            block = _int_array(f"client {c}'s indices", indices).reshape(-1)
            blocks.append(block)
        counts = np.array([b.size for b in blocks], dtype=np.int64)
        _check_nonempty(counts)
        flat = np.concatenate(blocks)
        total = flat.size if num_examples is None else num_examples
        total = check_int("num_examples", total, minimum=1)
        if int(flat.min()) < 0 or int(flat.max()) >= total:
            bad = int(flat.min()) if int(flat.min()) < 0 else int(flat.max())
            raise ValueError(f"example indices must be in [0, {total - 1}]. Found {bad}.")
        if total > flat.size:  # fewer indices than examples; count without a size-total array
            distinct = np.unique(flat)
            gaps = np.flatnonzero(distinct != np.arange(distinct.size))
            first = int(gaps[0]) if gaps.size else int(distinct.size)
            raise ValueError(
                f"the partition misses {total - distinct.size} of the {total} examples (example "
                f"{first} first). Every example must belong to exactly one client."
            )
        seen = np.bincount(flat, minlength=total)
        if (seen > 1).any():
            example = int(np.flatnonzero(seen > 1)[0])
            owners = [c for c, b in enumerate(blocks) if (b == example).any()][:2]
            where = f"clients {owners[0]} and {owners[1]}" if len(owners) > 1 else "one client"
            raise ValueError(
                f"the partition repeats {int((seen > 1).sum())} example(s); example {example} "
                f"is in {where}. Every example must belong to exactly one client."
            )
        if (seen == 0).any():
            missing = np.flatnonzero(seen == 0)
            raise ValueError(
                f"the partition misses {missing.size} of the {total} examples (example "
                f"{int(missing[0])} first). Every example must belong to exactly one client."
            )
        order = np.concatenate([np.sort(b) for b in blocks]).astype(np.int64)
        offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        return cls(order, offsets)

    @property
    def num_clients(self) -> int:
        """Number of clients ``n`` (the accountant's population)."""
        return int(self.offsets.size - 1)

    @property
    def num_examples(self) -> int:
        """Number of examples covered."""
        return int(self.order.size)

    @property
    def sizes(self) -> np.ndarray:
        """Examples per client."""
        return np.diff(self.offsets)

    def client(self, c: int) -> np.ndarray:
        """Return the example indices of client ``c``.

        Args:
            c: The client, in ``[0, num_clients)``.

        Returns:
            A new (writable) ``int64`` array; changing it does not change the partition.

        Raises:
            ValueError: if ``c`` is not a client.
        """
        c = check_int("client", c, minimum=0, maximum=self.num_clients - 1)
        return self.order[self.offsets[c] : self.offsets[c + 1]].copy()

    def __len__(self) -> int:
        """Return the number of clients."""
        return self.num_clients

    def __repr__(self) -> str:
        """Summary representation."""
        sizes = self.sizes
        return (
            f"ClientPartition(num_clients={self.num_clients}, num_examples={self.num_examples}, "
            f"sizes {int(sizes.min())}..{int(sizes.max())})"
        )


def _check_permutation(order: np.ndarray) -> None:
    """Refuse an ``order`` that is not a permutation of ``0 .. order.size - 1`` (one line)."""
    n = order.size
    low, high = int(order.min()), int(order.max())
    if low < 0 or high >= n:
        raise ValueError(
            f"order must be a permutation of the example indices 0 .. {n - 1} (its length "
            f"{n} is the number of examples). Found {low if low < 0 else high}."
        )
    seen = np.zeros(n, dtype=bool)
    seen[order] = True
    if not seen.all():  # in range and n entries: a missing index means a repeated one
        counts = np.bincount(order, minlength=n)
        repeated = int(np.flatnonzero(counts > 1)[0])
        missing = int(np.flatnonzero(counts == 0)[0])
        raise ValueError(
            f"order must be a permutation of the example indices 0 .. {n - 1}, each example "
            f"in exactly one client. Found example {repeated} {int(counts[repeated])} times "
            f"and example {missing} missing."
        )


def _check_offsets(offsets: np.ndarray, num_examples: int) -> None:
    """Refuse ``offsets`` that do not cut ``num_examples`` examples into non-empty clients."""
    if int(offsets[0]) != 0 or int(offsets[-1]) != num_examples:
        raise ValueError(
            f"offsets must start at 0 and end at {num_examples} (the length of order). "
            f"Found {int(offsets[0])} .. {int(offsets[-1])}."
        )
    steps = np.diff(offsets)
    bad = np.flatnonzero(steps <= 0)
    if bad.size:
        c = int(bad[0])
        raise ValueError(
            f"offsets must be strictly increasing (every client holds at least one example). "
            f"Found offsets[{c}] = {int(offsets[c])} and offsets[{c + 1}] = "
            f"{int(offsets[c + 1])}: client {c} would hold {int(steps[c])} examples."
        )


def _check_nonempty(counts: np.ndarray) -> None:
    empty = np.flatnonzero(counts == 0)
    if empty.size:
        raise ValueError(
            f"{empty.size} client(s) hold no example (client {int(empty[0])} first); every "
            f"client needs at least one example."
        )


def as_partition(partition: Any, num_examples: int) -> ClientPartition:
    """Return ``partition`` as a :class:`ClientPartition` covering ``num_examples`` examples.

    Args:
        partition: A :class:`ClientPartition`, one client id per example (array or tensor of
            integers), or a list of index lists (one per client).
        num_examples: The dataset's size.

    Returns:
        The partition.

    Raises:
        ValueError: for a partition that misses or repeats examples, has empty clients, or
            covers another number of examples.
    """
    if isinstance(partition, ClientPartition):
        result = partition
    elif isinstance(partition, (np.ndarray, Tensor)):
        result = ClientPartition.from_client_ids(partition)
    elif isinstance(partition, Sequence) and len(partition) and not np.isscalar(partition[0]):
        result = ClientPartition.from_indices(partition, num_examples)
    elif isinstance(partition, Sequence):
        result = ClientPartition.from_client_ids(np.asarray(partition))
    else:
        raise ValueError(
            "partition must be a ClientPartition, one client id per example, or a list of "
            f"index lists. Found {type(partition).__name__}."
        )
    if result.num_examples != num_examples:
        raise ValueError(
            f"partition covers {result.num_examples} examples but the dataset holds "
            f"{num_examples}; every example must belong to exactly one client."
        )
    return result


def iid_partition(num_examples: int, num_clients: int, *, seed: int) -> ClientPartition:
    """Split the examples uniformly at random into clients of (almost) equal size.

    Args:
        num_examples: Dataset size (integer >= 1).
        num_clients: Number of clients, in ``[1, num_examples]``; sizes differ by at most one.
        seed: Seed of the random permutation (integer >= 0).

    Returns:
        The partition.

    Raises:
        ValueError: on an out-of-range argument.
    """
    total = check_int("num_examples", num_examples, minimum=1)
    k = check_int("num_clients", num_clients, minimum=1, maximum=total)
    rng = np.random.default_rng(check_int("seed", seed, minimum=0))
    blocks = np.array_split(rng.permutation(total), k)
    return ClientPartition.from_indices([b.tolist() for b in blocks], total)


def _labels(labels: Any) -> np.ndarray:
    if isinstance(labels, Tensor):
        labels = labels.detach().cpu().numpy()
    array = _int_array("labels", labels)
    if array.ndim != 1 or array.size == 0:
        raise ValueError(f"labels must be a non-empty one-dimensional array. Found {array.shape}.")
    if int(array.min()) < 0:
        raise ValueError(f"labels must be integers >= 0. Found {int(array.min())}.")
    return array


def dirichlet_partition(
    labels: Any,
    num_clients: int,
    *,
    alpha: float,
    seed: int,
    client_sizes: Sequence[int] | None = None,
) -> ClientPartition:
    """Give every client a label distribution drawn from ``Dirichlet(alpha)`` over the classes.

    The scheme of Hsu, Qi & Brown (*Measuring the Effects of Non-Identical Data Distribution
    for Federated Visual Classification*, arXiv:1909.06335), with a uniform prior over the
    classes: client ``c`` draws ``q_c ~ Dir(alpha, ..., alpha)`` and then fills its
    ``client_sizes[c]`` places with examples drawn without replacement, each place's class
    drawn from ``q_c`` restricted to the classes that still have examples. Small ``alpha``
    gives clients dominated by few classes; large ``alpha`` approaches IID. Unlike splitting
    each class by a Dirichlet over clients, no client ends up empty, whatever ``num_clients``.
    The last clients may find their preferred classes used up and take what is left.

    Args:
        labels: Integer class label of every example (>= 0).
        num_clients: Number of clients, in ``[1, len(labels)]``.
        alpha: Concentration (> 0).
        seed: Seed (integer >= 0).
        client_sizes: Examples per client, summing to ``len(labels)``, each >= 1; by default as
            equal as possible.

    Returns:
        The partition.

    Raises:
        ValueError: on an out-of-range argument.
    """
    y = _labels(labels)
    total = y.size
    k = check_int("num_clients", num_clients, minimum=1, maximum=total)
    alpha = check_positive("alpha", alpha)
    rng = np.random.default_rng(check_int("seed", seed, minimum=0))
    sizes = _client_sizes(client_sizes, k, total)
    classes = np.unique(y)
    pools = [rng.permutation(np.flatnonzero(y == c)) for c in classes]
    left = np.array([p.size for p in pools], dtype=np.int64)
    taken = np.zeros(classes.size, dtype=np.int64)
    clients = []
    for size in sizes:
        q = rng.dirichlet(np.full(classes.size, alpha))
        want = np.zeros(classes.size, dtype=np.int64)
        need = int(size)
        while need > 0:
            room = left - want
            weights = np.where(room > 0, q, 0.0)
            if weights.sum() <= 0.0:  # the client's classes are used up: any class left
                weights = (room > 0).astype(float)
            draw = np.minimum(rng.multinomial(need, weights / weights.sum()), room)
            want += draw
            need -= int(draw.sum())
        block = [pools[j][taken[j] : taken[j] + want[j]] for j in np.flatnonzero(want)]
        clients.append(np.concatenate(block).tolist())
        taken += want
        left -= want
    return ClientPartition.from_indices(clients, total)


def _client_sizes(client_sizes: Sequence[int] | None, k: int, total: int) -> np.ndarray:
    if client_sizes is None:
        return np.array([b.size for b in np.array_split(np.arange(total), k)], dtype=np.int64)
    sizes = _int_array("client_sizes", client_sizes).reshape(-1)
    if sizes.size != k or (sizes < 1).any() or int(sizes.sum()) != total:
        raise ValueError(
            f"client_sizes must hold {k} integers >= 1 summing to {total} (the number of "
            f"labels). Found {sizes.size} sizes summing to {int(sizes.sum())}."
        )
    return sizes


def shard_partition(
    labels: Any, num_clients: int, *, shards_per_client: int = 2, seed: int
) -> ClientPartition:
    """Sort by label, cut into equal shards and deal ``shards_per_client`` shards to each client.

    The pathological non-IID partition of McMahan et al. (*Communication-Efficient Learning of
    Deep Networks from Decentralized Data*, arXiv:1602.05629, §3: 200 shards of 300 MNIST
    images, two per client, so most clients see two digits). Ties within a label are broken
    at random; shards are as equal in size as possible.

    Args:
        labels: Integer class label of every example (>= 0).
        num_clients: Number of clients (integer >= 1).
        shards_per_client: Shards per client (integer >= 1); ``num_clients *
            shards_per_client`` must not exceed the number of examples.
        seed: Seed (integer >= 0).

    Returns:
        The partition.

    Raises:
        ValueError: on an out-of-range argument.
    """
    y = _labels(labels)
    k = check_int("num_clients", num_clients, minimum=1, maximum=y.size)
    per = check_int("shards_per_client", shards_per_client, minimum=1, maximum=y.size // k)
    rng = np.random.default_rng(check_int("seed", seed, minimum=0))
    jitter = rng.permutation(y.size)
    by_label = jitter[np.argsort(y[jitter], kind="stable")]
    shards = np.array_split(by_label, k * per)
    deal = rng.permutation(k * per).reshape(k, per)
    return ClientPartition.from_indices(
        [np.concatenate([shards[s] for s in row]).tolist() for row in deal], y.size
    )


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


@dataclass(frozen=True)
class RoundResult:
    """What a released round did.

    Attributes:
        round: The round's index (0-based, as the sampler's).
        reports: Number of reports ``B_t`` (public in the shuffle model).
        local_loss: Mean over the participants of their mean local training loss (``nan`` for
            an empty round). A statistic of the clients' data that the protocol does not
            release and the accountant does not cover: for monitoring simulations only.
    """

    round: int
    reports: int
    local_loss: float


def _first_line(exc: BaseException) -> str:
    """Return an exception as one line: its type and the first line of its message."""
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__


def _materialise(data: Any) -> tuple[Tensor, Tensor]:
    """Return the ``(inputs, targets)`` tensors of ``data``, one row per example.

    Args:
        data: A ``TensorDataset`` of two tensors, a pair of tensors, or a map-style ``Dataset``
            of ``(input, target)`` pairs (read once, ``data[0] .. data[len(data) - 1]``, and
            stacked with ``default_collate``).

    Returns:
        ``(inputs, targets)`` with the same first dimension ``>= 1``.

    Raises:
        ValueError: one line, for another kind of ``data``, an example that cannot be read
            (the dataset's own exception is named, not re-raised), examples that are not
            ``(input, target)`` pairs or do not stack, or tensors of unequal lengths.
    """
    if isinstance(data, TensorDataset):
        tensors = data.tensors
    elif isinstance(data, (tuple, list)) and all(isinstance(t, Tensor) for t in data):
        tensors = tuple(data)
    elif isinstance(data, Dataset) and hasattr(data, "__len__"):
        size = len(data)  # type: ignore[arg-type]
        if size == 0:
            raise ValueError("data must hold at least one example. Found an empty dataset.")
        items = []
        for i in range(size):
            try:
                item = data[i]
            except Exception as exc:  # noqa: BLE001 - the dataset's failure becomes one line
                raise ValueError(
                    f"data[{i}] cannot be read (data is read once, indices 0 .. {size - 1}): "
                    f"{_first_line(exc)}"
                ) from None
            if not isinstance(item, (tuple, list)) or len(item) != 2:
                raise ValueError(
                    f"data's examples must be (input, target) pairs. Found data[{i}] of type "
                    f"{type(item).__name__}."
                )
            items.append(item)
        try:
            tensors = tuple(default_collate(items))
        except Exception as exc:  # noqa: BLE001 - a collation failure becomes one line
            raise ValueError(
                f"data's examples must stack into an inputs tensor and a targets tensor: "
                f"{_first_line(exc)}"
            ) from None
        if not all(isinstance(t, Tensor) for t in tensors):
            found = ", ".join(type(t).__name__ for t in tensors)
            raise ValueError(
                f"data's inputs and targets must stack into tensors (numbers, arrays or "
                f"tensors). Found {found}."
            )
    else:
        raise ValueError(
            "data must be a TensorDataset of (inputs, targets), a pair of tensors, or a "
            f"map-style Dataset of (input, target) pairs. Found {type(data).__name__}."
        )
    if len(tensors) != 2:
        raise ValueError(f"data must hold two tensors, inputs and targets. Found {len(tensors)}.")
    inputs, targets = tensors
    if inputs.ndim == 0 or targets.ndim == 0 or inputs.shape[0] != targets.shape[0]:
        raise ValueError(
            "data's inputs and targets must have the same first dimension (one row per "
            f"example). Found shapes {tuple(inputs.shape)} and {tuple(targets.shape)}."
        )
    if inputs.shape[0] == 0:
        raise ValueError("data must hold at least one example. Found an empty dataset.")
    return inputs, targets


class FederatedTrainer:
    """Runs the rounds of user-level shuffle-model training; built by :func:`make_private_clients`.

    Iterating over it releases the rounds ``start_round .. rounds - 1`` in order; each item is
    the :class:`RoundResult` of a round whose noisy average is already in the ``.grad`` of the
    global parameters and already recorded by the accountant. Call ``optimizer.step()`` for
    each (and do not clear the gradients in between)::

        for result in trainer:
            optimizer.step()

    Attributes:
        module: The global model (unchanged by the trainer except for ``.grad``).
        optimizer: The server's optimizer.
        partition: The clients.
        training: The local training.
        sampler: The protocol's sampler over the clients.
        accountant: The engine's accountant (population = number of clients).
        noise_multiplier: Each client's noise std divided by ``max_update_norm``.
        max_update_norm: The clipping norm ``C`` of a client's whole update.
        average: ``"expected"`` or ``"reports"`` (see :data:`AVERAGES`).
        noise_mode: ``"sum"`` or ``"per_client"`` (:func:`~shuffle_opacus.noise.local_noise_sum`).
        client_chunk: Clients trained together in one vectorised call.
        rounds_released: Rounds released (and accounted) so far by this trainer.
    """

    def __init__(
        self,
        *,
        module: nn.Module,
        optimizer: torch.optim.Optimizer,
        inputs: Tensor,
        targets: Tensor,
        partition: ClientPartition,
        loss_fn: Callable[[Tensor, Tensor], Tensor],
        training: LocalTraining,
        sampler: ShuffleRoundSampler,
        accountant: ShuffleAccountantBase,
        noise_multiplier: float,
        max_update_norm: float,
        average: str,
        noise_mode: str,
        noise_generator: torch.Generator | None,
        secure_mode: bool,
        client_chunk: int,
    ) -> None:
        """Store the validated pieces (use :func:`make_private_clients`, which checks them)."""
        self.module = module
        self.optimizer = optimizer
        self.inputs = inputs
        self.targets = targets
        self.partition = partition
        self.loss_fn = loss_fn
        self.training = training
        self.sampler = sampler
        # Rounds are released once each, in order: a round's clients are a function of the seed
        # and its index, so releasing it again would reuse the same check-in set, which
        # composition of independent rounds does not cover.
        self._next_round = sampler.start_round
        self.accountant = accountant
        self.noise_multiplier = noise_multiplier
        self.max_update_norm = max_update_norm
        self.average = average
        self.noise_mode = noise_mode
        self.noise_generator = noise_generator
        self.secure_mode = secure_mode
        self.client_chunk = client_chunk
        self.rounds_released = 0
        named = [(k, p) for k, p in module.named_parameters() if p.requires_grad]
        self._names = [k for k, _ in named]
        self._params = [p for _, p in named]
        self._fixed: dict[str, Tensor] = {
            k: p for k, p in module.named_parameters() if not p.requires_grad
        }
        self._fixed.update(dict(module.named_buffers()))
        self._order = torch.tensor(partition.order, dtype=torch.long, device=inputs.device)
        self._offsets = partition.offsets
        self._sizes = partition.sizes
        self._step_grad = vmap(
            grad(self._client_loss, has_aux=True), in_dims=(0, 0, 0, 0), randomness="different"
        )
        self._built = True

    def _client_loss(
        self, params: tuple[Tensor, ...], x: Tensor, y: Tensor, w: Tensor
    ) -> tuple[Tensor, Tensor]:
        state = dict(zip(self._names, params, strict=True))
        state.update(self._fixed)
        losses = self.loss_fn(functional_call(self.module, state, (x,)), y)
        total = (losses * w).sum()
        return total, total.detach()

    @property
    def expected_reports(self) -> float:
        """Expected reports per round (``n * rate``, ``m`` or ``n``)."""
        return float(self.sampler.expected_batch_size)

    def __len__(self) -> int:
        """Return the number of rounds iteration still releases (``rounds - next round``)."""
        return max(0, self.sampler.rounds - self._next_round)

    def __setattr__(self, name: str, value: Any) -> None:
        """Refuse to change the trainer once it is built (the accountant follows its plan).

        Raises:
            AttributeError: for every attribute after construction.
        """
        if self.__dict__.get("_built", False):
            raise AttributeError(
                f"{name} of a FederatedTrainer is fixed once it is built (its accountant records "
                f"the rounds with the sampler, noise and clients it holds); call "
                f"make_private_clients again on the same engine for other settings."
            )
        super().__setattr__(name, value)

    def __delattr__(self, name: str) -> None:
        """Refuse to delete an attribute.

        Raises:
            AttributeError: always.
        """
        raise AttributeError(f"{name} of a FederatedTrainer cannot be deleted.")

    def _refuse_copy(self, how: str) -> TypeError:
        return TypeError(
            f"a FederatedTrainer cannot be {how}: the copy would release rounds its engine's "
            f"accountant counts once, or not at all. Call make_private_clients again on the "
            f"same engine (new rounds are accounted with the others)."
        )

    def __copy__(self) -> FederatedTrainer:
        """Refuse (see :meth:`_refuse_copy`).

        Raises:
            TypeError: always.
        """
        raise self._refuse_copy("copied")

    def __deepcopy__(self, memo: dict[int, Any]) -> FederatedTrainer:
        """Refuse (see :meth:`_refuse_copy`).

        Raises:
            TypeError: always.
        """
        raise self._refuse_copy("deep-copied")

    def __reduce_ex__(self, protocol: Any) -> Any:
        """Refuse pickling (a pickled trainer would be a copy).

        Raises:
            TypeError: always.
        """
        raise self._refuse_copy("pickled")

    def __iter__(self) -> Iterator[RoundResult]:
        """Release the rounds not released yet, up to ``rounds - 1`` (see the class docstring).

        A second loop continues where the first stopped; once every round is released it yields
        nothing.
        """
        while self._next_round < self.sampler.rounds:
            yield self.run_round(self._next_round)

    def run_round(self, round_index: int) -> RoundResult:
        """Release round ``round_index``: train, clip, noise, average into ``.grad``, account.

        Every call is a release and is accounted. Each round is released at most once, in
        order: an index below the next round to release is refused (its clients are those of the
        earlier release, a reuse that independent-round composition does not cover); skipping
        ahead leaves the skipped rounds unreleased.

        Args:
            round_index: The round (in ``[0, rounds)``); its clients are the sampler's.

        Returns:
            The round's :class:`RoundResult`.

        Raises:
            ValueError: if ``round_index`` is out of range or was released already.
        """
        if (
            isinstance(round_index, bool)
            or not isinstance(round_index, (int, np.integer))
            or not self._next_round <= int(round_index) < self.sampler.rounds
        ):
            if isinstance(round_index, (int, np.integer)) and 0 <= round_index < self._next_round:
                raise ValueError(
                    f"round_index {round_index} was released already (the next round is "
                    f"{self._next_round}); its clients would be the same again, which the "
                    f"accountant cannot count as a new round. Release round_index >= "
                    f"{self._next_round}."
                )
            raise ValueError(
                f"round_index must be an integer in [{self._next_round}, {self.sampler.rounds}) "
                f"(the planned rounds not released yet). Found {round_index!r}."
            )
        round_index = int(round_index)
        # Refuse a round this engine's accountant has seen already, before any work.
        self.accountant.check_unreleased(
            self.sampler.seed, round_index, round_index + 1, what="round_index"
        )
        participants = np.asarray(self.sampler.batch(round_index), dtype=np.int64)
        sums, loss = self._clipped_sum(participants, round_index)
        reports = int(participants.size)
        expected = self.accountant.spec().reports_per_round(
            population=self.partition.num_clients, sample_size=self.accountant.sample_size
        )
        if expected is not None and reports != expected:
            raise RuntimeError(f"round {round_index} has {reports} reports, not {expected}")
        if self.average == "expected":
            denominator = self.expected_reports
        else:
            denominator = float(max(reports, 1))
        std = self.noise_multiplier * self.max_update_norm
        grads = {}
        for p in _optimizer_params(self.optimizer):
            total = sums[p]
            noise = local_noise_sum(
                std,
                reports,
                total,
                mode=self.noise_mode,
                generator=self.noise_generator,
                secure_mode=self.secure_mode,
            )
            grads[p] = ((total + noise) / denominator).view_as(p)
        self.accountant.release(
            self.sampler.seed,
            round_index,
            noise_multiplier=self.noise_multiplier,
            sample_rate=self.sampler.sample_rate,
        )
        for p, g in grads.items():
            p.grad = g
        object.__setattr__(self, "rounds_released", self.rounds_released + 1)
        object.__setattr__(self, "_next_round", round_index + 1)
        return RoundResult(round=int(round_index), reports=reports, local_loss=loss)

    def _clipped_sum(
        self, participants: np.ndarray, round_index: int
    ) -> tuple[dict[Tensor, Tensor], float]:
        """Return the sum of the participants' clipped updates and their mean local loss."""
        sums: dict[Tensor, Tensor] = {
            p: torch.zeros_like(p, memory_format=torch.contiguous_format) for p in self._params
        }
        loss_total = 0.0
        for start in range(0, participants.size, self.client_chunk):
            clients = participants[start : start + self.client_chunk]
            updates, losses = self.local_updates(clients, round_index)
            for p, s in zip(self._params, self.clip_sum(updates), strict=True):
                s = s.view_as(p)
                sums[p] += s
            loss_total += float(losses.sum())
        loss = loss_total / participants.size if participants.size else math.nan
        return sums, loss

    def clip_sum(self, updates: Sequence[Tensor]) -> list[Tensor]:
        """Return the sum over clients of ``updates`` clipped as one vector per client.

        Factor ``min(1, C / (||u_i|| + 1e-6))`` (Opacus's, :func:`shuffle_opacus.clipping.
        clip_factors`), ``||u_i||`` over all parameters; a non-finite update counts as zero.

        Args:
            updates: One ``(B, *shape)`` tensor per trainable parameter.

        Returns:
            One ``shape`` tensor per trainable parameter.
        """
        b = updates[0].shape[0]
        norms = torch.stack([u.reshape(b, -1).norm(2, dim=1) for u in updates], dim=1)
        norm = norms.norm(2, dim=1)
        finite = torch.isfinite(norm)
        factors = clip_factors(torch.where(finite, norm, 0.0), self.max_update_norm)
        if not bool(finite.all()):
            updates = [torch.where(finite.view(-1, *[1] * (u.ndim - 1)), u, 0.0) for u in updates]
            factors = torch.where(finite, factors, 0.0)
        return [torch.einsum("i,i...->...", factors, u) for u in updates]

    def local_updates(self, clients: np.ndarray, round_index: int) -> tuple[list[Tensor], Tensor]:
        """Train ``clients`` locally from the global weights; return their updates ``w - w_i``.

        Not private on its own (no clipping, no noise, nothing accounted); :meth:`run_round`
        releases only the clipped, noised sum.

        Args:
            clients: Client ids (``int64`` array).
            round_index: The round (seeds the local mini-batch order).

        Returns:
            ``(updates, losses)``: one ``(B, *shape)`` tensor per trainable parameter, and each
            client's mean local loss ``(B,)``.
        """
        index, weight = self._schedule(clients, round_index)
        b = len(clients)
        base = [p.detach() for p in self._params]
        updates = [torch.zeros((b, *p.shape), dtype=p.dtype, device=p.device) for p in base]
        losses = torch.zeros(b, dtype=weight.dtype, device=weight.device)
        if b == 0:
            return updates, losses
        lr = self.training.client_lr
        active = (weight > 0).any(dim=2)
        for s in range(index.shape[1]):
            rows = index[:, s]
            local = tuple(p.unsqueeze(0) - u for p, u in zip(base, updates, strict=True))
            grads, step_loss = self._step_grad(
                local, self.inputs[rows], self.targets[rows], weight[:, s]
            )
            for u, g in zip(updates, grads, strict=True):
                u.add_(g, alpha=lr)
            losses += step_loss.detach().to(losses.dtype)
        steps = active.sum(dim=1).clamp(min=1).to(losses.dtype)
        return updates, losses / steps

    def _schedule(self, clients: np.ndarray, round_index: int) -> tuple[Tensor, Tensor]:
        """Return ``(index, weight)`` of shape ``(B, steps, batch)``: dataset rows and weights."""
        sizes = self._sizes[clients]
        training = self.training
        b = len(clients)
        if b == 0:
            return (
                torch.zeros((0, 0, 0), dtype=torch.long, device=self.inputs.device),
                torch.zeros((0, 0, 0), dtype=self._params[0].dtype, device=self.inputs.device),
            )
        limit = training.local_batch_size
        batch = sizes if limit is None else np.minimum(sizes, int(limit))
        if training.local_steps is not None:
            steps = np.full(b, int(training.local_steps), dtype=np.int64)
        else:
            steps = int(training.local_epochs) * -(-sizes // batch)  # type: ignore[arg-type]
        width, depth = int(batch.max()), int(steps.max())
        positions = np.full((b, depth, width), -1, dtype=np.int64)
        whole = batch == sizes
        if whole.any():  # batches are the whole client: positions 0 .. size - 1, nothing drawn
            grid = np.arange(width)
            rows = np.flatnonzero(whole)
            valid = grid[None, :] < sizes[rows, None]
            for_steps = np.arange(depth)[None, :] < steps[rows, None]
            positions[rows] = np.where(valid[:, None, :] & for_steps[:, :, None], grid, -1)
        for row in np.flatnonzero(~whole):
            drawn = _local_positions(
                int(sizes[row]), training, self.sampler.seed, round_index, int(clients[row])
            )
            positions[row, : drawn.shape[0], : drawn.shape[1]] = drawn
        valid = positions >= 0
        counts = valid.sum(axis=2, keepdims=True)
        weight = np.where(valid, 1.0 / np.maximum(counts, 1), 0.0)
        rows = self._offsets[clients][:, None, None] + np.where(valid, positions, 0)
        device = self.inputs.device
        index = self._order[torch.as_tensor(rows, device=device)]
        dtype = self._params[0].dtype
        return index, torch.as_tensor(weight, dtype=dtype, device=device)


def _optimizer_params(optimizer: torch.optim.Optimizer) -> list[Tensor]:
    return [p for group in optimizer.param_groups for p in group["params"]]


def _check_module(module: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    if not isinstance(module, nn.Module):
        raise ValueError(f"module must be a torch.nn.Module. Found {type(module)!r}.")
    if isinstance(module, AbstractGradSampleModule):
        raise ValueError("module is wrapped for per-sample gradients; pass the plain module.")
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise ValueError(f"optimizer must be a torch.optim.Optimizer. Found {type(optimizer)!r}.")
    trainable = [p for p in module.parameters() if p.requires_grad]
    if not trainable:
        raise ValueError("module has no trainable parameter (requires_grad=True).")
    held = _optimizer_params(optimizer)
    if {id(p) for p in held} != {id(p) for p in trainable} or len(held) != len(trainable):
        raise ValueError(
            "optimizer must hold exactly the module's trainable parameters, each once "
            f"({len(trainable)} tensors); it holds {len(held)}."
        )
    for name, sub in module.named_modules():
        if isinstance(sub, nn.modules.batchnorm._NormBase) and sub.track_running_stats:
            raise ValueError(
                f"module layer {name or type(sub).__name__} ({type(sub).__name__}) keeps running "
                "statistics, which local training cannot update per client; use GroupNorm or "
                "track_running_stats=False."
            )


def _snapshot(module: nn.Module) -> dict[str, Any]:
    """Everything a forward pass could write into ``module``: tensors and plain attributes."""
    state: dict[str, Any] = {}
    for name, sub in module.named_modules():
        for key, value in vars(sub).items():
            if key in ("_parameters", "_buffers", "_modules") or key.endswith("hooks"):
                continue
            state[f"{name}:{key}"] = value
        for key, tensor in [*sub._parameters.items(), *sub._buffers.items()]:
            state[f"{name}.{key}"] = None if tensor is None else tensor.detach().clone()
    return state


def _changed(before: dict[str, Any], after: dict[str, Any]) -> str | None:
    for key in sorted(set(before) | set(after)):
        old, new = before.get(key), after.get(key)
        if isinstance(old, Tensor) and isinstance(new, Tensor):
            if old.shape != new.shape or not torch.equal(old, new):
                return key
        elif old is not new and not (isinstance(old, (bool, int, str, type(None))) and old == new):
            return key
    return None


def _dry_run(
    module: nn.Module,
    inputs: Tensor,
    targets: Tensor,
    partition: ClientPartition,
    loss_fn: Callable[[Tensor, Tensor], Tensor],
) -> None:
    """Evaluate the loss on up to two examples of client 0, on a copy of ``module``.

    The copy runs in training mode (as local training does) and, if the module is in evaluation
    mode, in that mode too; ``module`` itself is never called, so no client data reaches it
    outside the protocol. A module whose forward pass writes into its state (a buffer, a
    parameter or a plain attribute, as BatchNorm's running statistics do) is refused: local
    training would write one client's data into the global model without noise.

    Raises:
        ValueError: naming the cause (loss, shape, or the attribute the forward pass changed).
    """
    if not callable(loss_fn):
        raise ValueError(f"loss_fn must be callable. Found {type(loss_fn).__name__}.")
    rows = torch.as_tensor(partition.client(0)[:2], device=inputs.device)
    try:
        probe = copy.deepcopy(module)
    except Exception as exc:  # noqa: BLE001 - any failure becomes one line
        raise ValueError(
            f"module cannot be copied for the set-up check ({type(exc).__name__}: "
            f"{str(exc).strip().splitlines()[0] if str(exc).strip() else ''}); the check runs "
            f"on a copy so that no client data reaches the model outside the protocol."
        ) from None
    modes = [True] if module.training else [True, False]
    for training in modes:
        probe.train(training)
        before = _snapshot(probe)
        try:
            with torch.no_grad():
                losses = loss_fn(probe(inputs[rows]), targets[rows])
        except Exception as exc:  # noqa: BLE001 - any failure becomes one line
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise ValueError(
                f"loss_fn(module(inputs), targets) fails on client 0's examples: {first}"
            ) from None
        changed = _changed(before, _snapshot(probe))
        if changed is not None:
            mode = "training" if training else "evaluation"
            raise ValueError(
                f"module's forward pass in {mode} mode changes its state ({changed}): local "
                f"training would write a client's data into the global model outside the "
                f"protocol, with no noise and no accounting. Use layers without running state "
                f"(as for BatchNorm: GroupNorm, or track_running_stats=False)."
            )
        if not isinstance(losses, Tensor) or tuple(losses.shape) != (rows.numel(),):
            shape = tuple(losses.shape) if isinstance(losses, Tensor) else type(losses).__name__
            raise ValueError(
                f"loss_fn must return one loss per example (shape ({rows.numel()},) here). "
                f"Found {shape}; e.g. pass reduction='none' to torch's losses."
            )


def make_private_clients(
    engine: PrivacyEngine,
    *,
    module: nn.Module,
    optimizer: torch.optim.Optimizer,
    data: Any,
    partition: Any,
    loss_fn: Callable[[Tensor, Tensor], Tensor],
    noise_multiplier: float,
    max_update_norm: float,
    client_lr: float,
    local_steps: int | None = None,
    local_epochs: int | None = None,
    local_batch_size: int | None = None,
    rounds: int | None = None,
    rate: float | None = None,
    sample_size: int | None = None,
    seed: int | None = None,
    start_round: int = 0,
    sensitivity: float | str = "replace-one",
    method: str | None = None,
    noise_mode: str = "sum",
    average: str = "expected",
    noise_generator: torch.Generator | None = None,
    client_chunk: int = DEFAULT_CLIENT_CHUNK,
) -> FederatedTrainer:
    """Prepare user-level shuffle-model training: clients with many examples train locally.

    The protocol follows ``engine.accountant`` as in :func:`shuffle_opacus.make_private`
    (``shuffled_checkin`` needs ``rate``, ``subsampled_shuffle`` needs ``sample_size``,
    ``shuffle`` uses all clients), with ``n`` the **number of clients** of ``partition``. The
    accountant is configured with that population. See the module docstring for the round, the
    privacy statement and the units. Everything is checked first; after a ``ValueError`` the
    module, the optimizer and the accountant are as they were.

    Args:
        engine: A ``PrivacyEngine(accountant=...)`` with a shuffle accountant.
        module: The global model (trainable parameters are trained and clipped together;
            buffers and frozen parameters stay fixed during local training).
        optimizer: The server's optimizer over exactly the module's trainable parameters (SGD
            with ``lr=1`` is FedAvg).
        data: A ``TensorDataset`` of ``(inputs, targets)``, a pair of tensors, or a map-style
            ``Dataset`` of ``(input, target)`` pairs (stacked once), on the module's device.
        partition: A :class:`ClientPartition`, one client id per example, or a list of index
            lists; it must cover every example exactly once, every client non-empty.
        loss_fn: ``loss_fn(outputs, targets)`` returning **one loss per example** (e.g.
            ``functools.partial(F.cross_entropy, reduction="none")``).
        noise_multiplier: Each client's noise std divided by ``max_update_norm`` (> 0).
        max_update_norm: Clipping norm ``C`` of a client's whole update (> 0).
        client_lr: Local SGD learning rate (> 0).
        local_steps: Local steps per round; exactly one of it and ``local_epochs``.
        local_epochs: Local epochs per round.
        local_batch_size: Examples per local step (``None``: the whole client).
        rounds: Number of rounds (integer >= 1).
        rate: Check-in probability (``shuffled_checkin``), in ``(0, 1]``.
        sample_size: Clients per round (``subsampled_shuffle``), in ``[1, n - 1]``.
        seed: Seed of the client sampling and of the local mini-batch order (integer >= 0;
            ``None`` draws one, kept in ``trainer.sampler.seed``).
        start_round: First round iteration releases, to resume a run (same seed).
        sensitivity: ``"replace-one"`` (2, default), ``"paper"`` (1) or a number, in units of
            ``C``; see :mod:`shuffle_opacus.protocols`.
        method: Core analysis method of the accountant; ``None`` (default) is pld, the tightest
            sound one, or the Rényi bound where pld is beyond the work limits.
        noise_mode: ``"sum"`` (one draw of std ``sigma C sqrt(B_t)`` per parameter tensor) or
            ``"per_client"`` (every client's draw).
        average: ``"expected"`` (divide by the expected reports per round) or ``"reports"``
            (by the round's actual number).
        noise_generator: Torch generator of the noise, on the data's device, or ``None``
            (torch's default generator); must be ``None`` in secure mode.
        client_chunk: Clients trained together in one vectorised call (integer >= 1); memory
            grows with it.

    Returns:
        A :class:`FederatedTrainer`; iterate over it and call ``optimizer.step()`` each round.

    Raises:
        ValueError: on any invalid or inconsistent argument; nothing has been changed then.
    """
    _check_module(module, optimizer)
    accountant = _shuffle_accountant(engine)
    spec = accountant.spec()
    inputs, targets = _materialise(data)
    _check_noise_generator(noise_generator, inputs.device)
    clients = as_partition(partition, int(inputs.shape[0]))
    training = LocalTraining(
        client_lr=client_lr,
        local_steps=local_steps,
        local_epochs=local_epochs,
        local_batch_size=local_batch_size,
    )
    noise_multiplier = check_positive("noise_multiplier", noise_multiplier)
    max_update_norm = check_positive("max_update_norm", max_update_norm)
    if noise_mode not in NOISE_MODES:
        raise ValueError(
            f"noise_mode must be one of {', '.join(NOISE_MODES)}. Found {noise_mode!r}."
        )
    if average not in AVERAGES:
        raise ValueError(f"average must be one of {', '.join(AVERAGES)}. Found {average!r}.")
    chunk = check_int("client_chunk", client_chunk, minimum=1)
    if engine.secure_mode and noise_generator is not None:
        raise ValueError("noise_generator must be None in secure mode (Opacus's rule).")
    if engine.secure_mode and noise_mode == "per_client":
        raise ValueError("noise_mode='per_client' is a reference mode and has no secure mode.")
    n = clients.num_clients
    options = PrivacyOptions(
        max_grad_norm=max_update_norm,
        rounds=rounds,
        rate=rate,
        sample_size=sample_size,
        seed=seed,
        start_round=start_round,
        sensitivity=sensitivity,
        method=method,
    )
    sampler = new_sampler(spec, accountant.mechanism(), n, options)
    sens = resolve_sensitivity(sensitivity)
    method = spec.check_method(method)
    size = sampler.m if isinstance(sampler, FixedSizeShuffledSampler) else None
    accountant.check_configuration(population=n, sensitivity=sens, method=method, sample_size=size)
    check_release_plan(
        accountant,
        seed=sampler.seed,
        start=sampler.start_round,
        rounds=max(0, sampler.rounds - sampler.start_round),
        noise_multiplier=noise_multiplier,
        max_norm=max_update_norm,
        population=n,
        sample_rate=sampler.sample_rate,
        sensitivity=sens,
        dtype=next(p for p in module.parameters() if p.requires_grad).dtype,
        norm_name="max_update_norm",
        client_lr=training.client_lr,
    )
    _dry_run(module, inputs, targets, clients, loss_fn)
    if engine.secure_mode:
        warnings.warn(
            "secure_mode protects the noise; client sampling and local batches use numpy's "
            "PCG64, which is a simulation-grade generator.",
            stacklevel=2,
        )
    accountant.configure(population=n, sensitivity=sens, method=method, sample_size=size)
    bind_get_epsilon(engine)
    return FederatedTrainer(
        module=module,
        optimizer=optimizer,
        inputs=inputs,
        targets=targets,
        partition=clients,
        loss_fn=loss_fn,
        training=training,
        sampler=sampler,
        accountant=accountant,
        noise_multiplier=noise_multiplier,
        max_update_norm=max_update_norm,
        average=average,
        noise_mode=noise_mode,
        noise_generator=engine.secure_rng if engine.secure_mode else noise_generator,
        secure_mode=engine.secure_mode,
        client_chunk=chunk,
    )
