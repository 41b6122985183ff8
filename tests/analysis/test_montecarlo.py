"""Monte Carlo hockey-stick divergence of the shuffled Gaussian (arXiv:2106.00477 §5)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from shuffle_opacus.analysis.approximate.analytic_gaussian import gaussian_dp_delta
from shuffle_opacus.analysis.montecarlo import shuffled_gaussian_delta_mc
from shuffle_opacus.analysis.rdp.conversion import delta_from_rdp
from shuffle_opacus.analysis.rdp.shuffle_gaussian import shuffle_gaussian_rdp

SAMPLES = 200_000


@pytest.mark.parametrize("direction", ["remove", "add"])
@pytest.mark.parametrize("eps", [0.0, 0.4, 1.0])
def test_one_user_is_the_gaussian_mechanism(direction, eps):
    # n = 1: no shuffling; the exact profile is Balle & Wang's (symmetric in direction).
    est = shuffled_gaussian_delta_mc(eps, n=1, sigma=2.0, samples=SAMPLES, direction=direction)
    exact = gaussian_dp_delta(eps, sigma=2.0)
    assert abs(est.delta - exact) < 4.5 * est.stderr


@pytest.mark.parametrize("n", [2, 3, 5, 7])
@pytest.mark.parametrize("eps", [0.05, 0.2, 0.5])
def test_rdp_derived_delta_stays_above_the_estimate(n, eps):
    # The shuffle-Gaussian RDP (Theorem 1) converted at eps is an upper bound on the true
    # delta(eps); the estimate of the true value must not exceed it (beyond sampling error).
    orders = np.arange(2, 257)
    bound, _ = delta_from_rdp(
        orders=orders, rdp=shuffle_gaussian_rdp(n=n, sigma=2.0, orders=orders), eps=eps
    )
    for direction in ("remove", "add"):
        est = shuffled_gaussian_delta_mc(
            eps, n=n, sigma=2.0, samples=SAMPLES, direction=direction, seed=n
        )
        assert est.delta - 4.5 * est.stderr <= bound, (direction, est, bound)


def test_repeated_runs_agree_within_their_standard_errors():
    runs = [
        shuffled_gaussian_delta_mc(0.3, n=4, sigma=2.0, samples=SAMPLES, seed=s) for s in range(4)
    ]
    for a in runs:
        for b in runs:
            assert abs(a.delta - b.delta) <= 5 * math.hypot(a.stderr, b.stderr)
    again = shuffled_gaussian_delta_mc(0.3, n=4, sigma=2.0, samples=SAMPLES, seed=0)
    assert again == runs[0]  # a seed fixes the estimate


def test_shuffling_lowers_delta():
    one = gaussian_dp_delta(0.3, sigma=2.0)
    seven = shuffled_gaussian_delta_mc(0.3, n=7, sigma=2.0, samples=SAMPLES)
    assert seven.delta + 5 * seven.stderr < one


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"eps": -0.1}, "eps must be"),
        ({"n": 0}, "n must be"),
        ({"sigma": 0.0}, "sigma must be"),
        ({"samples": 10}, "samples must be"),
        ({"direction": "both"}, "direction must be one of remove, add"),
    ],
)
def test_bad_arguments(kwargs, message):
    args = {"eps": 0.1, "n": 3, "sigma": 2.0} | kwargs
    eps = args.pop("eps")
    with pytest.raises(ValueError, match=message):
        shuffled_gaussian_delta_mc(eps, **args)


@pytest.mark.parametrize("sigma", [0.7, 2.0, 9.0])
@pytest.mark.parametrize("delta", [1e-3, 1e-6, 1e-10])
def test_delta_from_rdp_inverts_lemma2(sigma, delta):
    from shuffle_opacus.analysis.rdp.central import gaussian_rdp
    from shuffle_opacus.analysis.rdp.conversion import rdp_to_dp

    orders = np.arange(2, 513)
    rdp = gaussian_rdp(sigma=sigma, orders=orders)
    eps, order = rdp_to_dp(orders=orders, rdp=rdp, delta=delta)
    back, back_order = delta_from_rdp(orders=orders, rdp=rdp, eps=eps)
    assert back == pytest.approx(delta, rel=1e-9) and back_order == order
    # Written out by hand at that order: (l-1)(rdp - eps + log(1 - 1/l)) - log l.
    lam = float(order)
    by_hand = math.exp(
        (lam - 1) * (lam / (2 * sigma**2) - eps + math.log(1 - 1 / lam)) - math.log(lam)
    )
    assert back == pytest.approx(by_hand, rel=1e-9)
