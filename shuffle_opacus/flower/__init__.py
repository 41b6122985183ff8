"""Shuffle-model differential privacy for federated learning on Flower (``flwr``).

The shuffled check-in protocol of Liew & Takahashi (*Shuffle Gaussian Mechanism for Differential
Privacy*, arXiv:2206.09569) at user level: one Flower node is one unit of privacy, ``n`` the
number of nodes, and ε is reported after every round (the tight ``pld``; the proven ε,
:data:`EPSILON_PROVEN_KEY`, at evaluation rounds and the last round). Two trust modes share
one accountant (:func:`shuffle_opacus.history_epsilon`, protocol ``checkin``) and one strategy
base (:mod:`.checkin_base`). **Trusted-server**: :class:`LocalShuffleDPMod` clips and noises each
node's update, :class:`ShuffleCheckInFedAvg` draws the coins and a shuffler simulated in the
ServerApp strips identities (:mod:`.shuffler`). **Secure aggregation**: :class:`SecAggCheckInMod`
flips each node's own coin and feeds Flower's SecAgg+, :class:`SecAggCheckInFedAvg` learns only
the sum and the count (:mod:`.secagg` and its siblings). :class:`ShufflePrivacyConfig` is what
mods, strategies and accountant agree on; :class:`PrivacyModeMod` serves both modes from one
ClientApp; :class:`InProcessGrid` (:mod:`.testing`) runs a ClientApp in this process;
:mod:`.launch` runs an app with ``flwr run``; :class:`ShuffleCheckInAccountant`
(:mod:`.accounting`) is the strategies' ledger in the shape of Flower's ``PrivacyAccountant``
protocol. Install with ``pip install 'shuffle-opacus[flower]'``; ``docs/flower.md`` states both
modes' guarantees and assumptions.
"""

from __future__ import annotations

import importlib.util

if importlib.util.find_spec("flwr") is None:  # pragma: no cover - exercised in a subprocess
    raise ImportError(
        "shuffle_opacus.flower needs Flower (flwr), which is not installed: "
        "pip install 'shuffle-opacus[flower]'"
    )

from .accounting import (  # noqa: E402
    ShuffleAccountingConfig,
    ShuffleCheckInAccountant,
    ShuffleCheckInEvent,
)
from .checkin_base import EPSILON_PROVEN_KEY  # noqa: E402
from .config import METRIC_KEYS, MODES, SECAGG, TRUSTED_SERVER, ShufflePrivacyConfig  # noqa: E402
from .mod import LocalShuffleDPMod  # noqa: E402
from .modes import PrivacyModeMod  # noqa: E402
from .secagg.mod import SecAggCheckInMod  # noqa: E402
from .secagg.parameters import SecAggParameters, secagg_parameters  # noqa: E402
from .secagg.strategy import SECAGG_ROUND_METRIC_KEYS, SecAggCheckInFedAvg  # noqa: E402
from .shuffler import ShuffledReplies, check_in, make_rng, shuffle_replies  # noqa: E402
from .strategy import ROUND_METRIC_KEYS, ProtocolViolationError, ShuffleCheckInFedAvg  # noqa: E402
from .testing import InProcessGrid  # noqa: E402

__all__ = [
    "EPSILON_PROVEN_KEY",
    "METRIC_KEYS",
    "MODES",
    "ROUND_METRIC_KEYS",
    "SECAGG",
    "SECAGG_ROUND_METRIC_KEYS",
    "TRUSTED_SERVER",
    "InProcessGrid",
    "LocalShuffleDPMod",
    "PrivacyModeMod",
    "ProtocolViolationError",
    "SecAggCheckInFedAvg",
    "SecAggCheckInMod",
    "SecAggParameters",
    "ShuffleAccountingConfig",
    "ShuffleCheckInAccountant",
    "ShuffleCheckInEvent",
    "ShuffleCheckInFedAvg",
    "ShufflePrivacyConfig",
    "ShuffledReplies",
    "check_in",
    "make_rng",
    "secagg_parameters",
    "shuffle_replies",
]
