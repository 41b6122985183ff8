"""Table 1 of Liew & Takahashi (shuffle Gaussian, §5.1): clones method against RDP.

Liew & Takahashi, *Shuffle Gaussian Mechanism for Differential Privacy* (arXiv:2206.09569),
Table 1: ``n = 60,000`` users (:data:`N`), noise ``sigma = 9.48`` (:data:`SIGMA`) on reports of
sensitivity 1, total ``delta = 1/n``, 1 to 7 compositions. :func:`table1` computes the rows:
the published ones (:data:`PAPER_CLONES`, :data:`PAPER_RDP`), :func:`recipe_clones`, our
reconstruction of how the published clones row was computed (the classical Gaussian calibration
with diameter 2, the closed form of Feldman, McMillan & Talwar's Eq. (1), a halving grid of
``delta0`` and ``(k eps, k delta)`` composition; it reproduces the row to below ``1e-4``), the
package's Theorem 1 RDP with the paper's order cap of 30 and without it, the numerical clones
bound at both units, and the central reference. :func:`main` (``shuffle-experiment table1
[--out DIR]``) prints the table and writes ``table1.csv`` and ``table1.png`` into ``DIR``
(default ``docs/figures``); the numerical clones rows take about a minute.

The recipe, the alternatives tried, the numbers and the caveats: docs/maths.md, "Table 1 of the
shuffle-Gaussian paper".
"""

from __future__ import annotations

import argparse
import csv
import math
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path

from shuffle_opacus.analysis.approximate.baselines import composed_epsilons
from shuffle_opacus.analysis.epsilon import compute_epsilon
from shuffle_opacus.analysis.rdp.conversion import OrderCapWarning

__all__ = ["N", "PAPER_CLONES", "PAPER_RDP", "SIGMA", "recipe_clones", "table1", "main"]

N = 60_000
SIGMA = 9.48
COMPOSITIONS = tuple(range(1, 8))
PAPER_CLONES = (0.18623, 0.38461, 0.59516, 0.79355, 1.02241, 1.22689, 1.43138)
PAPER_RDP = (0.22820, 0.22820, 0.22821, 0.22821, 0.22821, 0.22822, 0.22822)


def _eq1(n: int, eps0: float, delta: float) -> float:
    """Feldman, McMillan & Talwar Eq. (1) exactly as printed (Theorem 3.1)."""
    a = 8.0 * math.sqrt(math.exp(eps0) * math.log(4.0 / delta) / n) + 8.0 * math.exp(eps0) / n
    return math.log1p(math.tanh(eps0 / 2.0) * a)  # (e^x - 1)/(e^x + 1) = tanh(x/2)


def recipe_clones(k: int, *, n: int = N, sigma: float | None = None, start: float = 1e-10) -> float:
    """Follow the reconstructed recipe of the published clones row (see the module docstring).

    This reproduces a published number; it is not a bound the package recommends: the
    classical calibration is proved only for ``eps0 < 1`` (here it overestimates ``eps0``, so
    the row is valid but loose), and the halving grid does not search ``delta0`` finely.

    Args:
        k: Number of compositions (integer >= 1).
        n: Number of users.
        sigma: Noise std over sensitivity 1; ``2 sqrt(2 log(1.25 n))`` by default.
        start: First ``delta0`` of the halving scan.

    Returns:
        Epsilon after ``k`` compositions at total delta ``1/n``.

    Raises:
        ValueError: if no ``delta0`` in 60 halvings meets the budget.
    """
    if sigma is None:
        sigma = 2.0 * math.sqrt(2.0 * math.log(1.25 * n))
    delta0 = start
    for _ in range(60):
        eps0 = 2.0 * math.sqrt(2.0 * math.log(1.25 / delta0)) / sigma
        eps = _eq1(n, eps0, delta0)
        total = delta0 + (math.exp(eps) + 1.0) * (1.0 + math.exp(-eps0) / 2.0) * n * delta0
        if k * total <= 1.0 / n:
            return k * eps
        delta0 /= 2.0
    raise ValueError(f"no delta0 below {start:g} meets delta = 1/n for k = {k}")


