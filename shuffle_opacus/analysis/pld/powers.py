"""Compositions of dense privacy-loss PMFs by powers of their spectra, cached across round counts.

An accountant asked for epsilon after every round composes the same per-round PMFs again and
again for a growing number of rounds. ``dp_accounting``'s ``self_compose`` starts from scratch
each time (Chernoff bounds, an FFT of the PMF, the power, an inverse FFT, a Python loop over the
losses). Here the PMF's Chernoff moments and its spectrum at each FFT length are kept, rounds of
several PMFs are composed by multiplying their spectra's powers and one inverse FFT, and epsilon
is read off the result by a vectorised scan. The arithmetic is the one of ``dp_accounting``'s
``DensePLDPmf.self_compose`` (Chernoff window, cyclic convolution, left-out mass added at
infinity; see docs/maths.md, "Reporting epsilon every round"), so every result is a pessimistic
estimate, as there. The FFT length depends on the request only (not on earlier calls), so a
result never depends on what was asked before: a resumed run reproduces its numbers bit for bit.
"""

from __future__ import annotations

import math
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
from scipy import fft

from ...common.validation import check_delta, check_int
from ..limits import check_memory
from . import disk_cache

if TYPE_CHECKING:  # dp_accounting is imported where a PMF of its own is built or read
    from dp_accounting.pld import pld_pmf

__all__ = [
    "PmfPowers",
    "ComposedPmf",
    "cached_powers",
    "compose_arrays",
    "compose_powers",
    "epsilon_for_delta",
    "DEFAULT_TRUNCATION",
]

DEFAULT_TRUNCATION = 1e-15
"""Mass of a composition's tails left out of its window and added at infinity (as in
``dp_accounting``'s ``self_compose``)."""

#: Chernoff orders of the window, in units of the PMF's loss (the exponent's slope per unit of
#: privacy loss). Both signs; the window is the tightest bound over all of them.
_LOSS_ORDERS = np.concatenate((-np.geomspace(0.05, 400.0, 48), np.geomspace(0.05, 400.0, 48)))

#: Largest Chernoff order per grid step (the exponent's slope per index): at this order the bound
#: ``(log M + log(2/truncation)) / order`` lies within about 35 grid points of the support's end.
_MAX_INDEX_ORDER = 1.0

#: Orders per decade of the extension above ``_LOSS_ORDERS`` (as many as ``_LOSS_ORDERS`` has).
_ORDERS_PER_DECADE = 12


def _chernoff_orders(discretization: float) -> np.ndarray:
    """Chernoff orders of a window, per grid index: :data:`_LOSS_ORDERS`, then up to the grid.

    :data:`_LOSS_ORDERS` is fixed per unit of loss, so on a fine grid (a round whose loss is
    small, as at large ``n``) its largest order is far below the slope a tight window needs
    (about the normal quantile of the truncation over the composed loss's standard deviation),
    and the window grew like ``1 / discretization``. The orders are therefore extended
    geometrically from its largest one up to :data:`_MAX_INDEX_ORDER` per grid index; every
    order gives a valid bound, the window is the tightest, and a grid whose fixed orders already
    reach that slope (``discretization >= 1/400``) gets none.
    """
    orders = _LOSS_ORDERS * discretization
    start = float(_LOSS_ORDERS[-1]) * discretization
    if start >= _MAX_INDEX_ORDER:
        return orders
    count = max(2, math.ceil(_ORDERS_PER_DECADE * math.log10(_MAX_INDEX_ORDER / start)))
    extra = np.geomspace(start, _MAX_INDEX_ORDER, count + 1)[1:]
    return np.concatenate((orders, -extra, extra))


#: Spectra kept per PMF (one per FFT length).
_SPECTRA_KEPT = 2

#: Peak bytes of a composition per point of its FFT: the spectra (kept and powered, complex,
#: half the length), the inverse transform and its rolled copy. Measured 68 at 2^23 points
#: (check-in n = 1e5, rate 0.01, 10,000 rounds, the optimistic side: 0.72 GB); rounded up.
COMPOSE_BYTES_PER_POINT = 80


