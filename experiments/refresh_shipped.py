"""Recompute the epsilons of the shipped runs' figures and summaries from their configs.

    .venv/bin/python experiments/refresh_shipped.py [--add] [NAME ...]

Epsilon after a round is a function of the config alone (the curves never look at which clients
checked in), so when the accounting changes, the shipped runs' epsilon columns can be recomputed
without training again. For each shipped run ``NAME`` (``paper``, ``quick``, ``users``,
``users_cohort``, ``users_flower``) this reads the test accuracies of
``docs/figures/NAME_accuracy_vs_epsilon.csv`` (the run's own), rebuilds a run directory whose
``metrics.csv`` holds them with every curve of ``configs/NAME.yaml`` recomputed by the current
code, redraws the figures with ``plot_run``, copies them back to ``docs/figures`` and rewrites
the epsilon part of ``docs/figures/NAME_summary.json`` (``epsilon``, ``labels`` and
``guarantee``). ``flower`` does the same for the Flower app's runs in ``docs/figures/flower``:
the ``epsilon`` column of each ``rounds.csv`` is what the strategy's accountant gives now, the
summaries' ``epsilon`` follows, and the figure is redrawn by ``experiments/flower_mnist/plot.py``.
The accuracies, times and everything else the runs measured are kept as they were. Progress goes
to standard error.

With ``--add`` only the curves of the config that the shipped files lack (a curve added to the
config, ``proven`` say) are computed: every value the shipped CSVs and summary already hold is
kept byte for byte, the new columns, ``epsilon`` and ``labels`` entries and the guarantee's
``proven`` and ``rests_on`` are added, and the figures are redrawn (rounds that no shipped CSV
holds are computed by the current code for the drawing only).
"""

from __future__ import annotations

import csv
import json
import shutil
import sys
import tempfile
from pathlib import Path

from shuffle_experiments.config import load_config
from shuffle_experiments.curves import SPARSE_CURVES, EpsilonCurves, curve_label
from shuffle_experiments.guarantee import proven_record, rests_on
from shuffle_experiments.plan import build_plan
from shuffle_experiments.plots import plot_run
from shuffle_experiments.runner import guarantee_record
from tqdm import tqdm

ROOT = Path(__file__).resolve().parents[1]
FIGURES = ROOT / "docs" / "figures"
#: The shipped runs, by config name, and the Flower app's.
SHIPPED = ("paper", "quick", "users", "users_cohort", "users_flower", "flower")


def _shipped_rows(path: Path) -> dict[int, dict[str, str]]:
    """Return the rows of a shipped CSV by round (none if there is no such file)."""
    if not path.exists():
        return {}
    with path.open(newline="") as fh:
        return {int(row["round"]): row for row in csv.DictReader(fh)}


def refresh(name: str, *, add: bool = False) -> None:
    """Recompute the epsilons of one shipped run (see the module docstring).

    Args:
        name: The shipped run (its config's name).
        add: Compute only the curves the shipped files lack and keep every value they hold.
    """
    # The population: clients.count at user level, else the training examples used.
    plan = build_plan(load_config(ROOT / "configs" / f"{name}.yaml"))
    shipped = _shipped_rows(FIGURES / f"{name}_accuracy_vs_epsilon.csv")
    accuracy = {t: row["test_accuracy"] for t, row in shipped.items()}
    # The shipped values a round keeps with --add: its evaluation row, else its every-round row.
    kept = _shipped_rows(FIGURES / f"{name}_epsilon_vs_rounds.csv") if add else {}
    if add:
        kept.update(shipped)
    rounds = plan.rounds
    curves = EpsilonCurves(plan)
    names = plan.curves
    columns = ["round", "participants", "train_loss", "test_loss", "test_accuracy"]
    columns += [f"eps_{n}" for n in names]
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp)
        shutil.copy(ROOT / "configs" / f"{name}.yaml", run_dir / "config.yaml")
        with (run_dir / "metrics.csv").open("w", newline="") as fh:
            writer = csv.DictWriter(fh, fieldnames=columns)
            writer.writeheader()
            for t in tqdm(range(1, rounds + 1), desc=name, file=sys.stderr):
                evaluated = t in accuracy or t == rounds
                row = {"round": str(t), "participants": "", "train_loss": "", "test_loss": ""}
                row["test_accuracy"] = accuracy.get(t, "")
                for curve in names:
                    column = f"eps_{curve}"
                    if column in kept.get(t, {}):
                        row[column] = kept[t][column]
                    elif evaluated or curve not in SPARSE_CURVES:
                        row[column] = repr(curves.epsilon(curve, t))
                    else:
                        row[column] = ""
                writer.writerow(row)
        for path in plot_run(run_dir):
            target = FIGURES / f"{name}_{path.name}"
            if path.suffix == ".png" or target.exists() or path.stem.startswith("accuracy"):
                shutil.copy(path, target)
    summary_path = FIGURES / f"{name}_summary.json"
    summary = json.loads(summary_path.read_text())
    if add:
        old = summary["epsilon"], summary["labels"]
        summary["epsilon"] = {n: old[0].get(n, curves.epsilon(n, rounds)) for n in names}
        summary["labels"] = {n: old[1].get(n, curve_label(n, plan)) for n in names}
        guarantee = summary["guarantee"]
        if "proven" in names and "proven" not in guarantee:
            guarantee["proven"] = proven_record(curves, rounds)
            guarantee["rests_on"] = rests_on(plan.protocol.name, guarantee["method"])
    else:
        summary["epsilon"] = {n: curves.epsilon(n, rounds) for n in names}
        summary["labels"] = {n: curve_label(n, plan) for n in names}
        summary["guarantee"] = guarantee_record(plan, curves, rounds)
    summary_path.write_text(json.dumps(summary, indent=2) + "\n")
    print(f"{name}: {json.dumps(summary['guarantee'])}", file=sys.stderr)


