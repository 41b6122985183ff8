"""Small ClientApps for the Flower tests: numpy models whose updates the tests control."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from shuffle_opacus.flower import LocalShuffleDPMod

SECRET = "node-secret-7d1f"

#: An update function: (node's partition id, received arrays) -> arrays to return.
UpdateFn = Callable[[int, dict[str, np.ndarray]], dict[str, np.ndarray]]


def shift_update(scale: float = 1.0) -> UpdateFn:
    """Node i returns received + scale * (i + 1) * ones (an update of norm scale(i+1)sqrt(d))."""

    def update(pid: int, received: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {k: v + np.float32(scale * (pid + 1)) for k, v in received.items()}

    return update


def coordinate_update(scale: float = 0.5) -> UpdateFn:
    """Node i adds ``scale`` to coordinate i of the first array (distinct directions)."""

    def update(pid: int, received: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        out = {k: v.copy() for k, v in received.items()}
        first = next(iter(out))
        out[first].reshape(-1)[pid % out[first].size] += np.float32(scale)
        return out

    return update


def numpy_app(
    update: UpdateFn,
    *,
    min_noise_multiplier: float = 0.0,
    mod: LocalShuffleDPMod | None = None,
    with_mod: bool = True,
    leak: bool = True,
    extra_mods: list | None = None,
) -> ClientApp:
    """A ClientApp whose train step returns ``update(pid, received)``.

    With ``leak`` the training code also returns metrics, a config record and a second metric
    record that a privacy mod must not let through. The default mod accepts noiseless runs
    (σ = 0), so that tests can see the clipped updates exactly.
    """
    default = LocalShuffleDPMod(min_noise_multiplier=min_noise_multiplier, allow_noiseless=True)
    mods = [] if not with_mod else [mod or default]
    app = ClientApp(mods=mods + list(extra_mods or []))

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        received = {k: v.numpy().copy() for k, v in msg.content["arrays"].items()}
        pid = int(context.node_config["partition-id"])
        new = update(pid, received)
        content = {"arrays": ArrayRecord({k: Array(np.asarray(v)) for k, v in new.items()})}
        if leak:
            content["metrics"] = MetricRecord({"num-examples": 600, "loss": 0.25, "pid": pid})
            content["private"] = ConfigRecord({"secret": SECRET})
        else:
            content["metrics"] = MetricRecord({"num-examples": 1})
        return Message(RecordDict(content), reply_to=msg)

    @app.evaluate()
    def evaluate(msg: Message, context: Context) -> Message:
        return Message(
            RecordDict({"metrics": MetricRecord({"num-examples": 5, "accuracy": 0.9})}),
            reply_to=msg,
        )

    @app.query()
    def query(msg: Message, context: Context) -> Message:
        return Message(RecordDict({"answer": ConfigRecord({"secret": SECRET})}), reply_to=msg)

    return app


def model(d: int = 6, shapes: tuple = ((2, 3), (4,))) -> ArrayRecord:
    """An ArrayRecord of float32 zeros with the given shapes (names a, b, ...)."""
    names = "abcdefgh"
    return ArrayRecord(
        {names[i]: Array(np.zeros(shape, dtype=np.float32)) for i, shape in enumerate(shapes)}
    )


def context(pid: int = 0, n: int = 1, node_config: dict | None = None) -> Context:
    """A node's Context as Flower's simulation builds it."""
    config = {"partition-id": pid, "num-partitions": n, **(node_config or {})}
    return Context(
        run_id=1, node_id=1001 + pid, node_config=config, state=RecordDict(), run_config={}
    )


def instruction(
    arrays: ArrayRecord, config: dict, *, node: int = 1001, message_type: str = "train"
) -> Message:
    """A server instruction to ``node`` carrying ``arrays`` and ``config``."""
    from flwr.supercore.task_identity import TaskIdentity

    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 1, 0
    content = RecordDict({"arrays": arrays, "config": ConfigRecord(dict(config))})
    message = Message(content, node, message_type)
    message.metadata.__dict__["_message_id"] = "m-1"
    return message


def secagg_spy(recorded: dict) -> Callable:
    """SecAgg+'s client mod, instrumented on the node: it records the plain report (the arrays
    the privacy step hands to SecAgg+ before quantisation and masking) by (round, node id)."""
    from flwr.client.mod import secaggplus_mod
    from flwr.common import parameters_to_ndarrays
    from flwr.compat.common import recorddict_compat as compat

    def mod(msg: Message, ctx: Context, call_next: Callable) -> Message:
        def step(inner: Message, c: Context) -> Message:
            reply = call_next(inner, c)
            fitres = compat.recorddict_to_fitres(reply.content, keep_input=True)
            server_round = int(inner.content.config_records["fitins.config"]["server-round"])
            recorded[(server_round, int(c.node_id))] = parameters_to_ndarrays(fitres.parameters)
            return reply

        return secaggplus_mod(msg, ctx, step)

    return mod


def drop_at(app: Callable, drops: dict[tuple[int, str], set[int]]) -> Callable:
    """A ClientApp stand-in: the nodes in ``drops[(round, stage)]`` fail at that SecAgg+ stage
    (``setup``, ``share_keys``, ``collect_masked_vectors``, ``unmask``) of that round."""

    def call(msg: Message, ctx: Context) -> Message:
        configs = msg.content.config_records.get("secaggplus_configs")
        if configs is not None:
            key = (int(msg.metadata.group_id), str(configs.get("stage")))
            if int(ctx.node_id) in drops.get(key, set()):
                raise ConnectionError("node lost")
        return app(msg, ctx)

    return call


def deviant_secagg(
    *,
    report: Callable | None = None,
    masked: Callable | None = None,
    reply: Callable | None = None,
) -> Callable:
    """SecAgg+'s client mod on a node that does not follow the protocol (for
    ``SecAggCheckInMod(secure_aggregation_mod=...)``).

    ``report(arrays, state)`` replaces the plain report (float arrays, count last) before
    Flower quantises it; ``masked(arrays, state)`` replaces the masked integer arrays (weight
    factor first, count last) after; ``reply(stage, content)`` edits the reply's RecordDict at
    any stage. ``state`` is the node's SecAgg+ state (clipping range, target range, modulus).
    """
    from flwr.client.mod import secaggplus_mod
    from flwr.common import (
        bytes_to_ndarray,
        ndarray_to_bytes,
        ndarrays_to_parameters,
        parameters_to_ndarrays,
    )
    from flwr.compat.common import recorddict_compat as compat

    def mod(msg: Message, ctx: Context, call_next: Callable) -> Message:
        stage = msg.content.config_records["secaggplus_configs"].get("stage")

        def step(inner: Message, c: Context) -> Message:
            out = call_next(inner, c)
            if report is None:
                return out
            fitres = compat.recorddict_to_fitres(out.content, keep_input=True)
            state = c.state.config_records["secaggplus_state"]
            arrays = report(parameters_to_ndarrays(fitres.parameters), state)
            fitres.parameters = ndarrays_to_parameters(arrays)
            return Message(compat.fitres_to_recorddict(fitres, keep_input=False), reply_to=out)

        out = secaggplus_mod(msg, ctx, step)
        if stage == "collect_masked_vectors" and masked is not None:
            record = out.content.config_records["secaggplus_configs"]
            state = ctx.state.config_records["secaggplus_state"]
            arrays = masked([bytes_to_ndarray(b) for b in record["masked_params"]], state)
            record["masked_params"] = [ndarray_to_bytes(a) for a in arrays]
        if reply is not None:
            reply(stage, out.content)
        return out

    return mod


def mixed(app: Callable, other: Callable, nodes: set[int]) -> Callable:
    """A ClientApp stand-in: the nodes in ``nodes`` run ``other``, the rest ``app``."""

    def call(msg: Message, ctx: Context) -> Message:
        return (other if int(ctx.node_id) in nodes else app)(msg, ctx)

    return call
