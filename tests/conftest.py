"""Shared test set-up: the hypothesis profiles.

The suite runs the ``repeatable`` profile by default: every property test draws the same
examples on every run (``derandomize=True``), so that a CI verdict depends only on the code.
``pytest --hypothesis-profile=explore`` draws fresh random examples on each run, for hunting
new counterexamples (a failure it finds is printed with the example to pin as an ``@example``).
"""

from __future__ import annotations

import os

import pytest
from hypothesis import settings

settings.register_profile("repeatable", derandomize=True)
settings.register_profile("explore", derandomize=False)
settings.load_profile("repeatable")

# One math thread per process (torch's OpenMP pool, MKL, OpenBLAS), here and in the subprocesses
# the tests start, unless the caller chose: the suite runs two xdist workers on two cores, where a
# second thread per worker spins on a busy core (test_noise, test_clients and test_clipping took
# 104 s with two threads, 36 s with one). Set before any test module imports torch or numpy.
os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.fixture(autouse=True, scope="session")
def _private_pmf_cache(tmp_path_factory):
    """The on-disk PMF cache of the whole session (subprocesses too) lies in a temporary folder:
    the suite never reads or writes the user's cache (shuffle_opacus.analysis.pld.disk_cache)."""
    import os

    before = os.environ.get("SHUFFLE_OPACUS_CACHE_DIR")
    os.environ["SHUFFLE_OPACUS_CACHE_DIR"] = str(tmp_path_factory.mktemp("pmf_cache"))
    yield
    if before is None:
        os.environ.pop("SHUFFLE_OPACUS_CACHE_DIR", None)
    else:
        os.environ["SHUFFLE_OPACUS_CACHE_DIR"] = before


@pytest.fixture(autouse=True)
def _forget_other_tests_releases():
    """Each test starts with an empty process-wide release registry (tests share data sets)."""
    from shuffle_opacus.engine.release_registry import REGISTRY

    REGISTRY.clear()
    yield
    REGISTRY.clear()
