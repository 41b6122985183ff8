"""The cost model of the accounting entry points: measured unit costs and estimates per request.

Each method of the table carries its cost model (:class:`~.records.Cost`): the per-method
estimates below are plain functions that the records of :mod:`.mechanisms` reference, and
:func:`account_seconds`, :func:`rdp_stage_seconds` and :func:`calibrate_seconds` read the record
of the mechanism asked for, never its name. The unit costs were measured with
``python benchmarks/limits.py`` on one core of the project's machine and rounded up, so
estimates are conservative (typically 1-3 times the measured time); docs/maths.md ("Work
limits") lists the measurements. :mod:`.limits` turns the estimates into refusals and budgets.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from .records import Mechanism, Method, StageCost

__all__ = [
    "BASE_SECONDS",
    "mechanism_record",
    "account_seconds",
    "calibrate_seconds",
    "rdp_stage_seconds",
    "shuffle_pld_seconds",
    "proven_seconds",
    "closed_form_stage",
    "mixture_stage",
    "shuffle_stage",
    "theorem2_stage",
    "theorem3_stage",
    "checkin_sum_stage",
    "shuffle_pld_request",
    "proven_request",
    "shuffle_pld_calibration",
    "proven_calibration",
    "ldp_shuffle_request",
    "krr_request",
    "clones_request",
    "clones_gaussian_request",
    "clones_closed_form_request",
]

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
#: The same for the shuffle Gaussian's pessimistic composition alone (what a calibration
#: evaluates), since its window follows the loss scale: check-in n = 1e5, rate 0.01, sigma 5:
#: 1e4 rounds 0.01 s, 1e5 0.05 s, 1e6 1.4 s (the optimistic end, on its finer grid, costs about
#: ``PLD_COMPOSE_SECONDS sqrt(k)``: 2.1 s, 12 s, 27 s).
PLD_UPPER_COMPOSE_SECONDS = 2e-3
#: The geometric grid of the shuffle Gaussian PLD (at most 64 reports): about
#: ``PLD_LATTICE_SECONDS sqrt(n) / min(sigma, 1)^2`` plus 0.2 s.
PLD_LATTICE_SECONDS = 1.2e-3
#: One point of the largest lattice of the shuffle Gaussian PLD
#: (:func:`~shuffle_opacus.analysis.pld.shuffle_gaussian.lattice.lattice_points`, which follows
#: the reports per round and sigma, not n), plus :data:`PLD_PAIR_BASE_SECONDS`. Measured (pair and
#: its PMF, load about 2): check-in rate 0.01, sigma 5, n = 1e5 (2.9e5 points) 0.68 s; n = 1e9,
#: rate 0.01 (1.0e6 points) 2.0 s; shuffle n = 1e9 (1.0e7 points) 26.7 s.
PLD_POINT_SECONDS = 3e-6
PLD_PAIR_BASE_SECONDS = 0.3
#: Reports per round up to which the geometric grid may be used (its own cost model).
_GEOMETRIC_TERMS = 64
#: Fixed cost of a request (imports are not counted).
BASE_SECONDS = 0.05

#: Normal quantile of the tail masses the enumerations leave out (about 1e-13 per side).
_Z_TAIL = 7.5
#: Orders the automatic range visits (``epsilon_from_rdp``'s defaults).
_AUTO_START, _AUTO_LIMIT = 64, 4096


# --- Rényi-DP methods: one order range (the records' ``Cost.stage``) ----------------------------


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


def closed_form_stage(order: int, *, n: int | None, m: int | None, rate: float | None) -> float:
    """Estimate a closed form at each order (the Gaussian, Corollary 1, shuffle references)."""
    elements = 10.0 * order
    return elements * SERIES_SECONDS


def mixture_stage(order: int, *, n: int | None, m: int | None, rate: float | None) -> float:
    """Estimate one mixture or Wang et al. convolution (subsampled Gaussians, references)."""
    elements = float(order) ** 2
    return elements * SERIES_SECONDS


def shuffle_stage(order: int, *, n: int | None, m: int | None, rate: float | None) -> float:
    """Estimate Theorem 1 over the ``n`` users (``theorem1``; the check-in ``exact`` average)."""
    elements = _series_elements(int(n or 1), order)
    return elements * SERIES_SECONDS


def theorem2_stage(order: int, *, n: int | None, m: int | None, rate: float | None) -> float:
    """Estimate Theorem 1 over a round's ``m`` users, then Wang et al. (``theorem2``)."""
    elements = _series_elements(int(m or 1), order) + float(order) ** 2
    return elements * SERIES_SECONDS


