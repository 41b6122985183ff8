"""Exact sums of clipped per-sample gradients in one forward and one backward pass.

The local-noise protocol needs, for a round of ``N`` reports, only the *sum of clipped
per-sample gradients* ``sum_i c_i grad_i`` with Opacus's clip factor ``c_i = min(1, C /
(||grad_i|| + 1e-6))``. :class:`FastGradientClipper` computes it without holding every
per-sample gradient, as Opacus does: hooks keep each layer's input and output, one
``torch.autograd.grad`` gives the output gradients, per-layer per-report norms come from the
cheapest identity for the layer's shape (:data:`CONV_STRATEGIES` for ``Conv2d``), and one
weighted contraction per layer gives the clipped sum (:func:`clip_factors`,
:class:`ClipResult`). The result equals clipping ``torch.func`` per-sample gradients up to
floating-point rounding (tested). :class:`ClippedSumModule` makes it a drop-in for
:func:`shuffle_opacus.make_private` with ``grad_sample_mode="fast"``. Only the ``weight`` and
``bias`` of :data:`SUPPORTED_LAYERS` (``Conv2d``, ``Linear``, ``GroupNorm``) may be trainable
(else :class:`UnsupportedModuleError`), with no weight tying, no in-place change of a hooked
output, no module mixing the reports of a batch, and a sum or mean of per-report losses.

The four steps and the limits: docs/opacus.md, section ``grad_sample_mode="fast"``.
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
