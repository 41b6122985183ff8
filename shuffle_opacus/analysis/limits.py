"""Cost estimates and work limits of the accounting entry points.

Several parameters make the work of an accounting grow without bound (the Rényi order cap, the
number of users of the enumerating methods, the rounds composed, the distinct round counts).
This module estimates the cost of a request from the measured unit costs of :mod:`.costs`
*before* the work starts, so that a front end can refuse it with a :class:`WorkLimitError`
naming the parameter and its largest acceptable value (:func:`largest_within`).
:func:`check_budget` refuses a whole request up front (``account`` and the command line, within
:data:`CLI_MAX_SECONDS` or :data:`API_MAX_SECONDS`); :func:`work_budget` opens a budget that
:func:`charge` draws on while the work runs, so that each stage of the automatic growth of the
Rényi order range is charged before it is computed. Independently of any budget, Rényi orders
are capped at :data:`MAX_ORDER` everywhere (:func:`~shuffle_opacus.common.validation.check_orders`).
Memory has its own limit (:data:`MAX_MEMORY_BYTES`, changed by :func:`memory_limit`): the large
allocations of the privacy loss distributions (a lattice's convolution, a composition's FFT)
estimate their bytes first and call :func:`check_memory`, which raises a
:class:`MemoryLimitError` (a :class:`PldRangeError`: the default method falls back to the Rényi
bound with a note) instead of letting the process be killed.

The limits, the cost model and its measurements: docs/maths.md, "Work limits".
"""

from __future__ import annotations

import contextlib
import contextvars
import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

from ..common.validation import MAX_ORDER
from .costs import (
    _AUTO_START,
    account_seconds,
    calibrate_seconds,
    calibration_drivers,
    mechanism_record,
    rdp_stage_seconds,
    shuffle_pld_seconds,
)
from .memory import (
    MAX_MEMORY_BYTES,
    MemoryLimitError,
    PldRangeError,
    check_memory,
    memory_budget,
    memory_limit,
)
from .records import Mechanism

__all__ = [
    "MAX_ORDER",
    "CLI_MAX_SECONDS",
    "API_MAX_SECONDS",
    "WorkLimitError",
    "PldRangeError",
    "rdp_stage_seconds",
    "account_seconds",
    "calibrate_seconds",
    "check_budget",
    "largest_within",
    "work_budget",
    "charge",
    "check_calibrate_budget",
    "observe",
    "report_progress",
    "remaining_budget",
    "shuffle_pld_seconds",
    "MAX_MEMORY_BYTES",
    "MemoryLimitError",
    "memory_limit",
    "memory_budget",
    "check_memory",
]

CLI_MAX_SECONDS = 60.0
"""Largest estimated cost the ``shuffle-opacus`` command accepts."""

API_MAX_SECONDS = 600.0
"""Largest estimated cost :func:`~shuffle_opacus.analysis.account` accepts by default."""


class WorkLimitError(ValueError):
    """A request whose estimated cost exceeds the budget (a one-line ``ValueError``)."""


def largest_within(cost: Callable[[int], float], low: int, high: int, budget: float) -> int | None:
    """Return the largest ``x`` in ``[low, high]`` with ``cost(x) <= budget`` (monotone ``cost``).

    Returns:
        The value, or ``None`` when even ``cost(low)`` exceeds the budget.
    """
    if cost(low) > budget:
        return None
    if cost(high) <= budget:
        return high
    lo, hi = low, high  # cost(lo) <= budget < cost(hi)
    while hi - lo > 1:
        mid = (lo + hi) // 2 if hi - lo < 64 else int(math.isqrt(lo * hi)) or (lo + hi) // 2
        mid = min(max(mid, lo + 1), hi - 1)
        if cost(mid) <= budget:
            lo = mid
        else:
            hi = mid
    return lo


def check_budget(
    mechanism: Mechanism,
    values: Mapping[str, object],
    *,
    steps: list[int],
    method: str | None,
    max_order: int | None,
    budget: float,
) -> float:
    """Refuse a request whose estimated cost exceeds ``budget`` seconds.

    The refusal names the first of the record's :attr:`~.records.Mechanism.drivers` whose
    lowering brings the estimate within the budget.

    Args:
        mechanism: The record of a mechanism of
            :data:`~shuffle_opacus.analysis.MECHANISM_TABLE`.
        values: Its parameters by name (validated).
        steps: The round counts (validated).
        method: The method, or ``None``.
        max_order: The order cap, or ``None``.
        budget: Seconds allowed.

    Returns:
        The estimate in seconds.

    Raises:
        TypeError: for a ``mechanism`` that is not a record.
        WorkLimitError: naming the parameter to lower and its largest acceptable value, with
            the estimate.
    """
    entry = mechanism_record(mechanism)
    full = dict(values)
    full["max_order"] = max_order
    full["steps"] = list(steps)

    def cost(changes: Mapping[str, object]) -> float:
        trial = {**full, **changes}
        return account_seconds(
            entry,
            trial,
            steps=trial["steps"],  # type: ignore[arg-type]
            method=method,
            max_order=trial["max_order"],  # type: ignore[arg-type]
        )

    total = cost({})
    if total <= budget:
        return total
    label = _label(entry.name, method, values)
    for driver in entry.drivers:
        current = full.get(driver.name)
        if current is None:
            continue
        trial: Callable[[int], float]
        if driver.name == "steps":
            counts = list(full["steps"])  # type: ignore[call-overload]

            def capped_steps(x: int, counts: list[int] = counts) -> float:
                return cost({"steps": [min(s, x) for s in counts]})

            trial, top = capped_steps, max(counts)
        else:
            top = int(current)  # type: ignore[call-overload]

            def lowered(x: int, name: str = driver.name) -> float:
                return cost({name: x})

            trial = lowered

        best = largest_within(trial, driver.minimum, top, budget)
        if best is None or best >= top:
            continue
        raise WorkLimitError(
            f"{driver.name} must be <= {best} for {label} (estimated {_seconds(total)}, "
            f"limit {budget:g} s)."
        )
    names = ", ".join(d.name for d in entry.drivers)
    raise WorkLimitError(
        f"{label} is estimated at {_seconds(total)}, over the {budget:g} s limit; lower {names}."
    )


