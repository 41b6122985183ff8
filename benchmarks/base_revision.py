"""Load one module of the package as it was at an earlier revision, beside today's (not a test).

The identity scripts (``clones_identity.py``, ``geometric_add_identity.py``,
``ldp_pairs_identity.py``, ``windows_identity.py``) compare a rewritten module's results with its
earlier code, bit for bit. :func:`load_base_module` reads that code with ``git show REV:PATH``
and runs it as a sibling module of its package (``<package>._base_<name>``), so that its relative
imports reach today's package and nothing is copied into the scripts.
"""

from __future__ import annotations

import importlib
import importlib.util
import subprocess
import sys
import types
from collections.abc import Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def load_base_module(
    rev: str, path: str, *, renames: Mapping[str, str] | None = None
) -> types.ModuleType:
    """Return the module at ``path`` (from the repository root) as it was at ``rev``.

    Args:
        rev: A git revision of this repository.
        path: The module's file, e.g. ``shuffle_opacus/analysis/pld/ldp_pairs.py``.
        renames: Text replacements applied to the source first (to point its imports of
            sibling modules at other base modules loaded here).

    Returns:
        The module, registered in ``sys.modules`` as ``<package>._base_<name>``.

    Raises:
        subprocess.CalledProcessError: when git does not know ``rev:path``.
    """
    text = subprocess.run(
        ["git", "show", f"{rev}:{path}"], cwd=ROOT, check=True, capture_output=True, text=True
    ).stdout
    for old, new in (renames or {}).items():
        text = text.replace(old, new)
    package = ".".join(Path(path).with_suffix("").parts[:-1])
    importlib.import_module(package)
    full = f"{package}._base_{Path(path).stem.lstrip('_')}"
    spec = importlib.util.spec_from_loader(full, loader=None)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    module.__package__ = package
    sys.modules[full] = module  # dataclasses look their module up there
    exec(compile(text, f"{rev[:8]}:{path}", "exec"), module.__dict__)
    return module
