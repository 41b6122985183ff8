"""Compositions keep their buffers on the C allocator's heap (``powers._warm_allocator``).

A process that reads its per-round PMFs from the disk cache builds nothing large, so glibc would
serve every FFT buffer of every composition with a fresh ``mmap`` and fault its pages in one by
one (about twice the time of a round at the paper setting). Counted in page faults, not time.
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import textwrap

import pytest

CHILD = """
import resource, sys
import numpy as np
from shuffle_opacus.analysis.pld import powers
if sys.argv[1] == "unwarmed":
    powers._ALLOCATOR_WARMED = True  # as if the warm-up had not run
probs = np.random.default_rng(0).dirichlet(np.ones(4000))
pmf = powers.PmfPowers.from_arrays(
    discretization=1e-3, lower=-2000, probs=probs, infinity=0.0, pessimistic=True
)
powers.compose_arrays([(pmf, 100)])
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for count in range(100, 140):
    powers.compose_arrays([(pmf, count)])
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _faults(state: str) -> int:
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(CHILD), state],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    return int(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(
    platform.system() != "Linux" or platform.libc_ver()[0] != "glibc",
    reason="glibc's dynamic mmap threshold is what the warm-up raises",
)
def test_forty_compositions_fault_in_no_fresh_pages():
    warmed, unwarmed = _faults("warmed"), _faults("unwarmed")
    assert unwarmed > 10_000  # the test sees the effect: each buffer mapped afresh
    assert warmed < unwarmed / 100
