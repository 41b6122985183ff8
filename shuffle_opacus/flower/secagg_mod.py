"""The node side of the secure-aggregation mode: check in on the node, privatise, then SecAgg+.

:class:`SecAggCheckInMod` is the privacy mod of the ``secagg`` mode; use it as the first (or
only) mod of the ``ClientApp``::

    app = ClientApp(mods=[SecAggCheckInMod(min_noise_multiplier=0.5)])

It wraps Flower's own ``flwr.client.mod.secaggplus_mod`` (the client side of SecAgg+, Bell,
Bonawitz, Gascón, Lepoint and Raykova, *Secure Single-Server Aggregation with
(Poly)Logarithmic Overhead*, CCS 2020, IACR ePrint 2020/704) around its privatisation step, so the
order is fixed: **this node's report is clipped, noised, and zeroed if the node did not check
in before SecAgg+ quantises and masks it**. That is the mod order ``[secaggplus_mod,
privatise]``: ``secaggplus_mod`` calls the privatisation step (and through it the training
code) in its masked-input stage and masks whatever comes back.

In every round the server sends the SecAgg+ instructions to **every** node. In the masked-input
stage the node

1. reads σ, C, γ, δ, the sensitivity convention, ``n`` and ``D`` from the instruction and
   refuses (the node leaves the round) if σ is below its floor, γ above its ceiling, the
   sensitivity convention not its own, or the SecAgg+ parameters that Flower's set-up stage
   gave it (shares, threshold, clipping range, quantisation range, modulus) differ from the
   ones :func:`~shuffle_opacus.flower.secagg.secagg_parameters` derives from those values;
2. flips its own check-in coin with probability γ from the operating system's secure source
   (:class:`random.SystemRandom`); the coin never leaves the node;
3. runs the training code (also when the coin says no, unless ``train_when_absent=False``, so
   that its reply time does not depend on the coin; with ``reply_after`` it also waits until a
   fixed time, so that the reply time does not depend on how long the training took on its
   data either), computes the update over all arrays,
   clips it to norm ``C`` (a failed or non-finite training gives the zero update, which is in
   the ball) and draws ``N(0, σ²C²)`` for every coordinate (always, for the same reason);
4. returns, for SecAgg+ to mask, the vector ``b (clipped update + noise)`` and the count
   coordinate ``b c`` where ``b`` is 1 if it checked in and 0 otherwise, and ``c`` is the
   clipping range. The plain part of its reply (weight 1 and the echo of step 1) is the same
   whatever ``b`` is; the training code's metrics and records never leave the node.

So the server receives, per node, a masked vector and a fixed echo, and SecAgg+ lets it recover
only the sum over the nodes of the round: the sum of the participants' reports and their
number. The start-up check (a training instruction flagged ``shuffle-dp.handshake`` and
carrying the mode ``secagg``) is answered by step 1 alone, before SecAgg+.

The floor and the ceiling: ``min_noise_multiplier`` and ``max_rate`` are fixed in the
ClientApp's code; a SuperNode's operator can raise the floor with ``--node-config
"min-noise-multiplier=..."`` and lower the ceiling with ``--node-config
"max-checkin-rate=..."``. A server cannot make the node add less noise or check in more often
than the node allows, and the strategy accounts with exactly the values the nodes echo.

Randomness: coin and noise come from the operating system (the noise through numpy's PCG64
seeded with 128 fresh bits), unless ``seed`` is given (tests only). Flower's stochastic rounding
uses numpy's global generator; it acts after the noise, on the node's own report, so it is
post-processing whatever its source.
"""

from __future__ import annotations

import logging
import math
import random
import secrets
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
from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS
from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_STATE as SA_STATE
from flwr.compat.common import recorddict_compat as compat

