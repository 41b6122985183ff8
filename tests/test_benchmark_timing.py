"""The interleaving timing helper of the benchmarks (benchmarks/timing.py): order, records, workers.

Timings themselves are not asserted (the machine may be busy); what is checked is what the
helper promises regardless of load: the alternating order, the record's shape, self-timed
contenders, and the two ways of driving a contender that runs its own loop.
"""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

import timing  # noqa: E402


def test_rounds_alternate_their_order_and_the_record_holds_every_round(capsys):
    calls: list[tuple[str, int]] = []

    def contender(name: str):
        def run(r: int) -> None:
            calls.append((name, r))

        return run

    result = timing.compare(
        {"a": contender("a"), "b": contender("b"), "c": contender("c")},
        rounds=3,
        warmup=1,
        probe_s=0.01,
        progress=False,
        title="order",
    )
    assert calls == [
        ("a", 0), ("b", 0), ("c", 0),
        ("c", 1), ("b", 1), ("a", 1),
        ("a", 2), ("b", 2), ("c", 2),
        ("c", 3), ("b", 3), ("a", 3),
    ]  # fmt: skip
    assert result["baseline"] == "a"
    for name in "abc":
        entry = result["contenders"][name]
        assert len(entry["seconds"]) == 3
        assert entry["min"] <= entry["median"] <= entry["max"]
    assert result["ratios"]["a"]["median"] == pytest.approx(1.0)
    assert set(result["load"]) == {"before", "during", "after"}
    assert isinstance(result["busy"], bool)
    json.dumps(result)  # JSON-ready as it is
    out = capsys.readouterr().out
    assert "| a |" in out and "x baseline" in out


def test_self_timed_contenders_and_extras_are_kept():
    result = timing.compare(
        {
            "fixed": lambda: 2.0,
            "mapping": lambda r: {"seconds": 4.0, "reports": r},
            "zero-arg": lambda: None,
        },
        rounds=2,
        warmup=0,
        baseline="fixed",
        probe_s=0.01,
        show=False,
        progress=False,
    )
    assert result["contenders"]["fixed"]["seconds"] == [2.0, 2.0]
    assert result["contenders"]["mapping"]["extras"] == [{"reports": 0}, {"reports": 1}]
    assert result["ratios"]["mapping"]["median"] == pytest.approx(2.0)
    assert result["ratios"]["mapping"]["per_round"] == {"median": 2.0, "min": 2.0, "max": 2.0}


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="baseline must be one of"):
        timing.compare({"a": lambda: None}, rounds=1, baseline="b", show=False)
    with pytest.raises(ValueError, match="rounds must be >= 1"):
        timing.compare({"a": lambda: None}, rounds=0, show=False)


def test_threaded_rounds_run_one_round_per_call_and_stop_on_close():
    done: list[int] = []

    def driver(boundary):
        boundary()
        for r in range(10):
            done.append(r)
            boundary()

    rounds = timing.ThreadedRounds(driver)
    rounds()
    rounds()
    assert done == [0, 1]
    rounds.close()
    assert done == [0, 1]  # the driver ended at its next boundary, no further round ran


def test_round_worker_speaks_the_protocol(tmp_path):
    script = tmp_path / "worker.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import sys
            sys.path.insert(0, {str(BENCHMARKS)!r})
            import timing
            print("noise on stdout is passed on")
            timing.serve_rounds(
                lambda r: {{"seconds": 0.5, "round": r}},
                final=lambda: {{"bye": True}},
                hello={{"ready": True}},
            )
            """
        )
    )
    with timing.RoundWorker([sys.executable, str(script)], hello=True) as worker:
        assert worker.wait_hello() == {"ready": True}
        assert worker(3) == {"seconds": 0.5, "round": 3}
        result = timing.compare(
            {"worker": worker}, rounds=2, warmup=0, probe_s=0.01, show=False, progress=False
        )
        assert result["contenders"]["worker"]["seconds"] == [0.5, 0.5]
    assert worker.final == {"bye": True}


def test_whole_processes_record_exit_status_and_memory():
    result = timing.compare_commands(
        {
            "ok": [sys.executable, "-c", "pass"],
            "exit 3": [sys.executable, "-c", "raise SystemExit(3)"],
        },
        rounds=2,
        warmup=0,
        probe_s=0.01,
        show=False,
        progress=False,
    )
    assert result["contenders"]["ok"]["returncode"] == 0
    assert result["contenders"]["exit 3"]["returncode"] == 3
    assert result["contenders"]["ok"]["peak_rss_mib"] > 0
    assert result["mode"] == "whole process"
