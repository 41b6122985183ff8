"""Placements of the users against Theorem 1's pair (issue 40): an optimiser, not a test.

    .venv/bin/python benchmarks/placements.py --quick    # two small cells, about 30 s
    .venv/bin/python benchmarks/placements.py --json F   # the full search, about 23 minutes
    .venv/bin/python benchmarks/placements.py --resume F # part 3 from F again, then part 4

(Times measured in one process, one thread, on two shared cores: the full search took 1,368 s.)

The accounting of ``shuffle_opacus`` is exact for Theorem 1's pair of Liew & Takahashi, *Shuffle
Gaussian Mechanism for Differential Privacy* (arXiv:2206.09569): the other users at a common
value, the differing user at that value or at distance ``Delta``. That this pair is the worst case
is an assumption. Clipped updates live in a ball; under replace-one adjacency the differing user's
two inputs can be a diameter apart, so ``Delta`` = diameter = the sensitivity. This script puts
the ``n`` users anywhere in a ball of diameter 1 in ``R^d`` (so the analysis sigma equals the
noise std ``s``), and climbs towards the placement whose hockey-stick divergence (Monte Carlo,
``tests/placements.py``, both orientations: ``H(M(D')||M(D))`` and ``H(M(D)||M(D'))``) is largest
relative to the symmetrised profile of Theorem 1's pair at the same sigma
(``shuffle_gaussian_pair(...).delta_symmetric``, the curve the PLD accountant composes).

1. **Validation** of the oracle: its subset recursion (``n >= 5``) against the sum over the
   ``n!`` orderings (``n`` up to 9), ``n = 1`` against the analytic Gaussian, Theorem 1's pair
   against the quadrature of ``tests/oracles.py`` (``n = 2, 3``) and the package's pair
   (``n = 5, 9``) at the search's epsilons, with its importance sampling.
2. **The review's counterexample** under the paper's convention (sensitivity ``C``): the
   differing client at ``C e_1`` versus 0, the others at ``-C e_1``, in two dimensions.
3. **The optimiser**, for each cell (``n``, ``d``, sigma) and each epsilon where Theorem 1's
   symmetrised delta equals a target: the objective is ``delta_placement / delta_Theorem1``
   (the larger orientation) on common random numbers (one fixed noise sample per cell, shifted
   by the exact value of Theorem 1's pair, so the objective is a smooth function of the
   placement and the pair scores exactly 1). Random-restart hill climbing (a (1+1) search with
   an adaptive step: moving one user, moving all, or putting one user onto another) from
   random placements, then a coordinate search from the best end point; once unconstrained
   (towards the worst placement) and once with a penalty below distance :data:`FAR` from
   Theorem 1's pair (the worst placement unlike it). Every evaluation is archived with its
   ratios at all epsilons.
4. **Rechecks**: the leaders at each epsilon (the largest; the largest at distance >= 0.01,
   0.1 and 0.3; up to :data:`MAX_ABOVE` more that the search's noise scored above 1) are
   re-estimated on fresh noise, each with the estimator a pilot picked (plain, or the paired
   difference with Theorem 1's pair or its mirror, whose exact value is known), and reported as
   ``delta_placement / delta_Theorem1`` with three standard errors; then, with ``--deep``
   draws, the largest at distance >= 0.01, 0.1 and 0.3 and every recheck nominally above 1 (up
   to :data:`MAX_DEEP`). A placement above 1 beyond three standard errors after these (beyond
   :data:`ROUNDING`: the pair itself scores 1 up to rounding) is a FINDING.

The likelihood ratio of ``n`` users needs the permanent of an ``n x n`` matrix per sample
(``n 2^(n-1)`` products by the oracle's subset recursion), so a sample costs about 25 times more
at ``n = 9`` than at ``n = 5``: the noise sample and the draws of each recheck shrink with ``n``
(:func:`draws`). Everything runs on one thread per process (``--jobs`` processes over cells).
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import functools  # noqa: E402
import itertools  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402
from concurrent.futures import ProcessPoolExecutor, as_completed  # noqa: E402
from dataclasses import asdict, dataclass, field  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from shuffle_opacus.analysis.pld.shuffle_gaussian import shuffle_gaussian_pair  # noqa: E402
from tests.oracles import shuffle_hockey_quadrature  # noqa: E402
from tests.placements import (  # noqa: E402
    MIN_NONZERO,
    ORIENTATIONS,
    Noise,
    Placement,
    distance_from_theorem1,
    draw_noise,
    gaussian_delta,
    hockey_stick_mc,
    hockey_stick_terms,
    log_likelihood_ratio,
    placement,
    sample_losses,
    theorem1_placement,
    tilt_for,
)

#: Ball radius: diameter 1 is the sensitivity, so the analysis sigma is the noise std.
RADIUS = 0.5
#: Closer than this counts as Theorem 1's pair itself (its ratio is 1 by construction).
NEAR = 0.01
#: A placement this far from Theorem 1's pair (``distance_from_theorem1``) counts as "far"; the
#: constrained climbs are penalised below it.
FAR = 0.1
#: A second, farther threshold (placements unlike Theorem 1's pair).
FARTHER = 0.3
#: Distance thresholds of the rechecked leaders and of the summary.
THRESHOLDS = (0.0, NEAR, FAR, FARTHER)
#: Placements the search's own noise scored above 1 (at distance >= NEAR) are rechecked too, at
#: most this many per epsilon beyond the leaders.
MAX_ABOVE = 2
ABOVE = "above 1 on the search noise"
#: Every recheck nominally above 1 is rechecked deep, the largest first, up to this many.
MAX_DEEP = 30
#: Standard errors in every reported error bar.
K_SE = 3.0
#: A ratio counts as above 1 only beyond this: Theorem 1's pair itself (which the climbs reach
#: exactly, by putting users onto one another) scores 1 up to floating-point rounding.
ROUNDING = 1e-9
#: ``n 2^(n-1)`` at and below which a sample costs about the same (permutation sums, n <= 5).
_CHEAP = 80


def draws(base: int, n: int) -> int:
    """Draws for ``n`` users given ``base`` draws for ``n <= 5``: scaled by
    ``sqrt(80 / (n 2^(n-1)))`` above (the oracle's subset recursion costs ``n 2^(n-1)`` products
    per sample), so ``n = 9`` gets about a fifth; a multiple of 100, at least 1,000."""
    scale = min(1.0, math.sqrt(_CHEAP / (n * 2 ** (n - 1))))
    return max(1_000, int(round(base * scale / 100)) * 100)


# --- Theorem 1's pair: the reference curve -------------------------------------------------


@dataclass
class Reference:
    """Theorem 1's pair at one (n, sigma): its delta in both orientations at the target epsilons."""

    n: int
    sigma: float
    targets: list[float]
    eps: list[float]
    forward: list[float]
    reverse: list[float]

    @property
    def symmetric(self) -> np.ndarray:
        """The symmetrised profile: the larger orientation at each epsilon."""
        return np.maximum(self.forward, self.reverse)


