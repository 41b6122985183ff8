"""From a training history to epsilon: the one path every layer uses, and noise calibration.

A history is a list of ``(noise_multiplier, sample_rate, steps)`` entries, as Opacus
accountants keep it. :func:`history_epsilon` maps each entry to the analysis setting of its
protocol (:meth:`~shuffle_opacus.protocols.Protocol.round_setting`, with the analysis sigma of
:func:`~shuffle_opacus.protocols.analysis_sigma`) and hands the rounds to
:func:`shuffle_opacus.analysis.rounds_epsilon`. The Opacus accountants, the ``calibrate``
command, :func:`shuffle_opacus.make_private_with_epsilon` and the experiment's epsilon curves
all go through it, so they cannot disagree. This module does not import torch.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Sequence

from .analysis._validation import check_delta, check_int, check_positive
from .analysis.limits import (
    API_MAX_SECONDS,
    WorkLimitError,
    check_calibrate_budget,
    report_progress,
    work_budget,
)
from .analysis.mechanisms import get_mechanism, rounds_epsilon
from .analysis.rdp.conversion import DEFAULT_ORDER_LIMIT, EpsilonResult, OrderCapWarning
from .analysis.results import conversion_term
from .protocols import HistoryEntry, Protocol, analysis_sigma, get_protocol, resolve_sensitivity

__all__ = ["history_epsilon", "calibrate_noise_multiplier"]


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
) -> EpsilonResult:
    """Epsilon of a whole training history: RDP of every round summed, then Lemma 2.

    Rounds with different noise multipliers or rates compose by adding their RDP curves at each
    order (RDP composition), so a history with several entries is handled exactly like Opacus's
    RDP accountant does.

    Args:
        history: ``(noise_multiplier, sample_rate, steps)`` entries as kept by Opacus accountants.
            ``noise_multiplier`` is the *local* noise of one client relative to the clipping norm.
        protocol: A protocol name or record (see :data:`~shuffle_opacus.protocols.PROTOCOLS`).
        delta: Target delta in ``(0, 1)``.
        population: Number of clients ``n``.
        sensitivity: See :func:`~shuffle_opacus.protocols.resolve_sensitivity`.
        method: A method of the protocol's analysis; the tightest by default.
        reference: A reference curve of the analysis instead of a method (``no-shuffle`` or
            ``central``); a comparison, not a guarantee of the protocol.
        max_order: Optional cap on the Rényi order.

    Returns:
        An :class:`~shuffle_opacus.analysis.EpsilonResult`; epsilon is 0 for an empty history
        (with order 0).

    Raises:
        ValueError: on an invalid argument or history entry.
    """
    record = get_protocol(protocol)
    population = check_int("population", population, minimum=1)
    sens = resolve_sensitivity(sensitivity)
    if reference is None:
        method = record.check_method(method)
    delta = check_delta(delta)
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
    )


def calibrate_noise_multiplier(
    *,
    target_epsilon: float,
    delta: float,
    population: int,
    rounds: int,
    protocol: str | Protocol = "checkin",
    rate: float | None = None,
    sample_size: int | None = None,
    sensitivity: float | str = "replace-one",
    method: str | None = None,
    rel_tol: float = 1e-3,
    max_noise_multiplier: float = 1e4,
    max_seconds: float | None = API_MAX_SECONDS,
) -> float:
    """Smallest local noise multiplier (to ``rel_tol``) whose epsilon after ``rounds`` is <= target.

    A bisection on ``log(noise_multiplier)``. The value returned is always one at which epsilon
    was evaluated (by :func:`history_epsilon`) and found ``<= target_epsilon``, so the result
    never overshoots the target, whatever the shape of epsilon as a function of the noise.

    Args:
        target_epsilon: Privacy budget epsilon (> 0).
        delta: Target delta in ``(0, 1)``.
        population: Number of clients ``n``.
        rounds: Number of training rounds (integer >= 1).
        protocol: A protocol name or record.
        rate: Check-in probability (``checkin``).
        sample_size: Clients per round (``subsampled``).
        sensitivity: See :func:`~shuffle_opacus.protocols.resolve_sensitivity`.
        method: A method of the protocol's analysis; the tightest by default.
        rel_tol: Relative width of the final bracket (in ``(0, 1)``).
        max_noise_multiplier: Largest noise multiplier tried before giving up.
        max_seconds: Work budget in estimated seconds
            (:data:`~shuffle_opacus.analysis.limits.API_MAX_SECONDS` by default): the request
            is refused up front when its estimate exceeds it, and each Rényi order range is
            charged to it as it starts. ``None`` turns the budget off.

    Returns:
        The local noise multiplier (noise std of one client divided by the clipping norm).

    Raises:
        ValueError: on invalid arguments, when even ``max_noise_multiplier`` does not reach
            the target, when the target lies below the floor of Lemma 2 (Rényi-DP methods;
            see :func:`~shuffle_opacus.analysis.results.conversion_term`), or for a request
            over the work budget (:class:`~shuffle_opacus.analysis.limits.WorkLimitError`,
            naming ``population`` or ``rounds`` and its largest acceptable value).
    """
    target_epsilon = check_positive("target_epsilon", target_epsilon)
    delta = check_delta(delta)
    rounds = check_int("rounds", rounds, minimum=1)
    record = get_protocol(protocol)
    population = check_int("population", population, minimum=1)
    sample_rate = record.sample_rate(population=population, rate=rate, sample_size=sample_size)
    sens = resolve_sensitivity(sensitivity)
    method = record.check_method(method)
    rel_tol = check_positive("rel_tol", rel_tol)
    if rel_tol >= 1.0:
        raise ValueError(f"rel_tol must be in (0, 1). Found {rel_tol!r}.")
    max_noise_multiplier = check_positive("max_noise_multiplier", max_noise_multiplier)
    if get_mechanism(record.mechanism).method(method).kind != "pld":
        floor = min(conversion_term(order, delta) for order in range(2, DEFAULT_ORDER_LIMIT + 1))
        if target_epsilon < floor:
            # Every epsilon of Lemma 2 is at least its own term; no noise can reach the target.
            raise ValueError(
                f"target_epsilon must be >= {floor:.6g}: a smaller target is not reached with "
                f"noise_multiplier of any size (Lemma 2 gives no smaller epsilon at "
                f"delta={delta:g} with orders up to {DEFAULT_ORDER_LIMIT}; method pld has no "
                f"such floor). Found {target_epsilon!r}."
            )
    if max_seconds is not None:
        try:
            check_calibrate_budget(
                mechanism=record.mechanism,
                method=method,
                n=population,
                m=sample_size,
                rate=sample_rate,
                rounds=rounds,
                budget=float(max_seconds),
            )
        except WorkLimitError as exc:
            # The parameter is ``population`` here (``n`` in the estimate's message).
            text = str(exc)
            raise WorkLimitError(
                "population" + text[1:] if text.startswith("n ") else text
            ) from None

    def eps(noise_multiplier: float) -> float:
        report_progress(f"noise multiplier {noise_multiplier:.6g}")
        with warnings.catch_warnings():
            # An optimum at the order cap still gives a valid (looser) upper bound.
            warnings.simplefilter("ignore", OrderCapWarning)
            return history_epsilon(
                [(noise_multiplier, sample_rate, rounds)],
                protocol=record,
                delta=delta,
                population=population,
                sensitivity=sens,
                method=method,
            ).epsilon

    with work_budget(max_seconds):
        return _bisect(
            eps,
            target_epsilon=target_epsilon,
            rel_tol=rel_tol,
            max_noise_multiplier=max_noise_multiplier,
        )


def _bisect(
    eps: Callable[[float], float],
    *,
    target_epsilon: float,
    rel_tol: float,
    max_noise_multiplier: float,
) -> float:
    """Bisection on ``log(noise_multiplier)`` (see :func:`calibrate_noise_multiplier`).

    Args:
        eps: Epsilon as a function of the noise multiplier.
        target_epsilon: The target (> 0).
        rel_tol: Relative width of the final bracket.
        max_noise_multiplier: Largest noise multiplier tried.

    Returns:
        The smallest noise multiplier found with ``eps <= target_epsilon``.

    Raises:
        ValueError: when even ``max_noise_multiplier`` does not reach the target.
    """
    high = 1.0
    while eps(high) > target_epsilon:
        if high >= max_noise_multiplier:
            raise ValueError(
                f"target_epsilon={target_epsilon} is not reached with noise_multiplier <= "
                f"{max_noise_multiplier}; raise target_epsilon or max_noise_multiplier."
            )
        high = min(2.0 * high, max_noise_multiplier)
    low = high / 2.0
    while eps(low) <= target_epsilon:
        high = low
        low = low / 2.0
        if low < 1e-6:
            return high
    # Invariant: eps(high) <= target < eps(low).
    while high / low - 1.0 > rel_tol:
        mid = math.sqrt(low * high)
        if eps(mid) <= target_epsilon:
            high = mid
        else:
            low = mid
    return high
