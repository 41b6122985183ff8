"""Functions whose module is imported on first call, so that importing their users stays light.

The command line answers a bad argument, and accounts the simple mechanisms, without importing
scipy's statistics and optimisation modules or ``dp_accounting``; the tables that name those
functions (:mod:`.mechanisms`, :mod:`.catalogue`) hold these stand-ins instead.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["lazy_exports", "lazy_function"]


def lazy_function(module: str, name: str) -> Callable[..., Any]:
    """Return a stand-in for ``module.name`` that imports the module on its first call.

    Args:
        module: Absolute module name (``shuffle_opacus.analysis.pld.shuffle_gaussian``).
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


def lazy_exports(
    package: str, names: Mapping[str, str], namespace: dict[str, Any]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """Return a package's ``__getattr__`` and ``__dir__`` that load its public names on use.

    PEP 562: a name of ``names`` is imported from its module (relative to ``package``) on first
    access and kept in ``namespace``, so importing the package itself stays light.

    Args:
        package: The package's ``__name__``.
        names: Public name -> the module that defines it (``".accounting"``).
        namespace: The package's ``globals()``.

    Returns:
        ``(__getattr__, __dir__)`` for the package's namespace.
    """

    def getattr_(name: str) -> Any:
        if name in names:
            value = getattr(importlib.import_module(names[name], package), name)
            namespace[name] = value
            return value
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def dir_() -> list[str]:
        return sorted(set(namespace) | set(names))

    return getattr_, dir_
