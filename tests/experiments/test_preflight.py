"""Every config value is checked before anything of a run exists (issue 41, part 6).

Run names stay inside ``output_dir``, YAML nesting is bounded, and the values the library would
refuse only once the data, the model and the engine exist (after the run directory) are refused
from the config alone, naming the config key and its range. No training: each refusal comes
before the data are read.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from shuffle_experiments import runner
from shuffle_experiments.cli import main
from shuffle_experiments.config import MAX_YAML_DEPTH, ConfigError, load_config, validate
from shuffle_experiments.preflight import check_plan

ROOT = Path(__file__).resolve().parents[2]
SMOKE = ROOT / "configs" / "smoke.yaml"
USERS = ROOT / "configs" / "users_smoke.yaml"


def refused(path: Path, out: Path, *overrides: str) -> str:
    """Read and run a config (``output_dir`` = ``out``); return the one-line refusal."""
    with pytest.raises(ConfigError) as info:
        config = load_config(path, [f"output_dir={out}", *overrides])
        runner.run(config, progress=False, echo=lambda _: None)
    message = str(info.value)
    assert "\n" not in message
    return message


@pytest.mark.parametrize(
    ("path", "override", "expected"),
    [
        (SMOKE, "optimizer.lr=1e300", r"^optimizer\.lr must be at most 1\.84e\+19 "),
        (SMOKE, "optimizer.lr=1e30", r"^optimizer\.lr must be at most 1\.84e\+19 "),
        (
            SMOKE,
            "privacy.noise_multiplier=1e300",
            r"^privacy\.noise_multiplier must keep privacy\.noise_multiplier \* "
            r"privacy\.clipping_norm \* sqrt\(n\) at most .*: privacy\.noise_multiplier <= "
            r"4\.12e\+17 with privacy\.clipping_norm 1 and n = 2000\. Found 1e\+300\.$",
        ),
        (
            SMOKE,
            "privacy.noise_multiplier=1e-300",
            r"^privacy\.noise_multiplier=1e-300: .*privacy\.noise_multiplier must be in "
            r"\[2e-150, 2e\+150\]",
        ),
        (SMOKE, "privacy.clipping_norm=1e300", r"^privacy\.clipping_norm must be at most 1\.84e"),
        (SMOKE, "privacy.delta=1e-320", r"^privacy\.delta must be in \[1e-200, 1\) "),
        (USERS, "clients.client_lr=1e300", r"^clients\.client_lr must be at most 1\.84e\+19 "),
        (USERS, "privacy.clipping_norm=1e300", r"^privacy\.clipping_norm must be at most "),
        (USERS, "optimizer.lr=1e300", r"^optimizer\.lr must be at most 1\.84e\+19 "),
    ],
)
def test_a_refused_value_creates_nothing_under_output_dir(tmp_path, path, override, expected):
    # Before: refused by the library after config.yaml and ``latest`` existed, naming its own
    # parameters (max_grad_norm, max_update_norm, "tail must be ... Found 0.0"), or, for the
    # learning rate, not at all: round 1 crashed with a 20-line traceback.
    import re

    out = tmp_path / "out"
    message = refused(path, out, override)
    assert re.search(expected, message), message
    assert not any(
        w in message for w in ("max_grad_norm", "max_update_norm", "tail ", "sigma must")
    )
    assert not out.exists()


def test_the_command_refuses_an_overflowing_learning_rate_in_one_line(tmp_path, capsys):
    out = tmp_path / "out"
    argv = ["train", "--config", str(SMOKE), "--set", f"output_dir={out}", "--set",
            "optimizer.lr=1e300", "--no-progress"]  # fmt: skip
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("shuffle-experiment: error: optimizer.lr must be at most ")
    assert captured.err.count("\n") == 1 and not out.exists()


@pytest.mark.filterwarnings("ignore:sensitivity 1 C is below replace-one")  # paper.yaml
def test_the_shipped_configs_pass_the_plan_checks():
    for path in sorted((ROOT / "configs").glob("*.yaml")):
        check_plan(load_config(path))


@pytest.mark.parametrize("name", ["../escape", "..", ".", "/tmp/elsewhere", "a/b", "a\\b"])
def test_a_run_name_that_leaves_output_dir_is_refused(tmp_path, name):
    # Before: name=../escape wrote the run (and ``latest``) beside output_dir.
    with pytest.raises(ConfigError) as info:
        load_config(SMOKE, [f"output_dir={tmp_path / 'out'}", f"name={name}"])
    assert str(info.value) == (
        f"name must be one directory name inside output_dir (no '/', '\\', '.' or '..'), got "
        f"{name!r}"
    )
    assert list(tmp_path.iterdir()) == []


def test_plain_run_names_are_accepted():
    raw = load_config(SMOKE).model_dump(mode="json")
    for name in ("smoke", "trial-01", "users_smoke", "a.b", "..x"):
        assert validate({**raw, "name": name}).name == name


@pytest.mark.parametrize(
    "text",
    [
        "name: " + "[" * 5000 + "]" * 5000 + "\n",
        "name: " + "{a: " * 5000 + "1" + "}" * 5000 + "\n",
        "".join(" " * i + "a:\n" for i in range(5000)) + " " * 5000 + "b: 1\n",
    ],
    ids=["flow-lists", "flow-mappings", "block-mappings"],
)
def test_a_deeply_nested_yaml_is_one_line(tmp_path, text, capsys):
    # Before: RecursionError with a long traceback.
    path = tmp_path / "deep.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=f"nests deeper than the {MAX_YAML_DEPTH} levels"):
        load_config(path)
    assert main(["train", "--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"shuffle-experiment: error: config file {path}: nests deeper than")
    assert err.count("\n") == 1


def test_nesting_up_to_the_bound_is_read():
    from shuffle_experiments.config import _parse_yaml

    deep = "[" * MAX_YAML_DEPTH + "]" * MAX_YAML_DEPTH
    assert _parse_yaml(deep, "t") is not None
    with pytest.raises(ConfigError, match="nests deeper"):
        _parse_yaml("[" + deep + "]", "t")


def test_a_deeply_nested_set_key_is_one_line(capsys):
    key = ".".join(["data"] * 3000)
    assert main(["train", "--config", str(SMOKE), "--set", f"{key}=1"]) == 2
    err = capsys.readouterr().err
    assert err == (
        f"shuffle-experiment: error: --set expects a key of at most {MAX_YAML_DEPTH} levels, "
        f"got 3000\n"
    )