def theorem3_stage(order: int, *, n: int | None, m: int | None, rate: float | None) -> float:
    """Estimate the check-in ``theorem3`` bound: Theorem 1 at half the users, two mixtures."""
    big = min(int(n or 1), int(0.5 * int(n or 1) * float(rate or 1.0)) + 1)
    elements = _series_elements(big, order) + 2.0 * float(order) ** 2
    return elements * SERIES_SECONDS


def checkin_sum_stage(order: int, *, n: int | None, m: int | None, rate: float | None) -> float:
    """Estimate the check-in ``sum`` bound (Eq. 17 over the binomial bulk and its tails)."""
    elements = _sum_elements(int(n or 1), float(rate or 1.0), order)
    return elements * SERIES_SECONDS


# --- privacy loss distributions, clones ---------------------------------------------------------


def _pld_compose_seconds(steps: Sequence[int]) -> float:
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


def _shuffle_pld_seconds(n: int, users: int, sigma: float, rate: float | None) -> float:
    """Estimated seconds of one round's pair and PMF: ``users`` reports out of ``n`` at ``rate``."""
    if users <= _GEOMETRIC_TERMS:
        return 0.2 + PLD_LATTICE_SECONDS * math.sqrt(users) / min(sigma, 1.0) ** 2
    # Imported here: the pld package imports the limits, which import this module.
    from .pld.shuffle_gaussian.lattice import lattice_points

    points = lattice_points(n=n, terms=users, rate=rate or 1.0, sigma=sigma, tail=1e-13)
    if not math.isfinite(points):  # the engine refuses such a sigma at once
        return PLD_PAIR_BASE_SECONDS
    return PLD_PAIR_BASE_SECONDS + PLD_POINT_SECONDS * points


PROVEN_EVALUATIONS = 8.0
"""Compositions a ``proven`` answer takes: the level search (once per doubling of the rounds)."""


#: Users beyond which the ``proven`` method's enumerations stop growing: its pairs cap their
#: expected counts (``CLONES_COUNT``, ``BLANKET_COUNT`` of :mod:`.pld.proven_pairs`). Measured
#: (check-in rate 0.01 at 1e7, 1e-4 at 1e9, sigma 5, 10,000 rounds, load about 3): n = 1e7 41 s,
#: n = 1e9 18 s.
PROVEN_USERS_CAP = 10**7

#: Epsilon evaluations of a noise calibration: a bisection to 0.1% takes about 10 steps after
#: 2 to 5 to bracket the target.
_CALIBRATION_EVALUATIONS = 16.0


def proven_seconds(users: int, steps: Sequence[int]) -> float:
    """Estimated seconds of the ``proven`` method (the level search, then the answer).

    Each evaluation enumerates one pair, whose windows grow like the square root of the
    reports per round up to :data:`PROVEN_USERS_CAP` users, and composes it.
    """
    one = 0.05 + 2e-4 * math.sqrt(min(users, PROVEN_USERS_CAP)) + _pld_compose_seconds(steps)
    return BASE_SECONDS + PROVEN_EVALUATIONS * one


def shuffle_pld_seconds(settings: list[tuple[int, int, float, float | None]], steps: int) -> float:
    """Estimated seconds of the shuffle Gaussian's ``pld`` for distinct round settings.

    Args:
        settings: ``(n, reports per round, sigma, check-in rate or None)`` of each distinct
            setting (the reports per round are ``n``, or ``m`` for the subsampled shuffle).
        steps: Rounds composed in all.

    Returns:
        The estimate (one pair per setting, then the composition).
    """
    pairs = sum(_shuffle_pld_seconds(n, users, sigma, rate) for n, users, sigma, rate in settings)
    return BASE_SECONDS + pairs + _pld_compose_seconds([steps])


def _population(values: Mapping[str, object]) -> tuple[int, int]:
    """``(n, reports per round)`` of a request (``n`` is 1 where absent)."""
    n = int(values.get("n") or 1)  # type: ignore[call-overload]
    m = values.get("m")
    return n, int(m) if m is not None else n  # type: ignore[call-overload]


def shuffle_pld_request(values: Mapping[str, object], steps: Sequence[int], base: float) -> float:
    """Estimate the shuffle Gaussian's ``pld``: one pair and its PMF, then the compositions."""
    n, users = _population(values)
    rate = values.get("rate")
    pair = _shuffle_pld_seconds(
        n,
        users,
        float(values["sigma"]),  # type: ignore[arg-type]
        float(rate) if rate is not None else None,  # type: ignore[arg-type]
    )
    return base + pair + _pld_compose_seconds(steps)


def proven_request(values: Mapping[str, object], steps: Sequence[int], base: float) -> float:
    """Estimate the ``proven`` method (:func:`proven_seconds`, counting its own fixed cost)."""
    return proven_seconds(_population(values)[1], steps)


