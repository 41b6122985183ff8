"""Small models and synthetic data shared by the Opacus-layer tests."""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

# Per accountant: the make_private sampling arguments, and the core mechanism with the same
# parameters (for n = N_CLIENTS).
N_CLIENTS = 64
SETTINGS = {
    "shuffle": ({}, {"mechanism": "shuffle"}),
    "subsampled_shuffle": ({"sample_size": 16}, {"mechanism": "subsampled", "m": 16}),
    "shuffled_checkin": ({"rate": 0.25}, {"mechanism": "checkin", "rate": 0.25}),
}


def dataset(n: int = N_CLIENTS, seed: int = 0) -> TensorDataset:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 6, generator=gen)
    y = (x[:, 0] + 0.5 * x[:, 1] > 0).long()
    return TensorDataset(x, y)


def model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 2))


def loader(n: int = N_CLIENTS, seed: int = 0) -> DataLoader:
    return DataLoader(dataset(n, seed), batch_size=8)


def train(module: nn.Module, optimizer: torch.optim.Optimizer, data: DataLoader, engine=None):
    """Run every round of ``data``; return batch sizes and, with ``engine``, epsilon per round."""
    sizes, eps = [], []
    for x, y in data:
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(module(x), y)
        loss.backward()
        optimizer.step()
        sizes.append(len(x))
        if engine is not None:
            eps.append(engine.get_epsilon(1e-5))
    return sizes, eps


def has_grad_sample_hooks(module: nn.Module) -> bool:
    """True if any submodule carries hooks or any parameter a per-sample gradient."""
    for sub in module.modules():
        if sub._forward_hooks or sub._backward_hooks or sub._forward_pre_hooks:
            return True
    return any(hasattr(p, "grad_sample") for p in module.parameters())
