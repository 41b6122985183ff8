"""Check that compositions' Chernoff windows are bit for bit a base revision's, and time them.

    .venv/bin/python benchmarks/windows_identity.py [--base REV]

Loads ``shuffle_opacus/analysis/pld/powers.py`` as it was at ``REV`` (default ``a280257``, when
every order's moment was computed with the PMF and the window scanned them all) beside the
package (``base_revision.py``). For the per-round PMFs the ``pld`` and ``proven`` methods build
(pessimistic and optimistic, shuffle and check-in, n from 10^3 to 10^7, on their default grids;
the local Gaussian alone up to n = 60,000, 10^6 points)
and for random PMFs, it compares the window of :func:`.moments.window` with the base's scan
(its moments computed by its own code) at round counts from 1 to 10^6, alone and two PMFs
together, then times both on the same PMFs, interleaved in this process by
``timing.compare`` (CPU time, 3 rounds, load recorded): the base's moments and scan against a
fresh search. Exits 1 on any difference.
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

from shuffle_opacus.analysis.pld import proven, rounds
from shuffle_opacus.analysis.pld.moments import window
from shuffle_opacus.analysis.pld.powers import PmfPowers
from shuffle_opacus.analysis.pld.shuffle_gaussian import pld_discretization, pld_tail

PATH = "shuffle_opacus/analysis/pld/powers.py"
COUNTS = (1, 2, 3, 10, 100, 1000, 5540, 10_000, 10**5, 10**6)
SETTINGS = (
    rounds.ShuffleRound(n=1000, sigma=1.0),
    rounds.ShuffleRound(n=1000, sigma=4.0),
    rounds.ShuffleRound(n=60000, sigma=0.689, rate=0.1),  # the paper's calibrated sigma
    rounds.ShuffleRound(n=60000, sigma=2.5, rate=0.1),
    rounds.ShuffleRound(n=10**5, sigma=5.0, rate=0.01),
    rounds.ShuffleRound(n=10**7, sigma=5.0, rate=1e-3),
    rounds.ShuffleRound(n=6000, sigma=0.8, m=600),
)


def _pmfs() -> list[PmfPowers]:
    """The per-round PMFs of the settings (built fresh: nothing read from the disk cache)."""
    found = []
    for s in SETTINGS:
        grid = pld_discretization(n=s.n, sigma=s.sigma, rate=s.rate, m=s.m)
        tail = pld_tail(1e-5, 5540)
        found.append(rounds._build_upper(s, grid, tail)[0])
        found.extend(rounds._build_lower(s, grid, tail))
        if s.n <= 60000:  # the local Gaussian alone: 10^6 points here, 4 10^6 at n = 10^5
            found.append(proven._gaussian_powers(s, grid))
    rng = np.random.default_rng(0)
    for size in (1500, 6000, 40000):
        x = np.linspace(-1.0, 1.0, size)
        probs = np.exp(-rng.uniform(1.0, 500.0) * (x - rng.uniform(-0.5, 0.5)) ** 2)
        probs /= probs.sum() * (1.0 + 1e-9)
        found.append(
            PmfPowers.from_arrays(
                discretization=2.0**-14,
                lower=-size // 2,
                probs=probs,
                infinity=1e-9,
                pessimistic=True,
            )
        )
    return [_fresh(p) for p in found]


def _fresh(pmf: PmfPowers) -> PmfPowers:
    return PmfPowers.from_arrays(**{**pmf.fields(), "log_mgf": None})


_BASE_MOMENTS: dict[int, types.SimpleNamespace] = {}


def _base_window(
    old: types.ModuleType, parts: list[tuple[PmfPowers, int]], *, keep: bool = True
) -> tuple[int, int]:
    """The base revision's window: its own moments of every order (kept), then its scan."""
    shims = []
    for p, k in parts:
        shim = _BASE_MOMENTS.get(id(p)) if keep else None
        if shim is None:
            orders = old._chernoff_orders(p.discretization)
            moments = old._log_mgf(p.probs, orders)
            shim = types.SimpleNamespace(size=p.size, orders=orders, log_mgf=moments)
            if keep:
                _BASE_MOMENTS[id(p)] = shim
        shims.append((shim, k))
    return tuple(old._window(shims, old.DEFAULT_TRUNCATION))  # type: ignore[return-value]


def _new_window(parts: list[tuple[PmfPowers, int]]) -> tuple[int, int]:
    support = sum((p.size - 1) * k for p, k in parts)
    return window([(p.moments, k) for p, k in parts], support, 1e-15)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", default="a280257")
    args = parser.parse_args()
    old = load_base_module(args.base, PATH)
    pmfs = _pmfs()
    compared = 0
    for i, p in enumerate(pmfs):
        partner = next((q for q in pmfs[i + 1 :] if q.discretization == p.discretization), None)
        for count in COUNTS:
            cases = [[(p, count)]] + ([[(p, count), (partner, 3)]] if partner else [])
            for parts in cases:
                if _new_window(parts) != _base_window(old, parts):
                    sys.exit(f"DIFFERENT: PMF {i} (size {p.size}), count {count}")
                compared += 1
    computed = sum(int(p.moments.done.sum()) for p in pmfs)
    orders = sum(p.orders.size for p in pmfs)
    print(f"identical: {compared} windows of {len(pmfs)} PMFs (sizes {min(p.size for p in pmfs)}"
          f" to {max(p.size for p in pmfs)}), counts 1 to 10^6; the search computed {computed}"
          f" of {orders} orders over all counts", flush=True)  # fmt: skip

    def one_window_each(name: str) -> Callable[[], float]:
        def run() -> float:
            fresh = [_fresh(p) for p in pmfs]  # built outside the timed part
            start = time.process_time()
            for p in fresh:
                parts = [(p, 5540)]
                (_base_window(old, parts, keep=False) if name == "base" else _new_window(parts))
            return time.process_time() - start  # CPU seconds

        return run

    compare(
        {name: one_window_each(name) for name in ("base", "search")},
        rounds=3,
        warmup=0,
        title=f"one window per PMF at 5,540 rounds, all {len(pmfs)} PMFs (CPU s)",
    )


if __name__ == "__main__":
    main()
