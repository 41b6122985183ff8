"""Package namespaces whose public names are imported on first use (PEP 562).

``import shuffle_opacus`` and ``import shuffle_opacus.analysis`` stay light, so that the command
line starts without torch, scipy's statistics or ``dp_accounting``; a name loads its module
when it is first read. A package may also keep old names for one release: reading one warns
(:class:`DeprecationWarning`) and names the way that replaces it.
"""

from __future__ import annotations

import importlib
import sys
import warnings
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["lazy_exports"]


def lazy_exports(
    package: str,
    names: Mapping[str, str],
    namespace: dict[str, Any],
    deprecated: Mapping[str, tuple[str, str]] | None = None,
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """Return a package's ``__getattr__`` and ``__dir__`` that load its public names on use.

    PEP 562: a name of ``names`` is imported from its module (relative to ``package``) on first
    access and kept in ``namespace``, so importing the package itself stays light. A name of
    ``deprecated`` is imported the same way but never kept, so that every read through the
    package warns once; with ``deprecated`` given, ``__dir__`` lists only ``names`` (the front
    door) and the module's dunder attributes, not the old names, submodules or helpers.

    Args:
        package: The package's ``__name__``.
        names: Public name -> the module that defines it (``".accounting"``).
        namespace: The package's ``globals()``.
        deprecated: Old public name -> ``(module, replacement)``, where ``replacement`` says in
            words what to use instead (it ends the warning's message).

    Returns:
        ``(__getattr__, __dir__)`` for the package's namespace.
    """
    old = dict(deprecated or {})

    def getattr_(name: str) -> Any:
        if name in names:
            value = getattr(importlib.import_module(names[name], package), name)
            namespace[name] = value
            return value
        if name in old:
            module, replacement = old[name]
            # ``from package import name`` reads the name twice: once in the import machinery's
            # ``hasattr`` (which only checks for a submodule), once in the statement itself;
            # only the second warns, so that one statement gives one warning.
            if sys._getframe(1).f_globals.get("__name__") != "importlib._bootstrap":
                warnings.warn(
                    f"{package}.{name} is deprecated and will be removed in the next release; "
                    f"{replacement}",
                    DeprecationWarning,
                    stacklevel=2,
                )
            return getattr(importlib.import_module(module, package), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def dir_() -> list[str]:
        if old:
            return sorted(set(names) | {k for k in namespace if k.startswith("__")})
        return sorted(set(namespace) | set(names))

    return getattr_, dir_
