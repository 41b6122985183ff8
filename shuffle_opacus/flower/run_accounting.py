"""The ε of one check-in run: one history, the tight and the proven ε, what each rests on.

:class:`RunAccounting` is the accounting side of a strategy of :mod:`.checkin_base`: the run's
:class:`~.accounting.ShuffleCheckInAccountant`, whose
:class:`~shuffle_opacus.accounting.ledger.RoundLedger` is the run's one history (every round
composed once, noiseless ones included), the round the run plays (its σ, γ and population), ε
after the rounds accounted or more of them, by the configured method or the method ``proven``,
and the budget check. :func:`guarantees_record` says what each ε rests on. Nothing here imports
flwr.
"""

from __future__ import annotations

import math
from typing import Any

from ..accounting.ledger import RoundLedger
from ..accounting.protocols import SENSITIVITIES, get_protocol, sensitivity_assumptions
from ..analysis.epsilon import proven_note
from ..analysis.rdp.conversion import EpsilonResult
from ..common.validation import check_int
from .accounting import ShuffleAccountingConfig, ShuffleCheckInAccountant, ShuffleCheckInEvent
from .config import ShufflePrivacyConfig

__all__ = [
    "EPSILON_PROVEN_KEY",
    "PROVEN_METHOD",
    "PROVEN_SENSITIVITY",
    "RunAccounting",
    "guarantees_record",
]

#: Key of the proven ε in a round's metrics: present at evaluation rounds and the last round.
EPSILON_PROVEN_KEY = "epsilon-proven"

#: The method of the proven ε (no assumption on where the other nodes' updates lie).
PROVEN_METHOD = "proven"

#: Sensitivity of the proven ε, in units of C: replace-one, whatever the run's convention (a
#: smaller one is itself an assumption on where the updates lie).
PROVEN_SENSITIVITY = SENSITIVITIES["replace-one"]


class RunAccounting:
    """The accountant of one run and its ε after any number of rounds at the run's settings.

    Args:
        privacy: The run's σ, γ, δ, sensitivity convention and method.
        population: ``n``, the population the accountant uses.
        max_epsilon: The run's budget, in the accountant's configuration (``None``: none).

    Attributes:
        privacy: As given.
        event: One round of the run, as the accountant composes it.
        accountant: The run's :class:`~.accounting.ShuffleCheckInAccountant` (its
            configuration is the run's: δ, population, method, sensitivity, budget).
    """

    def __init__(
        self, privacy: ShufflePrivacyConfig, population: int, max_epsilon: float | None
    ) -> None:
        self.privacy = privacy
        self.event = ShuffleCheckInEvent(privacy.noise_multiplier, privacy.rate, population)
        config = ShuffleAccountingConfig(
            target_delta=privacy.delta,
            population_size=population,
            max_epsilon=max_epsilon,
            method=privacy.method,
            sensitivity=privacy.sensitivity,
        )
        self.accountant = ShuffleCheckInAccountant(config)

    @property
    def ledger(self) -> RoundLedger:
        """The rounds accounted: the accountant's ledger."""
        return self.accountant.ledger

    def account_round(self) -> None:
        """Compose one round of :attr:`event` into the accountant."""
        self.accountant.compose(self.event)

    def result(
        self, rounds: int | None = None, *, proven: bool = False
    ) -> tuple[int, EpsilonResult | None]:
        """Return the rounds asked for and the accountant's result after them.

        Args:
            rounds: Number of rounds (at least those accounted; ``None``: those); the rounds
                beyond those accounted are rounds of :attr:`event`.
            proven: Use the method ``proven`` under replace-one adjacency
                (:data:`PROVEN_SENSITIVITY`) instead of the configured method and sensitivity.

        Returns:
            ``(rounds, result)``; the result is ``None`` where ε needs no analysis: no round
            (0) or a noiseless one (``inf``).

        Raises:
            ValueError: for ``rounds`` smaller than the rounds already accounted.
        """
        done = self.ledger.rounds
        rounds = done if rounds is None else check_int("rounds", rounds, minimum=done)
        then = None if rounds == done else (self.event, rounds - done)
        return rounds, self.accountant.epsilon_result(proven=proven, then=then)

    def epsilon(self, rounds: int | None = None, *, proven: bool = False) -> float:
        """Return ε at the run's δ after ``rounds`` rounds (as :meth:`result`).

        Returns:
            ε; 0 for no round, ``inf`` when any round is (or would be) noiseless.
        """
        rounds, result = self.result(rounds, proven=proven)
        if result is not None:
            return float(result.epsilon)
        return 0.0 if rounds == 0 else math.inf

    def guarantees(self) -> dict[str, dict[str, Any]]:
        """Return :func:`guarantees_record` after the rounds accounted (computes the proven ε)."""
        tight, proven = self.result()[1], self.result(proven=True)[1]
        return guarantees_record(self.privacy, tight, proven)

    def allows_another_round(self, max_epsilon: float | None) -> bool:
        """Return whether one more round keeps ε within ``max_epsilon`` (True for ``None``)."""
        return max_epsilon is None or not self.accountant.would_exceed(self.event, max_epsilon)

    def budget_message(self, server_round: int, max_epsilon: float | None) -> str:
        """Return the line that says why the run stops before ``server_round``."""
        after = self.epsilon(self.ledger.rounds + 1)
        return (
            f"stopped before round {server_round}: epsilon would reach {after:.6g} > budget "
            f"{max_epsilon:g} (delta = {self.privacy.delta:g})"
        )


def guarantees_record(
    privacy: ShufflePrivacyConfig, tight: EpsilonResult | None, proven: EpsilonResult | None
) -> dict[str, dict[str, Any]]:
    """Say what the tight ε and the proven ε of a run are and rest on.

    Args:
        privacy: The run's configuration (its method, sensitivity and δ).
        tight: The result of the configured method, or ``None`` where ε needed no analysis
            (no round, or a noiseless one).
        proven: The result of the method ``proven`` (:data:`PROVEN_METHOD`), or ``None``.

    Returns:
        ``{"epsilon": ..., EPSILON_PROVEN_KEY: ...}``, each a dict with ``method`` (the method
        used: for ``epsilon`` the configured one, or the Rényi fallback where the default is
        beyond the work limits), ``sensitivity`` (in units of C), ``delta``, ``assumptions``
        (from :meth:`~shuffle_opacus.analysis.mechanisms.Mechanism.assumptions_of`, plus what a
        sensitivity below 2 C assumes) and ``note`` (how the proven ε was obtained: route,
        level and delta's split; the tight one's fallback note; or ``None``).
    """
    mech = get_protocol("checkin").analysis
    method = (
        tight.method if tight is not None and tight.method else privacy.method
    ) or mech.default_method
    proven_details = None if proven is None else dict(proven.details or {})
    return {
        "epsilon": {
            "method": method,
            "sensitivity": privacy.sensitivity,
            "delta": privacy.delta,
            "assumptions": [
                *mech.assumptions_of(method),
                *sensitivity_assumptions(privacy.sensitivity),
            ],
            "note": None if tight is None else tight.note,
        },
        EPSILON_PROVEN_KEY: {
            "method": PROVEN_METHOD,
            "sensitivity": PROVEN_SENSITIVITY,
            "delta": privacy.delta,
            "assumptions": list(mech.assumptions_of(PROVEN_METHOD)),
            "note": None if proven_details is None else proven_note(proven_details),
        },
    }
