"""Fuzzing the experiment config loader: every bad file is one ``ConfigError`` line.

``shuffle_experiments.config.load_config`` reads a YAML file, applies ``--set`` overrides and
validates the result. Whatever the file holds (nothing, binary garbage, a list, wrong types,
unknown keys, NaN, negative or absurd values), it must return a config or raise
:class:`~shuffle_experiments.config.ConfigError` (a ``ValueError``) with one line, never an
exception from deep inside the YAML parser or the validator.
"""

from __future__ import annotations

from pathlib import Path

import pytest

config = pytest.importorskip("shuffle_experiments.config")

SMOKE = (Path(__file__).resolve().parents[1] / "configs" / "smoke.yaml").read_text()


def _variant(old: str, new: str) -> bytes:
    assert old in SMOKE, old
    return SMOKE.replace(old, new).encode()


BAD_FILES = {
    "empty": b"",
    "nul bytes": b"\x00\x00",
    "a list": b"- 1\n- 2\n",
    "a scalar": b"42\n",
    "unclosed flow": b"a: [1, 2\n",
    "tab indent": b"\tname: x\n",
    "python tag": b'!!python/object/apply:os.system ["true"]\n',
    "unknown top key": (SMOKE + "\nfoo: 1\n").encode(),
    "unknown nested key": _variant("rounds: 20", "rounds: 20\n  bogus: 3"),
    "negative rounds": _variant("rounds: 20", "rounds: -1"),
    "string rounds": _variant("rounds: 20", "rounds: many"),
    "float rounds": _variant("rounds: 20", "rounds: 2.5"),
    "bool rounds": _variant("rounds: 20", "rounds: true"),
    "nan lr": _variant("lr: 0.5", "lr: .nan"),
    "nan noise": _variant("noise_multiplier: 2.0", "noise_multiplier: .nan"),
    "string delta": _variant("delta: 1e-5", "delta: abc"),
    "negative sensitivity": _variant("sensitivity: replace-one", "sensitivity: -1"),
    "nan sensitivity": _variant("sensitivity: replace-one", "sensitivity: .nan"),
    "rate above 1": _variant("rate: 0.1", "rate: 1e300"),
    "section as list": _variant("privacy:", "privacy: [1]\nx:"),
    "int name": _variant("name: smoke", "name: 5"),
    "zero eval_every": _variant("eval_every: 5", "eval_every: 0"),
    "nan ema": _variant("threads: 2", "threads: 2\n  ema: .nan"),
    "binary garbage": bytes(range(256)) * 4,
    "utf-16 text": SMOKE.encode("utf-16"),
    "huge rounds": _variant("rounds: 20", "rounds: 1000000000000000000000000000000"),
    "infinite lr": _variant("lr: 0.5", "lr: .inf"),
    "infinite noise": _variant("noise_multiplier: 2.0", "noise_multiplier: .inf"),
    "huge threads": _variant("threads: 2", "threads: 10000000000000"),
    "repeated key": _variant("rounds: 20", "rounds: 20\n  rounds: 30"),
    "subnormal rate": _variant("rate: 0.1", "rate: 1e-320"),
    "huge seed": _variant("seed: 0", "seed: 100000000000000000000"),
}

BAD_OVERRIDES = [
    ["training.rounds=[1"],
    ["optimizer.lr=.inf"],
    ["training.rounds=1e400"],
    ["training.rounds=.nan"],
    ["training.rounds"],
    ["=3"],
    ["name.x=1"],
    ["training.rounds.x=1"],
    ["privacy.accountants.0=x"],
    ["a.b.c=1"],
]


def _one_line_config_error(call) -> str:
    with pytest.raises(config.ConfigError) as info:
        call()
    message = str(info.value)
    assert message and "\n" not in message, message
    return message


@pytest.mark.parametrize("name", sorted(BAD_FILES))
def test_bad_files_are_one_line_errors(name: str, tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_bytes(BAD_FILES[name])
    _one_line_config_error(lambda: config.load_config(path))


@pytest.mark.parametrize("overrides", BAD_OVERRIDES, ids=str)
def test_bad_overrides_are_one_line_errors(overrides: list[str], tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(SMOKE)
    _one_line_config_error(lambda: config.load_config(path, overrides))


def test_missing_file(tmp_path: Path) -> None:
    assert "does not exist" in _one_line_config_error(
        lambda: config.load_config(tmp_path / "none.yaml")
    )


def test_directory_is_one_line_error(tmp_path: Path) -> None:
    assert "directory" in _one_line_config_error(lambda: config.load_config(tmp_path))
