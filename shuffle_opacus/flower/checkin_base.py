"""What both check-in strategies share, whatever the trust mode.

:class:`CheckInBase` is the base of :class:`~shuffle_opacus.flower.ShuffleCheckInFedAvg`
(trusted-server mode) and :class:`~shuffle_opacus.flower.SecAggCheckInFedAvg` (secure-aggregation
mode): the check-in accountant and the ε budget, waiting for exactly ``n`` nodes
(:func:`wait_for_population`), the start-up check (:func:`check_nodes`), and the loop of rounds
(budget stop, server evaluation, a round that ends the run keeps its metrics and a stop reason).
The rounds have one history, the ledger of the run's accountant, and every ε comes from it
(:mod:`.run_accounting`). After every round it logs one JSON line (:mod:`.round_log`:
:func:`round_line`, :func:`read_round_line`, re-exported here); the launcher's console reads
those lines. A subclass says what one round is (:meth:`CheckInBase._play_round`), what its nodes
echo at start-up and which population the accountant uses. ``docs/flower.md`` describes both
modes.

Two numbers are reported. ``epsilon``, every round, is the configured method (by default the
tight ``pld``, which rests on Theorem 1's pair of Liew & Takahashi being the worst case);
``epsilon-proven`` (:data:`EPSILON_PROVEN_KEY`), at evaluation rounds and the last round, is the
method ``proven``, proven from published theorems (Feldman, McMillan & Talwar, arXiv:2012.12803)
with no assumption on where the other nodes' updates lie, under replace-one adjacency whatever
the sensitivity convention. :meth:`CheckInBase.guarantees` says what each rests on
(:func:`~.run_accounting.guarantees_record`).
"""

from __future__ import annotations

import abc
import time
from collections.abc import Callable
from logging import INFO, WARNING
from typing import Any, NoReturn

from flwr.app import ArrayRecord, ConfigRecord, MetricRecord, RecordDict
from flwr.common import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result

from ..accounting.ledger import RoundLedger
from ..accounting.protocols import HistoryEntry
from ..common.validation import check_positive
from .accounting import ShuffleCheckInAccountant
from .config import ShufflePrivacyConfig
from .nodes import ProtocolViolationError, check_nodes, wait_for_population
from .round_log import ROUND_LINE_PREFIX, read_round_line, round_line, round_record
from .run_accounting import (
    EPSILON_PROVEN_KEY,
    PROVEN_METHOD,
    PROVEN_SENSITIVITY,
    RunAccounting,
    guarantees_record,
)

__all__ = [
    "EPSILON_PROVEN_KEY",
    "PROVEN_METHOD",
    "PROVEN_SENSITIVITY",
    "ROUND_LINE_PREFIX",
    "CheckInBase",
    "EvaluateFn",
    "ProtocolViolationError",
    "check_nodes",
    "check_privacy",
    "guarantees_record",
    "read_round_line",
    "round_line",
    "wait_for_population",
]

#: Server-side evaluation ``f(round, arrays)``, as both strategies' ``start`` take it.
EvaluateFn = Callable[[int, ArrayRecord], MetricRecord | None]


