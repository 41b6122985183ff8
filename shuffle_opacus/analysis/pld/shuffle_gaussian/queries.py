"""Composed rounds: delta and epsilon of a schedule of shuffle-Gaussian rounds.

See :mod:`shuffle_opacus.analysis.pld.shuffle_gaussian` and docs/maths.md.
"""

from __future__ import annotations

from collections.abc import Sequence

from dp_accounting.pld.privacy_loss_distribution import PrivacyLossDistribution

from ....common.validation import (
    check_delta,
    check_int,
    check_nonnegative,
)
from ..common import check_tail, compose_plds, per_round, pld_delta, pld_epsilon
from .pair import pld_tail
from .pmf import pld_discretization, shuffle_gaussian_pld


def _schedule(
    n: int | Sequence[int],
    sigma: float | Sequence[float],
    rate: float | None | Sequence[float | None],
    m: int | None | Sequence[int | None],
    steps: int | Sequence[int],
) -> list[tuple[int, float, float | None, int | None, int]]:
    rows = per_round({"n": n, "sigma": sigma, "rate": rate, "m": m, "steps": steps})
    return [(*row[:4], check_int("steps", row[4], minimum=1)) for row in rows]  # type: ignore[misc]


def _schedule_pld(
    plan: list[tuple[int, float, float | None, int | None, int]],
    discretization: float | None,
    tail: float,
) -> PrivacyLossDistribution:
    if discretization is None:
        discretization = min(
            pld_discretization(n=ni, sigma=si, rate=ri, m=mi) for ni, si, ri, mi, _ in plan
        )
    return compose_plds(
        plds=[
            shuffle_gaussian_pld(
                n=ni, sigma=si, rate=ri, m=mi, steps=k, discretization=discretization, tail=tail
            )
            for ni, si, ri, mi, k in plan
        ]
    )


def shuffle_gaussian_delta(
    eps: float,
    *,
    n: int | Sequence[int],
    sigma: float | Sequence[float],
    rate: float | None | Sequence[float | None] = None,
    m: int | None | Sequence[int | None] = None,
    steps: int | Sequence[int] = 1,
    discretization: float | None = None,
    tail: float = 1e-13,
) -> float:
    """Upper bound on ``delta(eps)`` of composed shuffle-Gaussian rounds (PLD accounting).

    Per-round parameters may be sequences of equal length (group ``i`` has ``steps[i]`` rounds
    with ``n[i]``, ``sigma[i]``, ``rate[i]``, ``m[i]``); scalars broadcast.

    Args:
        eps: Target epsilon, ``>= 0``.
        n: Users (scalar or per group).
        sigma: The paper's sigma (scalar or per group).
        rate: Check-in rate or ``None`` (scalar or per group).
        m: Users per round or ``None`` (scalar or per group).
        steps: Rounds (scalar or per group).
        discretization: Common loss grid step (the finest default of the groups by default).
        tail: Mass per round left out and added to delta.

    Returns:
        delta, the larger of the two directions.

    Raises:
        ValueError: on an out-of-range argument.
    """
    check_nonnegative("eps", eps)
    pld = _schedule_pld(_schedule(n, sigma, rate, m, steps), discretization, check_tail(tail))
    return pld_delta(pld, eps)


def shuffle_gaussian_epsilon(
    delta: float,
    *,
    n: int | Sequence[int],
    sigma: float | Sequence[float],
    rate: float | None | Sequence[float | None] = None,
    m: int | None | Sequence[int | None] = None,
    steps: int | Sequence[int] = 1,
    discretization: float | None = None,
    tail: float | None = None,
) -> float:
    """Smallest epsilon on the loss grid with ``delta(epsilon) <= delta`` (PLD accounting).

    Arguments as in :func:`shuffle_gaussian_delta`, with ``delta`` in ``(0, 1)``; ``tail``
    defaults to :func:`pld_tail` of ``delta`` and the total number of rounds.

    Returns:
        epsilon (``inf`` if the mass at infinite loss exceeds ``delta``).

    Raises:
        ValueError: on an out-of-range argument.
    """
    delta = check_delta(delta)
    plan = _schedule(n, sigma, rate, m, steps)
    if tail is None:
        tail = pld_tail(delta, sum(k for *_, k in plan))
    pld = _schedule_pld(plan, discretization, check_tail(tail))
    return pld_epsilon(pld, delta)
