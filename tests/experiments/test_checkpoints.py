"""Checkpoint safety and crash recovery of the experiment runner.

* checkpoints load with ``torch.load(weights_only=True)``; a file holding other objects, a
  truncated or corrupted file, another layout and another config are one-line errors;
* a training killed with SIGKILL at random moments (and in the middle of writing a checkpoint)
  resumes to the same ``metrics.csv`` (every round exactly once) and the same weights as an
  uninterrupted run;
* runs started at the same moment get different run directories, and ``latest`` only ever
  points at a directory that holds its config.
"""

from __future__ import annotations

import builtins
import csv
import errno
import io
import json
import os
import pickle
import random
import select
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
import yaml
from shuffle_experiments import checkpoint, runner
from shuffle_experiments.cli import main
from shuffle_experiments.config import ConfigDeprecationWarning, ConfigError, load_config

from shuffle_opacus.common.provenance import config_hash

from .support import record_plots

ROOT = Path(__file__).resolve().parents[2]
SMALL = [
    # Analysis sigma 1: the privacy loss distribution of a round is cheap to build (the smoke
    # config's 0.5 has the heavy-tailed reports whose pair takes seconds).
    "privacy.noise_multiplier=2.0",
    "data.train_subset=400",
    "data.test_subset=100",
    "training.rounds=24",
    # Evaluations every 2 rounds: round 4, the checkpoint of ``stopped``, is one, and those at
    # rounds 6, 10, ... flush rows that the checkpoints (every 4) have not yet covered (the
    # SIGKILL test).
    "training.eval_every=2",
    "training.checkpoint_every=4",
    "privacy.curves=[exact]",
    # One torch thread: the suite runs two workers on two cores, and a second thread per worker
    # spins on a busy core (a run took two to four times as long with 2 threads as with 1).
    "training.threads=1",
]


def small_config(tmp_path: Path, data: list[str], *extra: str):
    """The small config writing under ``tmp_path``, reading MNIST as ``data`` says."""
    overrides = [*SMALL, *data, f"output_dir={tmp_path}", *extra]
    return load_config(ROOT / "configs" / "smoke.yaml", overrides)


def quiet(_: str) -> None:
    pass


def rows(run_dir: Path) -> list[dict[str, str]]:
    with (run_dir / "metrics.csv").open(newline="") as fh:
        return list(csv.DictReader(fh))


@pytest.fixture(scope="module")
def reference(tmp_path_factory, small_mnist, driver):
    """An uninterrupted run of the small config (its directory).

    It asks for ``driver`` only to start that process here: its imports overlap this run and
    the tests up to the SIGKILL test, which compares its resumed run with this one.
    """
    base = tmp_path_factory.mktemp("reference")
    runner.run(small_config(base, small_mnist), run_dir=base / "run", progress=False, echo=quiet)
    return base / "run"


@pytest.fixture(scope="module")
def stopped_template(tmp_path_factory, small_mnist):
    """A run of the small config stopped (with a checkpoint) after round 4; copied per test."""
    base = tmp_path_factory.mktemp("stopped")
    run_dir = base / "run"
    config = small_config(base, small_mnist)
    runner.run(config, run_dir=run_dir, progress=False, stop_after=4, echo=quiet)
    return run_dir


@pytest.fixture
def stopped(stopped_template, tmp_path):
    """A fresh copy of ``stopped_template`` that a test may damage or resume."""
    run_dir = tmp_path / "run"
    shutil.copytree(stopped_template, run_dir)
    return run_dir


def resume_error(run_dir: Path) -> str:
    with pytest.raises(ConfigError) as info:
        runner.resume(run_dir, progress=False, echo=quiet)
    message = str(info.value)
    assert "\n" not in message
    return message


# --- safe loading ------------------------------------------------------------------------------


def test_checkpoint_is_tensors_and_plain_containers(stopped):
    state = torch.load(stopped / "checkpoint.pt", weights_only=True)
    assert state["round"] == 4 and state["format"] == runner.CHECKPOINT_FORMAT
    written = yaml.safe_load((stopped / "config.yaml").read_text())
    assert state["config"]["optimizer"] == written["optimizer"]


