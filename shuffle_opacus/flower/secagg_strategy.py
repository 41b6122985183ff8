"""The server side of the secure-aggregation mode: SecAgg+ rounds, decoding, ε after each round.

:class:`SecAggCheckInFedAvg` runs the shuffled check-in protocol without a trusted server. The
server never chooses who checks in and never sees a node's report: in every round it sends the
current model to **all** ``n`` nodes through Flower's SecAgg+ (Bell, Bonawitz, Gascón, Lepoint
and Raykova, *Secure Single-Server Aggregation with (Poly)Logarithmic Overhead*, CCS 2020,
IACR ePrint 2020/704); each node's :class:`~shuffle_opacus.flower.SecAggCheckInMod` flips its own
coin and contributes its clipped, noised report or zeros, plus a count coordinate; the server
recovers only the sum of the reports and the number ``K`` of nodes that checked in, and moves the
model by the sum divided by ``K``.

Flower 1.41's SecAgg+ exists only as a workflow of Flower's legacy API
(``flwr.server.workflow.SecAggPlusWorkflow``, which needs a ``LegacyContext`` and a
``flwr.server.strategy.Strategy``); the message-API strategies of ``flwr.serverapp`` have no
secure aggregation. So this class is a legacy ``Strategy`` (``configure_fit`` instructs every
node; ``aggregate_fit`` receives the SecAgg+ sum, never an individual report) and
:meth:`SecAggCheckInFedAvg.start` drives the rounds itself, as Flower's ``DefaultWorkflow``
does, with a budget check before each round and the start-up check before the first
(``DefaultWorkflow`` can do neither). The workflow is Flower's with the additions of
:class:`~shuffle_opacus.flower.secagg_workflow.SecAggWorkflow`: it halts a round before
unmasking when fewer than ``n − D`` nodes sent their masked vectors, names the missing nodes in
every unmasking instruction (so that the nodes check the same rule, and refuse to unmask), and
checks every reply's form before Flower reads it (a malformed reply ends the run with one line,
the round's metrics and a stop reason). The decoded sum is checked against what honest nodes
can produce (:func:`~shuffle_opacus.flower.secagg_decode.decode_sum`); a sum that fails is not
applied, and the round says so (``sum-rejected``, :attr:`SecAggCheckInFedAvg.skip_reasons`).

Privacy statement (user level, replace-one of one node's whole dataset). Under the assumptions
below, the released models and round metrics are (ε, δ)-DP with the ε reported, which is the
package's check-in analysis (:func:`shuffle_opacus.history_epsilon`, protocol ``checkin``) with
population ``n − D``, rate γ and the nodes' σ:

* the server's view of a round (the masked vectors, the SecAgg+ messages, the echo, the decoded
  sum and count) is, by SecAgg+'s security, computable from the sum alone; the sum of the
  quantised reports is a function of the multiset of the participants' reports (quantisation
  acts on each report alone and the sum is symmetric); so the view is post-processing of the
  shuffled check-in output, and the check-in analysis applies (``docs/maths.md``);
* every node runs :class:`~shuffle_opacus.flower.SecAggCheckInMod` and flips its coin with
  operating-system randomness; every node takes part in every round's sum; reply times do not
  depend on the data (the mod pads the masked-vector step to its ``reply_after``, and a
  training that fails or overruns gives the zero update at that time instead of a dropout);
  the rounding is drawn inside the mod, from the operating system;
* a node is missing from a round's sum (a dropout) independently of its data and its coin, and
  at most ``D`` nodes are missing: the server halts a round with more before unmasking, and
  the honest nodes refuse to unmask it themselves;
* SecAgg+'s assumptions hold: the server (and the SuperLink) follows SecAgg+ (it sends every
  node the same, true statement of who is in the sum; it need not follow the dropout rule), and
  fewer than ``t`` nodes of any neighbourhood collude with it (see ``docs/flower.md`` for the
  weakness of Flower 1.41's mask generator), and the ``n`` nodes exist.

Client-side evaluation is not part of the protocol: no evaluation instruction is sent.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from logging import DEBUG, INFO, WARNING
from typing import Any

import numpy as np
from flwr.app import (
    Array,
    ArrayRecord,
    ConfigRecord,
    Context,
    MetricRecord,
    RecordDict,
)
from flwr.common import (
    EvaluateIns,
    EvaluateRes,
    FitIns,
    FitRes,
    Parameters,
    Scalar,
    log,
    parameters_to_ndarrays,
)
from flwr.compat.common import recorddict_compat as compat
from flwr.server import ServerConfig
from flwr.server.client_manager import ClientManager
from flwr.server.client_proxy import ClientProxy
from flwr.server.compat.grid_client_proxy import GridClientProxy
from flwr.server.compat.legacy_context import LegacyContext
from flwr.server.strategy import Strategy
from flwr.server.workflow.constant import MAIN_CONFIGS_RECORD, MAIN_PARAMS_RECORD
from flwr.server.workflow.constant import Key as WorkflowKey
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result

from ..analysis._validation import check_int, check_positive
from ..protocols import HistoryEntry, get_protocol
from .config import (
    ARRAY_NAMES_KEY,
    CONFIG_KEYS,
    HANDSHAKE_KEY,
    MAX_DROPOUTS_KEY,
    MODE_KEY,
    NUM_NODES_KEY,
    ShufflePrivacyConfig,
    echo_differences,
    secagg_echo,
)
from .secagg import SecAggParameters, secagg_parameters
from .secagg_decode import decode_sum
from .secagg_handshake import check_nodes
from .secagg_workflow import SecAggWorkflow
from .strategy import CheckInAccounting, ProtocolViolationError, wait_for_population

__all__ = ["SECAGG_ROUND_METRIC_KEYS", "SecAggCheckInFedAvg"]

_CHECKIN = get_protocol("checkin")

#: Keys of the MetricRecord the strategy records for every round of the secure-aggregation mode.
SECAGG_ROUND_METRIC_KEYS: tuple[str, ...] = (
    "epsilon",
    "delta",
    "rounds-accounted",
    "num-nodes",
    "population",
    "num-in-sum",
    "num-dropped",
    "num-checked-in",
    "sum-rejected",
    "rounds-rejected",
)


class SecAggCheckInFedAvg(CheckInAccounting, Strategy):
    """Node-side check-in under SecAgg+, the check-in accountant and an ε budget.

    Attributes:
        privacy: σ, C, γ, δ, sensitivity convention and analysis method.
        num_nodes: ``n``: every round's secure sum is over all of them.
        max_dropouts: ``D``: the most nodes a released sum may miss.
        max_epsilon: ε budget at ``privacy.delta`` (``None``: none).
        parameters: The :class:`~shuffle_opacus.flower.secagg.SecAggParameters` of the run
            (set by :meth:`start`, which knows the model's size).
        history: Accounted rounds ``(noise_multiplier, rate, rounds)``.
        epsilons: ε after each round that ran, by round number.
        round_metrics: The metrics of each round (:data:`SECAGG_ROUND_METRIC_KEYS`).
        stop_reason: Why :meth:`start` ended before ``num_rounds`` (``None`` otherwise).
        skip_reasons: Why the update of a round was not applied, by round number (its
            decoded sum failed :func:`~shuffle_opacus.flower.secagg_decode.decode_sum`).
        rounds_rejected: Number of rounds whose decoded sum was rejected.
    """

    def __init__(
        self,
        *,
        privacy: ShufflePrivacyConfig,
        num_nodes: int,
        max_dropouts: int = 0,
        max_epsilon: float | None = None,
        node_wait_timeout: float = 600.0,
        verify_nodes: bool = True,
    ) -> None:
        """Create the strategy.

        Args:
            privacy: σ, C, γ, δ, sensitivity convention and analysis method.
            num_nodes: ``n`` (integer in ``[2, 10000]``); every round waits until exactly
                this many nodes are connected and instructs all of them.
            max_dropouts: ``D`` (integer in ``[0, ⌈n/2⌉ − 1]``, default 0): a round whose sum
                would miss more nodes is halted before unmasking, and the accountant uses the
                population ``n − D``. With the default the accountant's population is ``n``.
            max_epsilon: ε budget (> 0) or ``None``.
            node_wait_timeout: Seconds to wait for the ``num_nodes`` nodes (> 0).
            verify_nodes: Run the start-up check (:meth:`verify_nodes`) in :meth:`start`.

        Raises:
            ValueError: for an argument outside its range.
        """
        if not isinstance(privacy, ShufflePrivacyConfig):
            raise ValueError(f"privacy must be a ShufflePrivacyConfig. Found {type(privacy)!r}.")
        secagg_parameters(
            num_nodes=num_nodes,
            dimension=1,
            clip_norm=privacy.clip_norm,
            noise_multiplier=privacy.noise_multiplier,
            max_dropouts=max_dropouts,
        )
        if max_epsilon is not None:
            max_epsilon = check_positive("max_epsilon", max_epsilon)
        node_wait_timeout = check_positive("node_wait_timeout", node_wait_timeout)
        if not isinstance(verify_nodes, bool):
            raise ValueError(f"verify_nodes must be True or False. Found {verify_nodes!r}.")
        super().__init__()
        self.privacy = privacy
        self.num_nodes = int(num_nodes)
        self.max_dropouts = int(max_dropouts)
        self.max_epsilon = max_epsilon
        self.node_wait_timeout = node_wait_timeout
        self.check_nodes_at_start = verify_nodes
        self.parameters: SecAggParameters | None = None
        self.history: list[HistoryEntry] = []
        self.epsilons: dict[int, float] = {}
        self.round_metrics: dict[int, dict[str, float | int]] = {}
        self.stop_reason: str | None = None
        self.skip_reasons: dict[int, str] = {}
        self.rounds_rejected = 0
        self._unprotected_rounds = 0
        self._grid: Grid | None = None
        self._model: ArrayRecord | None = None
        self._train_config: dict[str, Any] = {}
        self._open_round: int | None = None
        if privacy.noise_multiplier == 0.0:
            log(WARNING, "noise_multiplier = 0: the reports carry no noise; epsilon is infinite")

    # --- accounting ---------------------------------------------------------------------

    @property
    def population(self) -> int:
        """``n − D``: the population the accountant uses."""
        return self.num_nodes - self.max_dropouts

    @property
    def accounting_population(self) -> int:
        """``n − D`` (:attr:`population`)."""
        return self.population

    def _echo(self) -> dict[str, float | int | str]:
        return secagg_echo(self.privacy, num_nodes=self.num_nodes, max_dropouts=self.max_dropouts)

    # --- Flower's legacy Strategy, driven by SecAggPlusWorkflow ------------------------

    def initialize_parameters(self, client_manager: ClientManager) -> Parameters | None:
        """Return ``None``: :meth:`start` takes the initial model."""
        return None

    def configure_fit(
        self, server_round: int, parameters: Parameters, client_manager: ClientManager
    ) -> list[tuple[ClientProxy, FitIns]]:
        """Instruct every node of the population; account the round.

        The instruction carries the current model (with its array names), the privacy
        parameters, the mode, ``n`` and ``D``; it is the same for every node. ``parameters``
        (the workflow's copy of the model, without names) is not used.

        Returns:
            One ``(proxy, FitIns)`` per node, or none after the budget stop.

        Raises:
            ProtocolViolationError: if not exactly ``num_nodes`` nodes are connected.
        """
        if self.stop_reason is not None or self._grid is None or self._model is None:
            return []
        node_ids = wait_for_population(self._grid, self.num_nodes, self.node_wait_timeout)
        run_id = int(getattr(self._grid.run, "run_id", 0) or 0)
        proxies = [GridClientProxy(node_id=i, grid=self._grid, run_id=run_id) for i in node_ids]
        for proxy in proxies:
            client_manager.register(proxy)
        self._account_round()
        self._open_round = server_round
        config: dict[str, Any] = {
            **self._train_config,
            **self._echo(),
            ARRAY_NAMES_KEY: list(self._model.keys()),
            "server-round": server_round,
        }
        model = compat.arrayrecord_to_parameters(self._model, keep_input=True)
        log(INFO, "round %d: all %d nodes take part in the secure sum", server_round, len(proxies))
        return [(proxy, FitIns(model, config)) for proxy in proxies]  # type: ignore[arg-type]

    def aggregate_fit(
        self,
        server_round: int,
        results: list[tuple[ClientProxy, FitRes]],
        failures: list[tuple[ClientProxy, FitRes] | BaseException],
    ) -> tuple[Parameters | None, dict[str, Scalar]]:
        """Decode and check the secure sum and the count; move the model by their ratio.

        SecAgg+ hands every result the same aggregate: the mean over the ``m`` nodes whose
        masked vectors entered the sum. :func:`~shuffle_opacus.flower.secagg_decode.decode_sum`
        turns it into the sum of the reports and ``K``, the number of nodes that checked in,
        and checks them against what honest nodes produce. An accepted sum moves the model by
        the sum divided by ``K`` (not at all when ``K = 0``); a rejected one leaves the model
        as it is, sets ``sum-rejected = 1`` and records the reason in :attr:`skip_reasons`.
        Each result's plain part (weight and echo) must be the one a node running the mod
        sends. The round is accounted either way.

        Returns:
            ``(None, metrics)``: the model is kept by the strategy (with its array names).

        Raises:
            ProtocolViolationError: for a reply whose plain part does not fit the protocol.
        """
        if server_round != self._open_round or self._model is None or self.parameters is None:
            return None, {}
        self._open_round = None
        expected = self._echo()
        for _, fitres in results:
            problems = echo_differences(expected, fitres.metrics)
            if fitres.num_examples != 1:
                problems.append(f"weight {fitres.num_examples!r}, expected 1")
            if problems:
                raise ProtocolViolationError(
                    f"round {server_round}: a node's reply disagrees with the strategy's "
                    f"parameters ({'; '.join(problems)}). Does every node run SecAggCheckInMod?"
                )
        m = len(results)
        shapes = [tuple(a.shape) for a in self._model.values()]
        mean = parameters_to_ndarrays(results[0][1].parameters)
        try:
            decoded = decode_sum(mean, m, shapes, self.parameters)
        except ValueError as exc:
            raise ProtocolViolationError(f"round {server_round}: {exc}.") from None
        epsilon = self.epsilon()
        self.epsilons[server_round] = epsilon
        count = decoded.count
        if decoded.rejected:
            self.rounds_rejected += 1
            self.skip_reasons[server_round] = (
                f"round {server_round}: the decoded sum was rejected ({decoded.problem}); the "
                f"round is accounted (epsilon = {epsilon:.6g}) and the model is unchanged"
            )
            log(WARNING, "%s", self.skip_reasons[server_round])
        elif count:
            updated = {}
            for name, total in zip(self._model.keys(), decoded.sums, strict=True):
                base = self._model[name].numpy()
                value = base.astype(np.float64) + total / count
                updated[name] = Array(np.asarray(value, dtype=base.dtype))
            self._model = ArrayRecord(updated)
        values = self._metrics(m, -1 if count is None else count, int(decoded.rejected))
        self.round_metrics[server_round] = values
        log(
            INFO,
            "round %d: %d nodes in the secure sum, %s checked in, epsilon = %.6g (delta = %g)",
            server_round,
            m,
            "?" if count is None else count,
            epsilon,
            self.privacy.delta,
        )
        return None, dict(values)

    def _metrics(self, num_in_sum: int, count: int, rejected: int) -> dict[str, float | int]:
        return {
            "epsilon": self.epsilon(),
            "delta": self.privacy.delta,
            "rounds-accounted": self.rounds_accounted,
            "num-nodes": self.num_nodes,
            "population": self.population,
            "num-in-sum": num_in_sum,
            "num-dropped": self.num_nodes - num_in_sum,
            "num-checked-in": count,
            "sum-rejected": rejected,
            "rounds-rejected": self.rounds_rejected,
        }

    def configure_evaluate(
        self, server_round: int, parameters: Parameters, client_manager: ClientManager
    ) -> list[tuple[ClientProxy, EvaluateIns]]:
        """Return no instruction: client-side evaluation is not part of the protocol."""
        return []

    def aggregate_evaluate(
        self,
        server_round: int,
        results: list[tuple[ClientProxy, EvaluateRes]],
        failures: list[tuple[ClientProxy, EvaluateRes] | BaseException],
    ) -> tuple[float | None, dict[str, Scalar]]:
        """Return nothing: there is no client-side evaluation."""
        return None, {}

    def evaluate(
        self, server_round: int, parameters: Parameters
    ) -> tuple[float, dict[str, Scalar]] | None:
        """Return ``None``: :meth:`start` calls its ``evaluate_fn`` with the named model."""
        return None

    # --- the run ------------------------------------------------------------------------

    def summary(self) -> None:
        """Log the protocol's parameters."""
        p, s = self.privacy, self.parameters
        budget = "none" if self.max_epsilon is None else f"{self.max_epsilon:g}"
        lines = [
            "├──> Shuffled check-in on the nodes under SecAgg+ (no trusted server)",
            f"│\t├── nodes n = {self.num_nodes}, check-in rate = {p.rate:g} (drawn by each node)",
            f"│\t├── clip norm C = {p.clip_norm:g}, noise multiplier = {p.noise_multiplier:g}",
            f"│\t├── sensitivity = {p.sensitivity:g} C, delta = {p.delta:g}, method {p.method}",
            f"│\t├── max dropouts D = {self.max_dropouts}: accountant population n - D = "
            f"{self.population}",
        ]
        if s is not None:
            lines.append(
                f"│\t├── SecAgg+: {s.num_shares} shares, threshold {s.threshold}, clipping range "
                f"{s.clipping_range:.6g}, quantisation range {s.quantization_range}, modulus "
                f"{s.modulus_range}"
            )
        lines.append(f"│\t└── epsilon budget: {budget}")
        for line in lines:
            log(INFO, "\t%s", line)

    def verify_nodes(self, grid: Grid, timeout: float) -> None:
        """Check, before any round, that every node's mod accepts this run's parameters.

        Sends every node a training instruction with the privacy parameters, the mode, ``n``,
        ``D`` and the flag ``shuffle-dp.handshake``, no model; each node's
        :class:`~shuffle_opacus.flower.SecAggCheckInMod` answers with its echo or refuses
        (noise floor, check-in ceiling, sensitivity convention, mode), before SecAgg+ and
        without running the training code. Nothing is accounted.

        Raises:
            ProtocolViolationError: naming, in one line, what the disagreeing nodes replied.
        """
        node_ids = wait_for_population(grid, self.num_nodes, self.node_wait_timeout)
        check_nodes(grid, node_ids, self._echo(), timeout)

    def _budget_message(self, server_round: int) -> str:
        after = self.epsilon(self.rounds_accounted + 1)
        return (
            f"stopped before round {server_round}: epsilon would reach {after:.6g} > budget "
            f"{self.max_epsilon:g} (delta = {self.privacy.delta:g})"
        )

    def start(
        self,
        grid: Grid,
        initial_arrays: ArrayRecord,
        num_rounds: int = 3,
        timeout: float = 3600,
        train_config: ConfigRecord | None = None,
        evaluate_fn: Callable[[int, ArrayRecord], MetricRecord | None] | None = None,
    ) -> Result:
        """Run up to ``num_rounds`` SecAgg+ rounds; stop before one that would exceed the budget.

        First the SecAgg+ parameters are derived from C, σ, n, D and the model's size
        (:func:`~shuffle_opacus.flower.secagg.secagg_parameters`), then the start-up check.
        Each round is one run of Flower's ``SecAggPlusWorkflow`` (set-up, key sharing, masked
        vectors, unmasking) with :meth:`configure_fit` and :meth:`aggregate_fit`, then
        ``evaluate_fn`` on the server.

        Args:
            grid: The Grid of the ServerApp.
            initial_arrays: The initial model (floating-point arrays).
            num_rounds: Maximum number of rounds (integer >= 1).
            timeout: Seconds to wait for the replies of each SecAgg+ stage (> 0).
            train_config: Extra entries for every training instruction.
            evaluate_fn: Server-side evaluation ``f(round, arrays)``, called before the first
                round (round 0) and after every round; it may return ``None``.

        Returns:
            Flower's ``Result``: the final model and the metrics of every round.

        Raises:
            ValueError: for an argument outside its range (before anything is sent).
            ProtocolViolationError: as :meth:`verify_nodes` and :meth:`aggregate_fit`, when a
                node's reply to a SecAgg+ stage is malformed or the secure aggregation fails,
                and when a round's secure aggregation halts. In each case after the round's
                instructions went out, the round is accounted, its metrics are recorded (with
                ``num-in-sum = 0`` when nothing was decoded), :attr:`stop_reason` says why,
                and the error is that one line.
        """
        num_rounds = check_int("num_rounds", num_rounds, minimum=1)
        timeout = check_positive("timeout", timeout)
        extra = dict(train_config or {})
        reserved = {
            *CONFIG_KEYS.values(),
            HANDSHAKE_KEY,
            MODE_KEY,
            NUM_NODES_KEY,
            MAX_DROPOUTS_KEY,
            ARRAY_NAMES_KEY,
            "server-round",
        }
        clash = sorted(set(extra) & reserved)
        if clash:
            raise ValueError(f"train_config must not set {clash}: the strategy does.")
        if not isinstance(initial_arrays, ArrayRecord) or not len(initial_arrays):
            raise ValueError("initial_arrays must be a non-empty ArrayRecord.")
        sizes = []
        for name, array in initial_arrays.items():
            value = array.numpy()
            if not np.issubdtype(value.dtype, np.floating):
                raise ValueError(
                    f"initial_arrays[{name!r}] must be floating-point. Found {value.dtype}."
                )
            sizes.append(value.size)
        self.parameters = secagg_parameters(
            num_nodes=self.num_nodes,
            dimension=int(sum(sizes)),
            clip_norm=self.privacy.clip_norm,
            noise_multiplier=self.privacy.noise_multiplier,
            max_dropouts=self.max_dropouts,
        )
        self._grid, self._model, self._train_config = grid, initial_arrays, extra
        workflow = SecAggWorkflow(
            min_in_sum=self.population, timeout=timeout, **self.parameters.workflow_arguments()
        )
        workflow.shapes = [tuple(a.numpy().shape) for a in initial_arrays.values()]
        context = LegacyContext(
            Context(run_id=0, node_id=0, node_config={}, state=RecordDict(), run_config={}),
            config=ServerConfig(num_rounds=num_rounds),
            strategy=self,
        )
        log(INFO, "Starting %s for up to %d rounds", type(self).__name__, num_rounds)
        self.summary()
        result = Result()
        result.arrays = initial_arrays
        if evaluate_fn is not None:
            evaluation = evaluate_fn(0, initial_arrays)
            if evaluation is not None:
                result.evaluate_metrics_serverapp[0] = evaluation
        started = time.monotonic()
        if self.check_nodes_at_start and self.budget_allows_another_round():
            self.verify_nodes(grid, timeout)
        cfg = ConfigRecord({WorkflowKey.START_TIME: time.time()})
        context.state.config_records[MAIN_CONFIGS_RECORD] = cfg
        for server_round in range(1, num_rounds + 1):
            if not self.budget_allows_another_round():
                self.stop_reason = self._budget_message(server_round)
                log(INFO, "%s", self.stop_reason)
                break
            log(INFO, "")
            log(INFO, "[ROUND %d/%d]", server_round, num_rounds)
            cfg[WorkflowKey.CURRENT_ROUND] = server_round
            context.state.array_records[MAIN_PARAMS_RECORD] = self._model
            accounted = self.rounds_accounted
            failure = self._run_round(workflow, grid, context, server_round)
            if failure is not None:
                self._stop(server_round, accounted, failure)
            result.arrays = self._model
            result.train_metrics_clientapp[server_round] = MetricRecord(
                dict(self.round_metrics[server_round])
            )
            if evaluate_fn is not None:
                evaluation = evaluate_fn(server_round, self._model)
                if evaluation is not None:
                    result.evaluate_metrics_serverapp[server_round] = evaluation
                    log(INFO, "round %d: server evaluation %s", server_round, dict(evaluation))
        log(INFO, "strategy finished in %.2f s", time.monotonic() - started)
        return result

    def _run_round(
        self, workflow: SecAggWorkflow, grid: Grid, context: LegacyContext, server_round: int
    ) -> str | None:
        """Run one round of the workflow; return why it could not finish (``None``: it did)."""
        try:
            # A weight factor a node changed can make Flower divide by zero: the decoded sum
            # is then not finite, and decode_sum rejects it (instead of a numpy warning).
            with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
                workflow(grid, context)
        except ProtocolViolationError as exc:
            return str(exc).rstrip(".")
        except Exception as exc:  # noqa: BLE001 - one line instead of Flower's traceback
            log(DEBUG, "round %d: the secure aggregation failed", server_round, exc_info=exc)
            first = (str(exc).splitlines() or [""])[0][:200]
            return (
                f"round {server_round}: the secure aggregation failed at the "
                f"'{workflow.stage}' stage ({type(exc).__name__}: {first})"
            )
        if server_round in self.round_metrics:
            return None
        reasons = "; ".join(sorted(workflow.reasons)) or "no reply"
        return (
            f"round {server_round}: the secure aggregation halted at the "
            f"'{workflow.halted_at}' stage ({reasons})"
        )

    def _stop(self, server_round: int, accounted: int, reason: str) -> None:
        """Record a round that could not finish, set :attr:`stop_reason` and end the run.

        Raises:
            ProtocolViolationError: always, with ``reason`` and what was accounted.
        """
        self._open_round = None
        if self.rounds_accounted == accounted:  # nothing went out: nothing to record
            raise ProtocolViolationError(reason + ".")
        epsilon = self.epsilon()
        self.epsilons[server_round] = epsilon
        outcome = "the model is unchanged"
        if server_round in self.round_metrics:
            outcome = "the model is as that round left it"
        else:
            self.round_metrics[server_round] = self._metrics(0, 0, 0)
        self.stop_reason = (
            f"{reason}; the round is accounted (epsilon = {epsilon:.6g}) and {outcome}"
        )
        log(WARNING, "%s", self.stop_reason)
        raise ProtocolViolationError(self.stop_reason + ".")