def _dense(pmf: pld_pmf.PLDPmf) -> pld_pmf.DensePLDPmf:
    from dp_accounting.pld import pld_pmf

    dense = pmf.to_dense_pmf()
    if not isinstance(dense, pld_pmf.DensePLDPmf):  # pragma: no cover - dp_accounting contract
        raise TypeError(f"pmf must convert to a DensePLDPmf. Found {type(dense).__name__}.")
    return dense


def _scaled_log(s: np.ndarray, m: np.ndarray, a_max: np.ndarray) -> np.ndarray:
    """``log(m + s) + a_max`` as scipy 1.17's ``logsumexp`` finishes (``nan`` for a negative sum).

    ``s`` is the sum of the scaled terms without the largest, ``m`` the largest one's weight.
    """
    s = np.where(s == 0, s, s / m)
    sign = np.sign(s + 1) * np.sign(m)
    s = np.where(s < -1, -s - 2, s)
    out = np.log1p(s) + np.log(np.abs(m)) + a_max
    out[sign < 0] = np.nan
    return out


def _logsumexp(a: np.ndarray, b: np.ndarray, zero: np.ndarray) -> np.float64:
    """``scipy.special.logsumexp(a, b=b)`` for 1-D float arrays with ``b >= 0``, bit for bit.

    The operations of scipy 1.17's ``logsumexp`` (the largest term taken out of the sum, then
    ``log1p(s) + log(m) + max``, the direct ``log(sum(b e^a))`` where that is not finite) in
    the same order on arrays of the same shapes, without its dispatch, which took most of a
    PMF's construction. ``a`` is overwritten; ``zero`` is ``b == 0``.
    """
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        original = a.copy()
        a[zero] = -np.inf
        a_max = np.max(a, keepdims=True)
        i_max = a == a_max
        a[i_max] = -np.inf
        m = np.sum(b * i_max.astype(a.dtype), keepdims=True, dtype=a.dtype)
        terms = b * np.exp(a - a_max)
        s = np.sum(terms, keepdims=True, dtype=terms.dtype)
        out = _scaled_log(s, m, a_max)
        if not np.isfinite(out[0]):
            out = np.log(np.sum(b * np.exp(original), keepdims=True))
    return np.float64(out[0])


def _logsumexp_at(
    index: np.ndarray, order: float, b: np.ndarray, zero: np.ndarray, top: int
) -> np.float64:
    """:func:`_logsumexp` of ``index * order``, whose only largest value where ``b > 0`` is at top.

    The same values with fewer passes over the arrays: the largest term is ``a[top]`` (no
    search), and its weight ``m``, which :func:`_logsumexp` sums over an indicator (every other
    product ``b * 0.0`` is ``+0.0``, so every partial sum is ``0`` or ``b[top]``), is
    ``b[top]``; the terms are computed in place. ``b`` must be finite.
    """
    a = index * order
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        a_max = a[top : top + 1].copy()
        a[zero] = -np.inf
        a[top] = -np.inf
        m = b[top : top + 1].copy()
        terms = np.multiply(b, np.exp(np.subtract(a, a_max, out=a), out=a), out=a)
        s = np.sum(terms, keepdims=True, dtype=terms.dtype)
        out = _scaled_log(s, m, a_max)
        if not np.isfinite(out[0]):  # _logsumexp's direct sum, on the same exponents
            out = np.log(np.sum(b * np.exp(index * order), keepdims=True))
    return np.float64(out[0])


def _log_mgf(probs: np.ndarray, orders: np.ndarray) -> np.ndarray:
    """``log sum_i probs[i] e^{o i}`` at each order ``o`` (see :func:`_logsumexp`).

    ``i o`` is monotone in ``i`` and its values at distinct ``i`` differ (by at least ``|o|``,
    far above their rounding), so the largest exponent where ``probs > 0`` is at the last such
    index for ``o > 0`` and at the first for ``o < 0``, and it is the only one:
    :func:`_logsumexp_at` then gives :func:`_logsumexp`'s values with fewer passes.
    """
    index = np.arange(probs.size, dtype=float)
    zero = probs == 0
    support = np.flatnonzero(~zero)
    if support.size == 0 or not np.all(np.isfinite(probs)) or probs.size >= 1 << 50:
        return np.array([_logsumexp(index * o, probs, zero) for o in orders])
    values = np.empty(orders.size)
    for k, o in enumerate(orders):
        if o > 0:
            values[k] = _logsumexp_at(index, o, probs, zero, int(support[-1]))
        elif o < 0:
            values[k] = _logsumexp_at(index, o, probs, zero, int(support[0]))
        else:
            values[k] = _logsumexp(index * o, probs, zero)
    return values


