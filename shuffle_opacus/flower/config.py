"""The privacy parameters the mod, the strategy and the accountant must agree on.

One :class:`ShufflePrivacyConfig` travels with every training instruction (as entries of its
``ConfigRecord``, :meth:`ShufflePrivacyConfig.to_config`). The node's mod applies the noise
multiplier and clipping norm it finds there, after checking them against its own floor and
sensitivity convention, and echoes all five parameters (:meth:`ShufflePrivacyConfig.reply_metrics`);
the strategy refuses a reply whose echo differs and accounts with exactly these values. So a
round is accounted with what the nodes applied, or the run stops. Units (as in
:mod:`shuffle_opacus.accounting.protocols`): ``clip_norm`` ``C`` bounds the L2 norm of a node's
whole update in parameter units; ``noise_multiplier`` σ is the noise std per coordinate divided by
``C``; ``sensitivity`` is the distance between a node's two possible reports in units of ``C``
(``replace-one``: 2, ``paper``: 1); the analysis sigma is ``noise_multiplier / sensitivity``.
The secure-aggregation mode's echo (:func:`secagg_echo`) adds the mode, ``n`` and ``D``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..accounting.protocols import get_protocol, resolve_sensitivity
from ..common.validation import (
    check_nonnegative,
    check_positive,
    check_probability,
    check_target_delta,
)

__all__ = [
    "ARRAY_NAMES_KEY",
    "CONFIG_KEYS",
    "ECHO_RECORD_KEY",
    "HANDSHAKE_KEY",
    "MAX_DROPOUTS_KEY",
    "METRIC_KEYS",
    "MODES",
    "MODE_KEY",
    "NUM_EXAMPLES_KEY",
    "NUM_NODES_KEY",
    "SECAGG",
    "TRUSTED_SERVER",
    "ShufflePrivacyConfig",
    "echo_differences",
    "secagg_echo",
]

#: ConfigRecord (and echo) key of each parameter.
CONFIG_KEYS: dict[str, str] = {
    "noise_multiplier": "shuffle-dp.noise-multiplier",
    "clip_norm": "shuffle-dp.clip-norm",
    "rate": "shuffle-dp.rate",
    "delta": "shuffle-dp.delta",
    "sensitivity": "shuffle-dp.sensitivity",
}

#: ConfigRecord key (``True``) of the strategy's start-up check: the mod answers such an
#: instruction with the echo of the parameters (or a refusal) and never runs the training code.
HANDSHAKE_KEY = "shuffle-dp.handshake"

#: FedAvg's weight key; the mod sets it to 1 so that the average is uniform over the reports
#: and reveals nothing about a node's number of examples.
NUM_EXAMPLES_KEY = "num-examples"

#: Every key of a reply's MetricRecord, and nothing else is allowed there.
METRIC_KEYS: tuple[str, ...] = (NUM_EXAMPLES_KEY, *CONFIG_KEYS.values())

#: The two trust modes of the Flower layer. ``trusted-server``: the server draws the check-in
#: coins and a shuffler simulated inside it strips node identities (:class:`ShuffleCheckInFedAvg`
#: with :class:`LocalShuffleDPMod`); the guarantee holds if the server's operator is trusted.
#: ``secagg``: every node draws its own coin and every node's report enters Flower's SecAgg+ sum
#: (:class:`SecAggCheckInFedAvg` with :class:`SecAggCheckInMod`); nobody is trusted beyond
#: SecAgg+'s own assumptions.
TRUSTED_SERVER = "trusted-server"
SECAGG = "secagg"
MODES: tuple[str, ...] = (TRUSTED_SERVER, SECAGG)

#: ConfigRecord key of the mode in the instructions of the secure-aggregation mode (and echo).
MODE_KEY = "shuffle-dp.mode"
#: ConfigRecord keys (and echo) of the secure-aggregation mode's population ``n`` and ``D``.
NUM_NODES_KEY = "shuffle-dp.num-nodes"
MAX_DROPOUTS_KEY = "shuffle-dp.max-dropouts"
#: ConfigRecord key of the model's array names (Flower's legacy messages carry no names).
ARRAY_NAMES_KEY = "shuffle-dp.array-names"
#: Record key of the echo in the secure-aggregation mode's answer to the start-up check.
ECHO_RECORD_KEY = "shuffle-dp.echo"

_CHECKIN = get_protocol("checkin")


@dataclass(frozen=True, init=False)
class ShufflePrivacyConfig:
    """σ, C, γ, δ, sensitivity convention and analysis method of a shuffled check-in run.

    Attributes:
        noise_multiplier: Local σ: each node's noise std per coordinate divided by
            ``clip_norm`` (> 0; 0 only with ``allow_noiseless``, and then epsilon = inf).
        clip_norm: ``C``, the L2 bound of a node's whole update (> 0).
        rate: Check-in probability γ of every node in every round, in ``(0, 1]``.
        delta: Target δ in ``[1e-200, 1)``.
        sensitivity: Sensitivity in units of ``C`` as a float (``"replace-one"`` = 2.0 and
            ``"paper"`` = 1.0 are accepted by the constructor and stored as numbers).
        method: Method of the check-in analysis; ``None`` (the default) is the tightest sound
            one, ``pld``, or the Rényi bound ``exact`` where ``pld`` is beyond the work limits
            (see :data:`shuffle_opacus.PROTOCOLS`).
        allow_noiseless: Whether ``noise_multiplier = 0`` was explicitly allowed (tests and
            equivalence checks only; not transmitted and not compared).
    """

    noise_multiplier: float
    clip_norm: float
    rate: float
    delta: float
    sensitivity: float = 2.0
    method: str | None = None
    allow_noiseless: bool = dataclasses.field(default=False, compare=False)

    def __init__(
        self,
        *,
        noise_multiplier: float,
        clip_norm: float,
        rate: float,
        delta: float,
        sensitivity: float | str = "replace-one",
        method: str | None = None,
        allow_noiseless: bool = False,
    ) -> None:
        """Validate and store the parameters; see the class attributes.

        Raises:
            ValueError: naming the first parameter outside its range (``noise_multiplier``
                <= 0 unless ``allow_noiseless``, then < 0; ``rate`` outside ``(0, 1]``; ...).
        """
        if not isinstance(allow_noiseless, bool):
            raise ValueError(f"allow_noiseless must be True or False. Found {allow_noiseless!r}.")
        check_sigma = check_nonnegative if allow_noiseless else check_positive
        values = {
            "noise_multiplier": check_sigma("noise_multiplier", noise_multiplier),
            "clip_norm": check_positive("clip_norm", clip_norm),
            "rate": check_probability("rate", rate),
            "delta": check_target_delta(delta),
            "sensitivity": resolve_sensitivity(sensitivity),
            "method": _CHECKIN.check_method(method),
            "allow_noiseless": allow_noiseless,
        }
        for key, value in values.items():
            object.__setattr__(self, key, value)

    @property
    def analysis_sigma(self) -> float:
        """σ in units of the sensitivity: ``noise_multiplier / sensitivity`` (the paper's σ)."""
        return self.noise_multiplier / self.sensitivity

    @property
    def noise_std(self) -> float:
        """Standard deviation of each node's noise per coordinate: ``noise_multiplier * C``."""
        return self.noise_multiplier * self.clip_norm

    def to_config(self) -> dict[str, float]:
        """Return the entries to put in a training instruction's ``ConfigRecord``."""
        return {key: float(getattr(self, field)) for field, key in CONFIG_KEYS.items()}

    def reply_metrics(self) -> dict[str, int | float]:
        """Return a reply's whole MetricRecord: weight 1 and the echoed parameters."""
        return {NUM_EXAMPLES_KEY: 1, **self.to_config()}

    @classmethod
    def from_config(
        cls,
        config: Mapping[str, Any],
        *,
        method: str | None = None,
        allow_noiseless: bool = False,
    ) -> ShufflePrivacyConfig:
        """Read the parameters from a ``ConfigRecord`` (or any mapping) built by :meth:`to_config`.

        Args:
            config: The mapping.
            method: Analysis method to attach (not carried in the record).
            allow_noiseless: Accept ``noise_multiplier = 0`` (tests only).

        Returns:
            The validated configuration.

        Raises:
            ValueError: if a key is missing or a value is outside its range.
        """
        missing = [key for key in CONFIG_KEYS.values() if key not in config]
        if missing:
            raise ValueError(
                f"the training instruction lacks the shuffle-model parameters {missing}; the "
                f"server must use shuffle_opacus.flower.ShuffleCheckInFedAvg."
            )
        values: dict[str, Any] = {}
        for field, key in CONFIG_KEYS.items():
            value = config[key]
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ValueError(f"{key} must be a number. Found {value!r}.")
            values[field] = float(value)
        return cls(**values, method=method, allow_noiseless=allow_noiseless)

    def differences(self, metrics: Mapping[str, Any]) -> list[str]:
        """Return the parameters on which a reply's MetricRecord disagrees with this config.

        A reply agrees when it holds exactly the keys of :data:`METRIC_KEYS`, its weight is 1,
        and every echoed parameter equals this configuration's (relative tolerance 1e-12).

        Args:
            metrics: The reply's MetricRecord.

        Returns:
            One short description per disagreement; empty when the reply agrees.
        """
        problems = []
        extra = sorted(set(metrics) - set(METRIC_KEYS))
        if extra:
            problems.append(f"unexpected metrics {extra}")
        expected = self.reply_metrics()
        for key, want in expected.items():
            got = metrics.get(key)
            if isinstance(got, bool) or not isinstance(got, (int, float)):
                problems.append(f"{key} missing or not a number ({got!r})")
            elif not math.isclose(float(got), float(want), rel_tol=1e-12, abs_tol=0.0):
                problems.append(f"{key} = {got!r}, expected {want!r}")
        return problems


def secagg_echo(
    privacy: ShufflePrivacyConfig, *, num_nodes: int, max_dropouts: int
) -> dict[str, float | int | str]:
    """Return the echo of the secure-aggregation mode: what a node agreed to be accounted with.

    The same for every node and every round (it does not depend on the node's check-in coin):
    the five privacy parameters, the mode, ``n`` and ``D``.

    Args:
        privacy: The run's privacy parameters.
        num_nodes: ``n``.
        max_dropouts: ``D``.

    Returns:
        The echo as a mapping for a ``ConfigRecord``.
    """
    return {
        **privacy.to_config(),
        MODE_KEY: SECAGG,
        NUM_NODES_KEY: int(num_nodes),
        MAX_DROPOUTS_KEY: int(max_dropouts),
    }


def echo_differences(expected: Mapping[str, Any], got: Mapping[str, Any]) -> list[str]:
    """Return the disagreements between an expected echo and a node's echo.

    Keys must match exactly; numbers must agree to a relative 1e-12, strings exactly.

    Args:
        expected: From :func:`secagg_echo`.
        got: The node's echo.

    Returns:
        One short description per disagreement; empty when they agree.
    """
    problems = []
    extra = sorted(set(got) - set(expected))
    if extra:
        problems.append(f"unexpected echo keys {extra}")
    for key, want in expected.items():
        value = got.get(key)
        if isinstance(want, str):
            if value != want:
                problems.append(f"{key} = {value!r}, expected {want!r}")
        elif isinstance(value, bool) or not isinstance(value, (int, float)):
            problems.append(f"{key} missing or not a number ({value!r})")
        elif not math.isclose(float(value), float(want), rel_tol=1e-12, abs_tol=0.0):
            problems.append(f"{key} = {value!r}, expected {want!r}")
    return problems
