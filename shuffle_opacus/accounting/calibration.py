"""From a target epsilon to a noise multiplier: calibration through :func:`.history_epsilon`.

:func:`calibrate` finds the smallest local noise multiplier whose planned rounds meet a target
(epsilon, delta) under the protocol's default method, so that what it returns is what the
accountant will report. The ``calibrate`` command and
:func:`shuffle_opacus.make_private_with_epsilon` use it. This module does not import torch.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass

from ..analysis.limits import (
    API_MAX_SECONDS,
    PldRangeError,
    WorkLimitError,
    check_calibrate_budget,
    report_progress,
    work_budget,
)
from ..analysis.mechanisms import get_mechanism
from ..analysis.rdp.conversion import DEFAULT_ORDER_LIMIT, OrderCapWarning
from ..analysis.results import conversion_term
from ..common.validation import check_int, check_positive, check_target_delta
from .history import history_epsilon
from .protocols import Protocol, analysis_sigma, get_protocol, resolve_sensitivity

__all__ = ["calibrate", "Calibration", "calibrate_noise_multiplier", "UnreachableTargetError"]


@dataclass(frozen=True)
class Calibration:
    """The result of :func:`calibrate`.

    Attributes:
        noise_multiplier: The smallest local noise multiplier found meeting the target.
        epsilon: Its epsilon after the planned rounds (at most the target).
        method: The method that computed it.
        note: Why the default fell back to a Rényi bound, or ``None``.
    """

    noise_multiplier: float
    epsilon: float
    method: str
    note: str | None = None


def calibrate(
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
) -> Calibration:
    """Smallest local noise multiplier (to ``rel_tol``) whose epsilon after ``rounds`` is <= target.

    A bisection on ``log(noise_multiplier)``. The value returned is always one at which epsilon
    was evaluated (by :func:`history_epsilon`, with one method throughout) and found
    ``<= target_epsilon``, so the result never overshoots the target, whatever the shape of
    epsilon as a function of the noise. The default method is ``pld`` (the tightest sound one)
    when its estimated cost is within ``max_seconds``, else the protocol's Rényi bound, with a
    note. Where the ``pld`` engines cannot evaluate a noise multiplier (too little noise,
    :class:`~shuffle_opacus.analysis.limits.PldRangeError`) the Rényi bound answers for it; the
    result names the method that evaluated the value returned.

    Args:
        target_epsilon: Privacy budget epsilon (> 0).
        delta: Target delta in ``[1e-200, 1)`` (a smaller one underflows the accounting).
        population: Number of clients ``n``.
        rounds: Number of training rounds (integer >= 1).
        protocol: A protocol name or record.
        rate: Check-in probability (``checkin``).
        sample_size: Clients per round (``subsampled``).
        sensitivity: See :func:`~shuffle_opacus.accounting.protocols.resolve_sensitivity`.
        method: A method of the protocol's analysis; the default as above when ``None``.
        rel_tol: Relative width of the final bracket (in ``(0, 1)``).
        max_noise_multiplier: Largest noise multiplier tried before giving up.
        max_seconds: Work budget in estimated seconds
            (:data:`~shuffle_opacus.analysis.limits.API_MAX_SECONDS` by default): the request
            is refused up front when its estimate exceeds it, and each Rényi order range is
            charged to it as it starts. ``None`` turns the budget off.

    Returns:
        A :class:`Calibration`.

    Raises:
        UnreachableTargetError: a ``ValueError``, when even ``max_noise_multiplier`` does
            not reach the target (it names the smallest target that does).
        ValueError: on invalid arguments, when the target lies below the floor of Lemma 2
            (Rényi-DP methods; see :func:`~shuffle_opacus.analysis.results.conversion_term`),
            or for a request over the work budget
            (:class:`~shuffle_opacus.analysis.limits.WorkLimitError`, naming ``population`` or
            ``rounds`` and its largest acceptable value).
    """
    target_epsilon = check_positive("target_epsilon", target_epsilon)
    delta = check_target_delta(delta)
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
    note = None
    if method is None:
        method = record.methods[0]
        if max_seconds is not None and record.fallback is not None:
            try:
                _check_budget(record, method, population, sample_size, sample_rate, rounds,
                              max_seconds)  # fmt: skip
            except WorkLimitError as exc:
                note = f"{str(exc).rstrip('.')}; Rényi bound (method {record.fallback}) instead"
                method = record.fallback
    kind = get_mechanism(record.mechanism).method(method).kind
    if kind != "pld":
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
        _check_budget(record, method, population, sample_size, sample_rate, rounds, max_seconds)

    used: dict[float, tuple[float, str]] = {}

    def evaluate(noise_multiplier: float, name: str) -> float:
        with warnings.catch_warnings():
            # An optimum at the order cap still gives a valid (looser) upper bound.
            warnings.simplefilter("ignore", OrderCapWarning)
            return history_epsilon(
                [(noise_multiplier, sample_rate, rounds)],
                protocol=record,
                delta=delta,
                population=population,
                sensitivity=sens,
                method=name,
            ).epsilon

    def eps(noise_multiplier: float) -> float:
        report_progress(f"noise multiplier {noise_multiplier:.6g}")
        name = method
        try:
            value = evaluate(noise_multiplier, name)
        except PldRangeError:
            # Too little noise for the pld engines: the Rényi bound answers there (both are
            # upper bounds, so the bisection still never overshoots the target).
            if record.fallback is None:
                raise
            name = record.fallback
            value = evaluate(noise_multiplier, name)
        used[noise_multiplier] = (value, name)
        return value

    with work_budget(max_seconds):
        start, slope = 1.0, 2.0
        floor = min(conversion_term(order, delta) for order in range(2, DEFAULT_ORDER_LIMIT + 1))
        if kind == "pld" and record.fallback is not None and target_epsilon >= floor:
            # The Rényi bound is cheap and never below pld: its answer meets the target under
            # pld too, and the search for pld starts there instead of at smaller noise (whose
            # heavy-tailed pairs are the expensive ones).
            try:
                start = _bisect(
                    lambda nm: evaluate(nm, record.fallback),  # type: ignore[arg-type]
                    target_epsilon=target_epsilon,
                    rel_tol=0.05,
                    max_noise_multiplier=max_noise_multiplier,
                )
                # How fast epsilon falls with the noise there (log-log), for the first step.
                near = evaluate(start / 1.05, record.fallback)  # type: ignore[arg-type]
                far = evaluate(start, record.fallback)  # type: ignore[arg-type]
                if 0.0 < far < near < math.inf:
                    slope = min(max(math.log(near / far) / math.log(1.05), 0.5), 8.0)
            except ValueError:
                start = 1.0
        found = _bisect(
            eps,
            target_epsilon=target_epsilon,
            rel_tol=rel_tol,
            max_noise_multiplier=max_noise_multiplier,
            start=start,
            slope=slope,
            check_cap=kind == "pld",
        )
    epsilon, name = used[found]
    refused = [nm for nm, (_, how) in used.items() if how != method and nm < found]
    if name == method and refused:
        note = (
            f"the pld engines cannot evaluate noise multipliers up to {max(refused):.6g} here, "
            f"where the Rényi bound exceeds the target: the value found is limited by them"
        )
    if name != method:
        note = (
            f"the pld engines cannot evaluate noise_multiplier {found:.6g} here (analysis sigma "
            f"{analysis_sigma(found, sens):.3g}); Rényi bound (method {name}) instead"
        )
    return Calibration(noise_multiplier=found, epsilon=epsilon, method=name, note=note)


def _check_budget(
    record: Protocol,
    method: str,
    population: int,
    sample_size: int | None,
    sample_rate: float,
    rounds: int,
    max_seconds: float,
) -> None:
    try:
        check_calibrate_budget(
            mechanism=record.analysis,
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
        raise WorkLimitError("population" + text[1:] if text.startswith("n ") else text) from None


class UnreachableTargetError(ValueError):
    """The target epsilon is not met even at the largest noise multiplier tried.

    Attributes:
        target_epsilon: The target.
        max_noise_multiplier: The largest noise multiplier tried.
        reached: Epsilon at ``max_noise_multiplier`` (``inf`` where it is not finite): the
            smallest target that noise multiplier meets.
    """

    def __init__(self, target_epsilon: float, max_noise_multiplier: float, reached: float):
        """Build the one-line message from the three numbers (see the attributes)."""
        self.target_epsilon = target_epsilon
        self.max_noise_multiplier = max_noise_multiplier
        self.reached = reached
        head = (
            f"target_epsilon={target_epsilon} is not reached with noise_multiplier <= "
            f"{max_noise_multiplier}"
        )
        if math.isfinite(reached):
            text = (
                f"{head}: target_epsilon must be >= {reached:.6g} (the epsilon at "
                f"noise_multiplier {max_noise_multiplier}), or raise max_noise_multiplier."
            )
        else:
            text = f"{head} (epsilon is not finite there); raise max_noise_multiplier."
        super().__init__(text)


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
    """Return the noise multiplier of :func:`calibrate` alone (same arguments and errors).

    Returns:
        The local noise multiplier (noise std of one client divided by the clipping norm).
    """
    return calibrate(
        target_epsilon=target_epsilon,
        delta=delta,
        population=population,
        rounds=rounds,
        protocol=protocol,
        rate=rate,
        sample_size=sample_size,
        sensitivity=sensitivity,
        method=method,
        rel_tol=rel_tol,
        max_noise_multiplier=max_noise_multiplier,
        max_seconds=max_seconds,
    ).noise_multiplier


def _bisect(
    eps: Callable[[float], float],
    *,
    target_epsilon: float,
    rel_tol: float,
    max_noise_multiplier: float,
    start: float = 1.0,
    slope: float = 2.0,
    check_cap: bool = False,
) -> float:
    """Solve ``eps(x) = target`` on ``log(noise_multiplier)``, never overshooting the target.

    A bracket ``[low, high]`` with ``eps(high) <= target < eps(low)`` is found from ``start``
    (upwards by doubling, downwards by extrapolating ``eps ~ x^-slope``) and narrowed by the
    Illinois variant of regula falsi on ``log eps`` against ``log x``, each new point kept at
    least half the tolerance away from both ends (a bisection step when the bracket stalls), until
    ``high / low - 1 <= rel_tol``. Every value returned was evaluated and met the target; a
    few evaluations suffice where plain bisection needs about ten (each ``pld`` evaluation
    builds a new pair).

    Args:
        eps: Epsilon as a function of the noise multiplier (``inf`` where it cannot be met).
        target_epsilon: The target (> 0).
        rel_tol: Relative width of the final bracket.
        max_noise_multiplier: Largest noise multiplier tried.
        start: First noise multiplier evaluated.
        slope: Guess of ``-d log eps / d log x`` for the first step down.
        check_cap: When ``start`` misses the target, look at ``max_noise_multiplier`` first
            and refuse at once if it misses too (for methods without a floor, like pld).

    Returns:
        The smallest noise multiplier found with ``eps <= target_epsilon``.

    Raises:
        UnreachableTargetError: when even ``max_noise_multiplier`` does not reach the target.
    """
    log_target = math.log(target_epsilon)
    seen: dict[float, float] = {}

    def excess(x: float) -> float:
        value = seen[x] = eps(x)
        if value <= 0.0:
            return -math.inf
        return math.log(value) - log_target if math.isfinite(value) else math.inf

    high = min(max(start, 1e-6), max_noise_multiplier)
    g_high = excess(high)
    if (
        check_cap
        and g_high > 0.0
        and high < max_noise_multiplier
        and excess(max_noise_multiplier) > 0.0
    ):
        # Unreachable (the pld method has no floor, so only the noise cap says so): one look
        # at the cap instead of every doubling up to it.
        raise UnreachableTargetError(
            target_epsilon, max_noise_multiplier, seen[max_noise_multiplier]
        )
    while g_high > 0.0:
        if high >= max_noise_multiplier:
            raise UnreachableTargetError(target_epsilon, max_noise_multiplier, seen[high])
        high = min(2.0 * high, max_noise_multiplier)
        g_high = excess(high)
    while True:  # below ``high``, a point that misses the target
        # Aim a little past the estimated crossing, so that the step likely brackets it.
        factor = math.exp(g_high / slope) / (1.0 + rel_tol) if math.isfinite(g_high) else 0.5
        low = high * min(max(factor, 0.5), 1.0 / (1.0 + rel_tol))
        if low < 1e-6:
            return high
        g_low = excess(low)
        if g_low > 0.0:
            break
        if math.isfinite(g_low) and math.isfinite(g_high) and g_low > g_high:
            # The secant of the two points met so far, for the next step.
            slope = min(max((g_low - g_high) / math.log(high / low), 0.5), 8.0)
        high, g_high = low, g_low
    # Invariant: eps(high) <= target < eps(low).
    side = 0
    stalled = 0
    while high / low - 1.0 > rel_tol:
        u_low, u_high = math.log(low), math.log(high)
        width = u_high - u_low
        if math.isfinite(g_low) and math.isfinite(g_high) and stalled < 3:
            u = u_high - g_high * width / (g_high - g_low)
        else:
            u = u_low + width / 2.0
        margin = min(math.log1p(rel_tol) / 2.0, width / 4.0)
        u = min(max(u, u_low + margin), u_high - margin)
        mid = math.exp(u)
        g_mid = excess(mid)
        before = width
        if g_mid <= 0.0:
            high, g_high = mid, g_mid
            if side == 1 and math.isfinite(g_low):
                g_low /= 2.0  # Illinois: the end kept twice pulls less
            side = 1
        else:
            low, g_low = mid, g_mid
            if side == -1 and math.isfinite(g_high):
                g_high /= 2.0
            side = -1
        shrunk = math.log(high) - math.log(low)
        stalled = stalled + 1 if shrunk > 0.5 * before else 0
    return high
