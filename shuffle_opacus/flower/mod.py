"""The node side of the trusted-server mode: clip the whole update, add noise, release nothing else.

:class:`LocalShuffleDPMod` must be the **first** mod of ``ClientApp(mods=[...])`` (the outermost
wrapper, with the last word on the reply). For a training instruction it reads the privacy
parameters (:class:`~shuffle_opacus.flower.config.ShufflePrivacyConfig`) and refuses when σ is
below the node's floor or the sensitivity convention is not the node's; runs the training code;
clips the update ``returned − received`` over all arrays to norm ``C`` (a non-finite update
becomes zero) and adds ``N(0, (σC)²)`` to every coordinate; and replies with exactly one
``ArrayRecord`` and one ``MetricRecord`` holding ``num-examples = 1`` and the echo. An
instruction flagged ``shuffle-dp.handshake`` (the start-up check) gets the echo alone, without
training. The floor can be raised by ``--node-config "min-noise-multiplier=..."``. Noise comes
from the operating system (:class:`~shuffle_opacus.common.secure_random.SecureGenerator`: Box–Muller
on ``os.urandom``, summed in fours as in Opacus's ``secure_mode``); ``noise_seed`` (numpy's
PCG64) is for tests. ``docs/flower.md`` has the details and what a node must also check.
"""

from __future__ import annotations

import logging
import math
from typing import Any, cast

import numpy as np
from flwr.app import (
    Array,
    ArrayRecord,
    Context,
    Error,
    Message,
    MessageType,
    MetricRecord,
    RecordDict,
)
from flwr.clientapp.typing import ClientAppCallable

from ..accounting.protocols import resolve_sensitivity
from ..common.secure_random import Draws, SecureGenerator
from ..common.validation import check_int, check_nonnegative
from .config import CONFIG_KEYS, HANDSHAKE_KEY, ShufflePrivacyConfig

__all__ = ["FLOOR_NODE_CONFIG_KEY", "REFUSED", "LocalShuffleDPMod", "clip_factor"]

#: ``--node-config`` key with which a SuperNode's operator can raise the noise floor.
FLOOR_NODE_CONFIG_KEY = "min-noise-multiplier"

#: Error code of the mod's refusals (Flower's ``MOD_FAILED_PRECONDITION``).
REFUSED = 6

_LOG = logging.getLogger(__name__)
_FAILED = "training failed on the node (details withheld by the privacy mod)"


