"""Cost estimates and work limits of the accounting entry points.

Several parameters make the work of an accounting grow without bound: the Rényi order cap
(the series of Theorem 1 cost ``O(L^2)`` per order range, ``O(L^2 log n)`` below ``n < L``),
the number of users of the enumerating methods (``ldp-shuffle``, ``krr``, ``clones``, the ``pld``
lattice), the number of rounds composed by a privacy loss distribution or by the optimal
composition theorem, and the number of distinct round counts. This module estimates the cost
of a request from measured per-unit timings *before* the work starts, so that a front end can
refuse it with a message naming the parameter and its largest acceptable value.

The unit costs below were measured with ``python benchmarks/limits.py`` on one core of the
project's machine (AMD EPYC, numpy single-threaded); they are rounded up, so estimates are
conservative (typically 1-3 times the measured time). ``docs/maths.md`` ("Work limits") lists
the measurements and the limits they give.

Two layers use the estimates:

* :func:`check_budget` refuses a whole request up front (``account`` and the command line);
* :func:`work_budget` opens a budget that :func:`charge` draws on while the work runs. The
  automatic growth of the Rényi order range (64, 128, ... 4096) charges each stage before
  computing it, so a range that would outgrow the budget is refused before the expensive stage
  starts, not after it.

Independently of any budget, Rényi orders are capped at :data:`MAX_ORDER` everywhere
(:func:`~shuffle_opacus.analysis._validation.check_orders`).
"""

from __future__ import annotations

import contextlib
import contextvars
import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

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
]

MAX_ORDER = 1 << 15
"""Largest Rényi order any function of the package evaluates (32768). Theorem 1 at this order
takes about 40 s for ``n >= L``; beyond it the ``O(L^2)`` series and their work arrays grow
without bound while the conversion gains nothing measurable (Lemma 2's floor at ``L = 32768``
and ``delta = 1e-5`` is 3.5e-6)."""

CLI_MAX_SECONDS = 60.0
"""Largest estimated cost the ``shuffle-opacus`` command accepts."""

API_MAX_SECONDS = 600.0
"""Largest estimated cost :func:`~shuffle_opacus.analysis.account` accepts by default."""

# --- measured unit costs (seconds, one core, rounded up) -------------------------------------

#: One element of an ``O(L^2)`` series operation: a step of the Miller recurrence or of a
#: binomial (EGF) convolution. Measured: Miller at L = 4096 (16.8e6 elements) 0.61 s, one EGF
#: convolution 0.34 s, binary exponentiation at n = 600, L = 2048 (1.5e8 elements) 5.3 s.
SERIES_SECONDS = 4e-8
#: One enumerated outcome of an ldp-shuffle pair: n = 1e6, eps0 = 0.5 (5e7 outcomes) 4.6 s;
#: n = 1e6, eps0 = 4 (1.1e7) 1.45 s. Counted for the stronger pair, which has the most outcomes.
LDP_OUTCOME_SECONDS = 1.5e-7
#: One enumerated outcome of k-RR, strong adversary (n = 1e7, k = 4, gamma = 0.25: 1.4e8
#: outcomes, 32 s) and weak adversary (n = 1e4: 9.5e7 outcomes, 7.9 s).
KRR_STRONG_OUTCOME_SECONDS = 2.5e-7
KRR_WEAK_OUTCOME_SECONDS = 1e-7
#: One value of ``C`` in one evaluation of the clones divergence (n = 1e8, eps0 = 1: 7.9e4
#: values, 44 evaluations, 27 s).
CLONES_C_SECONDS = 8e-6
#: One value of ``C`` in the Gaussian clones scan (n = 1e5, sigma = 1: 0.25 s).
CLONES_GAUSSIAN_C_SECONDS = 5e-4
#: One round of the optimal composition theorem, per evaluation point (k = 1e6: 4.0 s, 1e7:
#: 45 s per call).
KOV_ROUND_SECONDS = 4.5e-6
#: Self-composition of a PLD over k rounds: about ``PLD_COMPOSE_SECONDS * sqrt(k)`` (shuffle
#: Gaussian, k = 1e6: 21 s; ldp-shuffle, k = 1e6: 9.7 s).
PLD_COMPOSE_SECONDS = 0.025
#: The lattice of the shuffle Gaussian PLD: about ``PLD_LATTICE_SECONDS sqrt(n) / min(sigma,
#: 1)^2`` plus 0.2 s (n = 60000: 0.9 s; n = 1e9: 20 s; check-in n = 1e6, sigma = 0.5: 6.4 s).
PLD_LATTICE_SECONDS = 1.2e-3
#: Fixed cost of a request (imports are not counted).
BASE_SECONDS = 0.05

