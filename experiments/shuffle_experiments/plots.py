"""The experiment's figures, drawn from a run directory's ``metrics.csv`` and ``config.yaml``.

* ``accuracy_vs_epsilon.png``: test accuracy at each evaluation round against the epsilon spent
  by then, one curve per accountant (Liew & Takahashi, Figure 1b). The same accuracies appear
  on every curve; what differs is how much privacy each accountant says they cost.
* ``epsilon_vs_rounds.png``: epsilon after each round for the same accountants (Figure 1a
  style).

Each PNG comes with a CSV of exactly the plotted points. The epsilon axis is logarithmic: the
accountants differ by orders of magnitude. Each file is written through a temporary file and a
rename (:func:`~shuffle_experiments.files.write_file`): one that cannot be written is one line
naming it, and no half-written figure is left behind.
"""

from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from .config import ConfigError, load_config  # noqa: E402
from .curves import curve_label  # noqa: E402
from .files import PLOT_STEMS, write_file  # noqa: E402

__all__ = ["plot_run"]

_STYLE = {
    "exact": {"color": "tab:red", "linestyle": "-"},
    "sum": {"color": "tab:orange", "linestyle": "-."},
    "theorem3": {"color": "tab:purple", "linestyle": "--"},
    "no-shuffle": {"color": "tab:blue", "linestyle": ":"},
    "central": {"color": "black", "linestyle": (0, (1, 3))},
    "clones": {"color": "tab:green", "linestyle": "--"},
    "pld": {"color": "tab:brown", "linestyle": "-", "linewidth": 2.2},
    "replace-one": {"color": "tab:olive", "linestyle": "-", "linewidth": 2.6},
}


def _read(run_dir: Path) -> tuple[list[str], list[dict[str, str]]]:
    path = run_dir / "metrics.csv"
    if not path.exists():
        raise ConfigError(f"{run_dir} has no metrics.csv; is it a run directory?")
    with path.open(newline="") as fh:
        reader = csv.DictReader(fh)
        rows = list(reader)
        columns = list(reader.fieldnames or [])
    if not rows:
        raise ConfigError(f"{path} has no rounds yet")
    names = [c[len("eps_") :] for c in columns if c.startswith("eps_")]
    return names, rows


def _save(
    fig: Any, ax: Any, stem: Path, title: str, columns: list[str], rows: list[dict[str, str]]
) -> list[Path]:
    """Finish and write one figure as ``stem.png``, with ``columns`` of ``rows`` as ``stem.csv``.

    Raises:
        RunFileError: naming the file that cannot be written.
    """
    csv_path, png_path = stem.with_suffix(".csv"), stem.with_suffix(".png")
    text = io.StringIO()
    writer = csv.writer(text)
    writer.writerow(columns)
    writer.writerows([r[c] for c in columns] for r in rows)
    ax.set_title(title, fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    if ax.get_legend_handles_labels()[0]:  # beside the axes, never over the curves
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0)
    fig.tight_layout()
    png = io.BytesIO()
    try:
        fig.savefig(png, format="png", dpi=120)
    finally:
        plt.close(fig)
    write_file(csv_path, text.getvalue())
    write_file(png_path, png.getvalue())
    return [csv_path, png_path]


def plot_run(run_dir: str | Path) -> list[Path]:
    """Draw both figures of a run into its directory.

    Args:
        run_dir: A run directory (complete or not).

    Returns:
        The files written: two PNGs and two CSVs.

    Raises:
        ConfigError: if the directory has no metrics or no config.
        RunFileError: naming a file that cannot be written (a full disk).
    """
    run_dir = Path(run_dir)
    if not (run_dir / "config.yaml").exists():
        raise ConfigError(f"{run_dir} has no config.yaml; is it a run directory?")
    config = load_config(run_dir / "config.yaml")
    names, rows = _read(run_dir)
    delta = config.privacy.delta
    p = config.protocol
    setting = (
        f"{p.kind}"
        + (f", rate {p.rate:g}" if p.rate is not None else "")
        + (f", m {p.sample_size}" if p.sample_size is not None else "")
        + f", local sigma {config.privacy.noise_multiplier:g}, C {config.privacy.clipping_norm:g}"
        + f", sensitivity {config.privacy.sensitivity}"
    )
    evals = [r for r in rows if r["test_accuracy"]]
    eps_columns = [f"eps_{n}" for n in names]

    fig, ax = plt.subplots(figsize=(9.0, 4.4))
    if not evals:
        # Nothing to draw yet: say so on the figure instead of an empty frame with a legend.
        every = config.training.eval_every
        ax.text(
            0.5, 0.5,
            f"no evaluation yet: the model is evaluated every {every} rounds and at the last; "
            f"this run has {len(rows)} round(s)",
            ha="center", va="center", transform=ax.transAxes, fontsize=9,
        )  # fmt: skip
        ax.set_xticks([])
        ax.set_yticks([])
    for name in names if evals else []:
        xs = [float(r[f"eps_{name}"]) for r in evals]
        ys = [100.0 * float(r["test_accuracy"]) for r in evals]
        ax.plot(xs, ys, marker="o", markersize=3, label=curve_label(name, config),
                **_STYLE.get(name, {}))  # fmt: skip
    if evals:
        ax.set_xscale("log")
    ax.set_xlabel(f"epsilon (delta = {delta:g})")
    ax.set_ylabel("test accuracy (%)")
    title = f"{config.name}: accuracy vs privacy\n{setting}"
    columns = ["round", "test_accuracy", *eps_columns]
    accuracy_stem, rounds_stem = PLOT_STEMS
    written = _save(fig, ax, run_dir / accuracy_stem, title, columns, evals)

    fig, ax = plt.subplots(figsize=(9.0, 4.4))
    for name in names:
        have = [r for r in rows if r[f"eps_{name}"]]  # sparse curves skip most rounds
        # A curve known only at some rounds (evaluation rounds) is drawn with markers, so that
        # it shows even where it has a single point or runs under another curve.
        marks = {"marker": "o", "markersize": 4} if len(have) < len(rows) else {}
        ax.plot([int(r["round"]) for r in have], [float(r[f"eps_{name}"]) for r in have],
                label=curve_label(name, config), **_STYLE.get(name, {}), **marks)  # fmt: skip
    ax.set_yscale("log")
    ax.set_xlabel("rounds")
    ax.set_ylabel(f"epsilon (delta = {delta:g})")
    title = f"{config.name}: privacy spent\n{setting}"
    written += _save(fig, ax, run_dir / rounds_stem, title, ["round", *eps_columns], rows)
    return written
