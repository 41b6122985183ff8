"""The exact clipped sum (shuffle_opacus.engine.clipping) against torch.func and Opacus.

The oracle, ``reference_clipped_sum`` below, clips ``torch.func`` per-sample gradients (vmap of
grad over single examples) and sums them: no code shared with the module.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F  # noqa: N812
from shuffle_experiments.models import cnn  # the experiment's MNIST CNN, 26,010 parameters
from torch import nn

from shuffle_opacus.engine.clipping import FastGradientClipper, UnsupportedModuleError, clip_factors

SMALL_C, LARGE_C = 0.01, 1e6


def per_sample_reference(module, x, y, loss_fn):
    """Per-sample gradients of each example's own loss: ``name -> (N, *param.shape)``."""
    from torch.func import functional_call, grad, vmap

    params = {k: v.detach() for k, v in module.named_parameters() if v.requires_grad}
    buffers = {k: v.detach() for k, v in module.named_buffers()}
    frozen = {k: v.detach() for k, v in module.named_parameters() if not v.requires_grad}

    def one(p, xi, yi):
        out = functional_call(module, (p, buffers, frozen), (xi.unsqueeze(0),))
        return loss_fn(out, yi.unsqueeze(0))

    return vmap(grad(one), in_dims=(None, 0, 0))(params, x, y)


def reference_clipped_sum(module, x, y, loss_fn, max_norm, eps=1e-6):
    """Clip ``torch.func`` per-sample gradients and sum them: ``(name -> sum, norms)``."""
    params = {k: v for k, v in module.named_parameters() if v.requires_grad}
    if x.shape[0] == 0:
        return {k: torch.zeros_like(v) for k, v in params.items()}, x.new_zeros(0)
    ps = per_sample_reference(module, x, y, loss_fn)
    norms = torch.sqrt(sum(g.reshape(g.shape[0], -1).square().sum(1) for g in ps.values()))
    c = (max_norm / (norms + eps)).clamp(max=1.0)
    return {k: torch.einsum("i,i...->...", c, g) for k, g in ps.items()}, norms


def gn_cnn() -> nn.Module:
    """A CNN with GroupNorm, grouped/dilated/'same'/reflect-padded convs and a bias-free conv."""
    return nn.Sequential(
        nn.Conv2d(1, 8, 3, padding="same", padding_mode="reflect"),
        nn.GroupNorm(4, 8),
        nn.ReLU(),
        nn.Conv2d(8, 8, 3, stride=2, groups=4, bias=False),
        nn.Tanh(),
        nn.Conv2d(8, 12, 3, dilation=2, padding=1, groups=2),
        nn.AvgPool2d(2),
        nn.Flatten(),
        nn.Linear(12 * 5 * 5, 10),
    )


class SeqModel(nn.Module):
    """Linear layers on (N, T, d) inputs: exercises both sequence-norm branches."""

    def __init__(self) -> None:
        super().__init__()
        self.wide = nn.Linear(28, 64)  # T=28, in 28, out 64: ghost is cheaper
        self.narrow = nn.Linear(64, 2)  # in 64, out 2: materialising is cheaper
        self.head = nn.Linear(28 * 2, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.wide(x.reshape(x.shape[0], 28, 28)))
        return self.head(self.narrow(h).flatten(1))


def data(n: int, dtype: torch.dtype = torch.float32, seed: int = 0) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(n, 1, 28, 28, generator=g).to(dtype)
    y = torch.randint(0, 10, (n,), generator=g)
    return x, y


def tol(dtype: torch.dtype) -> float:
    return 2e-5 if dtype == torch.float32 else 1e-12


def assert_matches_reference(
    model: nn.Module,
    clipper: FastGradientClipper,
    x: torch.Tensor,
    y: torch.Tensor,
    max_norm: float,
    loss_fn=F.cross_entropy,
    **kwargs,
) -> None:
    result = clipper.clipped_sum(x, y, loss_fn, max_norm, **kwargs)
    ref, norms = reference_clipped_sum(model, x, y, loss_fn, max_norm, eps=clipper.eps)
    assert result.batch_size == x.shape[0]
    assert result.norms.shape == (x.shape[0],)
    t = tol(x.dtype)
    if x.shape[0]:
        torch.testing.assert_close(result.norms, norms, rtol=t, atol=0)
    for name, p in model.named_parameters():
        if not p.requires_grad:
            assert p.grad is None
            continue
        assert p.grad is not None and p.grad.shape == p.shape and p.grad.dtype == p.dtype
        scale = max(ref[name].abs().max().item(), 1e-30)
        err = (p.grad - ref[name]).abs().max().item()
        assert err <= t * scale, f"{name}: max abs diff {err:.3g} vs scale {scale:.3g}"


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("max_norm", [SMALL_C, LARGE_C])
@pytest.mark.parametrize("n", [1, 2, 37])
def test_cnn_matches_torch_func(dtype: torch.dtype, max_norm: float, n: int) -> None:
    torch.manual_seed(0)
    model = cnn().to(dtype)
    x, y = data(n, dtype)
    assert_matches_reference(model, FastGradientClipper(model), x, y, max_norm)


