"""The lattice's Chernoff windows evaluate few orders yet choose the scan's, bit for bit."""

import math
from unittest import mock

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shuffle_opacus.analysis.pld.shuffle_gaussian import chernoff
from shuffle_opacus.analysis.pld.shuffle_gaussian.chernoff import _Chernoff
from shuffle_opacus.analysis.pld.shuffle_gaussian.lattice import _term_lattice
from shuffle_opacus.analysis.pld.shuffle_gaussian.pair import _lattice_step, _report_cut


def _scan_moments(ch, theta):
    """The moments of every order as the lattice computed them before (blocks of 16)."""
    log_mass = np.log(ch.mass)
    log_m0 = np.empty(theta.size)
    ratio = np.empty(theta.size)
    for start in range(0, theta.size, 16):
        t = theta[start : start + 16, None]
        z0 = ch.hi if t[0, 0] > 0 else ch.lo
        exponent = log_mass[None, :] + t * z0[None, :]
        top = exponent.max(axis=1, keepdims=True)
        scaled = np.exp(exponent - top)
        log_m0[start : start + 16] = np.log(scaled.sum(axis=1)) + top[:, 0]
        shift = np.exp(top[:, 0] - log_m0[start : start + 16])[:, None]
        other = ch.lo if t[0, 0] > 0 else ch.hi
        at_z0 = scaled * shift * z0[None, :]
        at_other = (
            ch.mass[None, :]
            * other[None, :]
            * np.exp(t * other[None, :] - log_m0[start : start + 16, None])
        )
        ratio[start : start + 16] = np.maximum(at_z0, at_other).sum(axis=1)
    return log_m0, ratio


def _scan_window(ch, up, down, count, budget):
    """The window of the scan over all 240 orders (the lattice's code before the search)."""
    half = math.log(budget / 2.0)
    log_m0, ratio = up
    log_tilted = count * log_m0 + np.log(np.maximum(1.0 + count / ch.n * ratio, 1e-300))
    highs = np.maximum((log_tilted - half) / ch.thetas, 0.0)
    i = int(np.argmin(highs))
    high = float(highs[i])
    p_high = math.exp(log_tilted[i] - ch.thetas[i] * high)
    log_down, _ = down
    lows = np.minimum(-(count * log_down - half) / ch.thetas_down, 0.0)
    j = int(np.argmax(lows))
    low = float(lows[j])
    q_low = math.exp(count * log_down[j] + ch.thetas_down[j] * low)
    return low, high, q_low + p_high, p_high + q_low


def _check(ch, counts, budgets):
    up = _scan_moments(ch, ch.thetas)
    down = _scan_moments(ch, -ch.thetas_down)
    for count in counts:
        for budget in budgets:
            got = ch.window(count, budget)
            want = _scan_window(ch, up, down, count, budget)
            assert [x.hex() for x in got] == [float(x).hex() for x in want], (count, budget)
    return up, down


def _random_term(rng, size, spread):
    """A lattice measure like a term's: an atom at 0, mass below 1, values from -1 up."""
    per_unit = int(rng.integers(1, 8))
    masses = rng.random(size) ** spread * 10.0 ** rng.uniform(-30, 0, size)
    masses *= rng.uniform(0.2, 1.0) / masses.sum()
    masses[min(per_unit, size - 1)] += rng.uniform(0.0, 0.8)
    return (-per_unit, masses), 1.0 / per_unit


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    size=st.integers(2, 400),
    spread=st.floats(0.1, 20.0),
    n=st.integers(1, 10**9),
)
def test_windows_equal_the_full_scan_on_random_measures(seed, size, spread, n):
    rng = np.random.default_rng(seed)
    term, step = _random_term(rng, size, spread)
    ch = _Chernoff(term, step, n)
    counts = sorted({int(c) for c in rng.integers(1, max(2, n), 6)} | {1, n})
    with mock.patch.object(chernoff, "_SCAN_RUNS", 0):  # search even these small lattices
        _check(ch, counts, [1e-20, 3.7e-15, 1e-3])


@pytest.mark.parametrize(
    ("n", "rate", "sigma", "terms"),
    [(60000, 0.1, 0.6890700255608186, 60000), (10**9, 1e-4, 5.0, 10**9), (1000, 1.0, 1.0, 1000)],
)
def test_windows_equal_the_full_scan_on_term_lattices(n, rate, sigma, terms):
    # The paper's calibrated sigma (a term lattice merged into runs), a huge n and full shuffle.
    a = 1.0 / sigma
    x_max = _report_cut(a, rate, terms, n, 1e-13)[0]
    step = _lattice_step(a, rate, terms, x_max, 1e-3)[0]
    ch = _Chernoff(_term_lattice(a, rate, x_max, step), step, n)
    counts = [1, 2, 3, 7, 64, 607, terms // 3, terms - 1, terms]
    with mock.patch.object(chernoff, "_SCAN_RUNS", 0):  # n = 1e9 has few runs: search anyway
        _check(ch, counts, [1e-13 / 4 / 34, 1e-18])
    # The search evaluated a minority of the orders (else it saves nothing).
    assert ch._up.done.sum() + ch._down.done.sum() < 0.5 * 2 * chernoff.ORDERS


def test_small_lattices_take_every_order():
    (offset, masses), step = _random_term(np.random.default_rng(4), 300, 1.0)
    ch = _Chernoff((offset, masses), step, 1000)
    _check(ch, [1, 10, 1000], [1e-15])
    assert ch._up.done.all() and ch._down.done.all()


def test_untrusted_measures_take_every_order():
    # A mass below the error bound's range: every order is computed, the windows still the scan's.
    (offset, masses), step = _random_term(np.random.default_rng(3), 300, 1.0)
    masses[-1] = 1e-300
    ch = _Chernoff((offset, masses), step, 1000)
    with mock.patch.object(chernoff, "_SCAN_RUNS", 0):
        _check(ch, [1, 10, 1000], [1e-15])
    assert ch._up.done.all() and ch._down.done.all()


def test_moments_do_not_depend_on_which_orders_are_computed_together():
    (offset, masses), step = _random_term(np.random.default_rng(5), 1001, 2.0)
    ch = _Chernoff((offset, masses), step, 50)
    rng = np.random.default_rng(6)
    for index in (rng.permutation(chernoff.ORDERS)[:37], np.array([239, 0, 5])):
        ch._up.fill(index)
    ch._up.fill_all()
    log_m0, ratio = _scan_moments(ch, ch.thetas)
    assert ch._up.log_m.tobytes() == log_m0.tobytes()
    assert ch._up.ratio is not None and ch._up.ratio.tobytes() == ratio.tobytes()
