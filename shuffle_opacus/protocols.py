"""The client-sampling protocols, one frozen record each, and the sensitivity convention.

:data:`PROTOCOLS` holds one :class:`Protocol` per protocol: ``full`` (accountant ``shuffle``,
all ``n`` clients report, Theorem 1), ``subsampled`` (``subsampled_shuffle``, ``m`` of ``n``
without replacement, Theorem 2) and ``checkin`` (``shuffled_checkin``, each client with
probability ``rate``). Every layer looks a protocol up here (:func:`get_protocol`,
:func:`protocol_for_accountant`) instead of comparing names; its methods and reference curves
are those of its mechanism in :data:`shuffle_opacus.analysis.MECHANISM_TABLE`. No torch import.

:func:`analysis_sigma` divides the noise multiplier by the sensitivity, in units of the clipping
norm ``C``: ``"replace-one"`` (2, the default and the guarantee), ``"paper"`` (1, the convention
of Liew & Takahashi, *Shuffle Gaussian Mechanism for Differential Privacy*, arXiv:2206.09569,
§5.2) or a number in :data:`SENSITIVITY_RANGE`. **Warning:** ``"paper"``, or any number below 2,
is **not** a DP guarantee for updates clipped to ``C``: it holds only if every clipped update
lies within that many ``C`` of every other. It warns once (:class:`PaperConventionWarning`) and
:func:`sensitivity_assumptions` says so. Units, accepted values and the counterexample:
docs/opacus.md, "Units and the sensitivity convention"; docs/maths.md, "Conventions and
assumptions".
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ._validation import _found, _real, check_int, check_positive, check_probability
from .analysis.mechanisms import Mechanism, RoundSetting, get_mechanism

if TYPE_CHECKING:
    from .sampling import ShuffleRoundSampler

__all__ = [
    "Protocol",
    "PROTOCOLS",
    "PROTOCOL_NAMES",
    "SENSITIVITIES",
    "SENSITIVITY_RANGE",
    "HistoryEntry",
    "get_protocol",
    "protocol_for_accountant",
    "resolve_sensitivity",
    "analysis_sigma",
    "sensitivity_label",
    "sensitivity_assumptions",
    "PaperConventionWarning",
]

#: Named sensitivity conventions, in units of the clipping norm C.
SENSITIVITIES: dict[str, float] = {"replace-one": 2.0, "paper": 1.0}

#: The numeric sensitivities accepted, in units of C: from the paper's convention (the differing
#: client's reports C apart) to replace-one (2C, the diameter of the clipping ball).
SENSITIVITY_RANGE: tuple[float, float] = (1.0, 2.0)

#: One entry of an accountant's history: (noise_multiplier, sample_rate, steps), as in Opacus.
HistoryEntry = tuple[float, float, int]


class PaperConventionWarning(UserWarning):
    """A sensitivity below replace-one's 2C: epsilon assumes all clipped updates are close."""


_WARNED: set[float] = set()


def _warn_below_replace_one(sensitivity: float) -> None:
    if sensitivity >= SENSITIVITIES["replace-one"] or sensitivity in _WARNED:
        return
    _WARNED.add(sensitivity)
    warnings.warn(
        f"sensitivity {sensitivity:g} C is below replace-one's 2 C (the paper's convention is "
        f"1 C), so it is no guarantee for updates clipped to C: its epsilon holds only if every "
        f"clipped update "
        f"lies within {sensitivity:g} C of every other (e.g. updates clipped to "
        f"{sensitivity / 2:g} C). Use sensitivity='replace-one' for a guarantee; see "
        f"docs/maths.md. (Shown once.)",
        PaperConventionWarning,
        stacklevel=3,
    )