class PmfPowers:
    """One dense PMF with what its compositions need, computed once and kept.

    Args:
        pmf: A ``dp_accounting`` PMF (dense, or convertible to dense).

    Attributes:
        discretization: The loss grid step.
        lower: Index of the first grid point (loss ``lower * discretization``).
        probs: Masses on the grid (read-only).
        infinity: Mass at infinite loss.
        pessimistic: Whether the PMF is a pessimistic estimate.
        orders: The Chernoff orders of the composition window (per grid index).
        log_mgf: ``log sum_i probs[i] e^{o i}`` at each order (read-only).
    """

    def __init__(self, pmf: pld_pmf.PLDPmf) -> None:
        dense = _dense(pmf)
        # dp_accounting keeps these as private attributes of its dense PMF.
        self._setup(
            float(dense._discretization),
            int(dense._lower_loss),
            np.array(dense._probs, dtype=float),
            float(dense._infinity_mass),
            bool(dense._pessimistic_estimate),
            None,
        )

    def _setup(
        self,
        discretization: float,
        lower: int,
        probs: np.ndarray,
        infinity: float,
        pessimistic: bool,
        log_mgf: np.ndarray | None,
    ) -> None:
        self.discretization = discretization
        self.lower = lower
        probs.setflags(write=False)
        self.probs = probs
        self.infinity = infinity
        self.pessimistic = pessimistic
        self.orders = _chernoff_orders(discretization)
        if log_mgf is None:
            log_mgf = _log_mgf(probs, self.orders)
        elif log_mgf.shape != self.orders.shape:
            raise ValueError(
                f"log_mgf must hold one value per Chernoff order ({self.orders.size}). Found "
                f"{log_mgf.shape}."
            )
        log_mgf.setflags(write=False)
        self.log_mgf = log_mgf
        self._spectra: OrderedDict[int, np.ndarray] = OrderedDict()
        self._lock = threading.Lock()

    @classmethod
    def from_arrays(
        cls,
        *,
        discretization: float,
        lower: int,
        probs: np.ndarray,
        infinity: float,
        pessimistic: bool,
        log_mgf: np.ndarray | None = None,
    ) -> PmfPowers:
        """Build from the fields of a dense PMF, without ``dp_accounting``.

        ``PmfPowers.from_arrays(**p.fields())`` is bit for bit ``p``.

        Args:
            discretization: The loss grid step (> 0).
            lower: Index of the first grid point.
            probs: Masses on the grid (1-D; copied unless a read-only float64 array).
            infinity: Mass at infinite loss.
            pessimistic: Whether the PMF is a pessimistic estimate.
            log_mgf: The moments at :attr:`orders` if known (as :meth:`fields` gives them),
                else ``None`` to compute them.

        Returns:
            The :class:`PmfPowers`.

        Raises:
            ValueError: on a non-positive ``discretization``, ``probs`` not 1-D, or a
                ``log_mgf`` of the wrong length.
        """
        if not discretization > 0:
            raise ValueError(f"discretization must be > 0. Found {discretization!r}.")
        values = np.asarray(probs, dtype=float)
        if values.ndim != 1:
            raise ValueError(f"probs must be 1-D. Found shape {values.shape}.")
        if values.flags.writeable:  # kept read-only: a copy, unless the caller cannot write it
            values = values.copy()
        moments = None
        if log_mgf is not None:
            moments = np.asarray(log_mgf, dtype=float)
            if moments.flags.writeable:
                moments = moments.copy()
        self = cls.__new__(cls)
        self._setup(
            float(discretization), int(lower), values, float(infinity), bool(pessimistic), moments
        )
        return self

    def fields(self) -> dict[str, object]:
        """Return the keyword arguments of :meth:`from_arrays` that rebuild this PMF."""
        return {
            "discretization": self.discretization,
            "lower": self.lower,
            "probs": self.probs,
            "infinity": self.infinity,
            "pessimistic": self.pessimistic,
            "log_mgf": self.log_mgf,
        }

    @property
    def size(self) -> int:
        """Number of grid points."""
        return int(self.probs.size)

    def spectrum(self, length: int) -> np.ndarray:
        """Return the real FFT of the masses, zero-padded to ``length`` (cached, read-only)."""
        with self._lock:
            if length in self._spectra:
                self._spectra.move_to_end(length)
                return self._spectra[length]
            values = fft.rfft(self.probs, length)
            values.setflags(write=False)
            self._spectra[length] = values
            while len(self._spectra) > _SPECTRA_KEPT:
                self._spectra.popitem(last=False)
            return values


