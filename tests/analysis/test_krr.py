"""Shuffled k-randomised response against the strong and weak adversaries (arXiv:2106.00477 §4, C).

Oracle: exact enumeration (integer masses over a common denominator, rounded to floats once)
of every full view of the adversary -- inputs of users 1..n-1, the beta vector it knows, and the
multiset of shuffled reports -- for tiny n, with the hockey-stick divergences computed from those
masses. It shares no code with the module (no sufficient statistic, no multinomial formula, no
truncation).
"""

from __future__ import annotations

import itertools
import math
from collections import defaultdict
from fractions import Fraction
from functools import cache

import numpy as np
import pytest

from shuffle_opacus.analysis.pld.krr import (
    KRR_ADVERSARIES,
    _strong_outcomes,
    _weak_chunks,
    _weak_plan,
    krr_delta,
    krr_eps0,
    krr_epsilon,
    krr_pld,
    krr_tail_delta,
)

DISC = 1e-4
EPS_GRID = (0.0, 0.05, 0.3, 0.7, 1.5, 3.0)


def _inputs(n: int, k: int, pattern: str) -> tuple[int, ...]:
    """Inputs of users 1..n-1: all equal to k, or cycling through 3, 1, 2, ... (within [k])."""
    if pattern == "same":
        return (k,) * (n - 1)
    return tuple((i + 2) % k + 1 for i in range(n - 1))


@cache
def _strong_views(
    n: int, k: int, gamma: Fraction, inputs: tuple[int, ...]
) -> tuple[dict[object, list[int]], int]:
    """Exact masses of every strong-adversary view under X (x_n = 1) and X' (x_n = 2).

    With gamma = a/b, a report's mass is 1 - gamma = k (b - a) / (b k) (kept) or gamma / k =
    a / (b k) (each value drawn): every view's mass is an integer over ``(b k)^n``. Returns the
    integer numerators ``[under X, under X']`` of each view (beta, sorted reports) and ``(b k)^n``.
    """
    a, b = gamma.numerator, gamma.denominator
    kept, drawn = k * (b - a), a
    views: dict[object, list[int]] = defaultdict(lambda: [0, 0])
    for which, last in enumerate((1, 2)):
        options = []
        for x in (*inputs, last):
            opts = [(0, x, kept)] + [(1, y, drawn) for y in range(1, k + 1)]
            options.append([o for o in opts if o[2] > 0])
        for combo in itertools.product(*options):
            beta = tuple(c[0] for c in combo)
            reports = tuple(sorted(c[1] for c in combo))
            views[(beta, reports)][which] += math.prod(c[2] for c in combo)
    return dict(views), (b * k) ** n