def test_small_c_clips_everything_and_large_c_nothing() -> None:
    # float64, so that the comparison does not depend on the summation order (thread count).
    torch.manual_seed(0)
    model = cnn().double()
    x, y = data(16, torch.float64)
    clipper = FastGradientClipper(model)
    small = clipper.clipped_sum(x, y, F.cross_entropy, SMALL_C)
    assert (small.factors < 1).all()
    expected = torch.full((16,), SMALL_C, dtype=torch.float64)
    assert torch.allclose(small.norms * small.factors, expected, rtol=1e-4)
    large = clipper.clipped_sum(x, y, F.cross_entropy, LARGE_C)
    assert (large.factors == 1).all()
    # Nothing clipped: the sum of per-sample gradients is N times the mean-loss gradient.
    summed = {k: p.grad.clone() for k, p in model.named_parameters()}
    model.zero_grad()
    F.cross_entropy(model(x), y).backward()
    for k, p in model.named_parameters():
        torch.testing.assert_close(summed[k], 16 * p.grad, rtol=1e-10, atol=1e-13)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_empty_batch_gives_zero_sum(dtype: torch.dtype) -> None:
    model = cnn().to(dtype)
    x, y = data(0, dtype)
    result = FastGradientClipper(model).clipped_sum(x, y, F.cross_entropy, SMALL_C)
    assert result.batch_size == 0 and result.loss is None
    assert result.norms.shape == (0,) and result.norms.dtype == dtype
    for p in model.parameters():
        assert p.grad is not None and p.grad.dtype == dtype
        assert torch.count_nonzero(p.grad) == 0


@pytest.mark.parametrize("strategy", ["auto", "ghost", "unfold", "grouped", "polyphase"])
@pytest.mark.parametrize("keep_bytes", [0, 1 << 30])
def test_conv_strategies_agree(strategy: str, keep_bytes: int) -> None:
    torch.manual_seed(1)
    model = cnn().double()
    x, y = data(9, torch.float64)
    clipper = FastGradientClipper(model, conv_strategy=strategy, keep_bytes=keep_bytes)  # type: ignore[arg-type]
    assert_matches_reference(model, clipper, x, y, SMALL_C)


def test_small_chunks_and_micro_batches() -> None:
    torch.manual_seed(2)
    model = cnn().double()
    x, y = data(23, torch.float64)
    clipper = FastGradientClipper(model, chunk_bytes=1)  # one example per internal chunk
    assert_matches_reference(model, clipper, x, y, SMALL_C)
    clipper = FastGradientClipper(model)
    assert_matches_reference(model, clipper, x, y, SMALL_C, micro_batch=5)
    result = clipper.clipped_sum(x, y, F.cross_entropy, SMALL_C, micro_batch=5)
    torch.testing.assert_close(result.loss, F.cross_entropy(model(x), y).detach())


@pytest.mark.parametrize("strategy", ["auto", "ghost", "unfold", "grouped"])
@pytest.mark.parametrize("max_norm", [SMALL_C, LARGE_C])
def test_groupnorm_grouped_padded_convs(strategy: str, max_norm: float) -> None:
    torch.manual_seed(3)
    model = gn_cnn().double()
    x, y = data(7, torch.float64)
    clipper = FastGradientClipper(model, conv_strategy=strategy)  # type: ignore[arg-type]
    assert_matches_reference(model, clipper, x, y, max_norm)


