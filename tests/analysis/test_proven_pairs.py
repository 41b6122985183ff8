"""The pairs of the ``proven`` method against brute-force enumerations, and its floor.

Oracles: the multinomial laws of Theorem 4.1 (arXiv:2012.12803) and of the clones reduction
written out category by category for a handful of users (scipy's multinomial, no code shared
with ``analysis.pld.proven``); and Theorem 1's pair, one realisable placement of the users,
whose optimistic epsilon no sound bound may undercut.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from scipy.stats import multinomial

from shuffle_opacus.analysis.epsilon import compute_epsilon
from shuffle_opacus.analysis.pld import proven as P  # noqa: N812
from shuffle_opacus.analysis.pld.rounds import ShuffleRound


def _add(out: dict, key: tuple, wp: float, wq: float) -> None:
    x = out.setdefault(key, [0.0, 0.0])
    x[0] += wp
    x[1] += wq


def _blanket_brute(n: int, rate: float | None, m: int | None, q: float, p: float) -> np.ndarray:
    """(P, Q) of every outcome (a, b, c, d) of Theorem 4.1's pair, with the sampling."""
    out: dict = {}
    if m is None:  # check-in folded into the randomiser: p' = rate p, q' = rate q
        r = 1.0 if rate is None else rate
        pp, qq = r * p, r * q
        for counts in itertools.product(range(n), repeat=4):
            if sum(counts) != n - 1:
                continue
            w = multinomial.pmf(counts, n - 1, [pp, pp, pp, 1 - 3 * pp])
            a, b, c, d = counts
            _add(out, (a + 1, b, c, d), qq * w, 0.0)
            _add(out, (a, b + 1, c, d), 0.0, qq * w)
            _add(out, (a, b, c + 1, d), (1 - qq) * w, (1 - qq) * w)
        return np.array(list(out.values()))
    inside = m / n
    for k, weight in ((m, 1 - inside), (m - 1, inside)):
        for counts in itertools.product(range(k + 1), repeat=4):
            if sum(counts) != k:
                continue
            w = multinomial.pmf(counts, k, [p, p, p, 1 - 3 * p]) * weight
            a, b, c, d = counts
            if k == m:
                _add(out, (a, b, c, d), w, w)
            else:
                _add(out, (a + 1, b, c, d), q * w, 0.0)
                _add(out, (a, b + 1, c, d), 0.0, q * w)
                _add(out, (a, b, c + 1, d), (1 - q) * w, (1 - q) * w)
    return np.array(list(out.values()))


def _clones_brute(n: int, rate: float | None, m: int | None, eps0: float) -> np.ndarray:
    """(P, Q) of every (a, b) of the clones pair with the participation coins."""
    clone = math.exp(-eps0)
    first = math.exp(eps0) / (math.exp(eps0) + 1)
    out: dict = {}
    if m is None:
        r = 1.0 if rate is None else rate
        branches = [(1 - r, n - 1, r * clone, False), (r, n - 1, r * clone, True)]
    else:
        inside = m / n
        branches = [(1 - inside, m, clone, False), (inside, m - 1, clone, True)]
    for weight, trials, prob, adds in branches:
        for a0, b0, rest in itertools.product(range(trials + 1), repeat=3):
            if a0 + b0 + rest != trials:
                continue
            w = weight * multinomial.pmf([a0, b0, rest], trials, [prob / 2, prob / 2, 1 - prob])
            if adds:
                _add(out, (a0 + 1, b0), first * w, (1 - first) * w)
                _add(out, (a0, b0 + 1), (1 - first) * w, first * w)
            else:
                _add(out, (a0, b0), w, w)
    return np.array(list(out.values()))


def _delta_true(pq: np.ndarray, eps: float) -> float:
    return float(np.sum(np.maximum(pq[:, 0] - math.exp(eps) * pq[:, 1], 0.0)))


def _delta_pair(pair: P.ProvenPair, eps: float) -> float:
    return float(np.sum(pair.mass * np.maximum(1.0 - np.exp(eps - pair.loss), 0.0))) + pair.left


CASES = [
    (4, 0.5, None, 0.5),
    (5, None, None, 1.0),
    (6, None, 3, 0.8),
    (5, 0.3, None, 2.0),
    (6, 0.9, None, 0.4),
    (5, 0.2, None, 0.3),
]


@pytest.mark.parametrize(("n", "rate", "m", "sigma"), CASES)
def test_blanket_pair_bounds_the_brute_force_pair(n, rate, m, sigma):
    setting = ShuffleRound(n=n, sigma=sigma, rate=rate, m=m)
    p = P.blanket_weight(sigma, 0.5)
    truth = _blanket_brute(n, rate, m, P.blanket_mass(sigma), p)
    pair = P.blanket_pair(setting, p, 1e-12)
    for eps in (0.0, 0.05, 0.2, 0.5, 1.0):
        true, bound = _delta_true(truth, eps), _delta_pair(pair, eps)
        assert bound >= true - 1e-12, (eps, true, bound)
        # The enumeration is the pair itself: equal up to the left-out slack.
        assert bound <= true + 1e-9, (eps, true, bound)


