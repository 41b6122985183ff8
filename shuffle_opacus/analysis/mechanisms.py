"""The table of mechanisms: one record per mechanism, its parameters, methods and references.

Everything that turns a mechanism into epsilon reads :data:`MECHANISM_TABLE`: the ``account``
command and :func:`~shuffle_opacus.analysis.account`, the cost model and work limits
(:mod:`.costs`, :mod:`.limits`), the Opacus accountants through the protocol table
(:data:`shuffle_opacus.PROTOCOLS` names a mechanism of it), the experiment's curves and their
legend labels (:func:`.registry.curve_labels`). Mechanisms composed round by round (``shuffle``,
``subsampled``, ``checkin``, ``gaussian``, ``subsampled-gaussian``) carry per-round RDP factories
and, for the shuffle mechanisms, the ``pld`` method, their tightest sound default, with a Rényi
``fallback`` where the work limits do not allow it; the others (``clones``, ``clones-gaussian``,
``ldp-shuffle``, ``krr``) carry the function that accounts them (:attr:`Mechanism.results`).
The records are :mod:`.records`; the maths :mod:`.methods`; each method's cost model
:mod:`.costs`. A new mechanism is one module plus one record, added by
:func:`.registry.register_mechanism` (tests/analysis/test_adding_a_mechanism.py does it). Units,
references and assumptions: docs/maths.md, "The mechanism table".
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence

import numpy as np

from ..common.validation import check_positive, check_probability, check_sigma
from . import costs as _c
from . import methods as _m
from .limits import charge, largest_within, rdp_stage_seconds, report_progress
from .methods import RdpFn
from .options import CLONES_METHODS, KRR_ADVERSARIES, LDP_SHUFFLE_METHODS
from .records import Cost, Driver, Mechanism, Method, Parameter, RequestCost
from .setting import RoundSetting

__all__ = [
    "RdpFn",
    "RoundSetting",
    "Method",
    "Mechanism",
    "MECHANISM_TABLE",
    "PARAMETERS",
    "COMMON_PARAMETERS",
    "get_mechanism",
    "round_mechanism",
    "per_step_rdp",
    "SHUFFLE_ASSUMPTIONS",
    "PROVEN_ASSUMPTIONS",
]

PARAMETERS: tuple[str, ...] = ("n", "sigma", "eps0", "m", "rate", "k", "gamma", "adversary")
"""Every parameter of the shipped mechanisms, in the order results display them (a registered
mechanism may add its own: :func:`.registry.parameter_specs`)."""

COMMON_PARAMETERS: dict[str, Parameter] = {
    p.name: p
    for p in (
        Parameter("n", "number of users (integer >= 1)", kind="int"),
        Parameter(
            "sigma",
            "the analysis sigma > 0 (1e-150 to 1e150): for shuffle, subsampled and checkin each "
            "user's noise std over the distance of the differing user's two inputs (not the "
            "noise multiplier: under replace-one it is half of it)",
            check=lambda label, v: check_sigma(v, label),
        ),
        Parameter("m", "users per round (subsampled), 1..n", kind="int"),
        Parameter("rate", "check-in or Poisson rate", check=check_probability),
    )
}
"""How the command line takes the parameters several mechanisms share; a mechanism's own
parameters are in its record (:attr:`Mechanism.cli`)."""

_EPS0 = Parameter(
    "eps0", "local epsilon > 0 of each report (clones, ldp-shuffle)", check=check_positive
)

_WHOLE_DRIVERS = (Driver("n"), Driver("steps"))

_PLD = Method(
    "pld",
    None,
    "privacy loss distribution of the symmetrised Theorem 1 pair (tight (eps, delta))",
    pld=_m.shuffle_pld,
    cost=Cost(
        request=_c.shuffle_pld_request,
        calibration=_c.shuffle_pld_calibration,
        calibration_drivers=("n", "rounds"),
        min_sigma=0.05,
    ),
    label="shuffle, privacy loss distribution (this package)",
)

_REPLACE_ONE = "replace-one user"

PROVEN_ASSUMPTIONS: tuple[str, ...] = (
    "proven from published theorems (Feldman, McMillan & Talwar, arXiv:2012.12803, Theorems "
    "3.8 and 4.1; Balle & Wang 2018): no assumption on where the other users' updates lie",
    "each report's Gaussian noise is drawn afresh and kept secret from the server",
    "the shuffle is secret: the server sees the reports only as an anonymous multiset",
)
"""What the ``proven`` method rests on besides replace-one adjacency (the mechanisms that
sample add the secrecy of their coins)."""

_PROVEN_SUMMARY = (
    "proven bound: the reports' own clones or blanket pairs (Feldman, McMillan & Talwar) "
    "composed by PLD, no assumption on the other users"
)

SHUFFLE_ASSUMPTIONS: tuple[str, ...] = (
    "Theorem 1's pair (the other users at a common value) is the worst case: numerical "
    "evidence, docs/maths.md",
    "the shuffle is secret: the server sees the reports only as an anonymous multiset",
)
"""What every guarantee of the shuffle mechanisms rests on besides replace-one adjacency."""

_SECRET_SAMPLING = "the sampling coins are secret: no adversary knows which users report in a round"

_SIGMA_UNIT = (
    "sigma is each user's noise std over the distance between the differing user's two inputs"
)


_PROVEN_COST = Cost(
    request=_c.proven_request,
    calibration=_c.proven_calibration,
    calibration_drivers=("n", "rounds"),
)
_PROVEN_LABEL = "shuffle, proven bound (this package)"

_PROVEN_SAMPLED = Method(
    "proven",
    None,
    _PROVEN_SUMMARY,
    _m.proven_pld,
    (*PROVEN_ASSUMPTIONS, _SECRET_SAMPLING),
    cost=_PROVEN_COST,
    label=_PROVEN_LABEL,
)

_REFERENCE_LABELS = {"no-shuffle": "no shuffling (Corollary 1)", "central": "central DP reference"}


def _whole(names: Sequence[str], summary: str, costs: Sequence[RequestCost]) -> tuple[Method, ...]:
    """Methods of a mechanism accounted as a whole, each with its request's cost."""
    return tuple(
        Method(name, None, summary, cost=Cost(request=cost))
        for name, cost in zip(names, costs, strict=True)
    )