#: Normal quantile of the tail masses the enumerations leave out (about 1e-13 per side).
_Z_TAIL = 7.5
#: Orders the automatic range visits (``epsilon_from_rdp``'s defaults).
_AUTO_START, _AUTO_LIMIT = 64, 4096


class WorkLimitError(ValueError):
    """A request whose estimated cost exceeds the budget (a one-line ``ValueError``)."""


class PldRangeError(ValueError):
    """A valid setting the shuffle Gaussian's ``pld`` engines cannot evaluate.

    Raised for an analysis sigma below the method's floor, or one so small that the lattice or
    the loss grid would exceed its size limit; a Rényi-DP method still bounds such a setting.
    """


# --- Rényi-DP methods --------------------------------------------------------------------------


def _series_elements(users: int, order: int) -> float:
    """Series elements of ``shuffle_log_excess`` for one population at orders ``0..order``."""
    if users >= order:
        return float(order) ** 2  # Miller recurrence
    products = (users.bit_length() - 1) + (bin(users).count("1") - 1)
    return 3.0 * products * float(order) ** 2  # binary exponentiation, 3 convolutions each


def _sum_elements(n: int, rate: float, order: int) -> float:
    """Series elements of the check-in ``sum`` bound (first pass of its bulk and tails)."""
    mean = n * rate
    sd = math.sqrt(max(n * rate * (1.0 - rate), 1e-300))
    lo = max(1, int(math.floor(mean - 6.0 * sd)))
    hi = min(n, int(math.ceil(mean + 6.0 * sd)))
    width = hi - lo + 1
    step = max(1, math.ceil(width * (order + 1) ** 2 / 1.0e8))
    starts = math.ceil(width / step)
    chunks = 0
    b = lo
    while b > 1:  # _lower_chunks: geometric above the order, one chunk below
        a = max(1, min(b - 1, int(math.floor(b * 0.9))))
        if a < order:
            a = 1
        chunks += 1
        b = a
    square = float(order) ** 2
    rows = starts + chunks + 1
    small = [k for k in (lo, lo + step) if k < order]
    sequential = 2.0 * max(small) * square if small else 0.0
    # Two passes of the bulk (the bulk is widened once when its tails are too heavy).
    return 2.0 * (rows * square + sequential + (starts + chunks) * square)


def rdp_stage_seconds(
    mechanism: str,
    method: str,
    order: int,
    *,
    n: int | None = None,
    m: int | None = None,
    rate: float | None = None,
) -> float:
    """Estimated seconds to evaluate one round's RDP of a method at orders ``2..order``.

    Args:
        mechanism: A Rényi-DP mechanism (``shuffle``, ``subsampled``, ``checkin``, ``gaussian``,
            ``subsampled-gaussian``).
        method: Its method, or a reference curve (``no-shuffle``, ``central``).
        order: Largest order ``L``.
        n: Population.
        m: Users per round (``subsampled``).
        rate: Check-in or Poisson rate.

    Returns:
        The estimate in seconds.
    """
    square = float(order) ** 2
    if method in ("corollary1", "rdp", "no-shuffle", "central") and mechanism in (
        "shuffle",
        "gaussian",
    ):
        elements = 10.0 * order
    elif mechanism == "subsampled-gaussian" or method in ("no-shuffle", "central"):
        elements = square  # one mixture / Wang convolution
    elif method == "theorem1":
        elements = _series_elements(int(n or 1), order)
    elif method == "exact":
        elements = _series_elements(int(n or 1), order)
    elif method == "theorem2":
        elements = _series_elements(int(m or 1), order) + square
    elif method == "theorem3":
        big = min(int(n or 1), int(0.5 * int(n or 1) * float(rate or 1.0)) + 1)
        elements = _series_elements(big, order) + 2.0 * square
    elif method == "sum":
        elements = _sum_elements(int(n or 1), float(rate or 1.0), order)
    else:
        elements = square
    return elements * SERIES_SECONDS


