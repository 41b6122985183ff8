"""What both check-in strategies share, whatever the trust mode.

:class:`CheckInBase` is the base of :class:`~shuffle_opacus.flower.ShuffleCheckInFedAvg`
(trusted-server mode) and :class:`~shuffle_opacus.flower.SecAggCheckInFedAvg` (secure-aggregation
mode): the check-in accountant and the ε budget, waiting for exactly ``n`` nodes
(:func:`wait_for_population`), the start-up check (:func:`check_nodes`), and the loop of rounds
(budget stop, server evaluation, a round that ends the run keeps its metrics and a stop reason).
After every round it logs one JSON line that starts with :data:`ROUND_LINE_PREFIX`
(:func:`round_line`, :func:`read_round_line`); the launcher's console reads those lines.
A subclass says what one round is (:meth:`CheckInBase._play_round`), what its nodes echo at
start-up and which population the accountant uses. ``docs/flower.md`` describes both modes.

Two numbers are reported. ``epsilon``, every round, is the configured method (by default the
tight ``pld``, which rests on Theorem 1's pair of Liew & Takahashi being the worst case);
``epsilon-proven`` (:data:`EPSILON_PROVEN_KEY`), at evaluation rounds and the last round, is the
method ``proven``, proven from published theorems (Feldman, McMillan & Talwar, arXiv:2012.12803)
with no assumption on where the other nodes' updates lie, under replace-one adjacency whatever
the sensitivity convention. :meth:`CheckInBase.guarantees` says what each rests on.
"""

from __future__ import annotations

import abc
import json
import math
import time
from collections.abc import Callable, Mapping
from logging import INFO, WARNING
from typing import Any, NoReturn

from flwr.app import ArrayRecord, ConfigRecord, MetricRecord, RecordDict
from flwr.common import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result

from ..accounting.ledger import RoundLedger
from ..accounting.protocols import (
    SENSITIVITIES,
    HistoryEntry,
    get_protocol,
    sensitivity_assumptions,
)
from ..analysis.epsilon import proven_note
from ..analysis.rdp.conversion import EpsilonResult
from ..common.validation import check_int, check_positive
from .accounting import ShuffleAccountingConfig, ShuffleCheckInAccountant, ShuffleCheckInEvent
from .config import ShufflePrivacyConfig
from .nodes import ProtocolViolationError, check_nodes, wait_for_population

__all__ = [
    "EPSILON_PROVEN_KEY",
    "PROVEN_METHOD",
    "ROUND_LINE_PREFIX",
    "CheckInBase",
    "EvaluateFn",
    "ProtocolViolationError",
    "check_nodes",
    "check_privacy",
    "read_round_line",
    "round_line",
    "wait_for_population",
]

_CHECKIN = get_protocol("checkin")

#: Key of the proven ε in a round's metrics: present at evaluation rounds and the last round.
EPSILON_PROVEN_KEY = "epsilon-proven"

#: The method of the proven ε (no assumption on where the other nodes' updates lie).
PROVEN_METHOD = "proven"

#: Sensitivity of the proven ε, in units of C: replace-one, whatever the run's convention (a
#: smaller one is itself an assumption on where the updates lie).
PROVEN_SENSITIVITY = SENSITIVITIES["replace-one"]

#: The start of the JSON line a strategy logs after every round (see :func:`round_line`).
ROUND_LINE_PREFIX = "shuffle-dp.round "

#: Server-side evaluation ``f(round, arrays)``, as both strategies' ``start`` take it.
EvaluateFn = Callable[[int, ArrayRecord], MetricRecord | None]


