"""What a run prints and when it saves: the header, plain progress, the ignored-Ctrl-C note, the
time-based checkpoint, live metrics rows, ``threads: auto``, the device check, and a plot made
before the first evaluation."""

from __future__ import annotations

import signal
from pathlib import Path

import matplotlib.pyplot as plt
import pytest
import torch
import yaml
from shuffle_experiments import console, runner, session
from shuffle_experiments.config import ConfigError, load_config
from shuffle_experiments.plots import plot_run

from .support import record_plots

ROOT = Path(__file__).resolve().parents[2]
CHEAP = [
    "privacy.noise_multiplier=2.0",
    "data.train_subset=300",
    "data.test_subset=100",
    "training.rounds=8",
    "training.eval_every=8",
    "training.checkpoint_every=4",
    "privacy.curves=[exact]",
    # One torch thread: the suite's two workers share two cores (a test below sets auto).
    "training.threads=1",
]


def cheap_config(tmp_path: Path, data: list[str], *extra: str):
    """The cheap config writing under ``tmp_path``, reading MNIST as ``data`` says."""
    overrides = [*CHEAP, *data, f"output_dir={tmp_path}", *extra]
    return load_config(ROOT / "configs" / "smoke.yaml", overrides)


def test_a_run_in_a_log_says_where_it_is_and_how_it_goes(tmp_path, monkeypatch, small_mnist):
    """One run stopped at round 4 and resumed through ``latest``: the header, plain progress
    lines (pytest's stderr is not a terminal), the note about an ignored SIGINT, ``threads:
    auto`` written resolved, a plot before the first evaluation, the resumed run's own name."""
    monkeypatch.setattr(runner, "auto_threads", lambda: 1)
    cfg = cheap_config(tmp_path, small_mnist, "training.threads=auto")
    messages: list[str] = []
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)  # as in a background job
    try:
        first = runner.run(cfg, progress=True, stop_after=4, echo=messages.append)
    finally:
        signal.signal(signal.SIGINT, previous)
    run_dir = first.run_dir
    assert messages[0] == f"run directory   {run_dir}"
    assert messages[2].startswith("device          cpu, 1 threads (")
    protocol = "protocol        checkin: 300 clients, rate 0.1, 8 rounds"
    assert any(m.startswith(protocol) for m in messages)
    privacy = next(m for m in messages if m.startswith("privacy"))
    assert "epsilon after all rounds" in privacy and "(exact, delta 1e-05)" in privacy
    assert any("Ctrl-C is ignored in this process" in m and "kill -TERM" in m for m in messages)
    lines = [m for m in messages if m.startswith("round ")]
    assert [m.split()[1] for m in lines] == ["1/8", "2/8", "3/8", "4/8"]
    assert "eps[exact]=" in lines[-1]
    assert yaml.safe_load((run_dir / "config.yaml").read_text())["training"]["threads"] == 1
    # No evaluation yet (round 8 is the first): the accuracy figure says so.
    figures = []
    monkeypatch.setattr(plt, "close", figures.append)
    plot_run(run_dir)
    monkeypatch.undo()
    accuracy = figures[0].axes[0]
    assert accuracy.get_legend() is None and not accuracy.lines
    assert any("no evaluation yet" in t.get_text() for t in accuracy.texts)
    plotted = record_plots(monkeypatch)  # the figure before the first evaluation is checked
    resumed = runner.resume(tmp_path / "smoke" / "latest", progress=False, echo=lambda _: None)
    assert resumed.run_dir == run_dir.resolve() and resumed.rounds_done == 8
    assert plotted == [run_dir.resolve()]


def test_auto_threads_leave_the_busy_cores_alone(monkeypatch):
    monkeypatch.setattr(console, "usable_cores", lambda: 2)
    for load, threads in [(0.0, 2), (0.6, 1), (1.0, 1), (5.0, 1)]:
        monkeypatch.setattr(console, "machine_load", lambda load=load: load)
        assert console.auto_threads() == threads


def test_a_time_based_checkpoint_bounds_what_a_crash_loses(tmp_path, monkeypatch, small_mnist):
    cfg = cheap_config(
        tmp_path, small_mnist, "training.checkpoint_minutes=1e-6", "training.checkpoint_every=100"
    )
    original = session.Session.round

    def crashing(self, indices, round_number):
        if round_number == 6:
            raise RuntimeError("the machine went away")
        return original(self, indices, round_number)

    monkeypatch.setattr(session.Session, "round", crashing)
    with pytest.raises(RuntimeError):
        runner.run(cfg, run_dir=tmp_path / "r", progress=False, echo=lambda _: None)
    assert torch.load(tmp_path / "r" / "checkpoint.pt", weights_only=True)["round"] == 5
    # Rows reached metrics.csv before the crash, not only at checkpoints and evaluations.
    rows = (tmp_path / "r" / "metrics.csv").read_text().splitlines()
    assert [r.split(",")[0] for r in rows[1:]] == ["1", "2", "3", "4", "5"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_an_unavailable_device_is_refused_before_the_run_directory_exists(tmp_path, small_mnist):
    cfg = cheap_config(tmp_path, small_mnist, "training.device=cuda")
    with pytest.raises(ConfigError, match="training.device cuda is not available here"):
        runner.run(cfg, progress=False, echo=lambda _: None)
    assert not (tmp_path / "smoke").exists()


def test_a_log_gets_its_first_progress_line_after_the_first_round(monkeypatch):
    """Without a terminal the first line comes after round 1 (not after total/20 rounds), with
    the speed and the time left; then every total/20 rounds."""
    clock = iter(t / 10.0 for t in range(0, 10_000))
    monkeypatch.setattr(console.time, "monotonic", lambda: next(clock))
    lines: list[str] = []
    bar = console.Progress(1400, 0, lines.append)  # started at t = 0
    bar.update(1)  # t = 0.1 s: ten rounds a second
    assert lines == ["round 1/1400  10 rounds/s  2m20s left"]
    for _ in range(68):
        bar.update(1)
    assert len(lines) == 1
    bar.update(1)
    assert lines[-1] == "round 70/1400  10 rounds/s  2m13s left"
    assert console._duration(3725) == "1h02m" and console._duration(9) == "9s"
