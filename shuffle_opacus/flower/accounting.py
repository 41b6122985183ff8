"""An accountant of Flower's privacy-accounting shape for shuffled check-in rounds.

Flower 1.42 defines a ``PrivacyAccountant`` protocol (``flwr.supercore.privacy_accounting``:
``compose(event, count)``, ``get_epsilon``, ``get_delta``, ``get_privacy_spent``,
``would_exceed``, ``state_dict``/``load_state_dict``) with a Rényi backend for the sampled
Gaussian only. :class:`ShuffleCheckInAccountant` has the same members and accounts
:class:`ShuffleCheckInEvent` rounds (locally noised reports of the nodes that checked in, seen
as an anonymous multiset or as their sum) under replace-one adjacency of one node, by the tight
method (``pld``, resting on Theorem 1's pair) or the proven one. Its rounds are a
:class:`~shuffle_opacus.accounting.ledger.RoundLedger` (noiseless rounds included). It needs no
flwr module, so it works with flwr 1.41 and 1.42; the strategies of :mod:`.checkin_base` keep
one, built over their ledger: a round composed into it is the strategy's round, once.
"""

from __future__ import annotations

import dataclasses
import enum
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..accounting.ledger import HistoryEntry, RoundLedger
from ..accounting.protocols import get_protocol, resolve_sensitivity, sensitivity_assumptions
from ..analysis.epsilon import proven_note
from ..analysis.rdp.conversion import EpsilonResult
from ..common.validation import check_delta, check_int, check_positive, check_probability

__all__ = [
    "NeighboringRelation",
    "PrivacySpent",
    "SamplingMethod",
    "ShuffleAccountingConfig",
    "ShuffleCheckInAccountant",
    "ShuffleCheckInEvent",
]

_SCHEMA = 1
_BACKEND = "shuffle_opacus.checkin"
_CHECKIN = get_protocol("checkin")


class NeighboringRelation(str, enum.Enum):
    """Which datasets are neighbours (the values of Flower's enum of the same name)."""

    ADD_OR_REMOVE_ONE = "add-or-remove-one"
    REPLACE_ONE = "replace-one"


class SamplingMethod(str, enum.Enum):
    """How nodes take part in a round (the values of Flower's enum of the same name).

    Check-in is ``poisson``: every node flips its own coin with probability ``rate``.
    """

    POISSON = "poisson"
    WITHOUT_REPLACEMENT = "without-replacement"
    NO_AMPLIFICATION = "no-amplification"


def _value(option: object) -> object:
    """Return the string value of an enum member (ours or flwr's), or the object itself."""
    return option.value if isinstance(option, enum.Enum) else option


@dataclass(frozen=True)
class ShuffleAccountingConfig:
    """What :class:`ShuffleCheckInAccountant` accounts, with Flower's ``PrivacyConfig`` fields.

    Attributes:
        target_delta: δ of :meth:`ShuffleCheckInAccountant.get_privacy_spent`, in ``(0, 1)``.
        population_size: ``n``, the nodes that may check in.
        neighboring_relation: Only ``replace-one`` (one node's data replaced); Flower's or this
            module's enum member, or its string.
        sampling_method: Only ``poisson`` (check-in: each node's own coin).
        max_epsilon: Budget of :meth:`ShuffleCheckInAccountant.would_exceed`, or ``None``.
        method: A method of the check-in analysis: ``None`` (the tightest sound one, ``pld``,
            resting on Theorem 1's pair), ``"proven"`` (published theorems only, replace-one
            whatever ``sensitivity``), or another (``account checkin --help`` lists them).
        sensitivity: In units of the clipping norm; ``"replace-one"`` (2) is the guarantee.
    """

    target_delta: float
    population_size: int
    neighboring_relation: Any = NeighboringRelation.REPLACE_ONE
    sampling_method: Any = SamplingMethod.POISSON
    max_epsilon: float | None = None
    method: str | None = None
    sensitivity: float | str = "replace-one"

    def __post_init__(self) -> None:
        """Check every field (one-line errors naming it)."""
        check_delta(self.target_delta)
        check_int("population_size", self.population_size, minimum=1)
        relation = _value(self.neighboring_relation)
        if relation != NeighboringRelation.REPLACE_ONE.value:
            raise ValueError(
                "neighboring_relation must be 'replace-one' (a shuffled report's privacy is "
                f"stated for one node's data replaced). Found {relation!r}."
            )
        sampling = _value(self.sampling_method)
        if sampling != SamplingMethod.POISSON.value:
            raise ValueError(
                "sampling_method must be 'poisson' (check-in: every node flips its own coin). "
                f"Found {sampling!r}."
            )
        if self.max_epsilon is not None:
            check_positive("max_epsilon", self.max_epsilon)
        _CHECKIN.check_method(self.method)
        resolve_sensitivity(self.sensitivity)


