"""ServerApp: the check-in protocol on a 10-weight numpy model; writes every round's ε.

``mode = "trusted-server"`` runs ShuffleCheckInFedAvg, ``mode = "secagg"`` runs
SecAggCheckInFedAvg (node-side check-in under SecAgg+), and ``mode = "both"`` runs the first
and then the second from where it ended, ``num-server-rounds`` each, in one run (one start of
Flower's runtime for the test suite). With ``out-dir`` set (absolute),
``OUT-DIR/run-<run id>.json`` holds, for each mode run, the round metrics the strategy recorded
and the final weights.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from flwr.app import Array, ArrayRecord, Context
from flwr.serverapp import Grid, ServerApp

from shuffle_opacus.flower import (
    SecAggCheckInFedAvg,
    ShuffleCheckInFedAvg,
    ShufflePrivacyConfig,
)

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Run the protocol for ``num-server-rounds`` rounds."""
    rc = context.run_config
    privacy = ShufflePrivacyConfig(
        noise_multiplier=float(rc["noise-multiplier"]),
        clip_norm=float(rc["clip-norm"]),
        rate=float(rc["rate"]),
        delta=float(rc["delta"]),
    )
    nodes = int(rc["num-nodes"])
    modes = ["trusted-server", "secagg"] if rc["mode"] == "both" else [str(rc["mode"])]
    arrays = ArrayRecord({"w": Array(np.zeros(10, dtype=np.float32))})
    record = {}
    for mode in modes:
        if mode == "secagg":
            strategy = SecAggCheckInFedAvg(
                privacy=privacy, num_nodes=nodes, max_dropouts=int(rc["max-dropouts"])
            )
        else:
            seed = int(rc["checkin-seed"])
            strategy = ShuffleCheckInFedAvg(
                privacy=privacy, num_nodes=nodes, seed=None if seed < 0 else seed
            )
        result = strategy.start(
            grid,
            arrays,
            num_rounds=int(rc["num-server-rounds"]),
            timeout=float(rc["round-timeout"]),
        )
        arrays = result.arrays
        record[mode] = {
            "rounds": {str(r): dict(m) for r, m in strategy.round_metrics.items()},
            "weights": arrays["w"].numpy().tolist(),
        }
    if rc["out-dir"]:
        path = Path(str(rc["out-dir"])) / f"run-{context.run_id}.json"
        path.write_text(json.dumps(record, indent=1))