# --- privacy loss distributions, clones ---------------------------------------------------------


def _pld_compose_seconds(steps: list[int]) -> float:
    return sum(PLD_COMPOSE_SECONDS * math.sqrt(k) for k in set(steps) if k > 1)


def _ldp_outcomes(n: int, eps0: float) -> float:
    """Outcomes of the Lemma 11 enumeration of an ldp-shuffle pair (Hoeffding widths).

    Counted with the stronger pair's clone probability ``2 / (e^eps0 + 1)``, above the clones
    pair's ``e^-eps0``: an over-estimate for the default pair.
    """
    log_tail = math.log(4.0 / 1e-12)
    p2 = 2.0 / (math.exp(min(eps0, 700.0)) + 1.0)
    c_width = min(float(n), math.sqrt(2.0 * max(n - 1, 1) * log_tail) + 1.0)
    mean_c = p2 * max(n - 1, 0)
    a_width = min(mean_c + 2.0, math.sqrt(2.0 * max(mean_c, 1.0) * log_tail)) + 2.0
    return c_width * a_width


def _krr_outcomes(n: int, k: int, gamma: float, adversary: str) -> tuple[float, float]:
    """Outcomes of the k-RR enumeration and their unit cost (normal-quantile widths)."""
    if adversary == "weak":
        b_mean = gamma * max(n - 1, 0)
        b_width = min(float(n), 2.0 * _Z_TAIL * math.sqrt(b_mean * (1.0 - gamma)) + 1.0)
        side = min(b_mean + 2.0, 2.0 * _Z_TAIL * math.sqrt(b_mean / k) + 2.0) + 1.0
        return b_width * side * side, KRR_WEAK_OUTCOME_SECONDS
    mean = gamma / k * max(n - 1, 0)
    side = min(float(n) + 1.0, 2.0 * _Z_TAIL * math.sqrt(mean) + mean / 1e6 + 2.0)
    return side * side, KRR_STRONG_OUTCOME_SECONDS


def _clones_values(n: int, p: float) -> float:
    """Values of ``C ~ Bin(n - 1, p)`` in the bulk the clones method evaluates (tail 1e-16)."""
    return min(float(n), 2.0 * 8.3 * math.sqrt(max(n - 1, 1) * p * (1.0 - p)) + 1.0)


def _shuffle_pld_seconds(n: int, sigma: float) -> float:
    return 0.2 + PLD_LATTICE_SECONDS * math.sqrt(n) / min(sigma, 1.0) ** 2


def shuffle_pld_seconds(settings: list[tuple[int, float]], steps: int) -> float:
    """Estimated seconds of the shuffle Gaussian's ``pld`` for distinct round settings.

    Args:
        settings: ``(reports per round, sigma)`` of each distinct setting.
        steps: Rounds composed in all.

    Returns:
        The estimate (one pair per setting, then the composition).
    """
    pairs = sum(_shuffle_pld_seconds(users, sigma) for users, sigma in settings)
    return BASE_SECONDS + pairs + _pld_compose_seconds([steps])


