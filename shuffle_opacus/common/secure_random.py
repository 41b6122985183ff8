"""Draws from the operating system's cryptographically secure source, for secure mode.

With ``secure_mode=True`` (:func:`shuffle_opacus.make_private`,
:func:`~shuffle_opacus.federated.make_private_clients`) the samplers draw their rounds here, and the
Flower mods draw their noise here when they are given no seed. Every draw reads
:func:`os.urandom`; nothing can be seeded, so nothing can be replayed either.

- :func:`bernoulli` flips exact Bernoulli(``rate``) coins: 64 random bits are compared with the
  first 64 bits of ``rate``'s binary expansion, and the rare tie (probability ``2**-64``) is
  settled with :func:`secrets.randbelow` against the rest of the expansion, so
  ``P(heads) = rate`` for every float ``rate``.
- :func:`below` returns uniform integers by rejection sampling (no modulo bias);
  :func:`sample` draws ``m`` distinct items of ``n`` in uniformly random order with a partial
  Fisher–Yates shuffle on them.
- :func:`uniforms` returns 53-bit uniforms on ``[0, 1)`` (numpy's ``random()`` resolution).
- :func:`normal` draws Gaussian noise by Box–Muller on those uniforms, summing four draws and
  halving, as Opacus does in ``secure_mode`` after Holohan & Braghin, *Secure Random Sampling in
  Differential Privacy* (arXiv:2107.10138, §5.1): an observed noisy value then no longer reveals
  the uniforms behind it, which is what the floating-point attacks on Gaussian samplers exploit
  (Jin, McMurtry, Rubinstein and Ohrimenko, *Are We There Yet? Timing and Floating-Point Attacks
  on Differential Privacy Systems*, arXiv:2112.05307; descendants of Mironov's attack on the
  Laplace mechanism, *On Significance of the Least Significant Bits for Differential Privacy*,
  CCS 2012).
  Not addressed: the result is a float, whose set of reachable values still depends on the value
  noised (no snapping, no discrete Gaussian), and a caller's later rounding to ``float32`` is not
  designed as a defence.

:class:`SecureGenerator` wraps ``uniforms`` and ``normal`` behind the two methods of
``numpy.random.Generator`` that the Flower mods call (``random`` and ``normal``).
"""

from __future__ import annotations

import math
import os
import secrets
from typing import TypeAlias

import numpy as np

from .validation import check_int, check_probability

__all__ = [
    "Draws",
    "SecureGenerator",
    "below",
    "bernoulli",
    "label",
    "normal",
    "sample",
    "uniforms",
]

_WORD = 8  # bytes of one uint64


def _words(count: int) -> np.ndarray:
    """Return ``count`` independent uniform 64-bit words from :func:`os.urandom`."""
    return np.frombuffer(os.urandom(_WORD * count), dtype=np.uint64).copy()


def _count(size: int | tuple[int, ...] | None) -> tuple[tuple[int, ...], int]:
    shape = () if size is None else (size,) if isinstance(size, int) else tuple(size)
    for dim in shape:
        check_int("size", dim, minimum=0)
    return shape, math.prod(shape)


def label() -> int:
    """Return 128 fresh bits from the OS: the key of a secure sampler's rounds in the records.

    Returns:
        An integer in ``[0, 2**128 - 1]``; it draws nothing (see
        :mod:`shuffle_opacus.engine.releases`).
    """
    return secrets.randbits(128)


def uniforms(size: int | tuple[int, ...] | None = None) -> np.ndarray:
    """Return uniforms on ``[0, 1)``: ``k / 2**53`` for a uniform 53-bit ``k``, from the OS.

    Args:
        size: Output shape (``None``: a 0-d array).

    Returns:
        A float64 array of that shape.

    Raises:
        ValueError: for a negative dimension.
    """
    shape, count = _count(size)
    return ((_words(count) >> np.uint64(11)).astype(np.float64) * 2.0**-53).reshape(shape)


def bernoulli(count: int, rate: float) -> np.ndarray:
    """Flip ``count`` independent coins with heads probability exactly ``rate``.

    Args:
        count: Number of coins (integer >= 0).
        rate: Heads probability in ``(0, 1]``.

    Returns:
        A bool array of length ``count``.

    Raises:
        ValueError: for a negative ``count`` or ``rate`` outside ``(0, 1]``.
    """
    count = check_int("count", count, minimum=0)
    rate = check_probability("rate", rate)
    if rate == 1.0:
        return np.ones(count, dtype=bool)
    # rate = num / 2**e exactly; U = (W + V) / 2**64 with W a 64-bit word and V uniform on
    # [0, 1). U < rate <=> W < T, or W == T and V < f, where T + f = rate * 2**64.
    num, den = rate.as_integer_ratio()
    e = den.bit_length() - 1
    threshold = num << (64 - e) if e <= 64 else num >> (e - 64)
    rest, rest_den = (0, 1) if e <= 64 else (num & ((1 << (e - 64)) - 1), 1 << (e - 64))
    words = _words(count)
    heads = words < np.uint64(threshold)
    if rest:
        for i in np.flatnonzero(words == np.uint64(threshold)).tolist():
            heads[i] = secrets.randbelow(rest_den) < rest
    return heads


