"""Models for the MNIST experiment (inputs ``N x 1 x 28 x 28``, 10 logits).

The CNNs pool with :class:`~shuffle_experiments.pooling.FastMaxPool2d`, an ``nn.MaxPool2d``
whose results are the same bit for bit and whose CPU forward pass is faster: the models, their
``state_dict`` keys and every number they produce are those of ``nn.MaxPool2d(2, 1)``.
"""

from __future__ import annotations

from torch import nn

from .pooling import FastMaxPool2d

__all__ = ["MODELS", "build_model"]


def cnn() -> nn.Module:
    """Return the small tanh CNN commonly used for DP-SGD on MNIST (26,010 parameters).

    Two strided convolutions with max-pooling, then two linear layers; no batch norm, so
    per-sample gradients are well defined.
    """
    return nn.Sequential(
        nn.Conv2d(1, 16, 8, stride=2, padding=3),
        nn.Tanh(),
        FastMaxPool2d(2, 1),
        nn.Conv2d(16, 32, 4, stride=2),
        nn.Tanh(),
        FastMaxPool2d(2, 1),
        nn.Flatten(),
        nn.Linear(32 * 4 * 4, 32),
        nn.Tanh(),
        nn.Linear(32, 10),
    )


def cnn_small() -> nn.Module:
    """Return a narrower tanh CNN for heavy local noise (5,154 parameters).

    The layout of :func:`cnn` with half the filters and no hidden linear layer: the noise every
    client adds is spread over five times fewer coordinates, so each round's averaged update
    carries about 2.2 times less noise in norm for the same clipped signal.
    """
    return nn.Sequential(
        nn.Conv2d(1, 8, 8, stride=2, padding=3),
        nn.Tanh(),
        FastMaxPool2d(2, 1),
        nn.Conv2d(8, 16, 4, stride=2),
        nn.Tanh(),
        FastMaxPool2d(2, 1),
        nn.Flatten(),
        nn.Linear(16 * 4 * 4, 10),
    )


def mlp() -> nn.Module:
    """Return a 784-128-10 multilayer perceptron (101,770 parameters)."""
    return nn.Sequential(nn.Flatten(), nn.Linear(784, 128), nn.ReLU(), nn.Linear(128, 10))


MODELS = {"cnn": cnn, "cnn_small": cnn_small, "mlp": mlp}


def build_model(name: str) -> nn.Module:
    """Return a fresh model by name (``cnn``, ``cnn_small`` or ``mlp``).

    Raises:
        ValueError: for an unknown name.
    """
    if name not in MODELS:
        raise ValueError(f"model.name must be one of {', '.join(MODELS)}, got {name!r}")
    return MODELS[name]()
