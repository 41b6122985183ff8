"""One ClientApp for both trust modes: route each instruction to the mode's privacy mod.

:class:`PrivacyModeMod` holds the privacy mod of each mode and hands every instruction to one of
them: instructions of the secure-aggregation mode (those carrying SecAgg+'s records, or the mode
``secagg`` in their configuration) to the :class:`~shuffle_opacus.flower.SecAggCheckInMod`,
everything else to the trusted-server mode's :class:`~shuffle_opacus.flower.LocalShuffleDPMod`.
The server chooses the mode by the strategy it runs; a node that trusts no server pins its mode
with ``--node-config "privacy-mode=secagg"`` and refuses the other mode's instructions. Use it
as the first mod of the ClientApp::

    app = ClientApp(mods=[PrivacyModeMod(
        trusted_server=LocalShuffleDPMod(min_noise_multiplier=0.5),
        secagg=SecAggCheckInMod(min_noise_multiplier=0.5, reply_after=30.0),
    )])
"""

from __future__ import annotations

from flwr.app import Context, Error, Message
from flwr.clientapp.typing import ClientAppCallable
from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS

from .config import MODE_KEY, MODES, SECAGG, TRUSTED_SERVER
from .mod import REFUSED, LocalShuffleDPMod
from .secagg.mod import SecAggCheckInMod

__all__ = ["MODE_NODE_CONFIG_KEY", "PrivacyModeMod", "instruction_mode"]

#: ``--node-config`` key with which a SuperNode's operator pins the node's trust mode.
MODE_NODE_CONFIG_KEY = "privacy-mode"


def instruction_mode(msg: Message) -> str:
    """Return the trust mode an instruction belongs to (``secagg`` or ``trusted-server``)."""
    if not msg.has_content():
        return TRUSTED_SERVER
    records = msg.content.config_records
    if RECORD_KEY_CONFIGS in records:
        return SECAGG
    if any(record.get(MODE_KEY) == SECAGG for record in records.values()):
        return SECAGG
    return TRUSTED_SERVER


class PrivacyModeMod:
    """Route each instruction to the privacy mod of its trust mode (see the module docstring).

    Attributes:
        mods: The mod of each mode (``None`` for a mode this node does not take part in).
    """

    def __init__(
        self,
        *,
        trusted_server: LocalShuffleDPMod | None = None,
        secagg: SecAggCheckInMod | None = None,
    ) -> None:
        """Create the router.

        Args:
            trusted_server: The mod of the trusted-server mode, or ``None``.
            secagg: The mod of the secure-aggregation mode, or ``None``.

        Raises:
            ValueError: if a mod has the wrong type or both are ``None``.
        """
        if trusted_server is not None and not isinstance(trusted_server, LocalShuffleDPMod):
            raise ValueError(
                f"trusted_server must be a LocalShuffleDPMod or None. Found {trusted_server!r}."
            )
        if secagg is not None and not isinstance(secagg, SecAggCheckInMod):
            raise ValueError(f"secagg must be a SecAggCheckInMod or None. Found {secagg!r}.")
        if trusted_server is None and secagg is None:
            raise ValueError("PrivacyModeMod needs the mod of at least one mode.")
        self.mods: dict[str, LocalShuffleDPMod | SecAggCheckInMod | None] = {
            TRUSTED_SERVER: trusted_server,
            SECAGG: secagg,
        }

    def __call__(self, msg: Message, context: Context, call_next: ClientAppCallable) -> Message:
        """Hand the instruction to its mode's mod, or refuse it."""
        mode = instruction_mode(msg)
        pinned = context.node_config.get(MODE_NODE_CONFIG_KEY)
        if pinned is not None and pinned not in MODES:
            return _refuse(
                msg,
                f"node config {MODE_NODE_CONFIG_KEY} must be one of {', '.join(MODES)}. "
                f"Found {pinned!r}",
            )
        if pinned is not None and pinned != mode:
            return _refuse(
                msg, f"this node takes part only in the {pinned} mode; the server runs {mode}"
            )
        mod = self.mods[mode]
        if mod is None:
            return _refuse(msg, f"this node does not take part in the {mode} mode")
        return mod(msg, context, call_next)


def _refuse(msg: Message, reason: str) -> Message:
    return Message(Error(code=REFUSED, reason=f"shuffle-model mode: {reason}"), reply_to=msg)
