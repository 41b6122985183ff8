"""Pieces shared by the privacy-loss-distribution modules: defaults, checks, binning, composition.

Every PLD in :mod:`shuffle_opacus.analysis.pld` is a ``dp_accounting`` ``PrivacyLossDistribution``
whose losses were rounded *up* (pessimistic), so every delta read from it, alone or composed, is
an upper bound on the delta of the pair it describes. Mass that an enumeration leaves out is
placed at loss ``+inf``, where it adds to every delta. Where a result also reports a lower end,
it comes from the optimistic PLD of the same pair: losses rounded *down*, the left-out mass
dropped (:func:`lower_epsilon`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np

from ...common.validation import check_delta, check_int, check_nonnegative, check_positive
from ..results import PLD_ACCOUNTING, PLD_ACCOUNTING_SYMMETRISED, AccountingResult

if TYPE_CHECKING:  # imported where used: a query answered from the disk cache needs neither
    from dp_accounting.pld import pld_pmf
    from dp_accounting.pld.privacy_loss_distribution import PrivacyLossDistribution

__all__ = [
    "PLD_ACCOUNTING",
    "PLD_ACCOUNTING_SYMMETRISED",
    "DEFAULT_DISCRETIZATION",
    "DEFAULT_TAIL",
    "binom_logpmf",
    "check_discretization",
    "check_tail",
    "default_tail",
    "pmf_from_losses",
    "prebin_losses",
    "compose_plds",
    "LOWER_TRUNCATION",
    "lower_epsilon",
    "pld_results",
    "per_round",
    "pld_delta",
    "pld_epsilon",
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


_LONG = np.finfo(np.longdouble)


def exact_sum(values: np.ndarray) -> float:
    """``math.fsum(values)``, bit for bit: the correctly rounded sum, faster on large arrays.

    The values are summed in extended precision (numpy's pairwise sum of ``longdouble``, 64-bit
    significands on x86), whose error is at most ``depth * 2^-64 * sum |x|`` for a summation
    tree of that depth. When the whole interval of that width around the sum rounds to one
    double, that double is the correctly rounded exact sum, which is what ``math.fsum`` returns;
    otherwise (a sum next to a rounding boundary or at zero, small or non-finite input, an
    overflow, or a platform whose ``longdouble`` is a double) ``math.fsum`` answers.

    Args:
        values: Any array of floats.

    Returns:
        ``math.fsum(values)``.
    """
    x = np.asarray(values, dtype=np.float64).ravel()
    if x.size < 4096 or _LONG.nmant < 63:
        return math.fsum(x.tolist())
    wide = x.astype(np.longdouble)
    with np.errstate(invalid="ignore", over="ignore"):
        total = np.sum(wide)
        magnitude = np.sum(np.abs(wide))
    if not (np.isfinite(total) and np.isfinite(magnitude)):
        return math.fsum(x.tolist())
    # numpy's pairwise sum: 16 sequential terms, 3 levels joining 8 of them, one level per
    # halving above 128 terms; the margin doubles the bound twice over for the rounding of
    # magnitude, of this width and of the two ends.
    depth = math.ceil(math.log2(x.size)) + 24
    width = 2 * depth * np.longdouble(_LONG.eps) * magnitude + np.longdouble(_LONG.tiny)
    low, high = float(total - width), float(total + width)
    if low == high and math.isfinite(low) and low != 0.0:
        return low
    # Near a boundary, at zero (whose sign fsum decides) or overflowing (fsum raises): fsum.
    return math.fsum(x.tolist())


def binom_logpmf(k: np.ndarray | int, trials: np.ndarray | int, prob: float) -> np.ndarray:
    """``log Bin(trials, prob)(k)``, accurate to about 1e-13 at any ``trials``.

    scipy's ``binom.logpmf`` subtracts log-gammas of size ``trials log trials``, which loses
    about ``1e-16 trials log trials`` in absolute terms: 1e-6 at ``trials = 10^9``, enough to
    make a pair's masses sum to 1 - 2e-7 per round there. Its ``pmf`` (Loader's saddle point
    expansion) keeps full relative accuracy, so its log is taken wherever it does not underflow.
    The PLDs of the proven method, of shuffled eps0-LDP reports and of shuffled k-RR take
    their binomial log-masses from here.
    """
    from scipy.stats import binom

    pmf = binom.pmf(k, trials, prob)
    with np.errstate(divide="ignore"):
        return np.where(
            pmf > 1e-290, np.log(np.maximum(pmf, 1e-300)), binom.logpmf(k, trials, prob)
        )


def pmf_from_losses(
    losses: np.ndarray,
    masses: np.ndarray,
    *,
    infinity_mass: float,
    discretization: float = DEFAULT_DISCRETIZATION,
    pessimistic: bool = True,
) -> pld_pmf.DensePLDPmf:
    """Dense PMF of a discrete privacy loss distribution, rounded up (default) or down.

    Each finite loss is rounded up to the next multiple of ``discretization`` (which can only
    increase every hockey-stick divergence), or with ``pessimistic=False`` down to the previous
    one (which can only decrease it), and the masses of equal rounded losses are summed.
    Losses equal to ``+inf`` go to ``infinity_mass``; losses equal to ``-inf`` contribute nothing to
    any delta and are dropped.

    Args:
        losses: Privacy losses ``log P(x)/Q(x)`` of the outcomes.
        masses: Their probabilities under ``P`` (same shape).
        infinity_mass: Extra mass placed at loss ``+inf`` (e.g. truncated mass; pass 0 for an
            optimistic PMF, which drops what an enumeration left out).
        discretization: Grid step of the losses, in ``(0, 1]``.
        pessimistic: Round up (an upper bound on every delta) or down (a lower bound).

    Returns:
        A ``dp_accounting.pld.pld_pmf.DensePLDPmf`` with ``pessimistic_estimate=pessimistic``.

    Raises:
        ValueError: on shapes that differ, negative or non-finite masses, a NaN loss, or a
            negative ``infinity_mass``.
    """
    from dp_accounting.pld import pld_pmf

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
    pessimistic = bool(pessimistic)
    if not np.any(finite):
        return pld_pmf.DensePLDPmf(
            discretization, 0, np.zeros(1), min(infinity_mass, 1.0), pessimistic
        )
    scaled = losses[finite] / discretization
    idx = (np.ceil(scaled) if pessimistic else np.floor(scaled)).astype(np.int64)
    lower = int(idx.min())
    probs = np.bincount(idx - lower, weights=masses[finite])
    return pld_pmf.DensePLDPmf(discretization, lower, probs, min(infinity_mass, 1.0), pessimistic)


def prebin_losses(
    loss: np.ndarray, mass: np.ndarray, *, discretization: float, pessimistic: bool = True
) -> tuple[np.ndarray, np.ndarray]:
    """Group outcomes by their rounded loss bin: one representative loss and the bin's mass.

    Pessimistic bins round up, and their largest loss rounds to the same bin; optimistic bins
    round down, and their smallest loss does. So feeding :func:`pmf_from_losses` these pairs
    (with the same rounding) gives the same PMF as feeding it every outcome, from far fewer
    points. ``+inf`` losses pass through as one; ``-inf`` and NaN are not expected.

    Args:
        loss: Privacy losses of the outcomes.
        mass: Their masses (same shape).
        discretization: Grid step of the losses, in ``(0, 1]``.
        pessimistic: The rounding :func:`pmf_from_losses` will use.

    Returns:
        ``(losses, masses)``: one entry per occupied bin, then ``+inf`` with its mass.
    """
    finite = np.isfinite(loss)
    inf_mass = float(mass[loss == np.inf].sum())
    loss, mass = loss[finite], mass[finite]
    if loss.size == 0:
        return np.array([np.inf]), np.array([inf_mass])
    scaled = loss / discretization
    idx = (np.ceil(scaled) if pessimistic else np.floor(scaled)).astype(np.int64)
    idx -= idx.min()
    sign = 1.0 if pessimistic else -1.0
    top = np.full(int(idx.max()) + 1, -np.inf)
    np.maximum.at(top, idx, sign * loss)
    tot = np.bincount(idx, weights=mass, minlength=top.size)
    used = top > -np.inf
    return np.append(sign * top[used], np.inf), np.append(tot[used], inf_mass)


def per_round(columns: Mapping[str, object]) -> list[tuple[object, ...]]:
    """Broadcast scalar-or-sequence per-round parameters to one row per group of rounds.

    Args:
        columns: Parameter name -> a scalar, or a list, tuple or array of one value per group.

    Returns:
        One tuple per group, in the order of ``columns``.

    Raises:
        ValueError: if two sequences differ in length (naming the parameter).
    """
    seqs = {
        name: list(v) if isinstance(v, (list, tuple, np.ndarray)) else None
        for name, v in columns.items()
    }
    length = max((len(s) for s in seqs.values() if s is not None), default=1)
    rows: list[list[object]] = []
    for name, value in columns.items():
        seq = seqs[name]
        if seq is not None and len(seq) not in (1, length):
            raise ValueError(
                f"{name} must be a scalar or have the same length as the other per-round "
                f"parameters ({length}). Found length {len(seq)}."
            )
        rows.append(seq * length if seq is not None and len(seq) == 1 else seq or [value] * length)
    return list(zip(*rows, strict=True))


def pld_delta(pld: PrivacyLossDistribution, eps: float) -> float:
    """Return ``delta(eps)`` of ``pld`` (the larger direction), at most 1.

    Args:
        pld: A composed PLD.
        eps: Target epsilon, ``>= 0`` (checked).

    Returns:
        delta.

    Raises:
        ValueError: for a negative or non-finite ``eps``.
    """
    eps = check_nonnegative("eps", eps)
    return float(min(1.0, pld.get_delta_for_epsilon(eps)))


def pld_epsilon(pld: PrivacyLossDistribution, delta: float) -> float:
    """Return the smallest epsilon on the loss grid with ``delta(epsilon) <= delta``, >= 0.

    Args:
        pld: A composed PLD.
        delta: Target delta, already checked to be in ``(0, 1)``.

    Returns:
        epsilon (``inf`` if the mass at infinite loss exceeds ``delta``).
    """
    return max(0.0, float(pld.get_epsilon_for_delta(delta)))


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


LOWER_TRUNCATION = 1e-15
"""Tail mass ``t`` that ``dp_accounting`` may cut when it self-composes an optimistic PLD.

