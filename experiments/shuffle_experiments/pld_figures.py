"""Figures 1–5 of Koskela, Heikkilä & Honkela, redrawn from the package.

Koskela, Heikkilä & Honkela, *Numerical Accounting in the Shuffle Model of Differential Privacy*
(arXiv:2106.00477): δ(ε) of shuffled ``eps0``-LDP reports (1), connect-the-dots for subsampled
shufflers (2), ε against compositions of a subsampled shuffler (3), shuffled k-randomised
response (4) and a Monte Carlo check of the shuffled Gaussian (5). The paper built Figures 1–4
on the pair of Feldman, McMillan & Talwar's *Stronger Privacy Amplification by Shuffling*
(arXiv:2208.04591, Theorem 3.1), which its errata restrict to a class of randomisers, so the
curves for a general ``eps0``-LDP randomiser use the clones pair of *Hiding Among the Clones*
(arXiv:2012.12803, Theorem 3.2); the paper's pair, drawn beside it, names its restriction.
:data:`FIGURES` lists them; :func:`main` (``shuffle-experiment pld-figures [--only 1 4] [--out
DIR]``) calls :func:`write` for each, giving ``pld_figN.png`` and ``pld_figN.csv`` in ``DIR``
(default ``docs/figures``).

Each figure's setting, what it shows and the comparisons the tests assert: docs/maths.md,
"Figures 1–5 of KHH".
"""

from __future__ import annotations

import argparse
import csv
import math
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from shuffle_opacus.analysis.approximate.clones import clones_delta
from shuffle_opacus.analysis.approximate.composition import compose_optimal_delta
from shuffle_opacus.analysis.montecarlo import shuffled_gaussian_delta_mc
from shuffle_opacus.analysis.pld import (
    feldman_pair,
    ldp_shuffle_pld,
    ldp_shuffle_rdp,
    subsampled_ldp_shuffle_pld,
    subsampled_profile,
)
from shuffle_opacus.analysis.rdp.conversion import delta_from_rdp, rdp_to_dp
from shuffle_opacus.analysis.rdp.shuffle_gaussian import shuffle_gaussian_rdp

__all__ = ["FIGURES", "main", "write"]

Row = dict[str, object]


#: Label of the curves drawn with the pair of arXiv:2208.04591, which its errata restrict.
STRONGER = "stronger pair (errata: restricted randomisers)"


def _delta_rdp(orders: np.ndarray, rdp: np.ndarray, eps: float) -> float:
    return delta_from_rdp(orders=orders, rdp=rdp, eps=eps)[0]


def figure1() -> list[Row]:
    """PLD vs RDP vs clones numerical for ``n = 10^4``, ``eps0 = 4`` (and the paper's pair)."""
    n, eps0 = 10_000, 4.0
    eps_grid = np.linspace(0.05, 2.0, 40)
    orders = np.arange(2, 257)
    rdp = ldp_shuffle_rdp(n=n, eps0=eps0, orders=orders)
    one = ldp_shuffle_pld(n=n, eps0=eps0, tail=1e-15)
    two = one.self_compose(2)
    strong_one = ldp_shuffle_pld(n=n, eps0=eps0, tail=1e-15, pair="stronger")
    strong_two = strong_one.self_compose(2)
    per_round = np.linspace(0.02, 2.0, 100)
    per_round_delta = [clones_delta(float(e), n=n, eps0=eps0).upper for e in per_round]
    rows: list[Row] = []
    for eps in eps_grid:
        e = float(eps)
        kov = min(
            compose_optimal_delta(eps=float(e1), delta=min(d1, 1.0 - 1e-12), k=2, eps_total=e)
            for e1, d1 in zip(per_round, per_round_delta, strict=True)
        )
        values = {
            "PLD, clones pair, 1 composition": one.get_delta_for_epsilon(e),
            "PLD, clones pair, 2 compositions": two.get_delta_for_epsilon(e),
            "RDP, clones pair, 1 composition": _delta_rdp(orders, rdp, e),
            "RDP, clones pair, 2 compositions": _delta_rdp(orders, 2 * rdp, e),
            "clones numerical, 1 composition": clones_delta(e, n=n, eps0=eps0).upper,
            "clones numerical + optimal composition, 2": kov,
            f"PLD, {STRONGER}, 1 composition": strong_one.get_delta_for_epsilon(e),
            f"PLD, {STRONGER}, 2 compositions": strong_two.get_delta_for_epsilon(e),
        }
        rows += [{"curve": k, "x": e, "y": float(v)} for k, v in values.items()]
    return rows


