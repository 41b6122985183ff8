"""The client-sampling protocols: one small class per way of sampling, one record per protocol.

:data:`PROTOCOLS` holds one record per protocol: ``full`` (a :class:`FullParticipation`,
accountant ``shuffle``, all ``n`` clients report, Theorem 1), ``subsampled`` (a
:class:`FixedSize`, ``subsampled_shuffle``, ``m`` of ``n`` without replacement, Theorem 2) and
``checkin`` (a :class:`CheckIn`, ``shuffled_checkin``, each client with probability ``rate``).
Each class carries its protocol's behaviour (sample rate, reports per round, the analysis
setting of a round, its parameter's keyword and flag, its sampler), so every layer asks the
record (:func:`get_protocol`, :func:`protocol_for_accountant`) instead of comparing names. A new
protocol is a subclass and a record (:func:`register_protocol`). Its methods and reference
curves are those of its mechanism in :data:`shuffle_opacus.analysis.MECHANISM_TABLE`. The
sensitivity convention lives in :mod:`shuffle_opacus.accounting.sensitivity`; its names are
re-exported here. No torch import.
"""

from __future__ import annotations

import abc
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, ClassVar

from ..analysis.mechanisms import Mechanism, RoundSetting, get_mechanism
from ..common.validation import check_int, check_probability
from .sensitivity import (
    SENSITIVITIES,
    SENSITIVITY_RANGE,
    PaperConventionWarning,
    analysis_sigma,
    resolve_sensitivity,
    sensitivity_assumptions,
    sensitivity_label,
)

__all__ = [
    "Protocol",
    "FullParticipation",
    "FixedSize",
    "CheckIn",
    "PROTOCOLS",
    "PROTOCOL_NAMES",
    "SENSITIVITIES",
    "SENSITIVITY_RANGE",
    "HistoryEntry",
    "get_protocol",
    "protocol_for_accountant",
    "register_protocol",
    "unregister_protocol",
    "registered_protocol",
    "register_sampler",
    "resolve_sensitivity",
    "analysis_sigma",
    "sensitivity_label",
    "sensitivity_assumptions",
    "PaperConventionWarning",
]

#: One entry of an accountant's history: (noise_multiplier, sample_rate, steps), as in Opacus.
HistoryEntry = tuple[float, float, int]

#: Builds a protocol's sampler: ``(protocol, n, *, rate, sample_size, rounds, seed,
#: start_round, secure) -> sampler``, the keywords of :meth:`Protocol.make_sampler`.
SamplerBuilder = Callable[..., Any]

#: Protocol class -> the builder of its samplers (:func:`register_sampler`).
_SAMPLERS: dict[type, SamplerBuilder] = {}


def register_sampler(protocol: type[Protocol], builder: SamplerBuilder) -> None:
    """Make ``builder`` build the samplers of ``protocol`` and its subclasses.

    The training layer registers the built-in protocols' samplers when
    :mod:`shuffle_opacus.engine.sampling` is imported, so that this layer stays free of torch.

    Args:
        protocol: A :class:`Protocol` subclass.
        builder: Called as :meth:`Protocol.make_sampler` is, with the protocol first.

    Raises:
        TypeError: if ``protocol`` is not a :class:`Protocol` subclass or ``builder`` is not
            callable.
    """
    if not (isinstance(protocol, type) and issubclass(protocol, Protocol)):
        raise TypeError(f"protocol must be a Protocol subclass. Found {protocol!r}.")
    if not callable(builder):
        raise TypeError(f"builder must be callable. Found {builder!r}.")
    _SAMPLERS[protocol] = builder


