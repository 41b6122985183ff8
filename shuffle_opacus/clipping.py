"""Exact sums of clipped per-sample gradients in one forward and one backward pass.

The local-noise protocol needs, for a round of ``N`` reports, only the *sum of clipped per-sample
gradients* ``sum_i c_i grad_i`` with ``c_i = min(1, C / (||grad_i|| + 1e-6))`` (Opacus's clip
factor), ``grad_i`` the gradient of report ``i``'s own loss over all trainable parameters.
Opacus materialises every ``grad_i`` of every parameter and then reduces them (``N x 26,010``
floats a round for the MNIST CNN). :class:`FastGradientClipper` never holds them all:

1. **Forward**: hooks on every ``Conv2d``, ``Linear`` and ``GroupNorm`` keep the layer's input
   and output.
2. **Backward**: ``torch.autograd.grad`` from the loss (or the model's output) to the layer
   outputs gives each layer's output gradient ``g``, and nothing else: no parameter gradient is
   computed. With a mean loss the root gradient is scaled by ``N``, so ``g`` is the gradient of
   each report's own loss.
3. **Norms**: per layer and report, the squared norm of that layer's per-sample gradient, the
   cheapest way for its shape: ``||g_i||^2 ||a_i||^2`` for a ``Linear`` on ``(N, in)``; for a
   ``Conv2d`` either the "ghost" Gram-matrix identity ``||sum_p g_p a_p^T||^2 = sum_{p,q} (a_p .
   a_q)(g_p . g_q)`` over output positions (late layers), or the per-sample weight gradients of a
   chunk of reports by one batched product of the unfolded input ("unfold") or one grouped
   convolution backward ("grouped", for one-channel inputs).
4. **Clipped sum**: the factors ``c_i`` from the total norms, then per layer one weighted
   contraction: ``c @ G`` where the per-sample gradients were kept (small layers), else the
   ordinary weight-gradient kernel applied to the rescaled output gradients ``c_i g_i``.

The result is exact (equal to clipping ``torch.func`` per-sample gradients up to floating-point
rounding; tested). :class:`ClippedSumModule` makes it a drop-in: ``loss.backward()`` on a loss of
its output computes the round's clipped sum (see :func:`shuffle_opacus.make_private` with
``grad_sample_mode="fast"``).

Limits: every trainable parameter must be the ``weight``/``bias`` of a ``Conv2d``, ``Linear`` or
``GroupNorm`` (anything else is refused with the module named); a layer may run once per forward
(no weight tying); a hooked layer's output must not be modified in place; no module may mix the
reports of a batch (``BatchNorm`` in training mode is refused); the loss must be a sum or mean of
per-report losses.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Literal, cast

import torch
import torch.nn.functional as F  # noqa: N812
from torch import Tensor, nn
from torch.utils.hooks import RemovableHandle

__all__ = [
    "CONV_STRATEGIES",
    "ClipResult",
    "ClippedSumModule",
    "FastGradientClipper",
    "UnsupportedModuleError",
    "clip_factors",
]

ConvStrategy = Literal["auto", "ghost", "unfold", "grouped"]
CONV_STRATEGIES: tuple[str, ...] = ("auto", "ghost", "unfold", "grouped")
SUPPORTED_LAYERS: tuple[type[nn.Module], ...] = (nn.Conv2d, nn.Linear, nn.GroupNorm)

LossFn = Callable[[Tensor, Tensor], Tensor]

_DEFAULT_KEEP_BYTES = 64 * 2**20
_DEFAULT_CHUNK_BYTES = 12 * 2**20


class UnsupportedModuleError(ValueError):
    """A trainable parameter belongs to a layer type the clipper cannot handle."""


@dataclass(frozen=True)
class ClipResult:
    """What :meth:`FastGradientClipper.clipped_sum` returns besides the gradients.

    Attributes:
        norms: ``(N,)`` per-sample gradient norms before clipping (all layers together).
        factors: ``(N,)`` clipping factors ``c_i`` that were applied.
        loss: The batch loss as ``loss_fn`` reduced it (detached, 0-dim), ``None`` for an
            empty batch.
        batch_size: ``N``, the number of per-sample gradients summed.
    """

    norms: Tensor
    factors: Tensor
    loss: Tensor | None
    batch_size: int


def clip_factors(norms: Tensor, max_norm: float, eps: float = 1e-6) -> Tensor:
    """Return ``min(1, max_norm / (norms + eps))``, Opacus's per-sample clipping factor.

    With ``eps = 0`` this is the textbook ``min(1, C / ||g||)`` (a zero norm gives 1).
    """
    return (max_norm / (norms + eps)).clamp(max=1.0)


@dataclass
class _Record:
    """One hooked layer call of the current forward pass."""

    module: nn.Module
    name: str
    activation: Tensor
    output: Tensor
    version: int


@dataclass
class _LayerWork:
    """Per-layer result of the norm pass, consumed by the clipped-sum pass."""

    record: _Record
    grad_output: Tensor
    # Per-sample gradients kept for the final weighted sum: param -> (N, numel).
    kept: dict[nn.Parameter, Tensor]


def _trainable(module: nn.Module) -> list[tuple[str, nn.Parameter]]:
    return [(n, p) for n, p in module.named_parameters(recurse=False) if p.requires_grad]


def _param(tensor: Tensor) -> nn.Parameter:
    """Type a layer's ``weight`` or ``bias`` as what it is at run time, an ``nn.Parameter``.

    torch annotates these attributes as ``Tensor``; the module registers them as parameters.
    """
    return cast(nn.Parameter, tensor)


class FastGradientClipper:
    """Wrap a module to compute sums of clipped per-sample gradients in one backward pass.

    The module is used in place (not copied): hooks are registered on its ``Conv2d``,
    ``Linear`` and ``GroupNorm`` layers and are inactive except inside :meth:`clipped_sum`,
    so the module can still be trained or evaluated normally. Call :meth:`remove` (or use the
    clipper as a context manager) to take the hooks off.

    Args:
        module: The model. Its trainable parameters must all belong to supported layers.
        loss_reduction: ``"mean"`` or ``"sum"``: how ``loss_fn`` reduces per-example losses.
            With ``"mean"`` the captured gradients are multiplied back by ``N`` so that each
            ``grad_i`` is the gradient of example ``i``'s own loss (as Opacus does).
        eps: Added to the norm in the clipping factor; ``1e-6`` is Opacus's value (the current
            ``shuffle_opacus`` path), ``0`` gives ``min(1, C / ||g||)`` exactly.
        conv_strategy: How ``Conv2d`` per-sample norms are computed: one of
            :data:`CONV_STRATEGIES` for every conv layer, or a mapping from layer name (as in
            ``module.named_modules()``) to strategy; unnamed layers use ``"auto"``
            (:meth:`heuristic_conv_strategy`). Exact either way; the choice only changes the
            floating-point rounding and the speed.
        keep_bytes: Per-sample gradients of a layer whose ``N x numel`` tensor fits in this
            many bytes are kept after the norm pass and reduced with one ``c @ G`` product;
            larger ones are discarded and the clipped gradient is recomputed from ``c_i g_i``.
        chunk_bytes: Working-set target (bytes) for the chunked per-sample computations
            (unfolded inputs, Gram matrices, per-sample gradients).

    Raises:
        UnsupportedModuleError: if a trainable parameter is not the weight or bias of a
            supported layer (the error names the module and its type).
        ValueError: for a bad argument.
    """

    def __init__(
        self,
        module: nn.Module,
        *,
        loss_reduction: Literal["mean", "sum"] = "mean",
        eps: float = 1e-6,
        conv_strategy: ConvStrategy | Mapping[str, ConvStrategy] = "auto",
        keep_bytes: int = _DEFAULT_KEEP_BYTES,
        chunk_bytes: int = _DEFAULT_CHUNK_BYTES,
    ) -> None:
        if loss_reduction not in ("mean", "sum"):
            raise ValueError(f"loss_reduction must be 'mean' or 'sum', got {loss_reduction!r}")
        if not eps >= 0.0:
            raise ValueError(f"eps must be >= 0, got {eps!r}")
        if keep_bytes < 0 or chunk_bytes <= 0:
            raise ValueError("keep_bytes must be >= 0 and chunk_bytes > 0")
        strategies = (
            {} if isinstance(conv_strategy, str) else {str(k): v for k, v in conv_strategy.items()}
        )
        default = conv_strategy if isinstance(conv_strategy, str) else "auto"
        for value in (default, *strategies.values()):
            if value not in CONV_STRATEGIES:
                raise ValueError(
                    f"conv_strategy must be one of {', '.join(CONV_STRATEGIES)}, got {value!r}"
                )
        self.module = module
        self.loss_reduction = loss_reduction
        self.eps = float(eps)
        self.keep_bytes = int(keep_bytes)
        self.chunk_bytes = int(chunk_bytes)
        self._layers: dict[nn.Module, str] = {}
        self._params: list[nn.Parameter] = []
        self._conv_strategy: dict[nn.Module, str] = {}
        #: Layer name -> conv strategy used by the latest call (for inspection).
        self.chosen_strategies: dict[str, str] = {}
        self._validate_and_collect(default, strategies)
        self._batchnorms = [
            (name, m)
            for name, m in module.named_modules()
            if isinstance(m, nn.modules.batchnorm._BatchNorm)
        ]
        self._records: list[_Record] | None = None
        self._handles: list[RemovableHandle] = [
            m.register_forward_hook(self._forward_hook) for m in self._layers
        ]

    # ------------------------------------------------------------------ set-up

    def _validate_and_collect(self, default: str, strategies: dict[str, ConvStrategy]) -> None:
        seen: set[int] = set()
        for name, m in self.module.named_modules():
            own = _trainable(m)
            if not own:
                continue
            if type(m) not in SUPPORTED_LAYERS:
                names = ", ".join(n for n, _ in own)
                raise UnsupportedModuleError(
                    f"module {name or '<root>'!r} of type {type(m).__name__} has trainable "
                    f"parameters ({names}); FastGradientClipper supports only "
                    f"{', '.join(t.__name__ for t in SUPPORTED_LAYERS)} (freeze it with "
                    "requires_grad_(False) or use the Opacus per-sample path)"
                )
            if isinstance(m, nn.GroupNorm) and not m.affine:
                continue
            for _, p in own:
                if id(p) in seen:
                    raise UnsupportedModuleError(
                        f"parameter shared between layers (at {name!r}): weight tying is not "
                        "supported"
                    )
                seen.add(id(p))
                self._params.append(p)
            self._layers[m] = name
            if isinstance(m, nn.Conv2d):
                self._conv_strategy[m] = strategies.pop(name, default)
        if strategies:
            raise ValueError(f"conv_strategy names no Conv2d layer: {sorted(strategies)}")

    @property
    def parameters(self) -> list[nn.Parameter]:
        """The trainable parameters whose clipped-sum gradients are written."""
        return list(self._params)

    def remove(self) -> None:
        """Remove the forward hooks from the module."""
        for h in self._handles:
            h.remove()
        self._handles.clear()

    def __enter__(self) -> FastGradientClipper:
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()

    def _forward_hook(self, module: nn.Module, inputs: tuple[Tensor, ...], output: Tensor) -> None:
        records = self._records
        if records is None or not torch.is_grad_enabled():
            return
        if any(r.module is module for r in records):
            raise RuntimeError(
                f"layer {self._layers[module]!r} ran twice in one forward pass; reused layers "
                "(weight tying) are not supported by FastGradientClipper"
            )
        records.append(
            _Record(module, self._layers[module], inputs[0].detach(), output, output._version)
        )

    @contextmanager
    def _capturing(self) -> Iterator[list[_Record]]:
        if not self._handles:
            raise RuntimeError("the clipper's hooks were removed")
        self._records = []
        try:
            yield self._records
        finally:
            self._records = None

    # ------------------------------------------------------------------ main entry

    def clipped_sum(
        self,
        x: Tensor,
        y: Tensor,
        loss_fn: LossFn,
        max_norm: float,
        *,
        accumulate: bool = False,
        micro_batch: int | None = None,
    ) -> ClipResult:
        """Write ``sum_i min(1, C / (||grad_i|| + eps)) * grad_i`` into every ``p.grad``.

        Args:
            x: Inputs, batch first (``N`` may be 0).
            y: Targets, batch first.
            loss_fn: ``loss_fn(module(x), y)`` -> scalar, reduced as ``loss_reduction`` says.
            max_norm: The clipping norm ``C`` (> 0).
            accumulate: Add to existing ``p.grad`` instead of overwriting it.
            micro_batch: Process the batch in chunks of at most this many examples (the sum is
                the same: clipping is per example); ``None`` processes it whole.

        Returns:
            The per-sample norms, clipping factors, loss and ``N`` (:class:`ClipResult`).
        """
        if not max_norm > 0.0:
            raise ValueError(f"max_norm must be > 0, got {max_norm!r}")
        if x.shape[0] != y.shape[0]:
            raise ValueError(f"x and y hold {x.shape[0]} and {y.shape[0]} examples")
        reduction = getattr(loss_fn, "reduction", None)
        if isinstance(reduction, str) and reduction != self.loss_reduction:
            raise ValueError(
                f"loss_fn reduces with {reduction!r} but the clipper was built with "
                f"loss_reduction={self.loss_reduction!r}"
            )
        if micro_batch is not None and micro_batch <= 0:
            raise ValueError(f"micro_batch must be positive, got {micro_batch!r}")
        for name, bn in self._batchnorms:
            if bn.training:
                raise RuntimeError(
                    f"{type(bn).__name__} {name!r} is in training mode: it mixes the examples "
                    "of a batch, so per-sample gradients are not defined (call .eval() on it)"
                )
        n = int(x.shape[0])
        if not accumulate:
            for p in self._params:
                p.grad = None
        if n == 0:
            with torch.no_grad():
                self._add_grads({p: torch.zeros_like(p) for p in self._params})
            dtype = self._params[0].dtype if self._params else torch.get_default_dtype()
            empty = torch.zeros(0, dtype=dtype)
            return ClipResult(norms=empty, factors=empty.clone(), loss=None, batch_size=0)
        step = n if micro_batch is None else micro_batch
        norms: list[Tensor] = []
        factors: list[Tensor] = []
        losses: list[Tensor] = []
        for start in range(0, n, step):
            nc, fc, lc = self._clipped_sum_chunk(
                x[start : start + step], y[start : start + step], loss_fn, max_norm
            )
            norms.append(nc)
            factors.append(fc)
            losses.append(lc * (nc.shape[0] if self.loss_reduction == "mean" else 1))
        loss = torch.stack(losses).sum()
        if self.loss_reduction == "mean":
            loss = loss / n
        return ClipResult(torch.cat(norms), torch.cat(factors), loss, n)

    def _clipped_sum_chunk(
        self, x: Tensor, y: Tensor, loss_fn: LossFn, max_norm: float
    ) -> tuple[Tensor, Tensor, Tensor]:
        n = int(x.shape[0])
        with self._capturing() as records:
            with torch.enable_grad():
                loss = loss_fn(self.module(x), y)
        if loss.dim() != 0:
            raise ValueError(f"loss_fn must return a scalar, got shape {tuple(loss.shape)}")
        # Root gradient N for a mean loss: the output gradients are then those of each
        # example's own loss (cross_entropy's backward divides by N, so this is exact).
        root = torch.tensor(
            float(n) if self.loss_reduction == "mean" else 1.0,
            dtype=loss.dtype,
            device=loss.device,
        )
        norms, c, summed = self.clip_records(records, loss, root, max_norm, n)
        self._add_grads(summed)
        return norms, c, loss.detach()

    def clip_records(
        self,
        records: list[_Record],
        root: Tensor,
        root_grad: Tensor,
        max_norm: float,
        n: int,
    ) -> tuple[Tensor, Tensor, dict[nn.Parameter, Tensor]]:
        """Per-sample norms, clip factors and clipped sums from one captured forward pass.

        Args:
            records: The layer calls captured during the forward pass.
            root: The tensor to differentiate (the loss, or the model's output).
            root_grad: Its gradient, scaled so that each example's rows are the gradient of
                that example's own loss.
            max_norm: The clipping norm ``C``.
            n: The number of examples.

        Returns:
            ``(norms, factors, {parameter: clipped sum})``.
        """
        for r in records:
            if r.output._version != r.version:
                raise RuntimeError(
                    f"the output of layer {r.name!r} was modified in place (e.g. "
                    "ReLU(inplace=True)); use out-of-place activations"
                )
        grads = (
            torch.autograd.grad(
                root, [r.output for r in records], grad_outputs=root_grad, allow_unused=True
            )
            if records
            else ()
        )
        with torch.no_grad():
            sq = torch.zeros(n, dtype=root.dtype, device=root.device)
            work: list[_LayerWork] = []
            for r, g in zip(records, grads, strict=True):
                if g is None:
                    g = torch.zeros_like(r.output)
                layer_sq, kept = self._layer_sq_norms(r, g)
                sq += layer_sq
                work.append(_LayerWork(r, g, kept))
            del grads
            norms = sq.clamp(min=0).sqrt()
            c = clip_factors(norms, max_norm, self.eps)
            summed: dict[nn.Parameter, Tensor] = {}
            for w in work:
                summed.update(self._layer_clipped(w, c))
            del work
            # A layer that did not run with gradients enabled has zero per-sample gradients.
            for p in self._params:
                if p not in summed:
                    summed[p] = torch.zeros_like(p)
        return norms, c, summed

    def _add_grads(self, grads: Mapping[nn.Parameter, Tensor]) -> None:
        for p in self._params:
            g = grads[p].reshape(p.shape).to(p.dtype)
            if p.grad is None:
                p.grad = g
            else:
                p.grad.add_(g)

    # ------------------------------------------------------------------ per-layer norms

    def _chunk(self, per_sample_bytes: int, n: int) -> int:
        return max(1, min(n, self.chunk_bytes // max(1, per_sample_bytes)))

    def _layer_sq_norms(self, r: _Record, g: Tensor) -> tuple[Tensor, dict[nn.Parameter, Tensor]]:
        m = r.module
        if isinstance(m, nn.Linear):
            return self._linear_sq_norms(m, r.activation, g)
        if isinstance(m, nn.Conv2d):
            return self._conv_sq_norms(m, r.activation, g, self._resolve_conv_strategy(r, g))
        if isinstance(m, nn.GroupNorm):
            return self._groupnorm_sq_norms(m, r.activation, g)
        raise AssertionError(type(m))  # pragma: no cover - excluded at construction

    def _linear_sq_norms(
        self, m: nn.Linear, a: Tensor, g: Tensor
    ) -> tuple[Tensor, dict[nn.Parameter, Tensor]]:
        n = g.shape[0]
        a = a.to(g.dtype)
        sq = g.new_zeros(n)
        if a.dim() == 2:
            gg = g.square().sum(1)
            if m.weight.requires_grad:
                sq += gg * a.square().sum(1)
            if m.bias is not None and m.bias.requires_grad:
                sq += gg
            return sq, {}
        # Sequence input (N, ..., in): ghost norm over the T token positions or materialise.
        a3, g3 = a.reshape(n, -1, a.shape[-1]), g.reshape(n, -1, g.shape[-1])
        t, din, dout = a3.shape[1], a3.shape[2], g3.shape[2]
        if m.weight.requires_grad:
            if t * t * (din + dout) < t * din * dout:
                step = self._chunk(t * t * g.element_size() * 2, n)
                for s in range(0, n, step):
                    aa = torch.bmm(a3[s : s + step], a3[s : s + step].transpose(1, 2))
                    gg3 = torch.bmm(g3[s : s + step], g3[s : s + step].transpose(1, 2))
                    sq[s : s + step] += (aa * gg3).sum((1, 2))
            else:
                step = self._chunk(din * dout * g.element_size(), n)
                for s in range(0, n, step):
                    ps = torch.bmm(g3[s : s + step].transpose(1, 2), a3[s : s + step])
                    sq[s : s + step] += ps.square().sum((1, 2))
        if m.bias is not None and m.bias.requires_grad:
            sq += g3.sum(1).square().sum(1)
        return sq, {}

    @staticmethod
    def _conv_input(m: nn.Conv2d, a: Tensor) -> tuple[Tensor, tuple[int, int]]:
        """Return the conv's input as its kernel sees it, with the padding still to apply."""
        if m.padding_mode != "zeros" or isinstance(m.padding, str):
            mode = "constant" if m.padding_mode == "zeros" else m.padding_mode
            return F.pad(a, m._reversed_padding_repeated_twice, mode=mode), (0, 0)
        return a, (int(m.padding[0]), int(m.padding[1]))

    @staticmethod
    def _conv_dims(m: nn.Conv2d, positions: int) -> tuple[int, int, int]:
        """``(K, O, P)``: per-group patch length, per-group outputs, output positions."""
        k = (m.in_channels // m.groups) * m.kernel_size[0] * m.kernel_size[1]
        return k, m.out_channels // m.groups, positions

    @classmethod
    def heuristic_conv_strategy(cls, m: nn.Conv2d, positions: int) -> str:
        """Return the ``"auto"`` choice for a conv layer with ``positions`` output positions.

        ``"ghost"`` when its two ``P x P`` Gram matrices need fewer multiply-adds than the
        per-sample gradient (``P (K + O) < K O``: late layers, small images); otherwise
        ``"grouped"`` (oneDNN grouped convolution) for grouped/depthwise layers and for large
        outputs with long patches (``P >= 100`` and ``K >= 32``), else ``"unfold"``. Measured on
        2 EPYC cores this picks the fastest of the three for 7 of 7 test shapes
        (``conv_strategies.py``);
        """
        k, o, p = cls._conv_dims(m, positions)
        if p * (k + o) < k * o:
            return "ghost"
        if m.groups > 1 or (p >= 100 and k >= 32):
            return "grouped"
        return "unfold"

    def _resolve_conv_strategy(self, r: _Record, g: Tensor) -> str:
        m = r.module
        assert isinstance(m, nn.Conv2d)
        strategy = self._conv_strategy[m]
        positions = g.shape[2] * g.shape[3]
        if strategy == "auto":
            strategy = self.heuristic_conv_strategy(m, positions)
        self.chosen_strategies[r.name] = strategy
        return strategy

    def _conv_sq_norms(
        self, m: nn.Conv2d, a: Tensor, g: Tensor, strategy: str
    ) -> tuple[Tensor, dict[nn.Parameter, Tensor]]:
        n = g.shape[0]
        a, padding = self._conv_input(m, a.to(g.dtype))
        positions = g.shape[2] * g.shape[3]
        sq = g.new_zeros(n)
        kept: dict[nn.Parameter, Tensor] = {}
        if m.bias is not None and m.bias.requires_grad:
            gb = g.sum((2, 3))
            sq += gb.square().sum(1)
            kept[_param(m.bias)] = gb  # (N, O): always small, reduce with c @ gb
        if not m.weight.requires_grad:
            return sq, kept
        numel = m.weight.numel()
        item = g.element_size()
        if strategy == "ghost":
            k = (m.in_channels // m.groups) * m.kernel_size[0] * m.kernel_size[1]
            per = (positions * (k + m.out_channels // m.groups) + 2 * positions * positions) * item
            step = self._chunk(per * m.groups, n)
            for s in range(0, n, step):
                sq[s : s + step] += self._conv_ghost(m, a[s : s + step], g[s : s + step], padding)
            return sq, kept
        keep = n * numel * item <= self.keep_bytes
        store = g.new_empty(n, numel) if keep else None
        if strategy == "unfold":
            k = (m.in_channels // m.groups) * m.kernel_size[0] * m.kernel_size[1]
            per = (positions * k + numel) * item
        else:
            per = (a[0].numel() + g[0].numel() + numel) * item
        step = self._chunk(per, n)
        for s in range(0, n, step):
            if strategy == "unfold":
                ps = self._conv_unfold_grads(m, a[s : s + step], g[s : s + step], padding)
            else:
                ps = self._conv_grouped_grads(m, a[s : s + step], g[s : s + step], padding)
            sq[s : s + step] += ps.square().sum((1, 2))
            if store is not None:
                store[s : s + step].view(ps.shape).copy_(ps)
        if store is not None:
            kept[_param(m.weight)] = store
        return sq, kept

    @staticmethod
    def _unfold(m: nn.Conv2d, a: Tensor, padding: tuple[int, int]) -> Tensor:
        """``F.unfold`` of the conv's input: ``(n, C*kh*kw, P)``, channel-major rows.

        Without dilation the patches are taken as a strided view and copied once, which is
        about 30% faster than ``F.unfold``'s ``im2col`` for small images (same values).
        """
        if tuple(m.dilation) != (1, 1):
            return F.unfold(a, m.kernel_size, dilation=m.dilation, padding=padding, stride=m.stride)
        if padding != (0, 0):
            a = F.pad(a, (padding[1], padding[1], padding[0], padding[0]))
        (kh, kw), (sh, sw) = m.kernel_size, m.stride
        v = a.unfold(2, kh, sh).unfold(3, kw, sw)  # (n, C, Ho, Wo, kh, kw), a view
        n, c, ho, wo = v.shape[:4]
        return v.permute(0, 1, 4, 5, 2, 3).reshape(n, c * kh * kw, ho * wo)

    def _conv_ghost(self, m: nn.Conv2d, a: Tensor, g: Tensor, padding: tuple[int, int]) -> Tensor:
        n, groups = a.shape[0], m.groups
        u = self._unfold(m, a, padding)  # (n, Cin*kh*kw, P); channel-major, so groups split
        p = u.shape[-1]
        u = u.reshape(n * groups, -1, p)
        go = g.reshape(n * groups, -1, p)
        aa = torch.bmm(u.transpose(1, 2), u)  # (n*groups, P, P)
        gg = torch.bmm(go.transpose(1, 2), go)
        return (aa * gg).reshape(n, -1).sum(1)

    def _conv_unfold_grads(
        self, m: nn.Conv2d, a: Tensor, g: Tensor, padding: tuple[int, int]
    ) -> Tensor:
        """Per-sample weight gradients ``(n, O, numel / O)`` (maybe a view), by unfold + bmm."""
        n, groups = a.shape[0], m.groups
        u = self._unfold(m, a, padding)
        p = u.shape[-1]
        if groups == 1:
            # (n, K, P) @ (n, P, O) -> (n, K, O): measured faster than (n, O, P) @ (n, P, K);
            # returned as a (n, O, K) view, copied to the weight's layout only if kept.
            return torch.bmm(u, g.reshape(n, -1, p).transpose(1, 2)).transpose(1, 2)
        u = u.reshape(n * groups, -1, p)
        go = g.reshape(n * groups, -1, p)
        return torch.bmm(go, u.transpose(1, 2)).reshape(n, m.out_channels, -1)

    def _conv_grouped_grads(
        self, m: nn.Conv2d, a: Tensor, g: Tensor, padding: tuple[int, int]
    ) -> Tensor:
        """Per-sample weight gradients ``(n, O, numel / O)`` by one grouped conv backward."""
        n = a.shape[0]
        # Only the weight's shape matters for the weight gradient; its values are never read.
        w = m.weight.new_empty(n * m.out_channels, *m.weight.shape[1:]).to(g.dtype)
        gw = _conv_weight_grad(
            m,
            g.reshape(1, n * m.out_channels, *g.shape[2:]),
            a.reshape(1, n * m.in_channels, *a.shape[2:]),
            w,
            padding,
            groups=n * m.groups,
        )
        return gw.reshape(n, m.out_channels, -1)

    def _groupnorm_sq_norms(
        self, m: nn.GroupNorm, a: Tensor, g: Tensor
    ) -> tuple[Tensor, dict[nn.Parameter, Tensor]]:
        n = g.shape[0]
        sq = g.new_zeros(n)
        kept: dict[nn.Parameter, Tensor] = {}
        g3 = g.reshape(n, m.num_channels, -1)
        if m.weight is not None and m.weight.requires_grad:
            x_hat = F.group_norm(a.to(g.dtype), m.num_groups, None, None, m.eps)
            gw = (g3 * x_hat.reshape(n, m.num_channels, -1)).sum(2)
            sq += gw.square().sum(1)
            kept[m.weight] = gw
        if m.bias is not None and m.bias.requires_grad:
            gb = g3.sum(2)
            sq += gb.square().sum(1)
            kept[m.bias] = gb
        return sq, kept

    # ------------------------------------------------------------------ clipped sums

    def _layer_clipped(self, w: _LayerWork, c: Tensor) -> dict[nn.Parameter, Tensor]:
        m, a, g = w.record.module, w.record.activation, w.grad_output
        out: dict[nn.Parameter, Tensor] = {}
        for p, ps in w.kept.items():
            out[p] = (c.to(ps.dtype) @ ps).view_as(p)
        todo = {id(p) for _, p in _trainable(m) if p not in out}
        if not todo:
            return out
        c = c.to(g.dtype)
        if isinstance(m, nn.Linear):
            n = g.shape[0]
            a = a.to(g.dtype)
            gs = g * c.view(n, *([1] * (g.dim() - 1)))
            g2 = gs.reshape(-1, gs.shape[-1])
            if id(m.weight) in todo:
                out[_param(m.weight)] = torch.mm(g2.t(), a.reshape(-1, a.shape[-1]))
            if m.bias is not None and id(m.bias) in todo:
                out[m.bias] = g2.sum(0)
            return out
        if isinstance(m, nn.Conv2d):
            a, padding = self._conv_input(m, a.to(g.dtype))
            gs = g * c.view(-1, 1, 1, 1)
            gw = _conv_weight_grad(m, gs, a, m.weight.to(g.dtype), padding, groups=m.groups)
            out[_param(m.weight)] = gw
            return out
        raise AssertionError(type(m))  # pragma: no cover - GroupNorm always keeps its grads


def _conv_weight_grad(
    m: nn.Conv2d,
    grad_out: Tensor,
    inp: Tensor,
    weight: Tensor,
    padding: tuple[int, int],
    *,
    groups: int,
) -> Tensor:
    """Weight gradient of ``m``'s convolution (stride and dilation of ``m``, explicit padding).

    Only ``weight``'s shape is read; ``groups`` may exceed ``m.groups`` when the reports of a
    batch are folded into channel groups.
    """
    _, gw, _ = torch.ops.aten.convolution_backward(
        grad_out,
        inp,
        weight,
        None,
        list(m.stride),
        list(padding),
        list(m.dilation),
        False,
        [0, 0],
        groups,
        [False, True, False],
    )
    return gw


class _ClippedSumGrad(torch.autograd.Function):
    """Identity on the model's output whose backward computes the round's clipped sum.

    The graph-carrying output is handed over in a list, not as an input, so that the outer
    backward never enters the network: only the anchor (a scalar that requires a gradient)
    makes the result differentiable. The backward receives the gradient of the loss with respect
    to the output, runs the clipper from the output to the hooked layers (reentrant autograd) and
    stores the clipped sum in the owning :class:`ClippedSumModule`; no ordinary parameter
    gradient is computed.
    """

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any, anchor: Tensor, value: Tensor, owner: Any, records: list, holder: list
    ) -> Tensor:
        ctx.owner = owner
        ctx.records = records
        ctx.holder = holder
        return value.clone()

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[None, ...]:  # type: ignore[override]
        ctx.owner._accumulate(ctx.holder[0], grad, ctx.records)
        ctx.records = ctx.holder = None
        return None, None, None, None, None


class ClippedSumModule(nn.Module):
    """A model whose ``loss.backward()`` produces the sum of clipped per-sample gradients.

    In training mode with gradients enabled, the forward pass records what the clipper needs
    and returns the output through an identity whose backward computes, for the batch,
    ``sum_i c_i grad_i`` (``c_i = min(1, max_grad_norm / (||grad_i|| + 1e-6))``) and adds it to
    an accumulator per parameter, with the number of reports: :meth:`take` hands both over
    (the optimizer's ``step`` does it). No ``p.grad`` is written. In evaluation mode, or under
    ``no_grad``, it is the plain model.

    Args:
        module: The model (see the module docstring for what it may contain).
        max_grad_norm: The clipping norm ``C`` (> 0).
        loss_reduction: ``"mean"`` or ``"sum"``: how the training loss reduces per-report losses.

    Raises:
        UnsupportedModuleError: for a parameter of an unsupported layer.
        ValueError: for a bad argument.
    """

    def __init__(
        self, module: nn.Module, *, max_grad_norm: float, loss_reduction: str = "mean"
    ) -> None:
        super().__init__()
        if not max_grad_norm > 0.0:
            raise ValueError(f"max_grad_norm must be > 0. Found {max_grad_norm!r}.")
        self._module = module
        self.max_grad_norm = float(max_grad_norm)
        self.clipper = FastGradientClipper(module, loss_reduction=loss_reduction)  # type: ignore[arg-type]
        self._anchor = torch.zeros((), requires_grad=True)
        self._sums: dict[nn.Parameter, Tensor] = {}
        self._reports = 0

    def forward(self, x: Tensor) -> Tensor:
        """Run the model; in training mode, arrange for the clipped sum on ``backward``."""
        if not (self.training and torch.is_grad_enabled()):
            return self._module(x)
        for name, bn in self.clipper._batchnorms:
            if bn.training:
                raise RuntimeError(
                    f"{type(bn).__name__} {name!r} is in training mode: it mixes the reports "
                    "of a batch, so per-sample gradients are not defined"
                )
        with self.clipper._capturing() as records:
            output = self._module(x)
        anchor = self._anchor.to(output.device)
        return _ClippedSumGrad.apply(anchor, output.detach(), self, list(records), [output])

    def _accumulate(self, output: Tensor, grad: Tensor, records: list) -> None:
        n = int(output.shape[0])
        if n:
            scale = float(n) if self.clipper.loss_reduction == "mean" else 1.0
            _, _, summed = self.clipper.clip_records(
                records, output, grad * scale, self.max_grad_norm, n
            )
            for p, s in summed.items():
                s = s.reshape(p.shape).to(p.dtype)
                if p in self._sums:
                    self._sums[p].add_(s)
                else:
                    self._sums[p] = s
        self._reports += n

    def take(self) -> tuple[dict[nn.Parameter, Tensor], int]:
        """Return and reset the accumulated clipped sums and the number of reports."""
        sums = {p: self._sums.get(p, torch.zeros_like(p)) for p in self.clipper.parameters}
        reports = self._reports
        self._sums, self._reports = {}, 0
        return sums, reports
