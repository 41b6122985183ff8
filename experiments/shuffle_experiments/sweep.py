"""Short training trials over a grid of config overrides, with one results table.

A sweep file (:func:`load_sweep`, giving a :class:`Sweep` of :class:`Trial`) names a base
config, overrides for every trial, and a grid and/or a list of trials. :func:`run_sweep` runs
each trial as an ordinary run (:func:`shuffle_experiments.runner.run`) in ``OUT/trial-NN``,
skips finished trials and resumes an interrupted one when started again, and writes
``OUT/results.csv``, ``OUT/results.md`` (:func:`results_markdown`, one :class:`TrialResult`
per row) and ``OUT/accuracy.png``. Trials change only what the paper leaves open: overrides of
a privacy parameter are refused, since a sweep compares learning set-ups at one privacy setting
(``training.rounds``, the trial's length, is allowed).

The file format and the outputs: experiments/README.md, "Sweeps".
"""

from __future__ import annotations

import csv
import io
import itertools
import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .config import ConfigError, ExperimentConfig, apply_overrides, read_yaml, validate
from .files import write_file

__all__ = ["Sweep", "Trial", "TrialResult", "load_sweep", "run_sweep", "results_markdown"]

#: Keys a sweep may not override: the privacy setting under comparison.
_PROTECTED = (
    "protocol.",
    "privacy.clipping_norm",
    "privacy.noise_multiplier",
    "privacy.sensitivity",
    "privacy.delta",
    "privacy.noise_mode",
    "data.train_subset",
    "data.name",  # another dataset: another population, another setting
    "data.path",
)
_SWEEP_KEYS = {"base", "set", "grid", "trials"}


@dataclass(frozen=True)
class Trial:
    """One trial: its number, its own overrides and the validated config they give."""

    number: int
    overrides: dict[str, Any]
    config: ExperimentConfig


@dataclass(frozen=True)
class Sweep:
    """A loaded sweep file: the base config, the overrides common to all trials, the trials."""

    path: Path
    base: Path
    common: dict[str, Any]
    trials: list[Trial]


@dataclass(frozen=True)
class TrialResult:
    """What one finished trial measured.

    Attributes:
        trial: The trial.
        final_accuracy: Test accuracy after the last round.
        best_accuracy: The highest test accuracy at an evaluation round.
        best_round: The round of ``best_accuracy``.
        train_loss: Mean train loss over the last ``training.eval_every`` rounds.
        seconds_per_round: Training wall time per round.
        curve: ``[(round, test accuracy)]`` at the evaluation rounds.
    """

    trial: Trial
    final_accuracy: float
    best_accuracy: float
    best_round: int
    train_loss: float
    seconds_per_round: float
    curve: list[tuple[int, float]]


def _format_value(value: Any) -> str:
    if isinstance(value, list):
        return "[" + ", ".join(_format_value(v) for v in value) + "]"
    return str(value)


def _as_overrides(items: Mapping[str, Any], where: str) -> list[str]:
    out = []
    for key, value in items.items():
        if not isinstance(key, str) or not key:
            raise ConfigError(f"{where}: keys must be dotted config paths, got {key!r}")
        if any(key == p or key.startswith(p) for p in _PROTECTED):
            raise ConfigError(
                f"{where}: {key} is a privacy parameter; a sweep compares training set-ups at "
                "the base config's privacy setting"
            )
        out.append(f"{key}={json.dumps(value)}")  # JSON is YAML: --set reads it back
    return out


