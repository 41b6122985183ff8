"""The table of mechanisms: one record per mechanism, its parameters, methods and references.

Everything that turns a mechanism into epsilon reads :data:`MECHANISM_TABLE`: the ``account``
command and :func:`~shuffle_opacus.analysis.account`, the Opacus accountants through the
protocol table (:data:`shuffle_opacus.PROTOCOLS` names a mechanism of it), the experiment's
curves. Mechanisms composed round by round (``shuffle``, ``subsampled``, ``checkin``, ``gaussian``,
``subsampled-gaussian``) carry per-round RDP factories and, for the shuffle mechanisms, the
``pld`` method, their tightest sound default, with a Rényi ``fallback`` where the work limits
do not allow it; the others (``clones``, ``clones-gaussian``, ``ldp-shuffle``, ``krr``) carry
the function that accounts them (:attr:`Mechanism.results`). The functions live in
:mod:`.methods`. Units, references and assumptions: docs/maths.md, "The mechanism table".
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from .._validation import check_int, check_probability, check_sigma
from . import methods as _m
from .limits import charge, largest_within, rdp_stage_seconds, report_progress
from .methods import RdpFactory, RdpFn
from .options import CLONES_METHODS, KRR_ADVERSARIES, LDP_SHUFFLE_METHODS
from .setting import RoundSetting

if TYPE_CHECKING:
    from .pld.rounds import PldEstimate
    from .results import AccountingResult

__all__ = [
    "RdpFn",
    "RoundSetting",
    "Method",
    "Mechanism",
    "MECHANISM_TABLE",
    "PARAMETERS",
    "get_mechanism",
    "round_mechanism",
    "per_step_rdp",
    "SHUFFLE_ASSUMPTIONS",
    "PROVEN_ASSUMPTIONS",
]

PARAMETERS: tuple[str, ...] = ("n", "sigma", "eps0", "m", "rate", "k", "gamma", "adversary")
"""Every mechanism parameter, in the order results display them."""

Runner = Callable[..., "list[AccountingResult]"]
"""``run(steps=..., delta=..., method=..., **parameters)``: one result per round count."""


@dataclass(frozen=True)
class Method:
    """One way to bound the privacy of a mechanism.

    Attributes:
        name: The method's name (``--method`` of the ``account`` command).
        step_rdp: ``setting -> (orders -> per-round RDP)`` (Rényi-DP methods).
        summary: One line saying what the bound is and what it assumes.
        pld: ``(rounds, delta, lower) -> PldEstimate`` of composed ``(setting, steps)`` rounds
            (privacy-loss-distribution methods; ``lower`` asks for the optimistic estimate too).
        assumptions: What this method's guarantees rest on, where it differs from the
            mechanism's :attr:`Mechanism.assumptions` (``proven``), else ``None``.
    """

    name: str
    step_rdp: RdpFactory | None
    summary: str
    pld: Callable[[Sequence[tuple[RoundSetting, int]], float, bool], PldEstimate] | None = None
    assumptions: tuple[str, ...] | None = None

    @property
    def kind(self) -> str:
        """``rdp``, ``pld``, or ``whole`` (accounted by :attr:`Mechanism.results`)."""
        if self.pld is not None:
            return "pld"
        return "rdp" if self.step_rdp is not None else "whole"


@dataclass(frozen=True)
class Mechanism:
    """A mechanism of the table: parameters, methods (first is the default) and references.

    Attributes:
        name: The mechanism's name (``shuffle-opacus account NAME``).
        parameters: The parameters it requires (names of :data:`PARAMETERS`).
        methods: Its methods; the first is the default, the tightest sound one.
        neighbouring: The neighbouring relation of its guarantees.
        summary: One line for help texts.
        optional: Parameters it accepts besides the required ones.
        references: Comparison curves by name (``no-shuffle``, ``central``); not guarantees.
        fallback: The method the default falls back to where the default's estimated cost
            exceeds the work limits, or ``None`` (the default is always used).
        assumptions: What its guarantees rest on besides the neighbouring relation (for a
            mechanism with :attr:`results`, its results state them: they depend on the method).
        sigma_unit: What ``sigma`` is relative to, where the results should say it.
        results: For a mechanism not composed round by round, the function that accounts it
            (``results(steps=..., delta=..., method=..., **parameters)``); ``None`` for the
            mechanisms of :func:`per_step_rdp` and :func:`~.epsilon.rounds_epsilon`.
    """

    name: str
    parameters: tuple[str, ...]
    methods: tuple[Method, ...]
    neighbouring: str
    summary: str
    optional: tuple[str, ...] = ()
    references: Mapping[str, RdpFactory] = dataclasses.field(default_factory=dict)
    fallback: str | None = None
    assumptions: tuple[str, ...] = ()
    sigma_unit: str | None = None
    results: Runner | None = None

    def assumptions_of(self, method: str | None) -> tuple[str, ...]:
        """Return what the guarantees of ``method`` (the default for ``None``) rest on."""
        own = self.method(method).assumptions
        return self.assumptions if own is None else own

    @property
    def method_names(self) -> tuple[str, ...]:
        """Names of the methods, the default first."""
        return tuple(m.name for m in self.methods)

    @property
    def default_method(self) -> str:
        """Name of the default method (the tightest sound one; see :attr:`fallback`)."""
        return self.methods[0].name

    @property
    def by_rounds(self) -> bool:
        """Whether it is composed round by round (no :attr:`results` function)."""
        return self.results is None

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

    def reference(self, name: str) -> RdpFactory:
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
            if given.get(name) is None:
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


_PLD = Method(
    "pld",
    None,
    "privacy loss distribution of the symmetrised Theorem 1 pair (tight (eps, delta))",
    pld=_m.shuffle_pld,
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


_PROVEN_SAMPLED = Method(
    "proven", None, _PROVEN_SUMMARY, _m.proven_pld, (*PROVEN_ASSUMPTIONS, _SECRET_SAMPLING)
)


def _whole(names: Sequence[str], summary: str) -> tuple[Method, ...]:
    return tuple(Method(name, None, summary) for name in names)


MECHANISM_TABLE: dict[str, Mechanism] = {
    m.name: m
    for m in (
        Mechanism(
            name="shuffle",
            parameters=("n", "sigma"),
            methods=(
                _PLD,
                Method("proven", None, _PROVEN_SUMMARY, _m.proven_pld, PROVEN_ASSUMPTIONS),
                Method("theorem1", _m.theorem1, "Theorem 1 of Liew & Takahashi, exact RDP"),
                Method("corollary1", _m.corollary1, "Corollary 1: the Gaussian, no shuffling"),
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
        ),
        Mechanism(
            name="subsampled",
            parameters=("n", "m", "sigma"),
            methods=(
                _PLD,
                _PROVEN_SAMPLED,
                Method("theorem2", _m.theorem2, "Theorem 2: Wang et al. bound on Theorem 1 (RDP)"),
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
        ),
        Mechanism(
            name="checkin",
            parameters=("n", "rate", "sigma"),
            methods=(
                _PLD,
                _PROVEN_SAMPLED,
                Method("exact", _m.checkin("exact"), "exact binomial average of Theorem 1 (RDP)"),
                Method("sum", _m.checkin("sum"), "the paper's Eq. 17 summed over the binomial"),
                Method("theorem3", _m.checkin("theorem3"), "the paper's Theorem 3 (Conjecture 1)"),
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
        ),
        Mechanism(
            name="gaussian",
            parameters=("sigma",),
            methods=(Method("rdp", _m.gaussian(_m.one), "Gaussian mechanism, lambda / 2 sigma^2"),),
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
                ),
            ),
            neighbouring="add/remove-one user (Poisson sampling)",
            summary="Poisson-subsampled Gaussian (Mironov, Talwar & Zhang)",
        ),
        Mechanism(
            name="clones",
            parameters=("n", "eps0"),
            methods=_whole(CLONES_METHODS, "clones bound (Feldman, McMillan & Talwar)"),
            neighbouring=_REPLACE_ONE,
            summary="clones bound for eps0-LDP reports (approximate DP)",
            results=_m.clones,
        ),
        Mechanism(
            name="clones-gaussian",
            parameters=("n", "sigma"),
            optional=("rate",),
            methods=_whole(CLONES_METHODS, "clones bound (Feldman, McMillan & Talwar)"),
            neighbouring=_REPLACE_ONE,
            summary="clones bound for Gaussian reports, Theorem 3.8 (approximate DP)",
            results=_m.clones,
        ),
        Mechanism(
            name="ldp-shuffle",
            parameters=("n", "eps0"),
            optional=("m",),
            methods=_whole(LDP_SHUFFLE_METHODS, "PLD of a dominating pair of shuffled reports"),
            neighbouring=_REPLACE_ONE,
            summary=(
                "PLD of a Feldman-McMillan-Talwar pair for eps0-LDP reports: pld, the clones pair "
                "(any eps0-LDP randomiser); pld-stronger, the 2022 pair, which its errata restrict "
                "to randomisers such as binary and k-ary randomised response"
            ),
            results=_m.ldp_shuffle,
        ),
        Mechanism(
            name="krr",
            parameters=("n", "k", "gamma"),
            optional=("adversary",),
            methods=_whole(("pld",), "PLD of shuffled k-randomised response"),
            neighbouring=_REPLACE_ONE,
            summary=f"PLD of shuffled k-randomised response ({' or '.join(KRR_ADVERSARIES)})",
            results=_m.krr,
        ),
    )
}
"""Every mechanism by name: the one table of what a mechanism is."""


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