class LocalShuffleDPMod:
    """Clip-and-noise mod of the shuffled check-in protocol (see the module docstring).

    Example:
        ``app = ClientApp(mods=[LocalShuffleDPMod(min_noise_multiplier=0.8)])``

    Attributes:
        min_noise_multiplier: The floor fixed in code.
        sensitivity: The sensitivity convention (in units of ``C``) the node agrees to be
            accounted with; instructions announcing another one are refused.
        allow_evaluate: Whether evaluation instructions pass through (their replies are not
            privatised and not accounted).
        allow_noiseless: Whether an instruction with ``noise_multiplier = 0`` is accepted
            (tests only; refused by default whatever the floor).
    """

    def __init__(
        self,
        *,
        min_noise_multiplier: float,
        sensitivity: float | str = "replace-one",
        allow_evaluate: bool = False,
        allow_noiseless: bool = False,
        noise_seed: int | None = None,
    ) -> None:
        """Create the mod.

        Args:
            min_noise_multiplier: Smallest noise multiplier the node accepts (>= 0; 0 means no
                floor beyond the protocol's ``noise_multiplier > 0``); a SuperNode can raise it
                with the node config key ``min-noise-multiplier``.
            sensitivity: ``"replace-one"`` (default), ``"paper"`` or a number > 0; see
                :func:`shuffle_opacus.accounting.protocols.resolve_sensitivity`.
            allow_evaluate: Let evaluation instructions through unchanged. Off by default: an
                evaluation reply releases statistics of the node's data that no accountant
                covers; evaluate on the server with public data instead.
            allow_noiseless: Accept ``noise_multiplier = 0`` (the clipped update in the clear).
                Off by default, whatever the floor; for tests and equivalence checks only.
            noise_seed: Integer >= 0 for reproducible noise from numpy's PCG64 (tests only);
                ``None`` draws every report's noise from the operating system.

        Raises:
            ValueError: for an argument outside its range.
        """
        self.min_noise_multiplier = check_nonnegative("min_noise_multiplier", min_noise_multiplier)
        self.sensitivity = resolve_sensitivity(sensitivity)
        if not isinstance(allow_evaluate, bool):
            raise ValueError(f"allow_evaluate must be True or False. Found {allow_evaluate!r}.")
        self.allow_evaluate = allow_evaluate
        if not isinstance(allow_noiseless, bool):
            raise ValueError(f"allow_noiseless must be True or False. Found {allow_noiseless!r}.")
        self.allow_noiseless = allow_noiseless
        self.noise_seed = (
            None if noise_seed is None else check_int("noise_seed", noise_seed, minimum=0)
        )

    def floor(self, context: Context) -> float:
        """Return the node's noise floor: the larger of the code's and the node config's.

        Raises:
            ValueError: if the node config holds an invalid ``min-noise-multiplier``.
        """
        return node_noise_floor(context, self.min_noise_multiplier)

    def __call__(self, msg: Message, context: Context, call_next: ClientAppCallable) -> Message:
        """Handle one instruction (see the module docstring)."""
        category = msg.metadata.message_type.split(".")[0]
        if category != MessageType.TRAIN:
            if category == MessageType.EVALUATE and self.allow_evaluate:
                return call_next(msg, context)
            return _refuse(
                msg,
                f"this node answers only training instructions under the shuffle-model mod "
                f"(got {msg.metadata.message_type!r})",
            )
        try:
            config, handshake = self._read_parameters(msg, context)
            if handshake:
                metrics = MetricRecord(cast(Any, config.reply_metrics()))
                return Message(RecordDict({"metrics": metrics}), reply_to=msg)
            key, received = _received_arrays(msg)
        except ValueError as exc:
            return _refuse(msg, str(exc))
        try:
            reply = call_next(msg, context)
        except Exception:  # noqa: BLE001 - the details stay on the node
            _LOG.exception("the training code raised; the reply carries no details")
            return _refuse(msg, _FAILED)
        if reply.has_error():
            _LOG.error("the training code replied with an error: %s", reply.error.reason)
            return _refuse(msg, _FAILED)
        try:
            returned = _returned_arrays(reply, received)
        except ValueError as exc:
            return _refuse(msg, str(exc))
        report = self._privatise(config, received, returned, context, msg)
        content = RecordDict(
            {
                key: ArrayRecord({name: Array(value) for name, value in report.items()}),
                "metrics": MetricRecord(cast(Any, config.reply_metrics())),
            }
        )
        return Message(content, reply_to=msg)

    def _read_parameters(self, msg: Message, context: Context) -> tuple[ShufflePrivacyConfig, bool]:
        records = [
            record
            for record in msg.content.config_records.values()
            if CONFIG_KEYS["noise_multiplier"] in record
        ]
        if len(records) != 1:
            raise ValueError(
                f"the training instruction must carry the shuffle-model parameters in exactly "
                f"one ConfigRecord (found {len(records)}); the server must use "
                f"shuffle_opacus.flower.ShuffleCheckInFedAvg"
            )
        config = ShufflePrivacyConfig.from_config(records[0], allow_noiseless=self.allow_noiseless)
        floor = self.floor(context)
        if config.noise_multiplier < floor:
            raise ValueError(
                f"noise_multiplier {config.noise_multiplier} is below this node's floor {floor}"
            )
        if config.sensitivity != self.sensitivity:
            raise ValueError(
                f"sensitivity {config.sensitivity} (in units of C) differs from this node's "
                f"convention {self.sensitivity}"
            )
        return config, records[0].get(HANDSHAKE_KEY) is True

    def _generator(self, context: Context, msg: Message) -> Draws:
        if self.noise_seed is None:
            return SecureGenerator()
        config = next(
            r for r in msg.content.config_records.values() if CONFIG_KEYS["clip_norm"] in r
        )
        server_round = config.get("server-round", 0)
        round_key = int(server_round) if isinstance(server_round, int) else 0
        sequence = np.random.SeedSequence(
            self.noise_seed, spawn_key=(int(context.node_id) % 2**64, max(round_key, 0))
        )
        return np.random.default_rng(sequence)

    def _privatise(
        self,
        config: ShufflePrivacyConfig,
        received: dict[str, np.ndarray],
        returned: dict[str, np.ndarray],
        context: Context,
        msg: Message,
    ) -> dict[str, np.ndarray]:
        update = {
            name: returned[name].astype(np.float64) - received[name].astype(np.float64)
            for name in received
        }
        squared = math.fsum(float(np.sum(u * u)) for u in update.values())
        if not math.isfinite(squared):
            _LOG.warning("non-finite update replaced by zero before noising")
            update = {name: np.zeros_like(u) for name, u in update.items()}
            squared = 0.0
        scale = clip_factor(math.sqrt(squared), config.clip_norm)
        rng = self._generator(context, msg)
        std = config.noise_std
        report = {}
        for name, base in received.items():
            noise = rng.normal(0.0, std, size=base.shape) if std > 0 else 0.0
            value = base.astype(np.float64) + scale * update[name] + noise
            report[name] = np.asarray(value, dtype=base.dtype)
        return report