@dataclass(frozen=True)
class Protocol(abc.ABC):
    """How clients join a round, and everything the layers above need to know about it.

    One subclass per way of sampling (:class:`FullParticipation`, :class:`FixedSize`,
    :class:`CheckIn`) carries the behaviour; a record (an instance) names the accountant and the
    mechanism. Callers ask the record (:meth:`sample_rate`, :meth:`make_sampler`, ...) rather
    than branch on which protocol it is.

    Attributes:
        name: ``full``, ``subsampled`` or ``checkin`` (or a registered one's).
        accountant: Name of its Opacus accountant.
        mechanism: Name of its analysis mechanism (a key of
            :data:`shuffle_opacus.analysis.MECHANISM_TABLE`).
        summary: Who reports in a round, in words.
        sampler: Name of the matching sampler, for messages.
        option: Keyword (and configuration field) of the protocol's own parameter: ``"rate"``,
            ``"sample_size"`` or ``None`` (nothing to choose).
        flag: Its command-line flag (``--rate``, ``--m``), or ``None``.
        fixed_size: True when every round has the same, known number of reports.
        fixed_rate: The sample rate of every round whatever the population (1 for ``full``),
            or ``None``.
    """

    name: str
    accountant: str
    mechanism: str
    summary: str
    sampler: str

    option: ClassVar[str | None] = None
    flag: ClassVar[str | None] = None
    fixed_size: ClassVar[bool] = True
    fixed_rate: ClassVar[float | None] = None

    @property
    def parameter(self) -> str | None:
        """Deprecated (kept for one release): the same as :attr:`option`.

        Use :attr:`option` for the keyword's name, :attr:`flag` for the command-line flag, and
        the record's methods instead of comparing this string.
        """
        warnings.warn(
            "Protocol.parameter is deprecated: use Protocol.option (the keyword), Protocol.flag "
            "(the command-line flag) or the record's methods",
            DeprecationWarning,
            stacklevel=2,
        )
        return self.option

    @property
    def analysis(self) -> Mechanism:
        """The analysis mechanism's table entry."""
        return get_mechanism(self.mechanism)

    @property
    def methods(self) -> tuple[str, ...]:
        """Methods of the analysis, the default (the tightest sound one, ``pld``) first."""
        return self.analysis.method_names

    @property
    def fallback(self) -> str | None:
        """The Rényi bound the default falls back to where ``pld`` is beyond the work limits."""
        return self.analysis.fallback

    @property
    def references(self) -> tuple[str, ...]:
        """Reference curves of the analysis (``no-shuffle``, ``central``)."""
        return tuple(self.analysis.references)

    def check_method(self, method: str | None) -> str | None:
        """Return ``method`` if the protocol's analysis offers it; ``None`` stays ``None``.

        ``None`` means the default: ``pld`` (the tightest sound method) where the work limits
        allow it, else :attr:`fallback`; the results say which was used.

        Raises:
            ValueError: for a method the analysis does not offer.
        """
        if method is None:
            return None
        if method not in self.methods:
            raise ValueError(
                f"method must be one of {', '.join(self.methods)} for the {self.name} protocol. "
                f"Found {method!r}."
            )
        return method

    @abc.abstractmethod
    def sample_rate(
        self, *, population: int, rate: float | None = None, sample_size: int | None = None
    ) -> float:
        """Return the per-round inclusion probability of one client.

        Args:
            population: Number of clients ``n`` (integer >= 1).
            rate: Check-in probability (``checkin`` only), in ``(0, 1]``.
            sample_size: Clients per round ``m`` (``subsampled`` only), in ``[1, n]``.

        Returns:
            1 for ``full``, ``m / n`` for ``subsampled``, ``rate`` for ``checkin``.

        Raises:
            ValueError: on a missing, extraneous or out-of-range parameter.
        """

    def check_sampling(
        self, *, population: int, accountant: str, rate: float | None, sample_size: int | None
    ) -> float:
        """Check a sampler's arguments as :meth:`sample_rate` does, naming a better accountant.

        Args:
            population: Number of clients ``n``.
            accountant: The accountant's name, for messages.
            rate: As for :meth:`sample_rate`.
            sample_size: As for :meth:`sample_rate`.

        Returns:
            The per-round sample rate.

        Raises:
            ValueError: as :meth:`sample_rate`; where another protocol fits the arguments, the
                message names its accountant.
        """
        return self.sample_rate(population=population, rate=rate, sample_size=sample_size)

    @abc.abstractmethod
    def reports_per_round(self, *, population: int, sample_size: int | None) -> int | None:
        """Return the number of reports of every round (``None`` when it varies: check-in)."""

    def recorded_sample_size(self, sample_size: int | None) -> int | None:
        """Return the sample size an accountant of this protocol keeps (checked beforehand).

        Args:
            sample_size: The configured clients per round (already checked by
                :meth:`sample_rate`).

        Returns:
            ``m`` where it is the protocol's own parameter, else ``None``.
        """
        return None

    @abc.abstractmethod
    def round_setting(self, *, population: int, sigma: float, sample_rate: float) -> RoundSetting:
        """Return the analysis setting of a round recorded as ``(noise, sample_rate)``.

        Args:
            population: Number of clients ``n``.
            sigma: Analysis sigma (see :func:`analysis_sigma`).
            sample_rate: The rate the accountant recorded for the round.

        Returns:
            A validated :class:`~shuffle_opacus.analysis.RoundSetting`.

        Raises:
            ValueError: if the rate does not fit the protocol (``full``: 1; ``subsampled``:
                ``m / n`` for an integer ``m``).
        """

    def make_sampler(
        self, n: int, *, rate: float | None, sample_size: int | None, rounds: int,
        seed: int | None, start_round: int, secure: bool = False,
    ) -> Any:  # fmt: skip
        """Build the protocol's sampler; the arguments are checked already.

        The built-in protocols' samplers live in the training layer
        (:mod:`shuffle_opacus.engine.sampling`), which registers them with
        :func:`register_sampler` when it is imported; this layer never imports torch. A new
        protocol either registers a builder the same way or overrides this method.

        Args:
            n: Number of clients.
            rate: Check-in probability (check-in protocols).
            sample_size: Clients per round (fixed-size protocols; ``None`` means ``n``).
            rounds: Rounds of one pass.
            seed: Seed of the rounds, or ``None``.
            start_round: The first round.
            secure: Draw every round from the operating system.

        Returns:
            The sampler (a :class:`~shuffle_opacus.engine.sampling.ShuffleRoundSampler`).

        Raises:
            LookupError: if no sampler is registered for the protocol's class or its bases.
        """
        for cls in type(self).__mro__:
            builder = _SAMPLERS.get(cls)
            if builder is not None:
                return builder(
                    self, n, rate=rate, sample_size=sample_size, rounds=rounds, seed=seed,
                    start_round=start_round, secure=secure,
                )  # fmt: skip
        raise LookupError(
            f"the {self.name} protocol has no sampler: import shuffle_opacus.engine.sampling "
            f"(it registers the built-in ones), register one with register_sampler, or override "
            f"make_sampler."
        )

    def _no_rate(self, rate: float | None) -> None:
        if rate is not None:
            raise ValueError(
                f"rate is not a parameter of the {self.name} protocol. Found {rate!r}."
            )


