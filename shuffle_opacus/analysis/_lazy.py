"""Functions whose module is imported on first call, so that importing their users stays light.

The command line answers a bad argument, and accounts the simple mechanisms, without importing
scipy's statistics and optimisation modules or ``dp_accounting``; the tables that name those
functions (:mod:`.mechanisms`, :mod:`.catalogue`) hold these stand-ins instead.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable
from typing import Any

__all__ = ["lazy_function"]


def lazy_function(module: str, name: str) -> Callable[..., Any]:
    """Return a stand-in for ``module.name`` that imports the module on its first call.

    Args:
        module: Absolute module name (``shuffle_opacus.analysis.pld.gaussian``).
        name: The function's name in that module.

    Returns:
        A function with the same calling convention.
    """

    @functools.cache
    def target() -> Callable[..., Any]:
        return getattr(importlib.import_module(module), name)

    def call(*args: Any, **kwargs: Any) -> Any:
        return target()(*args, **kwargs)

    call.__name__ = name
    call.__qualname__ = name
    call.__doc__ = f"Call :func:`{module}.{name}` (imported on first use)."
    return call
