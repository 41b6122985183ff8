"""The Gaussian mechanism's exact (eps, delta) profile (Balle & Wang 2018, Theorem 8)."""

from __future__ import annotations

import math

import mpmath as mp
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from shuffle_opacus.analysis.approximate.analytic_gaussian import (
    gaussian_dp_delta,
    gaussian_dp_epsilon,
)


def hockey_stick_quadrature(eps: float, sigma: float) -> mp.mpf:
    """Integrate max(0, p(x) - e^eps q(x)) for p = N(0, sigma^2), q = N(1, sigma^2) in mpmath."""
    mp.mp.dps = 40
    s = mp.mpf(sigma)
    # p > e^eps q  <=>  x < 1/2 - eps sigma^2 (the likelihood ratio is monotone).
    cut = mp.mpf(0.5) - eps * s**2

    def integrand(x):
        return mp.npdf(x, 0, s) - mp.e**eps * mp.npdf(x, 1, s)

    return mp.quad(integrand, [-mp.inf, cut - 10 * s, cut])


@pytest.mark.parametrize(("eps", "sigma"), [(0.0, 1.0), (0.5, 1.0), (1.0, 2.0), (3.0, 0.7)])
def test_profile_against_quadrature(eps, sigma):
    expected = float(hockey_stick_quadrature(eps, sigma))
    assert gaussian_dp_delta(eps, sigma=sigma) == pytest.approx(expected, rel=1e-9)


def test_tiny_deltas_keep_their_digits():
    # Far in the tail the difference of two Phi values would cancel to 0 in plain floats.
    expected = float(hockey_stick_quadrature(12.0, 1.0))
    assert 0 < expected < 1e-20
    assert gaussian_dp_delta(12.0, sigma=1.0) == pytest.approx(expected, rel=1e-8)


def test_classical_calibration_is_looser_for_the_table1_setting():
    # sigma = 2 sqrt(2 log(1.25 n)) at sensitivity 2 is the classical (1, 1/n) calibration; the
    # exact profile gives a smaller epsilon at the same delta.
    n = 60_000
    sigma = math.sqrt(2 * math.log(1.25 * n))  # per unit of sensitivity 2
    assert gaussian_dp_epsilon(1 / n, sigma=sigma) < 1.0


@example(sigma=4.6875, log_delta=-35.9049078547248)  # once off by one rounding step
@settings(max_examples=40, deadline=None)
@given(
    sigma=st.floats(min_value=0.2, max_value=20.0),
    log_delta=st.floats(min_value=-40.0, max_value=-1.0),
)
def test_epsilon_inverts_delta(sigma, log_delta):
    delta = 10.0**log_delta
    eps = gaussian_dp_epsilon(delta, sigma=sigma)
    assert gaussian_dp_delta(eps, sigma=sigma) <= delta
    if eps > 1e-9:
        assert gaussian_dp_delta(eps * (1 - 1e-6), sigma=sigma) > delta


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: gaussian_dp_delta(-1.0, sigma=1.0), "eps must be"),
        (lambda: gaussian_dp_delta(1.0, sigma=0.0), "sigma must be"),
        (lambda: gaussian_dp_epsilon(0.0, sigma=1.0), "delta must be"),
        (lambda: gaussian_dp_epsilon(1e-5, sigma=math.inf), "sigma must be"),
    ],
)
def test_bad_arguments(call, message):
    with pytest.raises(ValueError, match=message):
        call()
