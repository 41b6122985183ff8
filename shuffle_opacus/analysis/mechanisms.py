"""The table of mechanisms: their parameters, methods and references, described once.

Every part of the package that turns a mechanism into epsilon (the ``account`` command, the
Opacus accountants through :mod:`shuffle_opacus.protocols`, the experiment's curves) reads this
table, as ``dp_accounting``'s ``dp_event`` describes each mechanism once. Adding a method to a
mechanism means adding one :class:`Method` entry here.

==========================  ===============================  ================================
mechanism                   parameters                       methods (first is the default)
==========================  ===============================  ================================
``shuffle``                 ``n``, ``sigma``                 ``pld``, ``theorem1``,
                                                             ``corollary1``
``subsampled``              ``n``, ``m``, ``sigma``          ``pld``, ``theorem2``
``checkin``                 ``n``, ``rate``, ``sigma``       ``pld``, ``exact``, ``sum``,
                                                             ``theorem3``
``gaussian``                ``sigma``                        ``rdp``
``subsampled-gaussian``     ``rate``, ``sigma``              ``rdp``
==========================  ===============================  ================================

The default of the shuffle mechanisms is ``pld``, the tightest sound method: the privacy loss
distribution of the symmetrised Theorem 1 pair (:mod:`.pld.rounds`). Where its estimated cost
exceeds the work limits (or the pair's engines cannot evaluate the setting) the default falls
back to the mechanism's Rényi bound (``fallback``), and the result says so in its note. The
other methods are upper bounds on the Rényi DP of one round (references in their docstrings and
in ``docs/maths.md``). The shuffle mechanisms also carry two *references*, which are comparison
curves and not guarantees of the shuffle protocol:

``no-shuffle``
    Corollary 1 of Liew & Takahashi in place of Theorem 1 (no amplification by shuffling):
    the Gaussian for ``shuffle``, the Wang-Balle-Kasiviswanathan bound of the Gaussian for
    ``subsampled``, the Poisson-subsampled Gaussian with the local sigma for ``checkin`` (the
    comparison curve of the paper's Figure 1).
``central``
    A trusted server adding the same total noise to the sum: sigma times ``sqrt(n)``,
    ``sqrt(m)`` or ``sqrt(rate n)`` (the expected number of reports), through the Gaussian, the
    Wang et al. bound or the Poisson-subsampled Gaussian respectively.

Units: for the shuffle mechanisms ``sigma`` is the paper's sigma (per-user noise standard
deviation divided by the L2 distance of the differing user's two inputs); for the two central
mechanisms it is the noise on the released sum divided by the sensitivity of the sum. The
neighbouring relation of the shuffle mechanisms is replace-one (the unit of privacy is one user);
their guarantees assume that Theorem 1's pair (the other users at a common value) is the worst
case, which is numerical evidence (docs/maths.md), and that the sampling and the shuffle are
secret (:attr:`Mechanism.assumptions`).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ._lazy import lazy_function
from ._validation import check_delta, check_int, check_probability, check_sigma
from .limits import (
    API_MAX_SECONDS,
    MAX_ORDER,
    PldRangeError,
    charge,
    largest_within,
    rdp_stage_seconds,
    remaining_budget,
    report_progress,
    shuffle_pld_seconds,
)
from .rdp.conversion import EpsilonResult, epsilon_from_rdp
from .results import PLD_ACCOUNTING_SYMMETRISED, AccountingResult

if TYPE_CHECKING:
    from .pld.rounds import PldEstimate

# The maths behind the table, imported when first used (the table itself stays light).
_A = "shuffle_opacus.analysis."
pld_discretization = lazy_function(_A + "pld.gaussian", "pld_discretization")
pld_tail = lazy_function(_A + "pld.gaussian", "pld_tail")
shuffle_rounds_epsilon = lazy_function(_A + "pld.rounds", "shuffle_rounds_epsilon")
shuffle_round = lazy_function(_A + "pld.rounds", "ShuffleRound")
gaussian_rdp = lazy_function(_A + "rdp.central", "gaussian_rdp")
poisson_subsampled_gaussian_rdp = lazy_function(
    _A + "rdp.central", "poisson_subsampled_gaussian_rdp"
)
checkin_rdp = lazy_function(_A + "rdp.checkin", "checkin_rdp")
no_shuffle_rdp = lazy_function(_A + "rdp.shuffle_gaussian", "no_shuffle_rdp")
shuffle_gaussian_rdp = lazy_function(_A + "rdp.shuffle_gaussian", "shuffle_gaussian_rdp")
subsampled_gaussian_rdp = lazy_function(_A + "rdp.subsampling", "subsampled_gaussian_rdp")
subsampled_shuffle_rdp = lazy_function(_A + "rdp.subsampling", "subsampled_shuffle_rdp")

__all__ = [
    "RdpFn",
    "RoundSetting",
    "Method",
    "Mechanism",
    "MECHANISM_TABLE",
    "MECHANISMS",
    "METHODS",
    "REFERENCES",
    "get_mechanism",
    "per_step_rdp",
    "rounds_epsilon",
    "compute_epsilon",
    "SHUFFLE_ASSUMPTIONS",
]

RdpFn = Callable[[np.ndarray], np.ndarray]
"""Maps a sorted array of integer orders ``>= 2`` to the RDP of one round at those orders."""

_PARAMETER_ORDER = ("n", "sigma", "m", "rate")


@dataclass(frozen=True)
class RoundSetting:
    """The validated parameters of one round of a mechanism (hashable, so results can be cached).

    Attributes:
        sigma: Noise parameter (unit as in the module docstring).
        n: Number of users (shuffle mechanisms).
        m: Users per round (``subsampled``).
        rate: Check-in or Poisson rate.
    """

    sigma: float
    n: int | None = None
    m: int | None = None
    rate: float | None = None

    def as_dict(self) -> dict[str, float | int | None]:
        """Return the parameters in display order (``n``, ``sigma``, ``m``, ``rate``)."""
        return {name: getattr(self, name) for name in _PARAMETER_ORDER}


@dataclass(frozen=True)
class Method:
    """One way to bound the privacy of a round: a Rényi-DP curve or a privacy loss distribution.

    Attributes:
        name: The method's name (``--method`` of the ``account`` command).
        step_rdp: ``setting -> (orders -> per-round RDP)`` (Rényi-DP methods).
        summary: One line saying what the bound is and what it assumes.
        pld: ``(rounds, delta, lower) -> PldEstimate`` of composed ``(setting, steps)`` rounds
            (privacy-loss-distribution methods; ``lower`` asks for the optimistic estimate too).
    """

    name: str
    step_rdp: Callable[[RoundSetting], RdpFn] | None
    summary: str
    pld: Callable[[Sequence[tuple[RoundSetting, int]], float, bool], PldEstimate] | None = None

    @property
    def kind(self) -> str:
        """``rdp`` or ``pld``."""
        return "pld" if self.pld is not None else "rdp"


@dataclass(frozen=True)
class Mechanism:
    """A mechanism of the table: parameters, methods (first is the default) and references.

    Attributes:
        name: The mechanism's name (``shuffle-opacus account NAME``).
        parameters: The parameters it requires, among ``n``, ``m``, ``rate`` and ``sigma``.
        methods: Its methods; the first is the default, the tightest sound one.
        neighbouring: The neighbouring relation of its guarantees.
        references: Comparison curves by name (``no-shuffle``, ``central``); not guarantees.
        fallback: The method the default falls back to where the default's estimated cost
            exceeds the work limits, or ``None`` (the default is always used).
        assumptions: What its guarantees rest on besides the neighbouring relation.
    """

    name: str
    parameters: tuple[str, ...]
    methods: tuple[Method, ...]
    neighbouring: str
    references: Mapping[str, Callable[[RoundSetting], RdpFn]]
    fallback: str | None = None
    assumptions: tuple[str, ...] = ()

    @property
    def method_names(self) -> tuple[str, ...]:
        """Names of the methods, the default first."""
        return tuple(m.name for m in self.methods)

    @property
    def default_method(self) -> str:
        """Name of the default method (the tightest sound one; see :attr:`fallback`)."""
        return self.methods[0].name

    def method(self, name: str | None = None) -> Method:
        """Return the method called ``name`` (the default for ``None``).

        Raises:
            ValueError: if the mechanism has no such method.
        """
        if name is None:
            return self.methods[0]
        for method in self.methods:
            if method.name == name:
                return method
        raise ValueError(
            f"method must be one of {', '.join(self.method_names)} for {self.name}. Found {name!r}."
        )

    def reference(self, name: str) -> Callable[[RoundSetting], RdpFn]:
        """Return the per-round RDP factory of the reference curve ``name``.

        Raises:
            ValueError: if the mechanism has no such reference.
        """
        if name not in self.references:
            allowed = ", ".join(self.references) or "none"
            raise ValueError(f"reference must be one of {allowed} for {self.name}. Found {name!r}.")
        return self.references[name]

    def setting(
        self,
        *,
        sigma: float | None,
        n: int | None = None,
        m: int | None = None,
        rate: float | None = None,
    ) -> RoundSetting:
        """Validate the parameters of one round.

        Returns:
            A :class:`RoundSetting`.

        Raises:
            ValueError: for a missing or extraneous parameter, or a value out of range.
        """
        given = {"n": n, "sigma": sigma, "m": m, "rate": rate}
        for name in self.parameters:
            if given[name] is None:
                raise ValueError(f"{name} is required for {self.name}.")
        for name, value in given.items():
            if value is not None and name not in self.parameters:
                raise ValueError(f"{name} is not a parameter of {self.name}. Found {value!r}.")
        n_checked = check_int("n", n, minimum=1) if n is not None else None
        return RoundSetting(
            sigma=check_sigma(sigma),
            n=n_checked,
            m=check_int("m", m, minimum=1, maximum=n_checked) if m is not None else None,
            rate=check_probability("rate", rate) if rate is not None else None,
        )


# --- per-round RDP factories of every method and reference ------------------------------------


def _theorem1(s: RoundSetting) -> RdpFn:
    return lambda orders: shuffle_gaussian_rdp(n=s.n, sigma=s.sigma, orders=orders)  # type: ignore[arg-type]


def _corollary1(s: RoundSetting) -> RdpFn:
    return lambda orders: no_shuffle_rdp(sigma=s.sigma, orders=orders)


def _theorem2(s: RoundSetting) -> RdpFn:
    return lambda orders: subsampled_shuffle_rdp(n=s.n, m=s.m, sigma=s.sigma, orders=orders)  # type: ignore[arg-type]


def _checkin(method: str) -> Callable[[RoundSetting], RdpFn]:
    def factory(s: RoundSetting) -> RdpFn:
        return lambda orders: checkin_rdp(
            n=s.n,  # type: ignore[arg-type]
            rate=s.rate,  # type: ignore[arg-type]
            sigma=s.sigma,
            orders=orders,
            method=method,
        )

    return factory


def _gaussian(scale: Callable[[RoundSetting], float]) -> Callable[[RoundSetting], RdpFn]:
    def factory(s: RoundSetting) -> RdpFn:
        return lambda orders: gaussian_rdp(sigma=s.sigma * scale(s), orders=orders)

    return factory


def _poisson_gaussian(scale: Callable[[RoundSetting], float]) -> Callable[[RoundSetting], RdpFn]:
    def factory(s: RoundSetting) -> RdpFn:
        return lambda orders: poisson_subsampled_gaussian_rdp(
            rate=s.rate,  # type: ignore[arg-type]
            sigma=s.sigma * scale(s),
            orders=orders,
        )

    return factory


def _wang_gaussian(scale: Callable[[RoundSetting], float]) -> Callable[[RoundSetting], RdpFn]:
    def factory(s: RoundSetting) -> RdpFn:
        return lambda orders: subsampled_gaussian_rdp(
            rate=s.m / s.n,  # type: ignore[operator]
            sigma=s.sigma * scale(s),
            orders=orders,
        )

    return factory


def _one(_: RoundSetting) -> float:
    return 1.0


def _shuffle_pld(
    rounds: Sequence[tuple[RoundSetting, int]], delta: float, lower: bool
) -> PldEstimate:
    # For the shuffle mechanisms: rate for check-in, m for the subsampled shuffle.
    parts = [(shuffle_round(n=s.n, sigma=s.sigma, rate=s.rate, m=s.m), k) for s, k in rounds]
    return shuffle_rounds_epsilon(parts, delta=delta, lower=lower)  # type: ignore[no-any-return]


_PLD = Method(
    "pld",
    None,
    "privacy loss distribution of the symmetrised Theorem 1 pair (tight (eps, delta))",
    pld=_shuffle_pld,
)

_REPLACE_ONE = "replace-one user"

SHUFFLE_ASSUMPTIONS: tuple[str, ...] = (
    "Theorem 1's pair (the other users at a common value) is the worst case: numerical "
    "evidence, docs/maths.md",
    "the shuffle is secret: the server sees the reports only as an anonymous multiset",
)
"""What every guarantee of the shuffle mechanisms rests on besides replace-one adjacency."""

_SECRET_SAMPLING = "the sampling coins are secret: no adversary knows which users report in a round"

MECHANISM_TABLE: dict[str, Mechanism] = {
    m.name: m
    for m in (
        Mechanism(
            name="shuffle",
            parameters=("n", "sigma"),
            methods=(
                _PLD,
                Method("theorem1", _theorem1, "Theorem 1 of Liew & Takahashi, exact RDP"),
                Method("corollary1", _corollary1, "Corollary 1: the Gaussian, no shuffling"),
            ),
            neighbouring=_REPLACE_ONE,
            references={
                "no-shuffle": _corollary1,
                "central": _gaussian(lambda s: math.sqrt(s.n)),  # type: ignore[arg-type]
            },
            fallback="theorem1",
            assumptions=SHUFFLE_ASSUMPTIONS,
        ),
        Mechanism(
            name="subsampled",
            parameters=("n", "m", "sigma"),
            methods=(
                _PLD,
                Method("theorem2", _theorem2, "Theorem 2: Wang et al. bound on Theorem 1 (RDP)"),
            ),
            neighbouring=_REPLACE_ONE,
            references={
                "no-shuffle": _wang_gaussian(_one),
                "central": _wang_gaussian(lambda s: math.sqrt(s.m)),  # type: ignore[arg-type]
            },
            fallback="theorem2",
            assumptions=(*SHUFFLE_ASSUMPTIONS, _SECRET_SAMPLING),
        ),
        Mechanism(
            name="checkin",
            parameters=("n", "rate", "sigma"),
            methods=(
                _PLD,
                Method("exact", _checkin("exact"), "exact binomial average of Theorem 1 (RDP)"),
                Method("sum", _checkin("sum"), "the paper's Eq. 17 summed over the binomial"),
                Method("theorem3", _checkin("theorem3"), "the paper's Theorem 3 (Conjecture 1)"),
            ),
            neighbouring=_REPLACE_ONE,
            references={
                "no-shuffle": _poisson_gaussian(_one),
                "central": _poisson_gaussian(lambda s: math.sqrt(s.rate * s.n)),  # type: ignore[operator]
            },
            fallback="exact",
            assumptions=(*SHUFFLE_ASSUMPTIONS, _SECRET_SAMPLING),
        ),
        Mechanism(
            name="gaussian",
            parameters=("sigma",),
            methods=(Method("rdp", _gaussian(_one), "Gaussian mechanism, lambda / 2 sigma^2"),),
            neighbouring="sum changes by at most the sensitivity",
            references={},
        ),
        Mechanism(
            name="subsampled-gaussian",
            parameters=("rate", "sigma"),
            methods=(
                Method(
                    "rdp",
                    _poisson_gaussian(_one),
                    "Poisson-subsampled Gaussian (Mironov, Talwar & Zhang)",
                ),
            ),
            neighbouring="add/remove-one user (Poisson sampling)",
            references={},
        ),
    )
}

MECHANISMS: tuple[str, ...] = tuple(MECHANISM_TABLE)
"""Names of the mechanisms with a Rényi-DP analysis."""

METHODS: dict[str, tuple[str, ...]] = {m.name: m.method_names for m in MECHANISM_TABLE.values()}
"""Methods of each mechanism, the default first."""

REFERENCES: dict[str, tuple[str, ...]] = {
    m.name: tuple(m.references) for m in MECHANISM_TABLE.values()
}
"""Reference curves of each mechanism."""


def get_mechanism(name: str) -> Mechanism:
    """Return the table entry of mechanism ``name``.

    Raises:
        ValueError: for an unknown name.
    """
    if name not in MECHANISM_TABLE:
        raise ValueError(f"mechanism must be one of {', '.join(MECHANISMS)}. Found {name!r}.")
    return MECHANISM_TABLE[name]


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
        return rdp_stage_seconds(
            mech.name, curve, order, n=setting.n, m=setting.m, rate=setting.rate
        )

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
        mechanism: One of :data:`MECHANISMS`.
        sigma: Noise parameter (see the module docstring for its unit).
        n: Population size (shuffle mechanisms).
        m: Users per round (``subsampled``).
        rate: Check-in rate (``checkin``) or Poisson rate (``subsampled-gaussian``).
        method: Bound to use; the first entry of ``METHODS[mechanism]`` by default.

    Returns:
        ``orders -> rdp`` (numpy arrays).

    Raises:
        ValueError: on an unknown mechanism or method, a missing or extraneous parameter, or an
            out-of-range value.
    """
    mech = get_mechanism(mechanism)
    chosen = mech.method(method)
    if chosen.step_rdp is None:
        raise ValueError(f"method {chosen.name} of {mechanism} has no Rényi-DP curve.")
    return chosen.step_rdp(mech.setting(sigma=sigma, n=n, m=m, rate=rate))


