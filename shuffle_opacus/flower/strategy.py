"""The server side of the trusted-server mode: FedAvg under the shuffled check-in protocol.

:class:`ShuffleCheckInFedAvg` wraps Flower's message-API ``FedAvg``. In every round it waits for
exactly ``num_nodes`` nodes, flips one coin with probability γ per node
(:func:`~shuffle_opacus.flower.shuffler.check_in`) and sends the model to the nodes that checked
in; the replies lose their node identities and are permuted
(:func:`~shuffle_opacus.flower.shuffler.shuffle_replies`), must echo the run's privacy
parameters and the model's shapes (else :class:`ProtocolViolationError`), are dropped beyond
:meth:`~ShuffleCheckInFedAvg.report_bound`, and FedAvg averages the rest. Every configured
round, an empty one included, is accounted by the check-in accountant (population
``num_nodes``): ``epsilon`` every round by the configured method (the tight ``pld`` by
default), and beside it the proven ε (``epsilon-proven``, method ``proven``) at evaluation
rounds and the last round only, because it costs more per round (see
:class:`~shuffle_opacus.flower.checkin_base.CheckInBase`). The start-up check, the budget stop
and the round bookkeeping are
:class:`~shuffle_opacus.flower.checkin_base.CheckInBase`'s. The privacy statement (Theorem 1 of
Liew & Takahashi, arXiv:2206.09569, with a trusted shuffler) is in ``docs/flower.md``. No
client-side evaluation: evaluate on the server with public data (``evaluate_fn``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from logging import INFO, WARNING
from typing import cast

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.common import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy import FedAvg, Result

from ..accounting.protocols import get_protocol
from ..common.validation import check_int, check_positive
from .checkin_base import (
    CheckInBase,
    EvaluateFn,
    ProtocolViolationError,
    check_privacy,
    wait_for_population,
)
from .config import (
    CONFIG_KEYS,
    HANDSHAKE_KEY,
    NUM_EXAMPLES_KEY,
    TRUSTED_SERVER,
    ShufflePrivacyConfig,
)
from .shuffler import ShuffledReplies, check_in, make_rng, shuffle_replies

__all__ = [
    "HONEST_REPORT_TAIL",
    "ROUND_METRIC_KEYS",
    "ProtocolViolationError",
    "ShuffleCheckInFedAvg",
    "wait_for_population",
]

_CHECKIN = get_protocol("checkin")

#: Keys of the MetricRecord the strategy records for every round (``start`` adds
#: :data:`~shuffle_opacus.flower.checkin_base.EPSILON_PROVEN_KEY` at evaluation rounds and the
#: last round).
ROUND_METRIC_KEYS: tuple[str, ...] = (
    "epsilon",
    "delta",
    "rounds-accounted",
    "num-nodes",
    "num-checked-in",
    "num-reports",
    "num-dropped",
    "num-rejected",
)

#: Probability with which an honest report may exceed
#: :meth:`ShuffleCheckInFedAvg.report_bound` (and be dropped).
HONEST_REPORT_TAIL = 1e-12


class ShuffleCheckInFedAvg(CheckInBase, FedAvg):
    """FedAvg with check-in, a shuffler, the check-in accountant and an ε budget.

    Attributes:
        privacy: The :class:`~shuffle_opacus.flower.config.ShufflePrivacyConfig`.
        num_nodes: Population ``n``: the number of nodes, each one unit of privacy.
        max_epsilon: ε budget at ``privacy.delta`` (``None``: none).
        history: Accounted rounds in Opacus's format ``(noise_multiplier, rate, rounds)``.
        epsilons: ε after each round that ran, by round number.
        epsilons_proven: The proven ε after the evaluation rounds and the last round.
        round_metrics: The metrics of each round that ran (:data:`ROUND_METRIC_KEYS`, and
            ``epsilon-proven`` at evaluation rounds and the last round).
        stop_reason: Why :meth:`start` ended before ``num_rounds`` (``None`` otherwise).
    """

    mode = TRUSTED_SERVER
    mod_name = "LocalShuffleDPMod"

    def __init__(
        self,
        *,
        privacy: ShufflePrivacyConfig,
        num_nodes: int,
        max_epsilon: float | None = None,
        seed: int | None = None,
        node_wait_timeout: float = 600.0,
        tolerate_dropouts: bool = False,
        verify_nodes: bool = True,
        report_proven: bool = True,
        arrayrecord_key: str = "arrays",
        configrecord_key: str = "config",
    ) -> None:
        """Create the strategy.

        Args:
            privacy: σ, C, γ, δ, sensitivity convention and analysis method.
            num_nodes: Number of nodes ``n`` (integer >= 1); every round waits until exactly
                this many are connected.
            max_epsilon: ε budget (> 0) or ``None``; see :meth:`start`.
            seed: ``None`` (default): check-in coins and shuffling from the operating system's
                secure source (:class:`random.SystemRandom`); an integer >= 0: a seeded
                generator, reproducible, for tests and experiments only.
            node_wait_timeout: Seconds to wait for the ``num_nodes`` nodes (> 0).
            tolerate_dropouts: If ``False`` (default), a node that checked in and did not send
                a report stops the run; if ``True`` the round goes on without it, which the
                analysis does not cover (logged, and counted in ``num-dropped``).
            verify_nodes: Run the start-up check (:meth:`verify_nodes`) in :meth:`start`
                before the first round (default). It costs one exchange with every node
                without a model; switch it off only where the nodes are known to agree.
            report_proven: Record the proven ε (``epsilon-proven``) at evaluation rounds and
                the last round (default). ``False`` skips it (where it would take long: it
                costs more than the tight ε, and much more at some settings, e.g. tiny σ or
                γ); :meth:`epsilon_proven` still computes it on demand.
            arrayrecord_key: Key of the model in instructions (FedAvg's).
            configrecord_key: Key of the config in instructions (FedAvg's).

        Raises:
            ValueError: for an argument outside its range.
        """
        privacy = check_privacy(privacy)
        num_nodes = check_int("num_nodes", num_nodes, minimum=1)
        _CHECKIN.sample_rate(population=num_nodes, rate=privacy.rate)
        if not isinstance(tolerate_dropouts, bool):
            raise ValueError(
                f"tolerate_dropouts must be True or False. Found {tolerate_dropouts!r}."
            )
        self._init_checkin(
            privacy, num_nodes, max_epsilon, node_wait_timeout, verify_nodes, report_proven
        )
        rng = make_rng(seed)
        super().__init__(
            fraction_train=1.0,
            fraction_evaluate=0.0,
            min_train_nodes=0,
            min_evaluate_nodes=0,
            min_available_nodes=num_nodes,
            weighted_by_key=NUM_EXAMPLES_KEY,
            arrayrecord_key=arrayrecord_key,
            configrecord_key=configrecord_key,
        )
        self.tolerate_dropouts = tolerate_dropouts
        self._rng = rng
        self._open_rounds: dict[int, tuple[int, dict[str, tuple[tuple[int, ...], np.dtype]]]] = {}
        self._sent: dict[int, dict[str, np.ndarray]] = {}
        self._counts: tuple[int, int, int] = (0, 0, 0)
        self._train_config = ConfigRecord()
        if privacy.delta >= 1.0 / num_nodes:
            log(
                WARNING,
                "delta = %g is not below 1 / num_nodes = %g: a mechanism that publishes one "
                "node's data at random would meet it",
                privacy.delta,
                1.0 / num_nodes,
            )

    # --- accounting ---------------------------------------------------------------------

    @property
    def accounting_population(self) -> int:
        """``num_nodes``: every node may check in."""
        return self.num_nodes

    def report_bound(self, dimension: int) -> float:
        """Return the L2 distance from the model sent beyond which a report is dropped.

        An honest report is ``received + clipped update + noise`` with the update's norm at
        most ``C`` and the noise ``σC Z``, ``Z ~ N(0, I_d)`` over all ``d`` coordinates. By the
        Gaussian concentration of the norm (Laurent and Massart, *Adaptive estimation of a
        quadratic functional by model selection*, Annals of Statistics 28(5), 2000, Lemma 1:
        ``P(|Z|² >= d + 2 sqrt(d x) + 2x) <= exp(-x)``, and ``d + 2 sqrt(d x) + 2x <=
        (sqrt(d) + sqrt(2x))²``), ``|Z| < sqrt(d) + sqrt(2 log(1/p))`` except with probability
        ``p =`` :data:`HONEST_REPORT_TAIL`. So an honest report lies within

            ``C + σC (sqrt(d) + sqrt(2 log(1/p)))``

        of the model sent, except with probability at most ``p`` (10⁻¹²). Rounding to the
        model's dtype is allowed for separately (see :meth:`aggregate_train`).

        Args:
            dimension: ``d``, the number of coordinates of the model (integer >= 1).

        Returns:
            The bound, in parameter units.

        Raises:
            ValueError: for a dimension that is not an integer >= 1.
        """
        d = check_int("dimension", dimension, minimum=1)
        c, sigma = self.privacy.clip_norm, self.privacy.noise_multiplier
        return c + sigma * c * (math.sqrt(d) + math.sqrt(2.0 * math.log(1.0 / HONEST_REPORT_TAIL)))

    # --- rounds -------------------------------------------------------------------------

    def summary(self) -> None:
        """Log the protocol's parameters."""
        p = self.privacy
        log(INFO, "\t├──> Shuffled check-in (user level, one node = one unit of privacy)")
        log(INFO, "\t│\t├── nodes n = %d, check-in rate = %g", self.num_nodes, p.rate)
        log(INFO, "\t│\t├── clip norm C = %g", p.clip_norm)
        log(INFO, "\t│\t├── noise multiplier = %g", p.noise_multiplier)
        log(INFO, "\t│\t├── sensitivity = %g C, delta = %g", p.sensitivity, p.delta)
        log(
            INFO,
            "\t│\t├── check-in analysis: epsilon by method %s, epsilon-proven by method proven "
            "(evaluation rounds and the last round)",
            p.method or "pld (default)",
        )
        budget = "none" if self.max_epsilon is None else f"{self.max_epsilon:g}"
        log(INFO, "\t│\t└── epsilon budget: %s", budget)
        log(INFO, "\t└──> No client-side evaluation (it would release unaccounted statistics)")

    def _instruction_config(self, server_round: int, config: ConfigRecord) -> ConfigRecord:
        clash = sorted(set(config) & {*CONFIG_KEYS.values(), HANDSHAKE_KEY})
        if clash:
            raise ValueError(
                f"train_config must not set {clash}: the strategy's ShufflePrivacyConfig does."
            )
        out = ConfigRecord(dict(config))
        out["server-round"] = server_round
        for key, value in self.privacy.to_config().items():
            out[key] = value
        return out

    def _handshake_config(self) -> tuple[str, ConfigRecord]:
        config = ConfigRecord({**self.privacy.to_config(), HANDSHAKE_KEY: True})
        return self.configrecord_key, config

    def _echo_problems(self, content: RecordDict) -> list[str]:
        metrics = list(content.metric_records.values())
        if len(metrics) != 1 or len(content.array_records) or len(content.config_records):
            return ["a reply is not the mod's echo (is LocalShuffleDPMod the first mod?)"]
        return self.privacy.differences(metrics[0])

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> list[Message]:
        """Check in the nodes of round ``server_round`` and return their instructions.

        Accounts the round once the coins are drawn (also when nobody checked in). Returns no
        instruction, and accounts nothing, once the budget forbids another round.

        Returns:
            One training instruction per node that checked in (a list, possibly empty).

        Raises:
            ProtocolViolationError: if not exactly ``num_nodes`` nodes are connected.
            ValueError: if ``config`` sets one of the privacy keys itself.
        """
        if self.stop_reason is not None:
            return []
        if not self.budget_allows_another_round():
            self.stop_reason = self._budget_message(server_round)
            return []
        instruction = self._instruction_config(server_round, config)
        node_ids = self._population(grid)
        chosen = check_in(node_ids, self.privacy.rate, self._rng)
        shapes = {name: (tuple(a.shape), np.dtype(a.dtype)) for name, a in arrays.items()}
        self._account_round()
        self._open_rounds[server_round] = (len(chosen), shapes)
        if chosen:
            self._sent[server_round] = {
                name: np.asarray(a.numpy(), dtype=np.float64) for name, a in arrays.items()
            }
        log(INFO, "check-in: %d of %d nodes", len(chosen), len(node_ids))
        record = RecordDict({self.arrayrecord_key: arrays, self.configrecord_key: instruction})
        return [
            Message(content=record, dst_node_id=node, message_type=MessageType.TRAIN)
            for node in chosen
        ]

    def _check_report(self, server_round: int, report: Message, shapes: dict) -> None:
        content = report.content
        metrics = list(content.metric_records.values())
        arrays = list(content.array_records.items())
        if len(metrics) != 1 or len(arrays) != 1 or len(content.config_records) != 0:
            raise ProtocolViolationError(
                f"round {server_round}: a reply holds {len(arrays)} ArrayRecords, "
                f"{len(metrics)} MetricRecords and {len(content.config_records)} "
                f"ConfigRecords; the shuffle-model mod sends exactly one of the first two (is "
                f"LocalShuffleDPMod the first mod of the ClientApp?)."
            )
        problems = self.privacy.differences(metrics[0])
        if problems:
            raise ProtocolViolationError(
                f"round {server_round}: a reply disagrees with the strategy's privacy "
                f"parameters ({'; '.join(problems)})."
            )
        key, record = arrays[0]
        if key != self.arrayrecord_key or set(record.keys()) != set(shapes):
            raise ProtocolViolationError(
                f"round {server_round}: a reply's arrays do not match the model that was sent."
            )
        for name, array in record.items():
            value = array.numpy()
            if (tuple(value.shape), np.dtype(value.dtype)) != shapes[name]:
                raise ProtocolViolationError(
                    f"round {server_round}: array {name!r} came back with shape {value.shape} "
                    f"and dtype {value.dtype}; sent {shapes[name]}."
                )

    def _within_bound(self, report: Message, model: dict[str, np.ndarray]) -> bool:
        """Whether a (checked) report lies within :meth:`report_bound` of the model sent."""
        ((_, record),) = report.content.array_records.items()
        squared, size, scale, unit = 0.0, 0, 0.0, 0.0
        for name, array in record.items():
            value = array.numpy()
            base = model[name]
            if not np.all(np.isfinite(value)):
                return False
            diff = value.astype(np.float64) - base
            squared += float(np.dot(diff.ravel(), diff.ravel()))
            scale += float(np.dot(base.ravel(), base.ravel()))
            size += base.size
            unit = max(unit, float(np.finfo(value.dtype).eps))
        bound = self.report_bound(max(size, 1))
        # The mod computes in float64 and rounds each coordinate to the model's dtype: an
        # error of at most eps/2 of the value, so at most eps/2 (|model| + bound) in norm.
        return math.sqrt(squared) <= bound + unit * (math.sqrt(scale) + bound)

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Shuffle the replies, check them, drop the out-of-bound ones, average, report ε.

        A report whose distance to the model sent exceeds :meth:`report_bound` (or that holds
        a non-finite value) cannot come from a node that follows the protocol, except with
        probability :data:`HONEST_REPORT_TAIL`; it is dropped before averaging and counted in
        ``num-rejected``. The test looks at each report of the anonymous multiset alone, so it
        is post-processing of the shuffler's output and changes no privacy number.

        Returns:
            ``(arrays, metrics)``: the average of the reports (``None`` when there is none)
            and the round's metrics (:data:`ROUND_METRIC_KEYS`); ``(None, None)`` for a round
            that was not configured (after the budget stop).

        Raises:
            ProtocolViolationError: on a reply that does not fit the protocol, or a dropout
                unless ``tolerate_dropouts``.
        """
        if server_round not in self._open_rounds:
            return None, None
        sent, shapes = self._open_rounds.pop(server_round)
        model = self._sent.pop(server_round, {})
        shuffled: ShuffledReplies = shuffle_replies(replies, self._rng)
        reports = shuffled.reports
        dropped = sent - len(reports)
        self._counts = (sent, len(reports), dropped)
        if dropped:
            reasons = "; ".join(shuffled.error_reasons) or "no reply"
            message = (
                f"round {server_round}: {dropped} of {sent} nodes that checked in sent no "
                f"report ({reasons})"
            )
            if not self.tolerate_dropouts:
                raise ProtocolViolationError(
                    message + "; the check-in analysis assumes every participant reports "
                    "(tolerate_dropouts=True continues outside the analysis)."
                )
            log(WARNING, "%s; continuing outside the analysis", message)
        for report in reports:
            self._check_report(server_round, report, shapes)
        kept = [report for report in reports if self._within_bound(report, model)]
        rejected = len(reports) - len(kept)
        if rejected:
            log(
                WARNING,
                "round %d: %d of %d reports lie beyond the bound an honest report meets and "
                "were dropped",
                server_round,
                rejected,
                len(reports),
            )
        arrays = None
        if kept:
            arrays, _ = super().aggregate_train(server_round, kept)
        self.epsilons[server_round] = self.epsilon()
        values = self._metrics(sent, len(reports), dropped, rejected)
        self.round_metrics[server_round] = values
        return arrays, MetricRecord(dict(values))

    def _metrics(
        self, checked_in: int, reports: int, dropped: int, rejected: int
    ) -> dict[str, float | int]:
        return {
            "epsilon": self.epsilon(),
            "delta": self.privacy.delta,
            "rounds-accounted": self.rounds_accounted,
            "num-nodes": self.num_nodes,
            "num-checked-in": checked_in,
            "num-reports": reports,
            "num-dropped": dropped,
            "num-rejected": rejected,
        }

    def _failed_round_metrics(self, server_round: int) -> dict[str, float | int]:
        """Return the counts established before the round failed (``num-rejected`` 0)."""
        return self._metrics(*self._counts, 0)

    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> list[Message]:
        """Return no instruction: client-side evaluation is not part of the protocol."""
        return []

    def aggregate_evaluate(
        self, server_round: int, replies: Iterable[Message]
    ) -> MetricRecord | None:
        """Return ``None``: there is no client-side evaluation."""
        return None

    def start(
        self,
        grid: Grid,
        initial_arrays: ArrayRecord,
        num_rounds: int = 3,
        timeout: float = 3600,
        train_config: ConfigRecord | None = None,
        evaluate_config: ConfigRecord | None = None,
        evaluate_fn: EvaluateFn | None = None,
    ) -> Result:
        """Run up to ``num_rounds`` rounds; stop before a round that would exceed the budget.

        First the start-up check (:meth:`verify_nodes`, unless switched off or the budget
        allows no round). Then each round: check-in and instructions (:meth:`configure_train`),
        the replies of the nodes that checked in (none are waited for in an empty round),
        shuffling, checks, averaging and accounting (:meth:`aggregate_train`), then
        ``evaluate_fn`` on the server, the proven ε where ``evaluate_fn`` returned metrics and
        at the last round, and one JSON line on the log
        (:func:`~shuffle_opacus.flower.checkin_base.round_line`). The round's metrics go to
        ``result.train_metrics_clientapp[round]``: ``epsilon`` (the configured method, the
        tight ``pld`` by default) every round, ``epsilon-proven`` (method ``proven``, not
        computed every round: it costs more per round) at evaluation rounds and the last
        round; :meth:`guarantees` says what each rests on.

        Args:
            grid: The Grid of the ServerApp.
            initial_arrays: The initial model.
            num_rounds: Maximum number of rounds (integer >= 1).
            timeout: Seconds to wait for a round's replies (> 0).
            train_config: Extra entries for every training instruction.
            evaluate_config: Must be ``None`` or empty (no client-side evaluation).
            evaluate_fn: Server-side evaluation ``f(round, arrays)``, called before the first
                round (round 0) and after every round; it may return ``None`` to skip.

        Returns:
            Flower's ``Result``: the final arrays (the initial ones if no round aggregated)
            and the metrics of every round that ran.

        Raises:
            ValueError: for an argument outside its range (before any round).
            ProtocolViolationError: as :meth:`verify_nodes`, :meth:`configure_train` and
                :meth:`aggregate_train`. A round that fails after its instructions went out
                (a malformed reply, a dropout) is accounted, its metrics are recorded (the
                counts established so far, ``num-rejected`` 0), :attr:`stop_reason` says why,
                and the error is that one line.
        """
        num_rounds = check_int("num_rounds", num_rounds, minimum=1)
        timeout = check_positive("timeout", timeout)
        if evaluate_config:
            raise ValueError("evaluate_config must be empty: there is no client-side evaluation.")
        train_config = ConfigRecord() if train_config is None else train_config
        self._instruction_config(0, train_config)  # refuses clashing keys before any round
        self._train_config = train_config
        return self._run(grid, initial_arrays, num_rounds, timeout, evaluate_fn)

    def _play_round(
        self, server_round: int, arrays: ArrayRecord, grid: Grid, timeout: float
    ) -> ArrayRecord:
        """Check-in and instructions, the replies, then shuffling, checks and averaging."""
        self._counts = (0, 0, 0)
        messages = self.configure_train(server_round, arrays, self._train_config, grid)
        if server_round in self._open_rounds:
            self._counts = (self._open_rounds[server_round][0], 0, 0)
        replies = list(grid.send_and_receive(messages, timeout=timeout)) if messages else []
        new_arrays, metrics = self.aggregate_train(server_round, replies)
        if metrics is not None:
            log(
                INFO,
                "round %d: %d reports, epsilon = %.6g (delta = %g)",
                server_round,
                int(cast(int, metrics["num-reports"])),
                float(cast(float, metrics["epsilon"])),
                self.privacy.delta,
            )
        return arrays if new_arrays is None else new_arrays