@dataclass(frozen=True)
class FullParticipation(Protocol):
    """All ``n`` clients report every round (Theorem 1); no parameter to choose."""

    fixed_rate: ClassVar[float | None] = 1.0

    def sample_rate(
        self, *, population: int, rate: float | None = None, sample_size: int | None = None
    ) -> float:
        """Return 1 (see :meth:`Protocol.sample_rate`); ``sample_size`` may only be ``n``.

        Raises:
            ValueError: for a rate, or a sample size other than ``population``.
        """
        population = check_int("population", population, minimum=1)
        self._no_rate(rate)
        if sample_size is not None and sample_size != population:
            raise ValueError(
                f"sample_size of the {self.name} protocol must equal population ({population}). "
                f"Found {sample_size!r}."
            )
        return 1.0

    def check_sampling(
        self, *, population: int, accountant: str, rate: float | None, sample_size: int | None
    ) -> float:
        """As :meth:`Protocol.check_sampling`; fewer clients per round point to ``subsampled``.

        Raises:
            ValueError: as :meth:`sample_rate`.
        """
        if sample_size is not None and sample_size != population:
            raise ValueError(
                f"sample_size of the {accountant} accountant must equal the number of clients "
                f"({population}); use {PROTOCOLS['subsampled'].accountant} for fewer clients "
                f"per round. Found {sample_size!r}."
            )
        return self.sample_rate(population=population, rate=rate, sample_size=sample_size)

    def reports_per_round(self, *, population: int, sample_size: int | None) -> int | None:
        """Return ``population``: every client reports."""
        return population

    def round_setting(self, *, population: int, sigma: float, sample_rate: float) -> RoundSetting:
        """See :meth:`Protocol.round_setting`; the rate must be 1.

        Raises:
            ValueError: for a rate other than 1.
        """
        if sample_rate != 1.0:
            raise ValueError(
                f"sample_rate of the {self.name} protocol ({self.accountant} accountant) must be "
                f"1. Found {sample_rate!r}."
            )
        return self.analysis.setting(sigma=sigma, n=population)