def account_seconds(
    mechanism: str,
    values: Mapping[str, object],
    *,
    steps: list[int],
    method: str | None,
    max_order: int | None,
) -> float:
    """Estimated seconds of :func:`~shuffle_opacus.analysis.account` for one request.

    For Rényi-DP methods without ``max_order`` the estimate is that of the first stage of the
    automatic order range (the later stages are charged as they start, see :func:`charge`).

    Args:
        mechanism: A mechanism of :data:`~shuffle_opacus.analysis.CATALOGUE`.
        values: Its parameters by name (``None`` for absent ones).
        steps: The round counts.
        method: The method (``None`` for the default).
        max_order: The order cap, or ``None``.

    Returns:
        The estimate in seconds.
    """
    n = int(values.get("n") or 1)  # type: ignore[call-overload]
    m = values.get("m")
    rate = values.get("rate")
    sigma = values.get("sigma")
    distinct = len(set(steps))
    total = BASE_SECONDS + 1e-4 * distinct
    if mechanism == "ldp-shuffle":
        eps0 = float(values["eps0"])  # type: ignore[arg-type]
        users = int(m) if m is not None else n  # type: ignore[call-overload]
        total += _ldp_outcomes(users, eps0) * LDP_OUTCOME_SECONDS * (2.0 if m else 1.0)
        # The records' lower end composes one more PMF (the optimistic remove direction).
        return total + 1.5 * _pld_compose_seconds(steps)
    if mechanism == "krr":
        outcomes, unit = _krr_outcomes(
            n,
            int(values["k"]),  # type: ignore[call-overload]
            float(values["gamma"]),  # type: ignore[arg-type]
            str(values.get("adversary") or "strong"),
        )
        return total + outcomes * unit + 1.5 * _pld_compose_seconds(steps)
    if mechanism in ("clones", "clones-gaussian"):
        several = max(steps) > 1
        points = 24 if several else 1
        if mechanism == "clones":
            eps0 = float(values["eps0"])  # type: ignore[arg-type]
            p = math.exp(-min(eps0, 700.0))
            evaluations = 2.0 * max(1.0, math.log2(max(eps0, 1e-6) / 1e-6)) + 4.0
            one = _clones_values(n, p) * evaluations * CLONES_C_SECONDS
            one *= 2.0 if not several else 1.0  # the certified lower end
        else:
            one = _clones_values(n, 0.5) * CLONES_GAUSSIAN_C_SECONDS
        if method == "closed-form":
            one = 1e-3
        composition = sum(points * KOV_ROUND_SECONDS * k for k in set(steps) if k > 1)
        return total + points * one + composition
    fallback = {"shuffle": "theorem1", "subsampled": "theorem2", "checkin": "exact"}.get(mechanism)
    order = max_order if max_order is not None else _AUTO_START

    def rdp(name: str) -> float:
        return total + rdp_stage_seconds(
            mechanism,
            name,
            order,
            n=n,
            m=int(m) if m is not None else None,  # type: ignore[call-overload]
            rate=float(rate) if rate is not None else None,  # type: ignore[arg-type]
        )

    if fallback is None:
        return rdp(method or "rdp")
    users = int(m) if m is not None else n  # type: ignore[call-overload]
    pld = total + _shuffle_pld_seconds(users, float(sigma)) + _pld_compose_seconds(steps)  # type: ignore[arg-type]
    if method == "pld":
        return pld
    if method is not None:
        return rdp(method)
    # The default: pld where affordable, else its Rényi fallback (an order cap selects it).
    if max_order is not None or float(sigma) < 0.05:  # type: ignore[arg-type]
        return rdp(fallback)
    return min(pld, rdp(fallback))


def _calibrate_drivers(method: str) -> tuple[str, ...]:
    """Return the calibration parameters that drive its cost, in the order to suggest them."""
    return ("n", "rounds") if method == "pld" else ("n",)


def calibrate_seconds(
    *,
    mechanism: str,
    method: str,
    n: int,
    m: int | None,
    rate: float | None,
    rounds: int,
    order: int,
) -> float:
    """Estimated seconds of a noise calibration (about 16 evaluations of epsilon).

    Args:
        mechanism: The protocol's analysis mechanism.
        method: Its method.
        n: Population.
        m: Users per round, or ``None``.
        rate: Check-in rate, or ``None``.
        rounds: Rounds composed.
        order: The Rényi order range the evaluations are expected to need.

    Returns:
        The estimate in seconds.
    """
    # A bisection to 0.1% takes about 10 steps after 2 to 5 to bracket the target.
    evaluations = 16.0
    if method == "pld":
        users = m if m is not None else n
        one = _shuffle_pld_seconds(users, 0.5) + _pld_compose_seconds([rounds])
        return BASE_SECONDS + evaluations * one
    stage = rdp_stage_seconds(mechanism, method, order, n=n, m=m, rate=rate)
    # The order range grows by doubling; its stages cost about 4/3 of the last one.
    return BASE_SECONDS + evaluations * stage * 4.0 / 3.0