class _Payload:
    """An object whose unpickling would run a command (what weights_only must refuse)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_checkpoint_with_code_is_refused_without_running_it(stopped, tmp_path):
    marker = tmp_path / "pwned"
    state = torch.load(stopped / "checkpoint.pt", weights_only=True)
    state["seconds"] = _Payload(marker)
    torch.save(state, stopped / "checkpoint.pt")
    message = resume_error(stopped)
    assert "holds objects other than tensors and plain containers" in message
    assert str(stopped / "checkpoint.pt") in message
    assert not marker.exists()


@pytest.mark.parametrize("damage", ["truncate", "garbage", "empty", "plain-pickle"])
def test_damaged_checkpoint_is_one_line(stopped, damage):
    path = stopped / "checkpoint.pt"
    data = path.read_bytes()
    damaged = {
        "truncate": data[: len(data) // 2],
        "garbage": os.urandom(4096),
        "empty": b"",
        "plain-pickle": pickle.dumps({"round": 4}),  # not torch's format
    }
    path.write_bytes(damaged[damage])
    message = resume_error(stopped)
    assert message.startswith(f"checkpoint {path} is truncated, corrupted or not a checkpoint")


def test_checkpoint_of_another_config_is_refused(stopped):
    path = stopped / "config.yaml"
    raw = yaml.safe_load(path.read_text())
    raw["optimizer"]["lr"] = 0.25
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    assert "was written for a different config than" in resume_error(stopped)


def test_placement_may_change_between_sessions(stopped, reference, monkeypatch):
    path = stopped / "config.yaml"
    raw = yaml.safe_load(path.read_text())
    raw["training"]["device"] = "cpu"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    plotted = record_plots(monkeypatch)  # the rows are compared, not the figures
    runner.resume(stopped, progress=False, echo=quiet)
    assert rows(stopped) == rows(reference) and len(plotted) == 1


def test_a_run_begun_under_the_old_key_resumes_as_it_was_with_a_note(
    stopped, reference, monkeypatch
):
    # A run checkpointed before privacy.accountants became privacy.curves: its config.yaml and
    # its checkpoint's copy of the config both name the old key.
    path = stopped / "config.yaml"
    text = path.read_text()
    assert text.count("\n  curves:\n") == 1
    old_text = text.replace("\n  curves:\n", "\n  accountants:\n")
    path.write_text(old_text)
    ckpt = stopped / "checkpoint.pt"
    state = torch.load(ckpt, weights_only=True)
    privacy = state["config"]["privacy"]
    state["config"]["privacy"] = {("accountants" if k == "curves" else k): v
                                  for k, v in privacy.items()}  # fmt: skip
    state["checksum"] = checkpoint.checksum(state)
    torch.save(state, ckpt)
    plotted = record_plots(monkeypatch)  # the rows and the provenance are checked, no figure
    with pytest.warns(ConfigDeprecationWarning, match="privacy.curves") as notes:
        result = runner.resume(stopped, progress=False, echo=quiet)
    assert len(plotted) == 1
    assert {str(n.message) for n in notes if n.category is ConfigDeprecationWarning}
    assert rows(stopped) == rows(reference)
    # Its config.yaml is kept as it was, so the hash that identifies the run is unchanged.
    assert path.read_text() == old_text
    assert result.provenance["config_hash"] == config_hash(old_text.encode())


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda s: s.update(format=1), "has layout 1, this version reads layout"),
        (lambda s: s.pop("noise_generator"), "not a checkpoint of this experiment (noise_gen"),
        (lambda s: s.update(round=10**6), "is at round 1000000, outside 1..24"),
        (lambda s: s["model"].update({"0.weight": torch.zeros(3)}), "does not fit this run"),
    ],
)  # fmt: skip
def test_inconsistent_checkpoint_is_one_line(stopped, edit, message):
    path = stopped / "checkpoint.pt"
    state = torch.load(path, weights_only=True)
    edit(state)
    state["checksum"] = checkpoint.checksum(state)  # edited with its checksum: a consistent file
    torch.save(state, path)
    assert message in resume_error(stopped)


def test_cli_reports_a_damaged_checkpoint_on_one_line(stopped, capsys):
    (stopped / "checkpoint.pt").write_bytes(b"PK\x03\x04 not really a zip")
    assert main(["train", "--resume", str(stopped), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "is truncated, corrupted or not a checkpoint" in err


# --- check, then write ----------------------------------------------------------------------


def _snapshot(run_dir: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(run_dir.iterdir())}


def test_resume_refuses_an_accountant_the_config_contradicts_before_writing(stopped):
    """config.yaml and the checkpoint's copy both edited (sigma x 4): the accountant says no."""
    raw = yaml.safe_load((stopped / "config.yaml").read_text())
    raw["privacy"]["noise_multiplier"] *= 4
    (stopped / "config.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    state = torch.load(stopped / "checkpoint.pt", weights_only=True)
    state["config"]["privacy"]["noise_multiplier"] = raw["privacy"]["noise_multiplier"]
    state["checksum"] = checkpoint.checksum(state)
    torch.save(state, stopped / "checkpoint.pt")
    before = _snapshot(stopped)
    message = resume_error(stopped)
    assert "the accountant holds the rounds" in message and "config.yaml implies" in message
    assert _snapshot(stopped) == before  # no summary, plot or metrics row was written


def test_a_second_session_in_the_same_run_directory_is_refused(stopped):
    import fcntl

    before = _snapshot(stopped)
    fd = os.open(stopped, os.O_RDONLY)  # what a running session holds
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        assert "is in use by another training session" in resume_error(stopped)
    finally:
        os.close(fd)
    assert _snapshot(stopped) == before


def test_output_dir_that_is_a_file_is_one_line(tmp_path, capsys, small_mnist):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    argv = ["train", "--config", str(ROOT / "configs" / "smoke.yaml"), "--no-progress"]
    # One curve: the config is checked and the curves set up before the directory is made, and
    # the smoke config's clones curve alone takes seconds to set up (its round profile). The
    # data are loaded before too: the small copy, as the other runs of this file read.
    argv += ["--set", "privacy.curves=[exact]"]
    argv += [arg for override in small_mnist for arg in ("--set", override)]
    assert main([*argv, "--set", f"output_dir={blocker}"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert f"output_dir: cannot create the directory {blocker / 'smoke'} (Not a directory)" in err


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
def test_a_full_disk_during_a_checkpoint_is_one_line_and_leaves_no_temporary(tmp_path):
    path = tmp_path / "checkpoint.pt"
    path.write_bytes(b"the previous checkpoint")
    tmp = tmp_path / "checkpoint.pt.tmp"
    tmp.symlink_to("/dev/full")  # every write to it fails with ENOSPC, as on a full disk
    with pytest.raises(OSError, match=r"cannot write .*checkpoint.pt \(No space left on dev"):
        checkpoint.save_checkpoint({"weights": torch.zeros(4096)}, path)
    assert path.read_bytes() == b"the previous checkpoint"
    assert not tmp.exists() and not tmp.is_symlink()


def _edit_metrics(run_dir: Path, edit) -> None:
    path = run_dir / "metrics.csv"
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join(edit(lines)))


def _resume_one_round(run_dir: Path) -> list[str]:
    said: list[str] = []
    runner.resume(run_dir, progress=False, echo=said.append, stop_after=5)
    return said


def test_a_row_cut_at_the_checkpoint_round_is_rebuilt_and_said(stopped, reference):
    cut = rows(stopped)[3]
    row = f"4,{cut['participants']},{cut['train_loss']},,,\n"  # the rest of the row is lost
    _edit_metrics(stopped, lambda ls: [*ls[:4], row])
    said = _resume_one_round(stopped)
    assert any("rounds 4 rebuilt from the checkpoint" in line for line in said), said
    got, want = rows(stopped), rows(reference)
    assert [int(r["round"]) for r in got] == [1, 2, 3, 4, 5]
    assert got[3]["eps_exact"] == want[3]["eps_exact"] != ""
    assert got[3]["participants"] == want[3]["participants"]
    assert got[3]["test_accuracy"] == "" and got[:3] == want[:3] and got[4] == want[4]


def test_a_deleted_metrics_file_is_rebuilt_up_to_the_checkpoint(stopped, reference):
    (stopped / "metrics.csv").unlink()
    said = _resume_one_round(stopped)
    assert any("rounds 1-4 rebuilt from the checkpoint (the file was missing)" in s for s in said)
    got, want = rows(stopped), rows(reference)
    assert [int(r["round"]) for r in got] == [1, 2, 3, 4, 5]
    for mine, theirs in zip(got[:4], want[:4], strict=True):
        assert (mine["participants"], mine["eps_exact"]) == (
            theirs["participants"],
            theirs["eps_exact"],
        )
        assert mine["train_loss"] == mine["test_accuracy"] == ""
    assert got[4] == want[4]


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda ls: [ls[0], "x" + ls[1], *ls[2:]], "metrics.csv line 2: the round 'x1' is not an"),
        (lambda ls: [*ls, ls[2]], "metrics.csv lists round 2 twice (lines 3 and 6)"),
        (lambda ls: [ls[0].replace("eps_exact", "eps"), *ls[1:]], "has the columns"),
        (lambda ls: [ls[0], ls[1].replace(",", ",1", 1), *ls[2:]], "participants in rounds 1-4"),
    ],
)  # fmt: skip
def test_metrics_that_cannot_be_interpreted_are_refused_in_one_line(stopped, edit, message):
    _edit_metrics(stopped, edit)
    before = _snapshot(stopped)
    got = resume_error(stopped)
    assert message in got and str(stopped / "metrics.csv") in got
    assert _snapshot(stopped) == before


