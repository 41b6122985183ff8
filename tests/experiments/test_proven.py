"""The proven bound beside the tight one: curve, summary, metrics.csv, plot and config."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from shuffle_experiments import runner
from shuffle_experiments.config import ALL_CURVES, load_config, validate
from shuffle_experiments.curves import CURVE_LABELS, SPARSE_CURVES, EpsilonCurves, curve_label
from shuffle_experiments.guarantee import guarantee_record
from shuffle_experiments.metrics_file import _metric_columns, metrics_row
from shuffle_experiments.plan import build_plan
from shuffle_experiments.plots import (
    GUARANTEE_PROVEN,
    GUARANTEE_TIGHT,
    MAX_DECADES,
    plot_run,
    split_panels,
)

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "configs"
LABEL = "shuffle, proven bound (this package)"

# 500 clients, analysis sigma 1 (the per-round pairs are cheap), 4 rounds evaluated at 2 and 4.
SMALL = [
    "privacy.noise_multiplier=2.0",
    "data.train_subset=500",
    "data.test_subset=200",
    "training.rounds=4",
    "training.eval_every=2",
    "training.checkpoint_every=4",
    "privacy.curves=[pld, proven]",
]


def small_config(*extra: str):
    return load_config(CONFIGS / "smoke.yaml", [*SMALL, *extra])


def test_config_accepts_proven_and_ships_it_beside_pld():
    assert "proven" in ALL_CURVES and CURVE_LABELS["proven"] == LABEL
    for protocol in ({"kind": "checkin", "rate": 0.1}, {"kind": "full"},
                     {"kind": "subsampled", "sample_size": 50}):  # fmt: skip
        cfg = validate(
            {
                "name": "t",
                "output_dir": "runs/t",
                "protocol": protocol,
                "privacy": {"clipping_norm": 1.0, "noise_multiplier": 2.0,
                            "curves": ["pld", "proven"]},
                "optimizer": {"lr": 1.0},
                "training": {"rounds": 3},
            }
        )  # fmt: skip
        assert cfg.privacy.curves == ["pld", "proven"]
    for name in ("quick", "users", "paper"):
        listed = yaml.safe_load((CONFIGS / f"{name}.yaml").read_text())["privacy"]["curves"]
        assert listed[:2] == ["pld", "proven"], name


@pytest.fixture(scope="module")
def curves() -> EpsilonCurves:
    """The small config's curves, shared: the library keeps what it built for them."""
    return EpsilonCurves(small_config(), 500)


@pytest.mark.filterwarnings("ignore:sensitivity 1 C is below replace-one")
def test_proven_is_never_below_the_tight_guarantee_and_ignores_the_convention(curves):
    paper = EpsilonCurves(small_config("privacy.sensitivity=paper"), 500)
    assert "proven" in SPARSE_CURVES  # evaluated at evaluation rounds and the last round only
    for rounds in (2, 4):  # the evaluation rounds of the small config
        proven = curves.epsilon("proven", rounds)
        assert proven >= curves.epsilon("pld", rounds) == curves.guarantee(rounds).epsilon
        # Under the paper's convention the pld curve shrinks; proven stays replace-one's.
        assert paper.epsilon("proven", rounds) == proven >= paper.epsilon("pld", rounds)
    assert curve_label("proven", small_config()) == LABEL
    assert curve_label("proven", small_config("privacy.sensitivity=paper")).endswith("(2C)")


