"""Shared test set-up: the hypothesis profiles.

The suite runs the ``repeatable`` profile by default: every property test draws the same
examples on every run (``derandomize=True``), so that a CI verdict depends only on the code.
``pytest --hypothesis-profile=explore`` draws fresh random examples on each run, for hunting
new counterexamples (a failure it finds is printed with the example to pin as an ``@example``).
"""

from __future__ import annotations

from hypothesis import settings

settings.register_profile("repeatable", derandomize=True)
settings.register_profile("explore", derandomize=False)
settings.load_profile("repeatable")
