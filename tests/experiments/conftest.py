"""Shared fixtures of the experiment's tests (see :mod:`tests.experiments.support`)."""

from __future__ import annotations

import pytest

from .support import write_small_mnist


@pytest.fixture(scope="session")
def small_mnist(tmp_path_factory) -> list[str]:
    """Config overrides that read the first 2,000 + 500 MNIST images from small IDX files."""
    return write_small_mnist(tmp_path_factory.mktemp("small_mnist"))
