"""The binomial distribution's mass, tails and quantiles without importing ``scipy.stats``.

``scipy.stats.binom`` evaluates Boost's binomial functions, which scipy >= 1.14 keeps as ufuncs
in ``scipy.special._ufuncs`` (``_binom_pmf`` and friends); importing ``scipy.stats`` costs about
0.3 s more than ``scipy.special``. The functions here call those same ufuncs and apply the rules
``scipy.stats.binom`` applies around them (support, integer ``k``, clipping to ``[0, 1]``, the
conventions of the quantiles at 0 and 1, ``nan`` for invalid parameters), so that they return
the very same floats: the clones bound computed with them is bit for bit the one computed with
``scipy.stats`` (``tests/analysis/test_binomial.py`` checks both against each other). Where the
ufuncs are missing (scipy older than 1.14, or renamed later) the functions call
``scipy.stats.binom`` itself: slower to import, same values.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import numpy as np

__all__ = [
    "binom_cdf",
    "binom_isf",
    "binom_logcdf",
    "binom_logpmf",
    "binom_logsf",
    "binom_pmf",
    "binom_ppf",
    "binom_sf",
]

_Ufunc = Callable[..., Any]
_Settled = tuple[np.ndarray, np.ndarray]  # (which points, their values)


@functools.cache
def _kernels() -> dict[str, _Ufunc] | None:
    """Boost's binomial ufuncs from ``scipy.special``, or ``None`` where this scipy lacks them."""
    from scipy.special import _ufuncs

    found: dict[str, _Ufunc] = {}
    for name in ("pmf", "cdf", "sf", "ppf", "isf"):
        kernel = getattr(_ufuncs, f"_binom_{name}", None)
        if kernel is None:
            return None
        found[name] = kernel
    return found


def _stats_binom() -> Any:
    """``scipy.stats.binom``, for a scipy without the ufuncs in ``scipy.special``."""
    from scipy.stats import binom

    return binom


def _evaluate(
    name: str, x: Any, n: Any, p: Any, ends: Callable[[np.ndarray, np.ndarray], _Settled]
) -> Any:
    """Kernel ``name`` at every point that ``ends`` does not settle, for valid parameters.

    ``ends(x, n)`` gives the points whose value follows from the support alone (outside it, or
    a quantile at 0 or 1) and their values; invalid parameters and ``nan`` give ``nan``.
    """
    x, n, p = np.asarray(x, dtype=float), np.asarray(n, dtype=float), np.asarray(p, dtype=float)
    if not x.shape == n.shape == p.shape:  # (broadcasting equal shapes would change nothing)
        x, n, p = np.broadcast_arrays(x, n, p)
    valid = (n >= 0) & (n == n.round()) & (p >= 0) & (p <= 1) & ~np.isnan(x)
    settled, value = ends(x, n)
    out = np.where(settled, value, np.nan)
    ask = valid & ~settled
    if ask.any():
        kernels = _kernels()
        assert kernels is not None
        if name.startswith("log"):
            out[ask] = _log_kernel(name, kernels, x[ask], n[ask], p[ask])
        else:
            found = kernels[name](x[ask], n[ask], p[ask])
            # scipy clips masses and tails to [0, 1], and adds its location (0) to quantiles.
            out[ask] = found + 0.0 if name in ("ppf", "isf") else found.clip(0.0, 1.0)
    out[~valid] = np.nan
    return out[()] if out.ndim == 0 else out


def _log_kernel(
    name: str, kernels: dict[str, _Ufunc], x: np.ndarray, n: np.ndarray, p: np.ndarray
) -> np.ndarray:
    """``scipy.stats.binom``'s logarithms at points inside the support, as it computes them.

    ``logpmf`` is its log-gamma formula (not the log of the mass); ``logcdf`` and ``logsf`` are
    the logarithms of the Boost tails, unclipped.
    """
    from scipy.special import gammaln, xlog1py, xlogy

    if name == "logpmf":
        k = np.floor(x)
        combiln = gammaln(n + 1) - (gammaln(k + 1) + gammaln(n - k + 1))
        return np.asarray(combiln + xlogy(k, p) + xlog1py(n - k, -p))
    with np.errstate(divide="ignore"):
        return np.asarray(np.log(kernels[name.removeprefix("log")](np.floor(x), n, p)))


