"""Pure numpy/scipy privacy accounting for the shuffle model (no torch import).

The package is grouped by kind of guarantee:

* :mod:`.rdp`: Rényi DP of the shuffle Gaussian (Theorem 1 of Liew & Takahashi, *Shuffle
  Gaussian Mechanism for Differential Privacy*, arXiv:2206.09569), its subsampled and check-in
  variants, the central references, the Girgis et al. bound, and the RDP → (eps, delta)
  conversion;
* :mod:`.approximate`: approximate-DP baselines: the clones method, composition theorems, the
  analytic Gaussian, and their composed curves;
* :mod:`.pld`: privacy loss distributions of the shuffle Gaussian itself (the ``pld`` method),
  of shuffled eps0-LDP reports and of k-randomised response;
* :mod:`.mechanisms`: the table of Rényi-DP mechanisms and methods;
  :mod:`.catalogue`: every mechanism of the ``account`` command; :mod:`.results`: the result
  record; :mod:`.montecarlo`: a Monte Carlo check of the shuffled Gaussian.

Units: ``sigma`` is the paper's sigma, the per-user noise standard deviation divided by the L2
distance between the differing user's two possible inputs (for the central references, the
aggregate noise divided by the sensitivity of the sum). Orders are integers >= 2.
"""

from typing import TYPE_CHECKING

from .._lazy import lazy_exports

if TYPE_CHECKING:  # the names below, for type checkers; at run time they load on first use
    from .approximate.analytic_gaussian import gaussian_dp_delta, gaussian_dp_epsilon
    from .approximate.baselines import clones_results, composed_epsilon, round_profile
    from .approximate.clones import CloneBounds, clones_delta, clones_epsilon, clones_gaussian
    from .approximate.composition import (
        compose_advanced,
        compose_basic,
        compose_best_epsilon,
        compose_optimal_delta,
        compose_optimal_epsilon,
        subsample_dp,
    )
    from .catalogue import CATALOGUE, CatalogueEntry, account
    from .epsilon import compute_epsilon, rounds_epsilon
    from .mechanisms import (
        MECHANISM_TABLE,
        MECHANISMS,
        METHODS,
        REFERENCES,
        SHUFFLE_ASSUMPTIONS,
        Mechanism,
        Method,
        RoundSetting,
        get_mechanism,
        per_step_rdp,
    )
    from .montecarlo import MonteCarloEstimate, shuffled_gaussian_delta_mc
    from .pld import (
        KRR_ADVERSARIES,
        compose_plds,
        default_tail,
        krr_delta,
        krr_eps0,
        krr_epsilon,
        krr_pld,
        krr_tail_delta,
        ldp_shuffle_delta,
        ldp_shuffle_epsilon,
        ldp_shuffle_pld,
        ldp_shuffle_rdp,
        shuffle_gaussian_delta,
        shuffle_gaussian_epsilon,
        shuffle_gaussian_pld,
        stronger_pair_applies,
        subsampled_ldp_shuffle_pld,
    )
    from .rdp.central import gaussian_rdp, poisson_subsampled_gaussian_rdp
    from .rdp.checkin import CHECKIN_METHODS, checkin_rdp
    from .rdp.conversion import (
        EpsilonResult,
        OrderCapWarning,
        delta_from_rdp,
        epsilon_from_rdp,
        rdp_to_dp,
    )
    from .rdp.girgis import girgis_epsilon, girgis_rdp, girgis_subsampled_rdp
    from .rdp.shuffle_gaussian import (
        no_shuffle_rdp,
        shuffle_gaussian_log_excess,
        shuffle_gaussian_rdp,
    )
    from .rdp.subsampling import subsampled_gaussian_rdp, subsampled_shuffle_rdp
    from .results import AccountingResult

