"""The experiment's models: output shape, parameter counts, Opacus compatibility."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from opacus.validators import ModuleValidator
from shuffle_experiments.models import build_model


@pytest.mark.parametrize(("name", "params"), [("cnn", 26010), ("cnn_small", 5154), ("mlp", 101770)])
def test_models(name, params):
    model = build_model(name)
    assert sum(p.numel() for p in model.parameters()) == params  # counted by hand per layer
    assert model(torch.zeros(3, 1, 28, 28)).shape == (3, 10)
    assert model(torch.zeros(0, 1, 28, 28)).shape == (0, 10)  # empty check-in rounds
    assert ModuleValidator.validate(model, strict=False) == []


def test_unknown_model():
    with pytest.raises(ValueError, match="model.name must be one of cnn, cnn_small, mlp"):
        build_model("resnet")


def _linear(input_shape, num_classes):
    return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(input_shape[-1], num_classes))


@pytest.fixture
def models():
    """The model registry, restored after the test."""
    from shuffle_experiments import models as registry

    saved = dict(registry.MODELS)
    yield registry
    registry.MODELS.clear()
    registry.MODELS.update(saved)


def test_the_built_in_names_the_config_knows_are_the_registrys():
    from shuffle_experiments import config, models

    assert config._BUILT_IN_MODELS == models.BUILT_IN_MODELS == tuple(models.MODELS)


def test_a_registered_model_is_named_by_a_config_and_built(models, tmp_path):
    import yaml
    from shuffle_experiments.config import ConfigError, validate

    raw = yaml.safe_load(Path("configs/quick.yaml").read_text())
    raw["model"] = {"name": "linear"}
    with pytest.raises(ConfigError, match=r"model.name must be one of .*register_model"):
        validate(raw)
    models.register_model("linear", _linear)
    assert validate(raw).model.name == "linear"
    assert models.build_model("linear", (6,), 3)(torch.zeros(2, 6)).shape == (2, 3)


@pytest.mark.parametrize(
    ("name", "build", "replace", "message"),
    [
        ("a b", _linear, False, "letters, digits"),
        ("", _linear, False, "letters, digits"),
        ("cnn", _linear, True, "built in"),
        ("linear", "not callable", False, "callable"),
    ],
)
def test_register_model_refuses_in_one_line(models, name, build, replace, message):
    with pytest.raises(ValueError, match=message) as info:
        models.register_model(name, build, replace=replace)
    assert "\n" not in str(info.value)


def test_a_registered_name_is_refused_twice_unless_replaced(models):
    models.register_model("linear", _linear)
    with pytest.raises(ValueError, match="registered already"):
        models.register_model("linear", _linear)
    models.register_model("linear", _linear, replace=True)
