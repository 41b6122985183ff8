"""What a node of the secure-aggregation mode checks of SecAgg+, and what it keeps to itself.

:class:`~shuffle_opacus.flower.SecAggCheckInMod` relies on three node-side pieces:
:func:`secagg_setup_problems` (the SecAgg+ set-up Flower stored on the node must be exactly the one
:func:`~shuffle_opacus.flower.secagg.parameters.secagg_parameters` derives from ``(C, σ, n, D,
d)``); :func:`unmask_problem`, **the dropout rule enforced by the node**: before sending the shares
that unmask a sum it checks that the server's list of missing nodes (:data:`NOT_IN_SUM_KEY`) is
there, holds at most ``D`` nodes and agrees with what Flower's part of the instruction says about
its neighbours; and the local record (:data:`LOCAL_RECORD_KEY` in the node's ``Context.state``,
never sent: rounds, failed or overrunning trainings, non-finite updates, refused unmaskings;
:func:`local_report`). The rule holds against a server that follows SecAgg+ but not the dropout
rule; not against one that tells different nodes different things, or counts nodes that do not
exist (``docs/flower.md``, "Dropouts").
"""

from __future__ import annotations

import math
from typing import Any

from flwr.app import ConfigRecord, Context
from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_STATE, Key

from .parameters import SecAggParameters

__all__ = [
    "LOCAL_COUNTERS",
    "LOCAL_RECORD_KEY",
    "NOT_IN_SUM_KEY",
    "local_report",
    "note",
    "open_round",
    "secagg_setup_problems",
    "unmask_problem",
]

#: Key, in the unmasking instruction's SecAgg+ ConfigRecord, of the ids of the round's nodes
#: that are missing from the sum (set by :class:`~shuffle_opacus.flower.SecAggCheckInFedAvg`).
NOT_IN_SUM_KEY = "shuffle-dp.not-in-sum"
#: Key of the node's local ConfigRecord in ``Context.state`` (it never leaves the node).
LOCAL_RECORD_KEY = "shuffle-dp.secagg-node"
#: Counters of the local record.
LOCAL_COUNTERS: tuple[str, ...] = (
    "rounds",
    "training-failed",
    "training-overran",
    "non-finite-update",
    "refused-unmask",
)
_OPEN = ("open-round", "num-nodes", "max-dropouts")


def _record(context: Context) -> ConfigRecord:
    records = context.state.config_records
    if LOCAL_RECORD_KEY not in records:
        records[LOCAL_RECORD_KEY] = ConfigRecord({key: 0 for key in LOCAL_COUNTERS})
    return records[LOCAL_RECORD_KEY]


def note(context: Context, counter: str) -> None:
    """Add one to a counter of the node's local record.

    Args:
        context: The node's Context.
        counter: One of :data:`LOCAL_COUNTERS`.

    Raises:
        ValueError: for an unknown counter.
    """
    if counter not in LOCAL_COUNTERS:
        raise ValueError(f"counter must be one of {', '.join(LOCAL_COUNTERS)}. Found {counter!r}.")
    record = _record(context)
    record[counter] = _count(record.get(counter)) + 1


def local_report(context: Context) -> dict[str, int]:
    """Return the node's local counters (:data:`LOCAL_COUNTERS`), zeros if none yet.

    Args:
        context: The node's Context.

    Returns:
        ``{counter: count}`` for this node and run.
    """
    record = context.state.config_records.get(LOCAL_RECORD_KEY)
    return {key: _count(record.get(key)) if record else 0 for key in LOCAL_COUNTERS}


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def open_round(context: Context, server_round: int, num_nodes: int, max_dropouts: int) -> None:
    """Remember, until the unmasking instruction, the round this node sent a masked vector for.

    Args:
        context: The node's Context.
        server_round: The round.
        num_nodes: ``n`` of the run, as this node accepted it.
        max_dropouts: ``D`` of the run, as this node accepted it.
    """
    record = _record(context)
    for key, value in zip(_OPEN, (server_round, num_nodes, max_dropouts), strict=True):
        record[key] = int(value)


