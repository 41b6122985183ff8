"""Proven epsilon of shuffled Gaussian reports (method ``proven``): no assumption on the others.

Each round's reports are replaced by stand-ins within a small total variation, whose shuffle is
dominated by a pair of count distributions (Feldman, McMillan & Talwar, *Hiding Among the
Clones*, arXiv:2012.12803): route ``blanket`` (Theorem 4.1, with the Gaussian's own
decomposition) or ``clones`` (Lemma 3.7 and the proof of Theorem 3.8). The pairs are composed by
privacy loss distribution, the stand-ins' total variation over every report of every round is
added to delta with its ``e^eps`` factor (their Lemma C.1), and the level of the stand-ins is
chosen on a grid. Route ``gaussian`` (the local Gaussian alone) is the fallback where shuffling
does not beat it. Derivation: docs/maths.md, "A proven bound".
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from ...common.validation import check_delta
from ..approximate.analytic_gaussian import gaussian_dp_delta, gaussian_dp_epsilon
from ..memory import PldRangeError
from . import disk_cache
from .common import default_tail
from .powers import DEFAULT_TRUNCATION, PmfPowers, cached_powers, compose_arrays
from .proven_pairs import (
    PairTooLargeError,
    ProvenPair,
    blanket_mass,
    blanket_pair,
    blanket_scale,
    blanket_weight,
    expected_others,
    inclusion,
    proven_pair,
)
from .proven_pmf import _pair_pmf, epsilon_with_coupling
from .rounds import ShuffleRound

__all__ = [
    "EPS0_STEP",
    "ProvenEstimate",
    "ProvenPair",
    "stand_in_costs",
    "blanket_pair",
    "blanket_mass",
    "blanket_scale",
    "blanket_weight",
    "ROUTES",
    "epsilon_with_coupling",
    "proven_pair",
    "proven_rounds_epsilon",
]

EPS0_STEP = 1.0 / 32.0
"""Step of the grid on which ``eps0`` is chosen (any grid point gives a valid bound)."""

_MAX_LEVEL = 60.0

ROUTES: tuple[str, ...] = ("blanket", "clones", "gaussian")
"""The proven routes, each a valid bound; the smallest epsilon is reported.

``blanket``: Theorem 4.1 of arXiv:2012.12803 with the Gaussian's own decomposition;
``clones``: Theorem 3.8's reduction (any ``(eps0, delta0)``-LDP randomiser); ``gaussian``: the
local Gaussian alone, no shuffle."""


def _level(k: int) -> float:
    return k * EPS0_STEP


@functools.lru_cache(maxsize=4)
def _route_pair(route: str, setting: ShuffleRound, k: int, tail: float) -> ProvenPair:
    """Return the route's pair at level ``k``, its outcomes sorted by loss (stably), once."""
    if route == "clones":
        pair = proven_pair(setting, _level(k), tail)
    else:
        pair = blanket_pair(setting, blanket_weight(setting.sigma, _level(k)), tail)
    order = np.argsort(pair.loss, kind="stable")
    return ProvenPair(loss=pair.loss[order], mass=pair.mass[order], left=pair.left)


BLANKET_COUNT = 64.0
"""Largest expected count per kind of the blanket pair: its enumeration has about
``6000 BLANKET_COUNT^1.5`` cells, so the blanket weight is capped there (a smaller weight is
always valid, at some cost in tightness where the population could hide more)."""


def blanket_floor(parts: Sequence[tuple[ShuffleRound, int]]) -> int:
    """Return the lowest blanket level on the grid whose weight keeps every count small.

    The weight ``p = 1/(2 c e^level)`` falls with the level; each kind of the pair counts about
    ``users * rate * p`` reports, kept at most :data:`BLANKET_COUNT`.
    """
    sigma = parts[0][0].sigma
    users = max((s.m if s.m is not None else s.n * (s.rate or 1.0)) for s, _ in parts)
    p_cap = BLANKET_COUNT / max(users, 1.0)
    if p_cap >= blanket_weight(sigma, 0.0):
        return 0
    level = math.log(1.0 / (2.0 * blanket_scale(blanket_mass(sigma)) * p_cap))
    return math.ceil(level / EPS0_STEP)


