"""Tests of the Flower layer. They need the ``flower`` extra, and say so loudly without it.

A missing ``flwr`` is a collection error here, not a silent skip, so that a contributor who
installed only the ``dev`` extra sees that the Flower layer went untested. Set
``SHUFFLE_OPACUS_SKIP_FLOWER=1`` to skip these tests on purpose.
"""

from __future__ import annotations

import importlib
import os

SKIP_ENV = "SHUFFLE_OPACUS_SKIP_FLOWER"

try:
    importlib.import_module("flwr")
except ImportError as exc:
    if os.environ.get(SKIP_ENV) != "1":
        raise ImportError(
            f"tests/flower needs flwr ({exc}): install the flower extra (pip install -e "
            f"'.[flower]', as .ci/setup does), or set {SKIP_ENV}=1 to skip the Flower tests."
        ) from None