# --- epsilon columns, checksums and the files of a finished run ------------------------------


def _halve(value: str) -> str:
    return repr(float(value) / 2)


def _set_eps(run_dir: Path, column: str, changes: dict[int, object]) -> None:
    """Overwrite ``column`` of the given rounds of metrics.csv (a value or a function of it)."""
    path = run_dir / "metrics.csv"
    with path.open(newline="") as fh:
        reader = csv.DictReader(fh)
        columns, table = list(reader.fieldnames or []), list(reader)
    for row in table:
        change = changes.get(int(row["round"]))
        if change is not None:
            row[column] = change(row[column]) if callable(change) else str(change)
    with path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=columns)
        writer.writeheader()
        writer.writerows(table)


def test_hand_edited_epsilons_are_recomputed_said_and_not_plotted(stopped, reference):
    # Round 4 is an evaluation round: its epsilon is a point of accuracy_vs_epsilon.
    _set_eps(stopped, "eps_exact", {2: _halve, 3: "0.001", 4: _halve})
    said: list[str] = []
    runner.resume(stopped, progress=False, echo=said.append)
    lines = [s for s in said if "eps_exact" in s]
    assert len(lines) == 1, said
    assert str(stopped / "metrics.csv") in lines[0] and "rounds 2-4" in lines[0]
    # Repaired, not rebuilt: the losses and the accuracy of those rounds are kept.
    assert rows(stopped) == rows(reference)
    for name in ("epsilon_vs_rounds.csv", "accuracy_vs_epsilon.csv"):
        assert (stopped / name).read_text() == (reference / name).read_text(), name


