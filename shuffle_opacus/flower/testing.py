"""Testing helpers for the Flower part: a ``Grid`` that runs a ``ClientApp`` in this process.

:class:`InProcessGrid` stands in for the SuperLink and SuperNodes, for tests and benchmarks:
``push_messages`` hands every instruction to the ``ClientApp`` of its destination node, one after
the other, and keeps the reply for ``pull_messages``. No Ray, no sockets, no subprocesses. Each
node has its own ``Context`` (``partition-id`` and ``num-partitions`` as in Flower's simulation,
a ``state`` that persists across rounds); the ``ClientApp`` gets a deep copy of the instruction;
an exception it raises becomes an error reply; replies carry the node's id as their source. It
is not a model of timing, failures or concurrency. :attr:`InProcessGrid.deliveries` records the
destination nodes of every ``push_messages`` call. ``shuffle_opacus.flower`` exports it too.
"""

from __future__ import annotations

import copy
import uuid
from collections.abc import Callable, Iterable, Mapping
from typing import Any, cast

from flwr.app import Context, Error, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid
from flwr.supercore.task_identity import TaskIdentity

from ..common.validation import check_int

__all__ = ["FIRST_NODE_ID", "SERVER_NODE_ID", "InProcessGrid"]

#: Node id of the first node; node ``i`` (partition ``i``) has id ``FIRST_NODE_ID + i``.
FIRST_NODE_ID = 1001
#: Node id the server's instructions are sent from (Flower's SuperLink uses 1 too).
SERVER_NODE_ID = 1
_CLIENT_APP_RAISED_EXCEPTION = 2


class InProcessGrid(Grid):
    """A Grid whose nodes run ``client_app`` in this process (see the module docstring).

    Attributes:
        client_app: The ``ClientApp`` every node runs.
        contexts: Each node's ``Context``, by node id.
        deliveries: Destination node ids of each ``push_messages`` call, in call order.
    """

    def __init__(
        self,
        client_app: ClientApp,
        num_nodes: int,
        *,
        run_config: Mapping[str, Any] | None = None,
        node_config: Callable[[int], Mapping[str, Any]] | None = None,
        run_id: int = 1,
    ) -> None:
        """Create ``num_nodes`` nodes running ``client_app``.

        Sets Flower's ``TaskIdentity`` (run id, server node id, task id) of this process, which
        ``Message`` reads when the strategy builds instructions.

        Args:
            client_app: The ``ClientApp``.
            num_nodes: Number of nodes (integer >= 1).
            run_config: The run config every node sees (``Context.run_config``).
            node_config: ``node_config(i)`` for node ``i``; by default
                ``{"partition-id": i, "num-partitions": num_nodes}``.
            run_id: Run id (integer >= 1).

        Raises:
            ValueError: for an argument outside its range.
        """
        num_nodes = check_int("num_nodes", num_nodes, minimum=1)
        run_id = check_int("run_id", run_id, minimum=1)
        self.client_app = client_app
        self.contexts: dict[int, Context] = {}
        for i in range(num_nodes):
            config = (
                {"partition-id": i, "num-partitions": num_nodes}
                if node_config is None
                else dict(node_config(i))
            )
            self.contexts[FIRST_NODE_ID + i] = Context(
                run_id=run_id,
                node_id=FIRST_NODE_ID + i,
                node_config=cast(Any, config),
                state=RecordDict(),
                run_config=dict(run_config or {}),
            )
        self.deliveries: list[list[int]] = []
        self._replies: dict[str, Message] = {}
        self._run: Any = None
        TaskIdentity.run_id = run_id
        TaskIdentity.node_id = SERVER_NODE_ID
        TaskIdentity.task_id = 0

    def set_run(self, run: Any) -> None:
        """Set the run (Flower's ``Run``; kept, not used)."""
        self._run = run

    @property
    def run(self) -> Any:
        """The run set by :meth:`set_run` (``None`` by default)."""
        return self._run

    def create_message(
        self,
        content: RecordDict,
        message_type: str,
        dst_node_id: int,
        group_id: str,
        ttl: float | None = None,
    ) -> Message:
        """Return an instruction to ``dst_node_id``."""
        return Message(content, dst_node_id, message_type, ttl=ttl, group_id=group_id)

    def get_node_ids(self) -> list[int]:
        """Return the ids of all nodes (all of them are always connected)."""
        return list(self.contexts)

    def _deliver(self, message: Message) -> Message:
        node = message.metadata.dst_node_id
        if node not in self.contexts:
            raise ValueError(f"dst_node_id {node} is not a node of this grid.")
        received = copy.deepcopy(message)
        try:
            return self.client_app(received, self.contexts[node])
        except Exception as exc:  # noqa: BLE001 - the runtime turns it into an error reply
            reason = f"{type(exc)}:<'{exc}'>"
            return Message(
                Error(code=_CLIENT_APP_RAISED_EXCEPTION, reason=reason), reply_to=received
            )

    def push_messages(self, messages: Iterable[Message]) -> list[str]:
        """Run each instruction on its node now; return the message ids."""
        ids = []
        nodes = []
        for message in messages:
            message_id = uuid.uuid4().hex
            message.metadata.__dict__["_message_id"] = message_id  # the SuperLink's job
            nodes.append(message.metadata.dst_node_id)
            self._replies[message_id] = self._deliver(message)
            ids.append(message_id)
        self.deliveries.append(nodes)
        return ids

    def pull_messages(self, message_ids: Iterable[str]) -> list[Message]:
        """Return (and forget) the replies to ``message_ids``."""
        return [self._replies.pop(i) for i in message_ids if i in self._replies]

    def send_and_receive(
        self, messages: Iterable[Message], *, timeout: float | None = None
    ) -> list[Message]:
        """Push the instructions and return all their replies (``timeout`` is not needed)."""
        return self.pull_messages(self.push_messages(messages))