def load_sweep(path: str | Path) -> Sweep:
    """Read a sweep file and validate every trial's config before anything runs.

    Args:
        path: The sweep YAML file.

    Returns:
        The sweep; its trials are numbered from 1, the grid's product first, then the listed
        trials.

    Raises:
        ConfigError: for a missing or malformed file, a privacy override, or an invalid
            trial config (the message names the trial).
    """
    path = Path(path)
    raw = read_yaml(path, "sweep file")
    if not isinstance(raw, Mapping):
        raise ConfigError(f"sweep file {path} must be a mapping with base, set, grid, trials")
    unknown = sorted(set(raw) - _SWEEP_KEYS)
    if unknown:
        raise ConfigError(
            f"sweep file {path}: unknown key {unknown[0]!r} (allowed: "
            + ", ".join(sorted(_SWEEP_KEYS))
            + ")"
        )
    if not isinstance(raw.get("base"), str):
        raise ConfigError(f"sweep file {path}: base must name a config file")
    base = (path.parent / raw["base"]).resolve()
    common = raw.get("set") or {}
    grid = raw.get("grid") or {}
    listed = raw.get("trials") or []
    if not isinstance(common, Mapping) or not isinstance(grid, Mapping):
        raise ConfigError(f"sweep file {path}: set and grid must be mappings")
    if not isinstance(listed, list) or not all(isinstance(t, Mapping) for t in listed):
        raise ConfigError(f"sweep file {path}: trials must be a list of mappings")
    for key, values in grid.items():
        if not isinstance(values, list) or not values:
            raise ConfigError(f"sweep file {path}: grid.{key} must be a non-empty list")
    combos: list[dict[str, Any]] = (
        [dict(zip(grid, values, strict=True)) for values in itertools.product(*grid.values())]
        if grid
        else []
    )
    combos += [dict(t) for t in listed]
    if not combos:
        raise ConfigError(f"sweep file {path}: no trials (give grid or trials)")
    common_overrides = _as_overrides(common, "set")
    try:
        base_raw = read_yaml(base, "base config")
    except ConfigError as exc:
        raise ConfigError(f"sweep file {path}: {exc}") from None
    if base_raw is None:
        raise ConfigError(f"sweep file {path}: base config {base} is empty")
    trials = []
    for number, overrides in enumerate(combos, start=1):
        strings = common_overrides + _as_overrides(overrides, f"trial {number}")
        try:
            config = validate(apply_overrides(base_raw, strings))
        except ConfigError as exc:
            raise ConfigError(f"sweep file {path}: trial {number}: {exc}") from None
        trials.append(Trial(number, overrides, config))
    return Sweep(path=path, base=base, common=dict(common), trials=trials)


def _read_result(trial: Trial, run_dir: Path, seconds_per_round: float) -> TrialResult:
    with (run_dir / "metrics.csv").open(newline="") as fh:
        rows = list(csv.DictReader(fh))
    curve = [(int(r["round"]), float(r["test_accuracy"])) for r in rows if r["test_accuracy"]]
    window = rows[-trial.config.training.eval_every :]
    losses = [float(r["train_loss"]) for r in window if r["train_loss"] not in ("", "nan")]
    best_round, best = max(curve, key=lambda c: (c[1], -c[0]))
    return TrialResult(
        trial=trial,
        final_accuracy=curve[-1][1],
        best_accuracy=best,
        best_round=best_round,
        train_loss=sum(losses) / len(losses) if losses else math.nan,
        seconds_per_round=seconds_per_round,
        curve=curve,
    )


def _check_same_config(trial: Trial, run_dir: Path) -> None:
    """Refuse to keep or resume a trial directory that was run with another config."""
    from .config import load_config
    from .runner import CONFIG_FILE

    written = run_dir / CONFIG_FILE
    if not written.exists():
        return
    if load_config(written).model_dump() != trial.config.model_dump():
        raise ConfigError(
            f"{run_dir} was run with a different config than trial {trial.number} of this "
            "sweep file; give another --out or remove that directory"
        )


def run_sweep(
    sweep: Sweep,
    out: str | Path,
    *,
    progress: bool = True,
    echo: Callable[[str], None] = print,
    only: Sequence[int] | None = None,
) -> list[TrialResult]:
    """Run (or finish) every trial and write the results table and figure.

    Args:
        sweep: From :func:`load_sweep`.
        out: The sweep's directory; trial ``k`` runs in ``out/trial-kk``.
        progress: Show each trial's progress bar.
        echo: Where one line per trial goes.
        only: Run just these trial numbers (for example one per process, to use several
            cores); the results then cover every trial of ``out`` that has finished.

    Returns:
        One result per finished trial, in order.

    Raises:
        ConfigError: if a trial directory in ``out`` holds a run of another config, or
            ``only`` names a trial the sweep does not have.
    """
    from .runner import SUMMARY_FILE, resume, run

    out = Path(out)
    trials = sweep.trials
    numbers = [t.number for t in trials]
    if only is not None:
        unknown = sorted(set(only) - set(numbers))
        if unknown:
            raise ConfigError(
                f"--trial must name trials 1 to {len(trials)} of this sweep, got {unknown[0]}"
            )
    out.mkdir(parents=True, exist_ok=True)
    results = []
    for trial in trials:
        run_dir = out / f"trial-{trial.number:02d}"
        summary = run_dir / SUMMARY_FILE
        label = ", ".join(f"{k}={_format_value(v)}" for k, v in trial.overrides.items())
        _check_same_config(trial, run_dir)
        if only is not None and trial.number not in only:
            if summary.exists():  # finished by another process: part of the table
                seconds = json.loads(summary.read_text())["seconds_per_round"]
                results.append(_read_result(trial, run_dir, seconds))
            continue
        if summary.exists():
            echo(f"trial {trial.number}/{len(trials)} ({label}): done before, kept")
        else:
            echo(f"trial {trial.number}/{len(trials)} ({label})")
            if (run_dir / "checkpoint.pt").exists():
                resume(run_dir, progress=progress, echo=echo)
            else:
                if run_dir.exists():  # started but stopped before its first checkpoint
                    for child in run_dir.iterdir():
                        child.unlink()
                run(trial.config, run_dir=run_dir, progress=progress, echo=echo)
        seconds = json.loads(summary.read_text())["seconds_per_round"]
        result = _read_result(trial, run_dir, seconds)
        echo(
            f"  test accuracy {result.final_accuracy:.2%} (best {result.best_accuracy:.2%} "
            f"at round {result.best_round}), {result.seconds_per_round:.3f} s per round"
        )
        results.append(result)
    _write_results(sweep, results, out)
    return results


