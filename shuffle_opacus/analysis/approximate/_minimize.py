"""Brent's minimisation of a function of one variable on an interval, without scipy.optimize.

The method of R. P. Brent, *Algorithms for Minimization without Derivatives* (1973), chapter 5,
in the form of Forsythe, Malcolm & Moler's ``fmin`` (*Computer Methods for Mathematical
Computations*, 1977): golden-section steps, replaced by the step to the vertex of the parabola
through the three best points whenever that step is small and falls inside the bracket. It is
the method of ``scipy.optimize.minimize_scalar(method="bounded")``, written here so that
:func:`.clones.clones_gaussian` needs no ``scipy.optimize`` (0.35 s to import). Its relative
tolerance is ``sqrt(2.2e-16)``, the value scipy uses, so that the points it visits, and so the
clones numbers derived from them, are the same as with scipy's
(``tests/analysis/test_minimize.py`` compares the two).
"""

from __future__ import annotations

import math
from collections.abc import Callable

__all__ = ["minimize_bounded"]

_GOLDEN = 0.5 * (3.0 - math.sqrt(5.0))
"""Fraction of the larger part of the bracket stepped into by a golden-section step."""

_SQRT_EPS = math.sqrt(2.2e-16)
"""Relative tolerance on the abscissa: the square root of (about) the double precision."""


def _step(
    x: float, a: float, b: float, tol1: float, e: float, d: float, points: tuple[float, ...]
) -> tuple[float, float]:
    """Return the next step ``d`` from ``x`` and the new ``e`` (the step before the last).

    ``points`` is ``(w, v, fx, fw, fv)``: the second and third best points and the values at
    ``x``, ``w`` and ``v``. A parabolic step is taken when the parabola's vertex is less than
    half the step before last away and strictly inside ``(a, b)``; otherwise a golden-section
    step into the larger part of the bracket.
    """
    mid = 0.5 * (a + b)
    if abs(e) > tol1:
        w, v, fx, fw, fv = points
        r = (x - w) * (fx - fv)
        q = (x - v) * (fx - fw)
        p = (x - v) * q - (x - w) * r
        q = 2.0 * (q - r)
        if q > 0.0:
            p = -p
        q = abs(q)
        before_last, e = e, d
        if abs(p) < abs(0.5 * q * before_last) and q * (a - x) < p < q * (b - x):
            d = p / q
            u = x + d
            if u - a < 2.0 * tol1 or b - u < 2.0 * tol1:  # not too near an end
                d = tol1 if mid - x >= 0 else -tol1
            return d, e
    e = (a - x) if x >= mid else (b - x)
    return _GOLDEN * e, e


def minimize_bounded(
    f: Callable[[float], float],
    lower: float,
    upper: float,
    *,
    xatol: float = 1e-5,
    max_evaluations: int = 500,
) -> float:
    """Return a local minimiser of ``f`` on ``[lower, upper]`` by Brent's method.

    Every point evaluated lies strictly inside the interval, and no two are closer than the
    tolerance ``sqrt(2.2e-16) |x| + xatol / 3``. The search stops when the bracket around the
    best point found is within twice that tolerance of it, or after ``max_evaluations``
    evaluations.

    Args:
        f: The function (finite values are expected; ``inf`` counts as larger than any).
        lower: Left end of the interval (finite).
        upper: Right end (finite, ``> lower``).
        xatol: Absolute tolerance on the minimiser (> 0).
        max_evaluations: Most evaluations of ``f`` (>= 1).

    Returns:
        The best point found.

    Raises:
        ValueError: if the interval is not finite and non-empty, or a tolerance is not > 0.
    """
    if not (math.isfinite(lower) and math.isfinite(upper) and lower < upper):
        raise ValueError(f"need finite lower < upper. Found {lower!r}, {upper!r}.")
    if not xatol > 0 or max_evaluations < 1:
        raise ValueError(f"need xatol > 0 and max_evaluations >= 1. Found {xatol!r}.")
    a, b = lower, upper
    x = w = v = a + _GOLDEN * (b - a)
    fx = fw = fv = f(x)
    evaluations = 1
    d = e = 0.0
    while evaluations < max_evaluations:
        tol1 = _SQRT_EPS * abs(x) + xatol / 3.0
        if abs(x - 0.5 * (a + b)) <= 2.0 * tol1 - 0.5 * (b - a):
            break
        d, e = _step(x, a, b, tol1, e, d, (w, v, fx, fw, fv))
        # Never a step shorter than the tolerance.
        u = x + (d if abs(d) >= tol1 else (tol1 if d >= 0 else -tol1))
        fu = f(u)
        evaluations += 1
        if fu <= fx:  # u is the new best point; x becomes an end of the bracket
            if u >= x:
                a = x
            else:
                b = x
            v, fv, w, fw, x, fx = w, fw, x, fx, u, fu
            continue
        if u < x:
            a = u
        else:
            b = u
        if fu <= fw or w == x:
            v, fv, w, fw = w, fw, u, fu
        elif fu <= fv or v == x or v == w:
            v, fv = u, fu
    return x