def _flower_rounds(rounds_csv: Path, config: dict[str, object]) -> float:
    """Recompute the ``epsilon`` column of a Flower run's ``rounds.csv``; return the last ε."""
    from shuffle_opacus import history_epsilon

    with rounds_csv.open(newline="") as fh:
        reader = csv.DictReader(fh)
        fields = list(reader.fieldnames or [])
        rows = list(reader)
    last = 0.0
    for row in rows:
        t = int(row["round"])
        last = (
            history_epsilon(
                [(float(config["noise-multiplier"]), float(config["rate"]), t)],  # type: ignore[arg-type]
                protocol="checkin",
                delta=float(config["delta"]),  # type: ignore[arg-type]
                population=int(config["num-nodes"]),  # type: ignore[call-overload]
                sensitivity=str(config.get("sensitivity", "replace-one")),
            ).epsilon
            if t
            else 0.0
        )
        row["epsilon"] = repr(last)
    with rounds_csv.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=fields)
        writer.writeheader()
        writer.writerows(rows)
    return last


def refresh_flower() -> None:
    """Recompute the epsilons of the Flower app's shipped runs (see the module docstring)."""
    sys.path.insert(0, str(ROOT / "experiments" / "flower_mnist"))
    from plot import plot  # experiments/flower_mnist/plot.py

    folder = FIGURES / "flower"
    config = json.loads((folder / "run_config.json").read_text())
    summary = json.loads((folder / "summary.json").read_text())
    summary["epsilon"] = _flower_rounds(folder / "rounds.csv", config)
    (folder / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    plot(folder, folder / "accuracy_vs_epsilon")
    # The 30-round runs of both modes: the app's defaults (n = 100, rate 0.5, sigma 1.5).
    modes = {"noise-multiplier": 1.5, "rate": 0.5, "delta": 1e-5, "num-nodes": 100}
    for rounds_csv in sorted((folder / "modes").glob("*.rounds.csv")):
        path = rounds_csv.with_name(rounds_csv.name.replace(".rounds.csv", ".summary.json"))
        summary = json.loads(path.read_text())
        summary["epsilon"] = _flower_rounds(rounds_csv, modes)
        path.write_text(json.dumps(summary, indent=1) + "\n")
    print(f"flower: epsilon {json.loads((folder / 'summary.json').read_text())['epsilon']}",
          file=sys.stderr)  # fmt: skip


def main(argv: list[str]) -> int:
    """Refresh the named shipped runs (all by default); ``--add``: only the new curves."""
    add = "--add" in argv
    argv = [a for a in argv if a != "--add"]
    for name in argv or SHIPPED:
        if name not in SHIPPED:
            print(f"unknown run {name!r}; one of {', '.join(SHIPPED)}", file=sys.stderr)
            return 2
        if add and name == "flower":
            print("--add applies to the configs' runs, not flower", file=sys.stderr)
            return 2
        refresh_flower() if name == "flower" else refresh(name, add=add)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