def shuffle_pld_calibration(*, n: int, m: int | None, rate: float | None, rounds: int) -> float:
    """Estimate a calibration by ``pld``: pessimistic compositions, each with its pair.

    The bisection's evaluations cost on average about one at analysis sigma 0.75 (the pair's
    lattice grows fast below it): check-in n = 1e5, rate 0.01, 10,000 rounds, target 1 (noise
    multiplier 1.03) took 46 s at load 1.3, the estimate is 47 s.
    """
    users = m if m is not None else n
    one = _shuffle_pld_seconds(n, users, 0.75, rate)
    one += PLD_UPPER_COMPOSE_SECONDS * math.sqrt(rounds)
    return BASE_SECONDS + _CALIBRATION_EVALUATIONS * one


def proven_calibration(*, n: int, m: int | None, rate: float | None, rounds: int) -> float:
    """Estimate a calibration by ``proven``: one ``proven`` answer per evaluation."""
    return _CALIBRATION_EVALUATIONS * proven_seconds(m if m is not None else n, [rounds])


def ldp_shuffle_request(values: Mapping[str, object], steps: Sequence[int], base: float) -> float:
    """Estimate ``ldp-shuffle``: the pair's enumeration (twice with ``m``), then compositions."""
    n, users = _population(values)
    m = values.get("m")
    eps0 = float(values["eps0"])  # type: ignore[arg-type]
    total = base + _ldp_outcomes(users, eps0) * LDP_OUTCOME_SECONDS * (2.0 if m else 1.0)
    # The records' lower end composes one more PMF (the optimistic remove direction).
    return total + 1.5 * _pld_compose_seconds(steps)


def krr_request(values: Mapping[str, object], steps: Sequence[int], base: float) -> float:
    """Estimate ``krr``: the enumeration of its outcomes, then the compositions."""
    outcomes, unit = _krr_outcomes(
        _population(values)[0],
        int(values["k"]),  # type: ignore[call-overload]
        float(values["gamma"]),  # type: ignore[arg-type]
        str(values.get("adversary") or "strong"),
    )
    return base + outcomes * unit + 1.5 * _pld_compose_seconds(steps)


def _clones_total(one: float, steps: Sequence[int], base: float) -> float:
    """Estimate a clones bound costing ``one`` per point, composed over ``steps``."""
    points = 24 if max(steps) > 1 else 1
    composition = sum(points * KOV_ROUND_SECONDS * k for k in set(steps) if k > 1)
    return base + points * one + composition


def clones_request(values: Mapping[str, object], steps: Sequence[int], base: float) -> float:
    """Estimate ``clones`` by its numerical bound: a divergence search (and a lower end)."""
    eps0 = float(values["eps0"])  # type: ignore[arg-type]
    p = math.exp(-min(eps0, 700.0))
    evaluations = 2.0 * max(1.0, math.log2(max(eps0, 1e-6) / 1e-6)) + 4.0
    one = _clones_values(_population(values)[0], p) * evaluations * CLONES_C_SECONDS
    one *= 2.0 if not max(steps) > 1 else 1.0  # the certified lower end
    return _clones_total(one, steps, base)


def clones_gaussian_request(
    values: Mapping[str, object], steps: Sequence[int], base: float
) -> float:
    """Estimate ``clones-gaussian`` by its numerical bound: one scan of ``C``."""
    one = _clones_values(_population(values)[0], 0.5) * CLONES_GAUSSIAN_C_SECONDS
    return _clones_total(one, steps, base)


def clones_closed_form_request(
    values: Mapping[str, object], steps: Sequence[int], base: float
) -> float:
    """Estimate the clones bounds' closed form: a formula per point."""
    return _clones_total(1e-3, steps, base)


# --- reading the records ------------------------------------------------------------------------


def mechanism_record(mechanism: Mechanism) -> Mechanism:
    """Return ``mechanism`` once it is checked to be a record.

    The cost model reads records only: the table that turns a name into its record
    (:func:`~.mechanisms.get_mechanism`) stands on the cost functions of this module.

    Raises:
        TypeError: for anything but a :class:`~.records.Mechanism`, a name included.
    """
    if not isinstance(mechanism, Mechanism):
        raise TypeError(
            f"mechanism must be a Mechanism record (get_mechanism(name) gives a name's). "
            f"Found {mechanism!r}."
        )
    return mechanism


def _stage_cost(entry: Mechanism, curve: str) -> StageCost | None:
    if curve in entry.references:
        return entry.reference_cost
    try:
        return entry.method(curve).cost.stage
    except ValueError:
        return None


