"""The ClientApp: local SGD on the node's images, privatised by the mod of the run's trust mode.

``PrivacyModeMod`` is the first (outermost) mod. It hands each instruction to the privacy mod
of its mode: ``LocalShuffleDPMod`` in the trusted-server mode (the reply is the clipped and
noised update), ``SecAggCheckInMod`` in the secure-aggregation mode (the node flips its own
check-in coin, and its clipped and noised update, or zeros, goes into Flower's SecAgg+ sum).
Either way the training loss and the number of examples computed below never leave the node.
The noise floor is ``MIN_NOISE_MULTIPLIER``; a SuperNode's operator can raise it with
``--node-config "min-noise-multiplier=..."``, lower the check-in ceiling of the
secure-aggregation mode with ``max-checkin-rate=...``, raise its padding with
``reply-after=...``, and refuse the trusted-server mode with ``privacy-mode=secagg``.

In the secure-aggregation mode every node replies ``reply-after`` seconds (run config, default
5) after the masked-vector instruction, whatever its training took; a training still running
then gives the zero update for the round (logged on the node).
"""

from __future__ import annotations

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from shuffle_opacus.flower import LocalShuffleDPMod, PrivacyModeMod, SecAggCheckInMod

from .task import initial_model, load_weights, local_train, node_data, setting

#: The smallest noise multiplier this ClientApp accepts from a server.
MIN_NOISE_MULTIPLIER = 0.5

app = ClientApp(
    mods=[
        PrivacyModeMod(
            trusted_server=LocalShuffleDPMod(min_noise_multiplier=MIN_NOISE_MULTIPLIER),
            secagg=SecAggCheckInMod(
                min_noise_multiplier=MIN_NOISE_MULTIPLIER,
                reply_after=lambda context: setting(context.run_config, "reply-after", float),
            ),
        )
    ]
)


def _data(context: Context) -> tuple[np.ndarray, np.ndarray]:
    """Return the node's images and labels, kept in the node's state after the first round."""
    cached = context.state.get("node-data")
    if isinstance(cached, ArrayRecord):
        return cached["images"].numpy(), cached["labels"].numpy()
    rc = context.run_config
    images, labels = node_data(
        setting(context.node_config, "partition-id", int),
        setting(context.node_config, "num-partitions", int),
        setting(rc, "examples-per-node", int),
        setting(rc, "data-seed", int),
    )
    context.state["node-data"] = ArrayRecord({"images": Array(images), "labels": Array(labels)})
    return images, labels


@app.train()
def train(msg: Message, context: Context) -> Message:
    """Train the received model on this node's data; reply with the trained weights."""
    torch.set_num_threads(1)
    rc = context.run_config
    images, labels = _data(context)
    model = initial_model(setting(rc, "model", str), 0)
    load_weights(model, msg.content["arrays"])
    server_round = int(msg.content["config"]["server-round"])
    loss = local_train(
        model,
        images,
        labels,
        epochs=setting(rc, "local-epochs", int),
        batch_size=setting(rc, "local-batch-size", int),
        lr=setting(rc, "local-lr", float),
        steps=setting(rc, "local-steps", int) if "local-steps" in rc else 0,
        seed=server_round * 1_000_003 + setting(context.node_config, "partition-id", int),
    )
    content = RecordDict(
        {
            "arrays": ArrayRecord(model.state_dict()),
            # Stripped by the mod: only the protocol's own metrics leave the node.
            "metrics": MetricRecord({"num-examples": len(labels), "train-loss": loss}),
        }
    )
    return Message(content, reply_to=msg)
