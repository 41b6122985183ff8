"""The ``shuffle-opacus`` command answers before its heavy imports.

A bad argument must be refused without loading scipy, ``dp_accounting`` or torch, and the simple
accountings must not load more than ``scipy.special``: each scenario runs in a fresh
interpreter and reports which of those modules it loaded.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

HEAVY = ("scipy", "scipy.special", "scipy.stats", "scipy.optimize", "scipy.signal",
         "dp_accounting", "torch", "opacus", "tqdm")  # fmt: skip

SCRIPT = """
import contextlib, io, json, sys
from shuffle_opacus.cli import main
with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
    status = main({argv!r})
print(json.dumps([status, [m for m in {heavy!r} if m in sys.modules]]))
"""


def _loaded(argv: list[str]) -> tuple[int, list[str]]:
    code = SCRIPT.format(argv=argv, heavy=HEAVY)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    status, loaded = json.loads(out.stdout.strip().splitlines()[-1])
    return status, loaded


@pytest.mark.parametrize(
    "argv",
    [
        ["account", "shuffle", "--n", "-3", "--sigma", "1"],
        ["account", "checkin", "--n", "100", "--rate", "2", "--sigma", "1"],
        ["account", "nosuch"],
        ["calibrate", "checkin", "--n", "100", "--rounds", "10", "--epsilon", "1"],
    ],
)
def test_a_bad_argument_loads_nothing_heavy(argv):
    status, loaded = _loaded(argv)
    assert status == 2
    assert loaded == []


@pytest.mark.parametrize(
    "argv",
    [
        ["account", "gaussian", "--sigma", "1", "--steps", "10"],
        # A Rényi bound by name (the default, pld, needs dp_accounting).
        ["account", "shuffle", "--n", "1000", "--sigma", "1", "--steps", "10", "--method",
         "theorem1"],
    ],
)  # fmt: skip
def test_simple_accountings_need_only_scipy_special(argv):
    status, loaded = _loaded(argv)
    assert status == 0
    assert set(loaded) <= {"scipy", "scipy.special"}


def test_the_central_gaussian_loads_no_scipy_at_all():
    """``account gaussian`` needs no series of Theorem 1: scipy.special (0.15 s) stays out, so
    the command starts within 2x ``import numpy`` (benchmarks/startup.py: 1.67x)."""
    status, loaded = _loaded(["account", "gaussian", "--sigma", "1", "--steps", "10"])
    assert status == 0
    assert loaded == []
