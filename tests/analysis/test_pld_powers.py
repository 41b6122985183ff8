"""Compositions by powers of spectra, the default method, and the [lower, upper] bracket.

Oracles: ``dp_accounting``'s own ``self_compose``/``compose`` and ``get_epsilon_for_delta`` (the
arithmetic ``powers`` must reproduce), the analytic Gaussian (``n = 1``: the shuffle of one user
is the Gaussian mechanism, Balle & Wang, arXiv:1805.06530, Theorem 8) for the bracket, and the
Rényi bound for the default's fallback.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from dp_accounting.pld import pld_pmf
from dp_accounting.pld import privacy_loss_distribution as pld_lib

from shuffle_opacus.analysis.approximate.analytic_gaussian import gaussian_dp_epsilon
from shuffle_opacus.analysis.epsilon import compute_epsilon, rounds_epsilon
from shuffle_opacus.analysis.limits import MemoryLimitError, memory_limit, work_budget
from shuffle_opacus.analysis.mechanisms import get_mechanism
from shuffle_opacus.analysis.pld.powers import PmfPowers, compose_powers, epsilon_for_delta
from shuffle_opacus.analysis.pld.rounds import ShuffleRound, shuffle_rounds_epsilon


def _gaussian_pmf(sigma: float, discretization: float = 1e-3):
    pld = pld_lib.from_gaussian_mechanism(
        sigma, value_discretization_interval=discretization, use_connect_dots=True
    )
    return pld._pmf_remove  # dp_accounting keeps the PMF of each direction


@pytest.mark.parametrize("count", [1, 2, 7, 64, 300])
def test_powers_reproduce_dp_accounting_self_compose(count):
    pmf = _gaussian_pmf(3.0)
    ours = epsilon_for_delta(compose_powers([(PmfPowers(pmf), count)]), 1e-6)
    reference = pmf.self_compose(count) if count > 1 else pmf
    theirs = reference.get_epsilon_for_delta(1e-6)
    assert ours == pytest.approx(theirs, rel=1e-8, abs=1e-10)


def test_powers_compose_different_pmfs_like_dp_accounting():
    a, b = _gaussian_pmf(2.0), _gaussian_pmf(5.0)
    ours = compose_powers([(PmfPowers(a), 3), (PmfPowers(b), 5)])
    theirs = a.self_compose(3).compose(b.self_compose(5))
    for delta in (1e-3, 1e-6, 1e-9):
        # dp_accounting truncates each self-composition's tails (1e-15 each) and ours once.
        assert epsilon_for_delta(ours, delta) == pytest.approx(
            theirs.get_epsilon_for_delta(delta), rel=1e-6
        )


def test_epsilon_scan_matches_dp_accounting_on_random_pmfs():
    rng = np.random.default_rng(3)
    for _ in range(20):
        probs = rng.exponential(size=rng.integers(2, 300))
        probs /= probs.sum() * 1.001
        pmf = pld_pmf.DensePLDPmf(0.01, int(rng.integers(-150, 50)), probs, 1e-4, True)
        for delta in (2e-4, 1e-3, 0.05, 0.5):
            assert epsilon_for_delta(pmf, delta) == pytest.approx(
                pmf.get_epsilon_for_delta(delta), rel=1e-9, abs=1e-12
            )


def test_a_result_does_not_depend_on_what_was_asked_before():
    # A resumed run asks for round 800 first; an uninterrupted one asked for 1..799 before.
    from shuffle_opacus.analysis.pld.shuffle_gaussian import shuffle_gaussian_pair, symmetric_pmf

    pair = shuffle_gaussian_pair(n=500, sigma=1.0, rate=0.1, tail=1e-13)
    fresh = PmfPowers(symmetric_pmf(pair, 2.0**-10, 2.5e-14))
    direct = epsilon_for_delta(compose_powers([(fresh, 800)]), 1e-5)
    for count in (1, 50, 799, 1600):
        compose_powers([(fresh, count)])
    again = epsilon_for_delta(compose_powers([(fresh, 800)]), 1e-5)
    assert direct == again  # bit for bit


@pytest.mark.parametrize(("sigma", "steps"), [(0.5, 1), (1.0, 1), (1.0, 10), (2.0, 50)])
def test_bracket_holds_the_analytic_gaussian(sigma, steps):
    # n = 1: one user's report is the Gaussian mechanism of sensitivity 1, whose exact epsilon
    # after ``steps`` adaptive rounds is the analytic Gaussian at sigma / sqrt(steps).
    est = shuffle_rounds_epsilon([(ShuffleRound(n=1, sigma=sigma), steps)], delta=1e-5, lower=True)
    exact = gaussian_dp_epsilon(1e-5, sigma=sigma / math.sqrt(steps))
    assert est.epsilon_lower is not None
    assert est.epsilon_lower <= exact <= est.epsilon
    assert est.epsilon - est.epsilon_lower <= 0.01 * exact


def test_bracket_is_ordered_and_narrow_at_a_large_population():
    res = compute_epsilon("checkin", n=60000, rate=0.1, sigma=5.0, steps=300, delta=1e-5)
    assert res.method == "pld" and res.kind == "pld"
    assert res.epsilon_lower is not None
    assert res.epsilon_lower <= res.epsilon <= res.epsilon_lower * 1.01


def test_the_default_is_pld_and_at_most_the_renyi_bound():
    for mechanism, params in (
        ("shuffle", {"n": 200, "sigma": 1.0}),
        ("subsampled", {"n": 200, "m": 20, "sigma": 1.0}),
        ("checkin", {"n": 200, "rate": 0.1, "sigma": 1.0}),
    ):
        assert get_mechanism(mechanism).default_method == "pld"
        default = compute_epsilon(mechanism, steps=20, delta=1e-5, **params)
        renyi = compute_epsilon(
            mechanism, steps=20, delta=1e-5, method=get_mechanism(mechanism).fallback, **params
        )
        assert default.method == "pld" and default.note is None
        assert default.epsilon < renyi.epsilon


def test_the_default_falls_back_below_the_pld_floor_with_a_note():
    res = compute_epsilon("checkin", n=1000, rate=0.1, sigma=0.04, steps=3, delta=1e-5)
    assert res.method == "exact" and res.kind == "rdp"
    assert res.note is not None and "0.05" in res.note and "Rényi bound" in res.note
    with pytest.raises(ValueError, match="sigma must be at least 0.05"):
        compute_epsilon("checkin", n=1000, rate=0.1, sigma=0.04, steps=3, delta=1e-5, method="pld")


def test_the_default_falls_back_when_the_work_budget_is_short():
    setting = get_mechanism("checkin").setting(sigma=1.0, n=10**6, rate=0.5)
    with work_budget(0.5):
        res = rounds_epsilon("checkin", [(setting, 10)], delta=1e-5)
    assert res.method == "exact" and res.note is not None and "estimated" in res.note


def test_a_fine_grid_gets_a_window_from_its_loss_scale():
    # Loss sd 1e-4 per round on a grid of 1e-6: after 100 rounds the composition's sd is 1e-3,
    # so a window of +-8.3 sd holds all but 1e-15. The orders fixed per unit of loss (up to
    # 400) stopped near +-0.09 of loss, a window of 1.8e5 points, ten times too wide (the cost
    # that grew like sqrt(n) in issue 42).
    pmf = _gaussian_pmf(1e4, discretization=1e-6)
    composed = compose_powers([(PmfPowers(pmf), 100)])
    assert composed._probs.size < 2.5e4
    reference = pmf.self_compose(100).get_epsilon_for_delta(1e-6)
    assert epsilon_for_delta(composed, 1e-6) == pytest.approx(reference, rel=1e-6)


def test_a_plan_over_the_memory_limit_falls_back_with_a_note():
    setting = get_mechanism("checkin").setting(sigma=2.0, n=1000, rate=0.1)
    with memory_limit(1 << 20):
        result = rounds_epsilon("checkin", [(setting, 10)], delta=1e-5)
    assert result.method == "exact"
    assert "over the 1 MiB memory limit; lower the reports per round" in result.note
    assert result.note.endswith("Rényi bound (method exact) instead")


def test_a_named_pld_over_the_memory_limit_is_refused_in_one_line():
    setting = get_mechanism("checkin").setting(sigma=2.0, n=1000, rate=0.1)
    with memory_limit(1 << 20), pytest.raises(MemoryLimitError, match=r"lower .*\.$") as info:
        rounds_epsilon("checkin", [(setting, 10)], delta=1e-5, method="pld")
    assert "\n" not in str(info.value)


def test_a_composition_over_the_memory_limit_is_refused_before_its_fft():
    powers = PmfPowers(_gaussian_pmf(3.0))
    with memory_limit(1 << 16), pytest.raises(MemoryLimitError, match="lower steps"):
        compose_powers([(powers, 1000)])
