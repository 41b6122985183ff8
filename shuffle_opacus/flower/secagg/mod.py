"""The node side of the secure-aggregation mode: check in on the node, privatise, then SecAgg+.

:class:`SecAggCheckInMod` is the first (or only) mod of the ClientApp::

    app = ClientApp(mods=[SecAggCheckInMod(min_noise_multiplier=0.5, reply_after=30.0)])

It wraps Flower's ``secaggplus_mod`` around its own privatisation step, so a report is clipped,
noised and zeroed (if the node did not check in) before SecAgg+ quantises and masks it. In the
masked-vector stage the node checks the instruction against its floor, ceiling, convention and
the derived SecAgg+ set-up; flips its own coin from the operating system; runs the training code
in a thread until ``reply_after`` seconds (the required padding: a training that fails or
overruns gives the zero update, so the node stays in the sum and replies on time); then clips,
noises and rounds onto SecAgg+'s grid with its own generator. Before unmasking it checks the
dropout rule (:func:`~shuffle_opacus.flower.secagg.node.unmask_problem`). ``docs/flower.md``
("A round", "The guarantee and what it assumes") has every step and why it is needed.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from typing import Any, cast

import numpy as np
from flwr.app import (
    Array,
    ArrayRecord,
    ConfigRecord,
    Context,
    Error,
    Message,
    MessageType,
    RecordDict,
)
from flwr.client.mod import secaggplus_mod
from flwr.clientapp.typing import ClientAppCallable
from flwr.common import Code, FitRes, Status, bytes_to_ndarray, ndarrays_to_parameters
from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS, Key, Stage
from flwr.compat.common import recorddict_compat as compat

from ...accounting.protocols import resolve_sensitivity
from ...common.secure_random import SecureGenerator, bernoulli
from ...common.validation import check_int, check_nonnegative, check_positive, check_probability
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
    secagg_echo,
)
from ..mod import REFUSED, clip_factor, node_noise_floor
from .node import note, open_round, secagg_setup_problems, unmask_problem
from .parameters import round_onto_grid, secagg_parameters

__all__ = [
    "CEILING_NODE_CONFIG_KEY",
    "FITINS_ARRAYS",
    "FITINS_CONFIG",
    "MAX_REPLY_AFTER",
    "PADDING_NODE_CONFIG_KEY",
    "SecAggCheckInMod",
]

#: ``--node-config`` key with which a SuperNode's operator can lower the check-in ceiling.
CEILING_NODE_CONFIG_KEY = "max-checkin-rate"
#: ``--node-config`` key with which a SuperNode's operator can raise the padding.
PADDING_NODE_CONFIG_KEY = "reply-after"
#: Largest padding in seconds (one hour): the node waits it out in every round, and the wait's
#: timer takes no larger number (``reply_after=1e300`` halted round 1 after the release).
MAX_REPLY_AFTER = 3600.0
#: Record keys of Flower's legacy training instruction (``FitIns``), which SecAgg+ uses.
FITINS_ARRAYS = "fitins.parameters"
FITINS_CONFIG = "fitins.config"

_LOG = logging.getLogger(__name__)
_PREFIX = "shuffle-model secagg mod: "
#: How the mod waits out its padding (tests replace it to skip the wait).
_SLEEP = time.sleep
Mod = Callable[[Message, Context, ClientAppCallable], Message]


def check_padding(name: str, value: object) -> float:
    """Return a padding in seconds if it is a finite number in ``(0, MAX_REPLY_AFTER]``.

    Args:
        name: How the message names it (``reply_after``, the node config key).
        value: The padding.

    Returns:
        ``value`` as a float.

    Raises:
        ValueError: otherwise, one line naming ``name`` and the range.
    """
    try:
        seconds: float | None = check_positive(name, value)
    except ValueError:
        seconds = None
    if seconds is None or seconds > MAX_REPLY_AFTER:
        raise ValueError(
            f"{name} must be a finite number > 0 and <= {MAX_REPLY_AFTER:g} (seconds; one "
            f"hour). Found {value!r}."
        )
    return seconds


class SecAggCheckInMod:
    """Node-side check-in, clip and noise under Flower's SecAgg+ (see the module docstring).

    Example:
        ``app = ClientApp(mods=[SecAggCheckInMod(min_noise_multiplier=0.5, reply_after=30.0)])``

    Attributes:
        min_noise_multiplier: The noise floor fixed in code.
        max_rate: The check-in ceiling fixed in code.
        sensitivity: The sensitivity convention (in units of ``C``) the node agrees to.
        train_when_absent: Whether the training code runs in rounds the node sits out.
        reply_after: Seconds after the masked-vector instruction at which the node replies
            (the padding fixed in code), or a function of the node's Context returning them.
        allow_noiseless: Whether σ = 0 is accepted (tests only).
        seed: Seed of coins and noise (tests only; ``None``: the operating system).
        secure_aggregation_mod: Flower's ``secaggplus_mod`` (replaceable for instrumentation
            in tests; it must call the step it is given exactly as ``secaggplus_mod`` does).
    """

    def __init__(
        self,
        *,
        min_noise_multiplier: float,
        reply_after: float | Callable[[Context], float],
        max_rate: float = 1.0,
        sensitivity: float | str = "replace-one",
        train_when_absent: bool = True,
        allow_noiseless: bool = False,
        seed: int | None = None,
        secure_aggregation_mod: Mod = secaggplus_mod,
    ) -> None:
        """Create the mod.

        Args:
            min_noise_multiplier: Smallest σ the node accepts (>= 0); a SuperNode can raise it
                with the node config key ``min-noise-multiplier``.
            reply_after: Seconds (> 0 and at most :data:`MAX_REPLY_AFTER`, one hour; required)
                after the masked-vector instruction arrived at which the node hands its report
                to SecAgg+, whatever its training took, so that the time of its reply does not
                depend on its data (e.g. its number of examples). A training still running then
                is abandoned for the round: the node sends the zero update (see the module
                docstring). Choose it above the slowest training of the node and below the
                server's stage timeout; a SuperNode can raise it (up to the same hour) with the
                node config key ``reply-after``. It may also be a function of the node's
                ``Context`` returning those seconds (e.g. from the run config's workload); it
                must not depend on the node's data.
            max_rate: Largest check-in rate γ the node accepts, in ``(0, 1]``; a SuperNode can
                lower it with the node config key ``max-checkin-rate``.
            sensitivity: ``"replace-one"`` (default), ``"paper"`` or a number in ``[1, 2]``.
            train_when_absent: Run the training code in every round and discard its result
                when the node did not check in (default), so that the work the node does (and
                any side effect of its training code) does not tell whether it checked in.
                ``False`` saves that work; the padding still hides it from reply times.
            allow_noiseless: Accept σ = 0 (the clipped updates then enter the sum without
                noise; tests only).
            seed: Integer >= 0 for reproducible coins and noise per node and round (tests
                only); ``None`` draws from the operating system.
            secure_aggregation_mod: The SecAgg+ client mod (Flower's ``secaggplus_mod``).

        Raises:
            ValueError: for an argument outside its range.
        """
        self.min_noise_multiplier = check_nonnegative("min_noise_multiplier", min_noise_multiplier)
        self.max_rate = check_probability("max_rate", max_rate)
        self.sensitivity = resolve_sensitivity(sensitivity)
        for name, value in (
            ("train_when_absent", train_when_absent),
            ("allow_noiseless", allow_noiseless),
        ):
            if not isinstance(value, bool):
                raise ValueError(f"{name} must be True or False. Found {value!r}.")
        self.train_when_absent = train_when_absent
        self.reply_after = (
            reply_after if callable(reply_after) else check_padding("reply_after", reply_after)
        )
        self.allow_noiseless = allow_noiseless
        self.seed = None if seed is None else check_int("seed", seed, minimum=0)
        if not callable(secure_aggregation_mod):
            raise ValueError(
                f"secure_aggregation_mod must be a mod (callable). Found "
                f"{secure_aggregation_mod!r}."
            )
        self.secure_aggregation_mod = secure_aggregation_mod

    # --- the node's limits ----------------------------------------------------------------

    def floor(self, context: Context) -> float:
        """Return the node's noise floor: the larger of the code's and the node config's.

        Raises:
            ValueError: if the node config holds an invalid ``min-noise-multiplier``.
        """
        return node_noise_floor(context, self.min_noise_multiplier)

    def ceiling(self, context: Context) -> float:
        """Return the node's check-in ceiling: the smaller of the code's and the node config's.

        Raises:
            ValueError: if the node config holds an invalid ``max-checkin-rate``.
        """
        configured = context.node_config.get(CEILING_NODE_CONFIG_KEY)
        if configured is None:
            return self.max_rate
        node_ceiling = check_probability(f"node config {CEILING_NODE_CONFIG_KEY}", configured)
        return min(self.max_rate, node_ceiling)

    def padding(self, context: Context) -> float:
        """Return the node's padding in seconds: the larger of the code's and the node config's.

        Raises:
            ValueError: if ``reply_after(context)`` or the node config's ``reply-after`` is not
                a finite number in ``(0, MAX_REPLY_AFTER]`` (one hour).
        """
        if callable(self.reply_after):
            seconds = check_padding("reply_after(context)", self.reply_after(context))
        else:
            seconds = self.reply_after
        configured = context.node_config.get(PADDING_NODE_CONFIG_KEY)
        if configured is None:
            return seconds
        return max(seconds, check_padding(f"node config {PADDING_NODE_CONFIG_KEY}", configured))

    # --- messages -------------------------------------------------------------------------

    def __call__(self, msg: Message, context: Context, call_next: ClientAppCallable) -> Message:
        """Handle one instruction (see the module docstring)."""
        category = msg.metadata.message_type.split(".")[0]
        if category != MessageType.TRAIN:
            return _refuse(
                msg,
                f"this node answers only training instructions of the secure-aggregation mode "
                f"(got {msg.metadata.message_type!r})",
            )
        configs = msg.content.config_records.get(RECORD_KEY_CONFIGS)
        if configs is not None:
            if configs.get(Key.STAGE) == Stage.UNMASK:
                problem = unmask_problem(configs, context)
                if problem is not None:
                    note(context, "refused-unmask")
                    _LOG.warning("refusing to unmask: %s", problem)
                    return _refuse(msg, f"no unmasking shares: {problem}")

            def contribute(inner: Message, ctx: Context) -> Message:
                return self._contribute(inner, ctx, call_next)

            return self.secure_aggregation_mod(msg, context, contribute)
        try:
            record = _settings_record(msg.content.config_records.values())
            privacy, num_nodes, max_dropouts = self._read(record, context)
            self.padding(context)  # a padding out of range stops the run before any round
            if record.get(HANDSHAKE_KEY) is not True:
                raise ValueError(
                    "a training instruction of the secure-aggregation mode must come through "
                    "SecAgg+ (SecAggCheckInFedAvg)"
                )
        except ValueError as exc:
            return _refuse(msg, str(exc))
        echo = secagg_echo(privacy, num_nodes=num_nodes, max_dropouts=max_dropouts)
        return Message(RecordDict({ECHO_RECORD_KEY: ConfigRecord(cast(Any, echo))}), reply_to=msg)

    def _read(
        self, record: ConfigRecord, context: Context
    ) -> tuple[ShufflePrivacyConfig, int, int]:
        if record.get(MODE_KEY) != SECAGG:
            raise ValueError(
                "this node takes part only in the secure-aggregation mode ('secagg'); the "
                "instruction comes from a server in the trusted-server mode"
            )
        privacy = ShufflePrivacyConfig.from_config(record, allow_noiseless=self.allow_noiseless)
        floor = self.floor(context)
        if privacy.noise_multiplier < floor:
            raise ValueError(
                f"noise_multiplier {privacy.noise_multiplier} is below this node's floor {floor}"
            )
        ceiling = self.ceiling(context)
        if privacy.rate > ceiling:
            raise ValueError(f"rate {privacy.rate} is above this node's check-in ceiling {ceiling}")
        if privacy.sensitivity != self.sensitivity:
            raise ValueError(
                f"sensitivity {privacy.sensitivity} (in units of C) differs from this node's "
                f"convention {self.sensitivity}"
            )
        num_nodes, max_dropouts = record.get(NUM_NODES_KEY), record.get(MAX_DROPOUTS_KEY)
        # Validates n and D (the dimension does not matter here).
        secagg_parameters(
            num_nodes=cast(int, num_nodes),
            dimension=1,
            clip_norm=privacy.clip_norm,
            noise_multiplier=privacy.noise_multiplier,
            max_dropouts=cast(int, max_dropouts),
        )
        return privacy, int(cast(int, num_nodes)), int(cast(int, max_dropouts))

    def _contribute(self, msg: Message, context: Context, call_next: ClientAppCallable) -> Message:
        """Return the report of the masked-input stage, which SecAgg+ masks.

        Raises:
            ValueError: to leave the round when the instruction is refused (step 1).
        """
        started = time.monotonic()
        record = msg.content.config_records.get(FITINS_CONFIG)
        if record is None or FITINS_ARRAYS not in msg.content.array_records:
            raise ValueError(_PREFIX + "the SecAgg+ instruction carries no training instruction")
        try:
            deadline = started + self.padding(context)
            privacy, num_nodes, max_dropouts = self._read(record, context)
            names, received = _received(record, msg.content.array_records[FITINS_ARRAYS])
            params = secagg_parameters(
                num_nodes=num_nodes,
                dimension=sum(a.size for a in received.values()),
                clip_norm=privacy.clip_norm,
                noise_multiplier=privacy.noise_multiplier,
                max_dropouts=max_dropouts,
            )
            problems = secagg_setup_problems(context, params)
            if problems:
                raise ValueError(
                    "the SecAgg+ set-up differs from the parameters derived from this run's "
                    f"(C, sigma, n, D, d): {'; '.join(problems)}"
                )
        except ValueError as exc:
            raise ValueError(_PREFIX + str(exc)) from None
        server_round = record.get("server-round", 0)
        round_key = int(server_round) if isinstance(server_round, int) else 0
        rng, checked_in = self._draw(context, privacy.rate, round_key)
        update = {name: np.zeros(a.shape) for name, a in received.items()}
        if checked_in or self.train_when_absent:
            trained = self._train_until(deadline, msg, context, call_next, record, received)
            if trained is not None:
                update = trained
        # Wait out the padding before the node's own work, which is the same for any data, so
        # that every node replies that work's time after reply_after, overrun or not.
        left = deadline - time.monotonic()
        if left > 0:
            _SLEEP(left)
        norm = math.sqrt(math.fsum(float(np.sum(u * u)) for u in update.values()))
        scale = clip_factor(norm, privacy.clip_norm)
        std = privacy.noise_std
        indicator = 1.0 if checked_in else 0.0
        report = []
        for name in names:
            noise = rng.normal(0.0, std, size=update[name].shape) if std > 0 else 0.0
            report.append(indicator * (scale * update[name] + noise))
        report.append(np.array([indicator * params.count_value]))
        report = round_onto_grid(report, params, rng)
        echo = secagg_echo(privacy, num_nodes=num_nodes, max_dropouts=max_dropouts)
        note(context, "rounds")
        open_round(context, round_key, num_nodes, max_dropouts)
        fitres = FitRes(
            status=Status(code=Code.OK, message=""),
            parameters=ndarrays_to_parameters(report),
            num_examples=1,
            metrics=cast(Any, echo),
        )
        return Message(compat.fitres_to_recorddict(fitres, keep_input=False), reply_to=msg)

    def _draw(self, context: Context, rate: float, server_round: int) -> tuple[Any, bool]:
        """Return the generator of noise and rounding and the node's check-in coin."""
        if self.seed is None:
            return SecureGenerator(), bool(bernoulli(1, rate)[0])
        sequence = np.random.SeedSequence(
            self.seed, spawn_key=(int(context.node_id) % 2**64, max(server_round, 0))
        )
        rng = np.random.default_rng(sequence)
        return rng, bool(rng.random() < rate)

    def _train_until(
        self,
        deadline: float,
        msg: Message,
        context: Context,
        call_next: ClientAppCallable,
        record: ConfigRecord,
        received: dict[str, np.ndarray],
    ) -> dict[str, np.ndarray] | None:
        """Run the training code in a thread until ``deadline``; return the update or ``None``.

        ``None`` (the zero update) when the training raised, returned something that is not
        the model, returned non-finite weights, or was still running at the deadline; each is
        logged on the node and counted in its local record. Nothing of it leaves the node.
        """
        outcome: dict[str, Any] = {}

        def work() -> None:
            try:
                outcome["update"] = _train(msg, context, call_next, record, received)
            except BaseException as exc:  # noqa: BLE001 - nothing of it leaves the node
                outcome["error"] = exc

        thread = threading.Thread(target=work, name="shuffle-dp-training", daemon=True)
        thread.start()
        thread.join(max(deadline - time.monotonic(), 0.0))
        if thread.is_alive():
            note(context, "training-overran")
            _LOG.error(
                "training still running at reply_after (%.3g s): this node contributes the "
                "zero update this round (raise reply_after above the slowest training)",
                self.padding(context),
            )
            return None
        if "error" in outcome:
            note(context, "training-failed")
            _LOG.error(
                "training failed; this node contributes the zero update this round",
                exc_info=outcome["error"],
            )
            return None
        update: dict[str, np.ndarray] = outcome["update"]
        if not all(np.all(np.isfinite(u)) for u in update.values()):
            note(context, "non-finite-update")
            _LOG.error("non-finite update: this node contributes the zero update this round")
            return None
        return update


def _train(
    msg: Message,
    context: Context,
    call_next: ClientAppCallable,
    record: ConfigRecord,
    received: dict[str, np.ndarray],
) -> dict[str, np.ndarray]:
    """Run the training code on a Message-API instruction; return its update (float64).

    Raises:
        ValueError: if the training code replies with an error or not with the model.
    """
    content = RecordDict(
        {
            "arrays": ArrayRecord({name: Array(a) for name, a in received.items()}),
            "config": ConfigRecord(dict(record)),
        }
    )
    # flwr 1.41's overloads omit the (content, metadata) constructor its own runtime uses.
    inner = Message(content=content, metadata=msg.metadata)  # type: ignore[call-overload]
    reply = call_next(inner, context)
    if reply.has_error():
        raise ValueError(f"the training code replied with an error: {reply.error.reason}")
    arrays = list(reply.content.array_records.values())
    if len(arrays) != 1 or set(arrays[0].keys()) != set(received):
        raise ValueError("the training code must reply with one ArrayRecord of the model")
    update = {}
    for name, base in received.items():
        value = np.asarray(arrays[0][name].numpy(), dtype=np.float64)
        if value.shape != base.shape:
            raise ValueError(f"array {name!r} came back with shape {value.shape}")
        update[name] = value - base.astype(np.float64)
    return update


def _settings_record(records: Any) -> ConfigRecord:
    found = [r for r in records if CONFIG_KEYS["noise_multiplier"] in r]
    if len(found) != 1:
        raise ValueError(
            f"the instruction must carry the shuffle-model parameters in exactly one "
            f"ConfigRecord (found {len(found)})"
        )
    return found[0]


def _received(record: ConfigRecord, arrays: ArrayRecord) -> tuple[list[str], dict[str, np.ndarray]]:
    names = record.get(ARRAY_NAMES_KEY)
    values = [bytes_to_ndarray(array.data) for array in arrays.values()]
    if (
        not isinstance(names, list)
        or len(names) != len(values)
        or len(set(names)) != len(names)
        or not values
    ):
        raise ValueError(
            f"the instruction's {ARRAY_NAMES_KEY} must name each of its {len(values)} arrays once"
        )
    received = {}
    for name, value in zip(names, values, strict=True):
        if not np.issubdtype(value.dtype, np.floating):
            raise ValueError(f"array {name!r} has dtype {value.dtype}; only floats are noised")
        received[str(name)] = value
    return [str(n) for n in names], received


def _refuse(msg: Message, reason: str) -> Message:
    return Message(Error(code=REFUSED, reason=_PREFIX + reason), reply_to=msg)
