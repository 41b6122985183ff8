"""The server side: FedAvg under the shuffled check-in protocol, with ε after every round.

:class:`ShuffleCheckInFedAvg` wraps Flower's message-API ``FedAvg``:

* **check-in** (:meth:`~ShuffleCheckInFedAvg.configure_train`): it waits until exactly
  ``num_nodes`` nodes are connected (the population ``n`` the accountant uses), flips one coin
  with probability γ per node (:func:`~shuffle_opacus.flower.shuffler.check_in`) and sends the
  current model and the privacy parameters to the nodes that checked in. A round where nobody
  checked in sends nothing, leaves the model as it is, and is still a round of the protocol:
  it is accounted and its metrics are recorded;
* **shuffler** (:meth:`~ShuffleCheckInFedAvg.aggregate_train`): the replies lose their node
  identities and are permuted (:func:`~shuffle_opacus.flower.shuffler.shuffle_replies`) before
  anything else looks at them; every reply must echo the strategy's σ, C, γ, δ and
  sensitivity (:meth:`~shuffle_opacus.flower.config.ShufflePrivacyConfig.differences`) and
  have the shapes of the model sent, or the run stops with :class:`ProtocolViolationError`;
  a report farther from the model sent than an honest one can be
  (:meth:`~ShuffleCheckInFedAvg.report_bound`, non-finite values included) is dropped and
  counted in the round's ``num-rejected``; FedAvg then averages the remaining anonymous reports
  with equal weights;
* **accountant**: every round that was configured is accounted by the package's check-in
  analysis (:func:`shuffle_opacus.history_epsilon` with protocol ``checkin``, population
  ``num_nodes``), and the round's ``MetricRecord`` carries ``epsilon`` (at ``delta``);
* **budget stop** (:meth:`~ShuffleCheckInFedAvg.start`): before each round, if the ε after one
  more round would exceed ``max_epsilon``, the run ends without running that round;
* **start-up check** (:meth:`~ShuffleCheckInFedAvg.verify_nodes`): before the first round,
  every node receives the privacy parameters alone (no model) and its mod must echo them; a
  node without the mod, with a higher noise floor or another sensitivity convention stops the
  run with one line naming the problem, before any round is run or accounted.

Privacy statement (user level). Neighbouring federations differ in the whole dataset of one
node (replace-one). Under the sensitivity convention of the configuration, the node's two
possible clipped updates are ``2C`` (``replace-one``) or ``C`` (``paper``) apart; each report
adds ``N(0, σ²C²)`` per coordinate; check-in coins are independent of the data; the analyst
sees only, per round, the number of reports and their multiset (trusted shuffler, see
:mod:`shuffle_opacus.flower.shuffler`), and every node that checked in reports (the run stops
on a missing report unless ``tolerate_dropouts``; dropouts are outside the analysis). Then the
released models and round metrics are (ε, δ)-DP with the ε reported, by Theorem 1 of Liew &
Takahashi (*Shuffle Gaussian Mechanism for Differential Privacy*, arXiv:2206.09569) averaged
over the binomial number of check-ins (method ``exact``; see ``docs/maths.md``), RDP composition
over rounds and the RDP-to-DP conversion of that paper's Lemma 2.

Client-side evaluation is not part of the protocol (its replies would release unaccounted
statistics): this strategy sends no evaluation instructions. Evaluate on the server with
public data (``evaluate_fn``).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable
from logging import INFO, WARNING
from typing import cast

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.common import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy import FedAvg, Result

from ..accounting import history_epsilon
from ..analysis._validation import check_int, check_positive
from ..protocols import HistoryEntry, get_protocol
from .config import CONFIG_KEYS, HANDSHAKE_KEY, NUM_EXAMPLES_KEY, ShufflePrivacyConfig
from .mod import REFUSED
from .shuffler import ShuffledReplies, check_in, make_rng, shuffle_replies

__all__ = [
    "CheckInAccounting",
    "HONEST_REPORT_TAIL",
    "ROUND_METRIC_KEYS",
    "ProtocolViolationError",
    "ShuffleCheckInFedAvg",
    "wait_for_population",
]

_CHECKIN = get_protocol("checkin")

#: Keys of the MetricRecord the strategy records for every round.
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


class ProtocolViolationError(RuntimeError):
    """A reply, the population or a dropout does not fit the accounted protocol."""


def wait_for_population(grid: Grid, num_nodes: int, timeout: float) -> list[int]:
    """Wait until exactly ``num_nodes`` nodes are connected; return their ids, sorted.

    Args:
        grid: The Grid of the ServerApp.
        num_nodes: The population ``n`` the accountant uses.
        timeout: Seconds to wait.

    Returns:
        The ids of the connected nodes.

    Raises:
        ProtocolViolationError: if more than ``num_nodes`` are connected, or fewer after
            ``timeout`` seconds.
    """
    deadline = time.monotonic() + timeout
    while True:
        ids = sorted(int(i) for i in grid.get_node_ids())
        if len(ids) > num_nodes:
            raise ProtocolViolationError(
                f"{len(ids)} nodes are connected but num_nodes = {num_nodes} is the "
                f"population the accountant uses; start exactly num_nodes nodes."
            )
        if len(ids) == num_nodes:
            return ids
        left = deadline - time.monotonic()
        if left < 0:
            raise ProtocolViolationError(
                f"only {len(ids)} of num_nodes = {num_nodes} nodes connected within {timeout:g} s."
            )
        log(INFO, "waiting for nodes: %d of %d connected", len(ids), num_nodes)
        time.sleep(min(1.0, left + 1e-3))


class CheckInAccounting:
    """The accountant's side of both check-in strategies (trusted-server and SecAgg+).

    A subclass sets ``privacy`` (the :class:`ShufflePrivacyConfig`), ``history`` (the list of
    ``(noise_multiplier, rate, rounds)`` entries accounted), ``max_epsilon`` and
    ``_unprotected_rounds`` (rounds run with sigma = 0), and says which population the
    accountant uses (:attr:`accounting_population`: ``n`` nodes, or ``n - D`` under SecAgg+).
    ε is :func:`shuffle_opacus.history_epsilon` with protocol ``checkin``, that population and
    the configuration's sensitivity and method: replace-one adjacency of one node, adaptive
    rounds.
    """

    privacy: ShufflePrivacyConfig
    history: list[HistoryEntry]
    max_epsilon: float | None
    _unprotected_rounds: int

    @property
    def accounting_population(self) -> int:
        """The population ``n`` the accountant uses."""
        raise NotImplementedError

    @property
    def rounds_accounted(self) -> int:
        """Number of rounds accounted so far (every round whose instructions went out)."""
        return int(sum(steps for _, _, steps in self.history)) + self._unprotected_rounds

    def epsilon(self, rounds: int | None = None) -> float:
        """ε at ``privacy.delta`` after ``rounds`` rounds (default: the rounds accounted so far).

        The history of this run, extended with identical rounds when ``rounds`` exceeds it. 0 for
        no round; ``inf`` when any round is (or would be) noiseless.

        Raises:
            ValueError: for ``rounds`` smaller than the rounds already accounted.
        """
        done = self.rounds_accounted
        rounds = done if rounds is None else check_int("rounds", rounds, minimum=done)
        if rounds == 0:
            return 0.0
        if self._unprotected_rounds or self.privacy.noise_multiplier == 0.0:
            return math.inf
        history = list(self.history)
        if rounds > done:
            history.append((self.privacy.noise_multiplier, self.privacy.rate, rounds - done))
        result = history_epsilon(
            history,
            protocol=_CHECKIN,
            delta=self.privacy.delta,
            population=self.accounting_population,
            sensitivity=self.privacy.sensitivity,
            method=self.privacy.method,
        )
        return float(result.epsilon)

    def budget_allows_another_round(self) -> bool:
        """Return whether one more round keeps ε within ``max_epsilon`` (True without budget)."""
        if self.max_epsilon is None:
            return True
        return self.epsilon(self.rounds_accounted + 1) <= self.max_epsilon

    def _account_round(self) -> None:
        sigma, rate = self.privacy.noise_multiplier, self.privacy.rate
        if sigma == 0.0:
            self._unprotected_rounds += 1
        elif self.history and self.history[-1][:2] == (sigma, rate):
            self.history[-1] = (sigma, rate, self.history[-1][2] + 1)
        else:
            self.history.append((sigma, rate, 1))


class ShuffleCheckInFedAvg(CheckInAccounting, FedAvg):
    """FedAvg with check-in, a shuffler, the check-in accountant and an ε budget.

    Attributes:
        privacy: The :class:`~shuffle_opacus.flower.config.ShufflePrivacyConfig`.
        num_nodes: Population ``n``: the number of nodes, each one unit of privacy.
        max_epsilon: ε budget at ``privacy.delta`` (``None``: none).
        history: Accounted rounds in Opacus's format ``(noise_multiplier, rate, rounds)``.
        epsilons: ε after each round that ran, by round number.
        round_metrics: The metrics of each round that ran (:data:`ROUND_METRIC_KEYS`).
        stop_reason: Why :meth:`start` ended before ``num_rounds`` (``None`` otherwise).
    """

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
            arrayrecord_key: Key of the model in instructions (FedAvg's).
            configrecord_key: Key of the config in instructions (FedAvg's).

        Raises:
            ValueError: for an argument outside its range.
        """
        if not isinstance(privacy, ShufflePrivacyConfig):
            raise ValueError(f"privacy must be a ShufflePrivacyConfig. Found {type(privacy)!r}.")
        num_nodes = check_int("num_nodes", num_nodes, minimum=1)
        _CHECKIN.sample_rate(population=num_nodes, rate=privacy.rate)
        if max_epsilon is not None:
            max_epsilon = check_positive("max_epsilon", max_epsilon)
        node_wait_timeout = check_positive("node_wait_timeout", node_wait_timeout)
        if not isinstance(tolerate_dropouts, bool):
            raise ValueError(
                f"tolerate_dropouts must be True or False. Found {tolerate_dropouts!r}."
            )
        if not isinstance(verify_nodes, bool):
            raise ValueError(f"verify_nodes must be True or False. Found {verify_nodes!r}.")
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
        self.privacy = privacy
        self.num_nodes = num_nodes
        self.max_epsilon = max_epsilon
        self.node_wait_timeout = node_wait_timeout
        self.tolerate_dropouts = tolerate_dropouts
        self.check_nodes_at_start = verify_nodes
        self.history: list[HistoryEntry] = []
        self.epsilons: dict[int, float] = {}
        self.round_metrics: dict[int, dict[str, float | int]] = {}
        self.stop_reason: str | None = None
        self._rng = rng
        self._unprotected_rounds = 0
        self._open_rounds: dict[int, tuple[int, dict[str, tuple[tuple[int, ...], np.dtype]]]] = {}
        self._sent: dict[int, dict[str, np.ndarray]] = {}
        if privacy.noise_multiplier == 0.0:
            log(WARNING, "noise_multiplier = 0: the reports carry no noise; epsilon is infinite")
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
        log(INFO, "\t│\t├── check-in analysis: method %s", p.method)
        budget = "none" if self.max_epsilon is None else f"{self.max_epsilon:g}"
        log(INFO, "\t│\t└── epsilon budget: %s", budget)
        log(INFO, "\t└──> No client-side evaluation (it would release unaccounted statistics)")

    def _population(self, grid: Grid) -> list[int]:
        return wait_for_population(grid, self.num_nodes, self.node_wait_timeout)

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

    def verify_nodes(self, grid: Grid, timeout: float) -> None:
        """Check, before any round, that every node's mod accepts this run's parameters.

        Sends every node of the population a training instruction that carries the privacy
        parameters and the flag ``shuffle-dp.handshake`` but no model. The mod
        (:class:`~shuffle_opacus.flower.LocalShuffleDPMod`) answers with the echo of the
        parameters, or refuses (noise floor, sensitivity convention, noiseless run), without
        running the training code. Nothing is accounted: no data is touched.

        Args:
            grid: The Grid of the ServerApp.
            timeout: Seconds to wait for the answers (> 0).

        Raises:
            ProtocolViolationError: naming, in one line, what the nodes that disagree (or did
                not answer, or run no mod) replied.
        """
        node_ids = self._population(grid)
        config = ConfigRecord({**self.privacy.to_config(), HANDSHAKE_KEY: True})
        messages = [
            Message(
                content=RecordDict({self.configrecord_key: config}),
                dst_node_id=node,
                message_type=MessageType.TRAIN,
            )
            for node in node_ids
        ]
        replies = list(grid.send_and_receive(messages, timeout=timeout))
        problems: set[str] = set()
        for reply in replies:
            if reply.has_error():
                reason = str(reply.error.reason or f"error code {reply.error.code}")
                if reply.error.code != REFUSED:
                    reason += " (is LocalShuffleDPMod the first mod of the ClientApp?)"
                problems.add(reason)
                continue
            content = reply.content
            metrics = list(content.metric_records.values())
            if len(metrics) != 1 or len(content.array_records) or len(content.config_records):
                problems.add("a reply is not the mod's echo (is LocalShuffleDPMod the first mod?)")
                continue
            problems.update(self.privacy.differences(metrics[0]))
        missing = len(node_ids) - len(replies)
        if missing:
            problems.add(f"{missing} nodes did not answer within {timeout:g} s")
        if problems:
            raise ProtocolViolationError(
                f"start-up check: the nodes do not accept this run's privacy parameters "
                f"({'; '.join(sorted(problems))}); no round was run."
            )
        log(INFO, "start-up check: all %d nodes accept the privacy parameters", len(node_ids))

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
                f"ConfigRecords; the shuffle-model mod sends exactly one of the first two. Is "
                f"LocalShuffleDPMod the first mod of the ClientApp?"
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
        epsilon = self.epsilon()
        self.epsilons[server_round] = epsilon
        values: dict[str, float | int] = {
            "epsilon": epsilon,
            "delta": self.privacy.delta,
            "rounds-accounted": self.rounds_accounted,
            "num-nodes": self.num_nodes,
            "num-checked-in": sent,
            "num-reports": len(reports),
            "num-dropped": dropped,
            "num-rejected": rejected,
        }
        self.round_metrics[server_round] = values
        return arrays, MetricRecord(dict(values))

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
        evaluate_config: ConfigRecord | None = None,
        evaluate_fn: Callable[[int, ArrayRecord], MetricRecord | None] | None = None,
    ) -> Result:
        """Run up to ``num_rounds`` rounds; stop before a round that would exceed the budget.

        First the start-up check (:meth:`verify_nodes`, unless switched off or the budget
        allows no round). Then each round: check-in and instructions (:meth:`configure_train`),
        the replies of the
        nodes that checked in (none are waited for in an empty round), shuffling, checks,
        averaging and accounting (:meth:`aggregate_train`), then ``evaluate_fn`` on the
        server. The round's metrics go to ``result.train_metrics_clientapp[round]``.

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
                :meth:`aggregate_train`.
        """
        num_rounds = check_int("num_rounds", num_rounds, minimum=1)
        timeout = check_positive("timeout", timeout)
        if evaluate_config:
            raise ValueError("evaluate_config must be empty: there is no client-side evaluation.")
        train_config = ConfigRecord() if train_config is None else train_config
        self._instruction_config(0, train_config)  # refuses clashing keys before any round
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
            messages = self.configure_train(server_round, arrays, train_config, grid)
            replies = list(grid.send_and_receive(messages, timeout=timeout)) if messages else []
            new_arrays, metrics = self.aggregate_train(server_round, replies)
            if new_arrays is not None:
                arrays = new_arrays
                result.arrays = arrays
            if metrics is not None:
                result.train_metrics_clientapp[server_round] = metrics
                log(
                    INFO,
                    "round %d: %d reports, epsilon = %.6g (delta = %g)",
                    server_round,
                    int(cast(int, metrics["num-reports"])),
                    float(cast(float, metrics["epsilon"])),
                    self.privacy.delta,
                )
            if evaluate_fn is not None:
                evaluation = evaluate_fn(server_round, arrays)
                if evaluation is not None:
                    result.evaluate_metrics_serverapp[server_round] = evaluation
                    log(INFO, "round %d: server evaluation %s", server_round, dict(evaluation))
        log(INFO, "strategy finished in %.2f s", time.monotonic() - started)
        return result