def reference(n: int, sigma: float, targets: list[float]) -> Reference:
    """Epsilons where the symmetrised delta of Theorem 1's pair equals each target (bisection).

    Targets above ``delta(0)`` are dropped. Cached per process (the pair takes up to seconds).
    """
    return _reference(n, sigma, tuple(targets))


@functools.lru_cache(maxsize=64)
def _reference(n: int, sigma: float, targets: tuple[float, ...]) -> Reference:
    pair = shuffle_gaussian_pair(n=n, sigma=sigma)

    def sym(e: float) -> float:
        return float(pair.delta_symmetric(e)[0])

    kept, eps = [], []
    for t in targets:
        if sym(0.0) <= t:
            continue
        lo, hi = 0.0, 1.0
        while sym(hi) > t:
            hi *= 2.0
        for _ in range(60):
            mid = 0.5 * (lo + hi)
            lo, hi = (mid, hi) if sym(mid) > t else (lo, mid)
        kept.append(t)
        eps.append(round(0.5 * (lo + hi), 4))
    e = np.array(eps)
    return Reference(n, sigma, kept, eps, pair.delta_remove(e).tolist(), pair.delta_add(e).tolist())


# --- placements as arrays of points ----------------------------------------------------------


def clip_to_ball(points: np.ndarray) -> np.ndarray:
    """Scale every point outside the ball of radius :data:`RADIUS` back onto its sphere."""
    norms = np.linalg.norm(points, axis=1, keepdims=True)
    return points * np.minimum(1.0, RADIUS / np.maximum(norms, 1e-300))


def as_placement(points: np.ndarray, noise: float) -> Placement:
    """Points ``x, x', y_1, ..., y_{n-1}`` (rows) to a placement."""
    return placement(points[0], points[1], points[2:], noise)


def distance(points: np.ndarray) -> float:
    """Distance from Theorem 1's pair or its mirror (``distance_from_theorem1``, diameter 1)."""
    return distance_from_theorem1(as_placement(points, 1.0), 2 * RADIUS)


#: Kinds of random starting placements, used in turn.
KINDS = ("ball", "sphere", "antipodal", "near the pair")


def random_points(n: int, d: int, rng: np.random.Generator, kind: str) -> np.ndarray:
    """``n + 1`` random points in the ball of ``R^d``.

    ``ball``: uniform; ``sphere``: uniform on the sphere; ``antipodal``: ``x' = -x`` on the
    sphere, the others uniform; ``near the pair``: Theorem 1's pair across a random diameter,
    every point moved by ``N(0, 0.1^2)`` per coordinate (then clipped).
    """
    g = rng.standard_normal((n + 1, d))
    g /= np.linalg.norm(g, axis=1, keepdims=True)
    if kind == "sphere":
        return RADIUS * g
    if kind == "near the pair":
        pts = np.tile(-RADIUS * g[0], (n + 1, 1))
        pts[1] = RADIUS * g[0]
        return clip_to_ball(pts + 0.1 * rng.standard_normal(pts.shape))
    pts = RADIUS * g * rng.uniform(size=(n + 1, 1)) ** (1.0 / d)
    if kind == "antipodal":
        pts[0] = RADIUS * g[0]
        pts[1] = -pts[0]
    return pts


# --- results --------------------------------------------------------------------------------


@dataclass
class Found:
    """One placement's result at one epsilon."""

    eps: float
    target: float
    ratio: float
    stderr: float
    delta: float
    delta_theorem1: float
    orientation: str
    estimator: str
    samples: int
    distance: float
    origin: str
    points: list[list[float]]
    group: str = ""


@dataclass
class Climb:
    """One climb's end on the search noise."""

    eps: float
    objective: str
    start: str
    value: float
    ratio: float
    distance: float
    evaluations: int


@dataclass
class Cell:
    """Everything one (n, d, sigma) search produced."""

    n: int
    dim: int
    sigma: float
    reference: Reference
    samples: int = 0
    evaluations: int = 0
    seconds: float = 0.0
    climbs: list[Climb] = field(default_factory=list)
    rechecked: list[Found] = field(default_factory=list)
    above: list[int] = field(default_factory=list)


