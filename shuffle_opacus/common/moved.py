"""The modules that moved into the layer folders, still importable by their old names for a release.

``import shuffle_opacus`` puts a finder first on :data:`sys.meta_path` that answers the old
dotted names (``shuffle_opacus.accountants``, ``shuffle_opacus.clipping.clipper``, ...) with the
module at its new place, the same module object, after a :class:`DeprecationWarning` naming the
new place. Old pickles and ``import`` lines keep working; the names are strings here, so this
module imports nothing of the layers above it.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types
import warnings
from collections.abc import Sequence

__all__ = ["MOVED", "install", "new_name"]

_PACKAGE = __name__.split(".")[0]

#: Old dotted name (below the package) -> new one, for the release after the move.
MOVED: dict[str, str] = {
    "_validation": "common.validation",
    "_lazy": "common.lazy",
    "_version": "common.version",
    "suggestions": "common.suggestions",
    "provenance": "common.provenance",
    "secure_random": "common.secure_random",
    "sensitivity": "accounting.sensitivity",
    "protocols": "accounting.protocols",
    "history": "accounting.history",
    "ledger": "accounting.ledger",
    "calibration": "accounting.calibration",
    "accountant_core": "engine.accountant_core",
    "accountant_state": "engine.accountant_state",
    "accountants": "engine.accountants",
    "loading": "engine.loading",
    "noise": "engine.noise",
    "options": "engine.options",
    "parameter_seal": "engine.parameter_seal",
    "plan_checks": "engine.plan_checks",
    "privacy": "engine.privacy",
    "release_registry": "engine.release_registry",
    "releases": "engine.releases",
    "sampling": "engine.sampling",
    "step_guard": "engine.step_guard",
    "_registration": "engine.registration",
    "clipping": "engine.clipping",
    "partition": "federated.partition",
    "clients": "federated",
    "cli_args": "cli.args",
    "render": "cli.render",
    "flower.secagg_decode": "flower.secagg.decode",
    "flower.secagg_mod": "flower.secagg.mod",
    "flower.secagg_node": "flower.secagg.node",
    "flower.secagg_strategy": "flower.secagg.strategy",
    "flower.secagg_workflow": "flower.secagg.workflow",
}


def new_name(fullname: str) -> str | None:
    """Return the new dotted name of a moved module, or ``None`` if it did not move.

    Args:
        fullname: A full dotted module name; the modules inside a moved folder move with it.

    Returns:
        The full new name, or ``None``.
    """
    prefix = _PACKAGE + "."
    if not fullname.startswith(prefix):
        return None
    parts = fullname[len(prefix) :].split(".")
    for cut in range(len(parts), 0, -1):
        new = MOVED.get(".".join(parts[:cut]))
        if new is not None:
            return ".".join([_PACKAGE, new, *parts[cut:]])
    return None


class _AliasLoader(importlib.abc.Loader):
    """Hand out the module at its new place under the old name."""

    def __init__(self, new: str) -> None:
        self._new = new
        self._spec: importlib.machinery.ModuleSpec | None = None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        warnings.warn(
            f"{spec.name} moved to {self._new}; import it from there (the old name goes in "
            f"the next release).",
            DeprecationWarning,
            stacklevel=2,
        )
        module = importlib.import_module(self._new)
        self._spec = module.__spec__  # the import system overwrites it with the old name's
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        module.__spec__ = self._spec  # already run at its new place; keep its own spec


class _MovedFinder(importlib.abc.MetaPathFinder):
    """Answers the old names of :data:`MOVED` (and the modules below them)."""

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: types.ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        new = new_name(fullname)
        if new is None:
            return None
        return importlib.util.spec_from_loader(fullname, _AliasLoader(new))


_FINDER = _MovedFinder()


def install() -> None:
    """Put the finder of old names first on :data:`sys.meta_path` (once)."""
    if _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)