def _columns(results: Sequence[TrialResult]) -> list[str]:
    return list(dict.fromkeys(k for r in results for k in r.trial.overrides))


def _setting(trial: Trial, key: str) -> str:
    """Return dotted ``key`` of the trial's resolved config (the base value if not swept)."""
    node: Any = trial.config.model_dump(mode="json")
    for part in key.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return ""
        node = node[part]
    return "-" if node is None else _format_value(node)


def results_markdown(sweep: Sweep, results: Sequence[TrialResult]) -> str:
    """Return the sweep's results as Markdown: what was fixed, then one table row per trial.

    A cell of a swept setting that a trial does not override shows the base config's value.
    """
    keys = _columns(results)
    head = ["trial", *keys, "final acc", "best acc (round)", "train loss", "s/round"]
    common = ", ".join(f"`{k}={_format_value(v)}`" for k, v in sweep.common.items())
    lines = [
        f"Sweep `{sweep.path.name}`: base config `{sweep.base.name}`"
        + (f", every trial with {common}" if common else "")
        + ".",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
    ]
    for r in results:
        cells = [str(r.trial.number)]
        cells += [_setting(r.trial, k) for k in keys]
        cells += [
            f"{r.final_accuracy:.2%}",
            f"{r.best_accuracy:.2%} ({r.best_round})",
            f"{r.train_loss:.3f}",
            f"{r.seconds_per_round:.3f}",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _write_results(sweep: Sweep, results: Sequence[TrialResult], out: Path) -> None:
    """Write ``results.csv``, ``results.md`` and ``accuracy.png`` into ``out``.

    Raises:
        RunFileError: one line naming a file that cannot be written (a full disk).
    """
    keys = _columns(results)
    table = io.StringIO()
    writer = csv.writer(table)
    writer.writerow(
        [
            "trial",
            *keys,
            "final_accuracy",
            "best_accuracy",
            "best_round",
            "train_loss",
            "seconds_per_round",
        ]
    )
    for r in results:
        writer.writerow(
            [
                r.trial.number,
                *(_setting(r.trial, k) for k in keys),
                f"{r.final_accuracy:.6g}",
                f"{r.best_accuracy:.6g}",
                r.best_round,
                f"{r.train_loss:.6g}",
                f"{r.seconds_per_round:.6g}",
            ]
        )
    write_file(out / "results.csv", table.getvalue())
    write_file(out / "results.md", results_markdown(sweep, results))
    write_file(out / "accuracy.png", _plot(results))


def _plot(results: Sequence[TrialResult]) -> bytes:
    """Return the PNG of test accuracy against rounds, one line per trial."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    for r in results:
        label = f"{r.trial.number}: " + ", ".join(
            f"{k.rsplit('.', 1)[-1]}={_format_value(v)}" for k, v in r.trial.overrides.items()
        )
        rounds, acc = zip(*r.curve, strict=True)
        ax.plot(rounds, acc, marker=".", label=label)
    ax.set_xlabel("round")
    ax.set_ylabel("test accuracy")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    png = io.BytesIO()
    try:
        fig.savefig(png, format="png", dpi=120)
    finally:
        plt.close(fig)
    return png.getvalue()
