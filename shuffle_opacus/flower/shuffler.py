"""The check-in coins and the shuffler: the parts of a round a trusted party would run.

The shuffled check-in analysis (Liew & Takahashi, arXiv:2206.09569) assumes the analyst sees only
the number of reports of a round and their multiset, and that the coins are independent of the
data. :func:`check_in` flips one coin per connected node with probability ``rate``;
:func:`shuffle_replies` drops error replies, rebuilds every other reply with the same metadata for
all (no source node, message id or timestamps, one TTL) and returns them in uniformly random
order. Both run inside the ServerApp process, so they *simulate* a trusted shuffler: the
guarantee holds against an analyst that receives only their output, not against the operator of
the ServerApp or SuperLink (``docs/flower.md``). :func:`make_rng` returns
:class:`random.SystemRandom` unless a seed is given (Python's Mersenne Twister, for tests and
experiments only).
"""

from __future__ import annotations

import random
from collections.abc import Iterable
from dataclasses import dataclass

from flwr.app import DEFAULT_TTL, Message, Metadata

from ..common.validation import check_int, check_probability

__all__ = ["ShuffledReplies", "check_in", "make_rng", "shuffle_replies"]


def make_rng(seed: int | None = None) -> random.Random:
    """Return the generator for check-in coins and shuffling.

    Args:
        seed: ``None`` (default) for :class:`random.SystemRandom`, which draws from the
            operating system's secure source and cannot be seeded; an integer >= 0 for a
            seeded :class:`random.Random` (reproducible; for tests and experiments, not for a
            deployment).

    Returns:
        The generator.

    Raises:
        ValueError: for a seed that is not an integer >= 0.
    """
    if seed is None:
        return random.SystemRandom()
    return random.Random(check_int("seed", seed, minimum=0))


def check_in(node_ids: Iterable[int], rate: float, rng: random.Random) -> list[int]:
    """Flip an independent coin with probability ``rate`` for every node; return the heads.

    The nodes are visited in increasing id order, so a seeded generator gives the same
    participants for the same set of nodes. The coins do not depend on anything but ``rng``.

    Args:
        node_ids: Ids of all the nodes of the population (duplicates are an error).
        rate: Check-in probability γ in ``(0, 1]``.
        rng: Generator from :func:`make_rng`.

    Returns:
        The ids of the nodes that checked in, in increasing order (possibly none).

    Raises:
        ValueError: for a rate outside ``(0, 1]`` or duplicate node ids.
    """
    rate = check_probability("rate", rate)
    ids = sorted(int(i) for i in node_ids)
    if len(set(ids)) != len(ids):
        raise ValueError("node_ids must be distinct. Found duplicates.")
    return [node for node in ids if rng.random() < rate]


@dataclass(frozen=True)
class ShuffledReplies:
    """What the shuffler hands to the aggregation.

    Attributes:
        reports: The replies that carried content, with anonymous metadata, in random order.
        num_errors: Number of replies that carried an error instead (dropped).
        error_reasons: The distinct reasons of those errors, sorted (no node identities; the
            privacy mod's refusals carry no data-dependent detail).
    """

    reports: list[Message]
    num_errors: int
    error_reasons: list[str]


def _anonymous(reply: Message) -> Message:
    old = reply.metadata
    metadata = Metadata(
        run_id=old.run_id,
        message_id="",
        src_node_id=0,
        dst_node_id=old.dst_node_id,
        reply_to_message_id="",
        group_id=old.group_id,
        created_at=0.0,
        ttl=DEFAULT_TTL,
        message_type=old.message_type,
    )
    # flwr 1.41's overloads omit the (content, metadata) constructor its own runtime uses.
    return Message(content=reply.content, metadata=metadata)  # type: ignore[call-overload]


def shuffle_replies(replies: Iterable[Message], rng: random.Random) -> ShuffledReplies:
    """Strip the node identities from the replies and permute them uniformly at random.

    Every reply with content is rebuilt around the same content with metadata that holds no
    source node, message id, reply-to id, task ids or creation time, and a common TTL; the
    run id, destination (the server), group id (the round) and message type are the same for
    every reply of a round. Replies carrying an error are dropped and counted, and their
    distinct reasons kept.

    Args:
        replies: The round's replies as the Grid returned them.
        rng: Generator from :func:`make_rng` (:class:`random.SystemRandom` by default).

    Returns:
        A :class:`ShuffledReplies`.
    """
    reports: list[Message] = []
    reasons: set[str] = set()
    num_errors = 0
    for reply in replies:
        if reply.has_error():
            num_errors += 1
            reasons.add(str(reply.error.reason or f"error code {reply.error.code}"))
        else:
            reports.append(_anonymous(reply))
    rng.shuffle(reports)
    return ShuffledReplies(reports=reports, num_errors=num_errors, error_reasons=sorted(reasons))
