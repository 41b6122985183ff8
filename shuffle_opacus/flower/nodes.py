"""Reaching the nodes of a check-in run: waiting for exactly ``n``, and the start-up check.

:func:`wait_for_population` waits until exactly the population the accountant uses is connected;
:func:`check_nodes` asks every node's mod to accept the run's privacy parameters before any
round. Both raise :class:`ProtocolViolationError` in one line.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from logging import INFO

from flwr.app import ConfigRecord, Message, MessageType, RecordDict
from flwr.common import log
from flwr.serverapp import Grid

from .mod import REFUSED

__all__ = ["ProtocolViolationError", "check_nodes", "wait_for_population"]


class ProtocolViolationError(RuntimeError):
    """A reply, the population or a dropout does not fit the accounted protocol."""


def wait_for_population(grid: Grid, num_nodes: int, timeout: float) -> list[int]:
    """Wait until exactly ``num_nodes`` nodes are connected; return their ids, sorted.

    Args:
        grid: The Grid of the ServerApp.
        num_nodes: The population ``n`` the accountant uses.
        timeout: Seconds to wait.

    Returns:
        The ids of the connected nodes.

    Raises:
        ProtocolViolationError: if more than ``num_nodes`` are connected, or fewer after
            ``timeout`` seconds.
    """
    deadline = time.monotonic() + timeout
    while True:
        ids = sorted(int(i) for i in grid.get_node_ids())
        if len(ids) > num_nodes:
            raise ProtocolViolationError(
                f"{len(ids)} nodes are connected but num_nodes = {num_nodes} is the "
                f"population the accountant uses; start exactly num_nodes nodes."
            )
        if len(ids) == num_nodes:
            return ids
        left = deadline - time.monotonic()
        if left < 0:
            raise ProtocolViolationError(
                f"only {len(ids)} of num_nodes = {num_nodes} nodes connected within {timeout:g} s."
            )
        log(INFO, "waiting for nodes: %d of %d connected", len(ids), num_nodes)
        time.sleep(min(1.0, left + 1e-3))


def check_nodes(
    grid: Grid,
    node_ids: list[int],
    *,
    config: ConfigRecord,
    config_key: str,
    echo_problems: Callable[[RecordDict], list[str]],
    mod_name: str,
    timeout: float,
) -> None:
    """Run the start-up check: every node's mod must accept the run's parameters.

    Sends every node a training instruction holding ``config`` (the run's parameters and the
    flag ``shuffle-dp.handshake``) and no model; each node's mod answers with its echo, or
    refuses, without running the training code. Nothing is accounted: no data is touched.

    Args:
        grid: The Grid of the ServerApp.
        node_ids: The ``n`` nodes of the run.
        config: The instruction's ConfigRecord.
        config_key: Its key in the instruction's RecordDict.
        echo_problems: What is wrong with one reply's content (empty: it is the right echo).
        mod_name: The mod a node must run first, named in the error.
        timeout: Seconds to wait for the answers (> 0).

    Raises:
        ProtocolViolationError: naming, in one line, what the nodes that disagree (or did not
            answer, or run no mod) replied.
    """
    messages = [
        Message(
            content=RecordDict({config_key: config}),
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
                reason += f" (is {mod_name} the first mod of the ClientApp?)"
            problems.add(reason)
            continue
        problems.update(echo_problems(reply.content))
    missing = len(node_ids) - len(replies)
    if missing:
        problems.add(f"{missing} nodes did not answer within {timeout:g} s")
    if problems:
        raise ProtocolViolationError(
            f"start-up check: the nodes do not accept this run's privacy parameters "
            f"({'; '.join(sorted(problems))}); no round was run."
        )
    log(INFO, "start-up check: all %d nodes accept the privacy parameters", len(node_ids))
