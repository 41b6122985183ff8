"""The ServerApp: shuffled check-in FedAvg with ε after every round and server-side evaluation.

The run config (``[tool.flwr.app.config]`` of ``pyproject.toml``, overridable with ``flwr run
-c``) sets the trust mode (``mode``: ``trusted-server``, the server draws the check-in coins and
shuffles, or ``secagg``, every node draws its own coin and the reports are summed with Flower's
SecAgg+), the population, the privacy parameters and the budget. After every round the
ServerApp appends a row to ``OUT-DIR/run-<run id>/rounds.csv`` (when ``out-dir`` is set; it must
be absolute, since a ServerApp runs in the SuperLink's working directory): the round, ε, the
number of check-ins, the elapsed time and, every ``evaluate-every`` rounds and after the last
round that runs, the accuracy on the first ``test-examples`` MNIST test images (public data:
evaluating on it costs no privacy) with the proven ε beside the tight one (method ``proven``,
replace-one, no assumption on where the other nodes' updates lie). A ``summary.json`` follows
at the end with both ε; its ``final_test_accuracy`` is the last round's, ``null`` only with
``evaluate-every = 0``.
"""

from __future__ import annotations

import csv
import json
import math
import time
from pathlib import Path

import torch
from flwr.app import ArrayRecord, Context, MetricRecord
from flwr.common import log
from flwr.serverapp import Grid, ServerApp

from shuffle_opacus.common.provenance import provenance
from shuffle_opacus.flower import (
    MODES,
    SECAGG,
    SecAggCheckInFedAvg,
    ShuffleCheckInFedAvg,
    ShufflePrivacyConfig,
)
from shuffle_opacus.flower.launch import guarantee_lines

from .task import evaluate, initial_model, load_weights, setting, test_data

COLUMNS = (
    "round",
    "epsilon",
    "epsilon-proven",
    "num-checked-in",
    "num-reports",
    "test-accuracy",
    "test-loss",
    "seconds",
)

app = ServerApp()


def _strategy(rc: dict) -> ShuffleCheckInFedAvg | SecAggCheckInFedAvg:
    mode = setting(rc, "mode", str)
    if mode not in MODES:
        raise ValueError(f"run config 'mode' must be one of {', '.join(MODES)}. Found {mode!r}.")
    privacy = ShufflePrivacyConfig(
        noise_multiplier=setting(rc, "noise-multiplier", float),
        clip_norm=setting(rc, "clip-norm", float),
        rate=setting(rc, "rate", float),
        delta=setting(rc, "delta", float),
        sensitivity=setting(rc, "sensitivity", str),
    )
    budget = setting(rc, "max-epsilon", float)
    if mode == SECAGG:
        return SecAggCheckInFedAvg(
            privacy=privacy,
            num_nodes=setting(rc, "num-nodes", int),
            max_dropouts=setting(rc, "max-dropouts", int),
            max_epsilon=None if math.isinf(budget) else budget,
            node_wait_timeout=setting(rc, "node-wait-timeout", float),
        )
    seed = setting(rc, "checkin-seed", int)
    return ShuffleCheckInFedAvg(
        privacy=privacy,
        num_nodes=setting(rc, "num-nodes", int),
        max_epsilon=None if math.isinf(budget) else budget,
        seed=None if seed < 0 else seed,
        node_wait_timeout=setting(rc, "node-wait-timeout", float),
    )


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Run the protocol for up to ``num-server-rounds`` rounds and record every round."""
    torch.set_num_threads(1)
    rc = dict(context.run_config)
    started = time.monotonic()
    strategy = _strategy(rc)
    name = setting(rc, "model", str)
    model = initial_model(name, setting(rc, "model-seed", int))
    every = setting(rc, "evaluate-every", int)
    test = test_data(setting(rc, "test-examples", int)) if every > 0 else None
    if test is None:
        log(20, "no server-side evaluation (evaluate-every = 0): final_test_accuracy is null")
    num_rounds = setting(rc, "num-server-rounds", int)
    out = setting(rc, "out-dir", str)
    run_dir = Path(out) / f"run-{context.run_id}" if out else None
    if run_dir is not None:
        if not run_dir.is_absolute():
            raise ValueError(f"run config 'out-dir' must be an absolute path. Found {out!r}.")
        run_dir.mkdir(parents=True, exist_ok=True)
        with (run_dir / "rounds.csv").open("w", newline="") as fh:
            csv.writer(fh).writerow(COLUMNS)
        (run_dir / "run_config.json").write_text(json.dumps(rc, indent=1, sort_keys=True))

    def after_round(server_round: int, arrays: ArrayRecord) -> MetricRecord | None:
        result: dict[str, float] = {}
        # The last round that runs is evaluated too: the configured last one, or the last one
        # the budget allows (the strategy stops before the next).
        last = server_round == num_rounds or (
            server_round > 0 and not strategy.budget_allows_another_round()
        )
        if test is not None and (server_round % every == 0 or last):
            result = evaluate(load_weights(initial_model(name, 0), arrays), *test)
        if run_dir is not None:
            metrics = strategy.round_metrics.get(server_round, {})
            # secagg: every node in the sum reports (zeros if it did not check in).
            reports = metrics.get("num-reports", metrics.get("num-in-sum", ""))
            row = {
                "round": server_round,
                "epsilon": strategy.epsilons.get(server_round, 0.0),
                # The proven epsilon costs more: only at evaluated rounds and the last one.
                "epsilon-proven": strategy.epsilon_proven() if result or last else "",
                "num-checked-in": metrics.get("num-checked-in", ""),
                "num-reports": reports,
                "test-accuracy": result.get("test-accuracy", ""),
                "test-loss": result.get("test-loss", ""),
                "seconds": round(time.monotonic() - started, 3),
            }
            with (run_dir / "rounds.csv").open("a", newline="") as fh:
                csv.writer(fh).writerow([row[c] for c in COLUMNS])
        return MetricRecord(result) if result else None

    result = strategy.start(
        grid=grid,
        initial_arrays=ArrayRecord(model.state_dict()),
        num_rounds=num_rounds,
        timeout=setting(rc, "round-timeout", float),
        evaluate_fn=after_round,
    )
    rounds = max(result.train_metrics_clientapp, default=0)
    seed = setting(rc, "checkin-seed", int) if setting(rc, "mode", str) != SECAGG else -1
    final = result.evaluate_metrics_serverapp.get(rounds)
    summary = {
        "run_id": context.run_id,
        "mode": setting(rc, "mode", str),
        "rounds": rounds,
        "epsilon": strategy.epsilon(),
        "epsilon_proven": strategy.epsilon_proven(),
        "delta": strategy.privacy.delta,
        "stop_reason": strategy.stop_reason,
        "final_test_accuracy": None if final is None else final.get("test-accuracy"),
        "seconds": time.monotonic() - started,
        # Versions, commit, the run config's hash; the server's check-in seed (secagg: none).
        "provenance": provenance(
            config_text=json.dumps(rc, sort_keys=True),
            seed=seed if seed >= 0 else None,
            seed_given=seed >= 0,
        ),
    }
    summary["guarantees"] = strategy.guarantees()
    for line in guarantee_lines(summary["guarantees"]):
        log(20, line)
    log(20, "summary: %s", summary)
    if run_dir is not None:
        (run_dir / "summary.json").write_text(json.dumps(summary, indent=1))