def _power(values: np.ndarray, count: int) -> np.ndarray:
    """``values ** count`` by binary powering: a fixed sequence of products for each count."""
    result: np.ndarray | None = None
    square = values
    while True:
        if count & 1:
            result = square.copy() if result is None else result * square
        count >>= 1
        if not count:
            break
        square = square * square
    assert result is not None
    return result


def _window(parts: Sequence[tuple[PmfPowers, int]], truncation: float) -> tuple[int, int]:
    """Index range of the composed masses outside which at most ``truncation`` lies (Chernoff).

    Indices count from the sum of the parts' first grid points. For every order ``o`` (same
    order per unit of loss for all parts, which share the grid), ``P(I >= b) <= truncation/2``
    for ``b = (sum_k count_k log M_k(o) + log(2/truncation)) / o`` when ``o > 0``, and the same
    for the lower end when ``o < 0``.
    """
    upper = sum((p.size - 1) * k for p, k in parts)
    lower = 0
    orders = parts[0][0].orders
    total = np.zeros(orders.size)
    for p, k in parts:
        total = total + k * p.log_mgf
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        bounds = (total + math.log(2.0 / truncation)) / orders
    for order, bound in zip(orders, bounds, strict=True):
        if not math.isfinite(bound):
            continue
        if order > 0:
            upper = min(upper, math.ceil(bound))
        else:
            lower = max(lower, math.floor(bound))
    return lower, max(upper, lower)


def _fft_length(needed: int) -> int:
    """Return an FFT length >= ``needed`` that depends on ``needed``'s power of two alone."""
    return int(fft.next_fast_len(1 << max(needed - 1, 1).bit_length(), real=True))


@dataclass(frozen=True)
class ComposedPmf:
    """A composed dense PMF without ``dp_accounting`` (:func:`compose_arrays`).

    Attributes:
        discretization: The loss grid step.
        lower: Index of the first grid point.
        probs: Masses on the grid.
        infinity: Mass at infinite loss.
        pessimistic: Whether the PMF is a pessimistic estimate.
    """

    discretization: float
    lower: int
    probs: np.ndarray
    infinity: float
    pessimistic: bool

    def to_dense_pmf(self) -> pld_pmf.DensePLDPmf:
        """Return the same PMF as a ``dp_accounting`` dense PMF (sharing ``probs``)."""
        from dp_accounting.pld import pld_pmf

        return pld_pmf.DensePLDPmf(
            self.discretization, self.lower, self.probs, self.infinity, self.pessimistic
        )


_ALLOCATOR_WARMED = False

#: A block just below glibc's largest dynamic mmap threshold (32 MiB on 64-bit systems).
_WARM_BLOCK_BYTES = 31 << 20


def _warm_allocator() -> None:
    """Let the C allocator keep composition-sized buffers on its heap (once per process).

    glibc serves every allocation above its mmap threshold (128 KiB at start) with a fresh
    ``mmap``, whose pages fault in one by one, and raises the threshold only after such a block is
    freed. A process that composes PMFs read from the disk cache, having built nothing large,
    would pay those page faults on every FFT buffer of every round (about twice the time of a
    round measured at the paper setting); allocating and freeing one large block first raises the
    threshold as building a PMF does. Elsewhere (another allocator) it costs one allocation.
    """
    global _ALLOCATOR_WARMED
    if not _ALLOCATOR_WARMED:
        _ALLOCATOR_WARMED = True
        np.empty(_WARM_BLOCK_BYTES, dtype=np.uint8)  # allocated and freed at once


