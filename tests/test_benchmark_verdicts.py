"""The verdicts of benchmarks/training.py and benchmarks/clones.py, without timing anything.

What is checked is what the two scripts promise whatever the machine: a printed ratio never
sits on the other side of its goal from the verdict beside it, a busy run gets no verdict, every
mode is offered the same micro-batch settings, and the equal-work pairs of the clones benchmark
match like with like.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

import clones  # noqa: E402
import training  # noqa: E402


@pytest.mark.parametrize(
    ("value", "text"),
    [(0.7996, "79.96"), (0.79996, "79.996"), (0.799999996, "79.9999996"), (0.8, "80.00"),
     (0.80004, "80.00"), (0.81, "81.00")],
)  # fmt: skip
def test_a_printed_percentage_stays_on_its_side_of_the_goal(value: float, text: str) -> None:
    assert training.beside(value, 0.8) == text
    assert (float(text) / 100 >= 0.8) == (value >= 0.8)


def test_a_printed_ratio_stays_on_its_side_of_one() -> None:
    assert clones.beside(0.9996, 1, scale=1, digits=3) == "0.9996"
    assert clones.beside(0.2941, 1, scale=1, digits=3) == "0.294"


def test_a_busy_run_gets_no_verdict() -> None:
    quiet = training.load_verdict(0.2, 1.3, 1)
    assert quiet == []
    assert training.load_verdict(0.6, 1.0, 1)[0].startswith("load average 0.60 before")
    assert training.load_verdict(0.2, 1.6, 1)[0].startswith("load average 1.60 after")
    assert training.load_verdict(None, 1.0, 1) == ["load average unknown"]
    assert training.load_verdict(0.1, 0.1, 1, ["during: others"]) == ["during: others"]
    summary = {
        "batch": 6000,
        "best_against_best": [
            {"mode": "fast", "per_round": {"median": 0.7996}},
        ],
    }
    assert training.verdict(summary, []).endswith("79.96% (median of paired rounds) against the "
                                                  "goal of 80%: not met")  # fmt: skip
    busy = training.verdict(summary, ["load average 3.00 before (limit 0.5)"])
    assert "busy: no verdict" in busy
    assert "not met" not in busy and ": met" not in busy


def test_every_mode_is_offered_the_same_settings_and_the_order_rotates() -> None:
    args = argparse.Namespace(micro_batch=[200, 500], modes=["fast", "hooks"], floor=False)
    first = training.configurations(args, 0)
    settings = {mode: {mb for m, mb in first if m == mode} for mode, _ in first}
    assert settings == {m: {None, 200, 500} for m in ("non-private", "fast", "hooks")}
    second = training.configurations(args, 1)
    assert sorted(second, key=str) == sorted(first, key=str)
    assert second[0] == first[1] and second[-1] == first[0]


def test_paired_ratios_pool_rounds_and_keep_each_run() -> None:
    def run(private: list[float], public: list[float]) -> dict:
        def entry(seconds: list[float]) -> dict:
            return {"seconds": seconds, "extras": [{"participants": 100}] * len(seconds)}

        return {"contenders": {"fast": entry(private), "non-private": entry(public)}}

    line = training.paired([run([1.0, 2.0], [1.0, 1.0]), run([1.25, 1.25], [1.0, 1.0])],
                           "fast", "non-private")  # fmt: skip
    assert line["per_round"]["n"] == 4
    assert line["per_round"]["min"] == 0.5 and line["per_round"]["max"] == 1.0
    assert line["per_round"]["median"] == pytest.approx(0.8)
    assert line["per_run"] == pytest.approx([0.75, 0.8])  # medians of samples/s


def test_the_clones_pairs_match_like_with_like(tmp_path: Path) -> None:
    argvs = clones.commands(1000, tmp_path)
    for ours, apple, _ in clones.PAIRS:
        assert ours in argvs and apple in argvs
    assert "True)" in argvs[clones.APPLE_UPPER][-1] and "False" not in argvs[clones.APPLE_UPPER][-1]
    assert "True)" in argvs[clones.APPLE_BOTH][-1] and "False)" in argvs[clones.APPLE_BOTH][-1]
    assert "clones_epsilon" not in argvs[clones.OURS_UPPER][-1]
    assert clones.parse_bounds("upper 0.17 lower 0.16") == {"upper": 0.17, "lower": 0.16}
    lines = clones.accuracy({
        clones.APPLE_BOTH: {"upper": 0.172790, "lower": 0.167539},
        clones.OURS_BOTH: {"upper": 0.1697702, "lower": 0.1697696},
        clones.OURS_UPPER: {"upper": 0.1697702},
    })  # fmt: skip
    assert any(line.startswith("Apple's bounds") and "3.13%" in line for line in lines)
    assert not any(line.startswith("warning") for line in lines)
