"""The experiment's figures, drawn from a run directory's ``metrics.csv`` and ``config.yaml``.

* ``accuracy_vs_epsilon.png``: test accuracy at each evaluation round against the epsilon spent
  by then, one curve per accountant (Liew & Takahashi, Figure 1b). The same accuracies appear
  on every curve; what differs is how much privacy each accountant says they cost.
* ``epsilon_vs_rounds.png``: epsilon after each round for the same accountants (Figure 1a
  style).

The legends mark the run's guarantees: ``guarantee (tight, rests on Theorem 1's pair)`` (``pld``,
or the ``replace-one`` curve when the config's sensitivity is a smaller convention) and
``guarantee (proven)``; every other curve is a comparison. The epsilon axis is logarithmic: the
accountants differ by orders of magnitude. In the accuracy plot the guarantees set the main
panel's axis, and comparison curves that would stretch it over more than :data:`MAX_DECADES`
decades (``clones``, often ``no-shuffle``) are drawn in a second panel to its right, with the
same accuracy axis, instead of squeezing the guarantees into a corner.

Each PNG comes with a CSV of exactly the plotted points (both panels). Each file is written
through a temporary file and a rename (:func:`~shuffle_experiments.files.write_file`): one that
cannot be written is one line naming it, and no half-written figure is left behind.
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from .config import ConfigError, load_config  # noqa: E402
from .curves import CURVE_LABELS, PROVEN, REPLACE_ONE, curve_label  # noqa: E402
from .files import PLOT_STEMS, write_file  # noqa: E402
from .plan import RunPlan, build_plan  # noqa: E402

__all__ = ["GUARANTEE_PROVEN", "GUARANTEE_TIGHT", "MAX_DECADES", "plot_run", "split_panels"]

#: How the legend marks the tight guarantee (``pld``, or ``replace-one`` below replace-one).
GUARANTEE_TIGHT = "guarantee (tight, rests on Theorem 1's pair)"
#: How the legend marks the proven bound.
GUARANTEE_PROVEN = "guarantee (proven)"
#: Decades of epsilon the accuracy plot's main panel may span before a comparison curve goes to
#: the second panel.
MAX_DECADES = 5.0

_STYLE = {
    "exact": {"color": "tab:red", "linestyle": "-"},
    "sum": {"color": "tab:orange", "linestyle": "-."},
    "theorem3": {"color": "tab:purple", "linestyle": "--"},
    "no-shuffle": {"color": "tab:blue", "linestyle": ":"},
    "central": {"color": "black", "linestyle": (0, (1, 3))},
    "clones": {"color": "tab:green", "linestyle": "--"},
    "pld": {"color": "tab:brown", "linestyle": "-", "linewidth": 2.2},
    "replace-one": {"color": "tab:olive", "linestyle": "-", "linewidth": 2.6},
    "proven": {"color": "navy", "linestyle": "-", "linewidth": 2.2, "marker": "s"},
}


def _guarantees(names: Sequence[str]) -> dict[str, str]:
    """Return the guarantee curves among ``names``, each with its mark in the legend."""
    marks: dict[str, str] = {}
    tight = REPLACE_ONE if REPLACE_ONE in names else "pld" if "pld" in names else None
    if tight is not None:
        marks[tight] = GUARANTEE_TIGHT
    if PROVEN in names:
        marks[PROVEN] = GUARANTEE_PROVEN
    return marks


def _legend(name: str, plan: RunPlan, marks: dict[str, str]) -> str:
    """Return the legend entry of curve ``name``: its label, under its mark if a guarantee."""
    label = curve_label(name, plan)
    if name == REPLACE_ONE:
        label = f"{CURVE_LABELS['pld']}, replace-one"
    return f"{marks[name]}:\n{label}" if name in marks else label


def _finite(values: Sequence[float]) -> list[float]:
    return [v for v in values if v > 0.0 and math.isfinite(v)]


def split_panels(
    values: dict[str, list[float]], guarantees: Sequence[str], decades: float = MAX_DECADES
) -> tuple[list[str], list[str]]:
    """Split curves between the main panel and the second one of the accuracy plot.

    The guarantees (or, without any, the first curve) are always in the main panel; the other
    curves join it, those that stretch its epsilon range least first, as long as the range stays
    within ``decades`` decades.

    Args:
        values: The epsilons of each curve, in plotting order.
        guarantees: The guarantee curves.
        decades: The most decades the main panel may span.

    Returns:
        ``(main, far)``: the curves of each panel, in the order of ``values``.
    """
    names = list(values)
    core = [n for n in names if n in guarantees] or names[:1]
    points = [v for n in core for v in _finite(values[n])]
    if not points:
        return names, []
    lo, hi = min(points), max(points)

    def span(name: str) -> float:
        own = _finite(values[name]) or [lo]
        return math.log10(max(hi, *own) / min(lo, *own))

    main = set(core)
    for name in sorted((n for n in names if n not in main), key=span):
        if span(name) <= decades:
            main.add(name)
            own = _finite(values[name])
            lo, hi = min([lo, *own]), max([hi, *own])
    return [n for n in names if n in main], [n for n in names if n not in main]


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
    fig: Any,
    axes: Sequence[Any],
    stem: Path,
    title: str,
    columns: list[str],
    rows: list[dict[str, str]],
) -> list[Path]:
    """Finish and write one figure as ``stem.png``, with ``columns`` of ``rows`` as ``stem.csv``.

    The title goes over the first panel (over the figure when there are two), the legend of
    every panel's curves beside the last one.

    Raises:
        RunFileError: naming the file that cannot be written.
    """
    csv_path, png_path = stem.with_suffix(".csv"), stem.with_suffix(".png")
    text = io.StringIO()
    writer = csv.writer(text)
    writer.writerow(columns)
    writer.writerows([r[c] for c in columns] for r in rows)
    if len(axes) == 1:
        axes[0].set_title(title, fontsize=9)
    else:
        fig.suptitle(title, fontsize=9)
    handles: list[Any] = []
    labels: list[str] = []
    for ax in axes:
        ax.grid(True, which="both", alpha=0.3)
        more = ax.get_legend_handles_labels()
        handles += more[0]
        labels += more[1]
    # The guarantees head the legend (tight, then proven), the comparisons follow in run order.
    rank = (GUARANTEE_TIGHT, GUARANTEE_PROVEN)
    order = sorted(
        range(len(labels)),
        key=lambda i: next((k for k, m in enumerate(rank) if labels[i].startswith(m)), 2),
    )
    handles, labels = [handles[i] for i in order], [labels[i] for i in order]
    if handles:  # beside the axes, never over the curves
        axes[-1].legend(handles, labels, fontsize=8, loc="upper left",
                        bbox_to_anchor=(1.04, 1.0), borderaxespad=0.0)  # fmt: skip
    fig.tight_layout()
    png = io.BytesIO()
    try:
        fig.savefig(png, format="png", dpi=120)
    finally:
        plt.close(fig)
    write_file(csv_path, text.getvalue())
    write_file(png_path, png.getvalue())
    return [csv_path, png_path]


def plot_run(run_dir: str | Path, plan: RunPlan | None = None) -> list[Path]:
    """Draw both figures of a run into its directory.

    Args:
        run_dir: A run directory (complete or not).
        plan: The run's plan, when the caller holds it; by default read from its config.yaml.

    Returns:
        The files written: two PNGs and two CSVs.

    Raises:
        ConfigError: if the directory has no metrics or no config.
        RunFileError: naming a file that cannot be written (a full disk).
    """
    run_dir = Path(run_dir)
    if not (run_dir / "config.yaml").exists():
        raise ConfigError(f"{run_dir} has no config.yaml; is it a run directory?")
    if plan is None:
        plan = build_plan(load_config(run_dir / "config.yaml"))
    names, rows = _read(run_dir)
    delta = plan.delta
    setting = (
        f"{plan.protocol.name}"
        + (f", rate {plan.rate:g}" if plan.rate is not None else "")
        + (f", m {plan.sample_size}" if plan.sample_size is not None else "")
        + f", local sigma {plan.noise_multiplier:g}, C {plan.clipping_norm:g}"
        + f", sensitivity {plan.sensitivity_setting}"
    )
    evals = [r for r in rows if r["test_accuracy"]]
    eps_columns = [f"eps_{n}" for n in names]
    marks = _guarantees(names)
    values = {n: [float(r[f"eps_{n}"]) for r in evals if r[f"eps_{n}"]] for n in names}
    main, far = split_panels(values, list(marks)) if evals else (names, [])

    if far:
        fig, axes = plt.subplots(1, 2, figsize=(12.5, 4.6), sharey=True,
                                 gridspec_kw={"width_ratios": [3.0, 1.4]})  # fmt: skip
        ax, side = axes
        side.set_title(f"beyond the left panel's range: {', '.join(far)}", fontsize=8)
        side.set_xlabel(f"epsilon (delta = {delta:g}), comparison only")
        side.tick_params(labelleft=True)
    else:
        fig, ax = plt.subplots(figsize=(10.5, 4.4))
        axes = [ax]
    if not evals:
        # Nothing to draw yet: say so on the figure instead of an empty frame with a legend.
        every = plan.eval_every
        ax.text(
            0.5, 0.5,
            f"no evaluation yet: the model is evaluated every {every} rounds and at the last; "
            f"this run has {len(rows)} round(s)",
            ha="center", va="center", transform=ax.transAxes, fontsize=9,
        )  # fmt: skip
        ax.set_xticks([])
        ax.set_yticks([])
    for name in names if evals else []:
        have = [r for r in evals if r[f"eps_{name}"]]
        xs = [float(r[f"eps_{name}"]) for r in have]
        ys = [100.0 * float(r["test_accuracy"]) for r in have]
        style = {"marker": "o", "markersize": 3, **_STYLE.get(name, {})}
        (ax if name in main else side).plot(xs, ys, label=_legend(name, plan, marks), **style)
    if evals:
        for panel in axes:
            panel.set_xscale("log")
    ax.set_xlabel(f"epsilon (delta = {delta:g})")
    ax.set_ylabel("test accuracy (%)")
    title = f"{plan.config.name}: accuracy vs privacy\n{setting}"
    columns = ["round", "test_accuracy", *eps_columns]
    accuracy_stem, rounds_stem = PLOT_STEMS
    written = _save(fig, axes, run_dir / accuracy_stem, title, columns, evals)

    fig, ax = plt.subplots(figsize=(10.5, 4.4))
    for name in names:
        have = [r for r in rows if r[f"eps_{name}"]]  # sparse curves skip most rounds
        # A curve known only at some rounds (evaluation rounds) is drawn with markers, so that
        # it shows even where it has a single point or runs under another curve.
        dots = {"marker": "o", "markersize": 4} if len(have) < len(rows) else {}
        style = {**_STYLE.get(name, {}), **dots}
        ax.plot([int(r["round"]) for r in have], [float(r[f"eps_{name}"]) for r in have],
                label=_legend(name, plan, marks), **style)  # fmt: skip
    ax.set_yscale("log")
    ax.set_xlabel("rounds")
    ax.set_ylabel(f"epsilon (delta = {delta:g})")
    title = f"{plan.config.name}: privacy spent\n{setting}"
    written += _save(fig, [ax], run_dir / rounds_stem, title, ["round", *eps_columns], rows)
    return written