def stand_in_costs(
    route: str, rounds: Sequence[tuple[ShuffleRound, int]], level: float
) -> tuple[float, float, float]:
    """Total variation between the real reports and their stand-ins, summed over all rounds.

    Args:
        route: ``"clones"`` or ``"blanket"``.
        rounds: ``(setting, count)`` pairs sharing ``sigma``.
        level: ``eps0`` (clones) or the blanket's level (see :func:`blanket_weight`).

    Returns:
        ``(eta0, eta1, per_report)``: on the dataset whose differing input is the reference and
        on the other one, and the bound per report of another user. ``clones``: each other
        report ``(1 + e^{-eps0}/2) delta0``, the differing user's own ``delta0`` on one side
        (proof of Theorem 3.8, arXiv:2012.12803). ``blanket``: each other report
        ``delta_G(level) / e^level``, the differing user's none (its decomposition is exact).
        Summed over the expected number of reports (a union bound over a random number of
        randomiser calls).
    """
    sigma = rounds[0][0].sigma
    others = sum(c * expected_others(s) for s, c in rounds)
    own = sum(c * inclusion(s) for s, c in rounds)
    delta_g = gaussian_dp_delta(level, sigma=sigma)
    if route == "clones":
        per = (1.0 + 0.5 * math.exp(-level)) * delta_g
        return others * per, others * per + own * delta_g, per
    per = delta_g * math.exp(-level)
    return others * per, others * per, per


#: Loss grid points per standard deviation of one round's loss (as the ``pld`` method's).
_GRID_PER_SD = 64.0

#: Largest loss grid of the local Gaussian's PMF (as the ``pld`` method's per-round grids).
MAX_GAUSSIAN_POINTS = 4_000_000


def _step(sd: float) -> float:
    """Loss grid step: the power of two at most ``sd / 64``, between ``2^-40`` and ``2^-10``.

    ``sd`` is one round's loss standard deviation. Connect-the-dots costs about the square of
    the step per round, so the grid does not depend on the round count: an accountant asked
    every round keeps its per-round PMFs from the first round on.
    """
    step = max(sd / _GRID_PER_SD, 2.0**-40)
    return 2.0 ** min(-10, math.floor(math.log2(step)))


def _scale(rounds: int) -> int:
    return 1 << max(rounds - 1, 0).bit_length()


def _tail(delta: float, rounds: int, scale: int) -> float:
    """Per-round left-out mass for ``rounds`` rounds: the one for ``scale >= rounds`` rounds.

    Smaller than (or equal to) :func:`~.common.default_tail` of ``rounds``, so at most as much is
    left out, and the same for every count up to the next power of two, so the pairs are built
    once per doubling; the count's own where the scale's would be below the smallest tail.
    """
    try:
        return default_tail(delta, max(rounds, scale))
    except ValueError:
        return default_tail(delta, rounds)


CACHE_VERSION = 1
"""Code version of the proven pairs' cached statistics and PMFs: bump it whenever their
construction changes (the digest of :data:`CACHE_SOURCES` changes with any edit anyway)."""

CACHE_SOURCES = (
    "analysis/pld/proven.py",
    "analysis/pld/proven_pmf.py",
    "analysis/pld/proven_pairs.py",
    "analysis/pld/common.py",
    "analysis/pld/powers.py",
    "analysis/pld/disk_cache.py",
    "analysis/approximate/analytic_gaussian.py",
)
"""The source files that build a cached pair entry (relative to the package)."""


def _pair_key(
    route: str, setting: ShuffleRound, k: int, tail: float
) -> dict[str, disk_cache.KeyValue]:
    return {
        "route": route,
        "n": setting.n,
        "sigma": setting.sigma,
        "rate": setting.rate,
        "m": setting.m,
        "level": k,
        "level_step": EPS0_STEP,
        "tail": tail,
    }


