"""Client-sampling protocols, the sensitivity convention, and accounting of a training history.

This module sits between the maths layer (:mod:`shuffle_opacus.analysis`) and the Opacus glue. It
does not import torch, so the CLI and the calibration helpers stay light.

Protocols (one per Opacus accountant):

====================  ======================  ======================  =========================
protocol              accountant name         who reports in a round  analysis (core mechanism)
====================  ======================  ======================  =========================
``full``              ``shuffle``             all ``n`` clients       Theorem 1 (``shuffle``)
``subsampled``        ``subsampled_shuffle``  ``m`` of ``n``, without  Theorem 2 (``subsampled``)
                                              replacement
``checkin``           ``shuffled_checkin``    each client with        Theorem 1 averaged over
                                              probability ``rate``    check-ins (``checkin``)
====================  ======================  ======================  =========================

Units. Opacus's ``noise_multiplier`` is the standard deviation of the noise each client adds
to its clipped update, divided by the clipping norm ``C``. The analysis needs sigma relative to
the L2 distance between the differing client's two possible reports. That distance is the
*sensitivity*, given here in units of ``C``:

* ``"replace-one"`` (the default, ``2.0``): neighbouring datasets replace one client's data by
  anything else, so two clipped updates can be ``2C`` apart and analysis
  ``sigma = noise_multiplier / 2``.
* ``"paper"`` (``1.0``): the convention of the MNIST experiment of Liew & Takahashi (§5.2),
  whose analysis treats the clipped update as lying in ``[0, C]`` with the differing client's
  reports ``C`` apart, so analysis ``sigma = noise_multiplier``. Use it to reproduce the paper.

Any positive float is also accepted. Whatever the convention, the guarantees are those of the
core analysis: replace-one adjacency of one client, the other clients' reports at a common
value (Theorem 1's pair), the forward Rényi divergence; see ``docs/maths.md``.
"""

from __future__ import annotations

import functools
import math
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from .analysis._validation import check_delta, check_int, check_positive, check_probability
from .analysis.accounting import per_step_rdp
from .analysis.conversion import EpsilonResult, OrderCapWarning, epsilon_from_rdp

__all__ = [
    "PROTOCOLS",
    "ACCOUNTANT_PROTOCOL",
    "DEFAULT_METHODS",
    "SENSITIVITIES",
    "HistoryEntry",
    "resolve_sensitivity",
    "protocol_sample_rate",
    "history_epsilon",
    "calibrate_noise_multiplier",
]

PROTOCOLS: tuple[str, ...] = ("full", "subsampled", "checkin")

ACCOUNTANT_PROTOCOL: dict[str, str] = {
    "shuffle": "full",
    "subsampled_shuffle": "subsampled",
    "shuffled_checkin": "checkin",
}

_CORE_MECHANISM: dict[str, str] = {
    "full": "shuffle",
    "subsampled": "subsampled",
    "checkin": "checkin",
}

#: Methods of the core analysis per protocol; the first entry is the default and the tightest.
DEFAULT_METHODS: dict[str, tuple[str, ...]] = {
    "full": ("theorem1", "corollary1"),
    "subsampled": ("theorem2",),
    "checkin": ("exact", "sum", "theorem3"),
}

#: Named sensitivity conventions, in units of the clipping norm C.
SENSITIVITIES: dict[str, float] = {"replace-one": 2.0, "paper": 1.0}

#: One entry of an accountant's history: (noise_multiplier, sample_rate, steps), as in Opacus.
HistoryEntry = tuple[float, float, int]


def resolve_sensitivity(value: float | str) -> float:
    """Return the sensitivity in units of the clipping norm.

    Args:
        value: ``"replace-one"`` (2.0), ``"paper"`` (1.0) or a finite number > 0.

    Returns:
        The sensitivity as a float.

    Raises:
        ValueError: for an unknown name or a non-positive number.
    """
    if isinstance(value, str):
        if value not in SENSITIVITIES:
            names = ", ".join(repr(k) for k in SENSITIVITIES)
            raise ValueError(
                f"sensitivity must be one of {names} or a number > 0 (in units of the "
                f"clipping norm). Found {value!r}."
            )
        return SENSITIVITIES[value]
    return check_positive("sensitivity", value)


def check_protocol(protocol: str) -> str:
    """Return ``protocol`` if it is one of :data:`PROTOCOLS`.

    Raises:
        ValueError: otherwise.
    """
    if protocol not in PROTOCOLS:
        raise ValueError(f"protocol must be one of {', '.join(PROTOCOLS)}. Found {protocol!r}.")
    return protocol


