"""Local noise: the sum simulation and the per-client mode give the same aggregated update.

Oracle: for a linear model with loss ``w . x_i + b`` per client, client i's gradient is
``(x_i, 1)``; after clipping to norm C the aggregated update is
``sum_i clip(g_i) + N(0, B sigma^2 C^2 I)``. Both modes are checked against that mean and
covariance and against each other, with tolerances of 4 standard errors.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from opacus.grad_sample import GradSampleModule
from torch import nn

from shuffle_opacus.engine.noise import LocalNoiseDPOptimizer

SIGMA, CLIP, TRIALS = 0.7, 1.0, 3000
X = torch.tensor(
    [[0.3, -0.2, 0.1], [2.0, 1.0, -1.0], [0.0, 0.5, 0.5], [-1.5, 0.2, 0.9], [0.1, 0.1, 0.1]]
)
B, D = X.shape[0], X.shape[1] + 1


def expected_mean() -> np.ndarray:
    g = np.hstack([X.numpy(), np.ones((B, 1))]).astype(np.float64)
    norms = np.linalg.norm(g, axis=1, keepdims=True)
    return (g * np.minimum(1.0, CLIP / (norms + 1e-6))).sum(axis=0)


def aggregated_updates(mode: str, seed: int) -> np.ndarray:
    lin = nn.Linear(3, 1)
    module = GradSampleModule(lin, loss_reduction="sum")
    optimizer = LocalNoiseDPOptimizer(
        torch.optim.SGD(lin.parameters(), lr=0.0),
        noise_multiplier=SIGMA,
        max_grad_norm=CLIP,
        expected_batch_size=B,
        accounting_sample_rate=1.0,
        loss_reduction="sum",
        generator=torch.Generator().manual_seed(seed),
        noise_mode=mode,
    )
    out = np.empty((TRIALS, D))
    first: list[torch.Tensor] = []
    for t in range(TRIALS):
        optimizer.zero_grad()
        if not first:
            module(X).sum().backward()
            first = [p.grad_sample.detach().clone() for p in optimizer.params]
        else:
            # Every trial's per-sample gradients are the first trial's (the same X, and no step
            # is taken): a fresh copy of them stands for the backward pass (half of a trial's
            # time), so that the trials go to the optimizer's clipping and noise.
            for p, grad_sample in zip(optimizer.params, first, strict=True):
                p.grad_sample = grad_sample.clone()
        optimizer.pre_step()
        out[t] = torch.cat([lin.weight.grad.flatten(), lin.bias.grad]).double().numpy()
        assert optimizer.last_report_count == B
    return out


@pytest.fixture(scope="module")
def samples() -> dict[str, np.ndarray]:
    return {"sum": aggregated_updates("sum", 1), "per_client": aggregated_updates("per_client", 2)}


@pytest.mark.parametrize("mode", ["sum", "per_client"])
def test_mean_is_the_sum_of_clipped_gradients(samples, mode):
    se = SIGMA * CLIP * math.sqrt(B / TRIALS)
    assert np.all(np.abs(samples[mode].mean(axis=0) - expected_mean()) < 4 * se)


@pytest.mark.parametrize("mode", ["sum", "per_client"])
def test_covariance_is_b_sigma_squared_c_squared_identity(samples, mode):
    var = B * (SIGMA * CLIP) ** 2
    cov = np.cov(samples[mode], rowvar=False)
    # Sample variance of a normal: relative standard error sqrt(2 / (N - 1)).
    assert np.all(np.abs(np.diag(cov) / var - 1) < 4 * math.sqrt(2 / (TRIALS - 1)))
    corr = cov / var
    off = corr[~np.eye(D, dtype=bool)]
    assert np.all(np.abs(off) < 4 / math.sqrt(TRIALS))


def test_modes_agree_with_each_other(samples):
    a, b = samples["sum"], samples["per_client"]
    se = SIGMA * CLIP * math.sqrt(2 * B / TRIALS)
    assert np.all(np.abs(a.mean(axis=0) - b.mean(axis=0)) < 4 * se)
    ratio = np.diag(np.cov(a, rowvar=False)) / np.diag(np.cov(b, rowvar=False))
    assert np.all(np.abs(np.log(ratio)) < 4 * math.sqrt(4 / (TRIALS - 1)))


def test_empty_round_adds_no_noise():
    lin = nn.Linear(3, 1)
    module = GradSampleModule(lin, loss_reduction="sum")
    optimizer = LocalNoiseDPOptimizer(
        torch.optim.SGD(lin.parameters(), lr=0.1),
        noise_multiplier=SIGMA,
        max_grad_norm=CLIP,
        expected_batch_size=2.0,
        accounting_sample_rate=0.5,
    )
    before = [p.detach().clone() for p in lin.parameters()]
    module(torch.zeros(0, 3)).sum().backward()
    optimizer.step()
    assert optimizer.last_report_count == 0
    assert all(torch.equal(p, q) for p, q in zip(lin.parameters(), before, strict=True))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"noise_multiplier": 0.0}, "noise_multiplier must be"),
        ({"max_grad_norm": -1.0}, "max_grad_norm must be"),
        ({"accounting_sample_rate": 1.5}, r"accounting_sample_rate must be in \(0, 1\]"),
        ({"noise_mode": "central"}, "noise_mode must be one of"),
        ({"noise_mode": "per_client", "secure_mode": True}, "secure_mode"),
    ],
)
def test_bad_arguments(kwargs, message):
    lin = nn.Linear(3, 1)
    base = {
        "noise_multiplier": 1.0,
        "max_grad_norm": 1.0,
        "expected_batch_size": 2.0,
        "accounting_sample_rate": 0.5,
    }
    with pytest.raises(ValueError, match=message):
        LocalNoiseDPOptimizer(torch.optim.SGD(lin.parameters(), lr=0.1), **{**base, **kwargs})
