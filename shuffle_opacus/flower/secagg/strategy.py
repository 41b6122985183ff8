"""The server side of the secure-aggregation mode: SecAgg+ rounds, decoding, ε after each round.

:class:`SecAggCheckInFedAvg` runs the shuffled check-in protocol without a trusted server: every
round it sends the model to all ``n`` nodes through Flower's SecAgg+ (Bell et al., CCS 2020,
IACR ePrint 2020/704); each node's :class:`~shuffle_opacus.flower.SecAggCheckInMod` flips its own
coin and contributes its clipped, noised report or zeros plus a count; the server recovers only
the sum and the number ``K`` that checked in, and moves the model by their ratio. SecAgg+ exists
in Flower 1.41 only as a legacy workflow, so this is a legacy ``Strategy`` driven round by round
by :class:`~shuffle_opacus.flower.secagg.workflow.SecAggWorkflow` (which halts a round missing
more than ``D`` nodes and checks every reply's form). A decoded sum no honest round produces is
rejected (:func:`~shuffle_opacus.flower.secagg.decode.decode_sum`). The start-up check, the budget
stop and the round bookkeeping are :class:`~shuffle_opacus.flower.checkin_base.CheckInBase`'s.
ε is the check-in accountant's with population ``n − D``: ``epsilon`` every round by the
configured method (the tight ``pld`` by default), the proven ε (``epsilon-proven``, method
``proven``) at evaluation rounds and the last round only, as it costs more per round (see
:class:`~shuffle_opacus.flower.checkin_base.CheckInBase`); the privacy statement and what it
assumes are in ``docs/flower.md``. No client-side evaluation.
"""

from __future__ import annotations

import time
from logging import DEBUG, INFO, WARNING
from typing import Any, cast

