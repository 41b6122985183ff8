"""Privacy accounting for the shuffle model, in numpy and scipy (no torch import).

The way in is the table of mechanisms, :data:`MECHANISM_TABLE`, and :func:`account` (any
mechanism by name) or :func:`compute_epsilon` (a mechanism composed round by round); below them
one entry per family of bounds. The rest lives in the subpackages: :mod:`.rdp` (Rényi DP of the
shuffle Gaussian and its variants, Liew & Takahashi, arXiv:2206.09569), :mod:`.pld` (privacy
loss distributions), :mod:`.approximate` (clones, composition theorems, the analytic Gaussian).
``sigma`` is the paper's sigma: each user's noise std over the L2 distance between the
differing user's two inputs (docs/maths.md).
"""

from typing import TYPE_CHECKING

from .._lazy import lazy_exports

if TYPE_CHECKING:  # the names below, for type checkers; at run time they load on first use
    from .approximate.analytic_gaussian import gaussian_dp_epsilon
    from .approximate.clones import clones_epsilon
    from .approximate.composition import compose_best_epsilon
    from .epsilon import compute_epsilon, rounds_epsilon
    from .mechanisms import (
        MECHANISM_TABLE,
        SHUFFLE_ASSUMPTIONS,
        Mechanism,
        Method,
        RoundSetting,
        get_mechanism,
        per_step_rdp,
    )
    from .montecarlo import shuffled_gaussian_delta_mc
    from .pld.krr import krr_epsilon
    from .pld.ldp import ldp_shuffle_epsilon
    from .pld.shuffle_gaussian import shuffle_gaussian_epsilon
    from .query import account
    from .rdp.conversion import EpsilonResult, OrderCapWarning, epsilon_from_rdp, rdp_to_dp
    from .rdp.girgis import girgis_epsilon
    from .results import AccountingResult

_LAZY: dict[str, str] = {
    # the table and the two ways to query it
    "MECHANISM_TABLE": ".mechanisms",
    "SHUFFLE_ASSUMPTIONS": ".mechanisms",
    "Mechanism": ".mechanisms",
    "Method": ".mechanisms",
    "RoundSetting": ".mechanisms",
    "get_mechanism": ".mechanisms",
    "per_step_rdp": ".mechanisms",
    "account": ".query",
    "compute_epsilon": ".epsilon",
    "rounds_epsilon": ".epsilon",
    # results and the Rényi conversion
    "AccountingResult": ".results",
    "EpsilonResult": ".rdp.conversion",
    "OrderCapWarning": ".rdp.conversion",
    "epsilon_from_rdp": ".rdp.conversion",
    "rdp_to_dp": ".rdp.conversion",
    # one entry per family of bounds
    "shuffle_gaussian_epsilon": ".pld.shuffle_gaussian",
    "ldp_shuffle_epsilon": ".pld.ldp",
    "krr_epsilon": ".pld.krr",
    "clones_epsilon": ".approximate.clones",
    "compose_best_epsilon": ".approximate.composition",
    "gaussian_dp_epsilon": ".approximate.analytic_gaussian",
    "girgis_epsilon": ".rdp.girgis",
    "shuffled_gaussian_delta_mc": ".montecarlo",
}

__all__ = [
    "MECHANISM_TABLE",
    "SHUFFLE_ASSUMPTIONS",
    "AccountingResult",
    "EpsilonResult",
    "Mechanism",
    "Method",
    "OrderCapWarning",
    "RoundSetting",
    "account",
    "clones_epsilon",
    "compose_best_epsilon",
    "compute_epsilon",
    "epsilon_from_rdp",
    "gaussian_dp_epsilon",
    "get_mechanism",
    "girgis_epsilon",
    "krr_epsilon",
    "ldp_shuffle_epsilon",
    "per_step_rdp",
    "rdp_to_dp",
    "rounds_epsilon",
    "shuffle_gaussian_epsilon",
    "shuffled_gaussian_delta_mc",
]


# PEP 562: each public name is imported from its module on first use.
__getattr__, __dir__ = lazy_exports(__name__, _LAZY, globals())