MECHANISM_TABLE: dict[str, Mechanism] = {
    m.name: m
    for m in (
        Mechanism(
            name="shuffle",
            parameters=("n", "sigma"),
            methods=(
                _PLD,
                Method(
                    "proven",
                    None,
                    _PROVEN_SUMMARY,
                    _m.proven_pld,
                    PROVEN_ASSUMPTIONS,
                    cost=_PROVEN_COST,
                    label=_PROVEN_LABEL,
                ),
                Method(
                    "theorem1",
                    _m.theorem1,
                    "Theorem 1 of Liew & Takahashi, exact RDP",
                    cost=Cost(stage=_c.shuffle_stage),
                ),
                Method(
                    "corollary1",
                    _m.corollary1,
                    "Corollary 1: the Gaussian, no shuffling",
                    cost=Cost(stage=_c.closed_form_stage),
                    label="shuffle, Corollary 1",
                ),
            ),
            neighbouring=_REPLACE_ONE,
            summary=_PLD.summary,
            references={
                "no-shuffle": _m.corollary1,
                "central": _m.gaussian(lambda s: math.sqrt(s.n)),  # type: ignore[arg-type]
            },
            fallback="theorem1",
            assumptions=SHUFFLE_ASSUMPTIONS,
            sigma_unit=_SIGMA_UNIT,
            reference_cost=_c.closed_form_stage,
            reference_labels=_REFERENCE_LABELS,
            noise_multiplier=True,
            beside_default="proven",
        ),
        Mechanism(
            name="subsampled",
            parameters=("n", "m", "sigma"),
            methods=(
                _PLD,
                _PROVEN_SAMPLED,
                Method(
                    "theorem2",
                    _m.theorem2,
                    "Theorem 2: Wang et al. bound on Theorem 1 (RDP)",
                    cost=Cost(stage=_c.theorem2_stage),
                ),
            ),
            neighbouring=_REPLACE_ONE,
            summary=_PLD.summary,
            references={
                "no-shuffle": _m.wang_gaussian(_m.one),
                "central": _m.wang_gaussian(lambda s: math.sqrt(s.m)),  # type: ignore[arg-type]
            },
            fallback="theorem2",
            assumptions=(*SHUFFLE_ASSUMPTIONS, _SECRET_SAMPLING),
            sigma_unit=_SIGMA_UNIT,
            reference_cost=_c.mixture_stage,
            reference_labels=_REFERENCE_LABELS,
            noise_multiplier=True,
            beside_default="proven",
        ),
        Mechanism(
            name="checkin",
            parameters=("n", "rate", "sigma"),
            methods=(
                _PLD,
                _PROVEN_SAMPLED,
                Method(
                    "exact",
                    _m.checkin("exact"),
                    "exact binomial average of Theorem 1 (RDP)",
                    cost=Cost(stage=_c.shuffle_stage),
                    label="shuffle, Rényi bound (this package)",
                ),
                Method(
                    "sum",
                    _m.checkin("sum"),
                    "the paper's Eq. 17 summed over the binomial",
                    cost=Cost(stage=_c.checkin_sum_stage),
                    label="shuffle, binomial sum (Eq. 17)",
                ),
                Method(
                    "theorem3",
                    _m.checkin("theorem3"),
                    "the paper's Theorem 3 (Conjecture 1)",
                    cost=Cost(stage=_c.theorem3_stage),
                    label="shuffle, Theorem 3 (paper)",
                ),
            ),
            neighbouring=_REPLACE_ONE,
            summary=_PLD.summary,
            references={
                "no-shuffle": _m.poisson_gaussian(_m.one),
                "central": _m.poisson_gaussian(lambda s: math.sqrt(s.rate * s.n)),  # type: ignore[operator]
            },
            fallback="exact",
            assumptions=(*SHUFFLE_ASSUMPTIONS, _SECRET_SAMPLING),
            sigma_unit=_SIGMA_UNIT,
            reference_cost=_c.mixture_stage,
            reference_labels=_REFERENCE_LABELS,
            noise_multiplier=True,
            beside_default="proven",
        ),
        Mechanism(
            name="gaussian",
            parameters=("sigma",),
            methods=(
                Method(
                    "rdp",
                    _m.gaussian(_m.one),
                    "Gaussian mechanism, lambda / 2 sigma^2",
                    cost=Cost(stage=_c.closed_form_stage),
                ),
            ),
            neighbouring="sum changes by at most the sensitivity",
            summary="Gaussian mechanism, lambda / 2 sigma^2",
        ),
        Mechanism(
            name="subsampled-gaussian",
            parameters=("rate", "sigma"),
            methods=(
                Method(
                    "rdp",
                    _m.poisson_gaussian(_m.one),
                    "Poisson-subsampled Gaussian (Mironov, Talwar & Zhang)",
                    cost=Cost(stage=_c.mixture_stage),
                ),
            ),
            neighbouring="add/remove-one user (Poisson sampling)",
            summary="Poisson-subsampled Gaussian (Mironov, Talwar & Zhang)",
        ),
        Mechanism(
            name="clones",
            parameters=("n", "eps0"),
            methods=_whole(
                CLONES_METHODS,
                "clones bound (Feldman, McMillan & Talwar)",
                (_c.clones_request, _c.clones_closed_form_request),
            ),
            neighbouring=_REPLACE_ONE,
            summary="clones bound for eps0-LDP reports (approximate DP)",
            results=_m.clones,
            drivers=_WHOLE_DRIVERS,
            cli=(_EPS0,),
        ),
        Mechanism(
            name="clones-gaussian",
            parameters=("n", "sigma"),
            optional=("rate",),
            methods=_whole(
                CLONES_METHODS,
                "clones bound (Feldman, McMillan & Talwar)",
                (_c.clones_gaussian_request, _c.clones_closed_form_request),
            ),
            neighbouring=_REPLACE_ONE,
            summary="clones bound for Gaussian reports, Theorem 3.8 (approximate DP)",
            results=_m.clones,
            drivers=_WHOLE_DRIVERS,
        ),
        Mechanism(
            name="ldp-shuffle",
            parameters=("n", "eps0"),
            optional=("m",),
            methods=_whole(
                LDP_SHUFFLE_METHODS,
                "PLD of a dominating pair of shuffled reports",
                (_c.ldp_shuffle_request,) * len(LDP_SHUFFLE_METHODS),
            ),
            neighbouring=_REPLACE_ONE,
            summary=(
                "PLD of a Feldman-McMillan-Talwar pair for eps0-LDP reports: pld, the clones pair "
                "(any eps0-LDP randomiser); pld-stronger, the 2022 pair, which its errata restrict "
                "to randomisers such as binary and k-ary randomised response"
            ),
            results=_m.ldp_shuffle,
            drivers=(Driver("n"), Driver("m"), Driver("steps")),
            cli=(_EPS0,),
        ),
        Mechanism(
            name="krr",
            parameters=("n", "k", "gamma"),
            optional=("adversary",),
            methods=_whole(("pld",), "PLD of shuffled k-randomised response", (_c.krr_request,)),
            neighbouring=_REPLACE_ONE,
            summary=f"PLD of shuffled k-randomised response ({' or '.join(KRR_ADVERSARIES)})",
            results=_m.krr,
            drivers=_WHOLE_DRIVERS,
            cli=(
                Parameter("k", "krr: domain size (>= 2)", kind="int", minimum=2),
                Parameter(
                    "gamma",
                    "krr: probability in (0, 1] that a user answers uniformly at random",
                    check=check_probability,
                ),
                Parameter(
                    "adversary",
                    "krr: strong (knows who randomised, Balle et al.; default) or weak",
                    kind="choice",
                    choices=KRR_ADVERSARIES,
                ),
            ),
        ),
    )
}
"""Every mechanism by name: the one table of what a mechanism is."""

