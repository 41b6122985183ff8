"""Compositions of dense privacy-loss PMFs by powers of their spectra, cached across round counts.

An accountant asked for epsilon after every round composes the same per-round PMFs again and
again for a growing number of rounds. ``dp_accounting``'s ``self_compose`` starts from scratch
each time (Chernoff bounds, an FFT of the PMF, the power, an inverse FFT, a Python loop over the
losses). Here the PMF's Chernoff moments (:mod:`.moments`, each computed the first time a window
needs it) and its spectrum at each FFT length are kept, rounds of several PMFs are composed by
multiplying their spectra's powers and one inverse FFT, and epsilon is read off the result by a
vectorised scan. The arithmetic is the one of ``dp_accounting``'s
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
from .moments import Moments, chernoff_orders, window

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
        moments: The moments ``log sum_i probs[i] e^{o i}`` at those orders, each computed the
            first time a window needs it (:class:`.moments.Moments`).
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
        self.orders = chernoff_orders(discretization)
        if log_mgf is not None and log_mgf.shape != self.orders.shape:
            raise ValueError(
                f"log_mgf must hold one value per Chernoff order ({self.orders.size}). Found "
                f"{log_mgf.shape}."
            )
        self.moments = Moments(probs, self.orders, log_mgf)
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
            log_mgf: The moments at :attr:`orders` computed so far, ``nan`` where not (as
                :meth:`fields` gives them), or ``None``: each is computed when first needed.

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
            "log_mgf": self.moments.known(),
        }

    @property
    def log_mgf(self) -> np.ndarray:
        """``log sum_i probs[i] e^{o i}`` at every order (read-only; computes those not known)."""
        return self.moments.full()

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
    support = sum((p.size - 1) * k for p, k in parts)
    low, high = window([(p.moments, k) for p, k in parts], support, truncation)
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

    The PMFs come back bit for bit as ``build`` made them, with the Chernoff moments known when
    the entry was stored (the others are computed when a window first needs them).

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
            arrays[f"{i}.probs"], arrays[f"{i}.log_mgf"] = pmf.probs, pmf.moments.known()
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