@cache
def brute_views(
    n: int, k: int, gamma: Fraction, inputs: tuple[int, ...], adversary: str
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Exact masses of every view under X (x_n = 1) and X' (x_n = 2).

    Returns float arrays ``(p, q, beta_n_zero)`` over the union of the supports; the last marks
    the views whose (known) beta_n is 0, for the strong adversary. The weak adversary's view is
    the strong one without beta_n: its masses are sums of the strong ones, exactly.
    """
    strong, denominator = _strong_views(n, k, gamma, inputs)
    if adversary == "weak":
        views: dict[object, list[int]] = defaultdict(lambda: [0, 0])
        for (beta, reports), (under_x, under_x_prime) in strong.items():
            views[(beta[:-1], reports)][0] += under_x
            views[(beta[:-1], reports)][1] += under_x_prime
    else:
        views = strong
    keys = list(views)
    p = np.array([float(Fraction(views[v][0], denominator)) for v in keys])
    q = np.array([float(Fraction(views[v][1], denominator)) for v in keys])
    zero = np.array([adversary == "strong" and v[0][-1] == 0 for v in keys])
    assert sum(views[v][0] for v in keys) == denominator
    assert sum(views[v][1] for v in keys) == denominator
    return p, q, zero


def hockey(p: np.ndarray, q: np.ndarray, eps: float) -> float:
    both = max(
        np.maximum(p - math.exp(eps) * q, 0).sum(), np.maximum(q - math.exp(eps) * p, 0).sum()
    )
    return float(both)


CASES = [
    (n, k, g)
    for n in (1, 2, 3, 5)
    for k in (2, 3, 4)
    for g in (Fraction(1, 4), Fraction(2, 3), Fraction(1))
]


@pytest.mark.parametrize("adversary", KRR_ADVERSARIES)
@pytest.mark.parametrize(("n", "k", "gamma"), CASES)
def test_pld_delta_bounds_brute_force_tightly(adversary, n, k, gamma):
    pld = krr_pld(n=n, k=k, gamma=float(gamma), adversary=adversary, discretization=DISC)
    for pattern in ("same", "mixed"):
        p, q, _ = brute_views(n, k, gamma, _inputs(n, k, pattern), adversary)
        for eps in EPS_GRID:
            exact = hockey(p, q, eps)
            got = pld.get_delta_for_epsilon(eps)
            # Pessimistic: above the exact value; the loss rounding costs at most DISC.
            assert exact - 1e-12 <= got <= exact + DISC + 1e-9, (pattern, eps, got, exact)


@pytest.mark.parametrize("adversary", KRR_ADVERSARIES)
@pytest.mark.parametrize(
    ("n", "k", "gamma"), [(2, 3, Fraction(1, 4)), (3, 4, Fraction(2, 3)), (5, 2, Fraction(1, 4))]
)
def test_optimistic_pld_bounds_brute_force_from_below(adversary, n, k, gamma):
    # The lower end of the records: losses rounded down, truncated mass dropped.
    lower = krr_pld(n=n, k=k, gamma=float(gamma), adversary=adversary, pessimistic=False)
    for pattern in ("same", "mixed"):
        p, q, _ = brute_views(n, k, gamma, _inputs(n, k, pattern), adversary)
        for eps in EPS_GRID:
            got = lower.get_delta_for_epsilon(eps)
            assert hockey(p, q, eps + DISC) - 1e-11 <= got <= hockey(p, q, eps) + 1e-12


@pytest.mark.parametrize("adversary", KRR_ADVERSARIES)
@pytest.mark.parametrize(("n", "k", "gamma"), [(2, 3, Fraction(1, 4)), (3, 2, Fraction(2, 3))])
def test_two_rounds_match_brute_force_product(adversary, n, k, gamma):
    p, q, _ = brute_views(n, k, gamma, _inputs(n, k, "mixed"), adversary)
    p2, q2 = np.outer(p, p).ravel(), np.outer(q, q).ravel()
    pld = krr_pld(n=n, k=k, gamma=float(gamma), adversary=adversary, steps=2)
    for eps in EPS_GRID:
        exact = hockey(p2, q2, eps)
        got = pld.get_delta_for_epsilon(eps)
        assert exact - 1e-12 <= got <= exact + 2 * DISC + 1e-9, (eps, got, exact)
    # And it is not simply the one-round value.
    assert krr_delta(
        0.3, n=n, k=k, gamma=float(gamma), adversary=adversary
    ) < pld.get_delta_for_epsilon(0.3)


@pytest.mark.parametrize("k", [2, 3, 5])
@pytest.mark.parametrize("gamma", [0.1, 0.5, 0.9, 1.0])
def test_one_user_weak_is_plain_krr(k, gamma):
    for eps in EPS_GRID:
        closed = max(0.0, (1 - gamma + gamma / k) - math.exp(eps) * gamma / k)
        got = krr_delta(eps, n=1, k=k, gamma=gamma, adversary="weak")
        assert closed - 1e-12 <= got <= closed + DISC, (eps, got, closed)
    # Its eps0 is where delta reaches 0.
    eps0 = krr_eps0(k=k, gamma=gamma)
    assert krr_delta(eps0 + 2 * DISC, n=1, k=k, gamma=gamma, adversary="weak") == 0.0
    if gamma < 1:
        assert krr_delta(eps0 - 0.01, n=1, k=k, gamma=gamma, adversary="weak") > 0.0


@pytest.mark.parametrize("gamma", [0.2, 0.75])
def test_one_user_strong_reveals_a_truthful_report(gamma):
    # beta_1 = 0 (prob 1 - gamma) exposes x_1; beta_1 = 1 gives identical views.
    for eps in (0.0, 1.0, 20.0):
        assert krr_delta(eps, n=1, k=3, gamma=gamma, adversary="strong") == pytest.approx(
            1 - gamma, abs=1e-12
        )
    assert krr_epsilon((1 - gamma) / 2, n=1, k=3, gamma=gamma) == math.inf


def test_krr_eps0():
    assert krr_eps0(k=4, gamma=0.25) == pytest.approx(math.log(13))
    assert krr_eps0(k=2, gamma=1.0) == 0.0


@pytest.mark.parametrize("k", [2, 4])
@pytest.mark.parametrize("steps", [1, 3])
def test_strong_adversary_dominates_weak(k, steps):
    # A_w's view is a function of A_s's (drop beta_n): data processing, per round and composed.
    weak = krr_pld(n=200, k=k, gamma=0.3, adversary="weak", steps=steps)
    strong = krr_pld(n=200, k=k, gamma=0.3, adversary="strong", steps=steps)
    for eps in np.linspace(0.0, 3.0, 31):
        w, s = weak.get_delta_for_epsilon(eps), strong.get_delta_for_epsilon(eps)
        assert s >= w - steps * DISC, (eps, s, w)
    # Knowing beta_n is worth something: strictly larger beyond the discretisation slack.
    assert strong.get_delta_for_epsilon(0.5) > weak.get_delta_for_epsilon(0.5) + 10 * DISC


@pytest.mark.parametrize("adversary", KRR_ADVERSARIES)
@pytest.mark.parametrize(("n", "k", "gamma"), [(1, 3, 0.4), (10, 2, 0.5), (300, 4, 0.25)])
def test_paper_tail_bound_exceeds_hockey_stick(adversary, n, k, gamma):
    pld = krr_pld(n=n, k=k, gamma=gamma, adversary=adversary)
    for eps in np.linspace(0.0, 2.5, 6):
        tail = krr_tail_delta(eps, n=n, k=k, gamma=gamma, adversary=adversary)
        assert tail >= pld.get_delta_for_epsilon(eps) - DISC, (eps, tail)


@pytest.mark.parametrize("adversary", KRR_ADVERSARIES)
@pytest.mark.parametrize(("n", "k", "gamma"), [(3, 3, Fraction(1, 4)), (5, 2, Fraction(2, 3))])
def test_paper_tail_bound_matches_brute_force(adversary, n, k, gamma):
    # Theorem 16: P(L >= eps) under X. Theorem 13: the same conditioned on beta_n = 0.
    p, q, zero = brute_views(n, k, gamma, _inputs(n, k, "mixed"), adversary)
    with np.errstate(divide="ignore"):
        loss = np.where(q > 0, np.log(p) - np.log(np.where(q > 0, q, 1.0)), np.inf)
    for eps in (0.0, 0.2, 0.9, 1.7):
        hit = (loss >= eps - 1e-12) & (p > 0)
        if adversary == "strong":
            exact = p[hit & zero].sum() / (1 - float(gamma))
        else:
            exact = p[hit].sum()
        got = krr_tail_delta(eps, n=n, k=k, gamma=float(gamma), adversary=adversary)
        assert got == pytest.approx(exact, abs=1e-11), eps


@pytest.mark.parametrize(("n", "k", "gamma"), [(40, 3, 0.3), (25, 2, 0.6), (60, 5, 1.0)])
def test_weak_masses_match_the_closed_form_ratio(n, k, gamma):
    total_p = total_q = 0.0
    for b, n1, n2, log_p, log_q in _weak_chunks(n, k, gamma, 1e-12):
        c = gamma * (b + 1) / k
        formula = np.log((n1 * (1 - gamma) + c) / (n2 * (1 - gamma) + c))  # eqs. C.2-C.3
        np.testing.assert_allclose(log_p - log_q, formula, rtol=0, atol=1e-9)
        total_p += np.exp(log_p).sum()
        total_q += np.exp(log_q).sum()
    neglected = _weak_plan(n, k, gamma, 1e-12)[4]
    assert neglected <= 1e-12 * (1 + 1e-6)
    for total in (total_p, total_q):
        assert 1 - neglected - 1e-12 <= total <= 1 + 1e-12


@pytest.mark.parametrize(("n", "k", "gamma"), [(1000, 4, 0.25), (30, 2, 1.0)])
def test_strong_masses_sum_to_one(n, k, gamma):
    _, mass, _, _, neglected = _strong_outcomes(n, k, gamma, 1e-12)
    assert neglected <= 1e-12 * (1 + 1e-6)
    assert 1 - neglected - 1e-12 <= mass.sum() <= 1 + 1e-12


@pytest.mark.parametrize("n", [10**7, 10**9])
def test_weak_latent_count_masses_sum_to_one_at_large_n(n):
    # The law of B ~ Bin(n - 1, gamma) weights every outcome of the weak adversary: over its
    # window it must hold all but the reported left-out mass. scipy's binom.logpmf, whose
    # log-gammas are of size n log n, missed by 2e-8 at 10^7 and 5e-7 at 10^9.
    _, log_pb, _, _, neglected = _weak_plan(n, 4, 0.25, 1e-12)
    assert neglected <= 1e-12 * (1 + 1e-6)
    assert 1 - neglected - 1e-13 <= math.fsum(np.exp(log_pb)) <= 1 + 1e-13


@pytest.mark.parametrize("adversary", KRR_ADVERSARIES)
def test_truncated_mass_is_added_to_delta(adversary):
    args = dict(n=300, k=4, gamma=0.25, adversary=adversary)
    if adversary == "strong":
        neglected = _strong_outcomes(300, 4, 0.25, 1e-3)[4]
    else:
        neglected = _weak_plan(300, 4, 0.25, 1e-3)[4]
    assert 1e-5 < neglected <= 1e-3
    big, small = krr_pld(tail=1e-3, **args), krr_pld(tail=1e-12, **args)
    # Beyond every finite loss only the mass at +inf is left.
    assert big.get_delta_for_epsilon(30.0) >= neglected
    # With a negligible tail only the genuine +inf loss is left: M2 = 0 (A_s), nothing (A_w).
    genuine = 0.75 * (1 - 0.25 / 4) ** 299 if adversary == "strong" else 0.0
    assert genuine <= small.get_delta_for_epsilon(30.0) <= genuine + 1e-11
    for eps in np.linspace(0.0, 2.0, 9):
        d_big, d_small = big.get_delta_for_epsilon(eps), small.get_delta_for_epsilon(eps)
        assert d_small - 1e-12 <= d_big <= d_small + 1e-3, eps
    tail_big = krr_tail_delta(30.0, n=300, k=4, gamma=0.25, adversary=adversary, tail=1e-3)
    assert tail_big >= neglected / (0.75 if adversary == "strong" else 1.0) - 1e-15


def test_epsilon_inverts_delta():
    for adversary in KRR_ADVERSARIES:
        args = dict(n=300, k=4, gamma=0.25, adversary=adversary, steps=8)
        eps = krr_epsilon(1e-6, **args)
        assert 0 < eps < 6
        assert krr_delta(eps, **args) <= 1e-6
        assert krr_delta(eps - 0.01, **args) > 1e-6
    # No privacy cost at all when everyone randomises.
    assert krr_epsilon(1e-6, n=10, k=3, gamma=1.0, adversary="strong") == 0.0


BAD = [
    (krr_delta, dict(eps=0.5, n=0, k=3, gamma=0.5), "n"),
    (krr_delta, dict(eps=0.5, n=2.5, k=3, gamma=0.5), "n"),
    (krr_delta, dict(eps=0.5, n=10, k=1, gamma=0.5), "k"),
    (krr_delta, dict(eps=0.5, n=10, k=2.5, gamma=0.5), "k"),
    (krr_delta, dict(eps=0.5, n=10, k=3, gamma=0.0), "gamma"),
    (krr_delta, dict(eps=0.5, n=10, k=3, gamma=1.5), "gamma"),
    (krr_delta, dict(eps=0.5, n=10, k=3, gamma=0.5, adversary="medium"), "adversary"),
    (krr_delta, dict(eps=0.5, n=10, k=3, gamma=0.5, steps=0), "steps"),
    (krr_delta, dict(eps=-0.5, n=10, k=3, gamma=0.5), "eps"),
    (krr_delta, dict(eps=0.5, n=10, k=3, gamma=0.5, discretization=0.0), "discretization"),
    (krr_delta, dict(eps=0.5, n=10, k=3, gamma=0.5, tail=1.0), "tail"),
    (krr_epsilon, dict(delta=0.0, n=10, k=3, gamma=0.5), "delta"),
    (krr_pld, dict(n=10, k=3, gamma=float("nan")), "gamma"),
    (krr_tail_delta, dict(eps=0.5, n=10, k=3, gamma=0.5, adversary=3), "adversary"),
    (krr_eps0, dict(k=3, gamma=-1), "gamma"),
]


@pytest.mark.parametrize(("func", "kwargs", "name"), BAD)
def test_bad_inputs_raise_one_line_errors(func, kwargs, name):
    kwargs = dict(kwargs)
    positional = [kwargs.pop(key) for key in ("eps", "delta") if key in kwargs]
    with pytest.raises(ValueError) as err:
        func(*positional, **kwargs)
    message = str(err.value)
    assert message.startswith(f"{name} must") and "\n" not in message
    if name == "adversary":
        assert "'strong', 'weak'" in message


def test_more_users_hide_better_at_n_1000():
    # Shuffling amplifies: at a fixed delta the one-round epsilon of n = 1000 users is below that
    # of n = 300, and both are below the local epsilon of k-RR (ln 13 for k = 4, gamma = 0.25).
    # (How long n = 1000 takes is measured in benchmarks/limits.py, not here.)
    for adversary in KRR_ADVERSARIES:
        args = dict(k=4, gamma=0.25, adversary=adversary)
        big, small = krr_epsilon(1e-6, n=1000, **args), krr_epsilon(1e-6, n=300, **args)
        assert 0 < big < small < krr_eps0(k=4, gamma=0.25), adversary


@pytest.mark.parametrize("adversary", KRR_ADVERSARIES)
def test_reported_neglected_mass_covers_what_is_left_out(adversary):
    # With a coarse tail the left-out mass is large enough (>1e-5) that an under-reported
    # bound would show: kept mass + reported bound must reach 1 under P and under Q.
    n, k, gamma, tail = 300, 4, 0.25, 1e-3
    if adversary == "strong":
        _, mass, _, _, neglected = _strong_outcomes(n, k, gamma, tail)
        totals = [math.fsum(mass)]
    else:
        neglected = _weak_plan(n, k, gamma, tail)[4]
        total_p = total_q = 0.0
        for _, _, _, log_p, log_q in _weak_chunks(n, k, gamma, tail):
            total_p += math.fsum(np.exp(log_p))
            total_q += math.fsum(np.exp(log_q))
        totals = [total_p, total_q]
    assert 1e-5 < neglected <= tail * (1 + 1e-6)
    for total in totals:
        assert total + neglected >= 1 - 1e-12
        assert total <= 1 + 1e-12


@pytest.mark.parametrize("adversary", KRR_ADVERSARIES)
@pytest.mark.parametrize(("n", "k", "gamma"), [(3, 3, Fraction(1, 4)), (5, 2, Fraction(2, 3))])
def test_pair_is_symmetric_so_orientations_need_no_symmetrisation(adversary, n, k, gamma):
    # Replace-one with adaptive queries may swap the roles of x_n = 1 and x_n = 2 from one
    # round to the next. Swapping the labels 1 and 2 maps each view under X to one under X'
    # with the same mass, so H(P || Q) = H(Q || P) for the exact views ...
    for pattern in ("same", "mixed"):
        p, q, _ = brute_views(n, k, gamma, _inputs(n, k, pattern), adversary)
        for eps in EPS_GRID:
            forward = float(np.maximum(p - math.exp(eps) * q, 0).sum())
            backward = float(np.maximum(q - math.exp(eps) * p, 0).sum())
            assert forward == pytest.approx(backward, rel=1e-12, abs=1e-15)
    # ... so each of the module's two PMFs, on its own, bounds both orientations of a round,
    # and composing it covers every mix of orientations (the two PMFs differ only in how a loss
    # of exactly 0 rounds).
    pld = krr_pld(n=n, k=k, gamma=float(gamma), adversary=adversary, discretization=DISC)
    for pattern in ("same", "mixed"):
        p, q, _ = brute_views(n, k, gamma, _inputs(n, k, pattern), adversary)
        for eps in EPS_GRID:
            exact = hockey(p, q, eps)
            for pmf in (pld._pmf_remove, pld._pmf_add):  # noqa: SLF001
                assert pmf.get_delta_for_epsilon(eps) >= exact - 1e-12
