"""The clones bound and its per-round profile: the working tree's code against a base revision.

    PYTHONPATH=.:experiments .venv/bin/python benchmarks/clones_identity.py [--base REV] [--time]

Checks that the working tree's ``clones.py``, ``_binomial.py`` and ``baselines.py`` (of
``shuffle_opacus/analysis/approximate``) return bit for bit the floats of revision ``REV``
(default: the commit before they were made faster). The base files are read with
``git show REV:PATH`` and loaded beside the package as ``_base_binomial``, ``_base_clones``
and ``_base_baselines`` (only their imports of each other are renamed), so that both versions
run in one process on the same numpy and scipy. Every float is compared by its bits (which
also tells ``0.0`` from ``-0.0`` and matches ``nan``), every array by dtype, shape and bytes
(``np.array_equal`` as well), ``None`` by identity:

* ``half_pmf_sf`` (the internal fast path of the clones sum) against the public
  ``binom_pmf`` and ``binom_sf`` at ``p = 1/2``, over random arrays of the shapes the sum uses;
* ``clones_delta(eps, n=n, eps0=eps0)``, both fields, for ``n`` in 2, 10, 100, 1000, 60,000,
  10^6, ``eps0`` in 0.1, 0.5, 1, 3, 8 and twelve ``eps`` in ``[0, eps0]``;
* ``clones_epsilon`` at a few settings (both fields);
* ``clones_gaussian(n, sigma, delta, method)``, every field, for both methods at a few
  settings (the quick config's 60,000 clients at analysis sigma 0.5 and delta 1e-5, the smoke
  config's 2,000 at sigma 1);
* ``round_profile`` as ``experiments/shuffle_experiments/curves.py`` calls it
  (``_cached_profile``'s arguments from the quick and smoke configs' plans): deltas, epsilons
  and users. The new side goes through ``curves._clones_profile`` itself.

It prints the number of comparisons and exits 1 at the first difference. With ``--time`` it
then times old and new interleaved in this process (``round_profile`` at the quick config's
setting, ``clones_gaussian`` at n = 60,000, sigma 0.5, delta 1e-5; CPU time of this process, less
sensitive than wall time to other processes on the machine) and prints the ratios
old / new per round and their median, with ``/proc/loadavg`` before and after.
"""

from __future__ import annotations

import argparse
import math
import statistics
import struct
import time
import types
import warnings
from pathlib import Path
from typing import Any

import numpy as np
from base_revision import load_base_module

ROOT = Path(__file__).resolve().parents[1]
BASE = "485e58ae4aac3744f8a44d52b8290fd690e9b4cc"
FOLDER = "shuffle_opacus/analysis/approximate"
CONFIGS = ("configs/quick.yaml", "configs/smoke.yaml")


def load_base(rev: str) -> dict[str, types.ModuleType]:
    """The three modules at ``rev``, beside their package as ``_base_<name>`` (base_revision.py)."""
    renames = {
        "from ._binomial import": "from ._base_binomial import",
        "from .clones import": "from ._base_clones import",
    }
    return {
        name: load_base_module(rev, f"{FOLDER}/{name}.py", renames=renames)
        for name in ("_binomial", "clones", "baselines")
    }