def compose_arrays(
    parts: Sequence[tuple[PmfPowers, int]], *, truncation: float = DEFAULT_TRUNCATION
) -> ComposedPmf:
    """Compose ``count`` rounds of each PMF (the law of the sum of independent losses).

    :func:`compose_powers` without ``dp_accounting``: the same arithmetic, the same bits.

    Args:
        parts: ``(pmf, count)`` pairs; the PMFs must share their grid step and estimate type.
        truncation: Mass of the composition's tails outside the window (added at infinity for a
            pessimistic estimate, as ``dp_accounting`` does), in ``(0, 1)``.

    Returns:
        A :class:`ComposedPmf`.

    Raises:
        ValueError: on an empty ``parts``, a count below 1, or PMFs on different grids.
        MemoryLimitError: when the composition's FFT would exceed the memory limit
            (:func:`~shuffle_opacus.analysis.limits.memory_limit`), before it is allocated.
    """
    if not parts:
        raise ValueError("parts must hold at least one (pmf, count) pair. Found none.")
    first = parts[0][0]
    for p, k in parts:
        check_int("count", k, minimum=1)
        if p.discretization != first.discretization or p.pessimistic != first.pessimistic:
            raise ValueError(
                "parts must share their discretization and estimate type. Found "
                f"{p.discretization!r} and {first.discretization!r}."
            )
    low, high = _window(parts, truncation)
    width = high - low + 1
    length = _fft_length(max(width, max(p.size for p, _ in parts)))
    rounds = sum(k for _, k in parts)
    check_memory(
        COMPOSE_BYTES_PER_POINT * length,
        f"the composition of {rounds} rounds (an FFT of {length} points)",
        "steps",
    )
    _warm_allocator()
    spectrum: np.ndarray | None = None
    for p, k in parts:
        term = _power(p.spectrum(length), k)
        spectrum = term if spectrum is None else spectrum * term
    assert spectrum is not None
    cyclic = fft.irfft(spectrum, length)
    # The composed index range is low..high; the cyclic result holds index i at i mod length.
    probs = np.roll(cyclic, -low)[:width]
    log_keep = sum(k * math.log1p(-p.infinity) for p, k in parts)
    infinity = -math.expm1(log_keep)
    if first.pessimistic:
        infinity += truncation
    lower = sum(p.lower * k for p, k in parts) + low
    return ComposedPmf(first.discretization, lower, probs, infinity, first.pessimistic)


def compose_powers(
    parts: Sequence[tuple[PmfPowers, int]], *, truncation: float = DEFAULT_TRUNCATION
) -> pld_pmf.DensePLDPmf:
    """Compose ``count`` rounds of each PMF (the law of the sum of independent losses).

    Args:
        parts: ``(pmf, count)`` pairs; the PMFs must share their grid step and estimate type.
        truncation: Mass of the composition's tails outside the window (added at infinity for a
            pessimistic estimate, as ``dp_accounting`` does), in ``(0, 1)``.

    Returns:
        A ``dp_accounting`` dense PMF (that of :func:`compose_arrays`).

    Raises:
        ValueError: on an empty ``parts``, a count below 1, or PMFs on different grids.
        MemoryLimitError: when the composition's FFT would exceed the memory limit
            (:func:`~shuffle_opacus.analysis.limits.memory_limit`), before it is allocated.
    """
    return compose_arrays(parts, truncation=truncation).to_dense_pmf()