_LAZY: dict[str, str] = {
    "gaussian_dp_delta": ".approximate.analytic_gaussian",
    "gaussian_dp_epsilon": ".approximate.analytic_gaussian",
    "clones_results": ".approximate.baselines",
    "composed_epsilon": ".approximate.baselines",
    "round_profile": ".approximate.baselines",
    "CloneBounds": ".approximate.clones",
    "clones_delta": ".approximate.clones",
    "clones_epsilon": ".approximate.clones",
    "clones_gaussian": ".approximate.clones",
    "compose_advanced": ".approximate.composition",
    "compose_basic": ".approximate.composition",
    "compose_best_epsilon": ".approximate.composition",
    "compose_optimal_delta": ".approximate.composition",
    "compose_optimal_epsilon": ".approximate.composition",
    "subsample_dp": ".approximate.composition",
    "CATALOGUE": ".catalogue",
    "CatalogueEntry": ".catalogue",
    "account": ".catalogue",
    "MECHANISM_TABLE": ".mechanisms",
    "MECHANISMS": ".mechanisms",
    "METHODS": ".mechanisms",
    "REFERENCES": ".mechanisms",
    "Mechanism": ".mechanisms",
    "Method": ".mechanisms",
    "RoundSetting": ".mechanisms",
    "compute_epsilon": ".epsilon",
    "SHUFFLE_ASSUMPTIONS": ".mechanisms",
    "get_mechanism": ".mechanisms",
    "per_step_rdp": ".mechanisms",
    "rounds_epsilon": ".epsilon",
    "MonteCarloEstimate": ".montecarlo",
    "shuffled_gaussian_delta_mc": ".montecarlo",
    "KRR_ADVERSARIES": ".pld",
    "compose_plds": ".pld",
    "default_tail": ".pld",
    "krr_delta": ".pld",
    "krr_eps0": ".pld",
    "krr_epsilon": ".pld",
    "krr_pld": ".pld",
    "krr_tail_delta": ".pld",
    "ldp_shuffle_delta": ".pld",
    "ldp_shuffle_epsilon": ".pld",
    "ldp_shuffle_pld": ".pld",
    "ldp_shuffle_rdp": ".pld",
    "shuffle_gaussian_delta": ".pld",
    "shuffle_gaussian_epsilon": ".pld",
    "shuffle_gaussian_pld": ".pld",
    "stronger_pair_applies": ".pld",
    "subsampled_ldp_shuffle_pld": ".pld",
    "gaussian_rdp": ".rdp.central",
    "poisson_subsampled_gaussian_rdp": ".rdp.central",
    "CHECKIN_METHODS": ".rdp.checkin",
    "checkin_rdp": ".rdp.checkin",
    "EpsilonResult": ".rdp.conversion",
    "OrderCapWarning": ".rdp.conversion",
    "delta_from_rdp": ".rdp.conversion",
    "epsilon_from_rdp": ".rdp.conversion",
    "rdp_to_dp": ".rdp.conversion",
    "girgis_epsilon": ".rdp.girgis",
    "girgis_rdp": ".rdp.girgis",
    "girgis_subsampled_rdp": ".rdp.girgis",
    "no_shuffle_rdp": ".rdp.shuffle_gaussian",
    "shuffle_gaussian_log_excess": ".rdp.shuffle_gaussian",
    "shuffle_gaussian_rdp": ".rdp.shuffle_gaussian",
    "subsampled_gaussian_rdp": ".rdp.subsampling",
    "subsampled_shuffle_rdp": ".rdp.subsampling",
    "AccountingResult": ".results",
}

__all__ = [
    "CATALOGUE",
    "CHECKIN_METHODS",
    "KRR_ADVERSARIES",
    "MECHANISMS",
    "MECHANISM_TABLE",
    "METHODS",
    "REFERENCES",
    "AccountingResult",
    "CatalogueEntry",
    "CloneBounds",
    "EpsilonResult",
    "Mechanism",
    "Method",
    "MonteCarloEstimate",
    "OrderCapWarning",
    "RoundSetting",
    "account",
    "checkin_rdp",
    "clones_delta",
    "clones_epsilon",
    "clones_gaussian",
    "clones_results",
    "compose_advanced",
    "compose_basic",
    "compose_best_epsilon",
    "compose_optimal_delta",
    "compose_optimal_epsilon",
    "compose_plds",
    "composed_epsilon",
    "compute_epsilon",
    "SHUFFLE_ASSUMPTIONS",
    "default_tail",
    "delta_from_rdp",
    "epsilon_from_rdp",
    "gaussian_dp_delta",
    "gaussian_dp_epsilon",
    "gaussian_rdp",
    "get_mechanism",
    "girgis_epsilon",
    "girgis_rdp",
    "girgis_subsampled_rdp",
    "krr_delta",
    "krr_eps0",
    "krr_epsilon",
    "krr_pld",
    "krr_tail_delta",
    "ldp_shuffle_delta",
    "ldp_shuffle_epsilon",
    "ldp_shuffle_pld",
    "ldp_shuffle_rdp",
    "no_shuffle_rdp",
    "per_step_rdp",
    "poisson_subsampled_gaussian_rdp",
    "rdp_to_dp",
    "round_profile",
    "rounds_epsilon",
    "shuffle_gaussian_log_excess",
    "shuffle_gaussian_rdp",
    "shuffle_gaussian_delta",
    "shuffle_gaussian_epsilon",
    "shuffle_gaussian_pld",
    "shuffled_gaussian_delta_mc",
    "stronger_pair_applies",
    "subsample_dp",
    "subsampled_gaussian_rdp",
    "subsampled_ldp_shuffle_pld",
    "subsampled_shuffle_rdp",
]


# PEP 562: each public name is imported from its module on first use.
__getattr__, __dir__ = lazy_exports(__name__, _LAZY, globals())