@functools.lru_cache(maxsize=1024)
def _pair_stats(
    route: str, setting: ShuffleRound, k: int, tail: float
) -> tuple[float, float, float]:
    """Return ``(sd, span, left)``: the loss's standard deviation, its bulk's width, the cut.

    Kept for many more levels than the pairs themselves (three numbers each), so that a level
    search at the next doubling of the round count rebuilds no pair whose PMF is still cached;
    also kept on disk (:mod:`.disk_cache`), so that a later process builds no pair to search.
    """

    def entry() -> disk_cache.Entry:
        sd, span, left = _built_stats(route, setting, k, tail)
        return disk_cache.Entry({}, {"sd": sd, "span": span, "left": left})

    found = disk_cache.cached(
        "proven-stats",
        CACHE_VERSION,
        _pair_key(route, setting, k, tail),
        entry,
        sources=CACHE_SOURCES,
    ).scalars
    return float(found["sd"]), float(found["span"]), float(found["left"])  # type: ignore[arg-type]


def _built_stats(
    route: str, setting: ShuffleRound, k: int, tail: float
) -> tuple[float, float, float]:
    pair = _route_pair(route, setting, k, tail)
    if pair.mass.size == 0:
        return 1.0, 1.0, pair.left
    mean = float(np.dot(pair.mass, pair.loss))
    sd = math.sqrt(max(float(np.dot(pair.mass, (pair.loss - mean) ** 2)), 1e-30))
    cum = np.cumsum(pair.mass)  # the losses are sorted (:func:`_route_pair`)
    lo = pair.loss[min(int(np.searchsorted(cum, tail / 4.0)), cum.size - 1)]
    hi = pair.loss[min(int(np.searchsorted(cum, cum[-1] - tail / 4.0)), cum.size - 1)]
    return sd, float(hi - lo), pair.left


def _pair_grid(route: str, setting: ShuffleRound, k: int, tail: float) -> float:
    """Return the pair's grid step: :func:`_step`, coarsened to 2^17 points over the bulk."""
    sd, span, _ = _pair_stats(route, setting, k, tail)
    step = _step(sd)
    while span / step > 2.0**17:
        step *= 2.0
    return step


@functools.lru_cache(maxsize=48)
def _pair_powers(
    route: str, setting: ShuffleRound, k: int, tail: float, discretization: float
) -> PmfPowers:
    """One round's PMF of the route's pair at level ``k``, from the disk cache or built."""
    key = {**_pair_key(route, setting, k, tail), "discretization": discretization}
    (powers,) = cached_powers(
        "proven-pmf",
        CACHE_VERSION,
        key,
        lambda: [
            PmfPowers(_pair_pmf(_route_pair(route, setting, k, tail), discretization, tail / 4.0))
        ],
        sources=CACHE_SOURCES,
    )
    return powers


@functools.lru_cache(maxsize=16)
def _gaussian_powers(setting: ShuffleRound, discretization: float) -> PmfPowers:
    """One round of the local Gaussian alone, from the disk cache or built."""
    key: dict[str, disk_cache.KeyValue] = {
        "n": setting.n,
        "sigma": setting.sigma,
        "rate": setting.rate,
        "m": setting.m,
        "discretization": discretization,
    }
    (powers,) = cached_powers(
        "proven-gaussian",
        CACHE_VERSION,
        key,
        lambda: [_built_gaussian(setting, discretization)],
        sources=CACHE_SOURCES,
    )
    return powers


def _check_gaussian_grid(sigma: float, discretization: float) -> None:
    """Refuse a local Gaussian whose loss grid would exceed :data:`MAX_GAUSSIAN_POINTS`.

    ``dp_accounting`` keeps the Gaussian's losses within about ``2 z / sigma + 1 / sigma^2``
    (``z`` about 10, its tails cut at ``e^-50``); the grid step follows the loss's standard
    deviation, about ``sqrt(q) / sigma``, so at a tiny inclusion probability ``q`` the grid
    would hold tens of millions of points (minutes of ``dp_accounting``'s construction, then a
    composition over the memory limit). Checked before anything is built.
    """
    points = (20.0 / sigma + 1.0 / sigma**2) / discretization
    if points > MAX_GAUSSIAN_POINTS:
        raise PldRangeError(
            f"the proven bound's local Gaussian would need about {points:.3g} loss grid points "
            f"(at most {MAX_GAUSSIAN_POINTS}): the inclusion probability of a user is too small "
            f"for it; raise rate"
        )


