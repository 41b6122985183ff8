"""The ``shuffle-opacus`` command: :func:`main` parses, asks the maths layer and prints records."""

from __future__ import annotations

from .command import main

__all__ = ["main"]