def _pld_affordable(mech: Mechanism, parts: Sequence[tuple[RoundSetting, int]]) -> str | None:
    """Why the default ``pld`` cannot be used for these rounds, or ``None`` when it can."""
    low = min(s.sigma for s, _ in parts)
    if low < 0.05:
        return f"the pld method needs sigma >= 0.05 (got {low:g})"
    distinct = {(s.m if s.m is not None else int(s.n or 1), s.sigma) for s, _ in parts}
    estimate = shuffle_pld_seconds(sorted(distinct), sum(k for _, k in parts))
    remaining = remaining_budget()
    limit = API_MAX_SECONDS if remaining is None else remaining
    if estimate > limit:
        return f"the pld method is estimated at {estimate:.3g} s, over the {limit:.3g} s left"
    return None


def _fallback_note(mech: Mechanism, reason: str) -> str:
    return f"{reason}; Rényi bound (method {mech.fallback}) instead"


def _run_pld(
    mech: Mechanism,
    method: str | None,
    parts: Sequence[tuple[RoundSetting, int]],
    delta: float,
    lower: bool,
) -> tuple[PldEstimate | None, str | None]:
    """Evaluate ``pld`` if it is the method asked for (or the affordable default).

    Returns:
        ``(estimate, None)`` when ``pld`` was used; ``(None, note)`` when the default falls back
        to :attr:`Mechanism.fallback` (``note`` says why); ``(None, None)`` when another method
        was asked for.

    Raises:
        ValueError: when ``pld`` was asked for by name and cannot evaluate the setting.
    """
    chosen = mech.method(method)
    if chosen.pld is None:
        return None, None
    if method is not None or mech.fallback is None:
        return chosen.pld(parts, delta, lower), None
    reason = _pld_affordable(mech, parts)
    if reason is not None:
        return None, _fallback_note(mech, reason)
    try:
        return chosen.pld(parts, delta, lower), None
    except PldRangeError as exc:  # a setting the engines cannot hold: the Rényi bound can
        return None, _fallback_note(mech, str(exc).rstrip("."))


