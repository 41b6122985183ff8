"""Shuffled check-in: the three methods, their ordering, Monte Carlo and central floors."""

import functools
import importlib.util
import math
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.special import logsumexp
from scipy.stats import binom

from shuffle_opacus.analysis.epsilon import compute_epsilon
from shuffle_opacus.analysis.rdp.central import poisson_subsampled_gaussian_rdp
from shuffle_opacus.analysis.rdp.checkin import checkin_rdp
from shuffle_opacus.analysis.rdp.series import (
    log_gaussian_excess,
    mixture_log_excess,
    shuffle_log_excess,
)
from shuffle_opacus.analysis.rdp.shuffle_gaussian import shuffle_gaussian_rdp
from shuffle_opacus.analysis.rdp.subsampling import subsampled_shuffle_rdp, wang_log_excess


def explicit_average(n, rate, sigma, orders, conditional):
    """Sum over every k = 0..n of Pr[K = k] times the conditional moment bound."""
    ks = np.arange(1, n + 1)
    top = int(max(orders))
    log_e = shuffle_log_excess(ks, sigma, top)
    cond = conditional(ks / n, log_e, np.asarray(orders))
    log_pmf = binom.logpmf(ks, n, rate)
    total = logsumexp(log_pmf[:, None] + cond, axis=0)
    return np.logaddexp(0.0, total) / (np.asarray(orders) - 1.0)


@pytest.mark.parametrize(("n", "rate", "sigma"), [(5, 0.3, 1.0), (40, 0.2, 2.0), (150, 0.05, 0.8)])
def test_exact_equals_explicit_binomial_average(n, rate, sigma):
    orders = np.arange(2, 30)
    got = checkin_rdp(n=n, rate=rate, sigma=sigma, orders=orders, method="exact")
    want = explicit_average(n, rate, sigma, orders, mixture_log_excess)
    np.testing.assert_allclose(got, want, rtol=1e-9)


@pytest.mark.parametrize(("n", "rate", "sigma"), [(30, 0.3, 1.0), (200, 0.1, 2.0)])
def test_sum_matches_explicit_wang_average(n, rate, sigma):
    # `sum` is Eq. 17 (rate k/n) over the bulk; its tails bound the true conditional moment
    # instead, so it agrees with the explicit all-k average up to the tail tolerance and never
    # drops below the exact (true) moment.
    orders = np.arange(2, 25)
    got = checkin_rdp(n=n, rate=rate, sigma=sigma, orders=orders, method="sum")
    want = explicit_average(n, rate, sigma, orders, wang_log_excess)
    truth = explicit_average(n, rate, sigma, orders, mixture_log_excess)
    np.testing.assert_allclose(got, want, rtol=1e-5)
    assert np.all(got >= truth)


@pytest.mark.parametrize(("n", "sigma"), [(1, 0.8), (7, 1.5), (500, 3.0), (60000, 5.0)])
def test_exact_with_rate_one_is_theorem1(n, sigma):
    orders = np.arange(2, 200)
    got = checkin_rdp(n=n, rate=1.0, sigma=sigma, orders=orders, method="exact")
    want = shuffle_gaussian_rdp(n=n, sigma=sigma, orders=orders)
    np.testing.assert_allclose(got, want, rtol=1e-12)


@pytest.mark.parametrize(("n", "k", "sigma"), [(10, 3, 2.0), (6, 6, 2.5), (20, 5, 3.0)])
def test_conditional_moments_match_monte_carlo(n, k, sigma):
    rng = np.random.default_rng(12345)
    samples = 400_000
    x = rng.normal(0.0, sigma, size=(samples, k))
    ratio = (1 - k / n) + np.exp((2 * x - 1) / (2 * sigma**2)).sum(axis=1) / n
    orders = np.array([2, 3, 4])
    log_e = shuffle_log_excess(k, sigma, 4)
    model = 1 + np.exp(mixture_log_excess(k / n, log_e, orders)[0])
    for lam, want in zip(orders, model, strict=True):
        values = ratio**lam
        mean = values.mean()
        stderr = values.std(ddof=1) / math.sqrt(samples)
        assert abs(mean - want) <= 5 * stderr, (lam, mean, want, stderr)


@given(
    n=st.integers(2, 400),
    rate=st.floats(0.01, 1.0),
    sigma=st.floats(0.5, 8.0),
)
@settings(max_examples=25, deadline=None)
def test_exact_below_sum_and_above_central(n, rate, sigma):
    orders = np.arange(2, 24)
    exact = checkin_rdp(n=n, rate=rate, sigma=sigma, orders=orders, method="exact")
    summed = checkin_rdp(n=n, rate=rate, sigma=sigma, orders=orders, method="sum")
    assert np.all(exact <= summed * (1 + 1e-9))
    # Central floor: the server can add up the reports it receives. Given k reports the sum
    # is a k/n-mixture of Gaussians with std sigma*sqrt(k); average that over k exactly.
    ks = np.arange(1, n + 1)
    cond = np.stack(
        [
            mixture_log_excess(k / n, log_gaussian_excess(sigma * math.sqrt(k), 23), orders)[0]
            for k in ks
        ]
    )
    log_pmf = binom.logpmf(ks, n, rate)
    floor = np.logaddexp(0.0, logsumexp(log_pmf[:, None] + cond, axis=0))
    floor /= orders - 1.0
    assert np.all(exact >= floor * (1 - 1e-9))