def figure2() -> list[Row]:
    """Connect-the-dots convergence, ``eps0 = 3``, ``n = 10^4``, ``gamma = 0.01`` (clones pair)."""
    n, m, eps0 = 10_000, 100, 3.0
    rate = m / n
    eps_one = np.linspace(0.0, 0.2, 41)
    eps_many = np.linspace(0.2, 2.0, 37)
    rows: list[Row] = []
    pair = feldman_pair(n=m, eps0=eps0)
    p, q = np.exp(pair.log_p), np.exp(pair.log_q)
    mix = rate * p + (1 - rate) * q
    for e in eps_one:
        h_first = float(np.maximum(mix - math.exp(e) * q, 0.0).sum())
        rows.append({"panel": "1 round", "curve": "H(gP+(1-g)Q||Q)", "x": float(e), "y": h_first})
    h = subsampled_profile(np.exp(eps_one), m=m, eps0=eps0, rate=rate)
    rows += [
        {"panel": "1 round", "curve": "h (eq. 2.3)", "x": float(e), "y": float(v)}
        for e, v in zip(eps_one, h, strict=True)
    ]
    for points in (5, 11, 21, 51, 201):
        pld = subsampled_ldp_shuffle_pld(
            n=n, m=m, eps0=eps0, points=points, eps_range=(-0.25, 0.25)
        )
        for panel, dist, grid in (
            ("1 round", pld, eps_one),
            ("100 rounds", pld.self_compose(100), eps_many),
        ):
            curve = f"connect-the-dots, n_alpha={points}"
            rows += [
                {"panel": panel, "curve": curve, "x": float(e), "y": dist.get_delta_for_epsilon(e)}
                for e in grid
            ]
    return rows


def figure3() -> list[Row]:
    """``eps(1e-6)`` against compositions: PLD (Lemma 7, both pairs) vs Girgis et al. RDP."""
    from shuffle_opacus.analysis.rdp.girgis import girgis_subsampled_rdp

    n, m, eps0, delta = 1_000_000, 10_000, 2.0, 1e-6
    steps = (1, 3, 10, 30, 100, 300, 1000, 3000, 10_000)
    orders = np.arange(2, 257)
    rdp = girgis_subsampled_rdp(n=n, eps0=eps0, rate=m / n, orders=orders)
    tail = 1e-3 * delta / max(steps)
    base = subsampled_ldp_shuffle_pld(n=n, m=m, eps0=eps0, tail=tail)
    strong = subsampled_ldp_shuffle_pld(n=n, m=m, eps0=eps0, tail=tail, pair="stronger")
    rows: list[Row] = []
    for k in steps:
        for curve, one in (
            ("PLD (Lemma 7), clones pair", base),
            (f"PLD (Lemma 7), {STRONGER}", strong),
        ):
            pld = one if k == 1 else one.self_compose(k)
            rows.append({"curve": curve, "x": k, "y": pld.get_epsilon_for_delta(delta)})
        eps, _ = rdp_to_dp(orders=orders, rdp=k * rdp, delta=delta)
        rows.append(
            {"curve": "RDP (Girgis et al. Thm 3.1 + Wang et al. subsampling)", "x": k, "y": eps}
        )
    return rows


def figure4() -> list[Row]:
    """Shuffled k-RR: strong vs weak adversary vs the general eps0 analysis (both pairs)."""
    from shuffle_opacus.analysis.pld.krr import krr_eps0, krr_pld

    n, gamma, k = 1000, 0.25, 4
    eps0 = krr_eps0(k=k, gamma=gamma)
    eps_grid = np.linspace(0.05, 3.0, 60)
    rows: list[Row] = []
    bases = {
        "strong adversary": krr_pld(n=n, k=k, gamma=gamma, adversary="strong", tail=1e-15),
        "weak adversary": krr_pld(n=n, k=k, gamma=gamma, adversary="weak", tail=1e-15),
        f"general eps0-LDP, clones pair (eps0={eps0:.3f})": ldp_shuffle_pld(
            n=n, eps0=eps0, tail=1e-15
        ),
        # k-RR meets the errata's condition (with equality), so the paper's pair holds here.
        f"general eps0-LDP, stronger pair (valid for k-RR, eps0={eps0:.3f})": ldp_shuffle_pld(
            n=n, eps0=eps0, tail=1e-15, pair="stronger"
        ),
    }
    for label, base in bases.items():
        for steps in (1, 10, 100):
            pld = base if steps == 1 else base.self_compose(steps)
            rows += [
                {
                    "curve": f"{label}, n_c={steps}",
                    "group": steps,
                    "kind": label,
                    "x": float(e),
                    "y": pld.get_delta_for_epsilon(e),
                }
                for e in eps_grid
            ]
    return rows


def figure5(samples: int = 1_000_000) -> list[Row]:
    """Monte Carlo delta(eps) of the shuffled Gaussian, sigma = 2, n = 1..7, against RDP."""
    sigma = 2.0
    eps_grid = np.linspace(0.0, 0.6, 13)
    orders = np.arange(2, 257)
    rows: list[Row] = []
    for n in range(1, 8):
        rdp = shuffle_gaussian_rdp(n=n, sigma=sigma, orders=orders)
        for e in eps_grid:
            est = shuffled_gaussian_delta_mc(float(e), n=n, sigma=sigma, samples=samples, seed=n)
            rows.append(
                {
                    "curve": f"Monte Carlo, n={n}",
                    "group": n,
                    "kind": "mc",
                    "x": float(e),
                    "y": est.delta,
                    "se": est.stderr,
                }
            )
            rows.append(
                {
                    "curve": f"RDP bound, n={n}",
                    "group": n,
                    "kind": "rdp",
                    "x": float(e),
                    "y": _delta_rdp(orders, rdp, e),
                }
            )
    return rows