def check_method(protocol: str, method: str | None) -> str:
    """Return ``method`` (or the protocol's default) if the protocol supports it.

    Raises:
        ValueError: for a method the protocol's analysis does not offer.
    """
    allowed = DEFAULT_METHODS[check_protocol(protocol)]
    if method is None:
        return allowed[0]
    if method not in allowed:
        raise ValueError(
            f"method must be one of {', '.join(allowed)} for the {protocol} protocol. "
            f"Found {method!r}."
        )
    return method


def protocol_sample_rate(
    protocol: str,
    *,
    population: int,
    rate: float | None = None,
    sample_size: int | None = None,
) -> float:
    """Return the per-round inclusion probability of one client under ``protocol``.

    Args:
        protocol: One of :data:`PROTOCOLS`.
        population: Number of clients ``n`` (integer >= 1).
        rate: Check-in probability (``checkin`` only), in ``(0, 1]``.
        sample_size: Clients per round ``m`` (``subsampled`` only), in ``[1, n]``.

    Returns:
        1 for ``full``, ``m / n`` for ``subsampled``, ``rate`` for ``checkin``.

    Raises:
        ValueError: on a missing, extraneous or out-of-range parameter.
    """
    check_protocol(protocol)
    population = check_int("population", population, minimum=1)
    if protocol == "checkin":
        if sample_size is not None:
            raise ValueError(
                f"sample_size is not a parameter of the checkin protocol (use rate). "
                f"Found {sample_size!r}."
            )
        if rate is None:
            raise ValueError("rate is required for the checkin protocol; it must be in (0, 1].")
        return check_probability("rate", rate)
    if rate is not None:
        raise ValueError(f"rate is not a parameter of the {protocol} protocol. Found {rate!r}.")
    if protocol == "subsampled":
        if sample_size is None:
            raise ValueError(
                f"sample_size is required for the subsampled protocol; it must be an integer "
                f"in [1, {population}]."
            )
        m = check_int("sample_size", sample_size, minimum=1, maximum=population)
        return m / population
    if sample_size is not None and sample_size != population:
        raise ValueError(
            f"sample_size of the full protocol must equal population ({population}). "
            f"Found {sample_size!r}."
        )
    return 1.0


@functools.lru_cache(maxsize=128)
def _cached_step_rdp(
    mechanism: str, population: int, sigma: float, rate: float | None, m: int | None,
    method: str, max_order: int,
) -> np.ndarray:  # fmt: skip
    """Per-round RDP at orders ``2..max_order`` (read-only; cached across ``get_epsilon`` calls)."""
    kwargs: dict[str, object] = {"sigma": sigma, "n": population, "method": method}
    if rate is not None:
        kwargs["rate"] = rate
    if m is not None:
        kwargs["m"] = m
    out = np.asarray(per_step_rdp(mechanism, **kwargs)(np.arange(2, max_order + 1)), dtype=float)
    out.setflags(write=False)
    return out


def _entry_rdp(
    protocol: str,
    entry: HistoryEntry,
    *,
    population: int,
    sensitivity: float,
    method: str,
) -> Callable[[np.ndarray], np.ndarray]:
    noise_multiplier, sample_rate, steps = entry
    sigma = check_positive("noise_multiplier", noise_multiplier) / sensitivity
    mechanism = _CORE_MECHANISM[protocol]
    rate: float | None = None
    m: int | None = None
    if protocol == "full":
        if sample_rate != 1.0:
            raise ValueError(
                f"sample_rate of the full protocol (shuffle accountant) must be 1. "
                f"Found {sample_rate!r}."
            )
    elif protocol == "subsampled":
        q = check_probability("sample_rate", sample_rate)
        m = round(q * population)
        if m < 1 or abs(m - q * population) > 1e-6 * max(1.0, q * population):
            raise ValueError(
                f"sample_rate of the subsampled protocol must be m / population for an integer "
                f"m in [1, {population}]. Found {sample_rate!r}."
            )
    else:
        rate = check_probability("sample_rate", sample_rate)
    # Validate the whole setting now rather than inside the order search.
    per_step_rdp(mechanism, sigma=sigma, n=population, m=m, rate=rate, method=method)
    steps = check_int("steps", steps, minimum=0)

    def total(orders: np.ndarray) -> np.ndarray:
        orders = np.asarray(orders, dtype=np.int64)
        table = _cached_step_rdp(
            mechanism, population, sigma, rate, m, method, max(2, int(orders.max()))
        )
        return steps * table[orders - 2]

    return total


@dataclass(frozen=True)
class _Setting:
    protocol: str
    population: int
    sensitivity: float
    method: str


