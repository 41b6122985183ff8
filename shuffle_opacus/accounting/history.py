"""From a training history to epsilon: the one path every layer uses.

A history is a list of ``(noise_multiplier, sample_rate, steps)`` entries, as Opacus
accountants keep it. :func:`history_epsilon` maps each entry to the analysis setting of its
protocol (:meth:`~shuffle_opacus.accounting.protocols.Protocol.round_setting`, with the analysis
sigma of :func:`~shuffle_opacus.accounting.protocols.analysis_sigma`) and hands the rounds to
:func:`shuffle_opacus.analysis.epsilon.rounds_epsilon`. The Opacus accountants, calibration
(:mod:`.calibration`), the Flower strategies and the experiment's epsilon curves all go through
it, so they cannot disagree. This module does not import torch.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..analysis.epsilon import rounds_epsilon
from ..analysis.rdp.conversion import EpsilonResult
from ..common.validation import MIN_DELTA, check_int, check_target_delta
from .protocols import HistoryEntry, Protocol, analysis_sigma, get_protocol, resolve_sensitivity

__all__ = ["MIN_DELTA", "history_epsilon"]


def history_epsilon(
    history: Sequence[HistoryEntry],
    *,
    protocol: str | Protocol,
    delta: float,
    population: int,
    sensitivity: float | str = "replace-one",
    method: str | None = None,
    reference: str | None = None,
    max_order: int | None = None,
    lower: bool = False,
) -> EpsilonResult:
    """Epsilon of a whole training history under replace-one adjacency of one client.

    By default the rounds' privacy loss distributions (of the symmetrised Theorem 1 pair) are
    composed; a Rényi-DP method sums the rounds' RDP at each order and converts by Lemma 2. A
    history with several entries (different noise multipliers or rates) composes either way.

    Args:
        history: ``(noise_multiplier, sample_rate, steps)`` entries as kept by Opacus accountants.
            ``noise_multiplier`` is the *local* noise of one client relative to the clipping norm.
        protocol: A protocol name or record (see
            :data:`~shuffle_opacus.accounting.protocols.PROTOCOLS`).
        delta: Target delta in ``[1e-200, 1)`` (a smaller one underflows the accounting).
        population: Number of clients ``n``.
        sensitivity: See :func:`~shuffle_opacus.accounting.protocols.resolve_sensitivity`.
        method: A method of the protocol's analysis; by default the tightest sound one
            (``pld``), or the protocol's Rényi bound where ``pld`` is beyond the work limits
            (the result's ``method`` and ``note`` say which).
        reference: A reference curve of the analysis instead of a method (``no-shuffle`` or
            ``central``); a comparison, not a guarantee of the protocol.
        max_order: Optional cap on the Rényi order.
        lower: For ``pld``, also compute the optimistic estimate of the same pair
            (``epsilon_lower``; three compositions instead of one).

    Returns:
        An :class:`~shuffle_opacus.analysis.rdp.conversion.EpsilonResult`; epsilon is 0 for an
        empty history (with order 0).

    Raises:
        ValueError: on an invalid argument or history entry.
    """
    record = get_protocol(protocol)
    population = check_int("population", population, minimum=1)
    sens = resolve_sensitivity(sensitivity)
    if reference is None:
        method = record.check_method(method)
    delta = check_target_delta(delta)
    rounds = []
    for noise_multiplier, sample_rate, steps in history:
        if check_int("steps", steps, minimum=0) == 0:
            continue
        setting = record.round_setting(
            population=population,
            sigma=analysis_sigma(noise_multiplier, sens),
            sample_rate=sample_rate,
        )
        rounds.append((setting, int(steps)))
    return rounds_epsilon(
        record.mechanism,
        rounds,
        delta=delta,
        method=method,
        reference=reference,
        max_order=max_order,
        lower=lower,
    )
