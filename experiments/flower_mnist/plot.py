"""Plot test accuracy against ε from a run's ``rounds.csv`` (the ServerApp writes it).

    python experiments/flower_mnist/plot.py OUT_DIR/run-<id> [--output STEM]

Writes ``STEM.png`` (default: ``accuracy_vs_epsilon`` in the run directory) and ``STEM.csv``
holding exactly the plotted points: every evaluated round with its ε (at the run's δ), its
test accuracy and the number of reports of that round.
"""

from __future__ import annotations

import argparse
import csv
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def plot(run_dir: Path, stem: Path) -> tuple[Path, Path]:
    """Draw the accuracy-vs-ε figure of ``run_dir``; return the PNG and CSV paths."""
    with (run_dir / "rounds.csv").open(newline="") as fh:
        rows = [r for r in csv.DictReader(fh) if r["test-accuracy"] != ""]
    if not rows:
        raise SystemExit(f"{run_dir / 'rounds.csv'} has no evaluated round")
    config = json.loads((run_dir / "run_config.json").read_text())
    points = [(int(r["round"]), float(r["epsilon"]), float(r["test-accuracy"])) for r in rows]
    csv_path, png_path = stem.with_suffix(".csv"), stem.with_suffix(".png")
    with csv_path.open("w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["round", "epsilon", "test-accuracy"])
        writer.writerows(points)
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    ax.plot([p[1] for p in points], [100 * p[2] for p in points], marker="o", markersize=3)
    ax.set_xlabel(
        f"ε (δ = {config['delta']:g}, shuffled check-in, replace-one, privacy loss distribution)"
    )
    ax.set_ylabel("test accuracy (%)")
    ax.set_title(
        f"Flower MNIST: {config['num-nodes']} nodes × {config['examples-per-node']} images, "
        f"γ = {config['rate']:g}, σ = {config['noise-multiplier']:g}, C = {config['clip-norm']:g}",
        fontsize=9,
    )
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(png_path, dpi=120)
    plt.close(fig)
    return png_path, csv_path


def main() -> None:
    """Command line (see the module docstring)."""
    parser = argparse.ArgumentParser(description="Plot test accuracy against epsilon.")
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--output", type=Path, default=None, help="output stem")
    args = parser.parse_args()
    stem = args.output or args.run_dir / "accuracy_vs_epsilon"
    for path in plot(args.run_dir, stem):
        print(path)


if __name__ == "__main__":
    main()
