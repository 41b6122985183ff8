"""``import shuffle_opacus`` registers the accountants whatever the import order, idempotently."""

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
    "twice and reloaded": (
        "import importlib\nimport shuffle_opacus\nimport shuffle_opacus\n"
        "importlib.reload(shuffle_opacus)\nimport opacus\n"
        "import shuffle_opacus.accountants as a\nimportlib.reload(a)\n"
    ),
}


@pytest.mark.parametrize("order", sorted(ORDERS))
def test_registration(order):
    code = ORDERS[order] + CHECK
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_package_import_does_not_import_torch():
    code = (
        "import sys, shuffle_opacus\n"
        "assert 'torch' not in sys.modules and 'opacus' not in sys.modules\n"
        "assert callable(shuffle_opacus.calibrate_noise_multiplier)\n"
        "assert 'torch' not in sys.modules\n"
        "shuffle_opacus.make_private\n"
        "assert 'torch' in sys.modules\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_a_foreign_accountant_under_our_name_is_left_alone():
    code = textwrap.dedent(
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
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
