"""Package namespaces whose public names are imported on first use (PEP 562).

``import shuffle_opacus`` and ``import shuffle_opacus.analysis`` stay light, so that the command
line starts without torch, scipy's statistics or ``dp_accounting``; a name loads its module
when it is first read.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["lazy_exports"]


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
