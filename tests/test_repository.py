"""Repository-level checks: lint, and that the README's commands stay true."""

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")


def test_ruff_clean():
    ruff = shutil.which("ruff") or str(Path(sys.executable).parent / "ruff")
    proc = subprocess.run([ruff, "check", str(ROOT)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_ci_runs_the_readme_test_command():
    match = re.search(r"<!-- test-command -->\n```bash\n(.+?)\n```", README)
    assert match, "README must show the test command after <!-- test-command -->"
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert match.group(1).strip() in ci.splitlines()


def test_readme_main_job_command_runs():
    match = re.search(r"<!-- main-command -->\n```bash\n(.+?)\n```", README)
    assert match, "README must show the main command after <!-- main-command -->"
    command = match.group(1).strip()
    setup, _, job = command.partition(" && ")
    assert setup == "bash .ci/setup"
    assert job.startswith(".venv/bin/shuffle-opacus account ")
    args = job.split()[1:]
    proc = subprocess.run(
        [sys.executable, "-m", "shuffle_opacus.cli", *args], capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    # The README quotes the output; keep the quoted epsilon in sync with the code.
    quoted = re.search(r"<!-- main-output -->\n```text\n(.+?)\n```", README, re.S)
    assert quoted, "README must quote the main command's output after <!-- main-output -->"
    assert proc.stdout.strip() == quoted.group(1).strip()


@pytest.mark.parametrize("snippet_id", ["python-api", "opacus-loop"])
def test_readme_python_snippets_run(snippet_id, capsys):
    match = re.search(rf"<!-- {snippet_id} -->\n```python\n(.+?)\n```", README, re.S)
    assert match, f"README snippet {snippet_id} missing"
    exec(compile(match.group(1), f"README:{snippet_id}", "exec"), {})
    quoted = re.search(rf"<!-- {snippet_id}-output -->\n```text\n(.+?)\n```", README, re.S)
    if quoted:
        assert capsys.readouterr().out.strip() == quoted.group(1).strip()


def test_readme_calibrate_example_is_true(capsys):
    from shuffle_opacus.cli import main

    match = re.search(r"`(shuffle-opacus calibrate [^`]+)`\s+gives (\S+) \(ε = ([0-9.]+)\)", README)
    assert match, "README must quote a calibrate example"
    args = match.group(1).replace("\n", " ").split()[1:]
    assert main([*args, "--json"]) == 0
    row = json.loads(capsys.readouterr().out)
    assert f"{row['noise_multiplier']:.6g}" == match.group(2)
    assert f"{row['epsilon']:.6f}" == match.group(3)
