"""Partitions of a dataset's examples into clients: the data structure and the partitioners.

A :class:`ClientPartition` says which examples each client holds (every example in exactly one
client, every client non-empty; every constructor checks it). :func:`iid_partition`,
:func:`dirichlet_partition` (label skew) and :func:`shard_partition` (McMahan et al.'s shards)
build the usual federated splits; :func:`as_partition` accepts the forms
:func:`shuffle_opacus.make_private_clients` takes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from torch import Tensor

from ..common.validation import check_int, check_positive

__all__ = [
    "ClientPartition",
    "as_partition",
    "dirichlet_partition",
    "iid_partition",
    "shard_partition",
]


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
