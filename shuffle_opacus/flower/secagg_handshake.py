"""The start-up check of the secure-aggregation mode: every node accepts the run's parameters.

Before the first round :class:`~shuffle_opacus.flower.SecAggCheckInFedAvg` sends every node a
training instruction with the privacy parameters, the mode, ``n``, ``D`` and the flag
``shuffle-dp.handshake``, and no model. Each node's
:class:`~shuffle_opacus.flower.SecAggCheckInMod` answers with its echo, or refuses (noise floor,
check-in ceiling, sensitivity convention, mode), before SecAgg+ and without running the
training code. :func:`check_nodes` raises one line naming every distinct disagreement.
"""

from __future__ import annotations

from collections.abc import Mapping
from logging import INFO
from typing import Any

from flwr.app import ConfigRecord, Message, MessageType, RecordDict
from flwr.common import log
from flwr.serverapp import Grid

from .config import ECHO_RECORD_KEY, HANDSHAKE_KEY, echo_differences
from .mod import REFUSED
from .strategy import ProtocolViolationError

__all__ = ["check_nodes"]


def check_nodes(grid: Grid, node_ids: list[int], echo: Mapping[str, Any], timeout: float) -> None:
    """Run the start-up check on ``node_ids`` (see the module docstring).

    Nothing is accounted: no data is touched.

    Args:
        grid: The Grid of the ServerApp.
        node_ids: The ``n`` nodes of the run.
        echo: The echo every node must send back
            (:func:`~shuffle_opacus.flower.config.secagg_echo`).
        timeout: Seconds to wait for the answers (> 0).

    Raises:
        ProtocolViolationError: naming, in one line, what the disagreeing nodes replied.
    """
    config = ConfigRecord({**echo, HANDSHAKE_KEY: True})
    messages = [
        Message(
            content=RecordDict({"config": config}),
            dst_node_id=node,
            message_type=MessageType.TRAIN,
        )
        for node in node_ids
    ]
    replies = list(grid.send_and_receive(messages, timeout=timeout))
    problems: set[str] = set()
    for reply in replies:
        if reply.has_error():
            reason = str(reply.error.reason or f"error code {reply.error.code}")
            if reply.error.code != REFUSED:
                reason += " (is SecAggCheckInMod the first mod of the ClientApp?)"
            problems.add(reason)
            continue
        records = reply.content.config_records
        if ECHO_RECORD_KEY not in records or len(reply.content.array_records):
            problems.add(
                "a reply is not the secure-aggregation mode's echo (does the node run "
                "SecAggCheckInMod?)"
            )
            continue
        problems.update(echo_differences(echo, records[ECHO_RECORD_KEY]))
    missing = len(node_ids) - len(replies)
    if missing:
        problems.add(f"{missing} nodes did not answer within {timeout:g} s")
    if problems:
        raise ProtocolViolationError(
            f"start-up check: the nodes do not accept this run's privacy parameters "
            f"({'; '.join(sorted(problems))}); no round was run."
        )
    log(INFO, "start-up check: all %d nodes accept the privacy parameters", len(node_ids))