from ..analysis._validation import check_int, check_nonnegative, check_probability
from ..protocols import resolve_sensitivity
from .config import (
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
from .mod import REFUSED, clip_factor, node_noise_floor
from .secagg import SecAggParameters, secagg_parameters

__all__ = [
    "CEILING_NODE_CONFIG_KEY",
    "FITINS_ARRAYS",
    "FITINS_CONFIG",
    "SecAggCheckInMod",
]

#: ``--node-config`` key with which a SuperNode's operator can lower the check-in ceiling.
CEILING_NODE_CONFIG_KEY = "max-checkin-rate"
#: Record keys of Flower's legacy training instruction (``FitIns``), which SecAgg+ uses.
FITINS_ARRAYS = "fitins.parameters"
FITINS_CONFIG = "fitins.config"

_LOG = logging.getLogger(__name__)
_PREFIX = "shuffle-model secagg mod: "
Mod = Callable[[Message, Context, ClientAppCallable], Message]


class SecAggCheckInMod:
    """Node-side check-in, clip and noise under Flower's SecAgg+ (see the module docstring).

    Example:
        ``app = ClientApp(mods=[SecAggCheckInMod(min_noise_multiplier=0.5, max_rate=0.5)])``

    Attributes:
        min_noise_multiplier: The noise floor fixed in code.
        max_rate: The check-in ceiling fixed in code.
        sensitivity: The sensitivity convention (in units of ``C``) the node agrees to.
        train_when_absent: Whether the training code runs in rounds the node sits out.
        reply_after: Seconds after the masked-vector instruction before the node replies.
        allow_noiseless: Whether σ = 0 is accepted (tests only).
        seed: Seed of coins and noise (tests only; ``None``: the operating system).
        secure_aggregation_mod: Flower's ``secaggplus_mod`` (replaceable for instrumentation
            in tests; it must call the step it is given exactly as ``secaggplus_mod`` does).
    """

    def __init__(
        self,
        *,
        min_noise_multiplier: float,
        max_rate: float = 1.0,
        sensitivity: float | str = "replace-one",
        train_when_absent: bool = True,
        reply_after: float = 0.0,
        allow_noiseless: bool = False,
        seed: int | None = None,
        secure_aggregation_mod: Mod = secaggplus_mod,
    ) -> None:
        """Create the mod.

        Args:
            min_noise_multiplier: Smallest σ the node accepts (>= 0); a SuperNode can raise it
                with the node config key ``min-noise-multiplier``.
            max_rate: Largest check-in rate γ the node accepts, in ``(0, 1]``; a SuperNode can
                lower it with the node config key ``max-checkin-rate``.
            sensitivity: ``"replace-one"`` (default), ``"paper"`` or a number in ``[1, 2]``.
            train_when_absent: Run the training code in every round and discard its result
                when the node did not check in (default), so that the time of the node's reply
                does not tell whether it checked in. ``False`` saves that work but lets whoever
                sees reply times (the server, the SuperLink, the network) learn who checked in,
                which the analysis does not allow.
            reply_after: Seconds (>= 0) that the masked-vector step takes at least: the node
                waits until then before handing its report to SecAgg+, so that the time of its
                reply does not depend on how long its training took (and so on its data, e.g.
                its number of examples). 0 (default) replies as soon as the report is ready.
                Choose it above the slowest training and below the server's stage timeout; a
                training that takes longer replies late (logged on the node).
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
        self.reply_after = check_nonnegative("reply_after", reply_after)
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
        if RECORD_KEY_CONFIGS in msg.content.config_records:

            def contribute(inner: Message, ctx: Context) -> Message:
                return self._contribute(inner, ctx, call_next)

            return self.secure_aggregation_mod(msg, context, contribute)
        try:
            record = _settings_record(msg.content.config_records.values())
            privacy, num_nodes, max_dropouts = self._read(record, context)
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
        """Return the report of the masked-input stage, which SecAgg+ quantises and masks.

        Raises:
            ValueError: to leave the round when the instruction is refused (step 1).
        """
        started = time.monotonic()
        record = msg.content.config_records.get(FITINS_CONFIG)
        if record is None or FITINS_ARRAYS not in msg.content.array_records:
            raise ValueError(_PREFIX + "the SecAgg+ instruction carries no training instruction")
        try:
            privacy, num_nodes, max_dropouts = self._read(record, context)
            names, received = _received(record, msg.content.array_records[FITINS_ARRAYS])
            params = secagg_parameters(
                num_nodes=num_nodes,
                dimension=sum(a.size for a in received.values()),
                clip_norm=privacy.clip_norm,
                noise_multiplier=privacy.noise_multiplier,
                max_dropouts=max_dropouts,
            )
            _check_secagg_state(context, params)
        except ValueError as exc:
            raise ValueError(_PREFIX + str(exc)) from None
        server_round = record.get("server-round", 0)
        rng, checked_in = self._draw(context, privacy.rate, server_round)
        update = {name: np.zeros(a.shape) for name, a in received.items()}
        if checked_in or self.train_when_absent:
            trained = self._train(msg, context, call_next, record, received)
            if trained is not None:
                update = trained
        norm = math.sqrt(math.fsum(float(np.sum(u * u)) for u in update.values()))
        scale = clip_factor(norm, privacy.clip_norm)
        std = privacy.noise_std
        indicator = 1.0 if checked_in else 0.0
        report = []
        for name in names:
            noise = rng.normal(0.0, std, size=update[name].shape) if std > 0 else 0.0
            report.append(indicator * (scale * update[name] + noise))
        report.append(np.array([indicator * params.count_value]))
        echo = secagg_echo(privacy, num_nodes=num_nodes, max_dropouts=max_dropouts)
        elapsed = time.monotonic() - started
        if elapsed < self.reply_after:
            time.sleep(self.reply_after - elapsed)
        elif self.reply_after > 0:
            _LOG.warning("the round took %.1f s, longer than reply_after", elapsed)
        fitres = FitRes(
            status=Status(code=Code.OK, message=""),
            parameters=ndarrays_to_parameters(report),
            num_examples=1,
            metrics=cast(Any, echo),
        )
        return Message(compat.fitres_to_recorddict(fitres, keep_input=False), reply_to=msg)

    def _draw(self, context: Context, rate: float, server_round: Any) -> tuple[Any, bool]:
        """Return the noise generator and the node's check-in coin for this round."""
        if self.seed is None:
            coin = random.SystemRandom().random() < rate
            return np.random.default_rng(secrets.randbits(128)), coin
        round_key = int(server_round) if isinstance(server_round, int) else 0
        sequence = np.random.SeedSequence(
            self.seed, spawn_key=(int(context.node_id) % 2**64, max(round_key, 0))
        )
        rng = np.random.default_rng(sequence)
        return rng, bool(rng.random() < rate)

    def _train(
        self,
        msg: Message,
        context: Context,
        call_next: ClientAppCallable,
        record: ConfigRecord,
        received: dict[str, np.ndarray],
    ) -> dict[str, np.ndarray] | None:
        """Run the training code on a Message-API instruction; return the update or ``None``."""
        content = RecordDict(
            {
                "arrays": ArrayRecord({name: Array(a) for name, a in received.items()}),
                "config": ConfigRecord(dict(record)),
            }
        )
        # flwr 1.41's overloads omit the (content, metadata) constructor its own runtime uses.
        inner = Message(content=content, metadata=msg.metadata)  # type: ignore[call-overload]
        try:
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
        except Exception:  # noqa: BLE001 - nothing of it leaves the node
            _LOG.exception("training failed; this node contributes the zero update this round")
            return None
        if not all(np.all(np.isfinite(u)) for u in update.values()):
            _LOG.warning("non-finite update replaced by zero")
            return None
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


def _check_secagg_state(context: Context, params: SecAggParameters) -> None:
    """Compare the SecAgg+ set-up this node received with the derived parameters."""
    state = context.state.config_records.get(SA_STATE)
    if state is None:
        raise ValueError("no SecAgg+ set-up on this node")
    expected: dict[str, Any] = {
        "sample_num": params.num_nodes,
        "share_num": params.num_shares,
        "threshold": params.threshold,
        "target_range": params.quantization_range,
        "mod_range": params.modulus_range,
    }
    problems = [
        f"{k} = {state.get(k)!r}, expected {v!r}" for k, v in expected.items() if state.get(k) != v
    ]
    for key, want in (("clipping_range", params.clipping_range), ("max_weight", 1.0)):
        got = state.get(key)
        if not isinstance(got, float) or not math.isclose(got, want, rel_tol=1e-9):
            problems.append(f"{key} = {got!r}, expected {want!r}")
    if problems:
        raise ValueError(
            "the SecAgg+ set-up differs from the parameters derived from this run's "
            f"(C, sigma, n, D, d): {'; '.join(problems)}"
        )


def _refuse(msg: Message, reason: str) -> Message:
    return Message(Error(code=REFUSED, reason=_PREFIX + reason), reply_to=msg)