@dataclass
class Row:
    """One estimator: per-sample values, the exact offset added to their mean, its name, and
    the parts (the placement's and the control's terms) whose support decides eligibility."""

    values: np.ndarray
    offset: np.ndarray
    name: str
    parts: list[np.ndarray]
    control: str | None = None


class Problem:
    """The search objective at one (n, d, sigma) on a fixed noise sample (common random numbers)."""

    def __init__(self, ref: Reference, dim: int, samples: int, seed: int) -> None:
        self.ref = ref
        self.n = ref.n
        self.dim = dim
        self.eps = np.array(ref.eps)
        self.sym = ref.symmetric
        # Importance sampling: a defensive mixture shifted for each epsilon's rare event.
        self.shifts = sorted(
            {round(b, 2) for e in ref.eps if (b := tilt_for(self.n, ref.sigma, e)) > 0.25}
        )
        self.z = self.noise(np.random.default_rng(seed), samples)
        self.evaluations = 0
        t1 = theorem1_placement(self.n, ref.sigma, dim=dim)
        mirror = theorem1_placement(self.n, ref.sigma, dim=dim, mirror=True)
        self.controls = [
            ("Theorem 1", hockey_stick_terms(*sample_losses(t1, self.z), self.eps),
             np.array([ref.forward, ref.reverse])),
            ("mirror", hockey_stick_terms(*sample_losses(mirror, self.z), self.eps),
             np.array([ref.reverse, ref.forward])),
        ]  # fmt: skip
        # The control each orientation's objective is shifted by: the one whose exact value is
        # the symmetrised delta, so that Theorem 1's pair and its mirror score exactly 1.
        self.shift = np.zeros((2, self.eps.size))
        for i, measure in ((0, 0), (1, 1)):
            for _, terms, exact in self.controls:
                use = exact[i] >= self.sym - 1e-300
                mc = terms[i, measure].mean(axis=0)
                self.shift[i] = np.where(use, exact[i] - mc, self.shift[i])

    def noise(self, rng: np.random.Generator, samples: int) -> Noise:
        """Draws for this cell's dimension and importance-sampling shifts."""
        return draw_noise(rng, samples, self.n, self.dim, self.shifts)

    def terms(self, points: np.ndarray, z: Noise | None = None) -> np.ndarray:
        """Per-sample estimator terms of a placement (in its canonical frame)."""
        pl = as_placement(points, self.ref.sigma)
        return hockey_stick_terms(*sample_losses(pl, self.z if z is None else z), self.eps)

    def ratios(self, points: np.ndarray, count: bool = True) -> np.ndarray:
        """``delta_placement / delta_Theorem1`` at each epsilon (larger orientation), on ``z``
        (counted in :attr:`evaluations` unless ``count`` is false)."""
        self.evaluations += int(count)
        t = self.terms(points)
        fwd = t[0, 0].mean(axis=0) + self.shift[0]
        rev = t[1, 1].mean(axis=0) + self.shift[1]
        return np.maximum(fwd, rev) / self.sym

    def menu(self, t: np.ndarray, z: Noise, labels: set[str] | None = None) -> list[list[Row]]:
        """Every estimator of both orientations.

        Per orientation, ten: plain (two measures), and the paired difference with Theorem 1's
        pair or its mirror in either orientation (two measures each) plus the control's exact
        value as the offset. ``t`` are the placement's terms on the noise ``z``; ``labels``
        limits the controls computed on fresh noise (``"Theorem 1"``, ``"mirror"``).
        """
        ctrl = self.controls if z is self.z else self._controls_on(z, labels)
        out = []
        for i in range(2):
            bounded_first = (0, 1) if i == 0 else (1, 0)
            rows = [
                Row(t[i, m], np.zeros(self.eps.size), f"plain {_measure(i, m)}", [t[i, m]])
                for m in bounded_first
            ]
            for label, terms, exact in ctrl:
                for j in range(2):
                    for m in range(2):
                        name = f"{_measure(i, m)} minus {label} {ORIENTATIONS[j]} (exact)"
                        parts = [t[i, m], terms[j, m]]
                        rows.append(Row(t[i, m] - terms[j, m], exact[j], name, parts, label))
            out.append(rows)
        return out

    def _controls_on(
        self, z: Noise, labels: set[str] | None
    ) -> list[tuple[str, np.ndarray, np.ndarray]]:
        t1 = theorem1_placement(self.n, self.ref.sigma, dim=self.dim)
        mirror = theorem1_placement(self.n, self.ref.sigma, dim=self.dim, mirror=True)
        return [
            (label, hockey_stick_terms(*sample_losses(pl, z), self.eps), exact)
            for (label, _, exact), pl in zip(self.controls, (t1, mirror), strict=True)
            if labels is None or label in labels
        ]


def _measure(orientation: int, measure: int) -> str:
    names = {
        (0, 0): "E_P[(1-a/L)+]",
        (0, 1): "E_Q[(L-a)+]",
        (1, 0): "E_P[(1/L-a)+]",
        (1, 1): "E_Q[(1-aL)+]",
    }
    return names[(orientation, measure)]


# --- the optimiser ----------------------------------------------------------------------------


