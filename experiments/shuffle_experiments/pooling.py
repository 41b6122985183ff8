"""``nn.MaxPool2d``, bit for bit, with the forward pass on PyTorch's channels-last CPU kernel.

PyTorch's CPU max-pooling forward for a contiguous ``N x C x H x W`` input walks every window
with a data-dependent branch per element, which is slow on real data: for the CNNs' overlapping
``MaxPool2d(2, 1)`` it was a third of a user-level training step (the ``vmap`` over 100 clients
of ``benchmarks/users.py``). The kernel for channels-last inputs computes the same thing
vectorised over the channels, 5 times faster at these sizes. :class:`FastMaxPool2d` runs the
forward pass on a channels-last copy of the input, and the backward pass through the very call
``nn.MaxPool2d``'s backward makes, so that only the time changes:

* **forward**: both kernels scan a window in row-major order, keep the first maximal element
  (a later element replaces the running maximum only when it is strictly larger, or NaN, so the
  last NaN wins) and return its value and its flat index ``h * W + w`` in its plane: the same
  output and indices. The output is made contiguous, the layout ``nn.MaxPool2d`` returns for
  such an input, so the next layer gets the same tensor.
* **backward**: ``max_pool2d_with_indices_backward`` of the output gradient, the original
  input and those indices: each output's gradient goes to its window's selected element, and
  the windows that select one input position add into it in row-major order of the outputs,
  starting from zero. The input's gradient has the input's layout, as with ``nn.MaxPool2d``.

The fast path is taken for a floating-point ``N x C x H x W`` input on CPU with more than one
channel and unit stride along the width (a contiguous batch, or one sample of a ``vmap`` over
clients), without ``return_indices``; any other call is ``nn.MaxPool2d.forward`` itself (a
channels-last input already gets the fast kernel there). So is a small training call outside
``torch.func`` transforms (:attr:`FastMaxPool2d.min_elements`): the ``autograd.Function``'s
Python overhead outweighs the kernel's gain on a batch of about 10 images. The fast path works
under ``torch.func.grad`` and ``torch.func.vmap`` (the vmap rule is generated from the same
operations) and with Opacus and :mod:`shuffle_opacus.engine.clipping`, which never look inside a
layer without parameters; forward-mode AD (``torch.func.jvp``) is not provided. When no
gradient is recorded (evaluation) it runs the same forward pass without the
``autograd.Function``, faster than ``nn.MaxPool2d`` at every batch size.
"""

from __future__ import annotations

from typing import Any, cast

import torch
from torch import Tensor, nn

__all__ = ["FastMaxPool2d"]


#: ``(kernel_size, stride, padding, dilation, ceil_mode)`` as ATen's pooling takes them.
_Geometry = tuple[list[int], list[int], list[int], list[int], bool]


def _pool_channels_last(x: Tensor, geometry: _Geometry) -> tuple[Tensor, Tensor]:
    """Max-pool ``x`` with the channels-last kernel; return the contiguous output and indices."""
    # The channel dimension moved to the end, copied, and viewed back as ``N x C x H x W``:
    # movedim and contiguous() work under vmap, unlike contiguous(memory_format=...).
    last = x.movedim(-3, -1).contiguous().movedim(-1, -3)
    output, indices = torch.ops.aten.max_pool2d_with_indices(last, *geometry)
    return output.contiguous(), indices


class _ChannelsLastMaxPool(torch.autograd.Function):
    """Max-pooling whose forward runs on a channels-last copy of the input (see the module)."""

    generate_vmap_rule = True

    @staticmethod
    def forward(
        x: Tensor,
        kernel_size: list[int],
        stride: list[int],
        padding: list[int],
        dilation: list[int],
        ceil_mode: bool,
    ) -> tuple[Tensor, Tensor]:
        """Return the pooled ``x`` (contiguous) and the indices of the selected elements.

        Args:
            x: The input, ``N x C x H x W``.
            kernel_size: Window height and width.
            stride: Vertical and horizontal stride.
            padding: Implicit ``-inf`` padding on each side, vertical and horizontal.
            dilation: Spacing of the window's elements, vertical and horizontal.
            ceil_mode: Round the output size up instead of down.

        Returns:
            ``(output, indices)``; the indices are in the channels-last layout (their values,
            flat positions in the input plane, do not depend on the layout).
        """
        return _pool_channels_last(x, (kernel_size, stride, padding, dilation, ceil_mode))

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: tuple[Tensor, Tensor]) -> None:
        """Keep the input, the indices and the pooling's geometry for the backward pass."""
        x, kernel_size, stride, padding, dilation, ceil_mode = inputs
        indices = output[1]
        ctx.mark_non_differentiable(indices)
        # No zero tensor for the indices' (absent) gradient: the backward pass ignores it.
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(x, indices)
        ctx.geometry = (kernel_size, stride, padding, dilation, ceil_mode)

    @staticmethod
    def backward(
        ctx: Any, grad_output: Tensor | None, _grad_indices: Tensor | None
    ) -> tuple[Tensor | None, ...]:
        """Route each output's gradient to its selected element: ``nn.MaxPool2d``'s backward.

        Returns:
            The input's gradient, and ``None`` for the five geometry arguments.
        """
        if grad_output is None:  # the output was not used (grads are not materialised)
            return None, None, None, None, None, None
        x, indices = ctx.saved_tensors
        kernel_size, stride, padding, dilation, ceil_mode = ctx.geometry
        grad_input = torch.ops.aten.max_pool2d_with_indices_backward(
            grad_output, x, kernel_size, stride, padding, dilation, ceil_mode, indices
        )
        return grad_input, None, None, None, None, None


