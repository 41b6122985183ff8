"""Privacy accounting for the shuffle model, in numpy and scipy (no torch import).

The front door is the table of mechanisms, :data:`MECHANISM_TABLE`, and one function,
:func:`account`: any mechanism of the table by name, its parameters, a round count (or several)
and delta in; one :class:`AccountingResult` per count out, which names the mechanism, its
parameters, the method, epsilon with its delta and the neighbouring relation. Behind it, one
subpackage per family of bounds, reached by its module path (no warning): :mod:`.rdp` (Rényi
DP of the shuffle Gaussian and its variants, Liew & Takahashi, arXiv:2206.09569), :mod:`.pld`
(privacy loss distributions), :mod:`.approximate` (clones, composition theorems, the analytic
Gaussian), and the specialist tools :mod:`.epsilon` (heterogeneous rounds), :mod:`.montecarlo`
and :mod:`.rdp.conversion`. The per-family names this package used to export still work for
one release, with a :class:`DeprecationWarning` naming their new place. ``sigma`` is the
paper's sigma: each user's noise std over the L2 distance between the differing user's two
inputs (docs/maths.md).
"""

from typing import TYPE_CHECKING

from ..common.lazy import lazy_exports

if TYPE_CHECKING:  # the names below, for type checkers; at run time they load on first use
    from .mechanisms import (
        MECHANISM_TABLE,
        SHUFFLE_ASSUMPTIONS,
        Mechanism,
        Method,
        RoundSetting,
        get_mechanism,
    )
    from .query import account
    from .rdp.conversion import OrderCapWarning
    from .results import AccountingResult

if TYPE_CHECKING:  # deprecated here for one release (a warning at run time): see _DEPRECATED
    from .approximate.analytic_gaussian import gaussian_dp_epsilon  # noqa: F401
    from .approximate.clones import clones_epsilon  # noqa: F401
    from .approximate.composition import compose_best_epsilon  # noqa: F401
    from .epsilon import compute_epsilon, rounds_epsilon  # noqa: F401
    from .mechanisms import per_step_rdp  # noqa: F401
    from .montecarlo import shuffled_gaussian_delta_mc  # noqa: F401
    from .pld.krr import krr_epsilon  # noqa: F401
    from .pld.ldp import ldp_shuffle_epsilon  # noqa: F401
    from .pld.shuffle_gaussian import shuffle_gaussian_epsilon  # noqa: F401
    from .rdp.conversion import EpsilonResult, epsilon_from_rdp, rdp_to_dp  # noqa: F401
    from .rdp.girgis import girgis_epsilon  # noqa: F401

_LAZY: dict[str, str] = {
    # the table
    "MECHANISM_TABLE": ".mechanisms",
    "SHUFFLE_ASSUMPTIONS": ".mechanisms",
    "Mechanism": ".mechanisms",
    "Method": ".mechanisms",
    "RoundSetting": ".mechanisms",
    "get_mechanism": ".mechanisms",
    # the one way to ask for an epsilon, and what it answers
    "account": ".query",
    "AccountingResult": ".results",
    "OrderCapWarning": ".rdp.conversion",
}


def _moved(module: str, mechanism: str | None = None) -> tuple[str, str]:
    """Return ``(module, replacement)`` for an old name now imported from ``module``.

    ``mechanism``: the argument of :func:`account` that replaces the name, when there is one.
    """
    path = f"{__name__}{module}"
    if mechanism is None:
        return module, f"import it from {path} instead."
    call = f"{__name__}.account({mechanism}, steps=..., delta=..., **parameters)"
    return module, f"use {call}, or import it from {path}."


_DEPRECATED: dict[str, tuple[str, str]] = {
    # the ways into the table that the front door replaces
    "compute_epsilon": _moved(".epsilon", "mechanism"),
    "rounds_epsilon": _moved(".epsilon"),
    "per_step_rdp": _moved(".mechanisms"),
    # the Rényi conversion and its record
    "EpsilonResult": _moved(".rdp.conversion"),
    "epsilon_from_rdp": _moved(".rdp.conversion"),
    "rdp_to_dp": _moved(".rdp.conversion"),
    # one entry per family of bounds
    "shuffle_gaussian_epsilon": _moved(".pld.shuffle_gaussian", "'shuffle', method='pld'"),
    "ldp_shuffle_epsilon": _moved(".pld.ldp", "'ldp-shuffle'"),
    "krr_epsilon": _moved(".pld.krr", "'krr'"),
    "clones_epsilon": _moved(".approximate.clones", "'clones'"),
    "compose_best_epsilon": _moved(".approximate.composition"),
    "gaussian_dp_epsilon": _moved(".approximate.analytic_gaussian"),
    "girgis_epsilon": _moved(".rdp.girgis"),
    "shuffled_gaussian_delta_mc": _moved(".montecarlo"),
}

__all__ = [
    "MECHANISM_TABLE",
    "SHUFFLE_ASSUMPTIONS",
    "AccountingResult",
    "Mechanism",
    "Method",
    "OrderCapWarning",
    "RoundSetting",
    "account",
    "get_mechanism",
]


# PEP 562: each public name is imported from its module on first use; an old name warns.
__getattr__, __dir__ = lazy_exports(__name__, _LAZY, globals(), _DEPRECATED)