def hill_climb(
    f: Callable[[np.ndarray], float],
    points: np.ndarray,
    rng: np.random.Generator,
    *,
    budget: int,
    step: float = 0.15,
    min_step: float = 0.004,
) -> tuple[np.ndarray, float, int]:
    """A (1+1) hill climb (maximise ``f``) over placements in the ball.

    Each trial moves one user by ``N(0, step^2)`` per coordinate (half the trials), every user
    by ``N(0, step^2 / (n + 1))`` (three in ten), or puts one of the other users onto another
    point (one in five: shapes where users coincide, like Theorem 1's pair, are otherwise hard
    to reach); the
    result is clipped to the ball and kept if ``f`` improves. The step grows by 1.3 after a
    success and shrinks by 0.93 after a failure (a success rate near one in five keeps it);
    stop after ``budget`` evaluations or below ``min_step``.

    Returns:
        ``(points, f(points), evaluations)``.
    """
    points = clip_to_ball(points)
    best = f(points)
    used = 1
    m = points.shape[0]
    while used < budget and step >= min_step:
        trial = points.copy()
        u = rng.uniform()
        if u < 0.5:
            i = rng.integers(m)
            trial[i] += step * rng.standard_normal(trial.shape[1])
        elif u < 0.8:
            trial += step / math.sqrt(m) * rng.standard_normal(trial.shape)
        elif m > 2:
            i = rng.integers(2, m)  # one of the other users, onto any other point
            j = (i + rng.integers(1, m)) % m
            trial[i] = trial[j]
        trial = clip_to_ball(trial)
        value = f(trial)
        used += 1
        if value > best:
            points, best = trial, value
            step = min(0.5, step * 1.3)
        else:
            step *= 0.93
    return points, best, used


def coordinate_search(
    f: Callable[[np.ndarray], float],
    points: np.ndarray,
    *,
    budget: int,
    step: float = 0.05,
    min_step: float = 0.003,
) -> tuple[np.ndarray, float, int]:
    """Coordinate search (maximise ``f``): try ``+-step`` on each coordinate of each user, keep
    the first improvement (clipped to the ball), halve the step after a sweep without one; stop
    at ``min_step`` or after ``budget`` evaluations.

    Returns:
        ``(points, f(points), evaluations)``.
    """
    points = clip_to_ball(points)
    best = f(points)
    used = 1
    while step >= min_step and used < budget:
        improved = False
        for i, k in itertools.product(range(points.shape[0]), range(points.shape[1])):
            for sign in (1.0, -1.0):
                trial = points.copy()
                trial[i, k] += sign * step
                trial = clip_to_ball(trial)
                value = f(trial)
                used += 1
                if value > best:
                    points, best, improved = trial, value, True
                    break
            if used >= budget:
                break
        if not improved:
            step /= 2.0
    return points, best, used


def _pick(rows: list[Row], j: int) -> int:
    """The estimator with the smallest sample standard deviation at epsilon ``j`` among those
    whose parts each have at least :data:`MIN_NONZERO` non-zero terms (a rare-event estimator
    whose pilot terms are nearly all zero would otherwise look exact; a paired difference that
    is exactly zero is fine); the first (plain, bounded) one if none qualifies."""
    best, best_sd = 0, math.inf
    for k, row in enumerate(rows):
        if any(np.count_nonzero(part[:, j]) < MIN_NONZERO for part in row.parts):
            continue
        sd = float(row.values[:, j].std(ddof=1))
        if sd < best_sd:
            best, best_sd = k, sd
    return best


def recheck(
    problem: Problem, points: np.ndarray, j: int, samples: int, seed: int, origin: str
) -> Found:
    """Re-estimate a placement's ratio at epsilon ``j`` on fresh noise.

    A pilot on the search noise picks, for each orientation, the estimator with the smallest
    standard error; that estimator alone is then evaluated on ``samples`` fresh draws (in
    chunks). Reports the orientation with the larger ratio.
    """
    pilot = problem.menu(problem.terms(points), problem.z)
    chosen = [rows[_pick(rows, j)] for rows in pilot]
    labels = {row.control for row in chosen if row.control is not None}
    rng = np.random.default_rng(seed)
    sums = np.zeros(2)
    squares = np.zeros(2)
    done = 0
    while done < samples:
        size = min(50_000, samples - done)
        z = problem.noise(rng, size)
        rows = problem.menu(problem.terms(points, z), z, labels)
        for i in range(2):
            values = next(r for r in rows[i] if r.name == chosen[i].name).values[:, j]
            sums[i] += values.sum()
            squares[i] += np.square(values).sum()
        done += size
    mean = sums / done
    stderr = np.sqrt(np.maximum(squares / done - mean**2, 0.0) / (done - 1))
    offsets = [float(chosen[i].offset[j]) for i in range(2)]
    names = [chosen[i].name for i in range(2)]
    best: Found | None = None
    pl = as_placement(points, problem.ref.sigma)
    for i in range(2):
        delta = float(mean[i]) + offsets[i]
        ratio = delta / problem.sym[j]
        found = Found(
            eps=float(problem.eps[j]),
            target=problem.ref.targets[j],
            ratio=float(ratio),
            stderr=float(stderr[i] / problem.sym[j]),
            delta=delta,
            delta_theorem1=float(problem.sym[j]),
            orientation=ORIENTATIONS[i],
            estimator=names[i],
            samples=samples,
            distance=distance_from_theorem1(pl, 2 * RADIUS),
            origin=origin,
            points=np.round(points, 6).tolist(),
        )
        if best is None or found.ratio > best.ratio:
            best = found
    assert best is not None
    return best


def _key(points: np.ndarray) -> tuple[float, ...]:
    """A placement's points rounded to 1e-3, to tell placements apart."""
    return tuple(np.round(points, 3).ravel().tolist())


def _leaders(
    archive: list[tuple[np.ndarray, np.ndarray, float, str]], j: int, top: int
) -> list[tuple[np.ndarray, np.ndarray, float, str]]:
    """The ``top`` distinct placements (points rounded to 1e-3) with the largest ratio at ``j``."""
    out, seen = [], set()
    for a in sorted(archive, key=lambda a: a[1][j], reverse=True):
        key = _key(a[0])
        if key not in seen:
            seen.add(key)
            out.append(a)
        if len(out) == top:
            break
    return out


