"""Keep the model's parameters changing only through the private optimizer's guarded step.

The accountant covers the updates that :class:`~shuffle_opacus.engine.noise.LocalNoiseDPOptimizer`
applies after the step guard accepted the round (:mod:`shuffle_opacus.engine.step_guard`). Two side
doors bypass that step; both are closed here once an accountant's hook is attached:

* **The wrapped optimizer.** ``optimizer.original_optimizer`` stays reachable (Opacus itself
  reads it for ``param_groups``, ``state``, ``state_dict`` and ``zero_grad``), but stepping it
  outside the private step is refused before anything changes: :func:`refuse_outside_steps`
  registers a torch step pre-hook that lets a step through only inside :func:`guarded_step`.
* **Anything else that writes the parameters** (another optimizer over them, a manual update,
  ``p.data`` assignments). A :class:`ParameterSeal` keeps a bitwise copy of the parameters as the
  last guarded step left them; the next guarded step compares, before it clips, adds noise or
  changes anything, and is refused if a single bit differs.

The copy is exact, not a checksum: a checksum of a few reductions can be fooled by an ordinary
step (a cross-entropy layer's bias gradient sums to zero, so plain SGD keeps the bias's sum),
while a bitwise comparison misses no change at all. It costs one copy of the parameters in
memory and two passes over them per step (measured in docs/opacus.md).
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch

__all__ = ["ParameterSeal", "guarded_step", "refuse_outside_steps"]

_SAME_SIZE_INTS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}

# Optimizers being stepped by a guarded step right now, and those that refuse other steps.
_INSIDE: set[int] = set()
_ARMED: weakref.WeakSet[torch.optim.Optimizer] = weakref.WeakSet()


def _bits(t: torch.Tensor) -> torch.Tensor:
    """Return ``t`` (detached) viewed as integers of its element size: its exact bit pattern."""
    t = t.detach()
    if t.is_complex():
        t = torch.view_as_real(t)
    if t.dtype == torch.bool:
        return t
    return t.view(_SAME_SIZE_INTS[t.element_size()])


class ParameterSeal:
    """A bitwise copy of parameters, to tell whether anything changed them since it was taken.

    Attributes:
        records: Number of times :meth:`record` was called (guarded steps taken).
    """

    def __init__(self) -> None:
        """Create a seal with nothing recorded (every comparison passes until the first record)."""
        self._copies: list[torch.Tensor] = []
        self.records = 0

    def _fits(self, params: Sequence[torch.Tensor]) -> bool:
        return len(params) == len(self._copies) and all(
            c.shape == p.shape and c.dtype == p.dtype and c.device == p.device
            for c, p in zip(self._copies, params, strict=True)
        )

    def record(self, params: Sequence[torch.Tensor]) -> None:
        """Copy ``params`` bit for bit (into the previous copy's memory where the shapes fit).

        Args:
            params: The parameters as a guarded step has just left them.
        """
        if self._fits(params):
            for copy, p in zip(self._copies, params, strict=True):
                _bits(copy).copy_(_bits(p))
        else:
            self._copies = [p.detach().clone() for p in params]
        self.records += 1

    def changed(self, params: Sequence[torch.Tensor]) -> list[int]:
        """Return the positions of the parameters that differ from the recorded copy.

        Before the first :meth:`record` nothing has changed. When the number of parameters
        differs from the copy's, every position counts as changed.

        Args:
            params: The parameters now, in the order they were recorded.

        Returns:
            The positions whose shape, dtype, device or any bit differs (empty if none).
        """
        if not self.records:
            return []
        if len(params) != len(self._copies):
            return list(range(len(params)))
        flags: list[torch.Tensor | bool] = []
        for copy, p in zip(self._copies, params, strict=True):
            if copy.shape != p.shape or copy.dtype != p.dtype or copy.device != p.device:
                flags.append(True)
            else:
                flags.append(torch.ne(_bits(copy), _bits(p)).any())
        tensors = [f for f in flags if isinstance(f, torch.Tensor)]
        if tensors and len({f.device for f in tensors}) == 1 and len(tensors) == len(flags):
            values = torch.stack(tensors).tolist()  # one device synchronisation, not one each
        else:
            values = [bool(f) for f in flags]
        return [i for i, v in enumerate(values) if v]


@contextmanager
def guarded_step(optimizer: torch.optim.Optimizer) -> Iterator[None]:
    """Let ``optimizer.step()`` through the pre-hook of :func:`refuse_outside_steps` in the block.

    Args:
        optimizer: The wrapped (original) optimizer the private step is about to step.
    """
    key = id(optimizer)
    outer = key in _INSIDE
    _INSIDE.add(key)
    try:
        yield
    finally:
        if not outer:
            _INSIDE.discard(key)


def _refuse(optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
    """Refuse a step of ``optimizer`` outside :func:`guarded_step` (the step pre-hook).

    Raises:
        ValueError: outside :func:`guarded_step`, before the step changes anything.
    """
    if id(optimizer) not in _INSIDE:
        raise ValueError(
            "optimizer.original_optimizer.step() was called outside the private optimizer's "
            "step(): it would apply a gradient that no accountant checked (the plain gradient, "
            "or the noise of a refused step); call optimizer.step() once per batch of the "
            "private loader instead."
        )


def refuse_outside_steps(optimizer: torch.optim.Optimizer) -> None:
    """Make each step of ``optimizer`` outside :func:`guarded_step` raise before it changes a thing.

    Registered once per optimizer, however many private optimizers wrap it.

    Args:
        optimizer: The optimizer a private optimizer wraps.
    """
    if optimizer not in _ARMED:
        optimizer.register_step_pre_hook(_refuse)
        _ARMED.add(optimizer)