@dataclass(frozen=True)
class ShuffleCheckInEvent:
    """One shuffled check-in round (or ``count`` identical ones, see ``compose``).

    Every node checks in with probability ``rate``, clips its update to ``C`` and adds Gaussian
    noise of std ``noise_multiplier * C``; the server sees the reports of those who checked in
    as an anonymous multiset (trusted-server mode) or their sum (secure aggregation).

    Attributes:
        noise_multiplier: Local noise over the clipping norm, ``>= 0`` (0: ε is infinite).
        rate: Check-in probability, in ``(0, 1]``.
        population_size: ``n``; must be the configuration's.
    """

    noise_multiplier: float
    rate: float
    population_size: int

    def __post_init__(self) -> None:
        """Check every field (one-line errors naming it)."""
        value = self.noise_multiplier
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
            raise ValueError(f"noise_multiplier must be a finite float >= 0. Found {value!r}.")
        if not math.isfinite(value):
            raise ValueError(f"noise_multiplier must be a finite float >= 0. Found {value!r}.")
        check_probability("rate", self.rate)
        check_int("population_size", self.population_size, minimum=1)


@dataclass(frozen=True)
class PrivacySpent:
    """Cumulative spending, with Flower's ``PrivacySpent`` fields and what it rests on.

    Attributes:
        epsilon: ε at ``delta``.
        delta: δ.
        num_releases: Rounds composed.
        accounting_method: ``"shuffle-pld"`` or ``"shuffle-proven"`` (or the Rényi fallback's
            method where ``pld`` is beyond the work limits).
        optimal_order: The Rényi order for a Rényi method, else ``None``.
        note: How the number was obtained (proven route, fallback), or ``None``.
        neighboring_relation: Always ``"replace-one"`` (one node's data replaced).
        sensitivity: The sensitivity in units of the clipping norm (2: replace-one).
        assumptions: What the number rests on (Theorem 1's pair for ``pld``, secret noise,
            shuffle and coins).
    """

    epsilon: float
    delta: float
    num_releases: int
    accounting_method: str
    optimal_order: float | None = None
    note: str | None = None
    neighboring_relation: str = NeighboringRelation.REPLACE_ONE.value
    sensitivity: float = 2.0
    assumptions: tuple[str, ...] = ()


