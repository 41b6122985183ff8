"""Accounting benchmark: prints tables (not a test). Run with one thread per process.

    .venv/bin/python benchmarks/accounting.py

1. Table 1 of Liew & Takahashi (n = 60000, sigma = 9.48, delta = 1/n) with automatic orders.
2. The paper's MNIST check-in setting (n = 60000, gamma = 0.1, sigma = 5, 5540 rounds,
   delta = 1e-5): theorem3, sum, exact and the central reference, with times.
3. Theorem 1 at max order 30 against partition enumeration, and at max order 2000.
4. The numerical clones bound (Feldman, McMillan & Talwar, Theorem 3.2) up to n = 10^7.
5. PLD of shuffled eps0-LDP reports (Koskela, Heikkilä & Honkela) up to n = 10^6, both pairs.
6. PLD of the shuffle Gaussian itself (``method="pld"``) at the MNIST check-in setting, the quick
   experiment's setting and Table 1's, against RDP ``exact`` and the central reference
   (``dp_accounting``, Poisson-subsampled Gaussian with std sigma sqrt(gamma n) on the sum),
   with the optimistic estimate of the same pair; each setting in a fresh process, with its
   time and peak memory (``--pld [NAME ...]`` runs this section alone).
"""

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")
# Time the computation, not the on-disk PMF cache (docs/accounting.md), unless asked to.
os.environ.setdefault("SHUFFLE_OPACUS_CACHE_DIR", "off")

import json  # noqa: E402
import math  # noqa: E402
import platform  # noqa: E402
import resource  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

from shuffle_opacus.analysis.approximate.clones import clones_epsilon  # noqa: E402
from shuffle_opacus.analysis.epsilon import compute_epsilon  # noqa: E402
from shuffle_opacus.analysis.mechanisms import _step_table  # noqa: E402
from shuffle_opacus.analysis.pld import feldman_pair, ldp_shuffle_epsilon  # noqa: E402
from shuffle_opacus.analysis.rdp.shuffle_gaussian import shuffle_gaussian_rdp  # noqa: E402

TABLE1_PAPER = [0.22820, 0.22820, 0.22821, 0.22821, 0.22821, 0.22822, 0.22822]


def algorithm1_rdp(n: int, sigma: float, order: int) -> float:
    """Theorem 1 the way the paper's Algorithm 1 computes it, for the timing comparison.

    Every integer partition of the order (at most ``n`` parts) stands for the exponent vectors
    that permute it; each contributes its multinomial coefficient times
    ``exp(sum k_i^2 / 2 sigma^2)``. Partitions are generated with an explicit stack.
    """
    log_terms = []
    stack = [(order, order, ())]
    while stack:
        left, cap, parts = stack.pop()
        if left == 0:
            if len(parts) <= n:
                multiplicities = [parts.count(k) for k in set(parts)]
                log_count = math.lgamma(n + 1) - math.lgamma(n - len(parts) + 1)
                log_count -= sum(math.lgamma(c + 1) for c in multiplicities)
                log_coeff = math.lgamma(order + 1) - sum(math.lgamma(k + 1) for k in parts)
                exponent = sum(k * k for k in parts) / (2 * sigma**2)
                log_terms.append(log_count + log_coeff + exponent)
            continue
        stack.extend((left - k, k, (*parts, k)) for k in range(1, min(left, cap) + 1))
    peak = max(log_terms)
    log_sum = peak + math.log(sum(math.exp(v - peak) for v in log_terms))
    return (log_sum - order / (2 * sigma**2) - order * math.log(n)) / (order - 1)


def timed(fn, repeat=3):
    best = math.inf
    for _ in range(repeat):
        _step_table.cache_clear()  # time the computation, not a lookup of the per-round table
        start = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - start)
    return out, best


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return (
        f"{cpu}; {os.cpu_count()} cores; Python {platform.python_version()}; numpy {np.__version__}"
    )


