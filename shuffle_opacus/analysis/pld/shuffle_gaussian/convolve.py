"""``scipy.signal.convolve(x, y)`` of two 1-D float arrays, bit for bit, without ``scipy.signal``.

Importing ``scipy.signal`` (which imports ``scipy.stats``, ``scipy.optimize`` and more) took
about 0.7 s of a cold query; the lattice engine needs its ``convolve`` alone. These are the
operations of scipy 1.17's ``convolve(x, y, mode="full", method="auto")`` for 1-D float64
arrays: ``choose_conv_method``'s estimate of which of the direct and the FFT method is faster
(its ``_fftconv_faster`` with the constants of mode ``full`` in one dimension), then either
``numpy.convolve`` or ``fftconvolve``'s real FFTs zero-padded to ``next_fast_len`` (one
transform instead of two when an array is convolved with itself, the same values). Any other
input goes to ``scipy.signal`` itself.
"""

from __future__ import annotations

import numpy as np
from scipy import fft as sp_fft

__all__ = ["convolve_full"]

#: ``_fftconv_faster``'s cost constants for mode ``full`` of 1-D inputs (scipy 1.17): seconds
#: per FFT operation, per direct multiplication, and the offset.
_FFT_COST = 1.7649070e-9
_DIRECT_COST = 2.1414831e-10
_OFFSET = -1e-3


def _fft_faster(x_size: int, h_size: int) -> bool:
    """``scipy.signal``'s ``_fftconv_faster`` for 1-D inputs and mode ``full``."""
    full = x_size + h_size - 1
    fft_ops = 3 * full * np.log(full)  # 3 separate FFTs of the full output's size
    direct_ops = x_size * h_size
    return bool(_FFT_COST * fft_ops < _DIRECT_COST * direct_ops + _OFFSET)


def convolve_full(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Return ``scipy.signal.convolve(x, y)`` (mode ``full``, method ``auto``), bit for bit.

    Args:
        x: A 1-D float64 array.
        y: A 1-D float64 array.

    Returns:
        The full discrete linear convolution (``x.size + y.size - 1`` values, float64).
    """
    if not (
        x.ndim == y.ndim == 1 and x.dtype == y.dtype == np.float64 and x.size > 0 and y.size > 0
    ):
        from scipy import signal

        return np.asarray(signal.convolve(x, y, method="auto"))
    if not _fft_faster(x.size, y.size):
        return np.convolve(x, y, "full")
    if x.size == 1 or y.size == 1:
        # fftconvolve multiplies by broadcasting when an axis has length one.
        return (x * y).copy()
    shape = x.size + y.size - 1
    length = sp_fft.next_fast_len(shape, True)
    first = sp_fft.rfftn(x, [length], axes=[0])
    # A square (the lattice's powering) transforms once: the second transform would be the
    # same values, so the product is the same.
    second = first if y is x else sp_fft.rfftn(y, [length], axes=[0])
    spectrum = first * second
    return sp_fft.irfftn(spectrum, [length], axes=[0])[:shape].copy()
