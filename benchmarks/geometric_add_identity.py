"""Check that the geometric engine's ``_geometric_add`` is bit for bit the old one (not a test).

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/geometric_add_identity.py [--timing]

``_reference_add`` below is ``_geometric_add`` as it was before the Toeplitz / chunked-seed
rewrite (commit 485e58a), read from git beside the package (``base_revision.py``). The script
compares, bit for bit (the bytes of every array, so ``-0.0`` and NaN payloads count; ints and
floats by value and bits):

1. every ``_geometric_add`` call made while building the pairs of ``SETTINGS`` with
   ``_geometric_pair`` (each call's output against the reference on the same inputs);
2. the pairs themselves, built once with the reference add and once with the current one
   (every field of the :class:`ShuffleGaussianPair`);
3. random inputs: offsets with either order (so the swap happens), sizes 1..600 (most not a
   multiple of the block), positive masses with some zeros, atoms at zero or not, log-steps in
   ``[0.001, 0.02]`` or tiny (``1e-7`` to ``1e-5``, as at a large sigma), each at the default
   chunk size and at small ones (many chunks per block).

With ``--timing`` it then times old against new, interleaved in this process (medians), for
pair builds and for the add alone, and prints ``/proc/loadavg``. Exits 1 on any difference.
"""

from __future__ import annotations

import os
import struct
import sys
import time

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import numpy as np  # noqa: E402
from base_revision import load_base_module  # noqa: E402

from shuffle_opacus.analysis.pld.shuffle_gaussian import geometric  # noqa: E402
from shuffle_opacus.analysis.pld.shuffle_gaussian.pair import (  # noqa: E402
    DEFAULT_SPREAD,
    ShuffleGaussianPair,
)

#: (n, terms, gamma, sigma) of the pairs whose additions are compared.
SETTINGS = [
    (2, 2, 1.0, 0.5),
    (3, 3, 1.0, 2.0),
    (4, 4, 1.0, 0.3),
    (10, 10, 1.0, 0.3),
    (10, 10, 0.2, 1.0),
    (50, 50, 0.2, 0.5),
    (1000, 50, 1.0, 0.4534465031369155),
    (3, 3, 0.5, 0.7),
    (2, 2, 1.0, 5000.0),
    (64, 64, 0.25, 0.640870806240823),
]
TAIL = 1e-13
#: The commit before the rewrite.
BASE = "485e58a"

Part = tuple[int, np.ndarray, float]


#: ``_geometric_add`` as it was before the Toeplitz / chunked-seed rewrite.
_reference_add = load_base_module(
    BASE, "shuffle_opacus/analysis/pld/shuffle_gaussian/geometric.py"
)._geometric_add


def _same(a: object, b: object) -> bool:
    """Bit-for-bit equality of arrays (dtype, shape, bytes), ints, floats, strings."""
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return (
            isinstance(a, np.ndarray)
            and isinstance(b, np.ndarray)
            and a.dtype == b.dtype
            and a.shape == b.shape
            and np.array_equal(a, b)
            and a.tobytes() == b.tobytes()
        )
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        return struct.pack("<d", a) == struct.pack("<d", b)  # type: ignore[arg-type]
    return a == b


def _same_part(a: Part, b: Part) -> bool:
    return len(a) == len(b) == 3 and all(_same(x, y) for x, y in zip(a, b, strict=True))


def _same_pair(a: ShuffleGaussianPair, b: ShuffleGaussianPair) -> bool:
    names = ShuffleGaussianPair.__dataclass_fields__
    return all(_same(getattr(a, name), getattr(b, name)) for name in names)


def _build(setting: tuple[int, int, float, float], add: object) -> ShuffleGaussianPair:
    saved = geometric._geometric_add
    geometric._geometric_add = add  # type: ignore[assignment]
    try:
        return geometric._geometric_pair(*setting, TAIL, DEFAULT_SPREAD)
    finally:
        geometric._geometric_add = saved


def check_pairs() -> tuple[int, int]:
    """Compare every addition of the pairs' builds, then the pairs; return (calls, pairs)."""
    current = geometric._geometric_add
    calls = 0
    for setting in SETTINGS:
        seen: list[tuple[Part, Part, float]] = []

        def recording(y: Part, w: Part, step: float, seen: list = seen) -> Part:
            seen.append((y, w, step))
            return current(y, w, step)

        new_pair = _build(setting, recording)
        for y, w, step in seen:
            if not _same_part(current(y, w, step), _reference_add(y, w, step)):
                sys.exit(f"DIFFERENT add in the build of {setting}: sizes {y[1].size} {w[1].size}")
        old_pair = _build(setting, _reference_add)
        if not _same_pair(new_pair, old_pair):
            sys.exit(f"DIFFERENT pair at {setting}")
        calls += len(seen)
        print(f"  {setting}: {len(seen)} additions and the pair identical")
    return calls, len(SETTINGS)


