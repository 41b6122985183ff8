"""Pure numpy/scipy privacy accounting for the shuffle model (no torch import).

Units: ``sigma`` is the paper's sigma, the per-user noise standard deviation divided by the L2
distance between the differing user's two possible inputs (for the central references, the
aggregate noise divided by the sensitivity of the sum). Orders are integers >= 2.
"""

from .accounting import MECHANISMS, METHODS, AccountingResult, compute_epsilon, per_step_rdp
from .central import gaussian_rdp, poisson_subsampled_gaussian_rdp
from .checkin import CHECKIN_METHODS, checkin_rdp
from .clones import CloneBounds, clones_delta, clones_epsilon
from .composition import (
    compose_advanced,
    compose_basic,
    compose_best_epsilon,
    compose_optimal_delta,
    compose_optimal_epsilon,
    subsample_dp,
)
from .conversion import (
    EpsilonResult,
    OrderCapWarning,
    delta_from_rdp,
    epsilon_from_rdp,
    rdp_to_dp,
)
from .girgis import girgis_epsilon, girgis_rdp, girgis_subsampled_rdp
from .krr import KRR_ADVERSARIES, krr_delta, krr_eps0, krr_epsilon, krr_pld, krr_tail_delta
from .montecarlo import MonteCarloEstimate, shuffled_gaussian_delta_mc
from .pld import (
    compose_plds,
    ldp_shuffle_delta,
    ldp_shuffle_epsilon,
    ldp_shuffle_pld,
    ldp_shuffle_rdp,
    subsampled_ldp_shuffle_pld,
)
from .shuffle_gaussian import no_shuffle_rdp, shuffle_gaussian_log_excess, shuffle_gaussian_rdp
from .subsampling import subsampled_shuffle_rdp

__all__ = [
    "MECHANISMS",
    "METHODS",
    "CHECKIN_METHODS",
    "AccountingResult",
    "CloneBounds",
    "EpsilonResult",
    "MonteCarloEstimate",
    "OrderCapWarning",
    "checkin_rdp",
    "clones_delta",
    "clones_epsilon",
    "compose_advanced",
    "compose_basic",
    "compose_best_epsilon",
    "compose_optimal_delta",
    "compose_optimal_epsilon",
    "compose_plds",
    "compute_epsilon",
    "delta_from_rdp",
    "epsilon_from_rdp",
    "gaussian_rdp",
    "girgis_epsilon",
    "girgis_rdp",
    "girgis_subsampled_rdp",
    "KRR_ADVERSARIES",
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
    "shuffle_gaussian_log_excess",
    "shuffle_gaussian_rdp",
    "shuffled_gaussian_delta_mc",
    "subsample_dp",
    "subsampled_ldp_shuffle_pld",
    "subsampled_shuffle_rdp",
]