def _built_gaussian(setting: ShuffleRound, discretization: float) -> PmfPowers:
    """Build one round of the local Gaussian alone, without the shuffle.

    The differing report is seen with probability ``q``, nothing of it otherwise (loss 0
    under both datasets).
    """
    from dp_accounting.pld import pld_pmf
    from dp_accounting.pld.privacy_loss_distribution import from_gaussian_mechanism

    q = inclusion(setting)
    pld = from_gaussian_mechanism(
        standard_deviation=setting.sigma,
        sensitivity=1.0,
        pessimistic_estimate=True,
        value_discretization_interval=discretization,
    )
    dense = pld._pmf_remove.to_dense_pmf()  # the Gaussian's PLD is symmetric
    probs = np.array(dense._probs, dtype=float) * q
    low = int(dense._lower_loss)
    if q < 1.0:
        if low > 0:
            probs = np.concatenate((np.zeros(low), probs))
            low = 0
        top = low + probs.size - 1
        if top < 0:
            probs = np.concatenate((probs, np.zeros(-top)))
        probs[-low] += 1.0 - q
    return PmfPowers(
        pld_pmf.DensePLDPmf(discretization, low, probs, q * float(dense._infinity_mass), True)
    )


@dataclass(frozen=True)
class ProvenEstimate:
    """A proven epsilon with how delta was spent.

    Attributes:
        epsilon: The proven epsilon at ``delta``.
        delta: The target delta.
        route: Which route gave it (:data:`ROUTES`).
        level: ``eps0`` (``clones``) or the blanket's level (``blanket``); ``None`` for
            ``gaussian``.
        weight: The blanket weight ``p`` (``blanket``), else ``None``.
        per_report: Total variation of one other user's report from its stand-in.
        delta_pld: The part of delta spent by the composed privacy loss distribution.
        delta_coupling: The part spent on the stand-ins, ``eta0 + e^eps eta1``.
        discretization: The loss grid step.
        tail: The mass each round's pair leaves out (inside ``delta_pld``).
    """

    epsilon: float
    delta: float
    route: str
    level: float | None
    weight: float | None
    per_report: float
    delta_pld: float
    delta_coupling: float
    discretization: float
    tail: float


def _evaluate(
    route: str,
    parts: Sequence[tuple[ShuffleRound, int]],
    k: int,
    delta: float,
    tail: float,
) -> tuple[float, float, float, float, float]:
    """``(epsilon, delta_pld, coupling, discretization, per_report)`` at level ``k``."""
    level = _level(k)
    eta0, eta1, per = stand_in_costs(route, parts, level)
    if eta0 + eta1 >= delta:
        return math.inf, 1.0, eta0 + eta1, 0.0, per
    try:
        left = sum(_pair_stats(route, s, k, tail)[2] * c for s, c in parts)
    except PairTooLargeError:
        return math.inf, 1.0, eta0 + eta1, 0.0, per  # no bound from this route at this level
    if left >= delta:
        return math.inf, 1.0, eta0 + eta1, 0.0, per  # the pairs' own tails exceed delta
    disc = min(_pair_grid(route, s, k, tail) for s, _ in parts)
    try:
        powers = [(_pair_powers(route, s, k, tail, disc), c) for s, c in parts]
    except PairTooLargeError:  # its PMF's grid would not fit in the memory limit
        return math.inf, 1.0, eta0 + eta1, 0.0, per
    eps, d_pld = epsilon_with_coupling(compose_arrays(powers), delta, eta0, eta1)
    coupling = eta0 + math.exp(min(eps, 700.0)) * eta1 if math.isfinite(eps) else eta0 + eta1
    return eps, d_pld, coupling, disc, per


