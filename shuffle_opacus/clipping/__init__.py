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
   chunk of reports by one batched product of the unfolded input ("unfold"), one grouped
   convolution backward ("grouped") or, for strided layers, one batched product per kernel row
   on the input split into its stride phases and shifted along the width ("polyphase": one copy
   of about ``1 / Ti`` of the unfolded input's size, ``Ti = kh / stride`` kernel rows a phase).
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

from .clipper import (
    CONV_STRATEGIES,
    SUPPORTED_LAYERS,
    ClipResult,
    FastGradientClipper,
    UnsupportedModuleError,
    clip_factors,
)
from .module import ClippedSumModule

__all__ = [
    "CONV_STRATEGIES",
    "SUPPORTED_LAYERS",
    "ClipResult",
    "ClippedSumModule",
    "FastGradientClipper",
    "UnsupportedModuleError",
    "clip_factors",
]