def sensitivity_label(value: float | str) -> str:
    """Say what a sensitivity convention means, for results and summaries.

    Args:
        value: As for :func:`resolve_sensitivity`.

    Returns:
        One line: the convention, how it turns the noise multiplier into the analysis sigma,
        and, below replace-one, the condition under which its epsilon holds.

    Raises:
        ValueError: as :func:`resolve_sensitivity`.
    """
    sens = _resolve(value)
    if sens == SENSITIVITIES["replace-one"]:
        return "replace-one (clipped updates up to 2C apart; analysis sigma = noise_multiplier / 2)"
    name = "the paper's convention, " if sens == SENSITIVITIES["paper"] else ""
    return (
        f"{name}{sens:g} C (analysis sigma = noise_multiplier / {sens:g}): holds only if every "
        f"clipped update lies within {sens:g} C of every other, not for updates clipped to C"
    )


def sensitivity_assumptions(value: float | str) -> tuple[str, ...]:
    """Return the assumptions a sensitivity below 2 C adds to the guarantee (none at 2 C).

    Raises:
        ValueError: as :func:`resolve_sensitivity`.
    """
    sens = _resolve(value)
    if sens >= SENSITIVITIES["replace-one"]:
        return ()
    return (
        f"every clipped update lies within {sens:g} C of every other (sensitivity {sens:g} C, "
        f"below the clipping ball's diameter 2C)",
    )


def resolve_sensitivity(value: float | str) -> float:
    """Return the sensitivity in units of the clipping norm.

    Args:
        value: ``"replace-one"`` (2.0), ``"paper"`` (1.0) or a real number in
            :data:`SENSITIVITY_RANGE` (``[1, 2]``).

    Returns:
        The sensitivity as a float.

    Raises:
        ValueError: for an unknown name, a number outside ``[1, 2]`` (with the reason), or a
            value that is neither a name nor a real number (a bool or a tensor, say).

    Warns:
        PaperConventionWarning: once per value below 2 in a process (what it assumes).
    """
    sens = _resolve(value)
    _warn_below_replace_one(sens)
    return sens


def _resolve(value: float | str) -> float:
    low, high = SENSITIVITY_RANGE
    if isinstance(value, str):
        if value not in SENSITIVITIES:
            names = ", ".join(repr(k) for k in SENSITIVITIES)
            raise ValueError(
                f"sensitivity must be one of {names} or a number in [{low:g}, {high:g}] (in units "
                f"of the clipping norm). Found {value!r}."
            )
        return SENSITIVITIES[value]
    number = _real(value)
    if number is None or not low <= number <= high:
        raise ValueError(
            f"sensitivity must be 'replace-one' (2), 'paper' (1) or a number in [{low:g}, "
            f"{high:g}] in units of the clipping norm: clipped reports are at most 2C apart, and "
            f"below C the guarantee would rest on the data, not on the clipping. Found "
            f"{_found(value)}."
        )
    return number


def analysis_sigma(noise_multiplier: float, sensitivity: float | str) -> float:
    """Return the analysis sigma of a noise multiplier: ``noise_multiplier / sensitivity``.

    Args:
        noise_multiplier: Each client's noise standard deviation divided by the clipping norm.
        sensitivity: See :func:`resolve_sensitivity` (in units of the clipping norm).

    Returns:
        The noise standard deviation in units of the L2 distance between the differing
        client's two possible reports (the paper's sigma).

    Raises:
        ValueError: for a non-positive noise multiplier or an invalid sensitivity.
    """
    return check_positive("noise_multiplier", noise_multiplier) / resolve_sensitivity(sensitivity)


SamplerFactory = Callable[..., "ShuffleRoundSampler"]


def _checkin_sampler(
    n: int, *, rate: float | None, sample_size: int | None, rounds: int, seed: int | None,
    start_round: int, secure: bool = False,
) -> ShuffleRoundSampler:  # fmt: skip
    from .sampling import ShuffledCheckInSampler

    return ShuffledCheckInSampler(n, rate, rounds, seed, start_round=start_round, secure=secure)  # type: ignore[arg-type]


def _fixed_size_sampler(
    n: int, *, rate: float | None, sample_size: int | None, rounds: int, seed: int | None,
    start_round: int, secure: bool = False,
) -> ShuffleRoundSampler:  # fmt: skip
    from .sampling import FixedSizeShuffledSampler

    m = n if sample_size is None else int(sample_size)
    return FixedSizeShuffledSampler(n, m, rounds, seed, start_round=start_round, secure=secure)