def half_pmf_sf(k: np.ndarray, n: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``binom_pmf(k, n, 0.5)`` and ``binom_sf(k, n, 0.5)`` without the checks, for the clones sum.

    Only for float arrays ``n`` of integers ``>= 0`` and ``k`` of integers in ``[0, n + 1]``
    (broadcast together), where every check of the public functions passes and only the end
    of the support is settled without the kernel. There the values are the very same floats
    (the kernels are elementwise; the points off the support get the same 0, the others the
    same clipped kernel value): :func:`binom_pmf` and :func:`binom_sf` spend nearly all their
    time on numpy call overhead for the few points the clones sum asks about.

    Args:
        k: Points (float array of integers in ``[0, n + 1]``).
        n: Numbers of trials (float array of integers ``>= 0``), broadcast with ``k``.

    Returns:
        The masses and the upper tails ``Pr[Bin(n, 1/2) > k]``, broadcast over ``k`` and ``n``.
    """
    kernels = _kernels()
    if kernels is None:
        return binom_pmf(k, n, 0.5), binom_sf(k, n, 0.5)
    # Off the support the kernels give nan, which np.where drops.
    pmf = np.where(k <= n, kernels["pmf"](k, n, 0.5).clip(0.0, 1.0), 0.0)
    sf = np.where(k < n, kernels["sf"](k, n, 0.5).clip(0.0, 1.0), 0.0)
    return pmf, sf


def binom_pmf(k: Any, n: Any, p: Any) -> Any:
    """``Pr[Bin(n, p) = k]``, as ``scipy.stats.binom.pmf(k, n, p)``.

    Args:
        k: Points (array-like; 0 off the integers ``0..n``).
        n: Numbers of trials (array-like; integers >= 0, else ``nan``).
        p: Success probabilities (array-like; in ``[0, 1]``, else ``nan``).

    Returns:
        The masses, broadcast over the arguments (a numpy scalar for scalar arguments).
    """
    if _kernels() is None:
        return _stats_binom().pmf(k, n, p)

    def ends(x: np.ndarray, trials: np.ndarray) -> _Settled:
        inside = (x >= 0) & (x <= trials) & (np.floor(x) == x)
        return ~inside, np.zeros_like(x)

    return _evaluate("pmf", k, n, p, ends)


def binom_cdf(k: Any, n: Any, p: Any) -> Any:
    """``Pr[Bin(n, p) <= k]``, as ``scipy.stats.binom.cdf(k, n, p)``.

    Args:
        k: Points (array-like; a non-integer ``k`` counts as ``floor(k)``).
        n: Numbers of trials (array-like; integers >= 0, else ``nan``).
        p: Success probabilities (array-like; in ``[0, 1]``, else ``nan``).

    Returns:
        The lower tails, broadcast over the arguments (a numpy scalar for scalar arguments).
    """
    if _kernels() is None:
        return _stats_binom().cdf(k, n, p)

    def ends(x: np.ndarray, trials: np.ndarray) -> _Settled:
        return (x < 0) | (x >= trials), np.where(x >= trials, 1.0, 0.0)

    return _evaluate("cdf", np.floor(k), n, p, ends)


def binom_sf(k: Any, n: Any, p: Any) -> Any:
    """``Pr[Bin(n, p) > k]``, as ``scipy.stats.binom.sf(k, n, p)``.

    Args:
        k: Points (array-like; a non-integer ``k`` counts as ``floor(k)``).
        n: Numbers of trials (array-like; integers >= 0, else ``nan``).
        p: Success probabilities (array-like; in ``[0, 1]``, else ``nan``).

    Returns:
        The upper tails, broadcast over the arguments (a numpy scalar for scalar arguments).
    """
    if _kernels() is None:
        return _stats_binom().sf(k, n, p)

    def ends(x: np.ndarray, trials: np.ndarray) -> _Settled:
        return (x < 0) | (x >= trials), np.where(x < 0, 1.0, 0.0)

    return _evaluate("sf", np.floor(k), n, p, ends)


def binom_ppf(q: Any, n: Any, p: Any) -> Any:
    """Smallest ``k`` with ``Pr[Bin(n, p) <= k] >= q``, as ``scipy.stats.binom.ppf(q, n, p)``.

    As in scipy, ``q = 0`` gives ``-1`` and ``q = 1`` gives ``n``.

    Args:
        q: Lower-tail probabilities (array-like; in ``[0, 1]``, else ``nan``).
        n: Numbers of trials (array-like; integers >= 0, else ``nan``).
        p: Success probabilities (array-like; in ``[0, 1]``, else ``nan``).

    Returns:
        The quantiles as floats, broadcast over the arguments.
    """
    if _kernels() is None:
        return _stats_binom().ppf(q, n, p)

    def ends(x: np.ndarray, trials: np.ndarray) -> _Settled:
        return (x <= 0) | (x >= 1), np.where(x == 0, -1.0, np.where(x == 1, trials, np.nan))

    return _evaluate("ppf", q, n, p, ends)


def binom_isf(q: Any, n: Any, p: Any) -> Any:
    """Smallest ``k`` with ``Pr[Bin(n, p) > k] <= q``, as ``scipy.stats.binom.isf(q, n, p)``.

    As in scipy, ``q = 1`` gives ``-1`` and ``q = 0`` gives ``n``.

    Args:
        q: Upper-tail probabilities (array-like; in ``[0, 1]``, else ``nan``).
        n: Numbers of trials (array-like; integers >= 0, else ``nan``).
        p: Success probabilities (array-like; in ``[0, 1]``, else ``nan``).

    Returns:
        The quantiles as floats, broadcast over the arguments.
    """
    if _kernels() is None:
        return _stats_binom().isf(q, n, p)

    def ends(x: np.ndarray, trials: np.ndarray) -> _Settled:
        return (x <= 0) | (x >= 1), np.where(x == 1, -1.0, np.where(x == 0, trials, np.nan))

    return _evaluate("isf", q, n, p, ends)


def binom_logpmf(k: Any, n: Any, p: Any) -> Any:
    """``log Pr[Bin(n, p) = k]``, as ``scipy.stats.binom.logpmf(k, n, p)``.

    Args:
        k: Points (array-like; ``-inf`` off the integers ``0..n``).
        n: Numbers of trials (array-like; integers >= 0, else ``nan``).
        p: Success probabilities (array-like; in ``[0, 1]``, else ``nan``).

    Returns:
        The log masses, broadcast over the arguments (a numpy scalar for scalar arguments).
    """
    if _kernels() is None:
        return _stats_binom().logpmf(k, n, p)

    def ends(x: np.ndarray, trials: np.ndarray) -> _Settled:
        inside = (x >= 0) & (x <= trials) & (np.floor(x) == x)
        return ~inside, np.full_like(x, -np.inf)

    return _evaluate("logpmf", k, n, p, ends)


def binom_logcdf(k: Any, n: Any, p: Any) -> Any:
    """``log Pr[Bin(n, p) <= k]``, as ``scipy.stats.binom.logcdf(k, n, p)``.

    Args:
        k: Points (array-like; a non-integer ``k`` counts as ``floor(k)``).
        n: Numbers of trials (array-like; integers >= 0, else ``nan``).
        p: Success probabilities (array-like; in ``[0, 1]``, else ``nan``).

    Returns:
        The log lower tails, broadcast over the arguments (a numpy scalar for scalar
        arguments).
    """
    if _kernels() is None:
        return _stats_binom().logcdf(k, n, p)

    def ends(x: np.ndarray, trials: np.ndarray) -> _Settled:
        return (x < 0) | (x >= trials), np.where(x >= trials, 0.0, -np.inf)

    out = _evaluate("logcdf", np.floor(k), n, p, ends)
    # scipy writes 0 wherever k >= n after its nan for bad parameters, so bad ones get 0 there.
    beyond = np.asarray(k, dtype=float) >= np.asarray(n, dtype=float)
    if not np.any(beyond):
        return out
    return np.where(beyond, 0.0, out)[()]


def binom_logsf(k: Any, n: Any, p: Any) -> Any:
    """``log Pr[Bin(n, p) > k]``, as ``scipy.stats.binom.logsf(k, n, p)``.

    Args:
        k: Points (array-like; a non-integer ``k`` counts as ``floor(k)``).
        n: Numbers of trials (array-like; integers >= 0, else ``nan``).
        p: Success probabilities (array-like; in ``[0, 1]``, else ``nan``).

    Returns:
        The log upper tails, broadcast over the arguments (a numpy scalar for scalar
        arguments).
    """
    if _kernels() is None:
        return _stats_binom().logsf(k, n, p)

    def ends(x: np.ndarray, trials: np.ndarray) -> _Settled:
        return (x < 0) | (x >= trials), np.where(x < 0, 0.0, -np.inf)

    return _evaluate("logsf", np.floor(k), n, p, ends)
