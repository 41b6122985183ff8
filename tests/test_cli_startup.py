"""The ``shuffle-opacus`` command answers before its heavy imports.

A bad argument must be refused without loading scipy, ``dp_accounting`` or torch, and the simple
accountings and the clones bound must not load more than ``scipy.special``: each scenario runs
in a fresh interpreter and reports which of those modules it loaded.
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
from shuffle_opacus.cli.command import main
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


@pytest.mark.parametrize(
    "argv",
    [
        ["account", "clones", "--n", "1000", "--eps0", "1"],
        ["account", "clones", "--n", "1000", "--eps0", "1", "--steps", "10"],
        ["account", "clones", "--n", "1000", "--eps0", "1", "--method", "closed-form"],
    ],
)
def test_the_clones_bound_needs_only_scipy_special(argv):
    """The clones bound of eps0-LDP reports (benchmarks/clones.py times it against Apple's code,
    both as whole processes) takes its binomials from scipy.special and minimises by hand: no
    scipy.stats nor scipy.optimize (0.4 s of imports between them)."""
    status, loaded = _loaded(argv)
    assert status == 0
    assert set(loaded) <= {"scipy", "scipy.special"}


def test_the_gaussian_clones_bound_loads_no_scipy_stats():
    # Gaussian reports need the analytic Gaussian's root finder (scipy.optimize), not more.
    status, loaded = _loaded(["account", "clones-gaussian", "--n", "1000", "--sigma", "3"])
    assert status == 0
    assert "scipy.stats" not in loaded


def test_the_clones_functions_need_only_scipy_special():
    # The library call the benchmark times beside the command.
    code = (
        "import json, sys\n"
        "from shuffle_opacus.analysis.approximate.clones import clones_epsilon\n"
        "from shuffle_opacus.analysis.approximate.clones import clones_delta\n"
        "clones_epsilon(n=1000, eps0=1.0, delta=1e-6)\n"
        "clones_delta(0.5, n=1000, eps0=1.0)\n"
        f"print(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert set(json.loads(out.stdout.strip().splitlines()[-1])) <= {"scipy", "scipy.special"}