def table1(*, progress: bool = True) -> dict[str, list[float]]:
    """Compute every row of the table.

    Args:
        progress: Report each row on stderr as it is computed.

    Returns:
        Row label -> epsilon for 1..7 compositions.
    """
    delta = 1.0 / N
    rows: dict[str, list[float]] = {
        "paper clones": list(PAPER_CLONES),
        "recipe clones": [recipe_clones(k) for k in COMPOSITIONS],
        "paper RDP": list(PAPER_RDP),
    }

    def rdp(sigma: float, mechanism: str, max_order: int | None, n: int | None) -> list[float]:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", OrderCapWarning)
            return [
                compute_epsilon(
                    mechanism, sigma=sigma, n=n, steps=k, delta=delta, max_order=max_order
                ).epsilon
                for k in COMPOSITIONS
            ]

    rows["RDP, orders <= 30"] = rdp(SIGMA, "shuffle", 30, N)
    rows["RDP, exact"] = rdp(SIGMA, "shuffle", None, N)
    for label, sigma in (("clones, numerical", SIGMA), ("clones, numerical, sigma/2", SIGMA / 2)):
        if progress:
            print(f"computing {label} ...", file=sys.stderr, flush=True)
        rows[label] = composed_epsilons(n=N, sigma=sigma, steps=COMPOSITIONS, delta=delta)
    rows["central"] = rdp(SIGMA * math.sqrt(N), "gaussian", None, None)
    return rows


_STYLE = {
    "paper clones": {"color": "tab:blue", "marker": "s", "linestyle": "none"},
    "recipe clones": {"color": "tab:blue", "linestyle": "--"},
    "paper RDP": {"color": "tab:red", "marker": "o", "linestyle": "none"},
    "RDP, orders <= 30": {"color": "tab:red", "linestyle": "--"},
    "RDP, exact": {"color": "tab:red", "linestyle": "-"},
    "clones, numerical": {"color": "tab:green", "linestyle": "-"},
    "clones, numerical, sigma/2": {"color": "tab:green", "linestyle": ":"},
    "central": {"color": "black", "linestyle": (0, (1, 3))},
}


def write(rows: dict[str, list[float]], out: Path) -> list[Path]:
    """Write ``table1.csv`` and ``table1.png`` into ``out``.

    Args:
        rows: From :func:`table1`.
        out: Output directory (created if missing).

    Returns:
        The two paths written.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    csv_path, png_path = out / "table1.csv", out / "table1.png"
    with csv_path.open("w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["row", *(f"k={k}" for k in COMPOSITIONS)])
        for label, values in rows.items():
            writer.writerow([label, *(f"{v:.6g}" for v in values)])
    fig, ax = plt.subplots(figsize=(9, 4.5))
    for label, values in rows.items():
        ax.plot(COMPOSITIONS, values, label=label, **_STYLE.get(label, {}))
    ax.set_yscale("log")
    ax.set_xlabel("number of compositions")
    ax.set_ylabel(f"epsilon at delta = 1/n (n = {N:,})")
    ax.set_title(f"Shuffled Gaussian, sigma = {SIGMA}: clones method vs RDP")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    fig.savefig(png_path, dpi=120)
    plt.close(fig)
    return [csv_path, png_path]


def format_table(rows: dict[str, list[float]]) -> str:
    """Render ``rows`` as an aligned text table."""
    width = max(len(label) for label in rows)
    head = "compositions".ljust(width) + "".join(f"{k:>10d}" for k in COMPOSITIONS)
    lines = [head, "-" * len(head)]
    for label, values in rows.items():
        lines.append(label.ljust(width) + "".join(f"{v:10.5f}" for v in values))
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Print Table 1 and write its CSV and figure.

    Args:
        argv: Command-line arguments (``--out DIR``).

    Returns:
        Exit status 0.
    """
    parser = argparse.ArgumentParser(description="Liew & Takahashi Table 1: clones vs RDP.")
    parser.add_argument("--out", default="docs/figures", help="output directory")
    args = parser.parse_args(argv)
    rows = table1()
    print(format_table(rows))
    for path in write(rows, Path(args.out)):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
