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

from .._lazy import lazy_function
from .._validation import check_int, check_probability, check_sigma
from .limits import (
    charge,
    largest_within,
    rdp_stage_seconds,
    report_progress,
)

if TYPE_CHECKING:
    from .pld.rounds import PldEstimate

# The maths behind the table, imported when first used (the table itself stays light).
_A = "shuffle_opacus.analysis."
pld_discretization = lazy_function(_A + "pld.shuffle_gaussian", "pld_discretization")
pld_tail = lazy_function(_A + "pld.shuffle_gaussian", "pld_tail")
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