_SHIPPED = frozenset(MECHANISM_TABLE)


def get_mechanism(name: str) -> Mechanism:
    """Return the table entry of mechanism ``name``.

    Raises:
        ValueError: for an unknown name.
    """
    if name not in MECHANISM_TABLE:
        raise ValueError(f"mechanism must be one of {', '.join(MECHANISM_TABLE)}. Found {name!r}.")
    return MECHANISM_TABLE[name]


def round_mechanism(name: str) -> Mechanism:
    """Return the table entry of ``name``, a mechanism composed round by round.

    Raises:
        ValueError: for an unknown name or a mechanism accounted as a whole (use
            :func:`~shuffle_opacus.analysis.account` for those).
    """
    mech = get_mechanism(name)
    if not mech.by_rounds:
        rounds = ", ".join(m.name for m in MECHANISM_TABLE.values() if m.by_rounds)
        raise ValueError(
            f"mechanism must be one of {rounds} here ({name} is accounted as a whole: use "
            f"account()). Found {name!r}."
        )
    return mech


@functools.lru_cache(maxsize=256)
def _step_table(mechanism: str, curve: str, setting: RoundSetting, max_order: int) -> np.ndarray:
    """Per-round RDP at orders ``2..max_order`` (read-only; cached across calls).

    The estimated cost is charged to the active work budget (:func:`.limits.charge`) before
    the table is computed; a cached table costs nothing.
    """
    mech = MECHANISM_TABLE[mechanism]
    _charge_stage(mech, curve, setting, max_order)
    if curve in mech.references:
        factory = mech.references[curve]
    else:
        factory = mech.method(curve).step_rdp  # type: ignore[assignment]
    table = np.asarray(factory(setting)(np.arange(2, max_order + 1)), dtype=float)
    table.setflags(write=False)
    return table


