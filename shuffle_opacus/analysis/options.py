"""Names of the choices some mechanisms offer, importable without scipy or ``dp_accounting``.

The command line builds its help and checks its arguments from these before any heavy import.
"""

from __future__ import annotations

__all__ = ["CLONES_METHODS", "KRR_ADVERSARIES"]

CLONES_METHODS: tuple[str, ...] = ("numerical", "closed-form")
"""Methods of the clones bounds (Feldman, McMillan & Talwar): the numerical bound of their
Theorem 3.2 (default) and the closed form of Theorem 3.1."""

KRR_ADVERSARIES: tuple[str, ...] = ("strong", "weak")
"""Adversaries of shuffled k-randomised response (Koskela, Heikkilä & Honkela): ``strong`` knows
who randomised, ``weak`` does not know it for the differing user."""