class Counter:
    """Counts comparisons; raises at the first difference."""

    def __init__(self) -> None:
        self.count = 0

    def same(self, what: str, old: Any, new: Any) -> None:
        """Check ``old`` and ``new`` are identical, recursing into tuples and dataclasses."""
        if hasattr(old, "__dataclass_fields__"):
            assert type(old).__name__ == type(new).__name__, what
            for field in old.__dataclass_fields__:
                self.same(f"{what}.{field}", getattr(old, field), getattr(new, field))
            return
        if isinstance(old, np.ndarray) or isinstance(new, np.ndarray):
            old, new = np.asarray(old), np.asarray(new)
            equal = (
                old.dtype == new.dtype
                and old.shape == new.shape
                and old.tobytes() == new.tobytes()
                and np.array_equal(old, new, equal_nan=True)
            )
        elif isinstance(old, (tuple, list)):
            assert len(old) == len(new), what
            for i, (a, b) in enumerate(zip(old, new, strict=True)):
                self.same(f"{what}[{i}]", a, b)
            return
        elif isinstance(old, float) or isinstance(new, float):
            equal = type(old) is type(new) and struct.pack("<d", old) == struct.pack("<d", new)
            equal = equal and (old == new or (math.isnan(old) and math.isnan(new)))
        else:
            equal = type(old) is type(new) and old == new
        self.count += 1
        if not equal:
            raise SystemExit(f"DIFFERENT {what}: old {old!r}, new {new!r}")


