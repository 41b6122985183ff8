"""Names of the choices some mechanisms offer, importable without scipy or ``dp_accounting``.

The command line builds its help and checks its arguments from these before any heavy import.
"""

from __future__ import annotations

__all__ = ["CLONES_METHODS", "KRR_ADVERSARIES", "LDP_PAIRS", "LDP_SHUFFLE_METHODS"]

CLONES_METHODS: tuple[str, ...] = ("numerical", "closed-form")
"""Methods of the clones bounds (Feldman, McMillan & Talwar): the numerical bound of their
Theorem 3.2 (default) and the closed form of Theorem 3.1."""

KRR_ADVERSARIES: tuple[str, ...] = ("strong", "weak")
"""Adversaries of shuffled k-randomised response (Koskela, Heikkilä & Honkela): ``strong`` knows
who randomised, ``weak`` does not know it for the differing user."""

LDP_PAIRS: tuple[str, ...] = ("clones", "stronger")
"""Dominating pairs of shuffled eps0-LDP reports (Feldman, McMillan & Talwar), the default first:
``clones`` (*Hiding Among the Clones*, arXiv:2012.12803, Theorem 3.2; proven for every eps0-LDP
randomiser) and ``stronger`` (*Stronger Privacy Amplification by Shuffling*, arXiv:2208.04591,
Theorem 3.1; by the paper's errata only for a restricted class of randomisers)."""

LDP_SHUFFLE_METHODS: tuple[str, ...] = ("pld", "pld-stronger")
"""Methods of the ``ldp-shuffle`` mechanism, one per entry of :data:`LDP_PAIRS` (same order)."""
