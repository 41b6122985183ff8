"""``import shuffle_opacus`` registers the accountants whatever the import order, idempotently.

Each scenario needs an interpreter in which neither Opacus nor shuffle_opacus has been imported.
Most of a fresh interpreter's time (about 8 s of CPU) goes to torch and the libraries Opacus
imports (torch.distributed.tensor, scipy.stats), whose import order is not what these tests are
about. So one fresh interpreter (:class:`tests.forked.Forked`) imports those libraries once
(``PRELOAD``), checks that neither Opacus nor shuffle_opacus came with them, and forks a child per
scenario; each child runs its scenario's code as a fresh ``__main__`` and imports Opacus and
shuffle_opacus in the scenario's order. The scenario "no torch" is about torch itself, so it runs
in an interpreter of its own. The fixture ``finished`` starts both at once; each test then waits
for and checks its own.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from tests.forked import Forked

CHECK = textwrap.dedent(
    """
    from opacus import PrivacyEngine
    from opacus.accountants import create_accountant
    for name in ("shuffle", "subsampled_shuffle", "shuffled_checkin"):
        acc = create_accountant(name)
        assert acc.mechanism() == name, name
        assert type(acc).__module__ == "shuffle_opacus.engine.accountants", type(acc)
    assert type(PrivacyEngine(accountant="shuffled_checkin").accountant).__name__ == (
        "ShuffledCheckInAccountant"
    )
    """
)

ORDERS = {
    "package first": "import shuffle_opacus\nimport opacus\n",
    "opacus first": "import opacus\nimport shuffle_opacus\n",
    "accountants submodule first": "import opacus.accountants\nimport shuffle_opacus\n",
    # The lazy class imports shuffle_opacus.engine.accountants, whose own import of Opacus reaches
    # the registration hook while the module is half-initialised.
    "accountant class first": (
        "import shuffle_opacus\nshuffle_opacus.SubsampledShuffleAccountant()\nimport opacus\n"
    ),
    "twice and reloaded": (
        "import importlib\nimport shuffle_opacus\nimport shuffle_opacus\n"
        "importlib.reload(shuffle_opacus)\nimport opacus\n"
        "import shuffle_opacus.engine.accountants as a\nimportlib.reload(a)\n"
    ),
}


#: The package and its calibration load without torch; make_private is the part that needs it.
#: Its first use must import torch, which a finder refuses here: loading torch for real would cost
#: this interpreter 5-7 s of CPU (it ran in 0.4 s with the refusal), and the scenario "accountant
#: class first" resolves a name of the torch side on first use for real, through the same lazy
#: loader.
NO_TORCH = textwrap.dedent(
    """
    import sys, shuffle_opacus
    assert 'torch' not in sys.modules and 'opacus' not in sys.modules
    assert callable(shuffle_opacus.calibrate_noise_multiplier)
    assert 'torch' not in sys.modules

    class RefuseTorch:
        def find_spec(self, name, path=None, target=None):
            if name.split('.')[0] == 'torch':
                raise ImportError(f'refused: {name}')

    sys.meta_path.insert(0, RefuseTorch())
    try:
        shuffle_opacus.make_private
    except ImportError as exc:
        assert str(exc) == 'refused: torch', exc
    else:
        raise AssertionError('make_private loaded without importing torch')
    """
)

FOREIGN = textwrap.dedent(
    """
        import warnings
        from opacus.accountants import RDPAccountant, register_accountant, create_accountant
        register_accountant("shuffle", RDPAccountant)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            import shuffle_opacus.engine.accountants
        assert type(create_accountant("shuffle")) is RDPAccountant
        assert any("did not replace" in str(w.message) for w in caught), caught
        assert create_accountant("shuffled_checkin").mechanism() == "shuffled_checkin"
        """
)

SCRIPTS = {
    **{order: code + CHECK for order, code in ORDERS.items()},
    "no torch": NO_TORCH,
    "foreign": FOREIGN,
}


#: A scenario that fails on purpose, run with the others.
CANARY = "canary"

#: Imports what Opacus imports from outside itself (the bulk of its import time: torch and the
#: parts of torch.distributed and scipy that Opacus's modules import), once, before the scenarios
#: are forked; fails if that imported Opacus or shuffle_opacus (the scenarios would then not
#: choose the import order).
PRELOAD = textwrap.dedent(
    """
    import sys
    import scipy.fft, scipy.integrate, scipy.optimize, scipy.signal, scipy.special, scipy.stats
    import torch, torch.distributed.tensor, torch.distributed.fsdp
    import torch.distributed._composable.fsdp, torch.distributed._tensor.experimental
    early = sorted(m for m in sys.modules if m.split(".")[0] in ("opacus", "shuffle_opacus"))
    if early:
        sys.exit(f"preloading imported {early}")
    """
)


@pytest.fixture(scope="module")
def finished():
    """Start every scenario at once; return a function that waits for one and gives its
    stderr when it failed (``None`` when it exited 0)."""
    forked = {name: code for name, code in SCRIPTS.items() if name != "no torch"}
    forked[CANARY] = "import sys\nsys.exit(4)\n"
    driver = Forked(PRELOAD, forked)
    alone = subprocess.Popen(
        [sys.executable, "-c", SCRIPTS["no torch"]],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )

    def failure(name: str) -> str | None:
        if name == "no torch":
            _, err = alone.communicate(timeout=300)
            return None if alone.returncode == 0 else err
        outcome = driver.outcome(name)
        return None if outcome.status == 0 else f"exit status {outcome.status}: {outcome.stderr}"

    yield failure
    driver.close()  # scenarios whose test was deselected
    alone.kill()
    alone.communicate()


def test_a_failing_scenario_is_reported(finished):
    """The driver's verdicts can fail: a scenario that raises comes back with its traceback."""
    failure = finished(CANARY)
    assert failure is not None and "SystemExit: 4" in failure, failure


@pytest.mark.parametrize("order", sorted(ORDERS))
def test_registration(finished, order):
    assert finished(order) is None


def test_package_import_does_not_import_torch(finished):
    assert finished("no torch") is None


def test_a_foreign_accountant_under_our_name_is_left_alone(finished):
    assert finished("foreign") is None


def test_lazy_names_are_exactly_the_public_names():
    # Every public name of the package and of its maths layer loads on first use; a name added to
    # one list and not the other would be either unreachable or undocumented.
    import shuffle_opacus
    import shuffle_opacus.analysis
    import shuffle_opacus.analysis.pld

    assert sorted(shuffle_opacus.__all__) == sorted(["__version__", *shuffle_opacus._LAZY])
    for module in (shuffle_opacus.analysis, shuffle_opacus.analysis.pld):
        assert sorted(module.__all__) == sorted(module._LAZY)
    for module in (shuffle_opacus, shuffle_opacus.analysis, shuffle_opacus.analysis.pld):
        for name in module._LAZY:
            assert getattr(module, name) is not None, name
