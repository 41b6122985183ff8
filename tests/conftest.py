"""Shared test set-up: the hypothesis profiles.

The suite runs the ``repeatable`` profile by default: every property test draws the same
examples on every run (``derandomize=True``), so that a CI verdict depends only on the code.
``pytest --hypothesis-profile=explore`` draws fresh random examples on each run, for hunting
new counterexamples (a failure it finds is printed with the example to pin as an ``@example``).
"""

from __future__ import annotations

import pytest
from hypothesis import settings

settings.register_profile("repeatable", derandomize=True)
settings.register_profile("explore", derandomize=False)
settings.load_profile("repeatable")


@pytest.fixture(autouse=True)
def _forget_other_tests_releases():
    """Each test starts with an empty process-wide release registry (tests share data sets)."""
    from shuffle_opacus.release_registry import REGISTRY

    REGISTRY.clear()
    yield
    REGISTRY.clear()