def main() -> None:
    print(f"machine: {machine()} (single thread)\n")

    print("## Table 1 setting: n=60000, sigma=9.48, delta=1/n")
    print(
        "| compositions | paper (orders <= 30) | ours, orders <= 30 "
        "| ours, automatic orders | order | time (s) |"
    )
    print("|---|---|---|---|---|---|")
    for c in range(1, 8):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            capped = compute_epsilon(
                "shuffle", n=60000, sigma=9.48, steps=c, delta=1 / 60000, max_order=30
            )
        res, sec = timed(
            lambda c=c: compute_epsilon("shuffle", n=60000, sigma=9.48, steps=c, delta=1 / 60000)
        )
        print(
            f"| {c} | {TABLE1_PAPER[c - 1]:.5f} | {capped.epsilon:.5f} | {res.epsilon:.5f} | "
            f"{res.order} | {sec:.3f} |"
        )

    print("\n## MNIST check-in: n=60000, gamma=0.1, sigma=5, 5540 rounds, delta=1e-5")
    print("| method | epsilon | order | ratio to central | time (s) |")
    print("|---|---|---|---|---|")
    central, c_sec = timed(
        lambda: compute_epsilon(
            "subsampled-gaussian",
            rate=0.1,
            sigma=5.0 * math.sqrt(60000 * 0.1),
            steps=5540,
            delta=1e-5,
        )
    )
    for method in ("theorem3", "sum", "exact"):
        res, sec = timed(
            lambda m=method: compute_epsilon(
                "checkin", n=60000, rate=0.1, sigma=5.0, steps=5540, delta=1e-5, method=m
            )
        )
        print(
            f"| {method} | {res.epsilon:.5f} | {res.order} | "
            f"{res.epsilon / central.epsilon:.3f} | {sec:.3f} |"
        )
    print(
        f"| central (Poisson-subsampled Gaussian, sigma*sqrt(n*gamma)) | {central.epsilon:.5f} | "
        f"{central.order} | 1.000 | {c_sec:.3f} |"
    )

    print("\n## Theorem 1 (n=60000, sigma=9.48): all orders 2..L in one call")
    print("| L | series (s) | partition enumeration (s) | speed-up |")
    print("|---|---|---|---|")
    _, fast = timed(lambda: shuffle_gaussian_rdp(n=60000, sigma=9.48, orders=np.arange(2, 31)))
    _, slow = timed(lambda: [algorithm1_rdp(60000, 9.48, lam) for lam in range(2, 31)], repeat=1)
    print(f"| 30 | {fast:.4f} | {slow:.3f} | {slow / fast:.0f}x |")
    _, big = timed(lambda: shuffle_gaussian_rdp(n=60000, sigma=9.48, orders=np.arange(2, 2001)))
    print(f"| 2000 | {big:.3f} | infeasible | - |")
    _, small_n = timed(lambda: shuffle_gaussian_rdp(n=1000, sigma=9.48, orders=np.arange(2, 2001)))
    print(f"| 2000 (n=1000 < L: binary exponentiation) | {small_n:.3f} | infeasible | - |")

    print("\n## Numerical clones bound, delta = 1e-6 (certified upper and lower epsilon)")
    print("| n | eps0 | upper | lower | time (s) |")
    print("|---|---|---|---|---|")
    for n, eps0 in ((100_000, 4.0), (10**6, 4.0), (10**6, 1.0), (10**7, 1.0)):
        res, secs = timed(lambda n=n, eps0=eps0: clones_epsilon(n=n, eps0=eps0, delta=1e-6))
        print(f"| {n:,} | {eps0:g} | {res.upper:.7f} | {res.lower:.7f} | {secs:.3f} |")

    print("\n## PLD of shuffled eps0-LDP reports (Lemma 11), delta = 1e-6, one round")
    print(
        "clones pair (default, any eps0-LDP randomiser) and the stronger pair of arXiv:2208.04591"
    )
    print("(its errata: only for a restricted class); outcomes and time of the clones pair.")
    print(
        "| n | eps0 | PLD, clones pair | PLD, stronger pair | clones upper | outcomes | time (s) |"
    )
    print("|---|---|---|---|---|---|---|")
    for n, eps0 in ((10_000, 4.0), (100_000, 4.0), (10**6, 4.0), (10**6, 1.0)):
        eps, secs = timed(lambda n=n, eps0=eps0: ldp_shuffle_epsilon(1e-6, n=n, eps0=eps0))
        stronger = ldp_shuffle_epsilon(1e-6, n=n, eps0=eps0, pair="stronger")
        size = feldman_pair(n=n, eps0=eps0).loss.size
        clones = clones_epsilon(n=n, eps0=eps0, delta=1e-6).upper
        print(
            f"| {n:,} | {eps0:g} | {eps:.6f} | {stronger:.6f} | {clones:.6f} | {size:,} "
            f"| {secs:.2f} |"
        )


