"""Provenance records: versions from the installed metadata, the checkout's commit and state,
the config's hash, and the lines ``--version`` and the run headers print."""

from __future__ import annotations

import hashlib
import subprocess
from importlib import metadata
from pathlib import Path

import pytest

import shuffle_opacus
from shuffle_opacus.cli.command import main
from shuffle_opacus.common.provenance import (
    LIBRARIES,
    config_hash,
    git_state,
    provenance,
    provenance_lines,
)


def test_record_holds_every_field_with_the_installed_versions():
    record = provenance(config_text="a: 1\n", seed=7, seed_given=True)
    assert record["shuffle_opacus"] == shuffle_opacus.__version__
    assert record["versions"] == {name: metadata.version(name) for name in LIBRARIES}
    assert record["config_hash"] == "sha256:" + hashlib.sha256(b"a: 1\n").hexdigest()
    assert (record["seed"], record["seed_given"]) == (7, True)
    lines = provenance_lines(record)
    assert lines[0].startswith(f"shuffle-opacus {shuffle_opacus.__version__} (")
    assert "torch " + metadata.version("torch") in lines[1]
    assert lines[2:] == [f"config {record['config_hash']}", "seed 7 (given)"]


def test_config_hash_is_of_the_bytes_as_written():
    assert config_hash("x") == config_hash(b"x") != config_hash("x\n")


def test_git_state_reads_a_checkout_and_its_dirtiness(tmp_path):
    assert git_state(tmp_path) is None  # not a checkout
    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t"}
    env["GIT_COMMITTER_EMAIL"] = "t@t"

    def git(*args):
        subprocess.run(["git", "-C", str(tmp_path), *args], check=True, capture_output=True,
                       env={**env, "PATH": "/usr/bin:/bin"})  # fmt: skip

    git("init", "-q")
    (tmp_path / "f").write_text("1")
    git("add", "f")
    git("commit", "-qm", "c")
    state = git_state(tmp_path)
    assert state is not None and len(state["commit"]) == 40 and state["dirty"] is False
    (tmp_path / "f").write_text("2")
    assert git_state(tmp_path)["dirty"] is True
    record = {**provenance(), "git": git_state(tmp_path)}
    assert f"commit {state['commit'][:12]} (dirty tree)" in provenance_lines(record)[0]


def test_version_flag_prints_the_record(capsys):
    with pytest.raises(SystemExit) as stop:
        main(["--version"])
    assert stop.value.code == 0
    out = capsys.readouterr().out
    assert out.splitlines()[:2] == provenance_lines(provenance())


def test_git_state_by_default_reads_the_checkout_the_package_runs_from():
    # The default root is the repository that holds the package folder, wherever the module
    # providing it sits inside the package.
    root = Path(shuffle_opacus.__file__).resolve().parent.parent
    if not (root / ".git").exists():
        pytest.skip("the package does not run from a git checkout")
    head = subprocess.run(
        ["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert git_state()["commit"] == head