import numpy as np
from flwr.app import (
    Array,
    ArrayRecord,
    ConfigRecord,
    Context,
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

from ...common.validation import check_int, check_positive
from ..checkin_base import CheckInBase, EvaluateFn, ProtocolViolationError, check_privacy
from ..config import (
    ARRAY_NAMES_KEY,
    CONFIG_KEYS,
    ECHO_RECORD_KEY,
    HANDSHAKE_KEY,
    MAX_DROPOUTS_KEY,
    MODE_KEY,
    NUM_NODES_KEY,
    SECAGG,
    ShufflePrivacyConfig,
    echo_differences,
    secagg_echo,
)
from .decode import decode_sum
from .parameters import SecAggParameters, secagg_parameters
from .workflow import SecAggWorkflow

__all__ = ["SECAGG_ROUND_METRIC_KEYS", "SecAggCheckInFedAvg"]

#: Keys of the MetricRecord the strategy records for every round of the secure-aggregation mode
#: (``start`` adds :data:`~shuffle_opacus.flower.checkin_base.EPSILON_PROVEN_KEY` at evaluation
#: rounds and the last round).
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


class SecAggCheckInFedAvg(CheckInBase, Strategy):
    """Node-side check-in under SecAgg+, the check-in accountant and an ε budget.

    Attributes:
        privacy: σ, C, γ, δ, sensitivity convention and analysis method.
        num_nodes: ``n``: every round's secure sum is over all of them.
        max_dropouts: ``D``: the most nodes a released sum may miss.
        max_epsilon: ε budget at ``privacy.delta`` (``None``: none).
        parameters: The :class:`~shuffle_opacus.flower.secagg.parameters.SecAggParameters` of the
            run (set by :meth:`start`, which knows the model's size).
        history: Accounted rounds ``(noise_multiplier, rate, rounds)``.
        epsilons: ε after each round that ran, by round number.
        epsilons_proven: The proven ε after the evaluation rounds and the last round.
        round_metrics: The metrics of each round (:data:`SECAGG_ROUND_METRIC_KEYS`, and
            ``epsilon-proven`` at evaluation rounds and the last round).
        stop_reason: Why :meth:`start` ended before ``num_rounds`` (``None`` otherwise).
        skip_reasons: Why the update of a round was not applied, by round number (its
            decoded sum failed :func:`~shuffle_opacus.flower.secagg.decode.decode_sum`).
        rounds_rejected: Number of rounds whose decoded sum was rejected.
    """

    mode = SECAGG
    mod_name = "SecAggCheckInMod"

    def __init__(
        self,
        *,
        privacy: ShufflePrivacyConfig,
        num_nodes: int,
        max_dropouts: int = 0,
        max_epsilon: float | None = None,
        node_wait_timeout: float = 600.0,
        verify_nodes: bool = True,
        report_proven: bool = True,
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
            report_proven: Record the proven ε (``epsilon-proven``) at evaluation rounds and
                the last round (default); ``False`` skips it (:meth:`epsilon_proven` still
                computes it on demand).

        Raises:
            ValueError: for an argument outside its range.
        """
        privacy = check_privacy(privacy)
        secagg_parameters(
            num_nodes=num_nodes,
            dimension=1,
            clip_norm=privacy.clip_norm,
            noise_multiplier=privacy.noise_multiplier,
            max_dropouts=max_dropouts,
        )
        super().__init__()
        self._init_checkin(
            privacy, num_nodes, max_epsilon, node_wait_timeout, verify_nodes, report_proven
        )
        self.max_dropouts = int(max_dropouts)
        self.parameters: SecAggParameters | None = None
        self.skip_reasons: dict[int, str] = {}
        self.rounds_rejected = 0
        self._grid: Grid | None = None
        self._model: ArrayRecord | None = None
        self._train_config: dict[str, Any] = {}
        self._open_round: int | None = None
        self._workflow: SecAggWorkflow | None = None
        self._context: LegacyContext | None = None

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
        node_ids = self._population(self._grid)
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
        masked vectors entered the sum. :func:`~shuffle_opacus.flower.secagg.decode.decode_sum`
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
            f"│\t├── sensitivity = {p.sensitivity:g} C, delta = {p.delta:g}, epsilon by method "
            f"{p.method or 'pld (default)'}, epsilon-proven by method proven (evaluation rounds "
            "and the last round)",
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

    def _handshake_config(self) -> tuple[str, ConfigRecord]:
        return "config", ConfigRecord({**self._echo(), HANDSHAKE_KEY: True})

    def _echo_problems(self, content: RecordDict) -> list[str]:
        records = content.config_records
        if ECHO_RECORD_KEY not in records or len(content.array_records):
            return [
                "a reply is not the secure-aggregation mode's echo (does the node run "
                "SecAggCheckInMod?)"
            ]
        return echo_differences(self._echo(), records[ECHO_RECORD_KEY])

    def start(
        self,
        grid: Grid,
        initial_arrays: ArrayRecord,
        num_rounds: int = 3,
        timeout: float = 3600,
        train_config: ConfigRecord | None = None,
        evaluate_fn: EvaluateFn | None = None,
    ) -> Result:
        """Run up to ``num_rounds`` SecAgg+ rounds; stop before one that would exceed the budget.

        First the SecAgg+ parameters are derived from C, σ, n, D and the model's size
        (:func:`~shuffle_opacus.flower.secagg.parameters.secagg_parameters`), then the start-up
        check. Each round is one run of Flower's ``SecAggPlusWorkflow`` (set-up, key sharing, masked
        vectors, unmasking) with :meth:`configure_fit` and :meth:`aggregate_fit`, then
        ``evaluate_fn`` on the server. Every round's metrics carry ``epsilon`` (the configured
        method, the tight ``pld`` by default); the evaluation rounds (``evaluate_fn`` returned
        metrics) and the last round also carry ``epsilon-proven`` (method ``proven``, not
        computed every round: it costs more per round); :meth:`guarantees` says what each
        rests on.

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
        cfg = ConfigRecord({WorkflowKey.START_TIME: time.time()})
        context.state.config_records[MAIN_CONFIGS_RECORD] = cfg
        self._workflow, self._context = workflow, context
        return self._run(grid, initial_arrays, num_rounds, timeout, evaluate_fn)

    def _play_round(
        self, server_round: int, arrays: ArrayRecord, grid: Grid, timeout: float
    ) -> ArrayRecord:
        """Run one round of the workflow from the strategy's model; return the model after it.

        Raises:
            ProtocolViolationError: with one line saying why the round could not finish.
        """
        workflow, context = self._workflow, self._context
        if workflow is None or context is None:
            raise RuntimeError("the round's workflow is set by start(); call start().")
        context.state.config_records[MAIN_CONFIGS_RECORD][WorkflowKey.CURRENT_ROUND] = server_round
        context.state.array_records[MAIN_PARAMS_RECORD] = arrays
        reason = None
        try:
            # A weight factor a node changed can make Flower divide by zero: the decoded sum
            # is then not finite, and decode_sum rejects it (instead of a numpy warning).
            with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
                workflow(grid, context)
        except ProtocolViolationError as exc:
            reason = str(exc).rstrip(".")
        except Exception as exc:  # noqa: BLE001 - one line instead of Flower's traceback
            log(DEBUG, "round %d: the secure aggregation failed", server_round, exc_info=exc)
            first = (str(exc).splitlines() or [""])[0][:200]
            reason = (
                f"round {server_round}: the secure aggregation failed at the "
                f"'{workflow.stage}' stage ({type(exc).__name__}: {first})"
            )
        if reason is None and server_round not in self.round_metrics:
            reasons = "; ".join(sorted(workflow.reasons)) or "no reply"
            reason = (
                f"round {server_round}: the secure aggregation halted at the "
                f"'{workflow.halted_at}' stage ({reasons})"
            )
        if reason is not None:
            self._open_round = None
            raise ProtocolViolationError(reason)
        return cast(ArrayRecord, self._model)  # aggregate_fit keeps the model, named

    def _failed_round_metrics(self, server_round: int) -> dict[str, float | int]:
        """Return the metrics of a round whose sum was not decoded (``num-in-sum = 0``)."""
        return self._metrics(0, 0, 0)
