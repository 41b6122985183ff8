"""The launcher talks: one console line per round, --nodes and num-nodes agree, no silent wait."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("flwr")

from shuffle_opacus.flower.checkin_base import round_line  # noqa: E402
from shuffle_opacus.flower.launch import RoundPrinter, main  # noqa: E402

TINY_APP = Path(__file__).parent / "tiny_app"


def _line(r, metrics, evaluation=None, stop_reason=None, mode="trusted-server"):
    record = {
        "round": r,
        "num_rounds": 3,
        "mode": mode,
        "metrics": {"delta": 1e-05, **metrics},
        "evaluation": evaluation,
        "stop_reason": stop_reason,
    }
    return "INFO :      " + round_line(record)


LOG = [
    "INFO :      [ROUND 1/3]",
    "INFO :      round 1: 9 reports, epsilon = 4.18214 (delta = 1e-05)",  # not read: no JSON
    _line(1, {"epsilon": 4.182141234, "num-reports": 9}),
    "INFO :      [ROUND 2/3]",
    _line(2, {"epsilon": 5.90022, "num-reports": 11}, {"test-loss": 0.41, "test-accuracy": 0.8812}),
    "INFO :      shuffle-dp.round {not json",
    _line(3, {"epsilon": 7.2, "num-reports": 0, "epsilon-proven": 19.5012345}),
    _line(4, {"epsilon": 8.1, "num-in-sum": 8, "num-checked-in": 3}, mode="secagg"),
    _line(5, {"epsilon": float("inf"), "num-in-sum": 0, "num-checked-in": 0}, None, "halted"),
]


def test_one_line_per_round_with_the_accuracy_when_evaluated():
    lines: list[str] = []
    printer = RoundPrinter(lines.append, total=3)
    for line in LOG:
        printer(line)
    assert lines == [
        "round 1/3: 9 reports, epsilon 4.18214 (delta 1e-05)",
        "round 2/3: 11 reports, epsilon 5.90022 (delta 1e-05), test-accuracy 0.8812",
        "round 3/3: 0 reports, epsilon 7.2 (delta 1e-05), proven epsilon 19.5012",
        "round 4/3: 8 nodes in the secure sum, 3 checked in, epsilon 8.1 (delta 1e-05)",
        "round 5/3: 0 nodes in the secure sum, 0 checked in, epsilon inf (delta 1e-05); halted",
    ]  # each round as soon as its line arrives, the evaluation in it
    assert printer.rounds_printed == 5
    untold: list[str] = []
    RoundPrinter(untold.append)(LOG[2])  # without total: the round line's num_rounds
    assert untold == ["round 1/3: 9 reports, epsilon 4.18214 (delta 1e-05)"]


def test_nodes_and_num_nodes_must_agree_before_anything_starts(tmp_path, capsys):
    with pytest.raises(SystemExit) as info:
        main(["simulation", str(TINY_APP), "--nodes", "5", "-c", "num-nodes=100",
              "--work-dir", str(tmp_path / "w")])  # fmt: skip
    assert info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "-c num-nodes=100 disagrees with --nodes 5" in err
    assert not (tmp_path / "w").exists()  # refused before the federation was prepared


def test_help_says_where_rounds_csv_goes(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "OUT_DIR/run-<run id>/ the app's own results" in text
    assert "writes rounds.csv (one row per round" in text
    assert "--out-dir OUT_DIR sets the app's out-dir (made absolute): rounds.csv" in text
    assert "WORK_DIR/logs/ superlink.log, supernode-<i>.log and run-<run id>.log" in text


def test_out_dir_needs_an_app_with_out_dir(tmp_path, capsys):
    app = tmp_path / "app"
    app.mkdir()
    (app / "pyproject.toml").write_text("[tool.flwr.app.config]\nnum-nodes = 2\n")
    with pytest.raises(SystemExit) as info:
        main(["simulation", str(app), "--nodes", "2", "--out-dir", "x",
              "--work-dir", str(tmp_path / "w")])  # fmt: skip
    assert info.value.code == 2 and "has no out-dir setting" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["simulation", str(TINY_APP), "--nodes", "2", "--out-dir", "x", "-c", "out-dir='/y'",
              "--work-dir", str(tmp_path / "w")])  # fmt: skip
    assert "--out-dir or -c out-dir=..., not both" in capsys.readouterr().err
    assert not (tmp_path / "w").exists()


def test_the_last_round_is_followed_by_what_each_epsilon_rests_on():
    """Once, after the last round's line: the guarantee, note and assumptions of both ε."""
    guarantees = {
        "epsilon": {"method": "pld", "sensitivity": 2.0, "delta": 1e-5, "note": None,
                    "assumptions": ["Theorem 1's pair is the worst case", "secret coins"]},
        "epsilon-proven": {"method": "proven", "sensitivity": 2.0, "delta": 1e-5,
                           "note": "route blanket", "assumptions": ["published theorems"]},
    }  # fmt: skip
    record = {"round": 3, "num_rounds": 3, "mode": "trusted-server", "guarantees": guarantees,
              "metrics": {"delta": 1e-5, "epsilon": 7.2, "epsilon-proven": 19.5}}  # fmt: skip
    early = {**record, "round": 2}
    lines: list[str] = []
    printer = RoundPrinter(lines.append)
    for r in (early, record, record):
        printer("INFO :      " + round_line(r))
    assert lines[1:6] == [
        "round 3/3: ? reports, epsilon 7.2 (delta 1e-05), proven epsilon 19.5",
        "guarantee: epsilon is replace-one of one node (unit of privacy: one node), method pld, "
        "sensitivity 2 C, delta 1e-05",
        "  assumes: Theorem 1's pair is the worst case",
        "  assumes: secret coins",
        "guarantee: proven epsilon is replace-one of one node (unit of privacy: one node), "
        "method proven, sensitivity 2 C, delta 1e-05",
    ]
    assert lines[6:] == ["  note: route blanket", "  assumes: published theorems", lines[1]]


def test_the_readmes_flower_run_prints_the_accountants_numbers():
    """The README's Flower example (20 nodes, 3 rounds, the app's defaults): its last round's
    epsilon and proven epsilon are the check-in accountant's for that configuration."""
    import re

    from shuffle_opacus import history_epsilon

    try:
        import tomllib
    except ImportError:  # Python 3.10: flwr brings tomli
        import tomli as tomllib

    root = Path(__file__).resolve().parents[2]
    readme = (root / "README.md").read_text(encoding="utf-8")
    app = tomllib.loads((root / "experiments" / "flower_mnist" / "pyproject.toml").read_text())
    config = app["tool"]["flwr"]["app"]["config"]
    line = re.search(r"round 3/3: .*epsilon ([0-9.]+) \(delta 1e-05\), proven epsilon ([0-9.]+)",
                     readme)  # fmt: skip
    assert line and "--nodes 20" in readme and "num-server-rounds=3" in readme
    history = [(config["noise-multiplier"], config["rate"], 3)]
    for value, method in ((line.group(1), None), (line.group(2), "proven")):
        expected = history_epsilon(history, protocol="checkin", delta=config["delta"],
                                   population=20, method=method).epsilon  # fmt: skip
        assert float(value) == pytest.approx(expected, rel=1e-5), method