def test_summary_and_metrics_carry_both_numbers(curves, tmp_path):
    """The rows, summary.json's record and the console summary, as the runner builds them.

    No training: every value here is a function of the config (the runner's end-to-end path
    is tested with the smoke config in test_runner.py).
    """
    cfg = small_config(f"output_dir={tmp_path}")
    plan = build_plan(cfg, population=500)
    cpu = SimpleNamespace(type="cpu")
    session = SimpleNamespace(config=cfg, plan=plan, curves=curves, population=500, device=cpu)
    assert _metric_columns(plan)[-2:] == ["eps_pld", "eps_proven"]
    rows = [metrics_row(session, t, 50)[0] for t in range(1, 5)]  # type: ignore[arg-type]
    # A proven column, filled at the evaluation rounds (2 and 4) only.
    assert [r["eps_proven"] != "" for r in rows] == [False, True, False, True]
    assert float(rows[-1]["eps_proven"]) == curves.epsilon("proven", 4)
    assert float(rows[-1]["eps_proven"]) >= float(rows[-1]["eps_pld"])
    g = guarantee_record(cfg, curves, 4)
    assert g["method"] == "pld" and g["proven"]["epsilon"] == curves.epsilon("proven", 4)
    assert g["proven"]["route"] in ("blanket", "clones", "gaussian")
    assert g["proven"]["delta_pld"] + g["proven"]["delta_coupling"] <= cfg.privacy.delta * 1.0001
    assert any("no assumption on where the other" in a for a in g["proven"]["assumptions"])
    assert "Theorem 1's pair" in g["rests_on"] and "secret check-in coins" in g["rests_on"]
    result = runner.RunResult(
        run_dir=tmp_path, rounds_done=4, rounds=4, test_accuracy=0.5,
        epsilon=curves.row(4), delta=cfg.privacy.delta, seconds=1.0, mean_participants=50.0,
        guarantee=g, labels={name: curve_label(name, cfg) for name in curves.names},
    )  # fmt: skip
    summary = json.loads(json.dumps(result.to_dict()))  # what summary.json holds
    assert summary["labels"]["proven"] == LABEL
    assert summary["epsilon"]["proven"] == summary["guarantee"]["proven"]["epsilon"]
    lines = runner.summary_table(result).splitlines()
    epsilon_line = next(i for i, line in enumerate(lines) if line.startswith("epsilon "))
    assert lines[epsilon_line + 1].startswith(f"proven          {g['proven']['epsilon']:.6g} at")
    assert any(line.startswith(LABEL) and line.endswith(f"{g['proven']['epsilon']:.6g}")
               for line in lines)  # fmt: skip
    footer = [line for line in lines if line.startswith("rests on        ")]
    assert len(footer) == 1 and "no assumption on the other users' updates" in footer[0]
    # The header states both numbers for the whole run.
    header = runner._header(session, tmp_path, 0)  # type: ignore[arg-type]
    assert f"; proven {curves.epsilon('proven', 4):.6g}" in header[-1]


def _fake_run(run_dir: Path, values: dict[str, list[float]]) -> None:
    cfg = load_config(CONFIGS / "smoke.yaml", ["privacy.curves=[pld, proven, clones]"])
    run_dir.mkdir()
    (run_dir / "config.yaml").write_text(yaml.safe_dump(cfg.model_dump(mode="json")))
    names = list(values)
    rounds = len(values[names[0]])
    with (run_dir / "metrics.csv").open("w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["round", "participants", "train_loss", "test_loss", "test_accuracy",
                         *(f"eps_{n}" for n in names)])  # fmt: skip
        for t in range(rounds):
            writer.writerow([t + 1, 200, 1.0, 1.0, 0.5 + 0.1 * t,
                             *(repr(values[n][t]) for n in names)])  # fmt: skip


def test_plot_marks_the_guarantees_and_moves_far_curves_to_a_second_panel(tmp_path):
    far = {"pld": [0.05, 0.1, 0.14], "proven": [40.0, 120.0, 250.0], "clones": [800, 4e3, 1.3e4]}
    assert split_panels(far, ["pld", "proven"]) == (["pld", "proven"], ["clones"])
    near = {"pld": [0.5, 1.0], "proven": [4.0, 9.0], "clones": [40.0, 90.0]}
    assert split_panels(near, ["pld", "proven"]) == (["pld", "proven", "clones"], [])
    # A guarantee never leaves the main panel, however far it lies.
    assert split_panels({"pld": [1e-4], "proven": [1e4]}, ["pld", "proven"])[1] == []
    assert MAX_DECADES == 5.0

    import matplotlib.axes

    seen: list[tuple[str, ...]] = []
    original = matplotlib.axes.Axes.legend

    def record(self, *args, **kwargs):
        seen.append(tuple(args[1]) if len(args) > 1 else ())
        return original(self, *args, **kwargs)

    _fake_run(tmp_path / "run", far)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(matplotlib.axes.Axes, "legend", record)
        written = plot_run(tmp_path / "run")
    assert sorted(p.name for p in written) == [
        "accuracy_vs_epsilon.csv", "accuracy_vs_epsilon.png",
        "epsilon_vs_rounds.csv", "epsilon_vs_rounds.png",
    ]  # fmt: skip
    accuracy_legend = seen[0]
    # The guarantees come first, each marked as such; the comparison curve keeps its label.
    assert accuracy_legend[0].startswith(GUARANTEE_TIGHT + ":\n" + CURVE_LABELS["pld"])
    assert accuracy_legend[1] == f"{GUARANTEE_PROVEN}:\n{LABEL}"
    assert accuracy_legend[2] == CURVE_LABELS["clones"]
    with (tmp_path / "run" / "accuracy_vs_epsilon.csv").open(newline="") as fh:
        header = next(csv.reader(fh))
    assert header == ["round", "test_accuracy", "eps_pld", "eps_proven", "eps_clones"]
