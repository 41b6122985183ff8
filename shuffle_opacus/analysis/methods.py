"""The functions behind the methods of :data:`~.mechanisms.MECHANISM_TABLE`.

Each factory maps a round's setting to its per-round RDP curve, and each runner accounts a
mechanism that is not composed round by round (clones, ``ldp-shuffle``, ``krr``). They import
the maths they call inside their bodies, by name, so that the table stays light: the command line
answers ``--help`` or accounts the Gaussian without importing scipy's statistics or
``dp_accounting``. Derivations: docs/maths.md.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from .options import CLONES_METHODS, LDP_PAIRS, LDP_SHUFFLE_METHODS
from .records import RdpFactory, RdpFn

if TYPE_CHECKING:
    from .pld.rounds import PldEstimate
    from .results import AccountingResult
    from .setting import RoundSetting


def theorem1(s: RoundSetting) -> RdpFn:
    """Theorem 1 of Liew & Takahashi (arXiv:2206.09569): the shuffle Gaussian's exact RDP."""
    from .rdp.shuffle_gaussian import shuffle_gaussian_rdp

    return lambda orders: shuffle_gaussian_rdp(n=s.n, sigma=s.sigma, orders=orders)  # type: ignore[arg-type]


def corollary1(s: RoundSetting) -> RdpFn:
    """Corollary 1 of Liew & Takahashi: the Gaussian with the local sigma, no shuffling."""
    from .rdp.shuffle_gaussian import no_shuffle_rdp

    return lambda orders: no_shuffle_rdp(sigma=s.sigma, orders=orders)


def theorem2(s: RoundSetting) -> RdpFn:
    """Theorem 2 of Liew & Takahashi: the Wang et al. bound applied to Theorem 1."""
    from .rdp.subsampling import subsampled_shuffle_rdp

    return lambda orders: subsampled_shuffle_rdp(n=s.n, m=s.m, sigma=s.sigma, orders=orders)  # type: ignore[arg-type]


def checkin(method: str) -> RdpFactory:
    """Return the factory of the check-in bound ``method`` (``exact``, ``sum``, ``theorem3``)."""

    def factory(s: RoundSetting) -> RdpFn:
        from .rdp.checkin import checkin_rdp

        return lambda orders: checkin_rdp(
            n=s.n,  # type: ignore[arg-type]
            rate=s.rate,  # type: ignore[arg-type]
            sigma=s.sigma,
            orders=orders,
            method=method,
        )

    return factory


def gaussian(scale: Callable[[RoundSetting], float]) -> RdpFactory:
    """Return the factory of the Gaussian mechanism with sigma multiplied by ``scale``."""

    def factory(s: RoundSetting) -> RdpFn:
        from .rdp.central import gaussian_rdp

        return lambda orders: gaussian_rdp(sigma=s.sigma * scale(s), orders=orders)

    return factory


def poisson_gaussian(scale: Callable[[RoundSetting], float]) -> RdpFactory:
    """Return the factory of the Poisson-subsampled Gaussian with sigma times ``scale``."""

    def factory(s: RoundSetting) -> RdpFn:
        from .rdp.central import poisson_subsampled_gaussian_rdp

        return lambda orders: poisson_subsampled_gaussian_rdp(
            rate=s.rate,  # type: ignore[arg-type]
            sigma=s.sigma * scale(s),
            orders=orders,
        )

    return factory


def wang_gaussian(scale: Callable[[RoundSetting], float]) -> RdpFactory:
    """Return the factory of the Wang et al. bound of the Gaussian (``m`` of ``n`` sampled)."""

    def factory(s: RoundSetting) -> RdpFn:
        from .rdp.subsampling import subsampled_gaussian_rdp

        return lambda orders: subsampled_gaussian_rdp(
            rate=s.m / s.n,  # type: ignore[operator]
            sigma=s.sigma * scale(s),
            orders=orders,
        )

    return factory


def one(_: RoundSetting) -> float:
    """Return 1: the local sigma as it is."""
    return 1.0


def shuffle_pld(
    rounds: Sequence[tuple[RoundSetting, int]], delta: float, lower: bool
) -> PldEstimate:
    """Compose the privacy loss distributions of the symmetrised Theorem 1 pair (``pld``)."""
    from .pld.rounds import ShuffleRound, shuffle_rounds_epsilon

    parts = [(ShuffleRound(n=s.n, sigma=s.sigma, rate=s.rate, m=s.m), k) for s, k in rounds]  # type: ignore[arg-type]
    return shuffle_rounds_epsilon(parts, delta=delta, lower=lower)


def proven_pld(
    rounds: Sequence[tuple[RoundSetting, int]], delta: float, lower: bool
) -> PldEstimate:
    """Compose the clones or blanket pairs of the reports themselves (``proven``).

    No optimistic estimate (``lower`` is ignored): the bound is a chain of inequalities, not a
    discretisation of one pair.
    """
    from .pld.proven import proven_rounds_epsilon
    from .pld.rounds import PldEstimate, ShuffleRound

    parts = [(ShuffleRound(n=s.n, sigma=s.sigma, rate=s.rate, m=s.m), k) for s, k in rounds]  # type: ignore[arg-type]
    est = proven_rounds_epsilon(parts, delta=delta)
    details: dict[str, object] = {
        "route": est.route,
        "delta_pld": est.delta_pld,
        "delta_coupling": est.delta_coupling,
        "discretization": est.discretization,
        "tail": est.tail,
    }
    if est.route == "clones":
        details["eps0"] = est.level
    if est.route == "blanket":
        details["blanket_level"] = est.level
        details["blanket_weight"] = est.weight
    if est.route != "gaussian":
        details["per_report_tv"] = est.per_report
    return PldEstimate(
        epsilon=est.epsilon,
        epsilon_lower=None,
        discretization=est.discretization,
        tail=est.tail,
        details=details,
    )


def clones(
    *, steps: Sequence[int], delta: float, method: str | None, **parameters: Any
) -> list[AccountingResult]:
    """Account the clones bounds (Feldman, McMillan & Talwar, arXiv:2012.12803)."""
    from .approximate.baselines import clones_results

    return clones_results(
        steps=steps, delta=delta, method=method or CLONES_METHODS[0], **parameters
    )


def ldp_shuffle(
    *, steps: Sequence[int], delta: float, method: str | None, **parameters: Any
) -> list[AccountingResult]:
    """Account shuffled eps0-LDP reports by the PLD of the method's dominating pair."""
    from .pld.ldp import ldp_shuffle_results

    pair = LDP_PAIRS[LDP_SHUFFLE_METHODS.index(method or LDP_SHUFFLE_METHODS[0])]
    return ldp_shuffle_results(steps=steps, delta=delta, pair=pair, **parameters)


def krr(
    *, steps: Sequence[int], delta: float, method: str | None, **parameters: Any
) -> list[AccountingResult]:
    """Account shuffled k-randomised response by its PLD (Koskela, Heikkilä & Honkela)."""
    from .pld.krr import krr_results

    return krr_results(steps=steps, delta=delta, **parameters)
