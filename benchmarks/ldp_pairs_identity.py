"""Check that the shuffled eps0-LDP pairs' outcomes are bit for bit those of a base revision.

    .venv/bin/python benchmarks/ldp_pairs_identity.py [--base REV]

Loads ``shuffle_opacus/analysis/pld/ldp_pairs.py`` as it was at ``REV`` (default ``1f8e1f2``,
before log Gamma was looked up in tables instead of evaluated at every outcome) beside the
package (``base_revision.py``), and compares every chunk of :func:`pair_chunks` (losses,
log P, log Q: their bytes) for both pairs over a grid of n and eps0, then times old against
new at n = 10^6, eps0 = 4, interleaved in this process by ``timing.compare`` (CPU time, 3
rounds, load recorded). Exits 1 on any difference.
"""

from __future__ import annotations

import argparse
import sys
import time
import types
from collections.abc import Callable

import numpy as np
from base_revision import load_base_module
from timing import compare

from shuffle_opacus.analysis.pld import ldp_pairs

PATH = "shuffle_opacus/analysis/pld/ldp_pairs.py"


def _chunks(module: types.ModuleType, n: int, eps0: float, pair: str) -> list[np.ndarray]:
    return [a for chunk in module.pair_chunks(n, eps0, ldp_pairs.DEFAULT_TAIL, pair) for a in chunk]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", default="1f8e1f2")
    args = parser.parse_args()
    old = load_base_module(args.base, PATH)
    compared = 0
    for pair in ("clones", "stronger"):
        for n in (1, 2, 7, 100, 1000, 60000, 1_000_000):
            for eps0 in (0.1, 0.5, 1.0, 2.0, 4.0, 8.0):
                if n == 1_000_000 and eps0 < 1.0:
                    continue  # about 10^8 outcomes: minutes, and the same code path
                a, b = _chunks(old, n, eps0, pair), _chunks(ldp_pairs, n, eps0, pair)
                same = len(a) == len(b) and all(
                    x.dtype == y.dtype and x.shape == y.shape and x.tobytes() == y.tobytes()
                    for x, y in zip(a, b, strict=True)
                )
                if not same:
                    sys.exit(f"DIFFERENT: pair {pair}, n {n}, eps0 {eps0}")
                compared += len(a)
    print(f"identical: {compared} arrays (both pairs, n 1 to 10^6, eps0 0.1 to 8)")

    def chunks_of(module: types.ModuleType) -> Callable[[], float]:
        def run() -> float:
            start = time.process_time()
            _chunks(module, 1_000_000, 4.0, "clones")
            return time.process_time() - start  # CPU seconds

        return run

    compare(
        {"old": chunks_of(old), "new": chunks_of(ldp_pairs)},
        rounds=3,
        warmup=0,
        title="pair_chunks at n = 10^6, eps0 4 (CPU s)",
    )


if __name__ == "__main__":
    main()
