"""A cold pld query builds its pairs without dp_accounting or scipy.signal, with the same bits."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from scipy import signal

from shuffle_opacus.analysis.pld import rounds
from shuffle_opacus.analysis.pld.powers import PmfPowers
from shuffle_opacus.analysis.pld.shuffle_gaussian import convolve
from shuffle_opacus.analysis.pld.shuffle_gaussian.pmf import (
    _connect_dots,
    shuffle_gaussian_pair,
    symmetric_masses,
    symmetric_pmf,
)

SIZES = [1, 2, 3, 7, 64, 127, 500, 1001, 3000, 20000]


def test_convolve_full_is_scipy_signal_convolve_bit_for_bit():
    rng = np.random.default_rng(11)
    methods = set()
    for a in SIZES:
        for b in SIZES:
            x = rng.random(a) * 10.0 ** rng.uniform(-25, 0, a)
            y = rng.standard_normal(b)
            methods.add(convolve._fft_faster(a, b))
            got, want = convolve.convolve_full(x, y), signal.convolve(x, y, method="auto")
            assert got.dtype == want.dtype and got.tobytes() == want.tobytes(), (a, b)
        # A square transforms once (the lattice's powering): still the same bits.
        got, want = convolve.convolve_full(x, x), signal.convolve(x, x.copy(), method="auto")
        assert got.tobytes() == want.tobytes(), a
    assert methods == {True, False}  # both of choose_conv_method's answers were exercised


def test_convolve_full_hands_other_inputs_to_scipy_signal():
    ints = np.arange(5)
    assert convolve.convolve_full(ints, ints).tolist() == signal.convolve(ints, ints).tolist()
    grid = np.ones((2, 2))
    assert convolve.convolve_full(grid, grid).shape == (3, 3)


@pytest.mark.parametrize("size", [1, 2, 3, 40, 1500])
def test_connect_dots_is_dp_accountings(size):
    from dp_accounting.pld import pld_pmf

    rng = np.random.default_rng(size)
    curve = np.sort(rng.random(size))[::-1] * 0.3
    lower, probs, infinity = _connect_dots(curve, -7, 1e-3, 1e-20, 0.0)
    if size == 1:
        theirs = pld_pmf.DensePLDPmf(1e-3, -7, np.array([1.0 - curve[0]]), curve[0], True)
    else:
        theirs = pld_pmf.create_pmf_pessimistic_connect_dots_fixed_gap(
            1e-3, -7, -7 + size - 1, curve
        ).to_dense_pmf()
    assert (lower, probs.tobytes(), repr(infinity)) == (
        theirs._lower_loss,
        np.asarray(theirs._probs, dtype=float).tobytes(),
        repr(theirs._infinity_mass),
    )


def test_symmetric_masses_are_symmetric_pmfs():
    pair = shuffle_gaussian_pair(n=100, sigma=2.0, rate=0.5, tail=1e-13)
    lower, probs, infinity = symmetric_masses(pair, 2.0**-10, 2.5e-14)
    theirs = PmfPowers(symmetric_pmf(pair, 2.0**-10, 2.5e-14))
    assert (lower, probs.tobytes(), infinity) == (
        theirs.lower,
        theirs.probs.tobytes(),
        theirs.infinity,
    )


COLD = """
import json, sys
from shuffle_opacus.analysis.pld.rounds import ShuffleRound, shuffle_rounds_epsilon
est = shuffle_rounds_epsilon([(ShuffleRound(n=100, sigma=2.0, rate=0.5), 30)], delta=1e-5)
heavy = [m for m in ("dp_accounting", "scipy.stats", "scipy.signal") if m in sys.modules]
print(json.dumps([repr(est.epsilon), heavy]))
"""


def test_a_cold_lattice_query_imports_neither_dp_accounting_nor_scipy_signal():
    rounds._upper.cache_clear()
    here = rounds.shuffle_rounds_epsilon(
        [(rounds.ShuffleRound(n=100, sigma=2.0, rate=0.5), 30)], delta=1e-5
    )
    env = {**os.environ, "SHUFFLE_OPACUS_CACHE_DIR": "off"}
    out = subprocess.run([sys.executable, "-c", COLD], env=env, capture_output=True, text=True,
                         check=True)  # fmt: skip
    eps, heavy = json.loads(out.stdout.strip().splitlines()[-1])
    assert eps == repr(here.epsilon)
    assert heavy == []