@pytest.mark.parametrize("value", ["", "many", "-1"])
def test_an_unreadable_epsilon_is_recomputed_and_the_row_kept(stopped, reference, value):
    _set_eps(stopped, "eps_exact", {3: value})
    said = _resume_one_round(stopped)
    assert any("eps_exact of rounds 3 " in s for s in said), said
    assert rows(stopped) == rows(reference)[:5]


def test_resume_recomputes_no_epsilon_of_an_intact_file(stopped, monkeypatch):
    from shuffle_experiments.curves import EpsilonCurves

    asked: list[int] = []
    row = EpsilonCurves.row

    def counted(self, rounds, *, sparse=True):
        asked.append(rounds)
        return row(self, rounds, sparse=sparse)

    monkeypatch.setattr(EpsilonCurves, "row", counted)
    said = _resume_one_round(stopped)
    # Round 4 (the checkpoint's, whose row is checked against the accounting as it is now) and
    # round 5 (its row, and the result at the stop): rounds 1-3 are not recomputed.
    assert set(asked) == {4, 5} and not any("eps_" in s for s in said), (asked, said)


def test_epsilons_are_recomputed_when_the_accounting_changed(stopped, reference, monkeypatch):
    # The file is as the checkpoint says, but the code now computes other numbers (a fix of the
    # accounting between two sessions): the rows up to the checkpoint follow the new code.
    from shuffle_experiments.curves import EpsilonCurves

    epsilon = EpsilonCurves.epsilon
    monkeypatch.setattr(EpsilonCurves, "epsilon", lambda self, n, t: 0.5 * epsilon(self, n, t))
    said = _resume_one_round(stopped)
    assert any("eps_exact of rounds 1-4 did not match" in s for s in said), said
    got, want = rows(stopped), rows(reference)[:5]
    assert [float(r["eps_exact"]) for r in got] == [0.5 * float(r["eps_exact"]) for r in want]
    assert [r["train_loss"] for r in got] == [r["train_loss"] for r in want]