def _int_list(value: Any) -> list[int] | None:
    if not isinstance(value, list) or any(
        isinstance(v, bool) or not isinstance(v, int) for v in value
    ):
        return None
    return [int(v) for v in value]


def unmask_problem(configs: ConfigRecord, context: Context) -> str | None:
    """Return why this node must not send its unmasking shares, or ``None`` (see module doc).

    Forgets the open round either way: a node unmasks at most once per masked vector.

    Args:
        configs: The SecAgg+ ConfigRecord of the unmasking instruction.
        context: The node's Context (its local record and Flower's SecAgg+ state).

    Returns:
        One line naming the problem, or ``None`` when the sum holds at least ``n − D`` nodes.
    """
    record = _record(context)
    opened = [record.get(key) for key in _OPEN]
    for key in _OPEN:
        if key in record:
            del record[key]
    if any(not isinstance(v, int) for v in opened):
        return "no masked vector of this node is waiting to be unmasked"
    n, dropouts = _count(opened[1]), _count(opened[2])
    active = _int_list(configs.get(Key.ACTIVE_NODE_ID_LIST))
    dead = _int_list(configs.get(Key.DEAD_NODE_ID_LIST))
    missing = _int_list(configs.get(NOT_IN_SUM_KEY))
    if active is None or dead is None:
        return "the unmasking instruction's lists of nodes are not lists of node ids"
    if missing is None:
        return (
            f"the unmasking instruction does not name the nodes missing from the sum "
            f"({NOT_IN_SUM_KEY}): this node cannot check that the sum holds at least "
            f"n - D = {n - dropouts} nodes"
        )
    listed = set(missing)
    if len(listed) != len(missing):
        return f"the list of nodes missing from the sum ({NOT_IN_SUM_KEY}) repeats a node"
    if len(listed) > dropouts:
        return (
            f"{len(listed)} of the round's {n} nodes are missing from the sum, more than "
            f"max_dropouts D = {dropouts}: the sum would hold fewer than n - D = {n - dropouts}"
        )
    node = int(context.node_id)
    if not set(dead) <= listed or listed & set(active) or node not in active:
        return (
            "the list of nodes missing from the sum contradicts SecAgg+'s lists of this "
            "node's neighbours"
        )
    state = context.state.config_records.get(RECORD_KEY_STATE)
    complete = state is not None and state.get("share_num") == state.get("sample_num") == n
    if complete and (len(set(active)) + len(set(dead)) != n or set(dead) != listed):
        return (
            f"with every node a neighbour, SecAgg+'s lists must cover the n = {n} nodes and "
            f"name the same missing nodes"
        )
    return None


def secagg_setup_problems(context: Context, params: SecAggParameters) -> list[str]:
    """Compare the SecAgg+ set-up this node received with the derived parameters.

    The clipping range must be equal, not merely close: the node rounds onto the grid it
    derives (:func:`~shuffle_opacus.flower.secagg.parameters.round_onto_grid`), and only that grid
    makes Flower's quantiser exact.

    Args:
        context: The node's Context (Flower's SecAgg+ state).
        params: The parameters derived from the run's ``(C, σ, n, D, d)``.

    Returns:
        One description per difference (empty when they agree).
    """
    state = context.state.config_records.get(RECORD_KEY_STATE)
    if state is None:
        return ["no SecAgg+ set-up on this node"]
    expected: dict[str, Any] = {
        "sample_num": params.num_nodes,
        "share_num": params.num_shares,
        "threshold": params.threshold,
        "target_range": params.quantization_range,
        "mod_range": params.modulus_range,
    }
    problems = [
        f"{k} = {state.get(k)!r}, expected {v!r}" for k, v in expected.items() if state.get(k) != v
    ]
    for key, want in (("clipping_range", params.clipping_range), ("max_weight", 1.0)):
        got = state.get(key)
        if not isinstance(got, float) or not math.isfinite(got) or got != want:
            problems.append(f"{key} = {got!r}, expected {want!r}")
    return problems
