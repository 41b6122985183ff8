"""Repository-level checks: lint, and that the README's commands stay true."""

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")
#: The command reference moved out of the README; its examples are checked the same way.
ACCOUNTING_DOC = (ROOT / "docs" / "accounting.md").read_text(encoding="utf-8")


def test_ruff_clean():
    ruff = shutil.which("ruff") or str(Path(sys.executable).parent / "ruff")
    proc = subprocess.run([ruff, "check", str(ROOT)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_ci_runs_the_readme_test_command():
    match = re.search(r"<!-- test-command -->\n```bash\n(.+?)\n```", README)
    assert match, "README must show the test command after <!-- test-command -->"
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert match.group(1).strip() in ci.splitlines()


def test_readme_main_job_is_the_quick_experiment():
    match = re.search(r"<!-- main-command -->\n```bash\n(.+?)\n```", README)
    assert match, "README must show the main command after <!-- main-command -->"
    setup, _, job = match.group(1).strip().partition(" && ")
    assert setup == "bash .ci/setup"
    assert job == ".venv/bin/shuffle-experiment train --config configs/quick.yaml"
    # The job's config is valid (running it takes minutes; the smoke config runs in the tests).
    from shuffle_experiments.config import load_config
    from shuffle_experiments.curves import CURVE_LABELS, EpsilonCurves

    config = load_config(ROOT / "configs" / "quick.yaml")
    # The summary the README quotes: its epsilons follow from the config alone, so they must
    # be what the code computes now.
    quoted = re.search(r"<!-- main-output -->\n```text\n(.+?)\n```", README, re.S)
    assert quoted, "README must quote the run's summary after <!-- main-output -->"
    text = quoted.group(1)
    rounds = int(re.search(r"rounds\s+(\d+) of (\d+)", text).group(2))
    assert rounds == config.training.rounds
    curves = EpsilonCurves(config, 60000)
    for name in config.privacy.curves:
        value = re.search(re.escape(CURVE_LABELS[name]) + r"\s+(\S+)", text)
        assert value, f"summary lacks {name}"
        assert float(value.group(1)) == pytest.approx(curves.epsilon(name, rounds), rel=1e-5)
    # The quick config's analysis sigma is 0.5: each report's likelihood ratio is log-normal with
    # log-sd 2 (heavy tails). The pld method evaluates it (no fallback) and beats the Rényi bound.
    assert 0 < curves.epsilon("pld", rounds) < curves.epsilon("exact", rounds)
    # The plot lines name the run the summary is of (not an older run's directory).
    run_dir = re.search(r"^run directory\s+(\S+)$", text, re.M).group(1)
    plots = re.findall(r"^plot\s+(\S+)$", text, re.M)
    assert plots and all(p.startswith(run_dir + "/") for p in plots), (run_dir, plots)
    for figure in re.findall(r"\]\((docs/figures/[^)]+\.png)\)", README):
        assert (ROOT / figure).is_file(), figure
    assert re.search(r"\]\(docs/figures/[^)]+\.png\)", README), "README must show the plot"


#: Where each published Python snippet lives: the Python API example moved to the accounting
#: reference with the rest of the README's "Accounting reference"; the other two stay in the README.
SNIPPETS = {
    "python-api": ("docs/accounting.md", ACCOUNTING_DOC),
    "opacus-loop": ("README", README),
    "clients-api": ("README", README),
}


@pytest.mark.parametrize("snippet_id", list(SNIPPETS))
def test_readme_python_snippets_run(snippet_id, capsys):
    where, text = SNIPPETS[snippet_id]
    match = re.search(rf"<!-- {snippet_id} -->\n```python\n(.+?)\n```", text, re.S)
    assert match, f"{where} snippet {snippet_id} missing"
    exec(compile(match.group(1), f"{where}:{snippet_id}", "exec"), {})
    quoted = re.search(rf"<!-- {snippet_id}-output -->\n```text\n(.+?)\n```", text, re.S)
    if quoted:
        assert capsys.readouterr().out.strip() == quoted.group(1).strip()


def test_readme_calibrate_example_is_true(capsys):
    from shuffle_opacus.cli.command import main

    match = re.search(r"`(shuffle-opacus calibrate [^`]+)`\s+gives (\S+) \(ε = ([0-9.]+)\)", README)
    assert match, "README must quote a calibrate example"
    args = match.group(1).replace("\n", " ").split()[1:]
    assert main([*args, "--json"]) == 0
    row = json.loads(capsys.readouterr().out)
    assert f"{row['noise_multiplier']:.6g}" == match.group(2)
    assert f"{row['epsilon']:.6f}" == match.group(3)


def _examples() -> list[tuple[str, list[str]]]:
    """``$ shuffle-opacus ...`` lines of the README's and docs/accounting.md's text blocks, each
    with its quoted output."""
    found: list[tuple[str, list[str]]] = []
    for block in re.findall(r"```text\n(.+?)\n\s*```", README + "\n" + ACCOUNTING_DOC, re.S):
        lines = [line.strip() for line in block.splitlines()]
        for i, line in enumerate(lines):
            if line.startswith("$ shuffle-opacus "):
                output = []
                for follow in lines[i + 1 :]:
                    if follow.startswith("$ "):
                        break
                    output.append(follow)
                found.append((line[2:], output))
    return found


@pytest.mark.parametrize(("command", "expected"), _examples(), ids=lambda v: str(v)[:60])
def test_readme_command_examples_are_true(command, expected, capsys):
    from shuffle_opacus.cli.command import main

    assert main(command.split()[1:]) == 0
    actual = [line.rstrip() for line in capsys.readouterr().out.splitlines()]
    if "..." not in expected:
        assert actual == expected
        return
    # "..." stands for any lines: the quoted ones must appear in this order.
    rest = iter(actual)
    for line in (e for e in expected if e != "..."):
        assert any(line == got for got in rest), f"{line!r} not in the output of {command}"


def test_readme_quotes_examples():
    assert len(_examples()) >= 4
    assert any(command in README for command, _ in _examples())


def test_the_library_never_imports_the_application():
    import ast

    for path in (ROOT / "shuffle_opacus").rglob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module or ""]
            for name in names:
                top = name.split(".")[0]
                assert top not in ("experiments", "shuffle_experiments", "tests"), (path, name)
    # Nothing called `experiments` is installed: the application is `shuffle_experiments`.
    code = (
        "import importlib.util, sys; sys.exit(importlib.util.find_spec('experiments') is not None)"
    )
    assert subprocess.run([sys.executable, "-c", code], cwd="/").returncode == 0


def test_papers_are_cited_not_referred_to_by_handle():
    # Papers are cited by authors, title and arXiv number; a handle (the word seed and a
    # number) or a file name under the shared seeds folder means nothing to a reader.
    handle = re.compile(r"\bseeds?[ _]?0\d\d\b|seeds/\d{3}_", re.IGNORECASE)
    # Folders of tools' output (.gitignore's), left out of the walk itself, not just of the
    # files read: a checkout's mypy caches alone hold thousands of files.
    skip = {".venv", "runs", ".git", "__pycache__", ".pytest_cache", ".hypothesis",
            ".mypy_cache", ".ruff_cache", "site", "build", "dist"}  # fmt: skip
    found = []
    for folder, subfolders, files in os.walk(ROOT):
        subfolders[:] = [name for name in subfolders if name not in skip]
        for name in files:
            path = Path(folder) / name
            if path.suffix not in {".py", ".md", ".yaml", ".toml", ".txt", ".csv", ".sh"}:
                continue
            for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
                if handle.search(line):
                    found.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert not found, "\n".join(found)


def test_the_flower_tests_fail_loudly_without_flwr_unless_skipped_on_purpose(tmp_path):
    """Without flwr, collecting tests/flower is an error; the opt-out makes it a skip."""
    fake = tmp_path / "flwr"
    fake.mkdir()
    (fake / "__init__.py").write_text("raise ModuleNotFoundError('flwr hidden for this test')\n")
    command = [sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider"]
    command += ["--collect-only", "tests/flower/test_shuffler.py"]
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    env.pop("SHUFFLE_OPACUS_SKIP_FLOWER", None)
    loud = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    assert loud.returncode != 0
    assert "install the flower extra" in loud.stdout + loud.stderr
    env["SHUFFLE_OPACUS_SKIP_FLOWER"] = "1"
    quiet = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    assert quiet.returncode == 5, quiet.stdout[-500:]  # collected nothing: the module skipped
    assert "SKIPPED" in quiet.stdout


def test_every_config_path_the_code_and_docs_name_exists():
    """A help text or page that cites a config file names one that ships (``NAME`` excepted)."""
    named = set()
    for folder in ("shuffle_opacus", "experiments", "docs", "configs"):
        for path in (ROOT / folder).rglob("*"):
            if path.suffix in (".py", ".md"):
                named.update(re.findall(r"configs/[A-Za-z0-9_/.-]+\.yaml", path.read_text()))
    for page in ("README.md", "CONTRIBUTING.md"):
        named.update(re.findall(r"configs/[A-Za-z0-9_/.-]+\.yaml", (ROOT / page).read_text()))
    missing = sorted(p for p in named if "NAME" not in p and not (ROOT / p).is_file())
    assert not missing, missing