def _pair(value: int | tuple[int, ...]) -> list[int]:
    return [value, value] if isinstance(value, int) else [int(v) for v in value]


class FastMaxPool2d(nn.MaxPool2d):
    """``nn.MaxPool2d`` with the same results bit for bit and a faster CPU forward pass.

    Takes the arguments of ``nn.MaxPool2d`` (the experiment's CNNs use
    ``FastMaxPool2d(2, 1)``). The forward pass runs PyTorch's channels-last kernel on a
    channels-last copy of the input and the backward pass is ``nn.MaxPool2d``'s own with the
    same indices (see :mod:`shuffle_experiments.pooling` for when). The output, the input's
    gradient and their layouts are those of ``nn.MaxPool2d``, ties (the first maximal element
    of a window in row-major order gets the gradient) and NaN (the last NaN of a window)
    included.
    """

    #: Outside ``torch.func`` transforms, a training call on fewer input elements than this
    #: runs ``nn.MaxPool2d.forward``: the ``autograd.Function`` adds about 0.1 ms to a forward
    #: and backward pass (Python), more than its kernel saves on ``cnn_small``'s batches of
    #: 12 images or fewer (measured on one core: 1.3 times nn's time at 15,680 elements,
    #: 0.6 times at 25,088). Under ``vmap`` a call pools the whole batch of clients at once and
    #: ``numel`` counts one client's share, so there is no threshold there.
    min_elements: int = 20_000

    def forward(self, input: Tensor) -> Tensor:
        """Pool ``input`` as ``nn.MaxPool2d`` does.

        Args:
            input: The tensor to pool, ``C x H x W`` or ``N x C x H x W``.

        Returns:
            The pooled tensor (and the indices with ``return_indices``, as ``nn.MaxPool2d``).

        Raises:
            RuntimeError: for an input or geometry ``nn.MaxPool2d`` refuses (raised by it).
        """
        if self.return_indices or not _fast_path(input):
            return cast(Tensor, super().forward(input))
        recorded = torch.is_grad_enabled() and input.requires_grad  # true under torch.func.grad
        if recorded and input.numel() < self.min_elements and not _transformed():
            return cast(Tensor, super().forward(input))  # a small batch: nn's kernel is faster
        geometry: _Geometry = (
            _pair(self.kernel_size),
            _pair(self.stride),
            _pair(self.padding),
            _pair(self.dilation),
            bool(self.ceil_mode),
        )
        if not recorded:  # evaluation: the same forward pass, without an autograd.Function
            return _pool_channels_last(input, geometry)[0]
        output, _ = _ChannelsLastMaxPool.apply(input, *geometry)  # type: ignore[no-untyped-call]
        return cast(Tensor, output)


def _transformed() -> bool:
    """Whether a ``torch.func`` transform (``vmap``, ``grad``, ...) is active.

    The check ``torch.autograd.Function.apply`` makes itself; if a torch version lacks it, every
    call counts as transformed (the fast path, never a wrong result: both paths agree).
    """
    active = getattr(torch._C, "_are_functorch_transforms_active", None)
    return True if active is None else bool(active())


def _fast_path(x: Tensor) -> bool:
    """Whether ``x`` takes the channels-last forward pass (see :class:`FastMaxPool2d`).

    A 4-dimensional input whose width has stride 1 and which has several channels is never
    "channels-last like" to PyTorch (so ``nn.MaxPool2d`` would return a contiguous output,
    as the fast path does); one that is already channels last runs the fast kernel anyway.
    """
    return (
        x.dim() == 4
        and x.device.type == "cpu"
        and x.is_floating_point()
        and x.size(1) > 1
        and x.stride(3) == 1
    )