@dataclass
class Budget:
    """The optimiser's effort per cell and epsilon, and the rechecks' draws (for ``n <= 5``)."""

    samples: int = 6_000
    restarts: int = 4
    climb: int = 50
    polish: int = 60
    recheck: int = 40_000
    seed: int = 0


def run_cell(n: int, dim: int, sigma: float, targets: list[float], budget: Budget) -> Cell:
    """Search one (n, d, sigma) cell: for each epsilon, random-restart hill climbing and a
    coordinate search, unconstrained and away from the pair; then recheck the leaders."""
    start = time.perf_counter()
    seq = np.random.SeedSequence([budget.seed, n, dim, round(sigma * 1000)])
    s_noise, s_random, s_recheck = (int(s.generate_state(1)[0]) for s in seq.spawn(3))
    ref = reference(n, sigma, targets)
    cell = Cell(n, dim, sigma, ref, samples=draws(budget.samples, n))
    if not ref.eps:
        return cell
    problem = Problem(ref, dim, cell.samples, s_noise)
    rng = np.random.default_rng(s_random)
    archive: list[tuple[np.ndarray, np.ndarray, float, str]] = []
    state = {"origin": ""}

    def evaluate(points: np.ndarray) -> np.ndarray:
        r = problem.ratios(points)
        archive.append((points, r, distance(points), state["origin"]))
        return r

    for j, eps in enumerate(ref.eps):
        for objective in ("worst", f"worst at distance >= {FAR}"):
            penalised = objective != "worst"

            def f(points: np.ndarray, j: int = j, penalised: bool = penalised) -> float:
                r = float(evaluate(points)[j])
                return r - max(0.0, FAR - archive[-1][2]) if penalised else r

            ends = []
            for r_i in range(budget.restarts):
                kind = KINDS[r_i % len(KINDS)]
                state["origin"] = f"hill climb ({objective}) from {kind}"
                pts = random_points(n, dim, rng, kind)
                pts, value, used = hill_climb(f, pts, rng, budget=budget.climb)
                ends.append((value, pts, kind, used))
                cell.climbs.append(
                    Climb(eps, objective, kind, value, float(problem.ratios(pts, count=False)[j]),
                          distance(pts), used)
                )  # fmt: skip
            value, pts, kind, _ = max(ends, key=lambda e: e[0])
            state["origin"] = f"coordinate search ({objective}) after hill climb from {kind}"
            pts, value, used = coordinate_search(f, pts, budget=budget.polish)
            cell.climbs.append(
                Climb(eps, objective, f"coordinate search after {kind}", value,
                      float(problem.ratios(pts, count=False)[j]), distance(pts), used)
            )  # fmt: skip
    for j in range(len(ref.eps)):
        above = [a for a in archive if a[1][j] > 1.0 + ROUNDING and a[2] >= NEAR]
        cell.above.append(len({_key(a[0]) for a in above}))
        chosen: dict[tuple[float, ...], tuple[str, tuple[np.ndarray, np.ndarray, float, str]]] = {}
        for lo in THRESHOLDS:
            for a in _leaders([a for a in archive if a[2] >= lo], j, 1):
                chosen.setdefault(_key(a[0]), (f"largest at distance >= {lo}", a))
        extra = [a for a in _leaders(above, j, MAX_ABOVE + len(THRESHOLDS))
                 if _key(a[0]) not in chosen]  # fmt: skip
        for a in extra[:MAX_ABOVE]:
            chosen[_key(a[0])] = (ABOVE, a)
        for k, (group, a) in enumerate(chosen.values()):
            found = recheck(
                problem, a[0], j, draws(budget.recheck, n), s_recheck + 100 * j + k, a[3]
            )
            found.group = group
            cell.rechecked.append(found)
    cell.evaluations = problem.evaluations
    cell.seconds = time.perf_counter() - start
    return cell


# --- validation and the counterexample ---------------------------------------------------


def validate_recursion(rng: np.random.Generator, top: int = 9) -> tuple[list[str], float]:
    """The oracle's subset recursion against the sum over the ``n!`` orderings, ``n = 2 .. top``:
    random placements in ``R^3``, outputs drawn from ``M(D')`` (fewer at ``n = 9``: 9! terms)."""
    lines = ["| n | sigma | outputs | largest abs. difference of log L |", "|---|---|---|---|"]
    worst = 0.0
    for n in range(2, top + 1):
        for s in (0.3, 1.0):
            pts = random_points(n, 3, rng, "ball")
            pl = as_placement(pts, s)
            count = 4 if n == 9 else 20
            v = pl.means("D'")[None] + s * rng.standard_normal((count, n, 3))
            diff = np.abs(
                log_likelihood_ratio(v, pl, "subsets") - log_likelihood_ratio(v, pl, "permutations")
            ).max()
            worst = max(worst, float(diff))
            lines.append(f"| {n} | {s} | {count} | {diff:.1e} |")
    return lines, worst


