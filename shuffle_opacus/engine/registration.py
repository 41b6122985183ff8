"""Register the accountants with Opacus without making ``import shuffle_opacus`` import torch.

``import shuffle_opacus`` must register ``shuffle``, ``subsampled_shuffle`` and
``shuffled_checkin`` with :func:`opacus.accountants.register_accountant`, but the maths layer and
the ``shuffle-opacus account`` command must not pay for importing torch. So:

* if ``opacus.accountants`` is already imported, the accountants are registered at once;
* otherwise a finder on :data:`sys.meta_path` waits for ``opacus.accountants`` to be imported,
  lets it execute normally, and registers the accountants right after it. The finder removes
  itself once it has fired.

Either way the accountants are registered before any user code can reach
``PrivacyEngine(accountant=...)``, which needs ``opacus.accountants``.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types
from collections.abc import Sequence

_TARGET = "opacus.accountants"


def _register() -> None:
    module = sys.modules.get(f"{__package__}.accountants")
    if module is not None and not hasattr(module, "register_all"):
        # shuffle_opacus.engine.accountants is being imported and its own import of Opacus got here
        # first: the module registers the accountants itself when it finishes.
        return
    from . import accountants

    accountants.register_all()


class _LoaderWrapper(importlib.abc.Loader):
    """Run the real loader, then register."""

    def __init__(self, loader: importlib.abc.Loader) -> None:
        self._loader = loader

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType | None:
        return self._loader.create_module(spec)

    def exec_module(self, module: types.ModuleType) -> None:
        # The real loader object stays the module's __loader__ (resources, reload, ...).
        module.__loader__ = self._loader
        if module.__spec__ is not None:
            module.__spec__.loader = self._loader
        self._loader.exec_module(module)
        _uninstall()
        _register()


class _OpacusImportFinder(importlib.abc.MetaPathFinder):
    """Meta-path finder that only intercepts ``opacus.accountants``."""

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: types.ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != _TARGET:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _LoaderWrapper(spec.loader)
                return spec
        return None


_FINDER = _OpacusImportFinder()


def _uninstall() -> None:
    while _FINDER in sys.meta_path:
        sys.meta_path.remove(_FINDER)


def install() -> None:
    """Register now if Opacus's accountants are imported, else when they are.

    Safe to call any number of times.
    """
    if _TARGET in sys.modules:
        _uninstall()
        _register()
    elif _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)
