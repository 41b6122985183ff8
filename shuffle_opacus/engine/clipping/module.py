"""``ClippedSumModule``: the fast clipper as a drop-in module for ``loss.backward()``."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from .clipper import FastGradientClipper

__all__ = ["ClippedSumModule"]


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
