"""``exact_sum`` is ``math.fsum`` bit for bit (the proven pairs' left-out mass rests on it).

``math.fsum`` is the oracle: its result is the correctly rounded exact sum whatever the order.
The fast path (an extended-precision sum with a certified error interval) may only answer when
that interval rounds to one double; these cases aim at the boundaries it must notice.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from shuffle_opacus.analysis.pld.common import exact_sum


def _same(values: np.ndarray) -> None:
    expected = math.fsum(values.tolist())
    found = exact_sum(values)
    assert math.copysign(1.0, found) == math.copysign(1.0, expected) or expected == 0.0
    assert found.hex() == expected.hex()


@pytest.mark.parametrize("seed", range(6))
def test_random_arrays_of_every_kind(seed):
    rng = np.random.default_rng(seed)
    n = 5000 + 20000 * seed
    for values in (
        rng.dirichlet(np.ones(n)),  # masses summing to about 1, as a pair's do
        np.exp(rng.normal(-30.0, 15.0, n)),  # many magnitudes
        rng.normal(size=n) * np.exp(rng.normal(0.0, 40.0, n)),  # signs and cancellation
        np.concatenate([rng.random(n) * 1e-310, [1.0, 1e-16, -1.0]]),  # subnormals
    ):
        _same(values)


def test_sums_on_a_rounding_boundary_are_rounded_as_fsum_rounds_them():
    n = 8192
    for top, tie in ((1.0, 2.0**-53), (1.0, 3 * 2.0**-54), (0.5, 2.0**-54), (1.0, -(2.0**-54))):
        values = np.zeros(n)
        values[0], values[1] = top, tie  # an exact midpoint, or next to one
        values[2:40] = 2.0**-120  # a nudge far below double precision, above extended's
        _same(values)
        values[2:40] = 0.0
        _same(values)


def test_non_finite_and_overflowing_input_behaves_as_fsum():
    big = np.full(5000, 1e305)
    with pytest.raises(OverflowError):
        math.fsum(big.tolist())
    with pytest.raises(OverflowError):
        exact_sum(big)
    inf = np.ones(5000)
    inf[3] = math.inf
    assert exact_sum(inf) == math.inf
    inf[4] = -math.inf
    with pytest.raises(ValueError):
        exact_sum(inf)
    inf[:] = 1.0
    inf[7] = math.nan
    assert math.isnan(exact_sum(inf))


@settings(max_examples=60, deadline=None)
@given(
    arrays(
        np.float64,
        st.integers(4096, 9000),
        elements=st.floats(-1e6, 1e6, allow_nan=False, allow_subnormal=True),
    )
)
def test_any_finite_array(values):
    _same(values)


def test_small_arrays_are_fsums():
    values = np.array([0.1] * 10)
    assert exact_sum(values) == math.fsum(values.tolist()) == 1.0