@given(n=st.integers(2, 3000), rate=st.floats(0.01, 0.99), factor=st.floats(1.05, 2.0))
@settings(max_examples=25, deadline=None)
def test_exact_monotone_in_rate_and_sigma(n, rate, factor):
    orders = np.arange(2, 40)
    base = checkin_rdp(n=n, rate=rate, sigma=2.0, orders=orders)
    more_rate = checkin_rdp(n=n, rate=min(1.0, rate * factor), sigma=2.0, orders=orders)
    more_noise = checkin_rdp(n=n, rate=rate, sigma=2.0 * factor, orders=orders)
    more_users = checkin_rdp(n=n + 1, rate=rate, sigma=2.0, orders=orders)
    assert np.all(more_rate >= base * (1 - 1e-12))
    assert np.all(more_noise <= base * (1 + 1e-12))
    assert np.all(more_users <= base * (1 + 1e-12))


def test_theorem3_as_written():
    # Recompute Theorem 3 (Eq. 18) by hand from Theorem 2 for one setting.
    n, rate, sigma, delta_c = 1000, 0.1, 2.0, 0.5
    orders = np.arange(2, 20)
    m = math.floor((1 - delta_c) * n * rate) + 1  # 51
    eps_1 = subsampled_shuffle_rdp(n=10, m=1, sigma=sigma, orders=orders)  # rate 1/10 = 0.1
    eps_m = subsampled_shuffle_rdp(n=510, m=m, sigma=sigma, orders=orders)  # rate 0.1
    want = np.logaddexp((orders - 1) * eps_1 - delta_c**2 * n * rate / 2, (orders - 1) * eps_m) / (
        orders - 1
    )
    got = checkin_rdp(n=n, rate=rate, sigma=sigma, orders=orders, method="theorem3")
    np.testing.assert_allclose(got, want, rtol=1e-12)


def test_paper_mnist_setting_ordering_and_scale():
    # n = 60000, rate 0.1, sigma 5, 5540 rounds, delta 1e-5 (Liew & Takahashi Sec. 5.2).
    kw = dict(n=60000, rate=0.1, sigma=5.0, steps=5540, delta=1e-5)
    exact = compute_epsilon("checkin", method="exact", **kw)
    summed = compute_epsilon("checkin", method="sum", **kw)
    thm3 = compute_epsilon("checkin", method="theorem3", **kw)
    central = compute_epsilon(
        "subsampled-gaussian", rate=0.1, sigma=5.0 * math.sqrt(6000), steps=5540, delta=1e-5
    )
    assert central.epsilon <= exact.epsilon <= 1.05 * central.epsilon
    assert exact.epsilon < summed.epsilon <= thm3.epsilon
    assert thm3.epsilon > 100 * exact.epsilon


def test_wang_bound_recovers_theorem2_formula():
    # Theorem 2 evaluated term by term in floating point for a small case.
    n, m, sigma = 50, 10, 1.5
    orders = np.arange(2, 12)
    eps_m = shuffle_gaussian_rdp(n=m, sigma=sigma, orders=np.arange(2, 12))
    g = m / n
    want = []
    for lam in orders:
        s = 1 + g**2 * math.comb(lam, 2) * min(4 * math.expm1(eps_m[0]), 2 * math.exp(eps_m[0]))
        for j in range(3, lam + 1):
            s += 2 * g**j * math.comb(lam, j) * math.exp((j - 1) * eps_m[j - 2])
        want.append(math.log(s) / (lam - 1))
    got = subsampled_shuffle_rdp(n=n, m=m, sigma=sigma, orders=orders)
    np.testing.assert_allclose(got, want, rtol=1e-12)


@functools.cache
def _opacus_compute_rdp() -> Callable[..., np.ndarray]:
    """Opacus's ``compute_rdp``, its module opacus/accountants/analysis/rdp.py loaded alone.

    That module imports only math, warnings, typing, numpy and scipy; ``import opacus`` would
    load torch first (3-5 s of this file's time, for nothing this reference uses).
    """
    spec = importlib.util.find_spec("opacus")  # locates the package without running it
    assert spec is not None and spec.submodule_search_locations
    path = Path(spec.submodule_search_locations[0], "accountants", "analysis", "rdp.py")
    module_spec = importlib.util.spec_from_file_location("_opacus_rdp_analysis", path)
    assert module_spec is not None and module_spec.loader is not None
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module.compute_rdp


@pytest.mark.parametrize(("q", "s"), [(0.1, 387.3), (0.01, 1.1), (1.0, 2.0), (0.3, 0.7)])
def test_central_reference_matches_mpmath_and_opacus(q, s):
    import mpmath as mp

    compute_rdp = _opacus_compute_rdp()
    orders = np.arange(2, 120)
    got = poisson_subsampled_gaussian_rdp(rate=q, sigma=s, orders=orders)
    with mp.workdps(50):
        big_q = mp.mpf(q)
        for lam in (2, 3, 17, 119):
            moment = sum(
                mp.binomial(lam, j)
                * (1 - big_q) ** (lam - j)
                * big_q**j
                * mp.e ** (mp.mpf(j * j - j) / (2 * mp.mpf(s) ** 2))
                for j in range(lam + 1)
            )
            assert got[lam - 2] == pytest.approx(float(mp.log(moment) / (lam - 1)), rel=1e-12)
    # Opacus sums the same series without separating the excess; it agrees to its precision.
    want = compute_rdp(q=q, noise_multiplier=s, steps=1, orders=list(orders))
    np.testing.assert_allclose(got, want, rtol=1e-6)