def _seconds(value: float) -> str:
    return f"{value:.3g} s" if value < 1e6 else f"{value:.2e} s"


def _label(mechanism: str, method: str | None, values: Mapping[str, object]) -> str:
    shown = ", ".join(
        f"{k}={v}" for k, v in values.items() if v is not None and k in ("eps0", "sigma", "rate")
    )
    text = mechanism + (f" --method {method}" if method else "")
    return f"{text} at {shown}" if shown else text


# --- running budgets --------------------------------------------------------------------------


@dataclass
class _Budget:
    limit: float
    spent: float = 0.0


_ACTIVE: contextvars.ContextVar[_Budget | None] = contextvars.ContextVar(
    "shuffle_opacus_work_budget", default=None
)


@contextlib.contextmanager
def work_budget(seconds: float | None) -> Iterator[None]:
    """Open a budget of estimated seconds that :func:`charge` draws on (``None``: no budget).

    A budget opened inside another one is the smaller of the two (the outer one keeps its
    spending).
    """
    if seconds is None:
        yield
        return
    outer = _ACTIVE.get()
    limit = float(seconds) if outer is None else min(float(seconds), outer.limit - outer.spent)
    token = _ACTIVE.set(_Budget(limit))
    try:
        yield
    finally:
        inner = _ACTIVE.get()
        _ACTIVE.reset(token)
        if outer is not None and inner is not None:
            outer.spent += inner.spent


def remaining_budget() -> float | None:
    """Seconds left in the active budget (:func:`work_budget`), or ``None`` without one."""
    budget = _ACTIVE.get()
    return None if budget is None else budget.limit - budget.spent


def charge(seconds: float, refuse: Callable[[float, float], str]) -> None:
    """Spend ``seconds`` of the active budget, or refuse before the work starts.

    Args:
        seconds: Estimated cost of the work about to start.
        refuse: ``(remaining, seconds) -> message`` of the refusal.

    Raises:
        WorkLimitError: when the active budget cannot cover ``seconds``.
    """
    budget = _ACTIVE.get()
    if budget is None:
        return
    remaining = budget.limit - budget.spent
    if seconds > remaining:
        raise WorkLimitError(refuse(remaining, seconds))
    budget.spent += seconds


def check_calibrate_budget(
    *,
    mechanism: Mechanism,
    method: str,
    n: int,
    m: int | None,
    rate: float | None,
    rounds: int,
    budget: float,
) -> float:
    """Refuse a noise calibration whose estimated cost exceeds ``budget`` seconds.

    The estimate (:func:`calibrate_seconds`) assumes the first stage of the automatic order
    range; later stages are charged while the calibration runs (:func:`charge`).

    Args:
        mechanism: The record of the protocol's analysis mechanism.
        method: Its method.
        n: Population (validated).
        m: Users per round, or ``None``.
        rate: Check-in rate, or ``None``.
        rounds: Rounds composed (validated).
        budget: Seconds allowed.

    Returns:
        The estimate in seconds.

    Raises:
        TypeError: for a ``mechanism`` that is not a record.
        WorkLimitError: naming ``n`` or ``rounds`` (the method's
            :attr:`~.records.Cost.calibration_drivers`) and its largest acceptable value.
    """
    entry = mechanism_record(mechanism)
    drivers = calibration_drivers(entry, method)

    def cost(n_: int, rounds_: int) -> float:
        return calibrate_seconds(
            mechanism=entry,
            method=method,
            n=n_,
            m=None if m is None else min(m, n_),
            rate=rate,
            rounds=rounds_,
            order=_AUTO_START,
        )

    total = cost(n, rounds)
    if total <= budget:
        return total
    for name in drivers:
        if name == "n":
            best = largest_within(lambda x: cost(x, rounds), max(m or 1, 1), n, budget)
            top = n
        else:
            best = largest_within(lambda x: cost(n, x), 1, rounds, budget)
            top = rounds
        if best is not None and best < top:
            raise WorkLimitError(
                f"{name} must be <= {best} for calibrate {entry.name} --method {method} "
                f"(estimated {_seconds(total)}, limit {budget:g} s)."
            )
    raise WorkLimitError(
        f"calibrate {entry.name} --method {method} is estimated at {_seconds(total)}, over the "
        f"{budget:g} s limit; lower {' or '.join(drivers)}."
    )


# --- progress ---------------------------------------------------------------------------------

_OBSERVER: contextvars.ContextVar[Callable[[str], None] | None] = contextvars.ContextVar(
    "shuffle_opacus_progress", default=None
)


@contextlib.contextmanager
def observe(callback: Callable[[str], None] | None) -> Iterator[None]:
    """Send the progress reports of the work run inside the block to ``callback``.

    Args:
        callback: Called with a short description of each stage as it starts (an order range,
            a calibration step); ``None`` leaves reports unobserved.
    """
    token = _OBSERVER.set(callback)
    try:
        yield
    finally:
        _OBSERVER.reset(token)


def report_progress(text: str) -> None:
    """Tell the active observer (:func:`observe`) that a stage described by ``text`` starts."""
    callback = _OBSERVER.get()
    if callback is not None:
        callback(text)
