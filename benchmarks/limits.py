"""Cost estimates against measured times (run: ``python benchmarks/limits.py``; not a test).

The work limits of :mod:`shuffle_opacus.analysis.limits` refuse a request whose *estimated*
cost exceeds a budget. Each estimate is a count of work units (series elements of an order
range, enumerated outcomes of a privacy loss distribution, values of the clones scan, rounds of
a composition) times a measured unit cost. This script times one request per unit cost through
:func:`~shuffle_opacus.analysis.account` with no budget, prints the estimate, the measured time,
their ratio and the unit cost the measurement implies. A ratio of at least 1 means the estimate
is conservative; the constants of ``limits.py`` are the implied unit costs rounded up.

Everything runs on one thread (set before numpy is imported), each request once, in about two
minutes on one core. ``--quick`` runs only the requests that take under a second.
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")
# Time the computation, not the on-disk PMF cache (docs/accounting.md), unless asked to.
os.environ.setdefault("SHUFFLE_OPACUS_CACHE_DIR", "off")

import sys  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402
from dataclasses import dataclass, field  # noqa: E402

from shuffle_opacus.analysis import limits  # noqa: E402
from shuffle_opacus.analysis.mechanisms import _step_table, get_mechanism  # noqa: E402
from shuffle_opacus.analysis.query import account  # noqa: E402
from shuffle_opacus.analysis.rdp.conversion import OrderCapWarning  # noqa: E402


@dataclass(frozen=True)
class Request:
    """One timed request: what it measures and the arguments of ``account``."""

    unit: str
    mechanism: str
    parameters: dict[str, object]
    steps: list[int] = field(default_factory=lambda: [1])
    method: str | None = None
    max_order: int | None = None
    quick: bool = False


REQUESTS = [
    Request("SERIES_SECONDS (Miller)", "shuffle", {"n": 60000, "sigma": 1.0}, max_order=4096),
    Request(
        "SERIES_SECONDS (Miller)", "shuffle", {"n": 60000, "sigma": 1.0}, max_order=1024, quick=True
    ),
    Request("SERIES_SECONDS (powers)", "shuffle", {"n": 600, "sigma": 1.0}, max_order=2048),
    Request(
        "SERIES_SECONDS (check-in)",
        "checkin",
        {"n": 60000, "rate": 0.1, "sigma": 5.0},
        max_order=2048,
    ),
    Request(
        "SERIES_SECONDS (sum)",
        "checkin",
        {"n": 60000, "rate": 0.1, "sigma": 5.0},
        method="sum",
        max_order=256,
    ),
    Request("LDP_OUTCOME_SECONDS", "ldp-shuffle", {"n": 1000000, "eps0": 4.0}),
    Request("LDP_OUTCOME_SECONDS", "ldp-shuffle", {"n": 100000, "eps0": 4.0}, quick=True),
    Request("LDP_OUTCOME_SECONDS", "ldp-shuffle", {"n": 1000000, "eps0": 0.5}),
    Request("KRR_STRONG_OUTCOME_SECONDS", "krr", {"n": 1000000, "k": 4, "gamma": 0.25}),
    Request(
        "KRR_WEAK_OUTCOME_SECONDS", "krr", {"n": 3000, "k": 4, "gamma": 0.25, "adversary": "weak"}
    ),
    Request("CLONES_C_SECONDS", "clones", {"n": 10000000, "eps0": 1.0}),
    Request("CLONES_C_SECONDS", "clones", {"n": 100000, "eps0": 4.0}, quick=True),
    Request("CLONES_GAUSSIAN_C_SECONDS", "clones-gaussian", {"n": 100000, "sigma": 1.0}),
    Request("KOV_ROUND_SECONDS", "clones", {"n": 100000, "eps0": 4.0}, steps=[100000]),
    Request("PLD_POINT_SECONDS", "shuffle", {"n": 60000, "sigma": 1.0}, method="pld"),
    Request(
        "PLD_COMPOSE_SECONDS", "shuffle", {"n": 60000, "sigma": 5.0}, method="pld", steps=[100000]
    ),
]


def main(argv: list[str]) -> None:
    """Time the requests and print one row each."""
    quick = "--quick" in argv
    print(f"{'unit':28} {'request':58} {'estimate':>9} {'measured':>9} {'ratio':>6}")
    for req in REQUESTS:
        if quick and not req.quick:
            continue
        values = {**req.parameters}
        estimate = limits.account_seconds(
            get_mechanism(req.mechanism),
            values,
            steps=req.steps,
            method=req.method,
            max_order=req.max_order,
        )
        _step_table.cache_clear()
        start = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", OrderCapWarning)
            account(
                req.mechanism,
                req.parameters,
                steps=req.steps,
                delta=1e-6,
                method=req.method,
                max_order=req.max_order,
                max_seconds=None,
            )
        measured = time.perf_counter() - start
        shown = ", ".join(
            f"{k}={v:g}" if not isinstance(v, str) else f"{k}={v}" for k, v in values.items()
        )
        label = f"{req.mechanism} {req.method or ''} {shown} steps={req.steps[0]}"
        if req.max_order:
            label += f" L={req.max_order}"
        print(
            f"{req.unit:28} {label:58} {estimate:8.3g}s {measured:8.3g}s "
            f"{estimate / measured:6.2f}",
            flush=True,
        )


if __name__ == "__main__":
    main(sys.argv[1:])
