"""Figures 1-5 of Koskela et al. (arXiv:2106.00477) in docs/figures: the shipped data keep
the orderings the paper reports.

The CSVs are produced by ``shuffle-experiment pld-figures`` (about 30 s, too slow for the
suite); these tests read them, so a regenerated figure that breaks an ordering fails here.
"""

from __future__ import annotations

import csv
from collections import defaultdict
from pathlib import Path

import pytest
from shuffle_experiments.pld_figures import FIGURES, write

FIGS = Path(__file__).resolve().parents[2] / "docs" / "figures"
# The figures use a truncated mass of 1e-15 per round, which every PLD delta includes; below
# FLOOR a curve shows that accounted mass rather than the mechanism (the plots cut there too).
FLOOR = 1e-13


def load(number: int) -> dict[str, dict[float, tuple[float, float]]]:
    curves: dict[str, dict[float, tuple[float, float]]] = defaultdict(dict)
    with (FIGS / f"pld_fig{number}.csv").open() as fh:
        for row in csv.DictReader(fh):
            key = f"{row.get('panel', '')}|{row['curve']}"
            curves[key][float(row["x"])] = (float(row["y"]), float(row.get("se") or 0.0))
    return curves


@pytest.mark.parametrize("number", sorted(FIGURES))
def test_figure_files_exist(number: int) -> None:
    assert (FIGS / f"pld_fig{number}.png").stat().st_size > 10_000
    assert len(load(number)) >= 2


STRONGER = "stronger pair (errata: restricted randomisers)"


def test_figure1_pld_below_rdp_and_clones() -> None:
    c = load(1)
    pld1, pld2 = c["|PLD, clones pair, 1 composition"], c["|PLD, clones pair, 2 compositions"]
    strong1, strong2 = c[f"|PLD, {STRONGER}, 1 composition"], c[f"|PLD, {STRONGER}, 2 compositions"]
    checked = 0
    for x, (y, _) in pld1.items():
        if y < FLOOR:
            continue
        checked += 1
        assert y <= c["|RDP, clones pair, 1 composition"][x][0]
        # One round: the clones numerical method bounds the same pair, nearly exactly; the PLD
        # rounds losses up by a grid step (1e-4), which costs it at most 0.5% here.
        assert y <= 1.005 * c["|clones numerical, 1 composition"][x][0]
        assert pld2[x][0] <= c["|RDP, clones pair, 2 compositions"][x][0]
        assert pld2[x][0] <= c["|clones numerical + optimal composition, 2"][x][0]
        # More clones, smaller delta: the paper's pair lies below (it is not valid for all).
        assert strong1[x][0] <= y and strong2[x][0] <= pld2[x][0]
    assert checked >= 15


def test_figure3_pld_below_girgis() -> None:
    c = load(3)
    rdp = next(v for k, v in c.items() if "RDP" in k)
    clones, strong = c["|PLD (Lemma 7), clones pair"], c[f"|PLD (Lemma 7), {STRONGER}"]
    for x, (y, _) in clones.items():
        assert strong[x][0] < y < rdp[x][0]


def test_figure4_strong_above_weak() -> None:
    c = load(4)
    for steps in (1, 10, 100):
        strong = c[f"|strong adversary, n_c={steps}"]
        weak = c[f"|weak adversary, n_c={steps}"]
        general = next(v for k, v in c.items() if f"clones pair (eps0=2.565), n_c={steps}" in k)
        paper = next(v for k, v in c.items() if f"valid for k-RR, eps0=2.565), n_c={steps}" in k)
        for x, (y, _) in strong.items():
            if weak[x][0] >= FLOOR:
                assert y >= weak[x][0]
            if general[x][0] >= FLOOR:
                assert paper[x][0] <= general[x][0]
            # What docs/maths.md reads off the figure (observed, not a theorem): the clones pair
            # above the strong adversary, the paper's pair between strong and weak.
            if y >= FLOOR:
                assert general[x][0] >= y
            if paper[x][0] >= FLOOR:
                assert weak[x][0] <= paper[x][0] <= y


def test_figure5_rdp_above_monte_carlo() -> None:
    c = load(5)
    for n in range(1, 8):
        for x, (est, se) in c[f"|Monte Carlo, n={n}"].items():
            assert c[f"|RDP bound, n={n}"][x][0] >= est - 4.5 * se


def test_write_produces_csv_and_png(tmp_path: Path) -> None:
    rows = [
        {"curve": "a", "x": 0.1, "y": 0.5},
        {"curve": "a", "x": 0.2, "y": 0.25},
        {"curve": "RDP b", "x": 0.1, "y": 0.7},
        {"curve": "RDP b", "x": 0.2, "y": 0.0},
    ]
    csv_path, png_path = write(1, rows, tmp_path)
    with csv_path.open() as fh:
        assert [r["y"] for r in csv.DictReader(fh)] == ["0.5", "0.25", "0.7", "0.0"]
    assert png_path.stat().st_size > 1000