#: (label, compute_epsilon arguments, central std on the sum, central sampling rate, delta)
PLD_SETTINGS = {
    "mnist": (
        "MNIST check-in: n=60000, gamma=0.1, sigma=5, 5540 rounds, delta=1e-5",
        {
            "mechanism": "checkin",
            "n": 60000,
            "rate": 0.1,
            "sigma": 5.0,
            "steps": 5540,
            "delta": 1e-5,
        },  # fmt: skip
    ),
    "quick": (
        "quick.yaml: n=60000, gamma=0.05, sigma=0.5, 1400 rounds, delta=1e-5",
        {
            "mechanism": "checkin",
            "n": 60000,
            "rate": 0.05,
            "sigma": 0.5,
            "steps": 1400,
            "delta": 1e-5,
        },  # fmt: skip
    ),
    "mnist-replace-one": (
        "MNIST check-in under replace-one: n=60000, gamma=0.1, sigma=2.5 (noise multiplier 5), "
        "5540 rounds, delta=1e-5",
        {
            "mechanism": "checkin",
            "n": 60000,
            "rate": 0.1,
            "sigma": 2.5,
            "steps": 5540,
            "delta": 1e-5,
        },  # fmt: skip
    ),
    "n100": (
        "n=100, sigma=1, 50 rounds, delta=1e-5 (plain shuffle)",
        {"mechanism": "shuffle", "n": 100, "sigma": 1.0, "steps": 50, "delta": 1e-5},
    ),
    **{
        f"small-{n}-{s}-{k}": (
            f"n={n}, sigma={s}, {k} round(s), delta=1e-5 (plain shuffle)",
            {"mechanism": "shuffle", "n": n, "sigma": s, "steps": k, "delta": 1e-5},
        )
        for n, s in ((1, 0.5), (1, 1.0), (2, 0.5), (3, 0.5), (10, 0.3))
        for k in (1, 10)
    },
    **{
        f"table1-{k}": (
            f"Table 1: n=60000, sigma=9.48, delta=1/n, {k} composition(s)",
            {"mechanism": "shuffle", "n": 60000, "sigma": 9.48, "steps": k, "delta": 1 / 60000},
        )
        for k in range(1, 8)
    },
}


def pld_child(name: str) -> None:
    """Compute one PLD setting in this (fresh) process and print a JSON line."""
    kwargs = dict(PLD_SETTINGS[name][1])
    mechanism = kwargs.pop("mechanism")
    start = time.perf_counter()
    try:
        result = compute_epsilon(mechanism, **kwargs, method="pld")
    except ValueError as error:  # a setting the method refuses: its one-line reason
        print(json.dumps({"error": str(error)}))
        return
    seconds = time.perf_counter() - start
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(
        json.dumps(
            {
                "epsilon": result.epsilon,
                "lower": result.epsilon_lower,
                "seconds": seconds,
                "rss_mb": rss,
            }
        )
    )


def central_epsilon(kwargs: dict) -> float:
    """The central reference of a setting, by dp_accounting's own PLD (connect-the-dots)."""
    from dp_accounting.pld import privacy_loss_distribution as pldm

    gamma = kwargs.get("rate", 1.0)
    std = kwargs["sigma"] * math.sqrt(gamma * kwargs["n"])
    if gamma == 1.0:
        from shuffle_opacus.analysis.approximate.analytic_gaussian import gaussian_dp_epsilon

        return gaussian_dp_epsilon(kwargs["delta"], sigma=std / math.sqrt(kwargs["steps"]))
    pld = pldm.from_gaussian_mechanism(
        standard_deviation=std, sampling_prob=gamma, value_discretization_interval=1e-6
    )
    return pld.self_compose(kwargs["steps"]).get_epsilon_for_delta(kwargs["delta"])


def pld_section(names: list[str] | None = None) -> None:
    print("\n## PLD of the shuffle Gaussian (method pld): epsilon, time and peak memory")
    print(
        "| setting | pld | optimistic | RDP | central | pld / central | time (s) | peak RSS (MB) |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for name, (label, kwargs) in PLD_SETTINGS.items():
        if names and name not in names:
            continue
        out = subprocess.run(
            [sys.executable, __file__, "--pld-child", name],
            capture_output=True,
            text=True,
            check=True,
        )
        row = json.loads(out.stdout.strip().splitlines()[-1])
        args = dict(kwargs)
        mechanism = args.pop("mechanism")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            fallback = {"checkin": "exact", "shuffle": "theorem1"}[mechanism]
            rdp = compute_epsilon(mechanism, **args, method=fallback).epsilon
        central = central_epsilon(kwargs)
        if "error" in row:
            print(f"| {label} | refused: {row['error']} | | {rdp:.6f} | {central:.6f} | | | |")
            continue
        print(
            f"| {label} | {row['epsilon']:.6f} | {row['lower']:.6f} | {rdp:.6f} | "
            f"{central:.6f} | {row['epsilon'] / central:.4f} | {row['seconds']:.2f} | "
            f"{row['rss_mb']:.0f} |"
        )


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--pld-child":
        pld_child(sys.argv[2])
    elif len(sys.argv) >= 2 and sys.argv[1] == "--pld":
        pld_section(sys.argv[2:])
    else:
        main()
        pld_section()
