"""Config validation: every bad field gets one line naming it; overrides; YAML pitfalls."""

from __future__ import annotations

import copy

import pytest
import yaml
from shuffle_experiments.config import ConfigError, apply_overrides, load_config, validate

BASE = {
    "name": "t",
    "output_dir": "runs/t",
    "protocol": {"kind": "checkin", "rate": 0.1},
    "privacy": {"clipping_norm": 0.01, "noise_multiplier": 5.0, "sensitivity": "paper"},
    "optimizer": {"lr": 1.0},
    "training": {"rounds": 10},
}


def with_value(path: str, value):
    raw = copy.deepcopy(BASE)
    node = raw
    keys = path.split(".")
    for key in keys[:-1]:
        node = node.setdefault(key, {})
    node[keys[-1]] = value
    return raw


def test_defaults_fill_in():
    cfg = validate(BASE)
    assert cfg.privacy.delta == 1e-5 and cfg.training.eval_every == 100
    assert cfg.privacy.curves == [
        "pld", "proven", "exact", "theorem3", "no-shuffle", "central"
    ]  # fmt: skip
    assert cfg.data.source == "auto" and cfg.model.name == "cnn" and cfg.seed == 0


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        ("training.rounds", -1, "training.rounds must be a positive integer, got -1"),
        ("training.rounds", 2.5, "training.rounds must be an integer, got 2.5"),
        ("training.rounds", "ten", "training.rounds must be an integer, got 'ten'"),
        ("training.rounds", True, "training.rounds must be an integer, got True"),
        ("training.epochs", 3, "training.epochs is not a known key, got 3"),
        ("surprise", 1, "surprise is not a known key, got 1"),
        ("protocol.rate", 1.5, "protocol.rate must be <= 1.0, got 1.5"),
        ("protocol.rate", 0, "protocol.rate must be > 0.0, got 0"),
        ("protocol.kind", "poisson", "protocol.kind must be one of"),
        ("privacy.noise_multiplier", 0, "privacy.noise_multiplier must be > 0.0, got 0"),
        ("privacy.clipping_norm", "abc", "privacy.clipping_norm must be a number, got 'abc'"),
        ("privacy.delta", 1, "privacy.delta must be < 1.0, got 1"),
        ("privacy.sensitivity", "l2", "privacy.sensitivity must be replace-one, paper or a"),
        ("privacy.sensitivity", -2, "privacy.sensitivity must be replace-one, paper or a"),
        ("privacy.curves", ["exact", "magic"], "privacy.curves[1] must be one of"),
        ("privacy.curves", [], "privacy.curves must not be empty"),
        ("privacy.curves", ["exact", "exact"], "must not repeat"),
        ("privacy.noise_mode", "central", "privacy.noise_mode must be one of"),
        ("optimizer", "sgd", "optimizer must be a mapping"),
        ("optimizer.momentum", 1.0, "optimizer.momentum must be < 1.0"),
        ("training.grad_sample_mode", "ghost", "training.grad_sample_mode must be one of"),
        ("data.train_subset", 0, "data.train_subset must be a positive integer, got 0"),
        ("data.source", "idx", "data.root is required for data.source idx"),
        ("seed", -1, "seed must be >= 0, got -1"),
        ("name", "", "name must not be empty"),
        ("protocol.rate", None, "protocol.rate is required for protocol.kind checkin"),
        ("protocol.sample_size", 5, "protocol.sample_size applies to subsampled only"),
    ],
)
def test_bad_values_are_one_line_naming_the_field(path, value, message):
    with pytest.raises(ConfigError) as err:
        validate(with_value(path, value))
    text = str(err.value)
    assert message in text and "\n" not in text


def test_missing_sections_and_subsampled_rules():
    raw = copy.deepcopy(BASE)
    del raw["training"]
    with pytest.raises(ConfigError, match="training is required"):
        validate(raw)
    raw = with_value("protocol", {"kind": "subsampled"})
    with pytest.raises(ConfigError, match="protocol.sample_size is required"):
        validate(raw)
    raw = with_value("protocol", {"kind": "subsampled", "sample_size": 60000})
    with pytest.raises(ConfigError, match=r"sample_size must be < the number of clients \(60000\)"):
        validate(raw)
    raw = with_value("protocol", {"kind": "full"})
    with pytest.raises(ConfigError, match="theorem3 is not available for protocol.kind full"):
        validate(raw)
    raw["privacy"]["curves"] = ["exact", "no-shuffle", "central", "clones"]
    assert validate(raw).protocol.kind == "full"
    raw = with_value("protocol", {"kind": "subsampled", "sample_size": 600})
    raw["privacy"]["curves"] = ["exact", "clones"]
    with pytest.raises(ConfigError, match="clones is not available for protocol.kind subsampled"):
        validate(raw)


def test_yaml_exponent_without_dot_is_a_number(tmp_path):
    # PyYAML reads 1e-5 as a string; the config accepts it as the number it means.
    text = yaml.safe_dump(BASE) + ""
    path = tmp_path / "c.yaml"
    path.write_text(text.replace("sensitivity: paper", "sensitivity: paper\n  delta: 1e-6"))
    assert yaml.safe_load(path.read_text())["privacy"]["delta"] == "1e-6"
    assert load_config(path).privacy.delta == 1e-6


def test_overrides_are_parsed_as_yaml_and_validated(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(BASE))
    cfg = load_config(path, ["training.rounds=25", "protocol.rate=0.5", "privacy.delta=1e-7"])
    assert cfg.training.rounds == 25 and cfg.protocol.rate == 0.5 and cfg.privacy.delta == 1e-7
    with pytest.raises(ConfigError, match="training.rounds must be a positive integer, got -1"):
        load_config(path, ["training.rounds=-1"])
    with pytest.raises(ConfigError, match="--set expects key=value"):
        load_config(path, ["training.rounds"])
    with pytest.raises(ConfigError, match="name is not a section"):
        apply_overrides(BASE, ["name.x=1"])
    assert BASE["training"]["rounds"] == 10  # overrides work on a copy


def test_unreadable_files(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "none.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML at line"):
        load_config(bad)
    listy = tmp_path / "list.yaml"
    listy.write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="config must be a mapping"):
        load_config(listy)


@pytest.mark.parametrize(
    ("section", "wrong", "right"),
    [("training", "round", "rounds"), ("privacy", "noise_multipler", "noise_multiplier")],
)
def test_a_misspelt_required_key_is_named_unknown_with_the_right_one(section, wrong, right):
    """The misspelling leaves the required key missing; the message names the misspelling as
    unknown and suggests the key it resembles (not only "<right> is required")."""
    raw = copy.deepcopy(with_value(f"{section}.{right}", 1))
    raw[section][wrong] = raw[section].pop(right)
    with pytest.raises(ConfigError) as err:
        validate(raw)
    assert (
        str(err.value) == f"{section}.{wrong} is not a known key (did you mean {right!r}?), got 1"
    )


def test_an_unknown_key_with_no_near_match_gets_no_suggestion():
    with pytest.raises(ConfigError, match=r"^training.zzz is not a known key, got 1$"):
        validate(with_value("training.zzz", 1))
