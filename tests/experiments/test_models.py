"""The experiment's models: output shape, parameter counts, Opacus compatibility."""

from __future__ import annotations

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