Its FFT keeps a window outside which at most ``t`` of the composed mass lies; that mass wraps
into the window, and ``t`` more is put at ``+inf``. A delta read from the composed optimistic
PLD can therefore exceed the optimistic value by up to ``2 t``, which :func:`lower_epsilon`
takes off (:data:`LOWER_TRUNCATION` is scaled down with a small target delta)."""


def lower_epsilon(lower: PrivacyLossDistribution, *, count: int, delta: float) -> float:
    """Lower end of the epsilon of ``count`` compositions of a pair, from its optimistic PLD.

    ``lower`` rounds every loss down and drops what the enumeration left out, so each of its
    deltas, alone or composed, is at most the pair's (in exact arithmetic). Compositions add at
    most ``2 t`` (see :data:`LOWER_TRUNCATION`), so the epsilon returned is that of the composed
    optimistic PLD at ``delta + 2 t``: at most the pair's epsilon at ``delta``.

    Args:
        lower: Optimistic PLD of one round.
        count: Number of rounds (integer >= 1).
        delta: Target delta in ``(0, 1)``.

    Returns:
        The lower end, clamped at 0 (``inf`` when the mass at infinite loss, which the
        optimistic PLD keeps for genuinely infinite losses, exceeds ``delta``).

    Raises:
        ValueError: on an out-of-range argument.
    """
    count = check_int("count", count, minimum=1)
    delta = check_delta(delta)
    if count == 1:
        return max(0.0, float(lower.get_epsilon_for_delta(delta)))
    t = min(LOWER_TRUNCATION, 1e-3 * delta)
    composed = lower.self_compose(count, tail_mass_truncation=t)
    return max(0.0, float(composed.get_epsilon_for_delta(delta + 2.0 * t)))


def pld_results(
    base: PrivacyLossDistribution,
    *,
    mechanism: str,
    parameters: dict[str, object],
    steps: Sequence[int],
    delta: float,
    tail: float,
    lower: PrivacyLossDistribution | None = None,
    method: str = "pld",
    assumptions: Sequence[str] = (),
    extra: Mapping[str, object] | None = None,
) -> list[AccountingResult]:
    """Epsilon of ``count`` compositions of ``base`` for each count in ``steps``, as records.

    With ``lower`` (the optimistic PLD of the same pair), each record's ``epsilon_lower`` is
    :func:`lower_epsilon`, so the pair's exact epsilon lies in ``[epsilon_lower, epsilon]`` (up
    to floating-point rounding).

    Args:
        base: The pessimistic PLD of one round (its truncated mass ``tail`` at infinity).
        mechanism: Name for the records (``ldp-shuffle``, ``krr``, ...).
        parameters: The mechanism's parameters, in display order.
        steps: Round counts (integers >= 1).
        delta: Target delta in ``(0, 1)``.
        tail: The truncated mass per round that ``base`` holds at infinity.
        lower: The optimistic PLD of one round, or ``None`` for no lower end.
        method: The records' method name.
        assumptions: What the guarantee rests on, one sentence each.
        extra: Further facts for the JSON records (``tail`` is always included).

    Returns:
        One :class:`~shuffle_opacus.analysis.AccountingResult` (``kind="pld"``) per count.

    Raises:
        ValueError: on an out-of-range argument.
    """
    delta = check_delta(delta)
    counts = [check_int("steps", s, minimum=1) for s in steps]
    facts = {"tail": tail, **(extra or {})}
    results = []
    for count in counts:
        pld = base if count == 1 else base.self_compose(count)
        epsilon = max(0.0, float(pld.get_epsilon_for_delta(delta)))
        low = None if lower is None else lower_epsilon(lower, count=count, delta=delta)
        results.append(
            AccountingResult(
                mechanism=mechanism,
                method=method,
                epsilon=epsilon,
                delta=delta,
                steps=count,
                parameters=parameters,
                kind="pld",
                accounting=PLD_ACCOUNTING,
                neighbouring="replace-one user",
                epsilon_lower=low,
                extra=facts,
                assumptions=tuple(assumptions),
            )
        )
    return results
