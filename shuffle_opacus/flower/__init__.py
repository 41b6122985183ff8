"""Shuffle-model differential privacy for federated learning on Flower (``flwr``).

The protocol is the shuffled check-in of Liew & Takahashi (*Shuffle Gaussian Mechanism for
Differential Privacy*, arXiv:2206.09569) at **user level**: the unit of privacy is a Flower node
(a client with all of its examples), and ``n`` is the number of nodes. In every round

1. each node checks in independently with probability ``rate`` (γ); a round where nobody checks
   in is still a round (:mod:`.shuffler`, :class:`ShuffleCheckInFedAvg`);
2. each node that checked in trains locally; :class:`LocalShuffleDPMod`, the outermost mod of
   its ``ClientApp``, clips the node's whole update (the weights it returns minus the weights it
   received) to L2 norm ``C`` and adds ``N(0, σ²C²I)`` before anything leaves the node, and
   replaces the reply's metrics by the protocol's parameters;
3. a shuffler strips the node identities from the replies and permutes them
   (:func:`shuffle_replies`); FedAvg averages the anonymous reports;
4. the strategy accounts the round with the package's check-in accountant
   (:func:`shuffle_opacus.history_epsilon` with protocol ``checkin``), puts ε in the round's
   metrics, and stops before a round that would exceed the ε budget.

Inside one Flower server the check-in draw and the shuffler run in the ServerApp process, so
they *simulate* a trusted shuffler: the guarantee holds against whoever sees only the
shuffler's output (the aggregated model and the round metrics), not against the operator of the
ServerApp or SuperLink. This is the **trusted-server mode**.

The **secure-aggregation mode** trusts no server: every node flips its own coin
(:class:`SecAggCheckInMod`), every node's report, or zeros, enters Flower's SecAgg+ sum (Bell,
Bonawitz, Gascón, Lepoint and Raykova, *Secure Single-Server Aggregation with (Poly)Logarithmic
Overhead*, CCS 2020, IACR ePrint 2020/704), and :class:`SecAggCheckInFedAvg` learns only the sum
and the number of participants; the same check-in accountant applies (population ``n − D`` with
``D`` tolerated dropouts) under SecAgg+'s assumptions. The nodes enforce what the argument needs
beyond them: reply times padded to ``reply_after`` (a failing or overrunning training sends
zeros), the rounding drawn inside the mod, and the dropout rule before they unmask; the server
rejects a decoded sum no honest round produces. ``docs/flower.md`` (its trust model) and
``docs/maths.md`` state both modes' guarantees and assumptions.

Before the first round the strategy sends every node the privacy parameters alone; a node
whose mod is missing or disagrees (noise floor, sensitivity convention) stops the run with one
line before any round is run or accounted.

Parts:

* :class:`ShufflePrivacyConfig`: σ, C, γ, δ, the sensitivity convention and the analysis
  method, shared by the mod, the strategy and the accountant (:mod:`.config`);
* :class:`LocalShuffleDPMod`: the client-side clip-and-noise mod with a noise floor
  (:mod:`.mod`);
* :class:`ShuffleCheckInFedAvg`: the check-in FedAvg with shuffler, accountant and budget stop
  (:mod:`.strategy`);
* :class:`SecAggCheckInMod`, :class:`SecAggCheckInFedAvg`, :func:`secagg_parameters`: the
  secure-aggregation mode (:mod:`.secagg_mod` and the node's checks in :mod:`.secagg_node`;
  :mod:`.secagg_strategy` with :mod:`.secagg_workflow`, :mod:`.secagg_decode` and
  :mod:`.secagg_handshake`; :mod:`.secagg`);
* :class:`PrivacyModeMod`: one ClientApp for both modes (:mod:`.modes`);
* :func:`check_in`, :func:`shuffle_replies`, :func:`make_rng`: the check-in coins and the
  shuffler (:mod:`.shuffler`);
* :class:`InProcessGrid`: a Grid that calls a ``ClientApp`` in the same process, for tests and
  benchmarks without Ray or network (:mod:`.testing`);
* :mod:`.launch`: start a SuperLink (and SuperNodes) on loopback, ``flwr run`` an app, and stop
  every process it started by its id.

This subpackage is the only part of ``shuffle_opacus`` that imports ``flwr``; install it with
``pip install 'shuffle-opacus[flower]'``.
"""

from __future__ import annotations

import importlib.util

if importlib.util.find_spec("flwr") is None:  # pragma: no cover - exercised in a subprocess
    raise ImportError(
        "shuffle_opacus.flower needs Flower (flwr), which is not installed: "
        "pip install 'shuffle-opacus[flower]'"
    )

from .config import METRIC_KEYS, MODES, SECAGG, TRUSTED_SERVER, ShufflePrivacyConfig  # noqa: E402
from .mod import LocalShuffleDPMod  # noqa: E402
from .modes import PrivacyModeMod  # noqa: E402
from .secagg import SecAggParameters, secagg_parameters  # noqa: E402
from .secagg_mod import SecAggCheckInMod  # noqa: E402
from .secagg_strategy import SECAGG_ROUND_METRIC_KEYS, SecAggCheckInFedAvg  # noqa: E402
from .shuffler import ShuffledReplies, check_in, make_rng, shuffle_replies  # noqa: E402
from .strategy import ROUND_METRIC_KEYS, ProtocolViolationError, ShuffleCheckInFedAvg  # noqa: E402
from .testing import InProcessGrid  # noqa: E402

__all__ = [
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
    "ShuffleCheckInFedAvg",
    "ShufflePrivacyConfig",
    "ShuffledReplies",
    "check_in",
    "make_rng",
    "secagg_parameters",
    "shuffle_replies",
]
