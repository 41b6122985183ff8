"""``import shuffle_opacus`` registers the accountants whatever the import order, idempotently.

Each scenario needs a fresh interpreter. The fixture ``finished`` starts all of them together
(most of their time is importing torch and opacus, which overlaps on two cores); each test then
waits for and checks its own.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

CHECK = textwrap.dedent(
    """
    from opacus import PrivacyEngine
    from opacus.accountants import create_accountant
    for name in ("shuffle", "subsampled_shuffle", "shuffled_checkin"):
        acc = create_accountant(name)
        assert acc.mechanism() == name, name
        assert type(acc).__module__ == "shuffle_opacus.accountants", type(acc)
    assert type(PrivacyEngine(accountant="shuffled_checkin").accountant).__name__ == (
        "ShuffledCheckInAccountant"
    )
    """
)

ORDERS = {
    "package first": "import shuffle_opacus\nimport opacus\n",
    "opacus first": "import opacus\nimport shuffle_opacus\n",
    "accountants submodule first": "import opacus.accountants\nimport shuffle_opacus\n",
    # The lazy class imports shuffle_opacus.accountants, whose own import of Opacus reaches
    # the registration hook while the module is half-initialised.
    "accountant class first": (
        "import shuffle_opacus\nshuffle_opacus.SubsampledShuffleAccountant()\nimport opacus\n"
    ),
    "twice and reloaded": (
        "import importlib\nimport shuffle_opacus\nimport shuffle_opacus\n"
        "importlib.reload(shuffle_opacus)\nimport opacus\n"
        "import shuffle_opacus.accountants as a\nimportlib.reload(a)\n"
    ),
}


NO_TORCH = (
    "import sys, shuffle_opacus\n"
    "assert 'torch' not in sys.modules and 'opacus' not in sys.modules\n"
    "assert callable(shuffle_opacus.calibrate_noise_multiplier)\n"
    "assert 'torch' not in sys.modules\n"
    "shuffle_opacus.make_private\n"
    "assert 'torch' in sys.modules\n"
)

FOREIGN = textwrap.dedent(
    """
        import warnings
        from opacus.accountants import RDPAccountant, register_accountant, create_accountant
        register_accountant("shuffle", RDPAccountant)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            import shuffle_opacus.accountants
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


@pytest.fixture(scope="module")
def finished():
    """Start every scenario at once; return a function that waits for one and gives its
    stderr when it failed (``None`` when it exited 0)."""
    procs = {
        name: subprocess.Popen(
            [sys.executable, "-c", code],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name, code in SCRIPTS.items()
    }

    def failure(name: str) -> str | None:
        _, err = procs[name].communicate(timeout=300)
        return None if procs[name].returncode == 0 else err

    yield failure
    for proc in procs.values():  # scenarios whose test was deselected
        proc.kill()
        proc.communicate()


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
