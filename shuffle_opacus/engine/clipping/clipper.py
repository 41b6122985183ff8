"""The fast clipper: hooks, the norm pass and the clipped-sum pass (see the package docstring)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor, nn
from torch.utils.hooks import RemovableHandle

from .layers import ConvStrategy, LayerKernels, _LayerWork, _Record, _trainable

__all__ = [
    "CONV_STRATEGIES",
    "ClipResult",
    "FastGradientClipper",
    "UnsupportedModuleError",
    "clip_factors",
]

CONV_STRATEGIES: tuple[str, ...] = ("auto", "ghost", "unfold", "grouped", "polyphase")
SUPPORTED_LAYERS: tuple[type[nn.Module], ...] = (nn.Conv2d, nn.Linear, nn.GroupNorm)

LossFn = Callable[[Tensor, Tensor], Tensor]

_DEFAULT_KEEP_BYTES = 64 * 2**20
_DEFAULT_CHUNK_BYTES = 4 * 2**20


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


class FastGradientClipper(LayerKernels):
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
        self._phase_indices: dict[tuple[object, ...], torch.Tensor] = {}
        self._workspaces: dict[tuple[object, ...], torch.Tensor] = {}
        self._layer_params: dict[nn.Module, list[nn.Parameter]] = {}
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
            self._layer_params[m] = [p for _, p in own]
            if isinstance(m, nn.Conv2d):
                self._conv_strategy[m] = strategies.pop(name, default)
        if strategies:
            raise ValueError(f"conv_strategy names no Conv2d layer: {sorted(strategies)}")

    @property
    def parameters(self) -> list[nn.Parameter]:
        """The trainable parameters whose clipped-sum gradients are written."""
        return list(self._params)

    def remove(self) -> None:
        """Remove the forward hooks from the module and free the reused buffers."""
        for h in self._handles:
            h.remove()
        self._handles.clear()
        self.release_workspace()

    def release_workspace(self) -> None:
        """Free the buffers kept between calls (the next call allocates them again).

        The per-sample work of a layer reuses its buffers from one call (micro-batch) to the
        next: at most ``keep_bytes`` of kept per-sample gradients per layer plus one chunk's
        working set (``chunk_bytes``). Call this between phases of a long job to give that
        memory back; results do not change.
        """
        self._workspaces.clear()

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
