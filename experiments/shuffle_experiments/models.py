"""Models for the experiment: MNIST's inputs ``N x 1 x 28 x 28`` and 10 logits by default.

A dataset of the registry (:mod:`.datasets`) fixes the shape ``S`` of one example and the number
of classes; :func:`build_model` passes both on. The MLP takes any shape (it flattens); the CNNs
are built for MNIST's ``1 x 28 x 28`` images and refuse another shape in one line.

The CNNs pool with :class:`~shuffle_experiments.pooling.FastMaxPool2d`, an ``nn.MaxPool2d``
whose results are the same bit for bit and whose CPU forward pass is faster: the models, their
``state_dict`` keys and every number they produce are those of ``nn.MaxPool2d(2, 1)``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from torch import nn

from .pooling import FastMaxPool2d

__all__ = ["MNIST_SHAPE", "MODELS", "BUILT_IN_MODELS", "build_model", "register_model"]

#: The shape of one MNIST image, which the CNNs take.
MNIST_SHAPE = (1, 28, 28)


def _images_only(name: str, input_shape: Sequence[int]) -> None:
    if tuple(input_shape) != MNIST_SHAPE:
        shape = " x ".join(str(d) for d in input_shape)
        raise ValueError(
            f"model.name {name} takes 1 x 28 x 28 images, the data's examples are {shape}; "
            "use model.name mlp, which takes any shape"
        )


def cnn(input_shape: Sequence[int] = MNIST_SHAPE, num_classes: int = 10) -> nn.Module:
    """Return the small tanh CNN commonly used for DP-SGD on MNIST (26,010 parameters).

    Two strided convolutions with max-pooling, then two linear layers; no batch norm, so
    per-sample gradients are well defined.

    Args:
        input_shape: The shape of one example; only ``(1, 28, 28)``.
        num_classes: Outputs (10 for MNIST).

    Raises:
        ValueError: for another input shape.
    """
    _images_only("cnn", input_shape)
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
        nn.Linear(32, num_classes),
    )


def cnn_small(input_shape: Sequence[int] = MNIST_SHAPE, num_classes: int = 10) -> nn.Module:
    """Return a narrower tanh CNN for heavy local noise (5,154 parameters).

    The layout of :func:`cnn` with half the filters and no hidden linear layer: the noise every
    client adds is spread over five times fewer coordinates, so each round's averaged update
    carries about 2.2 times less noise in norm for the same clipped signal.

    Args:
        input_shape: The shape of one example; only ``(1, 28, 28)``.
        num_classes: Outputs (10 for MNIST).

    Raises:
        ValueError: for another input shape.
    """
    _images_only("cnn_small", input_shape)
    return nn.Sequential(
        nn.Conv2d(1, 8, 8, stride=2, padding=3),
        nn.Tanh(),
        FastMaxPool2d(2, 1),
        nn.Conv2d(8, 16, 4, stride=2),
        nn.Tanh(),
        FastMaxPool2d(2, 1),
        nn.Flatten(),
        nn.Linear(16 * 4 * 4, num_classes),
    )


def mlp(input_shape: Sequence[int] = MNIST_SHAPE, num_classes: int = 10) -> nn.Module:
    """Return a multilayer perceptron with one hidden layer of 128 ReLU units.

    On MNIST it is 784-128-10 (101,770 parameters).

    Args:
        input_shape: The shape of one example (flattened).
        num_classes: Outputs.
    """
    features = math.prod(input_shape)
    return nn.Sequential(
        nn.Flatten(), nn.Linear(features, 128), nn.ReLU(), nn.Linear(128, num_classes)
    )


MODELS = {"cnn": cnn, "cnn_small": cnn_small, "mlp": mlp}
"""The models by name: ``build(input_shape, num_classes) -> nn.Module`` each."""

#: The models the package ships (a config names them without importing torch).
BUILT_IN_MODELS = ("cnn", "cnn_small", "mlp")


def register_model(
    name: str, build: Callable[[tuple[int, ...], int], nn.Module], *, replace: bool = False
) -> None:
    """Add a model to :data:`MODELS`, so that a config's ``model.name`` may name it.

    Args:
        name: The model's name (letters, digits, ``_`` and ``-``).
        build: ``build(input_shape, num_classes)`` returns a fresh ``nn.Module`` whose layers
            Opacus can clip per example.
        replace: Replace a registered model of the same name instead of refusing it (the
            built-in models are never replaced).

    Raises:
        ValueError: for a malformed name, a name taken (without ``replace``) or built in, or a
            ``build`` that is not callable.
    """
    if not (isinstance(name, str) and name and name.replace("_", "a").replace("-", "a").isalnum()):
        raise ValueError(f"model name must be letters, digits, _ and -, got {name!r}")
    if name in BUILT_IN_MODELS:
        raise ValueError(f"model {name!r} is built in and cannot be replaced")
    if name in MODELS and not replace:
        raise ValueError(f"model {name!r} is registered already; pass replace=True")
    if not callable(build):
        raise ValueError(f"model {name!r}: build must be callable, got {build!r}")
    MODELS[name] = build


def build_model(
    name: str, input_shape: Sequence[int] = MNIST_SHAPE, num_classes: int = 10
) -> nn.Module:
    """Return a fresh model by name (``cnn``, ``cnn_small``, ``mlp`` or a registered one).

    Args:
        name: The model.
        input_shape: The shape of one example (the dataset's; MNIST's by default).
        num_classes: Outputs (the dataset's number of classes).

    Raises:
        ValueError: for an unknown name, or a CNN asked for examples that are not
            ``1 x 28 x 28`` images.
    """
    if name not in MODELS:
        raise ValueError(f"model.name must be one of {', '.join(MODELS)}, got {name!r}")
    return MODELS[name](tuple(input_shape), num_classes)