@dataclass(frozen=True)
class FixedSize(Protocol):
    """``m`` of the ``n`` clients, drawn without replacement, report every round (Theorem 2)."""

    option: ClassVar[str | None] = "sample_size"
    flag: ClassVar[str | None] = "--m"

    def sample_rate(
        self, *, population: int, rate: float | None = None, sample_size: int | None = None
    ) -> float:
        """Return ``m / n`` (see :meth:`Protocol.sample_rate`).

        Raises:
            ValueError: for a rate, or a missing or out-of-range ``sample_size``.
        """
        population = check_int("population", population, minimum=1)
        self._no_rate(rate)
        if sample_size is None:
            raise ValueError(
                f"sample_size is required for the {self.name} protocol; it must be an "
                f"integer in [1, {population}]."
            )
        m = check_int("sample_size", sample_size, minimum=1, maximum=population)
        return m / population

    def check_sampling(
        self, *, population: int, accountant: str, rate: float | None, sample_size: int | None
    ) -> float:
        """As :meth:`Protocol.check_sampling`; all ``n`` clients per round point to ``full``.

        Raises:
            ValueError: as :meth:`sample_rate`, and for ``sample_size == population``.
        """
        if sample_size == population:
            raise ValueError(
                f"sample_size must be an integer in [1, {population - 1}] for {accountant}; with "
                f"all {population} clients per round use the {PROTOCOLS['full'].accountant} "
                f"accountant. Found {sample_size!r}."
            )
        return self.sample_rate(population=population, rate=rate, sample_size=sample_size)

    def reports_per_round(self, *, population: int, sample_size: int | None) -> int | None:
        """Return ``sample_size``: every round has ``m`` reports."""
        return sample_size

    def recorded_sample_size(self, sample_size: int | None) -> int | None:
        """Return ``m`` as an ``int`` (see :meth:`Protocol.recorded_sample_size`)."""
        return None if sample_size is None else int(sample_size)

    def round_setting(self, *, population: int, sigma: float, sample_rate: float) -> RoundSetting:
        """See :meth:`Protocol.round_setting`; the rate must be ``m / n`` for an integer ``m``.

        Raises:
            ValueError: for a rate that is not ``m / population``.
        """
        q = check_probability("sample_rate", sample_rate)
        m = round(q * population)
        if m < 1 or abs(m - q * population) > 1e-6 * max(1.0, q * population):
            raise ValueError(
                f"sample_rate of the {self.name} protocol must be m / population for an "
                f"integer m in [1, {population}]. Found {sample_rate!r}."
            )
        return self.analysis.setting(sigma=sigma, n=population, m=m)


@dataclass(frozen=True)
class CheckIn(Protocol):
    """Each client checks in independently with probability ``rate``; rounds vary in size."""

    option: ClassVar[str | None] = "rate"
    flag: ClassVar[str | None] = "--rate"
    fixed_size: ClassVar[bool] = False

    def sample_rate(
        self, *, population: int, rate: float | None = None, sample_size: int | None = None
    ) -> float:
        """Return ``rate`` (see :meth:`Protocol.sample_rate`).

        Raises:
            ValueError: for a sample size, or a missing or out-of-range rate.
        """
        check_int("population", population, minimum=1)
        if sample_size is not None:
            raise ValueError(
                f"sample_size is not a parameter of the {self.name} protocol (use rate). "
                f"Found {sample_size!r}."
            )
        if rate is None:
            raise ValueError(
                f"rate is required for the {self.name} protocol; it must be in (0, 1]."
            )
        return check_probability("rate", rate)

    def reports_per_round(self, *, population: int, sample_size: int | None) -> int | None:
        """Return ``None``: the number of check-ins varies."""
        return None

    def round_setting(self, *, population: int, sigma: float, sample_rate: float) -> RoundSetting:
        """See :meth:`Protocol.round_setting`; any rate in ``(0, 1]``.

        Raises:
            ValueError: for a rate outside ``(0, 1]``.
        """
        rate = check_probability("sample_rate", sample_rate)
        return self.analysis.setting(sigma=sigma, n=population, rate=rate)


