"""Brent's bounded minimisation against ``scipy.optimize.minimize_scalar(method="bounded")``.

``clones_gaussian`` refines its choice of ``delta0`` with
``shuffle_opacus.analysis.approximate._minimize.minimize_bounded`` instead of scipy's bounded
method; both implement Brent's method with the same tolerances, so on any function they must
visit the same points, in the same order, and return the same minimiser, bit for bit.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.optimize import minimize_scalar

from shuffle_opacus.analysis.approximate._minimize import minimize_bounded


def _visits(minimise, f):
    """The points ``minimise(f)`` evaluates, in order, and the point it returns."""
    seen: list[float] = []

    def recorded(x):
        seen.append(float(x))
        return f(x)

    return seen, float(minimise(recorded))


def _assert_same_search(f, lower, upper, xatol):
    ours = _visits(lambda g: minimize_bounded(g, lower, upper, xatol=xatol), f)
    theirs = _visits(
        lambda g: (
            minimize_scalar(g, bounds=(lower, upper), method="bounded", options={"xatol": xatol}).x
        ),
        f,
    )
    assert ours == theirs


def _random_function(rng: np.random.Generator):
    """A smooth, multimodal, capped, flat or discontinuous function of one variable."""
    kind = rng.integers(0, 5)
    centre, scale = rng.uniform(-30.0, 30.0), 10.0 ** rng.uniform(-2.0, 2.0)
    if kind == 0:  # a polynomial of degree 2 to 6
        coefficients = rng.normal(size=rng.integers(3, 8))
        return lambda x: float(np.polyval(coefficients, (x - centre) / scale))
    if kind == 1:  # many local minima
        frequency = rng.uniform(0.1, 5.0)
        return lambda x: math.sin(frequency * x) + ((x - centre) / scale) ** 2
    if kind == 2:  # capped, as clones_gaussian caps an infeasible delta0 at 1e6
        return lambda x: min(math.exp(min(abs(x - centre) / scale, 700.0)), 1e6)
    if kind == 3:  # steps, as a bisection to a tolerance makes its answer
        return lambda x: math.floor(((x - centre) / scale) ** 2 * 7.0) / 7.0
    return lambda x: abs(x - centre) ** 0.5  # a cusp


@pytest.mark.parametrize("seed", range(8))
def test_the_same_points_as_scipy_on_random_functions(seed):
    rng = np.random.default_rng(seed)
    for _ in range(60):
        f = _random_function(rng)
        lower = rng.uniform(-60.0, 20.0)
        upper = lower + 10.0 ** rng.uniform(-3.0, 2.0)
        xatol = 10.0 ** rng.uniform(-8.0, -1.0)
        _assert_same_search(f, lower, upper, xatol)


def test_the_same_points_as_scipy_on_the_clones_objective():
    # The delta0 search of clones_gaussian itself (log delta0 between grid points).
    from shuffle_opacus.analysis.approximate.clones import _gaussian_at

    # Small n keeps it cheap (the numerical bound's cost grows with n; 1e5 took 5 s); the
    # closed form is cheap at any n.
    cases = [(2_000, 3.0, 1e-6, "numerical"), (1000, 1.0, 1e-6, "numerical")]
    cases += [(n, s, d, "closed-form") for n, s, d in [(20_000, 3.0, 1e-6), (100_000, 10.0, 1e-8)]]
    for n, sigma, delta, method in cases:
        top = math.log(delta / (3.0 * n))

        def f(g, n=n, sigma=sigma, delta=delta, method=method):
            return min(_gaussian_at(g, n, sigma, delta, method, 1e-6)[0], 1e6)

        _assert_same_search(f, top - 16.0, top, 1e-2)


@pytest.mark.parametrize("where", [0.0, 0.3, 0.5, 0.999, 1.0])
def test_finds_the_minimum_of_a_parabola(where):
    lower, upper = -2.0, 3.0
    centre = lower + where * (upper - lower)
    found = minimize_bounded(lambda x: (x - centre) ** 2, lower, upper, xatol=1e-6)
    assert lower < found < upper
    assert abs(found - centre) <= 1e-5


def test_stops_after_the_evaluations_it_is_allowed():
    calls = []
    minimize_bounded(lambda x: calls.append(x) or math.sin(x), 0.0, 100.0, max_evaluations=5)
    assert len(calls) == 5


@pytest.mark.parametrize(
    ("lower", "upper", "xatol"), [(1.0, 1.0, 1e-5), (2.0, 1.0, 1e-5), (0.0, math.inf, 1e-5),
                                  (math.nan, 1.0, 1e-5), (0.0, 1.0, 0.0)]
)  # fmt: skip
def test_bad_arguments(lower, upper, xatol):
    with pytest.raises(ValueError, match="need"):
        minimize_bounded(lambda x: x, lower, upper, xatol=xatol)