def cached_powers(
    kind: str,
    version: int,
    key: Mapping[str, disk_cache.KeyValue],
    build: Callable[[], Sequence[PmfPowers]],
    *,
    sources: Sequence[str],
) -> tuple[PmfPowers, ...]:
    """Per-round PMFs from the on-disk cache (:mod:`.disk_cache`), built and stored on a miss.

    The PMFs, their Chernoff moments included, come back bit for bit as ``build`` made them.

    Args:
        kind: The entry's family (see :func:`.disk_cache.load`), e.g. ``"shuffle-upper"``.
        version: The construction's code version; bump it whenever the construction changes.
        key: Every parameter the PMFs depend on.
        build: Builds the PMFs on a miss (its exceptions propagate; nothing is stored then).
        sources: Source files and folders (relative to the ``shuffle_opacus`` package) of the
            construction, whose digest is part of the key.

    Returns:
        The PMFs, in ``build``'s order.
    """

    def entry() -> disk_cache.Entry:
        arrays: dict[str, np.ndarray] = {}
        scalars: dict[str, disk_cache.Scalar] = {}
        for i, pmf in enumerate(build()):
            arrays[f"{i}.probs"], arrays[f"{i}.log_mgf"] = pmf.probs, pmf.log_mgf
            scalars[f"{i}.discretization"], scalars[f"{i}.lower"] = pmf.discretization, pmf.lower
            scalars[f"{i}.infinity"], scalars[f"{i}.pessimistic"] = pmf.infinity, pmf.pessimistic
        scalars["count"] = len(arrays) // 2
        return disk_cache.Entry(arrays, scalars)

    found = disk_cache.cached(kind, version, key, entry, sources=sources)
    a, v = found.arrays, found.scalars
    return tuple(
        PmfPowers.from_arrays(
            discretization=float(v[f"{i}.discretization"]),  # type: ignore[arg-type]
            lower=int(v[f"{i}.lower"]),  # type: ignore[arg-type]
            probs=a[f"{i}.probs"],
            infinity=float(v[f"{i}.infinity"]),  # type: ignore[arg-type]
            pessimistic=bool(v[f"{i}.pessimistic"]),
            log_mgf=a[f"{i}.log_mgf"],
        )
        for i in range(int(v["count"]))  # type: ignore[arg-type]
    )


def epsilon_for_delta(pmf: pld_pmf.PLDPmf | ComposedPmf, delta: float) -> float:
    """Smallest epsilon with hockey-stick divergence at most ``delta`` (vectorised).

    The same scan as ``dp_accounting``'s ``DensePLDPmf.get_epsilon_for_delta`` (from the largest
    loss down, stopping where epsilon reaches the loss), in numpy instead of a Python loop.

    Args:
        pmf: A ``dp_accounting`` PMF or a :class:`ComposedPmf`.
        delta: Target delta in ``(0, 1)``.

    Returns:
        Epsilon (``inf`` when the mass at infinity exceeds ``delta``; at least 0).
    """
    delta = check_delta(delta)
    if isinstance(pmf, ComposedPmf):
        infinity, lowest = float(pmf.infinity), int(pmf.lower)
        probs, discretization = np.asarray(pmf.probs, dtype=float), float(pmf.discretization)
    else:
        dense = _dense(pmf)
        infinity, lowest = float(dense._infinity_mass), int(dense._lower_loss)
        probs, discretization = np.asarray(dense._probs, dtype=float), float(dense._discretization)
    if infinity > delta:
        return math.inf
    probs = probs[::-1]
    top = lowest + probs.size - 1
    losses = (top - np.arange(probs.size)) * discretization
    # Masses above each loss (excluded), as the scan holds them before adding that loss.
    upper = infinity + np.concatenate(([0.0], np.cumsum(probs)))
    with np.errstate(over="ignore"):
        weighted = np.exp(-losses) * probs
    lower = np.concatenate(([0.0], np.cumsum(weighted)))
    with np.errstate(divide="ignore", invalid="ignore"):
        candidate = np.log((upper[:-1] - delta) / lower[:-1])
    stop = (upper[:-1] > delta) & (lower[:-1] > 0) & (candidate >= losses)
    # A loss so large that exp(-loss) is 0 while the mass above reaches delta: epsilon is it.
    huge = (upper[1:] >= delta) & (lower[1:] == 0)
    hits = np.flatnonzero(stop | huge)
    if hits.size:
        k = int(hits[0])
        return max(0.0, float(candidate[k] if stop[k] else losses[k]))
    if upper[-1] <= lower[-1] + delta:
        return 0.0
    return max(0.0, math.log((upper[-1] - delta) / lower[-1]))
