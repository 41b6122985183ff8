"""Argument checks shared by the public functions of the maths layer.

Every check raises ``ValueError`` with one line that names the parameter, the allowed range and
the value found, in the style ``"sigma must be > 0. Found -1."``.

What counts as a number is the same everywhere: a real number in the sense of
:class:`numbers.Real` (Python ``int``, ``float``, ``fractions.Fraction`` and numpy's integer and
floating scalars). Booleans (Python's and numpy's), strings, arrays and tensors are refused,
whatever they would convert to: ``noise_multiplier="1.0"`` or ``True`` is an error, not 1.0.
Convert a 0-d tensor or array with ``.item()`` first.
"""

from __future__ import annotations

import math
import numbers

import numpy as np

__all__ = [
    "MAX_INT",
    "real_value",
    "describe_value",
    "check_int",
    "check_positive",
    "check_sigma",
    "SIGMA_RANGE",
    "check_probability",
    "check_delta",
    "check_target_delta",
    "MIN_DELTA",
    "check_orders",
    "MAX_ORDER",
]


MAX_INT = 1 << 62
"""Largest count (users, rounds, domain size) accepted: the series and enumerations use int64
arithmetic. Other integers (seeds) are not capped."""

COUNT_NAMES = frozenset({"n", "m", "k", "steps", "rounds", "population", "sample_size"})
"""Parameters :func:`check_int` caps at :data:`MAX_INT` when no ``maximum`` is given."""


MAX_ORDER = 1 << 15
"""Largest Rényi order any function of the package evaluates (32768). Theorem 1 at this order
takes about 40 s for ``n >= L``; beyond it the ``O(L^2)`` series and their work arrays grow
without bound while the conversion gains nothing measurable (Lemma 2's floor at ``L = 32768``
and ``delta = 1e-5`` is 3.5e-6)."""


def real_value(value: object) -> float | None:
    """Return ``value`` as ``float`` if it is a real number (see the module docstring).

    Args:
        value: Anything.

    Returns:
        ``float(value)`` for a real number that is not a bool, else ``None``.
    """
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        return None
    return float(value)


def describe_value(value: object) -> str:
    """Describe a value in a message: its repr, and its type when that is not a number.

    Args:
        value: Anything.

    Returns:
        The text that follows ``Found`` in a one-line error.
    """
    if real_value(value) is None:
        return f"{value!r} (a {type(value).__name__}, not a real number)"
    return repr(value)


def check_int(name: str, value: object, *, minimum: int = 1, maximum: int | None = None) -> int:
    """Return ``value`` as ``int`` if it is an integer in ``[minimum, maximum]``.

    ``maximum`` defaults to :data:`MAX_INT` for the counts of :data:`COUNT_NAMES` and to no
    bound otherwise.

    Raises:
        ValueError: if ``value`` is not an integer (bools and non-integral floats included) or
            lies outside the range.
    """
    if isinstance(value, bool) or not isinstance(value, (numbers.Integral, float, np.floating)):
        raise ValueError(f"{name} must be an integer >= {minimum}. Found {describe_value(value)}.")
    if isinstance(value, (float, np.floating)) and not float(value).is_integer():
        raise ValueError(f"{name} must be an integer >= {minimum}. Found {value!r}.")
    ivalue = int(value)
    top = MAX_INT if maximum is None and name in COUNT_NAMES else maximum
    if ivalue < minimum or (top is not None and ivalue > top):
        shown = maximum is not None or (top is not None and ivalue > top)
        allowed = f"in [{minimum}, {top}]" if shown else f">= {minimum}"
        raise ValueError(f"{name} must be an integer {allowed}. Found {value!r}.")
    return ivalue


def check_positive(name: str, value: object) -> float:
    """Return ``value`` as ``float`` if it is a finite real number ``> 0``.

    Raises:
        ValueError: otherwise (a bool, string or tensor included).
    """
    fvalue = real_value(value)
    if fvalue is None:
        raise ValueError(f"{name} must be a finite number > 0. Found {describe_value(value)}.")
    if not math.isfinite(fvalue) or fvalue <= 0.0:
        raise ValueError(f"{name} must be a finite number > 0. Found {value!r}.")
    return fvalue


SIGMA_RANGE = (1e-150, 1e150)
"""Noise ratios the Gaussian analyses accept: their squares and inverse squares stay finite
floats. Outside it epsilon is 0 or unbounded to every printed digit anyway."""


def check_sigma(value: object, name: str = "sigma") -> float:
    """Return a noise ratio as ``float`` if it is a real number in :data:`SIGMA_RANGE`.

    Raises:
        ValueError: otherwise, naming the range.
    """
    low, high = SIGMA_RANGE
    message = (
        f"{name} must be a finite number > 0 in [{low:g}, {high:g}]. Found {describe_value(value)}."
    )
    fvalue = real_value(value)
    if fvalue is None or not (low <= fvalue <= high):
        raise ValueError(message)
    return fvalue