def rounds_epsilon(
    mechanism: str,
    rounds: Sequence[tuple[RoundSetting, int]],
    *,
    delta: float,
    method: str | None = None,
    reference: str | None = None,
    max_order: int | None = None,
    lower: bool = False,
) -> EpsilonResult:
    """Epsilon of a sequence of rounds, by the mechanism's default method or the one named.

    The default of the shuffle mechanisms is ``pld`` (the rounds' privacy loss distributions
    composed, :mod:`.pld.rounds`), falling back to the Rényi bound where the work limits do not
    allow it (the result's ``note`` says why). Rényi-DP methods add the rounds' RDP at each
    order (Mironov 2017, Proposition 1) and convert by Lemma 2, the order chosen by
    :func:`~shuffle_opacus.analysis.epsilon_from_rdp`. Per-round tables and PMFs are cached, so
    asking again after more rounds (an accountant's ``get_epsilon``, a curve evaluated every
    round) costs only the composition or the conversion.

    Args:
        mechanism: One of :data:`MECHANISMS`.
        rounds: ``(setting, steps)`` pairs, settings from :meth:`Mechanism.setting`.
        delta: Target delta in ``(0, 1)``.
        method: A method of the mechanism (the default when ``None``).
        reference: A reference curve instead of a method (``no-shuffle`` or ``central``).
        max_order: Optional cap on the Rényi order (Rényi-DP methods, and the fallback).
        lower: For ``pld``, also compute the optimistic estimate (``epsilon_lower``).

    Returns:
        An :class:`~shuffle_opacus.analysis.EpsilonResult` with the method used; epsilon 0 at
        order 0 when there are no rounds.

    Raises:
        ValueError: on an invalid argument.
    """
    mech = get_mechanism(mechanism)
    delta = check_delta(delta)
    if reference is not None and method is not None:
        raise ValueError(
            f"give a method or a reference, not both. Found {method!r}, {reference!r}."
        )
    if reference is not None:
        mech.reference(reference)
    else:
        mech.method(method)
    if max_order is not None:
        max_order = check_int("max_order", max_order, minimum=2, maximum=MAX_ORDER)
        if method is not None and mech.method(method).kind == "pld":
            raise ValueError("max_order applies to Rényi-DP methods, not to the pld method.")
    parts = [(s, check_int("steps", k, minimum=0)) for s, k in rounds]
    parts = [(s, k) for s, k in parts if k > 0]
    named = reference is None and method is not None
    if not parts:
        empty = mech.method(method).name if reference is None else None
        if reference is None and method is None and mech.fallback and max_order is not None:
            empty = mech.fallback
        return EpsilonResult(
            epsilon=0.0, delta=delta, order=0, max_order=0, at_cap=False, method=empty
        )
    note = None
    if reference is None:
        if method is None and max_order is not None and mech.fallback is not None:
            # An order cap asks for a Rényi bound: the default's Rényi fallback.
            curve: str = mech.fallback
        else:
            estimate, note = _run_pld(mech, method, parts, delta, lower)
            if estimate is not None:
                return EpsilonResult(
                    epsilon=estimate.epsilon,
                    delta=delta,
                    order=0,
                    max_order=0,
                    at_cap=False,
                    method="pld",
                    epsilon_lower=estimate.epsilon_lower,
                )
            curve = mech.method(method).name if named or note is None else mech.fallback  # type: ignore[assignment]
    else:
        curve = reference

    def total(orders: np.ndarray) -> np.ndarray:
        top = max(2, int(orders[-1]))
        out = np.zeros(orders.shape)
        for setting, steps in parts:
            out = out + steps * _step_table(mech.name, curve, setting, top)[orders - 2]
        return out

    res = epsilon_from_rdp(total, delta=delta, max_order=max_order)
    return EpsilonResult(
        epsilon=res.epsilon,
        delta=delta,
        order=res.order,
        max_order=res.max_order,
        at_cap=res.at_cap,
        method=None if reference is not None else curve,
        note=note,
    )