def _search(
    route: str,
    parts: Sequence[tuple[ShuffleRound, int]],
    delta: float,
    tail: float,
    give_up: float = math.inf,
) -> tuple[int, tuple[float, float, float, float, float]]:
    """Return the best level of ``route`` on the grid: up past infeasible ones, then downhill.

    Stops at the first feasible level if its epsilon exceeds ``give_up`` (another route's
    best is already far smaller).
    """
    sigma = parts[0][0].sigma
    reports = sum(c * (inclusion(s) + expected_others(s)) for s, c in parts)
    # Below this level the stand-ins alone cost more than delta.
    floor = gaussian_dp_epsilon(min(0.5, delta / (3.0 * max(reports, 1.0))), sigma=sigma)
    k_min = max(1 if route == "clones" else 0, math.floor(floor / EPS0_STEP) - 8)
    if route == "blanket":
        k_min = max(k_min, blanket_floor(parts))
    k_max = max(k_min + 1, math.ceil(_MAX_LEVEL / EPS0_STEP))
    k = k_min
    while k < k_max and sum(stand_in_costs(route, parts, _level(k))[:2]) >= delta / 2.0:
        k += 1  # the first level whose stand-ins leave half of delta (no pair needed)
    k = min(k + 2, k_max)
    cache: dict[int, tuple[float, float, float, float, float]] = {}

    def value(i: int) -> float:
        if i not in cache:
            cache[i] = _evaluate(route, parts, i, delta, tail)
        return cache[i][0]

    tries = 0
    while not math.isfinite(value(k)) and k < k_max and tries < 3:
        k, tries = min(k + 4, k_max), tries + 1
    if not math.isfinite(value(k)) or value(k) > give_up:
        return k, cache[k]  # this route gives no bound here, or none near the best one
    # Every grid level is a valid bound; epsilon has been unimodal in the level in every case
    # examined, so a local minimum would cost tightness only. Downhill from the start, the steps
    # doubling while they gain, then halving back to one level: the start is usually within a
    # level or two of the best, and each level looked at costs a pair.
    k = _descend(value, k, k_min, k_max)
    best = min(cache, key=lambda i: cache[i][0])
    return best, cache[best]


def _descend(value: Callable[[int], float], k: int, k_min: int, k_max: int) -> int:
    """Return a local minimum of ``value`` on the integers of ``[k_min, k_max]``, from ``k``.

    Looks one level each way, then walks downhill one level at a time; after four steps the
    steps double while they gain and are then halved back to one level (a pattern search). A
    start next to the minimum (the usual case) costs three or four levels, a distant one a few
    times the logarithm of the distance.
    """

    def inside(i: int) -> bool:
        return k_min <= i <= k_max

    if inside(k - 1) and value(k - 1) < value(k):
        direction = -1
    elif inside(k + 1) and value(k + 1) < value(k):
        direction = 1
    else:
        return k
    k += direction
    step, walked = 1, 1
    while inside(k + direction * step) and value(k + direction * step) < value(k):
        k += direction * step
        walked += 1
        if walked > 4:
            step *= 2
    while step > 1:
        step //= 2
        for sign in (direction, -direction):
            while inside(k + sign * step) and value(k + sign * step) < value(k):
                k += sign * step
    return k


@functools.lru_cache(maxsize=32)
def _plan(
    settings: tuple[ShuffleRound, ...], weights: tuple[float, ...], delta: float, scale: int
) -> tuple[str, int]:
    """Choose the route and level for rounds in these proportions at ``scale`` rounds.

    Depends on the request only (not on earlier calls), so a resumed run reproduces its
    numbers; an accountant asked every round searches once each time the count doubles. The
    choice is kept on disk (:mod:`.disk_cache`) too: a later process asking the same searches
    no more.
    """
    key: dict[str, disk_cache.KeyValue] = {
        "settings": [[s.n, s.sigma, s.rate, s.m] for s in settings],
        "weights": list(weights),
        "delta": delta,
        "scale": scale,
    }

    def entry() -> disk_cache.Entry:
        route, k = _searched_plan(settings, weights, delta, scale)
        return disk_cache.Entry({}, {"route": route, "level": k})

    found = disk_cache.cached("proven-plan", CACHE_VERSION, key, entry, sources=CACHE_SOURCES)
    return str(found.scalars["route"]), int(found.scalars["level"])  # type: ignore[arg-type]