# --- refusing ---------------------------------------------------------------------------------


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


@dataclass(frozen=True)
class _Driver:
    """A parameter whose value drives the cost, with its smallest value."""

    name: str
    minimum: int


_DRIVERS: dict[str, tuple[_Driver, ...]] = {
    "ldp-shuffle": (_Driver("n", 1), _Driver("m", 1), _Driver("steps", 1)),
    "krr": (_Driver("n", 1), _Driver("steps", 1)),
    "clones": (_Driver("n", 1), _Driver("steps", 1)),
    "clones-gaussian": (_Driver("n", 1), _Driver("steps", 1)),
}
_RDP_DRIVERS = (_Driver("max_order", 2), _Driver("n", 1), _Driver("m", 1), _Driver("steps", 1))


def check_budget(
    mechanism: str,
    values: Mapping[str, object],
    *,
    steps: list[int],
    method: str | None,
    max_order: int | None,
    budget: float,
) -> float:
    """Refuse a request whose estimated cost exceeds ``budget`` seconds.

    Args:
        mechanism: A mechanism of :data:`~shuffle_opacus.analysis.CATALOGUE`.
        values: Its parameters by name (validated).
        steps: The round counts (validated).
        method: The method, or ``None``.
        max_order: The order cap, or ``None``.
        budget: Seconds allowed.

    Returns:
        The estimate in seconds.

    Raises:
        WorkLimitError: naming the parameter to lower and its largest acceptable value, with
            the estimate.
    """
    full = dict(values)
    full["max_order"] = max_order
    full["steps"] = list(steps)

    def cost(changes: Mapping[str, object]) -> float:
        trial = {**full, **changes}
        return account_seconds(
            mechanism,
            trial,
            steps=trial["steps"],  # type: ignore[arg-type]
            method=method,
            max_order=trial["max_order"],  # type: ignore[arg-type]
        )

    total = cost({})
    if total <= budget:
        return total
    label = _label(mechanism, method, values)
    for driver in _DRIVERS.get(mechanism, _RDP_DRIVERS):
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
    names = ", ".join(d.name for d in _DRIVERS.get(mechanism, _RDP_DRIVERS))
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
    mechanism: str,
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
        mechanism: The protocol's analysis mechanism (``shuffle``, ``subsampled``, ``checkin``).
        method: Its method.
        n: Population (validated).
        m: Users per round, or ``None``.
        rate: Check-in rate, or ``None``.
        rounds: Rounds composed (validated).
        budget: Seconds allowed.

    Returns:
        The estimate in seconds.

    Raises:
        WorkLimitError: naming ``n`` or ``rounds`` and its largest acceptable value.
    """

    def cost(n_: int, rounds_: int) -> float:
        return calibrate_seconds(
            mechanism=mechanism,
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
    for name in _calibrate_drivers(method):
        if name == "n":
            best = largest_within(lambda x: cost(x, rounds), max(m or 1, 1), n, budget)
            top = n
        else:
            best = largest_within(lambda x: cost(n, x), 1, rounds, budget)
            top = rounds
        if best is not None and best < top:
            raise WorkLimitError(
                f"{name} must be <= {best} for calibrate {mechanism} --method {method} "
                f"(estimated {_seconds(total)}, limit {budget:g} s)."
            )
    raise WorkLimitError(
        f"calibrate {mechanism} --method {method} is estimated at {_seconds(total)}, over the "
        f"{budget:g} s limit; lower {' or '.join(_calibrate_drivers(method))}."
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