_BUILT_IN: tuple[Protocol, ...] = (
    FullParticipation(
        name="full",
        accountant="shuffle",
        mechanism="shuffle",
        summary="all n clients report every round",
        sampler="FixedSizeShuffledSampler with m = n",
    ),
    FixedSize(
        name="subsampled",
        accountant="subsampled_shuffle",
        mechanism="subsampled",
        summary="m of the n clients, drawn without replacement, report every round",
        sampler="FixedSizeShuffledSampler with m < n",
    ),
    CheckIn(
        name="checkin",
        accountant="shuffled_checkin",
        mechanism="checkin",
        summary="each client checks in independently with probability rate",
        sampler="ShuffledCheckInSampler",
    ),
)

PROTOCOLS: dict[str, Protocol] = {p.name: p for p in _BUILT_IN}
"""The protocols by name (the built-in three, and any added with :func:`register_protocol`)."""

#: The built-in protocols' names.
PROTOCOL_NAMES: tuple[str, ...] = tuple(PROTOCOLS)

_BY_ACCOUNTANT: dict[str, Protocol] = {p.accountant: p for p in PROTOCOLS.values()}


def get_protocol(name: str | Protocol) -> Protocol:
    """Return the record of protocol ``name`` (a record is returned as it is).

    Raises:
        ValueError: for an unknown name.
    """
    if isinstance(name, Protocol):
        return name
    if name not in PROTOCOLS:
        raise ValueError(f"protocol must be one of {', '.join(PROTOCOLS)}. Found {name!r}.")
    return PROTOCOLS[name]


def protocol_for_accountant(name: str) -> Protocol:
    """Return the protocol of the Opacus accountant called ``name``.

    Raises:
        ValueError: for a name that is not one of the package's accountants.
    """
    if name not in _BY_ACCOUNTANT:
        raise ValueError(f"accountant must be one of {', '.join(_BY_ACCOUNTANT)}. Found {name!r}.")
    return _BY_ACCOUNTANT[name]


def register_protocol(protocol: Protocol) -> Protocol:
    """Add a protocol record to :data:`PROTOCOLS` (and its accountant to the lookups).

    A new way of sampling is a :class:`Protocol` subclass (with its sampler) and one record of
    it; its accountant is a :class:`~shuffle_opacus.engine.accountants.ShuffleAccountantBase`
    subclass whose ``name`` is the record's ``accountant``. :func:`registered_protocol` removes it
    again.

    Args:
        protocol: The record; its name and accountant must be new, its mechanism known.

    Returns:
        ``protocol``.

    Raises:
        ValueError: for a value that is not a record, a name or accountant already taken, or
            an unknown mechanism.
    """
    if not isinstance(protocol, Protocol):
        raise ValueError(f"protocol must be a Protocol record. Found {protocol!r}.")
    if protocol.name in PROTOCOLS or protocol.accountant in _BY_ACCOUNTANT:
        raise ValueError(
            f"protocol name and accountant must be new; {protocol.name!r} or "
            f"{protocol.accountant!r} is taken (taken: {', '.join(PROTOCOLS)})."
        )
    get_mechanism(protocol.mechanism)
    PROTOCOLS[protocol.name] = protocol
    _BY_ACCOUNTANT[protocol.accountant] = protocol
    return protocol


def unregister_protocol(name: str) -> Protocol:
    """Remove a protocol added with :func:`register_protocol`; return its record.

    Raises:
        ValueError: for a built-in protocol or a name that is not registered.
    """
    if name in PROTOCOL_NAMES or name not in PROTOCOLS:
        added = [k for k in PROTOCOLS if k not in PROTOCOL_NAMES]
        raise ValueError(
            f"name must be a protocol added with register_protocol ({', '.join(added) or 'none'}"
            f"). Found {name!r}."
        )
    protocol = PROTOCOLS.pop(name)
    del _BY_ACCOUNTANT[protocol.accountant]
    return protocol


@contextmanager
def registered_protocol(protocol: Protocol) -> Iterator[Protocol]:
    """Register ``protocol`` for the ``with`` block, then remove it (see :func:`register_protocol`).

    Raises:
        ValueError: as :func:`register_protocol`.
    """
    register_protocol(protocol)
    try:
        yield protocol
    finally:
        unregister_protocol(protocol.name)