def check_kernel(check: Counter) -> None:
    """``half_pmf_sf`` against the public functions on arrays the clones sum can ask about."""
    from shuffle_opacus.analysis.approximate._binomial import binom_pmf, binom_sf, half_pmf_sf

    rng = np.random.default_rng(0)
    for trial in range(400):
        top = [3, 30, 3000, 10**6][trial % 4]
        c = np.sort(rng.integers(0, top + 1, size=int(rng.integers(1, 60)))).astype(float)
        if trial % 5 == 0:
            c[: max(1, c.size // 3)] = 0.0  # the empty binomial, whose sf is settled everywhere
        k = np.floor(rng.random((3, c.size)) * (c + 2.0))  # integers in [0, c + 1]
        k[0] = np.where(rng.random(c.size) < 0.3, 0.0, k[0])
        k[2] = np.where(rng.random(c.size) < 0.3, c + 1.0, k[2])  # both ends of the range
        k[1] = np.where(rng.random(c.size) < 0.3, c, k[1])
        pmf, sf = half_pmf_sf(k, c)
        check.same(f"pmf trial {trial}", binom_pmf(k, c, 0.5), pmf)
        check.same(f"sf trial {trial}", binom_sf(k, c, 0.5), sf)
        for row in range(3):  # one row at a time, as the base's loop asked
            check.same(f"pmf row {trial}", binom_pmf(k[row], c, 0.5), pmf[row].copy())
            check.same(f"sf row {trial}", binom_sf(k[row], c, 0.5), sf[row].copy())


def run_checks(base: dict[str, types.ModuleType]) -> int:
    """All the comparisons; returns their number."""
    from shuffle_experiments import curves
    from shuffle_experiments.config import load_config
    from shuffle_experiments.plan import build_plan

    import shuffle_opacus.analysis.approximate.baselines as new_baselines
    import shuffle_opacus.analysis.approximate.clones as new_clones

    old_clones, old_baselines = base["clones"], base["baselines"]
    check = Counter()
    check_kernel(check)
    print(f"half_pmf_sf: {check.count} comparisons")
    before = check.count
    for n in (2, 10, 100, 1000, 60_000, 10**6):
        for eps0 in (0.1, 0.5, 1.0, 3.0, 8.0):
            for eps in np.concatenate([np.linspace(0.0, eps0, 11), [eps0 * 0.999]]):
                eps = float(eps)
                check.same(
                    f"clones_delta({eps}, n={n}, eps0={eps0})",
                    old_clones.clones_delta(eps, n=n, eps0=eps0),
                    new_clones.clones_delta(eps, n=n, eps0=eps0),
                )
    print(f"clones_delta: {check.count - before} comparisons")
    before = check.count
    for n, eps0, delta in (
        (1000, 1.0, 1e-6),
        (60_000, 3.0, 1e-5),
        (10**5, 4.0, 1e-6),
        (50, 8.0, 1e-3),
    ):
        check.same(
            f"clones_epsilon(n={n}, eps0={eps0}, delta={delta})",
            old_clones.clones_epsilon(n=n, eps0=eps0, delta=delta),
            new_clones.clones_epsilon(n=n, eps0=eps0, delta=delta),
        )
    print(f"clones_epsilon: {check.count - before} comparisons")
    before = check.count
    settings = (
        (60_000, 0.5, 1e-5),
        (2000, 1.0, 1e-5),
        (3000, 0.5, 1e-4),
        (10**6, 0.3, 1e-6),
        (100, 2.0, 1e-2),
    )
    for n, sigma, delta in settings:
        for method in ("numerical", "closed-form"):
            kw: dict[str, Any] = {"n": n, "sigma": sigma, "delta": delta, "method": method}
            with warnings.catch_warnings():  # the closed form's validity warning
                warnings.simplefilter("ignore")
                check.same(
                    f"clones_gaussian({kw})",
                    old_clones.clones_gaussian(**kw),
                    new_clones.clones_gaussian(**kw),
                )
    print(f"clones_gaussian: {check.count - before} comparisons")
    before = check.count
    for path in CONFIGS:
        plan = build_plan(load_config(ROOT / path))
        decades = math.log10(10.0 * max(1, plan.rounds)) + 6.0
        args: dict[str, Any] = {
            "n": plan.population,
            "sigma": plan.replace_one_sigma,
            "delta_max": plan.delta,
            "rate": plan.rate,
            "decades": decades,
        }
        old = old_baselines.round_profile(**args)
        new = curves._clones_profile(plan)
        check.same(f"round_profile {path} via curves", old, new)
        check.same(f"round_profile {path}", old, new_baselines.round_profile(**args))
        print(f"  {path}: {args}, {len(old.epsilons)} points, users {old.users}")
    print(f"round_profile: {check.count - before} comparisons")
    return check.count


def time_both(base: dict[str, types.ModuleType], rounds: int) -> None:
    """Old and new interleaved in this process, alternating which goes first."""
    import shuffle_opacus.analysis.approximate.baselines as new_baselines
    import shuffle_opacus.analysis.approximate.clones as new_clones

    quick: dict[str, Any] = {"n": 60_000, "sigma": 0.5, "delta_max": 1e-5, "rate": 0.05}
    quick["decades"] = math.log10(10.0 * 1400) + 6.0
    cases = {
        "round_profile (quick)": (
            lambda: base["baselines"].round_profile(**quick),
            lambda: new_baselines.round_profile(**quick),
        ),
        "clones_gaussian(60000, 0.5, 1e-5)": (
            lambda: base["clones"].clones_gaussian(n=60_000, sigma=0.5, delta=1e-5),
            lambda: new_clones.clones_gaussian(n=60_000, sigma=0.5, delta=1e-5),
        ),
    }
    print("load before:", Path("/proc/loadavg").read_text().strip())
    for label, (old, new) in cases.items():
        ratios, olds, news = [], [], []
        for r in range(rounds):
            times = {}
            for which, fn in (
                (("old", old), ("new", new)) if r % 2 == 0 else (("new", new), ("old", old))
            ):
                start = time.process_time()
                fn()
                times[which] = time.process_time() - start
            olds.append(times["old"])
            news.append(times["new"])
            ratios.append(times["old"] / times["new"])
        print(
            f"{label}: old {statistics.median(olds):.3f} s, new {statistics.median(news):.3f} s, "
            f"ratio old/new median {statistics.median(ratios):.2f} "
            f"(per round {', '.join(f'{x:.2f}' for x in ratios)})"
        )
    print("load after:", Path("/proc/loadavg").read_text().strip())


def main() -> None:
    """Run the checks, then (with ``--time``) the interleaved timing."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", default=BASE, help="revision to compare with")
    parser.add_argument("--time", action="store_true", help="also time old against new")
    parser.add_argument("--rounds", type=int, default=5, help="timing rounds per case")
    args = parser.parse_args()
    base = load_base(args.base)
    total = run_checks(base)
    print(f"all {total} comparisons bit for bit identical")
    if args.time:
        time_both(base, args.rounds)


if __name__ == "__main__":
    main()
