"""Flower's SecAgg+ workflow with the checks of the secure-aggregation mode's server.

:class:`SecAggWorkflow` is ``flwr.server.workflow.SecAggPlusWorkflow`` (Flower 1.41's SecAgg+,
Bell et al., CCS 2020, IACR ePrint 2020/704) with three additions made around Flower's stages,
whose code runs unchanged: **the dropout rule** (a round that ends the masked-vector stage with
fewer than ``min_in_sum = n − D`` vectors halts before unmasking); **the missing nodes, stated**
(every unmasking instruction carries the same list of the round's nodes not in the sum,
:data:`~shuffle_opacus.flower.secagg.node.NOT_IN_SUM_KEY`, so each node checks the rule itself);
**well-formed replies** (before Flower reads a reply, its SecAgg+ part is checked against what
the stage expects, and a reply that does not fit raises
:class:`~shuffle_opacus.flower.ProtocolViolationError` with one line naming the stage and the
problem). It also keeps, for the last round, the stage where the round halted and the distinct
reasons of the nodes' error replies (no node identities).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from logging import WARNING
from typing import Any

import numpy as np
from flwr.app import ConfigRecord, Message, RecordDict
from flwr.common import bytes_to_ndarray, log
from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS, Key
from flwr.compat.common import recorddict_compat as compat
from flwr.server.compat.legacy_context import LegacyContext
from flwr.server.workflow import SecAggPlusWorkflow
from flwr.server.workflow.constant import MAIN_CONFIGS_RECORD
from flwr.server.workflow.constant import Key as WorkflowKey
from flwr.serverapp import Grid

from ..checkin_base import ProtocolViolationError
from .node import NOT_IN_SUM_KEY

__all__ = ["STAGES", "SecAggWorkflow", "reply_problem"]

#: The four SecAgg+ stages, as the strategy's messages name them.
STAGES: tuple[str, ...] = ("setup", "share keys", "collect masked vectors", "unmask")


def _list(value: Any, kind: type) -> list[Any] | None:
    """``value`` if it is a list of ``kind`` (booleans are not integers here), else ``None``."""
    if isinstance(value, list) and all(
        isinstance(v, kind) and not isinstance(v, bool) for v in value
    ):
        return value
    return None


def reply_problem(
    stage: str,
    reply: Message,
    *,
    shapes: list[tuple[int, ...]] | None = None,
    modulus: int = 2**32,
    nodes: set[int] | None = None,
) -> str | None:
    """Return what is wrong with a node's (non-error) reply to a SecAgg+ stage, or ``None``.

    Args:
        stage: One of :data:`STAGES`.
        reply: The node's reply.
        shapes: In the masked-vector stage, the shapes of the masked arrays (Flower's weight
            factor, the model's arrays, the count).
        modulus: ``M``: masked integers lie in ``[0, M)``.
        nodes: In the unmasking stage, the ids of the round's nodes (owners of shares).

    Returns:
        One short description, or ``None`` for a well-formed reply.
    """
    if not reply.has_content():
        return "no content"
    configs = reply.content.config_records.get(RECORD_KEY_CONFIGS)
    if not isinstance(configs, ConfigRecord):
        return f"no {RECORD_KEY_CONFIGS} record"
    if stage == STAGES[0]:
        if not all(isinstance(configs.get(k), bytes) for k in (Key.PUBLIC_KEY_1, Key.PUBLIC_KEY_2)):
            return "the public keys are missing or not bytes"
    elif stage == STAGES[1]:
        dsts = _list(configs.get(Key.DESTINATION_LIST), int)
        ctxts = _list(configs.get(Key.CIPHERTEXT_LIST), bytes)
        if dsts is None or ctxts is None or len(dsts) != len(ctxts):
            return "the destinations and ciphertexts are not two lists of equal length"
    elif stage == STAGES[2]:
        return _masked_vector_problem(reply.content, configs, shapes or [], modulus)
    elif stage == STAGES[3]:
        nids = _list(configs.get(Key.NODE_ID_LIST), int)
        shares = _list(configs.get(Key.SHARE_LIST), bytes)
        if nids is None or shares is None or len(nids) != len(shares):
            return "the node ids and shares are not two lists of equal length"
        if nodes is not None and not set(nids) <= nodes:
            return "shares of nodes that are not in the round"
    return None


def _masked_vector_problem(
    content: RecordDict, configs: ConfigRecord, shapes: list[tuple[int, ...]], modulus: int
) -> str | None:
    masked = _list(configs.get(Key.MASKED_PARAMETERS), bytes)
    if masked is None or len(masked) != len(shapes):
        count = "no list of" if masked is None else len(masked)
        return f"{count} masked arrays where {len(shapes)} were expected"
    for i, (data, shape) in enumerate(zip(masked, shapes, strict=True)):
        try:
            array = bytes_to_ndarray(data)
        except Exception:  # noqa: BLE001 - any failure to read is the node's
            return f"masked array {i} is not a serialised array"
        if not np.issubdtype(array.dtype, np.integer):
            return f"masked array {i} has dtype {array.dtype}, not integers"
        if tuple(array.shape) != tuple(shape):
            return f"masked array {i} has shape {tuple(array.shape)}, expected {tuple(shape)}"
        if array.size and (int(array.min()) < 0 or int(array.max()) >= modulus):
            return f"masked array {i} has values outside [0, {modulus})"
    try:
        compat.recorddict_to_fitres(content, keep_input=True)
    except Exception:  # noqa: BLE001 - a missing or unreadable FitRes part
        return "its FitRes part (status, weight, metrics) is missing or unreadable"
    return None


class _CheckedGrid(Grid):
    """A Grid that edits a stage's instructions and checks the replies before Flower reads them."""

    def __init__(
        self,
        grid: Grid,
        check: Callable[[Message], str | None],
        describe: Callable[[str], str],
        edit: Callable[[Message], None] | None = None,
    ) -> None:
        self._grid, self._check, self._describe, self._edit = grid, check, describe, edit

    def set_run(self, run: Any) -> None:  # noqa: D102 - delegated
        self._grid.set_run(run)

    @property
    def run(self) -> Any:  # noqa: D102 - delegated
        return self._grid.run

    def create_message(self, *args: Any, **kwargs: Any) -> Message:  # noqa: D102 - delegated
        return self._grid.create_message(*args, **kwargs)

    def get_node_ids(self) -> Iterable[int]:  # noqa: D102 - delegated
        return self._grid.get_node_ids()

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:  # noqa: D102
        messages = list(messages)
        for message in messages if self._edit is not None else []:
            self._edit(message)  # type: ignore[misc]
        return self._grid.push_messages(messages)

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:  # noqa: D102
        return self._checked(self._grid.pull_messages(message_ids))

    def send_and_receive(  # noqa: D102 - edits, delegates, checks
        self, messages: Iterable[Message], *, timeout: float | None = None
    ) -> Iterable[Message]:
        messages = list(messages)
        for message in messages if self._edit is not None else []:
            self._edit(message)  # type: ignore[misc]
        return self._checked(self._grid.send_and_receive(messages, timeout=timeout))

    def _checked(self, replies: Iterable[Message]) -> list[Message]:
        replies = list(replies)
        for reply in replies:
            if reply.has_error():
                continue
            problem = self._check(reply)
            if problem is not None:
                raise ProtocolViolationError(self._describe(problem))
        return replies


class SecAggWorkflow(SecAggPlusWorkflow):
    """Flower's SecAgg+ workflow with the mode's checks (see the module docstring).

    Attributes:
        min_in_sum: ``n − D``: the fewest masked vectors a round may unmask.
        shapes: The shapes of the model's arrays (set by the strategy before each round).
        halted_at: The stage where the last round halted (``None`` if it did not).
        reasons: Distinct reasons of the nodes' error replies in the last round.
    """

    def __init__(self, *, min_in_sum: int, **kwargs: Any) -> None:
        """Create the workflow.

        Args:
            min_in_sum: ``n − D``.
            **kwargs: ``SecAggPlusWorkflow``'s arguments
                (:meth:`~shuffle_opacus.flower.secagg.parameters.SecAggParameters.workflow_arguments`
                and ``timeout``).
        """
        super().__init__(**kwargs)
        self.min_in_sum = min_in_sum
        self.shapes: list[tuple[int, ...]] = []
        self.halted_at: str | None = None
        self.stage: str | None = None
        self.reasons: set[str] = set()
        self._round = 0

    def __call__(self, grid: Grid, context: Any) -> None:
        """Run one round (Flower's ``SecAggPlusWorkflow.__call__``)."""
        self.halted_at, self.stage, self.reasons = None, None, set()
        config = context.state.config_records[MAIN_CONFIGS_RECORD]
        self._round = int(config.get(WorkflowKey.CURRENT_ROUND, 0))
        super().__call__(grid, context)

    def _grid(
        self,
        grid: Grid,
        stage: str,
        state: Any,
        edit: Callable[[Message], None] | None = None,
    ) -> Grid:
        self.stage = stage
        sizes = [(1,), *self.shapes, (1,)]
        nodes = set(state.sampled_node_ids)

        def check(reply: Message) -> str | None:
            return reply_problem(
                stage, reply, shapes=sizes, modulus=self.modulus_range, nodes=nodes
            )

        def describe(problem: str) -> str:
            return (
                f"round {self._round}: a node's reply at the '{stage}' stage of SecAgg+ is "
                f"malformed ({problem})"
            )

        return _CheckedGrid(grid, check, describe, edit)

    def _watch(self, stage: str, ok: bool, state: Any) -> bool:
        for failure in state.failures:
            error = failure.args[0] if failure.args else failure
            self.reasons.add(str(getattr(error, "reason", error)))
        if not ok and self.halted_at is None:
            self.halted_at = stage
        return ok

    def setup_stage(self, grid: Grid, context: LegacyContext, state: Any) -> bool:
        """Flower's set-up stage, replies checked."""
        checked = self._grid(grid, STAGES[0], state)
        return self._watch(STAGES[0], super().setup_stage(checked, context, state), state)

    def share_keys_stage(self, grid: Grid, context: LegacyContext, state: Any) -> bool:
        """Flower's key-sharing stage, replies checked."""
        checked = self._grid(grid, STAGES[1], state)
        return self._watch(STAGES[1], super().share_keys_stage(checked, context, state), state)

    def collect_masked_vectors_stage(self, grid: Grid, context: LegacyContext, state: Any) -> bool:
        """Flower's masked-vector stage, replies checked; halts below ``min_in_sum`` vectors."""
        checked = self._grid(grid, STAGES[2], state)
        ok = super().collect_masked_vectors_stage(checked, context, state)
        if ok and len(state.active_node_ids) < self.min_in_sum:
            log(
                WARNING,
                "only %d masked vectors, fewer than n - D = %d: the sum is not unmasked",
                len(state.active_node_ids),
                self.min_in_sum,
            )
            ok = False
        return self._watch(STAGES[2], ok, state)

    def unmask_stage(self, grid: Grid, context: LegacyContext, state: Any) -> bool:
        """Flower's unmasking stage; every instruction names the nodes missing from the sum."""
        missing = sorted(int(i) for i in set(state.sampled_node_ids) - set(state.active_node_ids))

        def name_missing(message: Message) -> None:
            message.content.config_records[RECORD_KEY_CONFIGS][NOT_IN_SUM_KEY] = list(missing)

        checked = self._grid(grid, STAGES[3], state, name_missing)
        return self._watch(STAGES[3], super().unmask_stage(checked, context, state), state)
