"""The memory limit of the privacy loss distributions' large allocations, and their errors.

A lattice's convolution or a composition's FFT estimates its bytes first and calls
:func:`check_memory`, which raises a :class:`MemoryLimitError` (a :class:`PldRangeError`: the
default method falls back to the Rényi bound with a note) instead of letting the process be
killed. The limit is :data:`MAX_MEMORY_BYTES` unless :func:`memory_limit` changes it. This module
imports nothing of the package, so every engine may import it (re-exported by
:mod:`~shuffle_opacus.analysis.limits`).
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator

__all__ = [
    "PldRangeError",
    "MemoryLimitError",
    "MAX_MEMORY_BYTES",
    "memory_limit",
    "memory_budget",
    "check_memory",
]


class PldRangeError(ValueError):
    """A valid setting the shuffle Gaussian's ``pld`` engines cannot evaluate.

    Raised for an analysis sigma below the method's floor, or one so small that the lattice or
    the loss grid would exceed its size limit; a Rényi-DP method still bounds such a setting.
    """


class MemoryLimitError(PldRangeError):
    """A plan whose estimated memory exceeds the limit (:func:`memory_limit`), before allocating.

    A :class:`PldRangeError`, so the default method of the shuffle mechanisms falls back to the
    Rényi bound with a one-line note; a method asked for by name raises it as a one-line
    ``ValueError`` naming the parameter to lower.
    """


MAX_MEMORY_BYTES = 4 << 30
"""Default limit on the estimated memory of one large allocation plan (4 GiB)."""

_MEMORY: contextvars.ContextVar[int] = contextvars.ContextVar(
    "shuffle_opacus_memory_limit", default=MAX_MEMORY_BYTES
)


@contextlib.contextmanager
def memory_limit(nbytes: int) -> Iterator[None]:
    """Limit the estimated memory of each allocation plan run inside the block.

    Args:
        nbytes: Bytes allowed (integer >= 1).

    Raises:
        ValueError: if ``nbytes`` is not an integer >= 1.
    """
    if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes < 1:
        raise ValueError(f"nbytes must be an integer >= 1. Found {nbytes!r}.")
    token = _MEMORY.set(nbytes)
    try:
        yield
    finally:
        _MEMORY.reset(token)


def memory_budget() -> int:
    """Return the bytes one allocation plan may use (:data:`MAX_MEMORY_BYTES` by default)."""
    return _MEMORY.get()


def _bytes(value: float) -> str:
    return f"{value / 2**30:.3g} GiB" if value >= 2**28 else f"{value / 2**20:.3g} MiB"


def check_memory(nbytes: float, what: str, parameter: str) -> None:
    """Refuse, before allocating, a plan whose estimated memory exceeds :func:`memory_budget`.

    Args:
        nbytes: Estimated peak bytes of the plan.
        what: What would be allocated (for the message), e.g. ``"the composition of 100 rounds"``.
        parameter: The parameter whose lowering shrinks the plan (named in the message).

    Raises:
        MemoryLimitError: one line naming ``parameter``, the estimate and the limit.
    """
    limit = memory_budget()
    if nbytes > limit:
        raise MemoryLimitError(
            f"{what} needs about {_bytes(nbytes)}, over the {_bytes(limit)} memory limit; "
            f"lower {parameter}."
        )
