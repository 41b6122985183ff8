"""The sweep command: trials from a grid and a list, results table, resumption, errors."""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import pytest
import yaml
from shuffle_experiments import runner
from shuffle_experiments.cli import main
from shuffle_experiments.config import ConfigError
from shuffle_experiments.sweep import load_sweep, run_sweep

from .support import record_plots

ROOT = Path(__file__).resolve().parents[2]
SMOKE = ROOT / "configs" / "smoke.yaml"

COMMON = {
    "training.rounds": 4,
    "training.eval_every": 2,
    "training.checkpoint_every": 2,
    "data.test_subset": 200,
    "privacy.curves": ["exact"],
    # One torch thread per trial: the suite's two workers share two cores.
    "training.threads": 1,
}


def write_sweep(tmp_path: Path, data: list[str] | None = None, **body) -> Path:
    """A sweep file (and its base config) in ``tmp_path``; ``data`` are ``data.KEY=VALUE``
    overrides of the base (``small_mnist``: the trials read the small copy of MNIST)."""
    base = tmp_path / "base.yaml"
    raw = yaml.safe_load(SMOKE.read_text())
    for override in data or []:
        key, value = override.split("=", 1)
        raw["data"][key.removeprefix("data.")] = value
    raw["data"]["train_subset"] = 300
    # Analysis sigma 1: each trial's summary states the pld guarantee, cheap to build here.
    raw["privacy"]["noise_multiplier"] = 2.0
    base.write_text(yaml.safe_dump(raw))
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump({"base": "base.yaml", "set": COMMON, **body}, sort_keys=False))
    return path


def rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as fh:
        return list(csv.DictReader(fh))


def test_grid_then_list_order_and_resolved_configs(tmp_path):
    sweep = load_sweep(
        write_sweep(
            tmp_path,
            grid={"optimizer.lr": [0.1, 0.2], "model.name": ["cnn", "cnn_small"]},
            trials=[{"training.ema": 0.9}],
        )
    )
    got = [(t.config.optimizer.lr, t.config.model.name, t.config.training.ema)
           for t in sweep.trials]  # fmt: skip
    assert got == [
        (0.1, "cnn", None), (0.1, "cnn_small", None), (0.2, "cnn", None),
        (0.2, "cnn_small", None), (0.5, "cnn", 0.9),  # the listed trial keeps the base lr
    ]  # fmt: skip
    assert [t.number for t in sweep.trials] == [1, 2, 3, 4, 5]
    assert all(t.config.training.rounds == 4 for t in sweep.trials)


@pytest.fixture(scope="module")
def trial_2_alone(tmp_path_factory, small_mnist) -> tuple[Path, list]:
    """The sweep of two learning rates with trial 2 alone run, uninterrupted (as a second
    process would run it): the sweep file, and the results of that call.

    ``test_only_some_trials`` continues a copy of its directory ``out``; its trial 2 is the
    uninterrupted run that ``test_sweep_runs_reports_and_resumes`` compares a resumed one with.
    The trial's own figures are recorded, not drawn (no sweep test looks at them; the sweep's
    figure is drawn).
    """
    base = tmp_path_factory.mktemp("alone")
    path = write_sweep(base, small_mnist, grid={"optimizer.lr": [0.1, 0.5]})
    with pytest.MonkeyPatch.context() as patch:
        plotted = record_plots(patch)
        results = run_sweep(load_sweep(path), base / "out", progress=False, only=[2],
                            echo=lambda _: None)  # fmt: skip
    assert [p.name for p in plotted] == ["trial-02"]
    return path, results