@dataclass(frozen=True)
class Protocol:
    """How clients join a round, and everything the layers above need to know about it.

    Attributes:
        name: ``full``, ``subsampled`` or ``checkin``.
        accountant: Name of its Opacus accountant.
        mechanism: Name of its analysis mechanism (a key of
            :data:`shuffle_opacus.analysis.MECHANISM_TABLE`).
        parameter: The protocol's own parameter: ``"rate"`` (check-in probability),
            ``"sample_size"`` (clients per round) or ``None`` (every client, every round).
        summary: Who reports in a round, in words.
        sampler: Name of the matching sampler, for messages.
        make_sampler: ``make_sampler(n, rate=..., sample_size=..., rounds=..., seed=...,
            start_round=..., secure=False)`` builds that sampler (imports torch).
    """

    name: str
    accountant: str
    mechanism: str
    parameter: str | None
    summary: str
    sampler: str
    make_sampler: SamplerFactory

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

    @property
    def fixed_size(self) -> bool:
        """True when every round has the same, known number of reports."""
        return self.parameter != "rate"

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
        population = check_int("population", population, minimum=1)
        if self.parameter == "rate":
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
        if rate is not None:
            raise ValueError(
                f"rate is not a parameter of the {self.name} protocol. Found {rate!r}."
            )
        if self.parameter == "sample_size":
            if sample_size is None:
                raise ValueError(
                    f"sample_size is required for the {self.name} protocol; it must be an "
                    f"integer in [1, {population}]."
                )
            m = check_int("sample_size", sample_size, minimum=1, maximum=population)
            return m / population
        if sample_size is not None and sample_size != population:
            raise ValueError(
                f"sample_size of the {self.name} protocol must equal population ({population}). "
                f"Found {sample_size!r}."
            )
        return 1.0

    def reports_per_round(self, *, population: int, sample_size: int | None) -> int | None:
        """Return the number of reports of every round (``None`` when it varies: check-in)."""
        if self.parameter == "rate":
            return None
        return population if self.parameter is None else sample_size

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
        analysis = self.analysis
        if self.parameter == "rate":
            rate = check_probability("sample_rate", sample_rate)
            return analysis.setting(sigma=sigma, n=population, rate=rate)
        if self.parameter == "sample_size":
            q = check_probability("sample_rate", sample_rate)
            m = round(q * population)
            if m < 1 or abs(m - q * population) > 1e-6 * max(1.0, q * population):
                raise ValueError(
                    f"sample_rate of the {self.name} protocol must be m / population for an "
                    f"integer m in [1, {population}]. Found {sample_rate!r}."
                )
            return analysis.setting(sigma=sigma, n=population, m=m)
        if sample_rate != 1.0:
            raise ValueError(
                f"sample_rate of the {self.name} protocol ({self.accountant} accountant) must be "
                f"1. Found {sample_rate!r}."
            )
        return analysis.setting(sigma=sigma, n=population)


PROTOCOLS: dict[str, Protocol] = {
    p.name: p
    for p in (
        Protocol(
            name="full",
            accountant="shuffle",
            mechanism="shuffle",
            parameter=None,
            summary="all n clients report every round",
            sampler="FixedSizeShuffledSampler with m = n",
            make_sampler=_fixed_size_sampler,
        ),
        Protocol(
            name="subsampled",
            accountant="subsampled_shuffle",
            mechanism="subsampled",
            parameter="sample_size",
            summary="m of the n clients, drawn without replacement, report every round",
            sampler="FixedSizeShuffledSampler with m < n",
            make_sampler=_fixed_size_sampler,
        ),
        Protocol(
            name="checkin",
            accountant="shuffled_checkin",
            mechanism="checkin",
            parameter="rate",
            summary="each client checks in independently with probability rate",
            sampler="ShuffledCheckInSampler",
            make_sampler=_checkin_sampler,
        ),
    )
}
"""The protocols by name."""

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
