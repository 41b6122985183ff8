"""FastMaxPool2d gives nn.MaxPool2d's results bit for bit: forward, backward, layouts, torch.func.

Every comparison is of the bits (``torch.equal`` on an integer view, so that NaN payloads count
too) and of the strides, against ``nn.MaxPool2d`` run on the same tensors.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F  # noqa: N812
from opacus import GradSampleModule
from shuffle_experiments import pooling
from shuffle_experiments.models import build_model
from shuffle_experiments.pooling import FastMaxPool2d
from torch import nn
from torch.func import functional_call, grad, vmap

from shuffle_opacus.engine.clipping import FastGradientClipper

MIN_ELEMENTS = FastMaxPool2d.min_elements


@pytest.fixture(autouse=True)
def every_size_takes_the_fast_path(monkeypatch):
    # The tensors here are small; outside vmap a small training call runs nn's own kernel.
    monkeypatch.setattr(FastMaxPool2d, "min_elements", 0)


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.view({torch.float32: torch.int32, torch.float64: torch.int64}[t.dtype])


def assert_same(a: torch.Tensor, b: torch.Tensor) -> None:
    assert a.dtype == b.dtype and a.shape == b.shape
    assert a.stride() == b.stride()  # the next layer sees the same layout
    assert torch.equal(bits(a), bits(b))


def with_nn_pooling(model: nn.Module) -> nn.Module:
    """A copy of ``model`` whose FastMaxPool2d layers are plain nn.MaxPool2d ones."""
    reference = copy.deepcopy(model)
    for name, module in reference.named_children():
        if isinstance(module, FastMaxPool2d):
            setattr(reference, name, nn.MaxPool2d(2, 1))
    return reference


def special_values(shape: tuple[int, ...], generator: torch.Generator) -> torch.Tensor:
    """Ties between +-0, +-1 and +-inf, and NaNs of several payloads (last NaN of a window wins)."""
    pool = torch.tensor([0.0, -0.0, 1.0, -1.0, float("inf"), float("-inf"), 0.5])
    x = pool[torch.randint(len(pool), shape, generator=generator)]
    nan = torch.rand(shape, generator=generator) < 0.1
    payloads = 0x7FC00000 + torch.randint(1, 1 << 20, shape, generator=generator, dtype=torch.int32)
    return torch.where(nan, payloads.view(torch.float32), x)


def make_input(kind: str, shape: tuple[int, ...], seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    if kind == "normal":
        return torch.randn(shape, generator=generator)
    if kind == "ties":  # values in {-1, 0, 1}: most windows tie
        return torch.randint(-1, 2, shape, generator=generator).float()
    if kind == "tanh":  # saturated to exactly +-1.0 in float32
        return torch.tanh(50 * torch.randn(shape, generator=generator))
    return special_values(shape, generator)


def gradient(shape: tuple[int, ...], seed: int = 1) -> torch.Tensor:
    """Output gradients of magnitudes 1e-4 .. 1e4: the order of additions shows in the bits."""
    generator = torch.Generator().manual_seed(seed)
    scale = 10.0 ** torch.randint(-4, 5, shape, generator=generator)
    return torch.randn(shape, generator=generator) * scale


def pool_and_grad(
    module: nn.Module, x: torch.Tensor, g: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.autograd.graph.Node | None]:
    leaf = x.detach().requires_grad_()
    out = module(leaf)
    (grad_input,) = torch.autograd.grad(out, leaf, g)
    return out, grad_input, out.grad_fn


@pytest.mark.parametrize("kind", ["normal", "ties", "tanh", "special"])
@pytest.mark.parametrize("shape", [(1, 8, 14, 14), (10, 16, 5, 5), (0, 8, 14, 14)])
def test_forward_and_backward_are_nn_maxpool_bit_for_bit(kind, shape):
    x = make_input(kind, shape)
    g = gradient((shape[0], shape[1], shape[2] - 1, shape[3] - 1))
    out, grad_input, node = pool_and_grad(FastMaxPool2d(2, 1), x, g)
    ref_out, ref_grad, _ = pool_and_grad(nn.MaxPool2d(2, 1), x, g)
    assert type(node).__name__ == "_ChannelsLastMaxPoolBackward"  # the fast path ran
    assert_same(out, ref_out)
    assert_same(grad_input, ref_grad)


def test_ties_nan_and_the_order_of_additions():
    # nn.MaxPool2d's rules, which the comparisons above rely on: the first maximal element of a
    # window in row-major order wins a tie; the last NaN wins; an input position that several
    # windows select adds their gradients in row-major order of the outputs, from 0.
    pool = FastMaxPool2d(2, 1)
    windows = torch.tensor([[1.0, 1.0, 1.0, 1.0], [0.0, 1.0, 1.0, 0.0], [1, float("nan"), 3, 4]])
    for window, winner in zip(windows, (0, 1, 1), strict=True):
        x = window.view(1, 1, 2, 2).expand(1, 2, 2, 2).contiguous()  # two channels: fast path
        g = torch.ones(1, 2, 1, 1)
        out, grad_input, _ = pool_and_grad(pool, x, g)
        assert torch.equal(bits(out.flatten()[:1]), bits(window[winner : winner + 1]))
        assert grad_input[0, 0].flatten().tolist() == [float(k == winner) for k in range(4)]
    x = torch.zeros(1, 2, 3, 3)
    x[:, :, 1, 1] = 1.0  # the centre is the maximum of all four windows
    g = torch.tensor([1e8, 1.0, -1e8, 1.0]).view(1, 1, 2, 2).expand(1, 2, 2, 2).contiguous()
    _, grad_input, _ = pool_and_grad(pool, x, g)
    # ((0 + 1e8) + 1) - 1e8 + 1 == 1 in float32 (1e8 + 1 rounds to 1e8); other orders give 0 or 2.
    assert grad_input[0, 0, 1, 1].item() == 1.0


@pytest.mark.parametrize(
    "geometry",
    [
        {"kernel_size": 3, "stride": 2, "padding": 1},
        {"kernel_size": 2},
        {"kernel_size": 2, "stride": 1, "dilation": 2},
        {"kernel_size": 3, "stride": 2, "ceil_mode": True},
    ],
)
def test_other_geometries(geometry):
    x = make_input("ties", (3, 4, 9, 9), seed=2)
    ref_out = nn.MaxPool2d(**geometry)(x)
    g = gradient(tuple(ref_out.shape))
    out, grad_input, _ = pool_and_grad(FastMaxPool2d(**geometry), x, g)
    ref_out, ref_grad, _ = pool_and_grad(nn.MaxPool2d(**geometry), x, g)
    assert_same(out, ref_out)
    assert_same(grad_input, ref_grad)


@pytest.mark.parametrize(
    "case",
    ["unbatched", "one channel", "channels last", "transposed", "float64", "return_indices"],
)
def test_other_inputs_match_too(case):
    x = make_input("tanh", (2, 4, 7, 7), seed=3)
    pool, reference = FastMaxPool2d(2, 1), nn.MaxPool2d(2, 1)
    if case == "unbatched":
        x = x[0]
    elif case == "one channel":
        x = x[:, :1]
    elif case == "channels last":
        x = x.contiguous(memory_format=torch.channels_last)
    elif case == "transposed":
        x = x.transpose(-1, -2)
    elif case == "float64":
        x = x.double()
    else:
        pool = FastMaxPool2d(2, 1, return_indices=True)
        reference = nn.MaxPool2d(2, 1, return_indices=True)
        (out, index), (ref_out, ref_index) = pool(x), reference(x)
        assert_same(out, ref_out)
        assert torch.equal(index, ref_index)
        return
    g = gradient(tuple(reference(x).shape)).to(x.dtype)
    out, grad_input, _ = pool_and_grad(pool, x, g)
    ref_out, ref_grad, _ = pool_and_grad(reference, x, g)
    assert_same(out, ref_out)
    assert_same(grad_input, ref_grad)
    with torch.no_grad():
        assert_same(pool(x), reference(x))


@pytest.mark.parametrize(
    ("name", "layers"), [("cnn_small", ["0", "3", "7"]), ("cnn", ["0", "3", "7", "9"])]
)
def test_models_use_it_and_keep_their_state_dict(name, layers):
    model = build_model(name)
    pools = [m for m in model.modules() if isinstance(m, nn.MaxPool2d)]
    assert len(pools) == 2 and all(type(m) is FastMaxPool2d for m in pools)
    assert all((m.kernel_size, m.stride) == (2, 1) for m in pools)
    # The keys of the nn.MaxPool2d models: their checkpoints load, strictly, both ways.
    assert list(model.state_dict()) == [f"{k}.{w}" for k in layers for w in ("weight", "bias")]
    reference = with_nn_pooling(model)
    model.load_state_dict(reference.state_dict())
    reference.load_state_dict(model.state_dict())


@pytest.mark.parametrize("name", ["cnn_small", "cnn"])
@pytest.mark.parametrize("batch", [1, 10])
def test_vmapped_local_steps_match(name, batch):
    # The user-level trainer's computation: vmap over clients of grad of each client's loss.
    torch.manual_seed(0)
    model = build_model(name)
    reference = with_nn_pooling(model)
    clients = 3
    names = [k for k, _ in model.named_parameters()]
    weights = tuple(
        p.detach() + 0.01 * torch.randn(clients, *p.shape) for _, p in model.named_parameters()
    )
    x = torch.rand(clients, batch, 1, 28, 28)
    y = torch.randint(0, 10, (clients, batch))

    def grads(module: nn.Module) -> tuple[torch.Tensor, ...]:
        def loss(w, xb, yb):
            out = functional_call(module, dict(zip(names, w, strict=True)), (xb,))
            return F.cross_entropy(out, yb)

        return vmap(grad(loss))(weights, x, y)

    for mine, theirs in zip(grads(model), grads(reference), strict=True):
        assert_same(mine, theirs)


def test_per_sample_gradients_and_clipped_sums_match():
    torch.manual_seed(1)
    model = build_model("cnn_small")
    reference = with_nn_pooling(model)
    x, y = torch.rand(6, 1, 28, 28), torch.randint(0, 10, (6,))
    samples = []
    for module in (model, reference):
        wrapped = GradSampleModule(copy.deepcopy(module))
        F.cross_entropy(wrapped(x), y).backward()
        samples.append([p.grad_sample for p in wrapped.parameters()])
    for mine, theirs in zip(*samples, strict=True):
        assert_same(mine, theirs)
    sums = []
    for module in (model, reference):
        result = FastGradientClipper(module).clipped_sum(x, y, F.cross_entropy, 0.1)
        sums.append([result.norms, result.factors, *(p.grad for p in module.parameters())])
    for mine, theirs in zip(*sums, strict=True):
        assert_same(mine, theirs)


def test_which_path_a_call_takes(monkeypatch):
    monkeypatch.setattr(FastMaxPool2d, "min_elements", MIN_ELEMENTS)
    calls = []
    apply = pooling._ChannelsLastMaxPool.apply

    def counted(*args):
        calls.append(args[0].shape)
        return apply(*args)

    monkeypatch.setattr(pooling._ChannelsLastMaxPool, "apply", counted)
    pool = FastMaxPool2d(2, 1)
    small, large = make_input("tanh", (10, 8, 14, 14)), make_input("tanh", (16, 8, 14, 14))
    assert type(pool(small.requires_grad_()).grad_fn).__name__ == "MaxPool2DWithIndicesBackward0"
    assert type(pool(large.requires_grad_()).grad_fn).__name__ == "_ChannelsLastMaxPoolBackward"
    with torch.no_grad():  # evaluation: the channels-last forward pass, no autograd.Function
        assert_same(pool(small), nn.MaxPool2d(2, 1)(small))
    assert calls == [large.shape]
    # Under vmap a call pools every client's batch at once: the fast path, whatever the size.
    vmap(grad(lambda t: pool(t).sum()))(small.detach().unsqueeze(0).expand(3, -1, -1, -1, -1))
    assert calls == [large.shape, small.shape]