def below(bounds: np.ndarray) -> np.ndarray:
    """Return one uniform integer in ``[0, b)`` for every ``b`` of ``bounds``, from the OS.

    Rejection sampling: a word masked to the bit length of ``b - 1`` is kept when it is below
    ``b`` (probability above 1/2) and drawn again otherwise, so no value is favoured.

    Args:
        bounds: Integers >= 1 (below ``2**63``).

    Returns:
        An int64 array of the same shape.

    Raises:
        ValueError: for a bound below 1 or from ``2**63``.
    """
    b = np.asarray(bounds)
    if b.size and (not np.issubdtype(b.dtype, np.integer) or b.min() < 1 or b.max() >= 2**63):
        raise ValueError(f"bounds must be integers in [1, 2**63 - 1]. Found {b!r:.60}.")
    top = b.astype(np.uint64).reshape(-1)
    mask = top - np.uint64(1)
    for shift in (1, 2, 4, 8, 16, 32):
        mask |= mask >> np.uint64(shift)
    out = np.empty(top.size, dtype=np.uint64)
    todo = np.arange(top.size)
    while todo.size:
        draw = _words(todo.size) & mask[todo]
        kept = draw < top[todo]
        out[todo[kept]] = draw[kept]
        todo = todo[~kept]
    return out.astype(np.int64).reshape(b.shape)


def sample(n: int, m: int) -> np.ndarray:
    """Return ``m`` distinct integers of ``[0, n)``, a uniform subset in uniformly random order.

    A partial Fisher–Yates shuffle: step ``i`` swaps position ``i`` with a uniform position of
    ``[i, n)`` (:func:`below`). With ``m == n`` it is a uniform permutation.

    Args:
        n: Population (integer >= 0).
        m: Sample size (integer in ``[0, n]``).

    Returns:
        An int64 array of length ``m``.

    Raises:
        ValueError: for ``n < 0`` or ``m`` outside ``[0, n]``.
    """
    n = check_int("n", n, minimum=0)
    m = check_int("m", m, minimum=0, maximum=n)
    order = np.arange(n, dtype=np.int64)
    steps = min(m, n - 1)  # the last step of a full shuffle has one position left
    jumps = np.arange(steps) + below(np.arange(n, n - steps, -1, dtype=np.int64))
    for i, j in enumerate(jumps.tolist()):
        order[i], order[j] = order[j], order[i]
    return order[:m]


def _standard_normals(count: int) -> np.ndarray:
    """Return ``count`` standard normal draws by Box–Muller on OS uniforms."""
    pairs = (count + 1) // 2
    u = uniforms((2, pairs))
    radius = np.sqrt(-2.0 * np.log1p(-u[0]))  # 1 - u on (0, 1]: the logarithm is finite
    angle = 2.0 * np.pi * u[1]
    return np.concatenate([radius * np.cos(angle), radius * np.sin(angle)])[:count]


def normal(
    loc: float = 0.0, scale: float = 1.0, size: int | tuple[int, ...] | None = None
) -> np.ndarray:
    """Return Gaussian draws ``N(loc, scale**2)`` from the OS, hardened as Opacus's secure mode.

    Each draw is the sum of four Box–Muller standard normals, halved (see the module docstring
    for what that does and does not address).

    Args:
        loc: Mean.
        scale: Standard deviation (>= 0).
        size: Output shape (``None``: a 0-d array).

    Returns:
        A float64 array of that shape.

    Raises:
        ValueError: for a negative or non-finite ``scale``, or a negative dimension.
    """
    if not (isinstance(scale, (int, float)) and math.isfinite(scale) and scale >= 0):
        raise ValueError(f"scale must be a finite number >= 0. Found {scale!r}.")
    shape, count = _count(size)
    z = _standard_normals(4 * count).reshape(4, count).sum(axis=0) / 2.0
    return (loc + scale * z).reshape(shape)


class SecureGenerator:
    """The ``random`` and ``normal`` of ``numpy.random.Generator``, drawn from the OS.

    It holds no state and cannot be seeded: two instances draw independently.

    Example:
        >>> SecureGenerator().normal(0.0, 1.0, size=(2, 3)).shape
        (2, 3)
    """

    def random(self, size: int | tuple[int, ...] | None = None) -> np.ndarray:
        """Return uniforms on ``[0, 1)`` (:func:`uniforms`).

        Args:
            size: Output shape.

        Returns:
            A float64 array.
        """
        return uniforms(size)

    def normal(
        self, loc: float = 0.0, scale: float = 1.0, size: int | tuple[int, ...] | None = None
    ) -> np.ndarray:
        """Return Gaussian draws (:func:`normal`).

        Args:
            loc: Mean.
            scale: Standard deviation (>= 0).
            size: Output shape.

        Returns:
            A float64 array.

        Raises:
            ValueError: for a negative or non-finite ``scale``.
        """
        return normal(loc, scale, size)

    def __repr__(self) -> str:
        """``SecureGenerator()``: there is no state to show."""
        return "SecureGenerator()"


#: A seeded numpy generator (reproducible simulation) or the operating system's draws.
Draws: TypeAlias = "np.random.Generator | SecureGenerator"
