"""What a run prints and when it saves: the header, plain progress, the ignored-Ctrl-C note, the
time-based checkpoint, live metrics rows, ``threads: auto`` and the device check."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
import torch
import yaml
from shuffle_experiments import console, runner, session
from shuffle_experiments.config import ConfigError, load_config

ROOT = Path(__file__).resolve().parents[2]
CHEAP = [
    "privacy.noise_multiplier=2.0",
    "data.train_subset=300",
    "data.test_subset=100",
    "training.rounds=8",
    "training.eval_every=4",
    "training.checkpoint_every=100",
    "privacy.accountants=[exact]",
]


def cheap_config(tmp_path: Path, *extra: str):
    return load_config(ROOT / "configs" / "smoke.yaml", [*CHEAP, f"output_dir={tmp_path}", *extra])


def test_the_header_comes_first_and_plain_lines_replace_the_bar_in_a_log(tmp_path):
    messages: list[str] = []
    runner.run(cheap_config(tmp_path), run_dir=tmp_path / "r", progress=True, echo=messages.append)
    assert messages[0] == f"run directory   {tmp_path / 'r'}"
    assert messages[2].startswith("device          cpu, 2 threads (")
    assert any(
        m.startswith("protocol        checkin: 300 clients, rate 0.1, 8 rounds") for m in messages
    )
    privacy = next(m for m in messages if m.startswith("privacy"))
    assert "epsilon after all rounds" in privacy and "(exact, delta 1e-05)" in privacy
    # pytest's stderr is not a terminal: one plain line per round here (8 rounds < 20).
    lines = [m for m in messages if m.startswith("round ")]
    assert [m.split()[1] for m in lines] == [f"{t}/8" for t in range(1, 9)]
    assert "eps[exact]=" in lines[-1] and "acc=" in lines[-1]


def test_an_ignored_sigint_is_announced(tmp_path):
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        messages: list[str] = []
        runner.run(cheap_config(tmp_path), run_dir=tmp_path / "r", progress=False,
                   echo=messages.append)  # fmt: skip
    finally:
        signal.signal(signal.SIGINT, previous)
    assert any("Ctrl-C is ignored in this process" in m and "kill -TERM" in m for m in messages)


def test_a_time_based_checkpoint_bounds_what_a_crash_loses(tmp_path, monkeypatch):
    cfg = cheap_config(tmp_path, "training.checkpoint_minutes=1e-6")  # every round, by time
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


def test_threads_auto_is_resolved_and_written_for_the_resume(tmp_path, monkeypatch):
    monkeypatch.setattr(console, "machine_load", lambda: 1.0)
    monkeypatch.setattr(console, "usable_cores", lambda: 2)
    assert console.auto_threads() == 1
    monkeypatch.setattr(runner, "auto_threads", lambda: 1)
    runner.run(cheap_config(tmp_path, "training.threads=auto"), run_dir=tmp_path / "r",
               progress=False, echo=lambda _: None)  # fmt: skip
    written = yaml.safe_load((tmp_path / "r" / "config.yaml").read_text())
    assert written["training"]["threads"] == 1


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_an_unavailable_device_is_refused_before_the_run_directory_exists(tmp_path):
    cfg = cheap_config(tmp_path, "training.device=cuda")
    with pytest.raises(ConfigError, match="training.device cuda is not available here"):
        runner.run(cfg, progress=False, echo=lambda _: None)
    assert not (tmp_path / "smoke").exists()


def test_a_resumed_run_names_its_own_directory_not_latest(tmp_path):
    cfg = cheap_config(tmp_path, "training.checkpoint_every=4")
    result = runner.run(cfg, progress=False, stop_after=4, echo=lambda _: None)
    latest = tmp_path / "smoke" / "latest"
    resumed = runner.resume(latest, progress=False, echo=lambda _: None)
    assert resumed.run_dir == result.run_dir.resolve() != latest


def test_a_plot_before_the_first_evaluation_says_so(tmp_path):
    from shuffle_experiments.plots import plot_run

    cfg = cheap_config(tmp_path, "training.checkpoint_every=2")
    runner.run(cfg, run_dir=tmp_path / "r", progress=False, stop_after=2, echo=lambda _: None)
    import matplotlib.pyplot as plt

    captured = {}
    original = plt.close

    def keep(fig):
        captured.setdefault("figs", []).append(fig)
        original(fig)

    plt.close = keep
    try:
        plot_run(tmp_path / "r")
    finally:
        plt.close = original
    accuracy = captured["figs"][0].axes[0]
    assert accuracy.get_legend() is None and not accuracy.lines
    assert any("no evaluation yet" in t.get_text() for t in accuracy.texts)