def _jsonable(value: Any) -> Any:
    """``value`` with non-finite floats as the strings ``inf``, ``-inf`` and ``nan``."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    return value


def round_line(record: Mapping[str, Any]) -> str:
    """Return ``record`` as one line: :data:`ROUND_LINE_PREFIX` and compact JSON.

    Args:
        record: The round's record (``round``, ``num_rounds``, ``mode``, ``metrics``,
            ``evaluation``, ``stop_reason``, and ``guarantees`` on the lines that carry the
            proven ε); non-finite floats become ``"inf"``/``"nan"``.

    Returns:
        The line, without a newline.
    """
    return ROUND_LINE_PREFIX + json.dumps(_jsonable(record), separators=(",", ":"))


def read_round_line(line: str) -> dict[str, Any] | None:
    """Return the record of a line written by :func:`round_line`, wherever it sits in ``line``.

    Args:
        line: One line of a log (a logger's prefix before the record is allowed).

    Returns:
        The record, or ``None`` for a line without one (or whose JSON does not parse).
    """
    start = line.find(ROUND_LINE_PREFIX)
    if start < 0:
        return None
    try:
        record = json.loads(line[start + len(ROUND_LINE_PREFIX) :])
    except ValueError:
        return None
    return record if isinstance(record, dict) else None


def check_privacy(privacy: Any) -> ShufflePrivacyConfig:
    """Return ``privacy`` if it is a :class:`ShufflePrivacyConfig`.

    Raises:
        ValueError: otherwise.
    """
    if not isinstance(privacy, ShufflePrivacyConfig):
        raise ValueError(f"privacy must be a ShufflePrivacyConfig. Found {type(privacy)!r}.")
    return privacy


class CheckInBase(abc.ABC):
    """The accountant, the budget, the start-up check and the rounds of both check-in modes.

    A subclass calls :meth:`_init_checkin` in its constructor and implements
    :attr:`accounting_population`, :meth:`summary`, :meth:`_handshake_config`,
    :meth:`_echo_problems`, :meth:`_play_round` and :meth:`_failed_round_metrics`. ε is
    :func:`shuffle_opacus.history_epsilon` with protocol ``checkin``, that population and the
    configuration's sensitivity and method: replace-one adjacency of one node, adaptive rounds.

    Beside it, :meth:`epsilon_proven` is the same history by the method ``proven`` under
    replace-one adjacency (:data:`PROVEN_SENSITIVITY`). It costs more per round than the tight
    ε (at n = 100, γ = 0.5, σ = 1.5 when this was written: about 0.3 s a round on one core,
    against 0.007 s for ``pld``), so :meth:`_run` records it,
    as :data:`EPSILON_PROVEN_KEY` in the round's metrics and in :attr:`epsilons_proven`, only at
    evaluation rounds (where ``evaluate_fn`` returned metrics) and at the last round the run
    records (the last configured round, the round before a budget stop, a round that ended the
    run), not every round. Asked again for the same rounds it is not recomputed.

    Attributes:
        privacy: σ, C, γ, δ, sensitivity convention and analysis method.
        num_nodes: ``n``, the nodes every round waits for.
        max_epsilon: ε budget at ``privacy.delta`` (``None``: none).
        node_wait_timeout: Seconds to wait for the ``n`` nodes.
        check_nodes_at_start: Whether :meth:`_run` starts with :meth:`verify_nodes`.
        report_proven: Whether :meth:`_run` records the proven ε (at evaluation rounds and the
            last round); :meth:`epsilon_proven` computes it on demand either way.
        history: Accounted rounds in Opacus's format ``(noise_multiplier, rate, rounds)``
            (the entries of :attr:`ledger`, a
            :class:`~shuffle_opacus.accounting.ledger.RoundLedger`, which also keeps the last few
            results).
        epsilons: ε after each round that ran, by round number.
        epsilons_proven: The proven ε after each round it was recorded at, by round number.
        round_metrics: The metrics of each round that ran, by round number.
        stop_reason: Why the run ended before its last round (``None`` otherwise).
    """

    #: The trust mode (:data:`~shuffle_opacus.flower.config.MODES`), in the round lines.
    mode: str = ""
    #: The mod a node must run first, named in the start-up check's errors.
    mod_name: str = ""

    privacy: ShufflePrivacyConfig
    num_nodes: int
    max_epsilon: float | None
    node_wait_timeout: float
    check_nodes_at_start: bool
    report_proven: bool
    ledger: RoundLedger
    epsilons: dict[int, float]
    epsilons_proven: dict[int, float]
    round_metrics: dict[int, dict[str, float | int]]
    stop_reason: str | None
    _unprotected_rounds: int
    _accountant: ShuffleCheckInAccountant | None

    def _init_checkin(
        self,
        privacy: ShufflePrivacyConfig,
        num_nodes: int,
        max_epsilon: float | None,
        node_wait_timeout: float,
        verify_nodes: bool,
        report_proven: bool = True,
    ) -> None:
        """Check the arguments both modes share and set the attributes.

        Raises:
            ValueError: for ``max_epsilon``, ``node_wait_timeout``, ``verify_nodes`` or
                ``report_proven`` outside its range.
        """
        if max_epsilon is not None:
            max_epsilon = check_positive("max_epsilon", max_epsilon)
        node_wait_timeout = check_positive("node_wait_timeout", node_wait_timeout)
        if not isinstance(verify_nodes, bool):
            raise ValueError(f"verify_nodes must be True or False. Found {verify_nodes!r}.")
        if not isinstance(report_proven, bool):
            raise ValueError(f"report_proven must be True or False. Found {report_proven!r}.")
        self.privacy = privacy
        self.num_nodes = int(num_nodes)
        self.max_epsilon = max_epsilon
        self.node_wait_timeout = node_wait_timeout
        self.check_nodes_at_start = verify_nodes
        self.report_proven = report_proven
        self.ledger = RoundLedger()
        self.epsilons = {}
        self.epsilons_proven = {}
        self.round_metrics = {}
        self.stop_reason = None
        self._unprotected_rounds = 0
        self._accountant = None
        if privacy.noise_multiplier == 0.0:
            log(WARNING, "noise_multiplier = 0: the reports carry no noise; epsilon is infinite")

    # --- accounting ---------------------------------------------------------------------

    @property
    @abc.abstractmethod
    def accounting_population(self) -> int:
        """The population ``n`` the accountant uses."""

    @property
    def accountant(self) -> ShuffleCheckInAccountant:
        """The run's ledger in Flower's accounting shape (:mod:`.accounting`).

        Every accounted round is composed into it as a :class:`ShuffleCheckInEvent`; its
        configuration is this run's (δ, population, method, sensitivity, budget). Save it with
        ``state_dict``; its ε equals :meth:`epsilon` (which keeps its own cache of results).
        """
        if self._accountant is None:
            self._accountant = ShuffleCheckInAccountant(
                ShuffleAccountingConfig(
                    target_delta=self.privacy.delta,
                    population_size=self.accounting_population,
                    max_epsilon=self.max_epsilon,
                    method=self.privacy.method,
                    sensitivity=self.privacy.sensitivity,
                )
            )
        return self._accountant

    @property
    def history(self) -> list[HistoryEntry]:
        """The accounted rounds: the entries of :attr:`ledger` (the list itself)."""
        return self.ledger.entries

    @history.setter
    def history(self, entries: list[HistoryEntry]) -> None:
        self.ledger.entries = entries

    @property
    def rounds_accounted(self) -> int:
        """Number of rounds accounted so far (every round whose instructions went out)."""
        return self.ledger.rounds + self._unprotected_rounds

    def _history_until(self, rounds: int | None) -> tuple[int, tuple[HistoryEntry, ...]]:
        """Return the rounds asked for and the history extended with identical rounds to them."""
        done = self.rounds_accounted
        rounds = done if rounds is None else check_int("rounds", rounds, minimum=done)
        privacy = self.privacy
        return rounds, self.ledger.extended(
            rounds, privacy.noise_multiplier, privacy.rate, done=done
        )

    def _result(self, method: str | None, rounds: int | None) -> EpsilonResult | None:
        """Return the accountant's result after ``rounds`` rounds by ``method``.

        ``None`` for no round, or when a round is (or would be) noiseless (ε is then 0 or
        infinite). The proven method is taken under replace-one adjacency
        (:data:`PROVEN_SENSITIVITY`), any other under the configuration's sensitivity. Results
        are kept for the last few histories asked for.
        """
        rounds, history = self._history_until(rounds)
        if rounds == 0 or self._unprotected_rounds or self.privacy.noise_multiplier == 0.0:
            return None
        sensitivity = PROVEN_SENSITIVITY if method == PROVEN_METHOD else self.privacy.sensitivity
        return self.ledger.epsilon(
            history=history,
            protocol=_CHECKIN,
            delta=self.privacy.delta,
            population=self.accounting_population,
            sensitivity=sensitivity,
            method=method,
        )

    def _value(self, method: str | None, rounds: int | None) -> float:
        result = self._result(method, rounds)
        if result is not None:
            return float(result.epsilon)
        return 0.0 if self._history_until(rounds)[0] == 0 else math.inf

    def epsilon(self, rounds: int | None = None) -> float:
        """ε at ``privacy.delta`` after ``rounds`` rounds (default: the rounds accounted so far).

        The history of this run, extended with identical rounds when ``rounds`` exceeds it, by
        the configuration's method (the tight ``pld`` by default) and sensitivity.

        Args:
            rounds: Number of rounds (at least the rounds accounted); ``None``: those.

        Returns:
            ε; 0 for no round, ``inf`` when any round is (or would be) noiseless.

        Raises:
            ValueError: for ``rounds`` smaller than the rounds already accounted.
        """
        return self._value(self.privacy.method, rounds)

    def epsilon_proven(self, rounds: int | None = None) -> float:
        """Return the proven ε at ``privacy.delta`` after ``rounds`` rounds (default: those done).

        The same history as :meth:`epsilon`, by the method ``proven`` (Feldman, McMillan &
        Talwar, arXiv:2012.12803, Theorems 3.8 and 4.1: no assumption on where the other
        nodes' updates lie) under replace-one adjacency whatever ``privacy.sensitivity``. It
        assumes less than the tight ε, so expect it above (far above at small ``n``). It costs
        more per round (see the class docstring): :meth:`_run` records it only at evaluation
        rounds and the last round. The last few results are kept, so asking again is free.

        Args:
            rounds: Number of rounds (at least the rounds accounted); ``None``: those.

        Returns:
            ε; 0 for no round, ``inf`` when any round is (or would be) noiseless.

        Raises:
            ValueError: for ``rounds`` smaller than the rounds already accounted.
        """
        return self._value(PROVEN_METHOD, rounds)

    def guarantees(self) -> dict[str, dict[str, Any]]:
        """Say what each ε reported after the rounds accounted so far is and rests on.

        Returns:
            ``{"epsilon": ..., EPSILON_PROVEN_KEY: ...}``, each a dict with ``method`` (the
            method used: for ``epsilon`` the configured one, or the Rényi fallback where the
            default is beyond the work limits), ``sensitivity`` (in units of C), ``delta``,
            ``assumptions`` (from
            :meth:`~shuffle_opacus.analysis.mechanisms.Mechanism.assumptions_of`, plus what a
            sensitivity below 2 C assumes) and ``note`` (how the proven ε was obtained: route,
            level and delta's split; the tight one's fallback note; or ``None``). Computing the
            proven ε's note computes the proven ε (see :meth:`epsilon_proven`).
        """
        mech = _CHECKIN.analysis
        tight = self._result(self.privacy.method, None)
        proven = self._result(PROVEN_METHOD, None)
        method = (
            tight.method if tight is not None and tight.method else self.privacy.method
        ) or mech.default_method
        proven_details = None if proven is None else dict(proven.details or {})
        return {
            "epsilon": {
                "method": method,
                "sensitivity": self.privacy.sensitivity,
                "delta": self.privacy.delta,
                "assumptions": [
                    *mech.assumptions_of(method),
                    *sensitivity_assumptions(self.privacy.sensitivity),
                ],
                "note": None if tight is None else tight.note,
            },
            EPSILON_PROVEN_KEY: {
                "method": PROVEN_METHOD,
                "sensitivity": PROVEN_SENSITIVITY,
                "delta": self.privacy.delta,
                "assumptions": list(mech.assumptions_of(PROVEN_METHOD)),
                "note": None if proven_details is None else proven_note(proven_details),
            },
        }

    def budget_allows_another_round(self) -> bool:
        """Return whether one more round keeps ε within ``max_epsilon`` (True without budget)."""
        if self.max_epsilon is None:
            return True
        return self.epsilon(self.rounds_accounted + 1) <= self.max_epsilon

    def _account_round(self) -> None:
        sigma, rate = self.privacy.noise_multiplier, self.privacy.rate
        self.accountant.compose(ShuffleCheckInEvent(sigma, rate, self.accounting_population))
        if sigma == 0.0:
            self._unprotected_rounds += 1
        else:
            self.ledger.record(sigma, rate)

    def _budget_message(self, server_round: int) -> str:
        after = self.epsilon(self.rounds_accounted + 1)
        return (
            f"stopped before round {server_round}: epsilon would reach {after:.6g} > budget "
            f"{self.max_epsilon:g} (delta = {self.privacy.delta:g})"
        )

    # --- what a mode says ---------------------------------------------------------------

    @abc.abstractmethod
    def summary(self) -> None:
        """Log the protocol's parameters."""

    @abc.abstractmethod
    def _handshake_config(self) -> tuple[str, ConfigRecord]:
        """Return the key and the ConfigRecord of the start-up check's instruction."""

    @abc.abstractmethod
    def _echo_problems(self, content: RecordDict) -> list[str]:
        """Return what is wrong with one node's start-up answer (empty: nothing)."""

    @abc.abstractmethod
    def _play_round(
        self, server_round: int, arrays: ArrayRecord, grid: Grid, timeout: float
    ) -> ArrayRecord:
        """Run one round from ``arrays``; return the model after it.

        Raises:
            ProtocolViolationError: with one line saying why the round could not finish.
        """

    @abc.abstractmethod
    def _failed_round_metrics(self, server_round: int) -> dict[str, float | int]:
        """Return the metrics of a round that ended the run before it recorded its own."""

    # --- the run ------------------------------------------------------------------------

    def _population(self, grid: Grid) -> list[int]:
        return wait_for_population(grid, self.num_nodes, self.node_wait_timeout)

    def verify_nodes(self, grid: Grid, timeout: float) -> None:
        """Check, before any round, that every node's mod accepts this run's parameters.

        Sends every node of the population a training instruction with the run's parameters
        and the flag ``shuffle-dp.handshake`` but no model; the node's mod answers with its
        echo, or refuses (noise floor, sensitivity convention, noiseless run, and under SecAgg+
        the check-in ceiling and the mode), without running the training code. Nothing is
        accounted: no data is touched.

        Args:
            grid: The Grid of the ServerApp.
            timeout: Seconds to wait for the answers (> 0).

        Raises:
            ProtocolViolationError: naming, in one line, what the nodes that disagree (or did
                not answer, or run no mod) replied.
        """
        key, config = self._handshake_config()
        check_nodes(
            grid,
            self._population(grid),
            config=config,
            config_key=key,
            echo_problems=self._echo_problems,
            mod_name=self.mod_name,
            timeout=timeout,
        )

    def _run(
        self,
        grid: Grid,
        initial_arrays: ArrayRecord,
        num_rounds: int,
        timeout: float,
        evaluate_fn: EvaluateFn | None,
    ) -> Result:
        """Run up to ``num_rounds`` rounds (arguments checked by the subclass's ``start``).

        Evaluates the initial model (round 0), runs the start-up check (unless switched off
        or the budget allows no round), then each round: the budget check, the round
        (:meth:`_play_round`), its metrics into the result, ``evaluate_fn``, the proven ε
        (:data:`EPSILON_PROVEN_KEY`, added to the round's metrics) if ``evaluate_fn`` returned
        metrics or the run ends after this round, and one line (:func:`round_line`) on the
        log.

        Returns:
            Flower's ``Result``: the final model and the metrics of every round that ran.

        Raises:
            ProtocolViolationError: from the start-up check, or a round that could not finish
                (see :meth:`_stop`).
        """
        log(INFO, "Starting %s for up to %d rounds", type(self).__name__, num_rounds)
        self.summary()
        result = Result()
        result.arrays = initial_arrays
        arrays = initial_arrays
        if evaluate_fn is not None:
            evaluation = evaluate_fn(0, arrays)
            if evaluation is not None:
                result.evaluate_metrics_serverapp[0] = evaluation
        started = time.monotonic()
        if self.check_nodes_at_start and self.budget_allows_another_round():
            self.verify_nodes(grid, timeout)
        for server_round in range(1, num_rounds + 1):
            if not self.budget_allows_another_round():
                self.stop_reason = self._budget_message(server_round)
                log(INFO, "%s", self.stop_reason)
                break
            log(INFO, "")
            log(INFO, "[ROUND %d/%d]", server_round, num_rounds)
            accounted = self.rounds_accounted
            try:
                arrays = self._play_round(server_round, arrays, grid, timeout)
            except ProtocolViolationError as exc:
                self._stop(server_round, num_rounds, accounted, str(exc).rstrip("."))
            result.arrays = arrays
            if server_round in self.round_metrics:
                metrics = MetricRecord(dict(self.round_metrics[server_round]))
                result.train_metrics_clientapp[server_round] = metrics
            evaluation = None
            if evaluate_fn is not None:
                evaluation = evaluate_fn(server_round, arrays)
                if evaluation is not None:
                    result.evaluate_metrics_serverapp[server_round] = evaluation
                    log(INFO, "round %d: server evaluation %s", server_round, dict(evaluation))
            if (
                self.report_proven
                and server_round in self.round_metrics
                and (evaluation is not None or self._is_last(server_round, num_rounds))
            ):
                self._record_proven(server_round)
                if server_round in result.train_metrics_clientapp:
                    proven = self.round_metrics[server_round][EPSILON_PROVEN_KEY]
                    result.train_metrics_clientapp[server_round][EPSILON_PROVEN_KEY] = proven
            self._log_round(server_round, num_rounds, evaluation)
        log(INFO, "strategy finished in %.2f s", time.monotonic() - started)
        return result

    def _is_last(self, server_round: int, num_rounds: int) -> bool:
        """Whether the run ends after ``server_round`` (its last round, or the budget's)."""
        return (
            server_round >= num_rounds
            or self.stop_reason is not None
            or not self.budget_allows_another_round()
        )

    def _record_proven(self, server_round: int) -> None:
        """Add the proven ε after the rounds accounted to the metrics of ``server_round``."""
        proven = self.epsilon_proven()
        self.epsilons_proven[server_round] = proven
        self.round_metrics[server_round][EPSILON_PROVEN_KEY] = proven

    def _log_round(
        self, server_round: int, num_rounds: int, evaluation: MetricRecord | None
    ) -> None:
        metrics = dict(self.round_metrics.get(server_round, {}))
        record: dict[str, Any] = {
            "round": server_round,
            "num_rounds": num_rounds,
            "mode": self.mode,
            "metrics": metrics,
            "evaluation": None if evaluation is None else dict(evaluation),
            "stop_reason": self.stop_reason,
        }
        if EPSILON_PROVEN_KEY in metrics:
            record["guarantees"] = self.guarantees()
        log(INFO, "%s", round_line(record))

    def _stop(self, server_round: int, num_rounds: int, accounted: int, reason: str) -> NoReturn:
        """Record a round that could not finish, set :attr:`stop_reason` and end the run.

        A round whose instructions went out is accounted: its ε, its metrics (from
        :meth:`_failed_round_metrics` when it recorded none, with the proven ε: it is the
        run's last round) and its line are kept.

        Raises:
            ProtocolViolationError: always, with ``reason`` and what was accounted.
        """
        if self.rounds_accounted == accounted:  # nothing went out: nothing to record
            raise ProtocolViolationError(reason + ".")
        epsilon = self.epsilon()
        self.epsilons[server_round] = epsilon
        outcome = "the model is unchanged"
        if server_round in self.round_metrics:
            outcome = "the model is as that round left it"
        else:
            self.round_metrics[server_round] = self._failed_round_metrics(server_round)
        if self.report_proven:
            self._record_proven(server_round)
        self.stop_reason = (
            f"{reason}; the round is accounted (epsilon = {epsilon:.6g}) and {outcome}"
        )
        log(WARNING, "%s", self.stop_reason)
        self._log_round(server_round, num_rounds, None)
        raise ProtocolViolationError(self.stop_reason + ".")
