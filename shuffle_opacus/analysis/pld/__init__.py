"""Privacy loss distributions (``dp_accounting`` PLD objects) of shuffled mechanisms.

* :mod:`.ldp`: shuffled eps0-LDP reports through the Feldman-McMillan-Talwar dominating pair,
  plain and subsampled (Koskela, Heikkilä & Honkela, arXiv:2106.00477, §3);
* :mod:`.krr`: shuffled k-randomised response against the strong and weak adversaries (same
  paper, §4);
* :mod:`.gaussian`: the shuffle Gaussian itself (plain, subsampled, check-in), the ``pld`` method;
* :mod:`.common`: defaults, checks, pessimistic binning and heterogeneous composition.
"""

from .common import (
    DEFAULT_DISCRETIZATION,
    DEFAULT_TAIL,
    compose_plds,
    default_tail,
    pmf_from_losses,
)
from .gaussian import (
    shuffle_gaussian_delta,
    shuffle_gaussian_epsilon,
    shuffle_gaussian_pair,
    shuffle_gaussian_pld,
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

__all__ = [
    "DEFAULT_DISCRETIZATION",
    "DEFAULT_TAIL",
    "KRR_ADVERSARIES",
    "MAX_EPS0",
    "FeldmanPair",
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
    "subsampled_ldp_shuffle_pld",
    "subsampled_profile",
]
