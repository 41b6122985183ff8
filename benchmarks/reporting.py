"""What it costs to report the pld epsilon after every round (not a test).

    .venv/bin/python benchmarks/reporting.py [--rounds 1400] [--every 100]

At the quick.yaml setting (n = 60,000, check-in rate 0.05, noise multiplier 1 under replace-one,
so the analysis sigma is 0.5, delta = 1e-5) the experiment asks for epsilon after each of its
1,400 rounds. Two ways, interleaved on the same rounds in one process:

* ``powers`` (the package): ``history_epsilon`` with ``method="pld"``, the per-round PMF and its
  spectrum kept (``shuffle_opacus.analysis.pld.powers``): every round 1..R is asked for, as the
  progress bar and metrics.csv do;
* ``self_compose`` (before): ``dp_accounting``'s ``self_compose`` of the same cached per-round
  PMF and its ``get_epsilon_for_delta``, at every ``--every``-th round only (it is slow).

It prints the first call (which builds the pair), the mean and largest time per update of each,
both epsilons at the shared rounds, the peak RSS, the load average and the CPU.
"""

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")
# Time the computation, not the on-disk PMF cache (docs/accounting.md), unless asked to.
os.environ.setdefault("SHUFFLE_OPACUS_CACHE_DIR", "off")

import argparse  # noqa: E402
import platform  # noqa: E402
import resource  # noqa: E402
import time  # noqa: E402

from shuffle_opacus import history_epsilon  # noqa: E402
from shuffle_opacus.analysis.pld.shuffle_gaussian import (  # noqa: E402
    pld_discretization,
    pld_tail,
    shuffle_gaussian_pair,
    symmetric_pmf,
)

N, RATE, NOISE, DELTA = 60000, 0.05, 1.0, 1e-5


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=1400)
    parser.add_argument("--every", type=int, default=100)
    args = parser.parse_args()
    print(f"machine: {platform.processor() or platform.machine()}, load {os.getloadavg()}")

    def ours(t: int) -> float:
        return history_epsilon(
            [(NOISE, RATE, t)], protocol="checkin", delta=DELTA, population=N, method="pld"
        ).epsilon

    start = time.perf_counter()
    ours(1)
    first = time.perf_counter() - start
    print(f"first call (builds the pair and its PMF): {first:.2f} s")
    sigma = NOISE / 2.0
    pmf = symmetric_pmf(
        shuffle_gaussian_pair(n=N, sigma=sigma, rate=RATE, tail=pld_tail(DELTA, args.rounds)),
        pld_discretization(n=N, sigma=sigma, rate=RATE),
        pld_tail(DELTA, args.rounds) / 4.0,
    )
    times, old_times, pairs = [], [], []
    for t in range(1, args.rounds + 1):
        began = time.perf_counter()
        eps = ours(t)
        times.append(time.perf_counter() - began)
        if t % args.every == 0:
            began = time.perf_counter()
            old = (pmf.self_compose(t) if t > 1 else pmf).get_epsilon_for_delta(DELTA)
            old_times.append(time.perf_counter() - began)
            pairs.append((t, eps, old))
            print(f"round {t}: powers {eps:.7f} ({times[-1] * 1e3:.1f} ms), self_compose "
                  f"{old:.7f} ({old_times[-1] * 1e3:.0f} ms)", flush=True)  # fmt: skip
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(
        f"powers: {len(times)} updates, mean {sum(times) / len(times) * 1e3:.1f} ms, largest "
        f"{max(times) * 1e3:.1f} ms; with the first call amortised "
        f"{(sum(times) + first) / len(times) * 1e3:.1f} ms"
    )
    print(
        f"self_compose: {len(old_times)} updates, mean {sum(old_times) / len(old_times) * 1e3:.0f}"
        f" ms; largest relative difference "
        f"{max(abs(a - b) / b for _, a, b in pairs):.2e}"
    )
    print(f"peak RSS {rss:.0f} MB; load {os.getloadavg()}")


if __name__ == "__main__":
    main()