def rdp_stage_seconds(
    mechanism: Mechanism,
    method: str,
    order: int,
    *,
    n: int | None = None,
    m: int | None = None,
    rate: float | None = None,
) -> float:
    """Estimated seconds to evaluate one round's RDP of a method at orders ``2..order``.

    Args:
        mechanism: The record of a mechanism of the table.
        method: Its method, or a reference curve (``no-shuffle``, ``central``); a curve without
            a stage cost counts as one series convolution.
        order: Largest order ``L``.
        n: Population.
        m: Users per round (``subsampled``).
        rate: Check-in or Poisson rate.

    Returns:
        The estimate in seconds.

    Raises:
        TypeError: for a ``mechanism`` that is not a record.
    """
    stage = _stage_cost(mechanism_record(mechanism), method)
    if stage is None:
        return float(order) ** 2 * SERIES_SECONDS
    return stage(order, n=n, m=m, rate=rate)


def account_seconds(
    mechanism: Mechanism,
    values: Mapping[str, object],
    *,
    steps: list[int],
    method: str | None,
    max_order: int | None,
) -> float:
    """Estimated seconds of :func:`~shuffle_opacus.analysis.account` for one request.

    For Rényi-DP methods without ``max_order`` the estimate is that of the first stage of the
    automatic order range (the later stages are charged as they start, see :func:`charge`). The
    default of a mechanism with a :attr:`~.records.Mechanism.fallback` costs the cheaper of
    itself and the fallback (the fallback alone with ``max_order``, which selects it).

    Args:
        mechanism: The record of a mechanism of
            :data:`~shuffle_opacus.analysis.MECHANISM_TABLE`.
        values: Its parameters by name (``None`` for absent ones).
        steps: The round counts.
        method: The method (``None`` for the default).
        max_order: The order cap, or ``None``.

    Returns:
        The estimate in seconds.

    Raises:
        TypeError: for a ``mechanism`` that is not a record.
        ValueError: for an unknown method.
    """
    entry = mechanism_record(mechanism)
    total = BASE_SECONDS + 1e-4 * len(set(steps))
    order = max_order if max_order is not None else _AUTO_START
    n = int(values.get("n") or 1)  # type: ignore[call-overload]
    m = values.get("m")
    rate = values.get("rate")

    def rdp(chosen: Method) -> float:
        return total + rdp_stage_seconds(
            entry,
            chosen.name,
            order,
            n=n,
            m=int(m) if m is not None else None,  # type: ignore[call-overload]
            rate=float(rate) if rate is not None else None,  # type: ignore[arg-type]
        )

    chosen = entry.method(method)
    request = chosen.cost.request
    if request is None:
        return rdp(chosen)
    if method is not None or entry.fallback is None:
        return request(values, steps, total)
    # The default: itself where affordable, else its Rényi fallback (an order cap selects it).
    fallback = rdp(entry.method(entry.fallback))
    sigma = values.get("sigma")
    if max_order is not None or (sigma is not None and float(sigma) < chosen.cost.min_sigma):  # type: ignore[arg-type]
        return fallback
    return min(request(values, steps, total), fallback)


def calibration_drivers(mechanism: Mechanism, method: str) -> tuple[str, ...]:
    """Return the calibration parameters that drive the cost of ``method``, in order.

    Raises:
        TypeError: for a ``mechanism`` that is not a record.
        ValueError: for an unknown method.
    """
    return mechanism_record(mechanism).method(method).cost.calibration_drivers


def calibrate_seconds(
    *,
    mechanism: Mechanism,
    method: str,
    n: int,
    m: int | None,
    rate: float | None,
    rounds: int,
    order: int,
) -> float:
    """Estimated seconds of a noise calibration (about 16 evaluations of epsilon).

    Args:
        mechanism: The record of the protocol's analysis mechanism.
        method: Its method.
        n: Population.
        m: Users per round, or ``None``.
        rate: Check-in rate, or ``None``.
        rounds: Rounds composed.
        order: The Rényi order range the evaluations are expected to need.

    Returns:
        The estimate in seconds.

    Raises:
        TypeError: for a ``mechanism`` that is not a record.
        ValueError: for an unknown method.
    """
    entry = mechanism_record(mechanism)
    own = entry.method(method).cost.calibration
    if own is not None:
        return own(n=n, m=m, rate=rate, rounds=rounds)
    stage = rdp_stage_seconds(entry, method, order, n=n, m=m, rate=rate)
    # The order range grows by doubling; its stages cost about 4/3 of the last one.
    return BASE_SECONDS + _CALIBRATION_EVALUATIONS * stage * 4.0 / 3.0