def _charge_stage(mech: Mechanism, curve: str, setting: RoundSetting, max_order: int) -> None:
    """Charge the estimated cost of one order range to the active budget, or refuse it."""

    def cost(order: int) -> float:
        return rdp_stage_seconds(mech, curve, order, n=setting.n, m=setting.m, rate=setting.rate)

    def refuse(remaining: float, seconds: float) -> str:
        best = largest_within(cost, 2, max_order, max(remaining, 0.0))
        shown = ", ".join(
            f"{k}={v:g}" for k, v in setting.as_dict().items() if v is not None and k != "n"
        )
        where = f"{mech.name} --method {curve} at n={setting.n}, {shown}"
        if setting.n is None:
            where = f"{mech.name} --method {curve} at {shown}"
        return (
            f"max_order must be <= {best if best is not None else 2} for {where} (orders up "
            f"to {max_order} estimated at {seconds:.3g} s, {max(remaining, 0.0):.3g} s of the "
            f"work budget left)."
        )

    charge(cost(max_order), refuse)
    report_progress(f"{mech.name} {curve}: orders 2..{max_order}")


def per_step_rdp(
    mechanism: str,
    *,
    sigma: float,
    n: int | None = None,
    m: int | None = None,
    rate: float | None = None,
    method: str | None = None,
) -> RdpFn:
    """Return a function mapping integer orders to the RDP of one round of ``mechanism``.

    Args:
        mechanism: A mechanism of :data:`MECHANISM_TABLE` composed round by round.
        sigma: Noise parameter (see the module docstring for its unit).
        n: Population size (shuffle mechanisms).
        m: Users per round (``subsampled``).
        rate: Check-in rate (``checkin``) or Poisson rate (``subsampled-gaussian``).
        method: Bound to use; the mechanism's default by default.

    Returns:
        ``orders -> rdp`` (numpy arrays).

    Raises:
        ValueError: on an unknown mechanism or method, a missing or extraneous parameter, or an
            out-of-range value.
    """
    mech = round_mechanism(mechanism)
    chosen = mech.method(method)
    if chosen.step_rdp is None:
        raise ValueError(f"method {chosen.name} of {mechanism} has no Rényi-DP curve.")
    return chosen.step_rdp(mech.setting(sigma=sigma, n=n, m=m, rate=rate))