@pytest.mark.parametrize(("n", "rate", "m", "sigma"), CASES)
@pytest.mark.parametrize("eps0", [0.5, 2.0])
def test_clones_pair_bounds_the_brute_force_pair(n, rate, m, sigma, eps0):
    setting = ShuffleRound(n=n, sigma=sigma, rate=rate, m=m)
    truth = _clones_brute(n, rate, m, eps0)
    pair = P.proven_pair(setting, eps0, 1e-12)
    for eps in (0.0, 0.1, 0.4, 1.0):
        true, bound = _delta_true(truth, eps), _delta_pair(pair, eps)
        assert true - 1e-12 <= bound <= true + 1e-9, (eps, true, bound)


def test_blanket_scale_bounds_the_sum_of_the_components():
    # G = Q1(x0) + Q1(x1) + Q0 <= c (f0 + f1) for one-dimensional Gaussians at every distance
    # up to the diameter, on a fine grid (docs/maths.md, "A proven bound").
    y = np.linspace(-12.0, 13.0, 20001)
    for sigma in (0.3, 0.45, 0.8, 2.5):
        q = P.blanket_mass(sigma)
        c = P.blanket_scale(q)
        for dist in (1e-3, 0.3, 0.7, 1.0):
            f0 = np.exp(-0.5 * (y / sigma) ** 2)
            f1 = np.exp(-0.5 * ((y - dist) / sigma) ** 2)
            f0, f1 = f0 / f0.sum(), f1 / f1.sum()
            low = np.minimum(f0, f1)
            q1 = 1.0 - low.sum()  # the actual total variation, <= q
            assert q1 <= q + 1e-9
            g = (f0 + f1 - 2 * low) / q + low * (3 - 2 * q1 / q) / (1 - q1)
            assert np.all(g <= c * (f0 + f1) * (1 + 1e-9) + 1e-300)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"mechanism": "checkin", "n": 1000, "rate": 0.05, "sigma": 2.0, "steps": 50},
        {"mechanism": "checkin", "n": 300, "rate": 0.1, "sigma": 1.0, "steps": 10},
        {"mechanism": "shuffle", "n": 50, "sigma": 1.5, "steps": 3},
        {"mechanism": "subsampled", "n": 1000, "m": 100, "sigma": 2.0, "steps": 20},
    ],
)
def test_proven_never_below_the_realisable_pair(kwargs):
    # Theorem 1's pair is one placement of the other users: its optimistic epsilon is a floor.
    proven = compute_epsilon(method="proven", delta=1e-5, **kwargs)
    tight = compute_epsilon(method="pld", delta=1e-5, **kwargs)
    assert proven.epsilon >= tight.epsilon_lower
    assert proven.method == "proven" and proven.kind == "pld"
    assert not any("Theorem 1's pair" in a for a in proven.assumptions)
    assert proven.extra["route"] in P.ROUTES


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"sigma": 0.0}, "sigma must be"),
        ({"sigma": -1.0}, "sigma must be"),
        ({"rate": 1.5}, "rate must be"),
        ({"rate": 0.0}, "rate must be"),
        ({"delta": 1.0}, "delta must be"),
        ({"delta": 0.0}, "delta must be"),
    ],
)
def test_bad_input_is_one_line_naming_the_parameter(kwargs, fragment):
    args = {"n": 100, "rate": 0.1, "sigma": 1.0, "steps": 5, "delta": 1e-5, **kwargs}
    with pytest.raises(ValueError, match=fragment) as err:
        compute_epsilon("checkin", method="proven", **args)
    assert "\n" not in str(err.value)


def test_a_pair_over_its_cell_budget_is_refused_and_its_route_skipped(monkeypatch):
    """A tiny delta widens the windows (n = 1000, delta = 1e-50 asked for 5e8 cells, over
    20 GB): past MAX_PAIR_CELLS the pair is not built, its route gives no bound at that level,
    and the answer comes from the other routes (never an out-of-memory kill)."""
    from shuffle_opacus.analysis.pld import proven, proven_pairs
    from shuffle_opacus.analysis.pld.rounds import ShuffleRound

    setting = ShuffleRound(n=50, sigma=1.0, rate=0.5)
    monkeypatch.setattr(proven_pairs, "MAX_PAIR_CELLS", 10.0)
    with pytest.raises(proven_pairs.PairTooLargeError, match="cells"):
        proven_pairs.blanket_pair(setting, 0.01, 1e-12)
    with pytest.raises(proven_pairs.PairTooLargeError, match="cells"):
        proven_pairs.proven_pair(setting, 1.0, 1e-12)
    proven._route_pair.cache_clear()
    proven._plan.cache_clear()
    estimate = proven.proven_rounds_epsilon([(setting, 2)], delta=1e-5)
    assert estimate.route == "gaussian" and math.isfinite(estimate.epsilon)
    proven._route_pair.cache_clear()
    proven._plan.cache_clear()


def test_a_delta_below_the_compositions_truncation_is_infinite_at_once():
    from shuffle_opacus.analysis.pld.proven import proven_rounds_epsilon
    from shuffle_opacus.analysis.pld.rounds import ShuffleRound

    estimate = proven_rounds_epsilon([(ShuffleRound(n=1000, sigma=1.0), 3)], delta=1e-50)
    assert math.isinf(estimate.epsilon)
