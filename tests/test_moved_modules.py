"""The modules' names before the layer folders import for one release: the same module objects,
with a DeprecationWarning that names the new place (shuffle_opacus/common/moved.py)."""

from __future__ import annotations

import importlib
import pickle
import re
import sys
from pathlib import Path

import pytest

import shuffle_opacus  # noqa: F401 - installs the finder of old names
from shuffle_opacus.common.moved import MOVED, new_name

PACKAGE = Path(__file__).resolve().parents[1] / "shuffle_opacus"


def _forget(name):
    for key in [k for k in sys.modules if k == name or k.startswith(name + ".")]:
        del sys.modules[key]


@pytest.mark.parametrize("old", sorted(MOVED))
def test_an_old_name_is_the_module_at_its_new_place(old):
    if old.startswith("flower."):
        pytest.importorskip("flwr")
    new = importlib.import_module(f"shuffle_opacus.{MOVED[old]}")
    _forget(f"shuffle_opacus.{old}")
    with pytest.warns(DeprecationWarning, match=f"shuffle_opacus.{old} moved to {new.__name__}"):
        module = importlib.import_module(f"shuffle_opacus.{old}")
    assert module is new
    assert new.__spec__.name == new.__name__  # its own spec, not the old name's


def test_old_names_are_only_those_that_moved():
    for old, new in MOVED.items():
        path = PACKAGE / old.replace(".", "/")
        assert not path.with_suffix(".py").exists() and not path.is_dir(), old
        target = PACKAGE / new.replace(".", "/")
        assert target.with_suffix(".py").exists() or (target / "__init__.py").exists(), new
    assert new_name("shuffle_opacus.analysis.query") is None
    assert new_name("shuffle_opacus") is None
    assert new_name("numpy.linalg") is None


def test_a_module_inside_a_moved_folder_follows_it():
    _forget("shuffle_opacus.clipping")
    with pytest.warns(DeprecationWarning):
        from shuffle_opacus.clipping import layers
    from shuffle_opacus.engine.clipping import layers as new

    assert layers is new
    assert new_name("shuffle_opacus.clipping.layers") == "shuffle_opacus.engine.clipping.layers"


def test_a_pickle_that_names_an_old_module_loads_the_same_class():
    from shuffle_opacus.accounting.protocols import CheckIn

    _forget("shuffle_opacus.protocols")
    with pytest.warns(DeprecationWarning):
        found = pickle.loads(b"cshuffle_opacus.protocols\nCheckIn\n.")
    assert found is CheckIn


def test_the_repository_uses_the_new_names_only():
    # The old names are for users' code; the repository's own code and pages use the new ones.
    root = PACKAGE.parent
    dotted = "|".join(re.escape(old) for old in MOVED)
    slashed = "|".join(re.escape(old.replace(".", "/")) for old in MOVED)
    pattern = re.compile(rf"\bshuffle_opacus(\.({dotted})(?![\w])|/({slashed})(\.py|/))")
    skip = {Path(__file__).resolve(), PACKAGE / "common" / "moved.py"}
    found = []
    for folder in ("shuffle_opacus", "tests", "experiments", "benchmarks", "docs", ".ci"):
        for path in sorted((root / folder).rglob("*")):
            if path.suffix not in {".py", ".md", ".sh", ".yaml", ".toml"} or path in skip:
                continue
            for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
                if pattern.search(line):
                    found.append(f"{path.relative_to(root)}:{number}: {line.strip()}")
    for name in ("README.md", "CONTRIBUTING.md", "pyproject.toml", "mkdocs.yml"):
        for number, line in enumerate((root / name).read_text(encoding="utf-8").splitlines(), 1):
            if pattern.search(line):
                found.append(f"{name}:{number}: {line.strip()}")
    assert found == [], "old module names:\n" + "\n".join(found)