def validate(samples: int, quick: bool = False) -> list[str]:
    """The oracle against exact values: the recursion, ``n = 1`` (analytic) and Theorem 1's pair
    (quadrature at ``n = 2, 3``, the package's pair at ``n = 5, 9``); ``quick``: the recursion
    up to ``n = 7`` and the pair at ``n = 2, 5`` only."""
    lines, worst_log = validate_recursion(np.random.default_rng(5), 7 if quick else 9)
    lines += [
        "",
        "| case | sigma | eps | orientation | oracle | exact | z |",
        "|---|---|---|---|---|---|---|",
    ]
    eps = np.array([0.0, 0.5, 1.0, 2.0])
    worst = 0.0
    for s in (0.5, 1.0, 2.0):
        pl = placement([0.0, 0.0], [0.6, 0.8], [], s)
        r = hockey_stick_mc(pl, eps, samples=samples, seed=11)
        analytic = gaussian_delta(eps, s)
        for o in ORIENTATIONS:
            for e, est, ex in zip(eps, r[o], analytic, strict=True):
                z = (est.delta - ex) / est.stderr if est.stderr > 0 else 0.0
                worst = max(worst, abs(z))
                lines.append(
                    f"| n=1 (analytic) | {s} | {e} | {o} | {est.delta:.5f} ± {est.stderr:.5f}"
                    f" | {ex:.5f} | {z:+.2f} |"
                )
    users = (2, 5) if quick else (2, 3, 5, 9)
    cases: list[tuple[int, float, bool]] = [(n, s, False) for n in users for s in (0.5, 1.0)]
    if not quick:
        cases.append((9, 0.5, True))
    worst_rare = 0.0
    for n, s, moved in cases:
        # At the search's epsilons, with its importance sampling, in two dimensions.
        ref = reference(n, s, [0.1, 0.01, 0.001])
        e_ref = np.array(ref.eps)
        shifts = [b for e in ref.eps if (b := tilt_for(n, s, e)) > 0.25]
        pl = theorem1_placement(n, s, dim=2)
        label = f"Theorem 1 n={n}"
        if moved:  # others apart by 1e-7: the general recursion, not the common-value shortcut
            others = pl.others + 1e-7 * np.arange(n - 1)[:, None]
            pl = placement(pl.x, pl.x_prime, others, s)
            label += ", others 1e-7 apart"
        r = hockey_stick_mc(pl, e_ref, samples=draws(samples, n), seed=12 + n, shifts=shifts)
        exact: dict[str, np.ndarray]
        if n <= 3:
            exact = {
                "forward": shuffle_hockey_quadrature(n, s, e_ref, "remove"),
                "reverse": shuffle_hockey_quadrature(n, s, e_ref, "add"),
            }
            label += " (quadrature)"
        else:
            exact = {"forward": np.array(ref.forward), "reverse": np.array(ref.reverse)}
            label += " (package pair)"
        for o in ORIENTATIONS:
            for e, est, ex, sym in zip(e_ref, r[o], exact[o], ref.symmetric, strict=True):
                z = (est.delta - ex) / est.stderr if est.stderr > 0 else 0.0
                if ex >= 0.1 * sym:
                    worst = max(worst, abs(z))
                else:
                    worst_rare = max(worst_rare, abs(z))
                lines.append(
                    f"| {label} | {s} | {e} | {o} | {est.delta:.6f} ± {est.stderr:.6f}"
                    f" | {ex:.6f} | {z:+.2f} |"
                )
    lines.append(
        f"\nrecursion against the n! orderings: largest |difference| of log L {worst_log:.1e};"
        f" largest |z| (estimate - exact, in standard errors): {worst:.2f}; where the orientation's"
        f" exact delta is below a tenth of the symmetrised one (rare events that the importance"
        f" sampling does not target, irrelevant to the ratio): {worst_rare:.2f}"
    )
    return lines


def counterexample(samples: int) -> list[str]:
    """The review's placement under the paper's convention and what replace-one gives."""
    lines = [
        "| n | noise/C | orientation | placement delta(1) | Theorem 1 at sigma=noise/C"
        " (remove / add) | Theorem 1 at sigma=noise/2C (symmetrised) |",
        "|---|---|---|---|---|---|",
    ]
    for n, s in ((2, 1.0), (3, 0.5)):
        e1 = np.array([1.0, 0.0])
        pl = placement(np.zeros(2), e1, np.tile(-e1, (n - 1, 1)), s)
        r = hockey_stick_mc(pl, [1.0], samples=samples, seed=21)
        paper = shuffle_gaussian_pair(n=n, sigma=s)
        replace = shuffle_gaussian_pair(n=n, sigma=s / 2)
        for o in ORIENTATIONS:
            est = r[o][0]
            lines.append(
                f"| {n} | {s} | {o} | {est.delta:.4f} ± {K_SE * est.stderr:.4f} |"
                f" {paper.delta_remove(1.0)[0]:.4f} / {paper.delta_add(1.0)[0]:.4f} |"
                f" {replace.delta_symmetric(1.0)[0]:.4f} |"
            )
    return lines


# --- driver -------------------------------------------------------------------------------


def _cell_from(saved: dict[str, Any]) -> Cell:
    """A :class:`Cell` from its ``--json`` record."""
    return Cell(
        n=saved["n"],
        dim=saved["dim"],
        sigma=saved["sigma"],
        reference=Reference(**saved["reference"]),
        samples=saved["samples"],
        evaluations=saved["evaluations"],
        seconds=saved["seconds"],
        climbs=[Climb(**c) for c in saved["climbs"]],
        rechecked=[Found(**f) for f in saved["rechecked"]],
        above=saved["above"],
    )


def _fmt(f: Found) -> str:
    return f"{f.ratio:.4f} ± {K_SE * f.stderr:.4f}"


def _where(c: Cell, f: Found) -> str:
    return (
        f"n={c.n} d={c.dim} sigma={c.sigma} eps={f.eps} (delta={f.target:g}), {f.orientation},"
        f" distance {f.distance:.3f}"
    )


def _largest(rechecked: list[tuple[Cell, Found]], lo: float) -> tuple[Cell, Found] | None:
    pool = [cf for cf in rechecked if cf[1].distance >= lo]
    return max(pool, key=lambda cf: cf[1].ratio) if pool else None


