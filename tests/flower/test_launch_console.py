"""The launcher talks: one console line per round, --nodes and num-nodes agree, no silent wait."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("flwr")

from shuffle_opacus.flower.launch import RoundPrinter, main  # noqa: E402

TINY_APP = Path(__file__).parent / "tiny_app"

LOG = """\
INFO :      [ROUND 1/3]
INFO :      round 1: 9 reports, epsilon = 4.18214 (delta = 1e-05)
INFO :      [ROUND 2/3]
INFO :      round 2: 11 reports, epsilon = 5.90022 (delta = 1e-05)
INFO :      round 2: server evaluation {'test-loss': 0.41, 'test-accuracy': 0.8812}
INFO :      [ROUND 3/3]
INFO :      round 3: 0 reports, epsilon = 7.2 (delta = 1e-05)
INFO :      round 4: 8 nodes in the secure sum, 3 checked in, epsilon = 8.1 (delta = 1e-05)
"""


def test_one_line_per_round_with_the_accuracy_when_evaluated():
    lines: list[str] = []
    printer = RoundPrinter(lines.append, total=3)
    for line in LOG.splitlines():
        printer(line)
    assert lines[:2] == [
        "round 1/3: 9 reports, epsilon 4.18214 (delta 1e-05)",
        "round 2/3: 11 reports, epsilon 5.90022 (delta 1e-05), test-accuracy 0.8812",
    ]  # a round waits for a possible evaluation until the next round's line ...
    assert lines[-1] == "round 3/3: 0 reports, epsilon 7.2 (delta 1e-05)"  # round 4 came
    printer.flush()  # ... until the stream ends
    assert lines[-1] == (
        "round 4/3: 8 nodes in the secure sum, 3 checked in, epsilon 8.1 (delta 1e-05)"
    )
    assert printer.rounds_printed == 4


def test_nodes_and_num_nodes_must_agree_before_anything_starts(tmp_path, capsys):
    with pytest.raises(SystemExit) as info:
        main(["simulation", str(TINY_APP), "--nodes", "5", "-c", "num-nodes=100",
              "--work-dir", str(tmp_path / "w")])  # fmt: skip
    assert info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "-c num-nodes=100 disagrees with --nodes 5" in err
    assert not (tmp_path / "w").exists()  # refused before the federation was prepared