#: (in, out, kernel, stride, padding, dilation, groups, padding_mode, input size) for polyphase.
POLYPHASE_SHAPES = [
    (1, 16, 8, 2, 3, 1, 1, "zeros", 28),  # the MNIST CNN's layers
    (16, 32, 4, 2, 0, 1, 1, "zeros", 13),
    (3, 5, 3, 1, 1, 1, 1, "zeros", 9),  # stride 1: one phase, kh taps
    (4, 6, 3, 1, 2, 2, 2, "zeros", 10),  # dilated and grouped
    (2, 4, (4, 2), (2, 1), (1, 0), 1, 1, "zeros", 11),  # different strides and kernel sides
    (2, 3, 4, 2, 1, 1, 1, "reflect", 9),  # padding applied before the phases are taken
]


@pytest.mark.parametrize("shape", POLYPHASE_SHAPES)
def test_polyphase_matches_torch_func_per_sample_gradients(
    shape: tuple, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Norms and clipped sum of one conv layer, from a random output gradient, vs torch.func.

    For 1 and 7 examples, with the per-sample gradients kept or not, whole or in chunks of 3
    (the last one shorter).
    """
    from torch.func import functional_call, grad, vmap

    cin, cout, k, stride, pad, dil, groups, mode, size = shape
    torch.manual_seed(11)
    conv = nn.Conv2d(
        cin, cout, k, stride=stride, padding=pad, dilation=dil, groups=groups, padding_mode=mode
    ).double()
    params = {k: v.detach() for k, v in conv.named_parameters()}

    def one(params: dict, xi: torch.Tensor, gi: torch.Tensor) -> torch.Tensor:
        return (functional_call(conv, params, (xi.unsqueeze(0),)) * gi.unsqueeze(0)).sum()

    for n in (1, 7):
        x = torch.randn(n, cin, size, size, dtype=torch.float64)
        with torch.no_grad():
            g = torch.randn_like(conv(x))
        ps = vmap(grad(one), in_dims=(None, 0, 0))(params, x, g)
        ref = torch.sqrt(sum(v.reshape(n, -1).square().sum(1) for v in ps.values()))
        for keep_bytes, chunk in ((1 << 30, None), (0, 3), (1 << 30, 3)):
            clipper = FastGradientClipper(conv, conv_strategy="polyphase", keep_bytes=keep_bytes)
            if chunk is not None:
                monkeypatch.setattr(clipper, "_chunk", lambda per, n, chunk=chunk: min(n, chunk))
            with clipper._capturing() as records:
                out = conv(x)
            norms, c, summed = clipper.clip_records(records, out, g, 1.0, n)
            clipper.remove()
            assert clipper.chosen_strategies == {"": "polyphase"}
            torch.testing.assert_close(norms, ref, rtol=1e-12, atol=0)
            for name, p in conv.named_parameters():
                expected = torch.einsum("i,i...->...", c, ps[name])
                torch.testing.assert_close(summed[p], expected, rtol=1e-12, atol=1e-12)


def test_reused_buffers_do_not_leak_between_calls() -> None:
    """One clipper over calls of other sizes, image sizes and dtypes gives a fresh clipper's bits.

    The per-sample buffers and the stride-phase index are kept from call to call (per layer,
    dtype and input shape); a stale one would give other numbers or fail. After
    ``release_workspace`` the buffers are gone and the numbers are still the same.
    """

    def model() -> nn.Module:
        torch.manual_seed(5)
        return nn.Sequential(
            nn.Conv2d(2, 4, 4, stride=2, padding=1),
            nn.Tanh(),
            nn.Conv2d(4, 6, 4, stride=2),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
            nn.Linear(6, 3),
        )

    def run(clipper: FastGradientClipper, n: int, size: int, dtype: torch.dtype) -> list:
        torch.manual_seed(n * 100 + size)
        x = torch.randn(n, 2, size, size, dtype=dtype)
        y = torch.randint(0, 3, (n,))
        clipper.module.to(dtype)
        result = clipper.clipped_sum(x, y, F.cross_entropy, SMALL_C)
        return [result.norms, *(p.grad.clone() for p in clipper.parameters)]

    shared = FastGradientClipper(model(), conv_strategy="polyphase")
    calls = [(9, 16, torch.float64), (4, 16, torch.float64), (9, 20, torch.float32),
             (12, 16, torch.float32), (3, 20, torch.float64)]  # fmt: skip
    for i, (n, size, dtype) in enumerate(calls):
        if i == 3:
            assert shared._workspaces
            shared.release_workspace()
            assert not shared._workspaces
        got = run(shared, n, size, dtype)
        fresh = FastGradientClipper(model(), conv_strategy="polyphase")
        expected = run(fresh, n, size, dtype)
        fresh.remove()
        assert shared.chosen_strategies == {"0": "polyphase", "2": "polyphase"}
        for a, b in zip(got, expected, strict=True):
            assert a.dtype == dtype
            assert torch.equal(a, b), (n, size, dtype)
    shared.remove()
    assert not shared._workspaces


def test_auto_strategy_choices() -> None:
    """``auto`` takes polyphase for both MNIST CNN layers; polyphase falls back where it fails."""
    model = cnn()
    clipper = FastGradientClipper(model)
    clipper.clipped_sum(*data(3), F.cross_entropy, SMALL_C)
    assert clipper.chosen_strategies == {"0": "polyphase", "3": "polyphase"}
    late = nn.Conv2d(64, 128, 4, stride=2)  # 3 x 3 outputs: the Gram matrices are far cheaper
    assert FastGradientClipper.heuristic_conv_strategy(late, 9) == "ghost"
    odd = nn.Sequential(nn.Conv2d(1, 2, 3, stride=2), nn.Flatten(), nn.Linear(2 * 13 * 13, 10))
    clipper = FastGradientClipper(odd, conv_strategy="polyphase")  # kernel 3, stride 2
    clipper.clipped_sum(*data(2), F.cross_entropy, SMALL_C)
    assert clipper.chosen_strategies == {"0": "unfold"}


def test_sequence_linear_layers() -> None:
    torch.manual_seed(4)
    model = SeqModel().double()
    x, y = data(6, torch.float64)
    assert_matches_reference(model, FastGradientClipper(model), x, y, SMALL_C)


def test_frozen_layers_are_skipped() -> None:
    torch.manual_seed(5)
    model = cnn().double()
    model[0].weight.requires_grad_(False)
    model[7].requires_grad_(False)
    x, y = data(8, torch.float64)
    clipper = FastGradientClipper(model)
    assert len(clipper.parameters) == 5
    assert_matches_reference(model, clipper, x, y, SMALL_C)


def test_sum_reduction_and_explicit_loss_module() -> None:
    torch.manual_seed(6)
    model = cnn().double()
    x, y = data(5, torch.float64)
    clipper = FastGradientClipper(model, loss_reduction="sum")
    assert_matches_reference(
        model, clipper, x, y, SMALL_C, loss_fn=nn.CrossEntropyLoss(reduction="sum")
    )
    with pytest.raises(ValueError, match="reduces with 'mean'"):
        clipper.clipped_sum(x, y, nn.CrossEntropyLoss(), SMALL_C)


def test_eps_zero_is_textbook_clipping_and_zero_norm_is_safe() -> None:
    norms = torch.tensor([0.0, 0.005, 0.02])
    torch.testing.assert_close(clip_factors(norms, 0.01, eps=0.0), torch.tensor([1.0, 1.0, 0.5]))
    model = nn.Sequential(nn.Flatten(), nn.Linear(784, 10, bias=False))
    x = torch.zeros(3, 1, 28, 28)  # zero input: every per-sample gradient is 0
    result = FastGradientClipper(model, eps=0.0).clipped_sum(
        x, torch.tensor([0, 1, 2]), F.cross_entropy, 0.01
    )
    assert torch.equal(result.norms, torch.zeros(3)) and torch.equal(result.factors, torch.ones(3))
    assert torch.count_nonzero(model[1].weight.grad) == 0
    torch.manual_seed(7)
    model = cnn().double()
    x, y = data(10, torch.float64)
    assert_matches_reference(model, FastGradientClipper(model, eps=0.0), x, y, SMALL_C)


def test_accumulate_adds_to_existing_grads() -> None:
    torch.manual_seed(8)
    model = cnn().double()
    x, y = data(12, torch.float64)
    clipper = FastGradientClipper(model)
    clipper.clipped_sum(x[:5], y[:5], F.cross_entropy, SMALL_C)
    clipper.clipped_sum(x[5:], y[5:], F.cross_entropy, SMALL_C, accumulate=True)
    ref, _ = reference_clipped_sum(model, x, y, F.cross_entropy, SMALL_C)
    for k, p in model.named_parameters():
        torch.testing.assert_close(p.grad, ref[k], rtol=1e-12, atol=1e-16)


def test_matches_opacus_per_sample_clipping() -> None:
    """The current shuffle_opacus path: Opacus hooks per-sample grads + DPOptimizer clipping."""
    from opacus.grad_sample import GradSampleModule
    from opacus.optimizers import DPOptimizer

    torch.manual_seed(9)
    model = cnn()
    x, y = data(64)
    ours = FastGradientClipper(model)
    ours.clipped_sum(x, y, F.cross_entropy, SMALL_C)
    mine = {k: p.grad.clone() for k, p in model.named_parameters()}
    ours.remove()
    gsm = GradSampleModule(model, loss_reduction="mean")
    opt = DPOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1),
        noise_multiplier=0.0,
        max_grad_norm=SMALL_C,
        expected_batch_size=64,
    )
    opt.zero_grad()
    F.cross_entropy(gsm(x), y).backward()
    opt.clip_and_accumulate()
    for k, p in gsm._module.named_parameters():
        torch.testing.assert_close(mine[k], p.summed_grad, rtol=1e-5, atol=1e-9)


def test_module_behaves_normally_outside_clipped_sum() -> None:
    torch.manual_seed(10)
    model = cnn()
    x, y = data(4)
    clipper = FastGradientClipper(model)
    F.cross_entropy(model(x), y).backward()  # ordinary backward still fills p.grad
    assert all(p.grad is not None for p in model.parameters())
    with torch.no_grad():
        model(x)
    clipper.remove()
    with pytest.raises(RuntimeError, match="hooks were removed"):
        clipper.clipped_sum(x, y, F.cross_entropy, SMALL_C)
    with FastGradientClipper(model) as c2:
        c2.clipped_sum(x, y, F.cross_entropy, SMALL_C)


def test_refuses_unsupported_layers() -> None:
    with pytest.raises(UnsupportedModuleError, match="BatchNorm2d"):
        FastGradientClipper(nn.Sequential(nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4)))

    class Scaled(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.scale = nn.Parameter(torch.ones(1))
            self.fc = nn.Linear(784, 10)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.fc(x.flatten(1)) * self.scale

    with pytest.raises(UnsupportedModuleError, match="<root>.*Scaled"):
        FastGradientClipper(Scaled())
    # Frozen unsupported layers are fine.
    frozen = nn.Sequential(nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4).requires_grad_(False))
    FastGradientClipper(frozen)


def test_refuses_in_place_outputs_and_reused_layers() -> None:
    x, y = data(3)
    inplace = nn.Sequential(
        nn.Conv2d(1, 2, 3), nn.ReLU(inplace=True), nn.Flatten(), nn.Linear(2 * 26 * 26, 10)
    )
    with pytest.raises(RuntimeError, match="modified in place"):
        FastGradientClipper(inplace).clipped_sum(x, y, F.cross_entropy, SMALL_C)

    class Twice(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(10, 10)
            self.inp = nn.Linear(784, 10)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.fc(self.fc(self.inp(x.flatten(1))))

    with pytest.raises(RuntimeError, match="ran twice"):
        FastGradientClipper(Twice()).clipped_sum(x, y, F.cross_entropy, SMALL_C)


def test_bad_arguments() -> None:
    model = cnn()
    x, y = data(2)
    with pytest.raises(ValueError):
        FastGradientClipper(model, loss_reduction="none")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        FastGradientClipper(model, conv_strategy="fft")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="names no Conv2d"):
        FastGradientClipper(model, conv_strategy={"7": "ghost"})
    clipper = FastGradientClipper(model, conv_strategy={"0": "unfold"})
    with pytest.raises(ValueError):
        clipper.clipped_sum(x, y, F.cross_entropy, 0.0)
    with pytest.raises(ValueError):
        clipper.clipped_sum(x, y[:1], F.cross_entropy, 1.0)
    with pytest.raises(ValueError):
        clipper.clipped_sum(x, y, F.cross_entropy, 1.0, micro_batch=0)
    assert math.isfinite(float(clipper.clipped_sum(x, y, F.cross_entropy, 1.0).loss))


def test_grads_are_plain_tensors() -> None:
    model = cnn()
    x, y = data(3)
    FastGradientClipper(model).clipped_sum(x, y, F.cross_entropy, SMALL_C)
    for p in model.parameters():
        assert p.grad is not None and p.grad.grad_fn is None and not p.grad.requires_grad
        assert p.grad.is_contiguous()


def test_batchnorm_in_training_mode_is_refused_and_unused_layers_get_zero() -> None:
    model = nn.Sequential(
        nn.Conv2d(1, 4, 3),
        nn.BatchNorm2d(4).requires_grad_(False),
        nn.Flatten(),
        nn.Linear(4 * 26 * 26, 10),
    )
    x, y = data(4)
    clipper = FastGradientClipper(model)
    with pytest.raises(RuntimeError, match="training mode"):
        clipper.clipped_sum(x, y, F.cross_entropy, SMALL_C)
    model[1].eval()
    assert_matches_reference(model.double(), clipper, x.double(), y, SMALL_C)

    class Unused(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.used = nn.Linear(784, 10)
            self.spare = nn.Linear(10, 10)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.used(x.flatten(1))

    model2 = Unused()
    FastGradientClipper(model2).clipped_sum(x, y, F.cross_entropy, SMALL_C)
    assert torch.count_nonzero(model2.spare.weight.grad) == 0
    assert torch.count_nonzero(model2.used.weight.grad) > 0


# --- the drop-in mode: make_private(grad_sample_mode="fast") ----------------------------------


def _round(mode: str, x, y, noise_seed: int, micro: int | None = None):
    """One check-in round of make_private in ``mode``; returns the model's parameters after it."""
    from opacus import PrivacyEngine
    from torch.utils.data import DataLoader, TensorDataset

    import shuffle_opacus
    from shuffle_opacus.engine.sampling import ShuffledCheckInSampler

    torch.manual_seed(0)
    model = cnn()
    engine = PrivacyEngine(accountant="shuffled_checkin")
    data_loader = DataLoader(
        TensorDataset(x, y), batch_sampler=ShuffledCheckInSampler(len(x), 1.0, 1, seed=0)
    )
    model, optimizer, loader = shuffle_opacus.make_private(
        engine, module=model, optimizer=torch.optim.SGD(model.parameters(), lr=1.0),
        data_loader=data_loader, noise_multiplier=2.0, max_grad_norm=SMALL_C,
        grad_sample_mode=mode, noise_generator=torch.Generator().manual_seed(noise_seed),
    )  # fmt: skip
    for xb, yb in loader:
        pairs = zip(xb.split(micro or len(xb)), yb.split(micro or len(yb)), strict=True)
        chunks = list(pairs) if len(xb) else [(xb, yb)]
        optimizer.zero_grad()
        for i, (xc, yc) in enumerate(chunks):
            F.cross_entropy(model(xc), yc).backward()
            if micro is not None:
                optimizer.signal_skip_step(do_skip=i < len(chunks) - 1)
            optimizer.step()
            if i < len(chunks) - 1:
                optimizer.zero_grad()
    plain = model._module
    assert engine.accountant.history == [(2.0, 1.0, 1)]
    assert optimizer.last_report_count == len(x)
    return [p.detach().clone() for p in plain.parameters()], plain


@pytest.mark.parametrize("micro", [None, 7])
def test_fast_mode_steps_like_the_per_sample_path(micro):
    x, y = data(40)
    hooks, _ = _round("hooks", x, y, noise_seed=3, micro=micro)
    fast, plain = _round("fast", x, y, noise_seed=3, micro=micro)
    for a, b in zip(hooks, fast, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)
    # Outside training the wrapper is the plain model, and no ordinary gradient was written.
    assert all(p.grad is not None for p in plain.parameters())  # the noisy update itself


def test_fast_mode_refuses_unsupported_layers_before_changing_anything():
    from opacus import PrivacyEngine
    from torch.utils.data import DataLoader, TensorDataset

    import shuffle_opacus

    class Scaled(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.scale = nn.Parameter(torch.ones(1))
            self.fc = nn.Linear(784, 10)

        def forward(self, x):
            return self.fc(x.flatten(1)) * self.scale

    model = Scaled()
    engine = PrivacyEngine(accountant="shuffled_checkin")
    x, y = data(8)
    with pytest.raises(ValueError, match="Scaled"):
        shuffle_opacus.make_private(
            engine, module=model, optimizer=torch.optim.SGD(model.parameters(), lr=1.0),
            data_loader=DataLoader(TensorDataset(x, y)), noise_multiplier=1.0,
            max_grad_norm=1.0, rounds=2, rate=0.5, grad_sample_mode="fast",
        )  # fmt: skip
    assert not engine.accountant.is_configured