def _searched_plan(
    settings: tuple[ShuffleRound, ...], weights: tuple[float, ...], delta: float, scale: int
) -> tuple[str, int]:
    counts = [max(1, round(w * scale)) for w in weights]
    parts = list(zip(settings, counts, strict=True))
    tail = _tail(delta, sum(counts), scale)
    best: tuple[float, str, int] = (math.inf, "gaussian", 0)
    for route in ROUTES[:2]:
        k, values = _search(route, parts, delta, tail, give_up=2.0 * best[0])
        if values[0] < best[0]:
            best = (values[0], route, k)
    try:
        gaussian = _gaussian_epsilon(parts, delta)[0]
    except PldRangeError:
        gaussian = math.inf  # chosen only where no route gives a bound: then it says why
    if gaussian <= best[0]:
        return "gaussian", 0
    return best[1], best[2]


def _gaussian_epsilon(
    parts: Sequence[tuple[ShuffleRound, int]], delta: float
) -> tuple[float, float, float]:
    """``(epsilon, delta_pld, discretization)`` of the local Gaussian alone."""
    q_max = max(inclusion(s) for s, _ in parts)
    disc = _step(math.sqrt(q_max) / parts[0][0].sigma)
    _check_gaussian_grid(parts[0][0].sigma, disc)
    composed = compose_arrays([(_gaussian_powers(s, disc), c) for s, c in parts])
    eps, d_pld = epsilon_with_coupling(composed, delta, 0.0, 0.0)
    return eps, d_pld, disc


def proven_rounds_epsilon(
    rounds: Sequence[tuple[ShuffleRound, int]], *, delta: float
) -> ProvenEstimate:
    """Proven epsilon at ``delta`` of adaptively composed shuffled-Gaussian rounds.

    Neighbouring relation: replace one user; its two inputs and every other user's input
    anywhere in a domain whose L2 diameter is the unit of ``sigma``. The rounds share
    ``sigma``. Three routes (:data:`ROUTES`), each a bound from published theorems: the route
    and its level are chosen where they give the smallest epsilon for the same proportions of
    rounds at the next power of two of the count (once per doubling), then evaluated at the
    count asked for.

    Args:
        rounds: ``(setting, count)`` pairs with counts >= 1 (validated settings).
        delta: Target delta in ``(0, 1)``.

    Returns:
        A :class:`ProvenEstimate`.

    Raises:
        ValueError: on an empty ``rounds`` or rounds of different ``sigma``.
    """
    delta = check_delta(delta)
    merged: dict[ShuffleRound, int] = {}
    for setting, count in rounds:
        merged[setting] = merged.get(setting, 0) + int(count)
    if not merged:
        raise ValueError("rounds must hold at least one (setting, count) pair. Found none.")
    if len({s.sigma for s in merged}) != 1:
        found = ", ".join(sorted({f"{s.sigma:g}" for s in merged}))
        raise ValueError(f"rounds must share sigma for the proven method. Found {found}.")
    parts = sorted(merged.items(), key=lambda item: (item[0].n, item[0].rate or 0, item[0].m or 0))
    total = sum(merged.values())
    if delta <= DEFAULT_TRUNCATION:
        # Every composition leaves out this much mass at infinity: no route gets below it.
        return ProvenEstimate(math.inf, delta, "gaussian", None, None, 0.0, 1.0, 0.0, 0.0, 0.0)
    scale = _scale(total)
    route, k = _plan(tuple(s for s, _ in parts), tuple(c / total for _, c in parts), delta, scale)
    if route == "gaussian":
        eps, d_pld, disc = _gaussian_epsilon(parts, delta)
        return ProvenEstimate(eps, delta, route, None, None, 0.0, d_pld, 0.0, disc, 0.0)
    tail = _tail(delta, total, scale)
    eps, d_pld, coupling, disc, per = _evaluate(route, parts, k, delta, tail)
    level = _level(k)
    weight = blanket_weight(parts[0][0].sigma, level) if route == "blanket" else None
    return ProvenEstimate(eps, delta, route, level, weight, per, d_pld, coupling, disc, tail)
