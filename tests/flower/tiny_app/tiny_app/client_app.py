"""ClientApp: node i moves every weight by (i + 1) / 10; the privacy mod of the run's mode
clips and noises the update (trusted-server mode) or checks in, clips, noises and hands it to
SecAgg+ (secure-aggregation mode)."""

from __future__ import annotations

from flwr.app import Array, ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from shuffle_opacus.flower import LocalShuffleDPMod, PrivacyModeMod, SecAggCheckInMod

app = ClientApp(
    mods=[
        PrivacyModeMod(
            trusted_server=LocalShuffleDPMod(min_noise_multiplier=0.5),
            # The training below takes microseconds: 0.05 s of padding is far above it.
            secagg=SecAggCheckInMod(min_noise_multiplier=0.5, reply_after=0.05),
        )
    ]
)


@app.train()
def train(msg: Message, context: Context) -> Message:
    """Return the received weights shifted by the node's own amount (and a metric to strip)."""
    shift = (int(context.node_config["partition-id"]) + 1) / 10
    arrays = ArrayRecord(
        {name: Array(a.numpy() + shift) for name, a in msg.content["arrays"].items()}
    )
    metrics = MetricRecord({"num-examples": 600, "private-loss": shift})
    return Message(RecordDict({"arrays": arrays, "metrics": metrics}), reply_to=msg)