def main() -> None:
    """Parse the options, run the four parts and print their tables."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--n", type=int, nargs="+", default=[2, 3, 5, 9], help="users (<= 10)")
    p.add_argument("--dim", type=int, nargs="+", default=[1, 2, 3], help="dimensions")
    p.add_argument("--sigma", type=float, nargs="+", default=[0.3, 0.8, 2.0])
    p.add_argument("--targets", type=float, nargs="+", default=[0.1, 0.01, 0.001],
                   help="Theorem 1's symmetrised delta at the epsilons searched")  # fmt: skip
    b = Budget()
    p.add_argument("--samples", type=int, default=b.samples,
                   help="noise draws of the search (n <= 5; fewer above, see draws())")  # fmt: skip
    p.add_argument("--restarts", type=int, default=b.restarts,
                   help="hill climbs per epsilon and objective")  # fmt: skip
    p.add_argument("--climb", type=int, default=b.climb, help="evaluations per hill climb")
    p.add_argument("--polish", type=int, default=b.polish,
                   help="evaluations of the coordinate search after the climbs")  # fmt: skip
    p.add_argument("--recheck", type=int, default=b.recheck, help="fresh draws per recheck")
    p.add_argument("--deep", type=int, default=1_000_000, help="draws of the final rechecks")
    p.add_argument("--jobs", type=int, default=1, help="processes over the cells")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--validate-samples", type=int, default=300_000)
    p.add_argument("--skip-validation", action="store_true")
    p.add_argument("--quick", action="store_true",
                   help="n = 2, 4 at d = 2, sigma = 1, small budgets and a shorter validation"
                        " (under a minute)")  # fmt: skip
    p.add_argument("--json", type=Path, help="write every result here")
    p.add_argument("--resume", type=Path,
                   help="read part 3 from this --json file, print it, run part 4")  # fmt: skip
    args = p.parse_args()
    if args.quick:
        args.n, args.dim, args.sigma = [2, 4], [2], [1.0]
        args.samples, args.restarts, args.climb, args.polish = 3_000, 2, 30, 30
        args.recheck, args.deep, args.validate_samples = 20_000, 100_000, 30_000
    budget = Budget(args.samples, args.restarts, args.climb, args.polish, args.recheck, args.seed)
    t0 = time.perf_counter()
    out: dict[str, object] = {"options": {k: str(v) for k, v in vars(args).items()}}
    cells: list[Cell] = []
    if args.resume:
        saved = json.loads(args.resume.read_text())
        cells = [_cell_from(c) for c in saved["cells"]]
        out["resumed"] = {"from": str(args.resume), "options": saved["options"]}
        print(f"## 3. The optimiser: {len(cells)} cells read from {args.resume}")
    else:
        if not args.skip_validation:
            print("## 1. The oracle against exact values\n", flush=True)
            lines = validate(args.validate_samples, quick=args.quick)
            print("\n".join(lines), flush=True)
            print(f"\n({time.perf_counter() - t0:.0f} s)\n", flush=True)
        print("## 2. The review's counterexample (paper's convention, C = 1)\n", flush=True)
        lines = counterexample(max(args.validate_samples, 30_000))
        print("\n".join(lines) + "\n", flush=True)
        print(
            "## 3. The optimiser (ball of diameter 1 = sensitivity, replace-one, sigma = noise)\n"
        )
        jobs = [(n, d, s) for n in args.n for d in args.dim for s in args.sigma]
        with ProcessPoolExecutor(max_workers=args.jobs) as pool:
            futures = [pool.submit(run_cell, n, d, s, args.targets, budget) for n, d, s in jobs]
            for k, fut in enumerate(as_completed(futures), 1):
                c = fut.result()
                cells.append(c)
                top = max(c.rechecked, key=lambda f: f.ratio, default=None)
                far = max((f for f in c.rechecked if f.distance >= FAR), key=lambda f: f.ratio,
                          default=None)  # fmt: skip
                print(
                    f"[{k}/{len(jobs)}] n={c.n} d={c.dim} sigma={c.sigma}: {c.evaluations}"
                    f" placements on {c.samples} draws, {c.seconds:.0f} s; rechecked: largest"
                    f" {_fmt(top) if top else '-'} (distance {top.distance if top else 0:.3f}),"
                    f" at distance >= {FAR} {_fmt(far) if far else '-'};"
                    f" {time.perf_counter() - t0:.0f} s in all",
                    flush=True,
                )
    cells.sort(key=lambda c: (c.n, c.dim, c.sigma))
    print(
        "\nRatios delta_placement / delta_Theorem1 on fresh noise (±3 se): the largest rechecked"
        f" placement (its distance from Theorem 1's pair or its mirror), and the largest at"
        f" distance >= {NEAR}, >= {FAR} and >= {FARTHER}.\n"
    )
    print(
        f"| n | d | sigma | eps | Theorem 1 delta | largest (distance) | >= {NEAR} | >= {FAR} |"
        f" >= {FARTHER} |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for c in cells:
        for e in c.reference.eps:
            at = [(c, f) for f in c.rechecked if f.eps == e]
            best = [_largest(at, lo) for lo in THRESHOLDS]
            a_ = best[0]
            assert a_ is not None
            cols = [_fmt(b_[1]) if b_ else "-" for b_ in best[1:]]
            print(
                f"| {c.n} | {c.dim} | {c.sigma} | {e} | {a_[1].delta_theorem1:.4g} |"
                f" {_fmt(a_[1])} ({a_[1].distance:.3f}) | {' | '.join(cols)} |"
            )
    total = sum(c.evaluations for c in cells)
    print(f"\nplacements evaluated: {total}; cells: {len(cells)}")
    climbs = [(c, cl) for c in cells for cl in c.climbs]
    for objective in ("worst", f"worst at distance >= {FAR}"):
        ends = [(c, cl) for c, cl in climbs if cl.objective == objective]
        polish = [(c, cl) for c, cl in ends if cl.start.startswith("coordinate search")]
        near = sum(1 for _, cl in polish if cl.distance < FAR)
        top_end = max(polish, key=lambda t: t[1].ratio, default=None)
        print(
            f"objective '{objective}': {len(ends) - len(polish)} hill climbs and {len(polish)}"
            f" coordinate searches; {near} of the latter ended within {FAR} of Theorem 1's pair;"
            f" the largest end ratio (search noise) "
            + (
                f"{top_end[1].ratio:.4f} at n={top_end[0].n} d={top_end[0].dim}"
                f" sigma={top_end[0].sigma} eps={top_end[1].eps}, distance"
                f" {top_end[1].distance:.3f}"
                if top_end
                else "-"
            )
        )
    rechecked = [(c, f) for c in cells for f in c.rechecked]
    print(f"\nrechecks on fresh noise: {len(rechecked)} ({args.recheck} draws each at n <= 5)")
    scored = sum(sum(c.above) for c in cells)
    again = [f for _, f in rechecked if f.group == ABOVE]
    top_again = max(again, key=lambda f: f.ratio, default=None)
    print(
        f"  placements at distance >= {NEAR} scored above 1 on the search's noise: {scored}"
        f" (distinct per eps); rechecked as extras: {len(again)}; largest of those:"
        f" {_fmt(top_again) if top_again else '-'}"
    )
    for lo in THRESHOLDS:
        cf = _largest(rechecked, lo)
        if cf:
            print(f"  largest ratio (distance >= {lo}): {_fmt(cf[1])} at {_where(*cf)}")
    print(f"\nlargest rechecked ratio at distance >= {FAR}, per n:")
    for n in sorted({c.n for c in cells}):
        cf = _largest([cf for cf in rechecked if cf[0].n == n], FAR)
        if cf:
            print(f"  n={n}: {_fmt(cf[1])} at {_where(*cf)}")
    over = [cf for cf in rechecked if cf[1].ratio - K_SE * cf[1].stderr > 1.0 + ROUNDING]
    print("\n## 4. Deep rechecks\n")
    deep: list[tuple[Cell, Found]] = []
    picks: list[tuple[Cell, Found]] = []

    def add(cands: list[tuple[Cell, Found]], count: int) -> None:
        fresh = [cf for cf in cands if all(cf[1] is not q[1] for q in picks)]
        picks.extend(sorted(fresh, key=lambda cf: -cf[1].ratio)[:count])

    for lo in (NEAR, FAR, FARTHER):  # the largest away from the pair, far, farther
        add([cf for cf in rechecked if cf[1].distance >= lo], 1)
    add([cf for cf in rechecked if cf[1].ratio > 1.0 + ROUNDING], MAX_DEEP)  # nominally above 1
    add(over, 10)  # above 1 beyond 3 se
    deep_of: dict[int, Found] = {}
    for c, f in picks:
        ref = reference(c.n, c.sigma, [f.target])
        problem = Problem(ref, c.dim, draws(args.samples, c.n), args.seed + 7)
        g = recheck(problem, np.array(f.points), 0, draws(args.deep, c.n), args.seed + 99,
                    f.origin)  # fmt: skip
        g.group = f.group
        deep.append((c, g))
        deep_of[id(f)] = g
        print(
            f"{_where(c, g)}: ratio {_fmt(g)} ({g.samples} draws, {g.estimator}; first recheck"
            f" {_fmt(f)}, {f.orientation}); delta {g.delta:.5g} vs Theorem 1"
            f" {g.delta_theorem1:.5g}; placement"
            f" {as_placement(np.array(g.points), c.sigma).describe()}",
            flush=True,
        )
    final = [(c, deep_of.get(id(f), f)) for c, f in rechecked]
    print("\nEvery recheck, the deep-rechecked ones at their deep value:")
    for lo in THRESHOLDS:
        cf = _largest(final, lo)
        if cf:
            print(f"  largest ratio (distance >= {lo}): {_fmt(cf[1])} at {_where(*cf)}")
    away = [cf for cf in final if cf[1].distance >= NEAR]
    top_lower = max(away, key=lambda cf: cf[1].ratio - K_SE * cf[1].stderr)
    print(
        f"  largest lower end (ratio - 3 se) at distance >= {NEAR}:"
        f" {top_lower[1].ratio - K_SE * top_lower[1].stderr:.6f} ({_fmt(top_lower[1])}) at"
        f" {_where(*top_lower)}"
    )
    final_over = [cf for cf in final if cf[1].ratio - K_SE * cf[1].stderr > 1.0 + ROUNDING]
    print(
        f"  first rechecks above 1 beyond 3 se: {len(over)}, all rechecked deep; after the deep"
        f" rechecks: {len(final_over)}"
    )
    if final_over:
        print(f"\nFINDING: {len(final_over)} placement(s) above Theorem 1's pair beyond 3 se:")
        for c, f in final_over:
            print(f"  {_fmt(f)} at {_where(c, f)}: {f.points}")
    else:
        print("\nNo placement above Theorem 1's pair beyond 3 standard errors.")
    print(f"\ntotal time: {time.perf_counter() - t0:.0f} s")
    if args.json:
        out["cells"] = [asdict(c) for c in cells]
        out["deep"] = [{"n": c.n, "dim": c.dim, "sigma": c.sigma, **asdict(f)} for c, f in deep]
        args.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
