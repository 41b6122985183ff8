"""The records of the mechanism table: a mechanism, its methods, cost model and command-line flags.

A :class:`Mechanism` carries everything the package knows of it: its maths (per-round RDP
factories, PLD composers or an accounting function, all in :mod:`.methods`), the cost model of
each method (:class:`Cost`, from :mod:`.costs`), the parameters that drive the cost of a request
(:class:`Driver`), how the command line takes its own parameters (:class:`Parameter`) and the
legend labels of its curves. :mod:`.costs`, :mod:`.limits` and the ``account`` command read them,
so that a new mechanism is one module of maths plus one record
(:func:`~.mechanisms.register_mechanism`). The table itself: :mod:`.mechanisms`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from ..common.validation import check_int, check_probability, check_sigma
from .setting import RoundSetting

if TYPE_CHECKING:
    from .results import AccountingResult

__all__ = [
    "RdpFn",
    "RdpFactory",
    "PldComposer",
    "StageCost",
    "RequestCost",
    "CalibrationCost",
    "Cost",
    "Driver",
    "ROUND_DRIVERS",
    "Parameter",
    "Method",
    "Mechanism",
]

RdpFn = Callable[[np.ndarray], np.ndarray]
"""Maps a sorted array of integer orders ``>= 2`` to the RDP of one round at those orders."""

RdpFactory = Callable[[RoundSetting], RdpFn]
"""Maps a round's setting to its per-round RDP curve."""

PldComposer = Callable[[Sequence[tuple[RoundSetting, int]], float, bool], Any]
"""``(rounds, delta, lower) -> PldEstimate`` (:class:`~.pld.rounds.PldEstimate`, not named here:
the PLD engine imports the work limits, which read these records)."""

Runner = Callable[..., "list[AccountingResult]"]
"""``run(steps=..., delta=..., method=..., **parameters)``: one result per round count."""


class StageCost(Protocol):
    """Estimated seconds of one round's Rényi DP at orders ``2..order``."""

    def __call__(self, order: int, *, n: int | None, m: int | None, rate: float | None) -> float:
        """Return the estimate (``n``, ``m``, ``rate``: the round's, ``None`` where absent)."""


class RequestCost(Protocol):
    """Estimated seconds of a whole request: a PLD composition, or a mechanism accounted whole."""

    def __call__(self, values: Mapping[str, object], steps: Sequence[int], base: float) -> float:
        """Return the estimate.

        ``values``: the mechanism's parameters by name (``None`` for absent ones); ``steps``: the
        round counts; ``base``: the request's fixed cost, which the estimate includes.
        """


class CalibrationCost(Protocol):
    """Estimated seconds of a noise calibration (a bisection over epsilon evaluations)."""

    def __call__(self, *, n: int, m: int | None, rate: float | None, rounds: int) -> float:
        """Return the estimate for ``rounds`` rounds of ``n`` users (``m`` a round, or ``rate``)."""


@dataclass(frozen=True)
class Cost:
    """The cost model of a method: the estimates :mod:`.limits` refuses work with.

    Attributes:
        request: Seconds of a whole request (PLD methods and mechanisms accounted whole).
        stage: Seconds of one order range (Rényi-DP methods and references).
        calibration: Seconds of a noise calibration, where it is not that of :attr:`stage`.
        calibration_drivers: The calibration parameters that drive the cost (``n``,
            ``rounds``), in the order a refusal suggests lowering them.
        min_sigma: Analysis sigma below which the mechanism's default skips this method for
            its Rényi :attr:`Mechanism.fallback` without estimating it (``0``: never).
    """

    request: RequestCost | None = None
    stage: StageCost | None = None
    calibration: CalibrationCost | None = None
    calibration_drivers: tuple[str, ...] = ("n",)
    min_sigma: float = 0.0


@dataclass(frozen=True)
class Driver:
    """A parameter whose value drives the cost of a request, with its smallest value.

    ``steps`` is capped count by count; ``max_order`` is the Rényi order cap.
    """

    name: str
    minimum: int = 1


ROUND_DRIVERS: tuple[Driver, ...] = (
    Driver("max_order", 2),
    Driver("n"),
    Driver("m"),
    Driver("steps"),
)
"""What a refusal of a mechanism composed round by round suggests lowering, in order."""


@dataclass(frozen=True)
class Parameter:
    """How the ``account`` command takes one mechanism parameter (flag ``--NAME``).

    Attributes:
        name: The parameter (a key of the ``account`` call).
        help: The flag's help text.
        kind: ``int`` (at least :attr:`minimum`), ``float`` (checked by :attr:`check`) or
            ``choice`` (one of :attr:`choices`).
        minimum: Smallest value of an ``int``.
        check: ``check(label, value) -> value`` of a ``float``: a one-line ``ValueError``
            naming ``label`` for a value out of range (``None``: any value > 0).
        choices: The values of a ``choice``.
    """

    name: str
    help: str
    kind: str = "float"
    minimum: int = 1
    check: Callable[[str, Any], float] | None = None
    choices: tuple[str, ...] = ()

    @property
    def flag(self) -> str:
        """The command-line flag (``--name``)."""
        return "--" + self.name.replace("_", "-")


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
        cost: Its cost model (:class:`Cost`): a Rényi-DP method has a :attr:`Cost.stage`, the
            others a :attr:`Cost.request`.
        label: The legend label of a curve of this method (the experiment's figures), or
            ``None`` (shown by its name).
    """

    name: str
    step_rdp: RdpFactory | None
    summary: str
    pld: PldComposer | None = None
    assumptions: tuple[str, ...] | None = None
    cost: Cost = Cost()
    label: str | None = None

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
        parameters: The parameters it requires (names of :data:`~.mechanisms.PARAMETERS` or
            of its :attr:`cli`).
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
            mechanisms of :func:`~.mechanisms.per_step_rdp` and :func:`~.epsilon.rounds_epsilon`.
        drivers: The parameters a refusal over the work limits suggests lowering, in order.
        reference_cost: The cost of one order range of its :attr:`references`.
        reference_labels: The legend labels of its references by name.
        cli: How the command line takes the parameters that are its own (those of
            :data:`~.mechanisms.COMMON_PARAMETERS` are shared).
        noise_multiplier: Whether the command line also takes its ``sigma`` as a noise
            multiplier with a sensitivity (the mechanisms of the protocols).
        beside_default: A method whose row the ``account`` command prints beside the default's
            when no method is named (``proven``), or ``None``.
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
    drivers: tuple[Driver, ...] = ROUND_DRIVERS
    reference_cost: StageCost | None = None
    reference_labels: Mapping[str, str] = dataclasses.field(default_factory=dict)
    cli: tuple[Parameter, ...] = ()
    noise_multiplier: bool = False
    beside_default: str | None = None

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
            A :class:`~.setting.RoundSetting`.

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