FIGURES: dict[int, tuple[Callable[[], list[Row]], str, str, str, bool]] = {
    1: (figure1, "Shuffled eps0-LDP, n=10^4, eps0=4", "epsilon", "delta", True),
    2: (
        figure2,
        "Subsampled shuffler, clones pair: connect-the-dots grids",
        "epsilon",
        "delta",
        True,
    ),
    3: (
        figure3,
        "Subsampled shuffler, n=10^6, gamma=0.01, eps0=2",
        "compositions",
        "epsilon",
        True,
    ),
    4: (figure4, "Shuffled k-RR, n=1000, gamma=0.25, k=4", "epsilon", "delta", True),
    5: (figure5, "Shuffled Gaussian, sigma=2: Monte Carlo vs RDP", "epsilon", "delta", True),
}


# Below these deltas the curves show only the accounted truncated mass (about 1e-15 per round).
YLIM_BOTTOM = {1: 1e-13, 2: 1e-11, 4: 1e-13}


def write(number: int, rows: list[Row], out: Path) -> list[Path]:
    """Write ``pld_fig{number}.csv`` and ``.png``.

    Args:
        number: Figure number (1–5).
        rows: Its data points.
        out: Output directory (created if missing).

    Returns:
        The two paths written.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    _, title, xlabel, ylabel, log_y = FIGURES[number]
    csv_path = out / f"pld_fig{number}.csv"
    fields = [f for f in ("panel", "curve", "x", "y", "se") if any(f in r for r in rows)]
    # "group" and "kind" only style the plot.
    with csv_path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=fields)
        writer.writeheader()
        for r in rows:
            writer.writerow({k: r.get(k, "") for k in fields})
    panels = list(dict.fromkeys(str(r.get("panel", "")) for r in rows))
    fig, axes = plt.subplots(1, len(panels), figsize=(7.5 * len(panels), 4.8), squeeze=False)
    for ax, panel in zip(axes[0], panels, strict=True):
        mine = [r for r in rows if str(r.get("panel", "")) == panel]
        curves = list(dict.fromkeys(str(r["curve"]) for r in mine))
        for curve in curves:
            pts = [r for r in mine if r["curve"] == curve]
            x = np.array([float(r["x"]) for r in pts])  # type: ignore[arg-type]
            y = np.array([float(r["y"]) for r in pts])  # type: ignore[arg-type]
            keep = y > 0 if log_y else np.ones(y.size, dtype=bool)
            style = "--" if ("RDP" in curve or "numerical" in curve) else "-"
            style = ":" if "stronger pair" in curve else style
            kwargs: dict[str, object] = {}
            if "group" in pts[0]:
                # One colour per group (n, or compositions), one line style per kind of curve.
                groups = list(dict.fromkeys(str(r["group"]) for r in mine))
                kinds = list(dict.fromkeys(str(r["kind"]) for r in mine))
                kwargs["color"] = plt.get_cmap("viridis")(
                    groups.index(str(pts[0]["group"])) / max(1, len(groups) - 1) * 0.9
                )
                style = ("-", "--", ":", "-.")[kinds.index(str(pts[0]["kind"])) % 4]
            (line,) = ax.plot(x[keep], y[keep], style, label=curve, lw=1.4, **kwargs)
            if "se" in pts[0]:
                se = np.array([float(r["se"]) for r in pts])  # type: ignore[arg-type]
                ax.fill_between(
                    x[keep],
                    np.maximum(y - se, y * 1e-3)[keep],
                    (y + se)[keep],
                    color=line.get_color(),
                    alpha=0.25,
                )
        if log_y:
            ax.set_yscale("log")
            ax.set_ylim(bottom=YLIM_BOTTOM.get(number))
        if number == 3:
            ax.set_xscale("log")
        ax.set_title(f"{title}: {panel}" if panel else title)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7, ncol=2 if len(curves) > 8 else 1)
    fig.tight_layout()
    png_path = out / f"pld_fig{number}.png"
    fig.savefig(png_path, dpi=120)
    plt.close(fig)
    return [csv_path, png_path]


def main(argv: Sequence[str] | None = None) -> int:
    """Compute and write the figures.

    Args:
        argv: Command-line arguments (``--only N ...``, ``--out DIR``).

    Returns:
        Exit status 0.
    """
    parser = argparse.ArgumentParser(
        description="Redraw Figures 1-5 of Koskela et al. (arXiv:2106.00477)."
    )
    parser.add_argument("--out", default="docs/figures", help="output directory")
    parser.add_argument(
        "--only", type=int, nargs="+", choices=sorted(FIGURES), help="figure numbers (default all)"
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    args = parser.parse_args(argv)
    from tqdm import tqdm

    numbers = args.only or sorted(FIGURES)
    for number in tqdm(numbers, desc="figures", disable=args.no_progress):
        rows = FIGURES[number][0]()
        for path in write(number, rows, Path(args.out)):
            tqdm.write(str(path))
    return 0


if __name__ == "__main__":
    sys.exit(main())