def node_noise_floor(context: Context, minimum: float) -> float:
    """Return a node's noise floor: the larger of the code's ``minimum`` and the node config's.

    Both trust modes' mods refuse a server that asks for less noise than this.

    Raises:
        ValueError: if the node config holds an invalid ``min-noise-multiplier``.
    """
    configured = context.node_config.get(FLOOR_NODE_CONFIG_KEY)
    if configured is None:
        return minimum
    return max(minimum, check_nonnegative(f"node config {FLOOR_NODE_CONFIG_KEY}", configured))


def clip_factor(norm: float, clip_norm: float) -> float:
    """Return ``min(1, clip_norm / norm)``: the factor that brings a norm down to the bound.

    Args:
        norm: L2 norm of the update (>= 0).
        clip_norm: The bound ``C`` (> 0).

    Returns:
        1 when ``norm <= clip_norm`` (zero included), else ``clip_norm / norm``; the clipped
        norm ``norm * factor`` is at most ``clip_norm`` up to one rounding.
    """
    if norm <= clip_norm:
        return 1.0
    return clip_norm / norm


def _received_arrays(msg: Message) -> tuple[str, dict[str, np.ndarray]]:
    arrays = msg.content.array_records
    if len(arrays) != 1:
        raise ValueError(
            f"the training instruction must carry exactly one ArrayRecord (found {len(arrays)})"
        )
    ((key, record),) = arrays.items()
    received = {}
    for name, array in record.items():
        value = np.asarray(array.numpy())
        if not np.issubdtype(value.dtype, np.floating):
            raise ValueError(
                f"array {name!r} has dtype {value.dtype}; only floating-point arrays can be "
                f"clipped and noised"
            )
        received[name] = value
    if not received:
        raise ValueError("the training instruction's ArrayRecord is empty")
    return key, received


def _returned_arrays(reply: Message, received: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    arrays = reply.content.array_records
    if len(arrays) != 1:
        raise ValueError(
            f"the training code must reply with exactly one ArrayRecord (found {len(arrays)})"
        )
    ((_, record),) = arrays.items()
    if set(record.keys()) != set(received):
        raise ValueError(
            "the training code's reply must hold the same arrays as the instruction "
            f"(keys {sorted(record.keys())} against {sorted(received)})"
        )
    returned = {}
    for name, base in received.items():
        value = np.asarray(record[name].numpy())
        if value.shape != base.shape:
            raise ValueError(
                f"array {name!r} came back with shape {value.shape}, sent with {base.shape}"
            )
        returned[name] = value
    return returned


def _refuse(msg: Message, reason: str) -> Message:
    return Message(Error(code=REFUSED, reason=f"shuffle-model mod: {reason}"), reply_to=msg)