def _evaluate(
    evaluate_fn: EvaluateFn | None, server_round: int, arrays: ArrayRecord, result: Result
) -> MetricRecord | None:
    """Return ``evaluate_fn(server_round, arrays)`` (``None`` without it), kept in ``result``."""
    evaluation = None if evaluate_fn is None else evaluate_fn(server_round, arrays)
    if evaluation is not None:
        result.evaluate_metrics_serverapp[server_round] = evaluation
        if server_round > 0:
            log(INFO, "round %d: server evaluation %s", server_round, dict(evaluation))
    return evaluation


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

    A subclass calls :meth:`_init_checkin` in its constructor, implements
    :attr:`accounting_population`, :meth:`summary`, :meth:`_handshake_config`,
    :meth:`_echo_problems`, :meth:`_play_round` and :meth:`_failed_round_metrics`, and accounts
    each round whose instructions go out with :meth:`_account_round`. The accounting is a
    :class:`~.run_accounting.RunAccounting`: every round is composed once into
    :attr:`accountant`, whose ledger is :attr:`ledger` (σ = 0 rounds included, ε then
    infinite); ε is :func:`shuffle_opacus.history_epsilon` of it with protocol ``checkin``, that
    population and the configuration's sensitivity and method (replace-one adjacency of one
    node, adaptive rounds). :meth:`epsilon_proven` is the same history by the method ``proven``
    under replace-one adjacency (:data:`PROVEN_SENSITIVITY`); it costs more per round (at
    n = 100, γ = 0.5, σ = 1.5 when this was written: about 0.3 s a round on one core, against
    0.007 s for ``pld``), so :meth:`_run` records it only at evaluation rounds and the last
    round the run records. The ledger keeps the last few results: asking again is free.

    Attributes:
        privacy: σ, C, γ, δ, sensitivity convention and analysis method.
        num_nodes: ``n``, the nodes every round waits for.
        max_epsilon: ε budget at ``privacy.delta`` (``None``: none).
        node_wait_timeout: Seconds to wait for the ``n`` nodes.
        check_nodes_at_start: Whether :meth:`_run` starts with :meth:`verify_nodes`.
        report_proven: Whether :meth:`_run` records the proven ε (as
            :data:`EPSILON_PROVEN_KEY` in the round's metrics); :meth:`epsilon_proven`
            computes it on demand either way.
        epsilons: ε after each round that ran, by round number.
        epsilons_proven: The proven ε after each round it was recorded at, by round number.
        round_metrics: The metrics of each round that ran, by round number.
        stop_reason: Why the run ended before its last round (``None`` otherwise).
    """

    #: The trust mode (:data:`~shuffle_opacus.flower.config.MODES`), in the round lines.
    mode: str = ""
    #: The mod a node must run first, named in the start-up check's errors.
    mod_name: str = ""

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
        for name, flag in (("verify_nodes", verify_nodes), ("report_proven", report_proven)):
            if not isinstance(flag, bool):
                raise ValueError(f"{name} must be True or False. Found {flag!r}.")
        self.privacy: ShufflePrivacyConfig = privacy
        self.num_nodes = int(num_nodes)
        self.max_epsilon: float | None = max_epsilon
        self.node_wait_timeout: float = node_wait_timeout
        self.check_nodes_at_start: bool = verify_nodes
        self.report_proven: bool = report_proven
        self.epsilons: dict[int, float] = {}
        self.epsilons_proven: dict[int, float] = {}
        self.round_metrics: dict[int, dict[str, float | int]] = {}
        self.stop_reason: str | None = None
        self._run_accounting: RunAccounting | None = None
        if privacy.noise_multiplier == 0.0:
            log(WARNING, "noise_multiplier = 0: the reports carry no noise; epsilon is infinite")

    # --- accounting: :class:`RunAccounting` --------------------------------------------

    @property
    @abc.abstractmethod
    def accounting_population(self) -> int:
        """The population ``n`` the accountant uses."""

    def _accounting(self) -> RunAccounting:
        """Return the run's accounting, built at first use (after the subclass's population)."""
        if self._run_accounting is None:
            population = self.accounting_population
            self._run_accounting = RunAccounting(self.privacy, population, self.max_epsilon)
        return self._run_accounting

    @property
    def accountant(self) -> ShuffleCheckInAccountant:
        """The run's accountant in Flower's accounting shape (:mod:`.accounting`).

        Configured as this run (δ, population, method, sensitivity, budget); every accounted
        round is composed into it once, and its ledger is :attr:`ledger`, so its ε is
        :meth:`epsilon` and a state loaded into it (``load_state_dict``) is this run's.
        """
        return self._accounting().accountant

    @property
    def ledger(self) -> RoundLedger:
        """The accounted rounds, σ = 0 ones included: the accountant's ledger."""
        return self.accountant.ledger

    @ledger.setter
    def ledger(self, ledger: RoundLedger) -> None:
        self.accountant.ledger = ledger

    @property
    def history(self) -> list[HistoryEntry]:
        """The accounted rounds as ``(noise_multiplier, rate, rounds)``: the ledger's entries."""
        return self.ledger.entries

    @history.setter
    def history(self, entries: list[HistoryEntry]) -> None:
        self.ledger.entries = entries

    @property
    def rounds_accounted(self) -> int:
        """Number of rounds accounted so far (every round whose instructions went out)."""
        return self.ledger.rounds

    def epsilon(self, rounds: int | None = None) -> float:
        """ε at ``privacy.delta`` after ``rounds`` rounds (default: the rounds accounted so far).

        The history of this run, extended with identical rounds to ``rounds`` (at least the
        rounds accounted, else ``ValueError``), by the configuration's method (the tight
        ``pld`` by default) and sensitivity. 0 for no round, ``inf`` when any round is (or
        would be) noiseless.
        """
        return self._accounting().epsilon(rounds)

    def epsilon_proven(self, rounds: int | None = None) -> float:
        """Return the proven ε at ``privacy.delta`` after ``rounds`` rounds (default: those done).

        As :meth:`epsilon`, by the method ``proven`` (Feldman, McMillan & Talwar,
        arXiv:2012.12803, Theorems 3.8 and 4.1: no assumption on where the other nodes' updates
        lie) under replace-one adjacency whatever ``privacy.sensitivity``: expect it above the
        tight ε (far above at small ``n``). It costs more (see the class docstring).
        """
        return self._accounting().epsilon(rounds, proven=True)

    def guarantees(self) -> dict[str, dict[str, Any]]:
        """Say what each ε after the rounds accounted is and rests on (:func:`guarantees_record`).

        Computing the proven ε's note computes the proven ε (see :meth:`epsilon_proven`).
        """
        return self._accounting().guarantees()

    def budget_allows_another_round(self) -> bool:
        """Return whether one more round keeps ε within ``max_epsilon`` (True without budget)."""
        return self._accounting().allows_another_round(self.max_epsilon)

    def _account_round(self) -> None:
        self._accounting().account_round()

    def _budget_message(self, server_round: int) -> str:
        return self._accounting().budget_message(server_round, self.max_epsilon)

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

        :func:`check_nodes` with :meth:`_handshake_config` and :meth:`_echo_problems`: each
        node's mod echoes the run's parameters or refuses them, without training; nothing is
        accounted.

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
        (:data:`EPSILON_PROVEN_KEY`) if ``evaluate_fn`` returned metrics or the run ends after
        this round (the last configured round, the round before a budget stop, a round that
        ended the run), and one line (:func:`round_line`) on the log.

        Returns:
            Flower's ``Result``: the final model and the metrics of every round that ran.

        Raises:
            ProtocolViolationError: from the start-up check, or a round that could not finish
                (see :meth:`_stop`).
        """
        log(INFO, "Starting %s for up to %d rounds", type(self).__name__, num_rounds)
        self.summary()
        result = Result()
        result.arrays = arrays = initial_arrays
        _evaluate(evaluate_fn, 0, arrays, result)
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
            evaluation = _evaluate(evaluate_fn, server_round, arrays, result)
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
        metrics = self.round_metrics.get(server_round, {})
        record = round_record(
            server_round,
            num_rounds,
            mode=self.mode,
            metrics=metrics,
            evaluation=evaluation,
            stop_reason=self.stop_reason,
            guarantees=self.guarantees() if EPSILON_PROVEN_KEY in metrics else None,
        )
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