def _flip_a_weight_byte(path: Path) -> None:
    state = torch.load(path, weights_only=True)
    weight = max(state["model"].values(), key=lambda t: t.numel())
    data = bytearray(path.read_bytes())
    at = data.find(weight.numpy().tobytes())
    assert at >= 0
    data[at + weight.numel() * weight.element_size() // 2] ^= 0x10
    path.write_bytes(bytes(data))


def test_the_checksum_covers_every_entry_and_its_type(stopped):
    state = torch.load(stopped / "checkpoint.pt", weights_only=True)
    assert state["checksum"] == checkpoint.checksum(state)
    seen = {checkpoint.checksum(state)}
    for key in [k for k in state if k != "checksum"]:
        edited = dict(state)
        edited[key] = [edited[key]]  # the same value, wrapped: another content
        seen.add(checkpoint.checksum(edited))
    noise = state["noise_generator"].clone()
    noise[-1] ^= 1
    seen.add(checkpoint.checksum({**state, "noise_generator": noise}))
    for value in (1, 1.0, True, "1", b"1", None, [1], (1,), {1: 1}, {"1": 1}):
        seen.add(checkpoint.checksum({**state, "round": value}))
    assert len(seen) == 1 + (len(state) - 1) + 1 + 10
    # Independent of the entries' order (a dict read back keeps the order it was written in).
    assert checkpoint.checksum(dict(reversed(state.items()))) == state["checksum"]


def test_a_flipped_byte_in_a_weight_is_refused_in_one_line(stopped, capsys):
    path = stopped / "checkpoint.pt"
    _flip_a_weight_byte(path)
    before = _snapshot(stopped)
    message = resume_error(stopped)
    assert message.startswith(f"checkpoint {path} fails its checksum"), message
    assert _snapshot(stopped) == before
    assert main(["train", "--resume", str(stopped), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"checkpoint {path} fails its checksum" in err


def _unsigned(path: Path, weight: float | None = None) -> None:
    """Rewrite a checkpoint as the previous version wrote it: layout 2, no checksum, no digest
    of the epsilon columns; with ``weight``, one weight of the model set to it."""
    state = torch.load(path, weights_only=True)
    for key in ("checksum", "epsilon_sha256"):
        state.pop(key)
    state["format"] = 2
    if weight is not None:
        next(iter(state["model"].values())).view(-1)[0] = weight
    torch.save(state, path)


def test_a_checkpoint_without_checksum_is_refused_without_the_explicit_flag(stopped, capsys):
    # Before: a weight set to 7 in an unsigned checkpoint resumed with only a warning.
    path = stopped / "checkpoint.pt"
    _unsigned(path, weight=7.0)
    before = _snapshot(stopped)
    message = resume_error(stopped)
    assert message.startswith(f"checkpoint {path} has no checksum (layout 2"), message
    assert message.endswith("unless you pass --allow-unsigned-checkpoint (allow_unsigned=True)")
    assert main(["train", "--resume", str(stopped), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--allow-unsigned-checkpoint" in err
    assert _snapshot(stopped) == before
    assert main(["train", "--config", "x.yaml", "--allow-unsigned-checkpoint"]) == 2
    assert "applies to --resume RUN_DIR only" in capsys.readouterr().err


def test_plot_of_a_finished_run_with_an_unsigned_checkpoint_needs_the_flag(
    reference, tmp_path, capsys
):
    run_dir = tmp_path / "run"
    shutil.copytree(reference, run_dir)
    _unsigned(run_dir / "checkpoint.pt")
    assert main(["plot", str(run_dir)]) == 2
    assert "--allow-unsigned-checkpoint" in capsys.readouterr().err
    assert main(["plot", str(run_dir), "--allow-unsigned-checkpoint"]) == 0


def test_a_checkpoint_without_checksum_loads_with_the_flag_and_its_epsilons_are_checked(
    stopped, reference
):
    path = stopped / "checkpoint.pt"
    _unsigned(path)
    _set_eps(stopped, "eps_exact", {1: _halve})
    said: list[str] = []
    runner.resume(
        stopped, progress=False, echo=said.append, stop_after=8, allow_unsigned_checkpoint=True
    )  # a checkpoint at 8
    assert any(f"checkpoint {path} has no checksum" in s for s in said), said
    assert any("eps_exact of rounds 1 " in s for s in said), said
    assert rows(stopped) == rows(reference)[:8]
    written = torch.load(path, weights_only=True)
    assert written["round"] == 8 and written["format"] == runner.CHECKPOINT_FORMAT
    assert written["checksum"] == checkpoint.checksum(written)


def _full_disk(monkeypatch, *names: str, error: int = errno.ENOSPC) -> None:
    """Make every write to a file of one of these ``names`` fail as a full disk does.

    The error carries no file name, as a real failing ``write`` does not.
    """
    real_open = builtins.open

    class Full:
        def __init__(self, fh) -> None:
            self._fh = fh

        def write(self, data) -> int:
            raise OSError(error, os.strerror(error))

        def __getattr__(self, attr):
            return getattr(self._fh, attr)

        def __enter__(self):
            return self

        def __exit__(self, *exc) -> None:
            self._fh.close()

    def fake_open(file, mode="r", *args, **kwargs):
        fh = real_open(file, mode, *args, **kwargs)
        named = isinstance(file, (str, os.PathLike)) and Path(file).name in names
        return Full(fh) if named and any(c in mode for c in "wax+") else fh

    monkeypatch.setattr(builtins, "open", fake_open)
    monkeypatch.setattr(io, "open", fake_open)


def _summary(run_dir: Path, *ignore: str) -> dict:
    summary = json.loads((run_dir / "summary.json").read_text())
    for key in ("run_dir", "plots", *ignore):
        summary.pop(key)
    return summary


def test_a_full_disk_at_the_summary_names_it_and_resume_writes_it(
    stopped, reference, monkeypatch, capsys
):
    _full_disk(monkeypatch, "summary.json", "summary.json.tmp")
    plotted = record_plots(monkeypatch)  # drawn before the summary: not what is tested here
    assert main(["train", "--resume", str(stopped), "--no-progress"]) == 2
    assert len(plotted) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert f"{stopped / 'summary.json'} (No space left on device)" in err, err
    assert not (stopped / "summary.json").exists() and not list(stopped.glob("*.tmp"))
    monkeypatch.undo()
    # The disk has room again: --resume of the finished run writes the summary, no training.
    plotted = record_plots(monkeypatch)
    assert main(["train", "--resume", str(stopped), "--no-progress"]) == 0
    assert len(plotted) == 1
    out = capsys.readouterr().out
    assert "the run is complete (24 of 24 rounds)" in out and "test accuracy" in out
    # Provenance differs between the two runs (their configs' output paths, hence hashes).
    timing = ("seconds", "seconds_per_round", "provenance")
    assert _summary(stopped, *timing) == _summary(reference, *timing)


def test_plot_rewrites_the_summary_and_plots_of_a_finished_run(reference, tmp_path, capsys):
    run_dir = tmp_path / "run"
    shutil.copytree(reference, run_dir)
    for name in ("summary.json", "epsilon_vs_rounds.png", "accuracy_vs_epsilon.csv"):
        (run_dir / name).unlink()
    assert main(["plot", str(run_dir)]) == 0
    printed = capsys.readouterr().out
    assert str(run_dir / "summary.json") in printed
    assert _summary(run_dir) == _summary(reference)
    for name in ("epsilon_vs_rounds.csv", "accuracy_vs_epsilon.csv"):
        assert (run_dir / name).read_text() == (reference / name).read_text(), name
    assert (run_dir / "epsilon_vs_rounds.png").is_file()


@pytest.mark.parametrize(
    ("name", "error"),
    [
        ("epsilon_vs_rounds.png", errno.ENOSPC),
        ("accuracy_vs_epsilon.csv", errno.EFBIG),
        ("summary.json", errno.EFBIG),
    ],
)
def test_plot_names_the_file_it_cannot_write(reference, tmp_path, monkeypatch, capsys, name, error):
    run_dir = tmp_path / "run"
    shutil.copytree(reference, run_dir)
    _full_disk(monkeypatch, name, f"{name}.tmp", error=error)
    assert main(["plot", str(run_dir)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert f"cannot write {run_dir / name} ({os.strerror(error)})" in err, err
    assert not list(run_dir.glob("*.tmp"))


def test_a_metrics_file_too_large_names_it(stopped, monkeypatch, capsys):
    _full_disk(monkeypatch, "metrics.csv", error=errno.EFBIG)  # the rows appended per round
    assert main(["train", "--resume", str(stopped), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert f"cannot write {stopped / 'metrics.csv'} (File too large)" in err, err
    assert not list(stopped.glob("*.tmp"))


# --- SIGKILL at random moments ------------------------------------------------------------


# The children are forks of a driver (``_DRIVER``): a fresh interpreter that imports torch and
# the runner once (most of a new interpreter's time) and then, for each command on its stdin,
# forks a child that resumes the run. The driver itself never runs a torch operation, so there
# is no OpenMP pool whose fork could deadlock (a fork of the pytest process could); it imports
# what a resume would import on first use, so that no child spends its time importing (torch's
# first optimizer imports torch._dynamo, over a second per child). The children read the small
# copy of MNIST of ``small_mnist``, so that they start quickly. A child kills itself with SIGKILL
# at a chosen point, so that where it dies does not depend on how quickly a busy machine
# schedules a watching parent:
# * "round K": as round K begins, with the rows since the last flush still buffered and, when an
#   evaluation flushed them, rows past the last checkpoint already on disk;
# * "in-checkpoint": in the middle of writing the next checkpoint (a half-written temporary file).
# The driver answers each command with the signal that ended the child (or minus its exit status).
_DRIVER = """
import os, signal, sys, traceback
from pathlib import Path
import torch
from shuffle_experiments import runner, session
import torch._dynamo, torch.nn.utils._expanded_weights, tqdm.auto
import shuffle_opacus.analysis.rdp.checkin
def resume_and_die(run_dir, mode, kill_at):
    def die():
        os.kill(os.getpid(), signal.SIGKILL)
    if mode == "round":
        step = session.Session.round
        def round_or_die(self, indices, round_number):
            if round_number == kill_at:
                die()
            return step(self, indices, round_number)
        session.Session.round = round_or_die
    else:
        def save(obj, path):
            tmp = path.with_name(path.name + ".tmp")
            torch.save(obj, tmp)
            with tmp.open("r+b") as fh:
                fh.truncate(tmp.stat().st_size // 2)
            die()
        runner.save_checkpoint = save
    runner.resume(run_dir, progress=False, echo=lambda _: None)
while line := sys.stdin.readline():
    run_dir, mode, kill_at = line.rstrip("\\n").split("\\t")
    pid = os.fork()
    if pid == 0:
        status = 0
        try:
            resume_and_die(Path(run_dir), mode, int(kill_at))
        except BaseException:
            traceback.print_exc()
            status = 1
        finally:
            sys.stderr.flush()
            os._exit(status)
    _, status = os.waitpid(pid, 0)
    ended = os.WTERMSIG(status) if os.WIFSIGNALED(status) else -os.WEXITSTATUS(status)
    print(ended, flush=True)
"""


def _rounds_written(run_dir: Path) -> int:
    with (run_dir / "metrics.csv").open() as fh:
        return sum(1 for _ in fh) - 1


def _checkpoint_round(run_dir: Path) -> int:
    return int(torch.load(run_dir / "checkpoint.pt", weights_only=True)["round"])


def _resume_in_child(driver: subprocess.Popen, run_dir: Path, mode: str, kill_at: int = 0) -> int:
    """Resume in a child of ``driver`` that SIGKILLs itself (see ``_DRIVER``).

    Returns:
        The signal that ended the child (``SIGKILL`` expected).
    """
    assert driver.stdin is not None and driver.stdout is not None
    driver.stdin.write(f"{run_dir}\t{mode}\t{kill_at}\n")
    driver.stdin.flush()
    ready, _, _ = select.select([driver.stdout], [], [], 300)
    assert ready, "the child neither died nor finished within 300 s"
    return int(driver.stdout.readline())


@pytest.fixture(scope="module")
def driver():
    """The driver of ``_DRIVER`` (started by ``reference``: its imports overlap the tests)."""
    proc = subprocess.Popen(
        [sys.executable, "-c", _DRIVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    yield proc
    proc.kill()
    proc.communicate()


def test_sigkill_at_random_moments_then_resume_equals_uninterrupted(
    stopped, reference, driver, monkeypatch
):
    # The copy of the run stopped at round 4 is killed and resumed until it is done; the rows
    # past a checkpoint that a kill leaves on disk are those of the evaluations (every 2 rounds)
    # between the checkpoints (every 4).
    run_dir = stopped
    rng = random.Random(20261123)
    rows_past_checkpoint = []
    for _ in range(2):  # killed as a random later round begins
        kill_at = rng.randint(_checkpoint_round(run_dir) + 1, 24)
        assert _resume_in_child(driver, run_dir, "round", kill_at) == signal.SIGKILL
        assert _checkpoint_round(run_dir) < kill_at
        rows_past_checkpoint.append(_rounds_written(run_dir) - _checkpoint_round(run_dir))
    # The seeded draws include a kill that left rows on disk past the last checkpoint.
    assert max(rows_past_checkpoint) > 0, rows_past_checkpoint
    # Killed while writing a checkpoint: the half-written file must not be used.
    before = _checkpoint_round(run_dir)
    assert _resume_in_child(driver, run_dir, "in-checkpoint") == signal.SIGKILL
    assert (run_dir / "checkpoint.pt.tmp").exists()
    assert _checkpoint_round(run_dir) == before

    plotted = record_plots(monkeypatch)  # the rows and weights are compared, not the figures
    runner.resume(run_dir, progress=False, echo=quiet)
    assert len(plotted) == 1
    got = rows(run_dir)
    assert [int(r["round"]) for r in got] == list(range(1, 25))  # every round exactly once
    assert got == rows(reference)
    final = torch.load(run_dir / "checkpoint.pt", weights_only=True)["model"]
    expected = torch.load(reference / "checkpoint.pt", weights_only=True)["model"]
    for name, tensor in expected.items():
        assert torch.equal(final[name], tensor), name


def test_a_child_of_the_driver_that_fails_is_reported(driver, tmp_path):
    """The driver's answers can fail: a resume that raises ends its child with status 1."""
    assert _resume_in_child(driver, tmp_path / "no run here", "round", 1) == -1


# --- concurrent runs ----------------------------------------------------------------------


def test_runs_started_together_get_their_own_directories(tmp_path, small_mnist):
    config = small_config(tmp_path, small_mnist)
    made: list[Path] = []
    barrier = threading.Barrier(8)

    def start() -> None:
        barrier.wait()
        made.append(runner.new_run_dir(config))

    threads = [threading.Thread(target=start) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(made)) == 8 and all(p.is_dir() for p in made)


def test_latest_points_at_a_directory_with_its_config(tmp_path, small_mnist):
    # Each run stops after its first round (no plots): ``latest`` is pointed at a new run before
    # it trains.
    config = small_config(tmp_path, small_mnist, "training.rounds=2")
    seen: list[Path] = []
    incomplete: list[Path] = []
    stop = threading.Event()
    latest = tmp_path / "smoke" / "latest"

    def watch() -> None:
        while not stop.is_set():
            if latest.is_symlink():
                target = latest.resolve()
                seen.append(target)
                if not (target / "config.yaml").exists():
                    incomplete.append(target)
            time.sleep(0.0005)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        first = runner.run(config, progress=False, stop_after=1, echo=quiet).run_dir
        second = runner.run(config, progress=False, stop_after=1, echo=quiet).run_dir
    finally:
        stop.set()
        watcher.join()
    assert first != second and latest.resolve() == second.resolve()
    assert seen and not incomplete