def compute_epsilon(
    mechanism: str,
    *,
    sigma: float,
    steps: int,
    delta: float,
    n: int | None = None,
    m: int | None = None,
    rate: float | None = None,
    method: str | None = None,
    max_order: int | None = None,
) -> AccountingResult:
    """Epsilon of ``steps`` rounds of ``mechanism`` at ``delta``, as a result record.

    By the mechanism's default method (for the shuffle mechanisms ``pld``, which also reports
    its optimistic estimate as ``epsilon_lower``, falling back to the Rényi bound with a note
    where the work limits do not allow it) or the method named. Rényi-DP methods compose the
    rounds' RDP and convert by Lemma 2.

    Args:
        mechanism: One of :data:`MECHANISMS`.
        sigma: Noise parameter (see the module docstring for its unit).
        steps: Number of rounds composed (integer >= 1).
        delta: Target delta in ``(0, 1)``.
        n: Population size (shuffle mechanisms).
        m: Users per round (``subsampled``).
        rate: Check-in rate (``checkin``) or Poisson rate (``subsampled-gaussian``).
        method: Bound to use; the first entry of ``METHODS[mechanism]`` by default.
        max_order: Cap on the Rényi order (Rényi-DP methods; with the default method of a
            shuffle mechanism it selects the Rényi fallback). A warning
            (:class:`~shuffle_opacus.analysis.OrderCapWarning`) is issued when the optimum sits
            at the cap.

    Returns:
        An :class:`~shuffle_opacus.analysis.AccountingResult` (``kind`` ``pld`` or ``rdp``).

    Raises:
        ValueError: on any invalid argument.
    """
    mech = get_mechanism(mechanism)
    mech.method(method)
    setting = mech.setting(sigma=sigma, n=n, m=m, rate=rate)
    steps = check_int("steps", steps, minimum=1)
    delta = check_delta(delta)
    res = rounds_epsilon(
        mech.name, [(setting, steps)], delta=delta, method=method, max_order=max_order, lower=True
    )
    common = {
        "mechanism": mech.name,
        "epsilon": res.epsilon,
        "delta": delta,
        "steps": steps,
        "parameters": setting.as_dict(),
        "neighbouring": mech.neighbouring,
        "note": res.note,
        "sensitivity": _SIGMA_UNIT if mech.name in _SHUFFLE_MECHANISMS else None,
        "assumptions": mech.assumptions,
    }
    if res.method == "pld":
        grid = pld_discretization(n=setting.n, sigma=setting.sigma, rate=setting.rate, m=setting.m)
        return AccountingResult(
            method="pld",
            kind="pld",
            accounting=PLD_ACCOUNTING_SYMMETRISED,
            epsilon_lower=res.epsilon_lower,
            extra={"discretization": grid, "tail": pld_tail(delta, steps)},
            **common,  # type: ignore[arg-type]
        )
    return AccountingResult(
        method=res.method or mech.default_method,
        kind="rdp",
        accounting="Rényi DP composed, converted by Lemma 2",
        order=res.order,
        max_order=res.max_order,
        at_cap=res.at_cap,
        **common,  # type: ignore[arg-type]
    )


_SHUFFLE_MECHANISMS = frozenset({"shuffle", "subsampled", "checkin"})

_SIGMA_UNIT = (
    "sigma is each user's noise std over the distance between the differing user's two inputs"
)