def _random_part(rng: np.random.Generator) -> Part:
    size = int(rng.integers(1, 601))
    masses = rng.random(size) * 10.0 ** rng.uniform(-12, 0, size)
    masses[rng.random(size) < rng.choice([0.0, 0.05, 0.5])] = 0.0
    masses[0] = rng.random() + 1e-3  # the ends carry mass, as after a trim
    masses[-1] = rng.random() + 1e-3
    zero = float(rng.random()) if rng.random() < 0.5 else 0.0
    return int(rng.integers(-800, 801)), masses, zero


def check_random(count: int, seed: int = 20240611) -> int:
    """Compare ``count`` random additions at several chunk sizes; return the comparisons."""
    rng = np.random.default_rng(seed)
    chunk_products = geometric._CHUNK_PRODUCTS
    compared = 0
    try:
        for index in range(count):
            y, w = _random_part(rng), _random_part(rng)
            # Mostly the usual steps; one in four tiny (a large sigma: f(d) near log(2)/step,
            # about 1e6, so the cells of a block lie in a narrow window far from cell 0).
            if rng.random() < 0.25:
                step = float(10.0 ** rng.uniform(-7.0, -5.0))
            else:
                step = float(rng.uniform(0.001, 0.02))
            expected = _reference_add(y, w, step)
            for products in (chunk_products, 1, 997, 4096):
                geometric._CHUNK_PRODUCTS = products
                if not _same_part(geometric._geometric_add(y, w, step), expected):
                    sys.exit(
                        f"DIFFERENT random add #{index} (chunk products {products}): "
                        f"ky={y[0]} kw={w[0]} sizes {y[1].size} {w[1].size} step={step!r}"
                    )
                compared += 1
    finally:
        geometric._CHUNK_PRODUCTS = chunk_products
    return compared


def _median_times(functions: dict[str, object], repeats: int) -> dict[str, float]:
    times: dict[str, list[float]] = {name: [] for name in functions}
    for _ in range(repeats):
        for name, function in functions.items():
            start = time.perf_counter()
            function()  # type: ignore[operator]
            times[name].append(time.perf_counter() - start)
    return {name: float(np.median(values)) for name, values in times.items()}


def timing(repeats: int = 5) -> None:
    """Old against new, interleaved: pair builds and the add alone (median seconds)."""
    print(f"load before: {open('/proc/loadavg').read().strip()}")
    for setting in [
        (2, 2, 1.0, 0.5),
        (2, 2, 1.0, 5000.0),  # a tiny step: the cells of each block in a narrow, far window
        (10, 10, 1.0, 0.3),
        (64, 64, 0.25, 0.640870806240823),
    ]:
        medians = _median_times(
            {
                "old": lambda s=setting: _build(s, _reference_add),
                "new": lambda s=setting: _build(s, geometric._geometric_add),
            },
            repeats,
        )
        print(
            f"  pair {setting}: old {medians['old']:.3f} s, new {medians['new']:.3f} s, "
            f"ratio {medians['old'] / medians['new']:.2f}"
        )
    rng = np.random.default_rng(1)
    for size_y, size_w in [(5350, 5350), (2000, 3100), (700, 1292), (300, 400)]:
        y = (0, rng.random(size_y), 0.1)
        w = (40, rng.random(size_w), 0.0)
        medians = _median_times(
            {
                "old": lambda y=y, w=w: _reference_add(y, w, 0.01),
                "new": lambda y=y, w=w: geometric._geometric_add(y, w, 0.01),
            },
            repeats,
        )
        print(
            f"  add {size_y} x {size_w}: old {medians['old'] * 1e3:.1f} ms, "
            f"new {medians['new'] * 1e3:.1f} ms, ratio {medians['old'] / medians['new']:.2f}"
        )
    print(f"load after: {open('/proc/loadavg').read().strip()}")


def main() -> None:
    print("pairs:")
    calls, pairs = check_pairs()
    compared = check_random(300)
    print(
        f"identical: {calls} additions of {pairs} pair builds, {pairs} pairs, "
        f"{compared} random additions"
    )
    if "--timing" in sys.argv[1:]:
        timing()


if __name__ == "__main__":
    main()
