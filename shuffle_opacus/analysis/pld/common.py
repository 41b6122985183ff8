"""Pieces shared by the privacy-loss-distribution modules: defaults, checks, binning, composition.

Every PLD in :mod:`shuffle_opacus.analysis.pld` is a ``dp_accounting`` ``PrivacyLossDistribution``
whose losses were rounded *up* (pessimistic), so every delta read from it, alone or composed, is
an upper bound on the delta of the pair it describes. Mass that an enumeration leaves out is
placed at loss ``+inf``, where it adds to every delta.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from dp_accounting.pld import pld_pmf
from dp_accounting.pld.privacy_loss_distribution import PrivacyLossDistribution

from .._validation import check_delta, check_int, check_nonnegative, check_positive
from ..results import PLD_ACCOUNTING, PLD_ACCOUNTING_SYMMETRISED, AccountingResult

__all__ = [
    "PLD_ACCOUNTING",
    "PLD_ACCOUNTING_SYMMETRISED",
    "DEFAULT_DISCRETIZATION",
    "DEFAULT_TAIL",
    "check_discretization",
    "check_tail",
    "default_tail",
    "pmf_from_losses",
    "compose_plds",
    "pld_results",
]

DEFAULT_DISCRETIZATION = 1e-4
"""Default loss grid step of the PLDs."""

DEFAULT_TAIL = 1e-12
"""Default bound on the mass left out per round (added to delta)."""


def check_discretization(value: object) -> float:
    """Return ``value`` if it is a loss grid step in ``(0, 1]``.

    Raises:
        ValueError: otherwise.
    """
    d = check_positive("discretization", value)
    if d > 1.0:
        raise ValueError(f"discretization must be in (0, 1]. Found {value!r}.")
    return d


MIN_TAIL = 1e-290
"""Smallest truncated-mass budget: the enumerations take ``log(4 / tail)``, which must stay
finite (a subnormal tail overflows it)."""


def check_tail(value: object) -> float:
    """Return ``value`` if it is a truncated-mass budget in ``[MIN_TAIL, 1)``.

    Raises:
        ValueError: otherwise.
    """
    t = check_positive("tail", value)
    if t < MIN_TAIL or t >= 1.0:
        raise ValueError(f"tail must be in (0, 1) and >= {MIN_TAIL:g}. Found {value!r}.")
    return t


def default_tail(delta: float, rounds: int) -> float:
    """Return a truncated mass per round that keeps the total far below ``delta``.

    The mass left out of every round is added to delta, so ``rounds`` rounds cost at most
    ``rounds * tail``; ``min(1e-12, 1e-3 delta / rounds)`` keeps that at a thousandth of ``delta``.

    Args:
        delta: The target delta, in ``(0, 1)``.
        rounds: Number of rounds composed (integer >= 1).

    Returns:
        The per-round truncated-mass budget.

    Raises:
        ValueError: on an out-of-range argument, or when ``1e-3 delta / rounds`` is below
            :data:`MIN_TAIL` (the message names ``delta`` and its smallest value).
    """
    delta = check_delta(delta)
    rounds = check_int("rounds", rounds, minimum=1)
    tail = min(DEFAULT_TAIL, 1e-3 * delta / rounds)
    if tail < MIN_TAIL:
        smallest = MIN_TAIL * 1e3 * rounds
        raise ValueError(
            f"delta must be >= {smallest:.3g} for {rounds} rounds (the mass a privacy loss "
            f"distribution may leave out, 1e-3 delta / rounds, must be >= {MIN_TAIL:g}). "
            f"Found {delta!r}."
        )
    return tail


def pmf_from_losses(
    losses: np.ndarray,
    masses: np.ndarray,
    *,
    infinity_mass: float,
    discretization: float = DEFAULT_DISCRETIZATION,
) -> pld_pmf.DensePLDPmf:
    """Pessimistic dense PMF of a discrete privacy loss distribution.

    Each finite loss is rounded up to the next multiple of ``discretization`` (which can only
    increase every hockey-stick divergence), and the masses of equal rounded losses are summed.
    Losses equal to ``+inf`` go to ``infinity_mass``; losses equal to ``-inf`` contribute nothing to
    any delta and are dropped.

    Args:
        losses: Privacy losses ``log P(x)/Q(x)`` of the outcomes.
        masses: Their probabilities under ``P`` (same shape).
        infinity_mass: Extra mass placed at loss ``+inf`` (e.g. truncated mass).
        discretization: Grid step of the losses, in ``(0, 1]``.

    Returns:
        A ``dp_accounting.pld.pld_pmf.DensePLDPmf`` with ``pessimistic_estimate=True``.

    Raises:
        ValueError: on shapes that differ, negative or non-finite masses, a NaN loss, or a
            negative ``infinity_mass``.
    """
    discretization = check_discretization(discretization)
    infinity_mass = check_nonnegative("infinity_mass", infinity_mass)
    losses = np.asarray(losses, dtype=float).ravel()
    masses = np.asarray(masses, dtype=float).ravel()
    if losses.shape != masses.shape:
        raise ValueError(
            f"losses and masses must have the same length. Found {losses.size} and {masses.size}."
        )
    if np.any(np.isnan(losses)):
        raise ValueError("losses must not contain NaN.")
    if np.any(~np.isfinite(masses)) or np.any(masses < 0):
        raise ValueError("masses must be finite numbers >= 0.")
    infinity_mass += float(masses[losses == np.inf].sum())
    finite = np.isfinite(losses) & (masses > 0)
    if not np.any(finite):
        return pld_pmf.DensePLDPmf(discretization, 0, np.zeros(1), min(infinity_mass, 1.0), True)
    idx = np.ceil(losses[finite] / discretization).astype(np.int64)
    lower = int(idx.min())
    probs = np.bincount(idx - lower, weights=masses[finite])
    return pld_pmf.DensePLDPmf(discretization, lower, probs, min(infinity_mass, 1.0), True)


def compose_plds(*, plds: Sequence[PrivacyLossDistribution]) -> PrivacyLossDistribution:
    """Compose the PLDs of heterogeneous rounds (e.g. different ``n`` or ``eps0`` per round).

    Dominating pairs of adaptively composed mechanisms multiply (Zhu, Dong & Wang, *Optimal
    Accounting of Differential Privacy via Characteristic Function*, arXiv:2106.08567,
    Theorem 10), so their PLDs convolve; ``dp_accounting`` does it by FFT, pessimistically.

    Args:
        plds: One PLD per group of rounds, all built with the same ``discretization``.

    Returns:
        The PLD of the adaptive composition.

    Raises:
        ValueError: if ``plds`` is empty or the discretisations differ.
    """
    if len(plds) == 0:
        raise ValueError("plds must hold at least one PrivacyLossDistribution. Found none.")
    out = plds[0]
    for other in plds[1:]:
        out = out.compose(other)
    return out


def pld_results(
    base: PrivacyLossDistribution,
    *,
    mechanism: str,
    parameters: dict[str, object],
    steps: Sequence[int],
    delta: float,
    tail: float,
) -> list[AccountingResult]:
    """Epsilon of ``count`` compositions of ``base`` for each count in ``steps``, as records.

    Args:
        base: The PLD of one round (its truncated mass ``tail`` already at infinity).
        mechanism: Name for the records (``ldp-shuffle``, ``krr``, ...).
        parameters: The mechanism's parameters, in display order.
        steps: Round counts (integers >= 1).
        delta: Target delta in ``(0, 1)``.
        tail: The truncated mass per round that ``base`` holds at infinity.

    Returns:
        One :class:`~shuffle_opacus.analysis.AccountingResult` (``kind="pld"``) per count.

    Raises:
        ValueError: on an out-of-range argument.
    """
    delta = check_delta(delta)
    counts = [check_int("steps", s, minimum=1) for s in steps]
    results = []
    for count in counts:
        pld = base if count == 1 else base.self_compose(count)
        results.append(
            AccountingResult(
                mechanism=mechanism,
                method="pld",
                epsilon=max(0.0, float(pld.get_epsilon_for_delta(delta))),
                delta=delta,
                steps=count,
                parameters=parameters,
                kind="pld",
                accounting=PLD_ACCOUNTING,
                neighbouring="replace-one user",
                extra={"tail": tail},
            )
        )
    return results