def test_sweep_runs_reports_and_resumes(tmp_path, capsys, small_mnist, trial_2_alone, monkeypatch):
    # The trials' own figures are recorded, not drawn; the sweep's figure is drawn.
    plotted = record_plots(monkeypatch)
    path = write_sweep(tmp_path, small_mnist, grid={"optimizer.lr": [0.1, 0.5]})
    sweep = load_sweep(path)
    out = tmp_path / "out"
    # Trial 2 was interrupted after round 2: the sweep must resume it, not start it over.
    runner.run(sweep.trials[1].config, run_dir=out / "trial-02", progress=False,
               stop_after=2, echo=lambda _: None)  # fmt: skip
    results = run_sweep(sweep, out, progress=False, echo=lambda _: None)
    assert [p.name for p in plotted] == ["trial-01", "trial-02"]
    # The same trial run uninterrupted (in another sweep directory, of the same sweep file).
    reference = trial_2_alone[0].parent / "out" / "trial-02"
    assert rows(out / "trial-02" / "metrics.csv") == rows(reference / "metrics.csv")

    table = rows(out / "results.csv")
    assert [r["optimizer.lr"] for r in table] == ["0.1", "0.5"]
    for result, row in zip(results, table, strict=True):
        metrics = rows(out / f"trial-{result.trial.number:02d}" / "metrics.csv")
        evaluated = [(int(m["round"]), float(m["test_accuracy"])) for m in metrics
                     if m["test_accuracy"]]  # fmt: skip
        assert result.curve == evaluated and evaluated[-1][0] == 4
        assert result.final_accuracy == evaluated[-1][1]
        assert result.best_accuracy == max(a for _, a in evaluated)
        assert float(row["final_accuracy"]) == pytest.approx(result.final_accuracy)
    uninterrupted = json.loads((reference / "summary.json").read_text())
    assert results[1].final_accuracy == uninterrupted["test_accuracy"]
    markdown = (out / "results.md").read_text()
    assert "| trial | optimizer.lr |" in markdown and markdown.count("\n| ") == 3
    assert (out / "accuracy.png").stat().st_size > 0

    # Started again, finished trials are kept as they are.
    before = (out / "trial-01" / "metrics.csv").stat().st_mtime_ns
    lines: list[str] = []
    run_sweep(load_sweep(path), out, progress=False, echo=lines.append)
    assert (out / "trial-01" / "metrics.csv").stat().st_mtime_ns == before
    assert sum("done before, kept" in line for line in lines) == 2

    # A changed sweep file must not silently reuse trials run with another config.
    raw = yaml.safe_load(path.read_text())
    raw["grid"]["optimizer.lr"] = [0.1, 0.3]
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    with pytest.raises(ConfigError, match="trial-02 was run with a different config than trial 2"):
        run_sweep(load_sweep(path), out, progress=False, echo=lambda _: None)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"grid": {"privacy.noise_multiplier": [1, 2]}},
         "privacy.noise_multiplier is a privacy parameter"),
        ({"trials": [{"protocol.rate": 0.2}]}, "trial 1: protocol.rate is a privacy parameter"),
        ({"trials": [{"data.train_subset": 100}]}, "data.train_subset is a privacy parameter"),
        ({}, "no trials"),
        ({"grid": {"optimizer.lr": []}}, "grid.optimizer.lr must be a non-empty list"),
        ({"trials": [{"optimizer.lr": -1}]}, "trial 1: optimizer.lr must be"),
        ({"trials": ["lr=1"]}, "trials must be a list of mappings"),
        ({"grid": {"optimizer.lr": [1]}, "extra": 1}, "unknown key 'extra'"),
    ],
)  # fmt: skip
def test_bad_sweep_files_are_one_line_errors(tmp_path, body, message):
    with pytest.raises(ConfigError, match=message) as info:
        load_sweep(write_sweep(tmp_path, **body))
    assert "\n" not in str(info.value)


def test_privacy_override_in_common_set_is_refused(tmp_path):
    path = write_sweep(tmp_path, grid={"optimizer.lr": [1]})
    raw = yaml.safe_load(path.read_text())
    raw["set"]["privacy.delta"] = 1e-3
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    with pytest.raises(ConfigError, match="set: privacy.delta is a privacy parameter"):
        load_sweep(path)


def test_cli_reports_a_missing_sweep_file_on_one_line(tmp_path, capsys):
    assert main(["sweep", str(tmp_path / "nope.yaml")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("shuffle-experiment: error: sweep file") and err.count("\n") == 1


@pytest.mark.parametrize("path", sorted((ROOT / "configs" / "sweeps").glob("*.yaml")),
                         ids=lambda p: p.name)  # fmt: skip
def test_shipped_sweeps_validate_and_keep_their_base_privacy_setting(path):
    sweep = load_sweep(path)
    # The published privacy settings: the paper's (example level) and that of the user-level
    # trials (the first users.yaml, sigma calibrated with the Renyi bound).
    published = {
        "paper.yaml": ("checkin", 0.1, 0.01, 5.0, "paper", 1e-5),
        "users-trials.yaml": ("checkin", 0.1, 0.1, 1.76, "replace-one", 1e-5),
    }
    assert sweep.base.name in published, sweep.base
    for trial in sweep.trials:
        p, q = trial.config.privacy, trial.config.protocol
        assert (q.kind, q.rate, p.clipping_norm, p.noise_multiplier, p.sensitivity, p.delta) == (
            published[sweep.base.name])  # fmt: skip


def test_only_some_trials(tmp_path, trial_2_alone, monkeypatch):
    alone, results = trial_2_alone
    out = tmp_path / "out"
    with pytest.raises(ConfigError, match="--trial must name trials 1 to 2 of this sweep, got 3"):
        run_sweep(load_sweep(alone), out, progress=False, only=[3], echo=lambda _: None)
    assert not out.exists()  # refused before any work
    # Trial 2 alone (as a second process would run it): the table holds what has finished.
    assert [r.trial.number for r in results] == [2]
    assert not (alone.parent / "out" / "trial-01").exists()
    assert [r["optimizer.lr"] for r in rows(alone.parent / "out" / "results.csv")] == ["0.5"]
    # Then trial 1, in a copy of that directory (the fixture's is shared, read only).
    shutil.copytree(alone.parent / "out", out)
    plotted = record_plots(monkeypatch)  # the trial's figures, as in trial_2_alone
    results = run_sweep(load_sweep(alone), out, progress=False, only=[1], echo=lambda _: None)
    assert [r.trial.number for r in results] == [1, 2] and len(plotted) == 1
    assert [r["optimizer.lr"] for r in rows(out / "results.csv")] == ["0.1", "0.5"]
