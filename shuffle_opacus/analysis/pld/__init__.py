"""Privacy loss distributions (``dp_accounting`` PLD objects) of shuffled mechanisms.

* :mod:`.ldp`: shuffled eps0-LDP reports through a Feldman-McMillan-Talwar dominating pair,
  plain and subsampled (Koskela, Heikkilä & Honkela, arXiv:2106.00477, §3); :mod:`.ldp_pairs`
  enumerates the two pairs (the clones pair by default; the stronger pair only for the
  randomisers its errata allow);
* :mod:`.krr`: shuffled k-randomised response against the strong and weak adversaries (same
  paper, §4);
* :mod:`.shuffle_gaussian`: the shuffle Gaussian itself (plain, subsampled, check-in), the
  ``pld`` method;
* :mod:`.common`: defaults, checks, pessimistic binning and heterogeneous composition.
"""

from typing import TYPE_CHECKING

from ...common.lazy import lazy_exports

if TYPE_CHECKING:  # the names below, for type checkers; at run time they load on first use
    from .common import (
        DEFAULT_DISCRETIZATION,
        DEFAULT_TAIL,
        compose_plds,
        default_tail,
        pmf_from_losses,
    )
    from .krr import KRR_ADVERSARIES, krr_delta, krr_eps0, krr_epsilon, krr_pld, krr_tail_delta
    from .ldp import (
        MAX_EPS0,
        FeldmanPair,
        feldman_pair,
        ldp_shuffle_delta,
        ldp_shuffle_epsilon,
        ldp_shuffle_pld,
        ldp_shuffle_rdp,
        subsampled_ldp_shuffle_pld,
        subsampled_profile,
    )
    from .ldp_pairs import LDP_PAIRS, clone_probability, stronger_pair_applies
    from .shuffle_gaussian import (
        shuffle_gaussian_delta,
        shuffle_gaussian_epsilon,
        shuffle_gaussian_pair,
        shuffle_gaussian_pld,
    )

_LAZY: dict[str, str] = {
    "DEFAULT_DISCRETIZATION": ".common",
    "DEFAULT_TAIL": ".common",
    "compose_plds": ".common",
    "default_tail": ".common",
    "pmf_from_losses": ".common",
    "shuffle_gaussian_delta": ".shuffle_gaussian",
    "shuffle_gaussian_epsilon": ".shuffle_gaussian",
    "shuffle_gaussian_pair": ".shuffle_gaussian",
    "shuffle_gaussian_pld": ".shuffle_gaussian",
    "KRR_ADVERSARIES": ".krr",
    "krr_delta": ".krr",
    "krr_eps0": ".krr",
    "krr_epsilon": ".krr",
    "krr_pld": ".krr",
    "krr_tail_delta": ".krr",
    "MAX_EPS0": ".ldp",
    "FeldmanPair": ".ldp",
    "feldman_pair": ".ldp",
    "ldp_shuffle_delta": ".ldp",
    "ldp_shuffle_epsilon": ".ldp",
    "ldp_shuffle_pld": ".ldp",
    "ldp_shuffle_rdp": ".ldp",
    "subsampled_ldp_shuffle_pld": ".ldp",
    "subsampled_profile": ".ldp",
    "LDP_PAIRS": ".ldp_pairs",
    "clone_probability": ".ldp_pairs",
    "stronger_pair_applies": ".ldp_pairs",
}

__all__ = [
    "DEFAULT_DISCRETIZATION",
    "DEFAULT_TAIL",
    "KRR_ADVERSARIES",
    "LDP_PAIRS",
    "MAX_EPS0",
    "FeldmanPair",
    "clone_probability",
    "compose_plds",
    "default_tail",
    "feldman_pair",
    "krr_delta",
    "krr_eps0",
    "krr_epsilon",
    "krr_pld",
    "krr_tail_delta",
    "ldp_shuffle_delta",
    "ldp_shuffle_epsilon",
    "ldp_shuffle_pld",
    "ldp_shuffle_rdp",
    "pmf_from_losses",
    "shuffle_gaussian_delta",
    "shuffle_gaussian_epsilon",
    "shuffle_gaussian_pair",
    "shuffle_gaussian_pld",
    "stronger_pair_applies",
    "subsampled_ldp_shuffle_pld",
    "subsampled_profile",
]


# PEP 562: each public name is imported from its module on first use.
__getattr__, __dir__ = lazy_exports(__name__, _LAZY, globals())