def check_nonnegative(name: str, value: object) -> float:
    """Return ``value`` as ``float`` if it is a finite real number ``>= 0``.

    Raises:
        ValueError: otherwise (a bool, string or tensor included).
    """
    fvalue = real_value(value)
    if fvalue is None:
        raise ValueError(f"{name} must be a finite number >= 0. Found {describe_value(value)}.")
    if not math.isfinite(fvalue) or fvalue < 0.0:
        raise ValueError(f"{name} must be a finite number >= 0. Found {value!r}.")
    return fvalue


def check_probability(name: str, value: object, *, allow_zero: bool = False) -> float:
    """Return ``value`` as ``float`` if it is a real number in ``(0, 1]`` (or ``[0, 1]``).

    The closed interval applies with ``allow_zero``.

    Raises:
        ValueError: otherwise (a bool, string or tensor included).
    """
    interval = "[0, 1]" if allow_zero else "(0, 1]"
    fvalue = real_value(value)
    if fvalue is None:
        raise ValueError(f"{name} must be a number in {interval}. Found {describe_value(value)}.")
    low_ok = fvalue >= 0.0 if allow_zero else fvalue > 0.0
    if not (math.isfinite(fvalue) and low_ok and fvalue <= 1.0):
        raise ValueError(f"{name} must be in {interval}. Found {value!r}.")
    return fvalue


def check_delta(value: object, name: str = "delta") -> float:
    """Return ``value`` as ``float`` if it is a real number in the open interval ``(0, 1)``.

    Raises:
        ValueError: otherwise (a bool, string or tensor included).
    """
    fvalue = real_value(value)
    if fvalue is None:
        raise ValueError(f"{name} must be a number in (0, 1). Found {describe_value(value)}.")
    if not (0.0 < fvalue < 1.0):
        raise ValueError(f"{name} must be in (0, 1). Found {value!r}.")
    return fvalue


MIN_DELTA = 1e-200
"""Smallest target delta of the front doors (:func:`~shuffle_opacus.account`,
:func:`~shuffle_opacus.calibrate`, :func:`~shuffle_opacus.history_epsilon`, the command line
and the configs). The accounting derives smaller numbers from delta (the privacy loss
distributions leave out ``1e-3 delta / rounds`` per round, which must stay >= ``1e-290``; the
clones bounds split delta), and below about ``1e-280`` those leave the normal floats; ``1e-200``
keeps them there for up to ``1e87`` rounds."""


def check_target_delta(value: object, name: str = "delta") -> float:
    """Return a target delta as ``float`` if it is a real number in ``[MIN_DELTA, 1)``.

    Args:
        value: The delta to check.
        name: How messages name it (``--delta``, ``privacy.delta``).

    Returns:
        ``value`` as a float.

    Raises:
        ValueError: for a value that is not a number, outside ``(0, 1)`` (the message of
            :func:`check_delta`), or below :data:`MIN_DELTA` (naming the range).
    """
    fvalue = check_delta(value, name)
    if fvalue < MIN_DELTA:
        raise ValueError(
            f"{name} must be in [{MIN_DELTA:g}, 1) (a smaller delta underflows the "
            f"accounting's arithmetic). Found {value!r}."
        )
    return fvalue


def check_orders(orders: object) -> np.ndarray:
    """Return ``orders`` as a sorted, duplicate-free int64 array of integers in ``[2, MAX_ORDER]``.

    Raises:
        ValueError: if it is empty or holds a non-integer or a value outside that range
            (:data:`MAX_ORDER` bounds the work of every
            Rényi-DP function).
    """
    arr = np.atleast_1d(np.asarray(orders, dtype=float))
    if arr.ndim != 1 or arr.size == 0:
        raise ValueError(
            f"orders must be a non-empty list of integers >= 2. Found {_one_line(orders)}."
        )
    if not np.all(np.isfinite(arr)) or np.any(arr != np.round(arr)) or np.any(arr < 2):
        raise ValueError(f"orders must be integers >= 2. Found {_one_line(orders)}.")
    if np.any(arr > MAX_ORDER):
        raise ValueError(
            f"orders must be integers in [2, {MAX_ORDER}] (the work grows as the square of the "
            f"largest order). Found {int(arr.max())}."
        )
    return np.unique(arr.astype(np.int64))


def _one_line(value: object) -> str:
    """``repr(value)`` on one line (numpy wraps long array reprs over several)."""
    return " ".join(repr(value).split())