def history_epsilon(
    history: Sequence[HistoryEntry],
    *,
    protocol: str,
    delta: float,
    population: int,
    sensitivity: float | str = "replace-one",
    method: str | None = None,
    max_order: int | None = None,
) -> EpsilonResult:
    """Epsilon of a whole training history: RDP of every round summed, then Lemma 2.

    Rounds with different noise multipliers or rates compose by adding their RDP curves at each
    order (RDP composition), so a history with several entries is handled exactly like Opacus's
    RDP accountant does.

    Args:
        history: ``(noise_multiplier, sample_rate, steps)`` entries as kept by Opacus accountants.
            ``noise_multiplier`` is the *local* noise of one client relative to the clipping norm.
        protocol: One of :data:`PROTOCOLS`.
        delta: Target delta in ``(0, 1)``.
        population: Number of clients ``n``.
        sensitivity: See :func:`resolve_sensitivity`.
        method: Core method (see :data:`DEFAULT_METHODS`); the tightest by default.
        max_order: Optional cap on the Rényi order.

    Returns:
        An :class:`~shuffle_opacus.analysis.EpsilonResult`; epsilon is 0 for an empty history
        (with order 0).

    Raises:
        ValueError: on an invalid argument or history entry.
    """
    setting = _Setting(
        protocol=check_protocol(protocol),
        population=check_int("population", population, minimum=1),
        sensitivity=resolve_sensitivity(sensitivity),
        method=check_method(protocol, method),
    )
    delta = check_delta(delta)
    if max_order is not None:
        max_order = check_int("max_order", max_order, minimum=2)
    parts = [
        _entry_rdp(
            setting.protocol,
            entry,
            population=setting.population,
            sensitivity=setting.sensitivity,
            method=setting.method,
        )
        for entry in history
        if check_int("steps", entry[2], minimum=0) > 0
    ]
    if not parts:
        return EpsilonResult(epsilon=0.0, delta=delta, order=0, max_order=0, at_cap=False)

    def total(orders: np.ndarray) -> np.ndarray:
        out = parts[0](orders)
        for part in parts[1:]:
            out = out + part(orders)
        return out

    return epsilon_from_rdp(total, delta=delta, max_order=max_order)


def calibrate_noise_multiplier(
    *,
    target_epsilon: float,
    delta: float,
    population: int,
    rounds: int,
    protocol: str = "checkin",
    rate: float | None = None,
    sample_size: int | None = None,
    sensitivity: float | str = "replace-one",
    method: str | None = None,
    rel_tol: float = 1e-3,
    max_noise_multiplier: float = 1e4,
) -> float:
    """Smallest local noise multiplier (to ``rel_tol``) whose epsilon after ``rounds`` is <= target.

    A bisection on ``log(noise_multiplier)``. The value returned is always one at which epsilon
    was evaluated and found ``<= target_epsilon``, so the result never overshoots the target,
    whatever the shape of epsilon as a function of the noise.

    Args:
        target_epsilon: Privacy budget epsilon (> 0).
        delta: Target delta in ``(0, 1)``.
        population: Number of clients ``n``.
        rounds: Number of training rounds (integer >= 1).
        protocol: One of :data:`PROTOCOLS`.
        rate: Check-in probability (``checkin``).
        sample_size: Clients per round (``subsampled``).
        sensitivity: See :func:`resolve_sensitivity`.
        method: Core method; the tightest by default.
        rel_tol: Relative width of the final bracket (in ``(0, 1)``).
        max_noise_multiplier: Largest noise multiplier tried before giving up.

    Returns:
        The local noise multiplier (noise std of one client divided by the clipping norm).

    Raises:
        ValueError: on invalid arguments, or when even ``max_noise_multiplier`` does not reach
            the target.
    """
    target_epsilon = check_positive("target_epsilon", target_epsilon)
    delta = check_delta(delta)
    rounds = check_int("rounds", rounds, minimum=1)
    check_protocol(protocol)
    population = check_int("population", population, minimum=1)
    sample_rate = protocol_sample_rate(
        protocol, population=population, rate=rate, sample_size=sample_size
    )
    sens = resolve_sensitivity(sensitivity)
    method = check_method(protocol, method)
    rel_tol = check_positive("rel_tol", rel_tol)
    if rel_tol >= 1.0:
        raise ValueError(f"rel_tol must be in (0, 1). Found {rel_tol!r}.")
    max_noise_multiplier = check_positive("max_noise_multiplier", max_noise_multiplier)

    def eps(noise_multiplier: float) -> float:
        with warnings.catch_warnings():
            # An optimum at the order cap still gives a valid (looser) upper bound.
            warnings.simplefilter("ignore", OrderCapWarning)
            return history_epsilon(
                [(noise_multiplier, sample_rate, rounds)],
                protocol=protocol,
                delta=delta,
                population=population,
                sensitivity=sens,
                method=method,
            ).epsilon

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
