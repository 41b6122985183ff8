"""The ``shuffle-opacus`` command answers before its heavy imports.

A bad argument must be refused without loading scipy, ``dp_accounting`` or torch, and the simple
accountings and the clones bound must not load more than ``scipy.special``: each scenario runs
in a fresh interpreter and reports which of those modules it loaded. The interpreters are forked
children of one (:mod:`tests.forked`) that imported the command first and checked that this
loaded none of those modules, so each scenario sees what a fresh ``shuffle-opacus`` process does.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator

import pytest

from tests.forked import Forked

HEAVY = ("scipy", "scipy.special", "scipy.stats", "scipy.optimize", "scipy.signal",
         "dp_accounting", "torch", "opacus", "tqdm")  # fmt: skip

#: What every fresh interpreter does first: import the command, which must load nothing heavy.
PREAMBLE = f"""
import sys
from shuffle_opacus.cli.command import main
early = [m for m in {HEAVY!r} if m in sys.modules]
assert not early, f"importing the command loaded {{early}}"
"""

SCRIPT = """
import contextlib, io, json, sys
from shuffle_opacus.cli.command import main
with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
    status = main({argv!r})
print(json.dumps([status, [m for m in {heavy!r} if m in sys.modules]]))
"""

#: The library call the clones benchmark times beside the command.
CLONES_FUNCTIONS = (
    "import json, sys\n"
    "from shuffle_opacus.analysis.approximate.clones import clones_epsilon\n"
    "from shuffle_opacus.analysis.approximate.clones import clones_delta\n"
    "clones_epsilon(n=1000, eps0=1.0, delta=1e-6)\n"
    "clones_delta(0.5, n=1000, eps0=1.0)\n"
    f"print(json.dumps([0, [m for m in {HEAVY!r} if m in sys.modules]]))"
)

BAD_ARGUMENTS = [
    ["account", "shuffle", "--n", "-3", "--sigma", "1"],
    ["account", "checkin", "--n", "100", "--rate", "2", "--sigma", "1"],
    ["account", "nosuch"],
    ["calibrate", "checkin", "--n", "100", "--rounds", "10", "--epsilon", "1"],
]
SIMPLE = [
    ["account", "gaussian", "--sigma", "1", "--steps", "10"],
    # A Rényi bound by name (the default, pld, needs dp_accounting).
    ["account", "shuffle", "--n", "1000", "--sigma", "1", "--steps", "10", "--method",
     "theorem1"],
]  # fmt: skip
CLONES = [
    ["account", "clones", "--n", "1000", "--eps0", "1"],
    ["account", "clones", "--n", "1000", "--eps0", "1", "--steps", "10"],
    ["account", "clones", "--n", "1000", "--eps0", "1", "--method", "closed-form"],
]
GAUSSIAN_CLONES = ["account", "clones-gaussian", "--n", "1000", "--sigma", "3"]
SCENARIOS = {
    **{json.dumps(argv): SCRIPT.format(argv=argv, heavy=HEAVY) for argv in
       [*BAD_ARGUMENTS, *SIMPLE, *CLONES, GAUSSIAN_CLONES]},
    "clones functions": CLONES_FUNCTIONS,
    # A bad argument after loading scipy on purpose: the report must show it.
    "canary": "import scipy\n" + SCRIPT.format(argv=["account", "nosuch"], heavy=HEAVY),
}  # fmt: skip


@pytest.fixture(scope="module")
def scenarios() -> Iterator[Forked]:
    """Every scenario, started at once in forked fresh interpreters."""
    forked = Forked(PREAMBLE, SCENARIOS)
    yield forked
    forked.close()


@pytest.fixture
def loaded(scenarios: Forked) -> Callable[[list[str] | str], tuple[int, list[str]]]:
    """``argv`` -> (the command's status, the heavy modules its fresh interpreter loaded)."""

    def scenario(argv: list[str] | str) -> tuple[int, list[str]]:
        outcome = scenarios.outcome(argv if isinstance(argv, str) else json.dumps(argv))
        assert outcome.status == 0, outcome.stderr
        status, modules = json.loads(outcome.stdout.strip().splitlines()[-1])
        return status, modules

    return scenario


@pytest.mark.parametrize("argv", BAD_ARGUMENTS)
def test_a_bad_argument_loads_nothing_heavy(loaded, argv):
    status, modules = loaded(argv)
    assert status == 2
    assert modules == []


@pytest.mark.parametrize("argv", SIMPLE)
def test_simple_accountings_need_only_scipy_special(loaded, argv):
    status, modules = loaded(argv)
    assert status == 0
    assert set(modules) <= {"scipy", "scipy.special"}


def test_the_central_gaussian_loads_no_scipy_at_all(loaded):
    """``account gaussian`` needs no series of Theorem 1: scipy.special (0.15 s) stays out, so
    the command starts within 2x ``import numpy`` (benchmarks/startup.py: 1.67x)."""
    status, modules = loaded(["account", "gaussian", "--sigma", "1", "--steps", "10"])
    assert status == 0
    assert modules == []


@pytest.mark.parametrize("argv", CLONES)
def test_the_clones_bound_needs_only_scipy_special(loaded, argv):
    """The clones bound of eps0-LDP reports (benchmarks/clones.py times it against Apple's code,
    both as whole processes) takes its binomials from scipy.special and minimises by hand: no
    scipy.stats nor scipy.optimize (0.4 s of imports between them)."""
    status, modules = loaded(argv)
    assert status == 0
    assert set(modules) <= {"scipy", "scipy.special"}


def test_the_gaussian_clones_bound_loads_no_scipy_stats(loaded):
    # Gaussian reports need the analytic Gaussian's root finder (scipy.optimize), not more.
    status, modules = loaded(GAUSSIAN_CLONES)
    assert status == 0
    assert "scipy.stats" not in modules


def test_the_clones_functions_need_only_scipy_special(loaded):
    # The library call the benchmark times beside the command (CLONES_FUNCTIONS).
    _, modules = loaded("clones functions")
    assert set(modules) <= {"scipy", "scipy.special"}


def test_a_scenario_that_loads_a_heavy_module_is_seen(loaded):
    """The verdicts can fail: a fresh interpreter that imports scipy reports it."""
    status, modules = loaded("canary")
    assert status == 2
    assert modules == ["scipy"]