class ShuffleCheckInAccountant:
    """Accountant of shuffled check-in rounds with the members of Flower's protocol.

    ε is :func:`shuffle_opacus.history_epsilon` of the composed rounds (protocol ``checkin``,
    adaptive composition, replace-one adjacency of one node), by ``config.method``.

    Args:
        config: A :class:`ShuffleAccountingConfig`.
        ledger: The ledger to compose into (a strategy passes its own, so that its rounds have
            one history); a new, empty one by default.

    Raises:
        ValueError: when ``config`` is not a :class:`ShuffleAccountingConfig`.

    Attributes:
        ledger: The composed rounds, a :class:`~shuffle_opacus.accounting.ledger.RoundLedger`
            of ``(noise_multiplier, rate, count)`` entries (noiseless rounds included; every
            event's population is the configuration's), which also keeps the last few results.
    """

    def __init__(self, config: ShuffleAccountingConfig, ledger: RoundLedger | None = None) -> None:
        if not isinstance(config, ShuffleAccountingConfig):
            raise ValueError(
                "config must be a ShuffleAccountingConfig (Flower's PrivacyConfig cannot state "
                f"check-in under replace-one). Found {type(config).__name__}."
            )
        self._config = config
        self.ledger = RoundLedger() if ledger is None else ledger

    @property
    def config(self) -> ShuffleAccountingConfig:
        """The configuration."""
        return self._config

    @property
    def num_releases(self) -> int:
        """Rounds composed so far."""
        return self.ledger.rounds

    def _check_event(self, event: object, count: int) -> ShuffleCheckInEvent:
        if not isinstance(event, ShuffleCheckInEvent):
            raise ValueError(
                "event must be a ShuffleCheckInEvent (a GaussianPrivacyEvent describes noise "
                f"added centrally to a sampled sum, not shuffled reports). Found "
                f"{type(event).__name__}."
            )
        if event.population_size != self._config.population_size:
            raise ValueError(
                f"event.population_size must be the configuration's "
                f"{self._config.population_size}. Found {event.population_size}."
            )
        check_int("count", count, minimum=1)
        return event

    def compose(self, event: ShuffleCheckInEvent, count: int = 1) -> None:
        """Account ``count`` rounds of ``event`` (merged with the last ones if they are equal).

        Raises:
            ValueError: for an event of another type or population, or ``count < 1``.
        """
        event = self._check_event(event, count)
        self.ledger.record(event.noise_multiplier, event.rate, count)

    def _history(self, then: tuple[ShuffleCheckInEvent, int] | None) -> tuple[HistoryEntry, ...]:
        """Return the entries, then ``then``'s rounds as one more entry (never merged)."""
        if then is None:
            return tuple(self.ledger.entries)
        event, count = self._check_event(*then), then[1]
        return (*self.ledger.entries, (event.noise_multiplier, event.rate, count))

    def _analysis(
        self, delta: float, history: tuple[HistoryEntry, ...], method: str | None
    ) -> EpsilonResult:
        """Return the result of ``history`` (no trivial ε) by ``method``, kept by the ledger.

        The proven method is taken under replace-one adjacency, any other under the
        configuration's sensitivity.
        """
        sensitivity = "replace-one" if method == "proven" else self._config.sensitivity
        return self.ledger.epsilon(
            history=history,
            protocol=_CHECKIN,
            delta=delta,
            population=self._config.population_size,
            sensitivity=sensitivity,
            method=method,
        )

    def epsilon_result(
        self,
        delta: float | None = None,
        *,
        proven: bool = False,
        then: tuple[ShuffleCheckInEvent, int] | None = None,
    ) -> EpsilonResult | None:
        """Return the analysis of the rounds composed, or ``None`` where none is needed.

        Args:
            delta: Target δ; ``config.target_delta`` by default.
            proven: Use the method ``proven`` (replace-one adjacency whatever the configured
                sensitivity) instead of ``config.method``.
            then: ``(event, count)``: also count that many rounds of ``event`` after those
                composed (nothing is composed).

        Returns:
            :func:`~shuffle_opacus.history_epsilon`'s result (the last few are kept), or
            ``None`` for no round (ε = 0) or a noiseless one (ε = ``inf``).

        Raises:
            ValueError: for ``delta`` outside ``(0, 1)``, or a bad event or count.
        """
        delta = check_delta(self._config.target_delta if delta is None else delta)
        history = self._history(then)
        if self.ledger.trivial_epsilon(history) is not None:
            return None
        return self._analysis(delta, history, "proven" if proven else self._config.method)

    def _spent(self, delta: float, history: tuple[HistoryEntry, ...]) -> PrivacySpent:
        delta = check_delta(delta)
        rounds = sum(c for _, _, c in history)
        method = self._config.method
        fixed = self.ledger.trivial_epsilon(history)
        if fixed is not None:  # no round, or a noiseless one
            return self._record(fixed, delta, rounds, method, None)
        result = self._analysis(delta, history, method)
        note = result.note
        if result.details and result.method == "proven":
            note = proven_note(dict(result.details))
        spent = self._record(float(result.epsilon), delta, rounds, result.method, note)
        if result.order and result.method not in (None, "pld", "proven"):
            spent = dataclasses.replace(spent, optimal_order=float(result.order))
        return spent

    def _record(
        self, epsilon: float, delta: float, rounds: int, method: str | None, note: str | None
    ) -> PrivacySpent:
        method = method or self._config.method or _CHECKIN.analysis.default_method
        sensitivity = "replace-one" if method == "proven" else self._config.sensitivity
        return PrivacySpent(
            epsilon,
            delta,
            rounds,
            f"shuffle-{method}",
            note=note,
            sensitivity=resolve_sensitivity(sensitivity),
            assumptions=(
                *_CHECKIN.analysis.assumptions_of(method),
                *sensitivity_assumptions(sensitivity),
            ),
        )

    def get_epsilon(self, delta: float) -> float:
        """Return ε at ``delta`` of the rounds composed (0 for none, inf with a noiseless round).

        Raises:
            ValueError: for ``delta`` outside ``(0, 1)``.
        """
        return self._spent(delta, self._history(None)).epsilon

    def get_delta(self, epsilon: float) -> float:
        """Return the smallest δ (to 1 %) at which the rounds composed are ``(epsilon, δ)``-DP.

        Solved by bisection on ``log δ`` over :meth:`get_epsilon` (about 10 evaluations); the
        δ returned is one at which ε is at most ``epsilon``, so it is an upper bound (below
        the smallest δ the analysis takes for these rounds, the smallest δ tried that holds;
        1 when even δ = 0.5 does not).

        Raises:
            ValueError: for ``epsilon`` negative or not finite.
        """
        if isinstance(epsilon, bool) or not isinstance(epsilon, (int, float)):
            raise ValueError(f"epsilon must be a finite float >= 0. Found {epsilon!r}.")
        if not (math.isfinite(epsilon) and epsilon >= 0):
            raise ValueError(f"epsilon must be a finite float >= 0. Found {epsilon!r}.")
        history = self._history(None)
        if self.num_releases == 0:
            return 0.0

        def holds(delta: float) -> bool:
            return self._spent(delta, history).epsilon <= epsilon

        # A bracket [lo, hi] with the answer inside, found by factors of 100 from target_delta.
        lo = hi = self._config.target_delta
        if holds(hi):
            while lo > 1e-100:
                lo = max(lo / 100.0, 1e-100)
                try:
                    if not holds(lo):
                        break
                except ValueError:  # below the smallest delta the analysis takes
                    return hi
                hi = lo
            else:
                return hi
        else:
            while True:
                hi = min(hi * 100.0, 0.5)
                if holds(hi):
                    break
                if hi == 0.5:
                    return 1.0
                lo = hi
        while hi / lo > 1.01:
            mid = math.sqrt(lo * hi)
            if holds(mid):
                hi = mid
            else:
                lo = mid
        return hi

    def get_privacy_spent(self, delta: float | None = None) -> PrivacySpent:
        """Return ε at ``delta`` (default: ``config.target_delta``) with what it rests on."""
        delta = self._config.target_delta if delta is None else delta
        return self._spent(delta, self._history(None))

    def would_exceed(
        self, event: ShuffleCheckInEvent, max_epsilon: float | None = None, count: int = 1
    ) -> bool:
        """Return whether composing ``count`` rounds of ``event`` would take ε above the budget.

        ε is taken at ``config.target_delta``; nothing is composed.

        Raises:
            ValueError: without a budget (here or in the configuration), or a bad event.
        """
        self._check_event(event, count)
        limit = self._config.max_epsilon if max_epsilon is None else max_epsilon
        if limit is None:
            raise ValueError("max_epsilon must be given here or in the configuration. Found None.")
        limit = check_positive("max_epsilon", limit)
        after = self._spent(self._config.target_delta, self._history((event, count)))
        return after.epsilon > limit

    def state_dict(self) -> dict[str, object]:
        """Return a JSON-serialisable state: the configuration and the rounds composed."""
        c = self._config
        return {
            "schema_version": _SCHEMA,
            "backend": _BACKEND,
            "config": {
                "target_delta": c.target_delta,
                "population_size": c.population_size,
                "neighboring_relation": _value(c.neighboring_relation),
                "sampling_method": _value(c.sampling_method),
                "max_epsilon": c.max_epsilon,
                "method": c.method,
                "sensitivity": c.sensitivity,
            },
            "compositions": [
                {
                    "event": {
                        "noise_multiplier": noise,
                        "rate": rate,
                        "population_size": c.population_size,
                    },
                    "count": n,
                }
                for noise, rate, n in self.ledger.entries
            ],
        }

    def load_state_dict(self, state: Mapping[str, object]) -> None:
        """Restore :meth:`state_dict`'s output; the configuration must be this one's.

        Nothing changes unless the whole state is valid. The rounds replace the entries of
        :attr:`ledger` (the same object, so a strategy that shares it sees them).

        Raises:
            ValueError: for another schema, backend or configuration, a bad composition, or
                rounds that do not begin with those already composed.
        """
        if not isinstance(state, Mapping):
            raise ValueError(f"state must be a mapping. Found {type(state).__name__}.")
        if state.get("schema_version") != _SCHEMA or state.get("backend") != _BACKEND:
            raise ValueError(
                f"state must come from this accountant (schema {_SCHEMA}, backend {_BACKEND!r})."
                f" Found schema {state.get('schema_version')!r}, backend "
                f"{state.get('backend')!r}."
            )
        mine = self.state_dict()["config"]
        if state.get("config") != mine:
            raise ValueError(
                f"state['config'] must be this accountant's {mine}. Found {state.get('config')}."
            )
        raw = state.get("compositions")
        if not isinstance(raw, list):
            raise ValueError(f"state['compositions'] must be a list. Found {type(raw).__name__}.")
        restored: list[HistoryEntry] = []
        for i, item in enumerate(raw):
            try:
                event = ShuffleCheckInEvent(**item["event"])
                count = item["count"]
                self._check_event(event, count)
            except (KeyError, TypeError, ValueError) as exc:
                raise ValueError(f"state['compositions'][{i}] is not valid: {exc}") from None
            restored.append((event.noise_multiplier, event.rate, count))
        if not _extends(restored, self.ledger.entries):
            # The ledger is a strategy's record of released rounds: a state may restore an
            # accountant with no rounds, or one that went on from them, never forget a round.
            raise ValueError(
                f"state['compositions'] must hold at least the {self.num_releases} rounds "
                "already composed, in order (a state saved earlier cannot rewind the rounds "
                "released since). Load it into a new accountant."
            )
        self.ledger.entries = restored  # the same ledger: a strategy's history follows


def _extends(entries: list[HistoryEntry], held: list[HistoryEntry]) -> bool:
    """Return whether ``entries`` hold the rounds of ``held`` first (run lengths compared)."""
    held = [entry for entry in held if entry[2]]
    entries = [entry for entry in entries if entry[2]]
    if not held:
        return True
    if len(entries) < len(held) or entries[: len(held) - 1] != held[:-1]:
        return False
    last, mine = held[-1], entries[len(held) - 1]
    return mine[:2] == last[:2] and mine[2] >= last[2]
