"""ServerApp: ShuffleCheckInFedAvg on a 10-weight numpy model; writes every round's ε.

With ``out-dir`` set (absolute), ``OUT-DIR/run-<run id>.json`` holds the round metrics the
strategy recorded and the final weights.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from flwr.app import Array, ArrayRecord, Context
from flwr.serverapp import Grid, ServerApp

from shuffle_opacus.flower import ShuffleCheckInFedAvg, ShufflePrivacyConfig

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
    seed = int(rc["checkin-seed"])
    strategy = ShuffleCheckInFedAvg(
        privacy=privacy, num_nodes=int(rc["num-nodes"]), seed=None if seed < 0 else seed
    )
    result = strategy.start(
        grid,
        ArrayRecord({"w": Array(np.zeros(10, dtype=np.float32))}),
        num_rounds=int(rc["num-server-rounds"]),
        timeout=float(rc["round-timeout"]),
    )
    if rc["out-dir"]:
        record = {
            "rounds": {str(r): dict(m) for r, m in strategy.round_metrics.items()},
            "weights": result.arrays["w"].numpy().tolist(),
        }
        path = Path(str(rc["out-dir"])) / f"run-{context.run_id}.json"
        path.write_text(json.dumps(record, indent=1))
