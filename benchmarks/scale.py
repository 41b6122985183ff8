"""Accounting at the scale of real deployments: time and peak memory against n (issue 42).

Run ``python benchmarks/scale.py table`` (not a test). Every request runs in its own process,
timed from outside with its peak resident memory (``/usr/bin/time``), under an address-space cap
of 8 GiB so that a request that would exhaust the machine fails instead. The requests of one
repetition are interleaved (each n in turn, then again), so the ratios of times come from the
same window; the load average is recorded before each request.

Subcommands:

* ``table``: ``shuffle-opacus account checkin`` at noise multiplier 10, 10,000 rounds, n = 1e5,
  1e6, 1e7 (rate 0.01), 1e8 (rate 1e-3), 1e9 (rate 1e-4): the command as shipped (the tight
  and the proven method) and ``--method pld`` alone (the tight one, with its lower end);
  the time ratio to n = 1e5 per repetition.
* ``extras``: ``calibrate`` at n = 1e9 and 1e5, an Opacus accountant asked for epsilon after
  each of 200 rounds (n = 1e9 and 1e5), ``account subsampled`` at n = 1e8 (m = 1e5) and the
  user-level path at n = 1e8 (the history accounting that the federated trainer's accountant
  calls, check-in rate 1e-3).
* ``check``: at n = 1e7 the windowed composition against the composition over the whole support
  (no truncation); at n = 1e7 and 1e8 the tight epsilon against the central floor (see
  :func:`central_epsilon`).
* ``figure PATH``: epsilon and time against n from 1e3 to 1e9 at noise multiplier 10 and an
  expected cohort of 1,000 clients, the central floor beside it (a PNG at PATH).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

# Time the computation, not the on-disk PMF cache (docs/accounting.md), unless asked to.
os.environ.setdefault("SHUFFLE_OPACUS_CACHE_DIR", "off")

ROOT = Path(__file__).resolve().parent.parent
CLI = [sys.executable, "-m", "shuffle_opacus.cli"]
ADDRESS_SPACE = 8 << 30
NOISE_MULTIPLIER = 10.0
ROUNDS = 10_000
DELTA = 1e-5
#: (n, check-in rate) of the issue's table.
TABLE = [(10**5, 0.01), (10**6, 0.01), (10**7, 0.01), (10**8, 1e-3), (10**9, 1e-4)]


def _cap() -> None:  # pragma: no cover - runs in the child
    resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE, ADDRESS_SPACE))


def measure(command: Sequence[str]) -> dict[str, object]:
    """Run ``command`` in its own process; return its wall time, peak memory and output.

    Args:
        command: The command line.

    Returns:
        ``seconds``, ``peak_gb``, ``rc``, ``stdout`` (text), ``stderr`` (last line) and ``load``
        (the one-minute load average before it started).
    """
    load = os.getloadavg()[0]
    timer = shutil.which("time") or "/usr/bin/time"
    with tempfile.NamedTemporaryFile("r", suffix=".txt") as report:
        start = time.perf_counter()
        done = subprocess.run(
            [timer, "-f", "%M", "-o", report.name, *command],
            capture_output=True,
            text=True,
            preexec_fn=_cap,
            cwd=ROOT,
            check=False,
        )
        seconds = time.perf_counter() - start
        lines = [line for line in Path(report.name).read_text().splitlines() if line.strip()]
    peak_kb = float(lines[-1]) if lines and lines[-1].strip().isdigit() else math.nan
    errors = [line for line in done.stderr.splitlines() if line.strip()]
    return {
        "seconds": seconds,
        "peak_gb": peak_kb / 1e6,
        "rc": done.returncode,
        "stdout": done.stdout,
        "stderr": errors[-1] if errors else "",
        "load": load,
    }


def _records(stdout: str) -> list[dict[str, object]]:
    return [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]


def _account(n: int, rate: float, *, method: str | None) -> list[str]:
    command = [*CLI, "account", "checkin", "--n", str(n), "--rate", repr(rate)]
    command += ["--noise-multiplier", repr(NOISE_MULTIPLIER), "--steps", str(ROUNDS), "--json"]
    return command + (["--method", method] if method else [])


def table(repeats: int) -> None:
    """Print the issue's table: the shipped command and the tight method alone, interleaved."""
    rows: dict[tuple[int, str], list[dict[str, object]]] = {}
    for _ in range(repeats):
        for n, rate in TABLE:
            for label, method in (("account", None), ("pld", "pld")):
                result = measure(_account(n, rate, method=method))
                rows.setdefault((n, label), []).append(result)
                print(
                    f"  n={n:.0e} {label:7s} {result['seconds']:6.1f} s "
                    f"{result['peak_gb']:5.2f} GB rc={result['rc']} load={result['load']:.1f}",
                    flush=True,
                )
    print(
        "\n| n | rate | command | time (median) | peak memory | eps (tight) | lower | "
        "eps (proven) | time / n=1e5 | load |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for (n, label), results in rows.items():
        rate = dict(TABLE)[n]
        seconds = sorted(float(r["seconds"]) for r in results)
        base = rows[(TABLE[0][0], label)]
        ratios = sorted(
            float(r["seconds"]) / float(b["seconds"]) for r, b in zip(results, base, strict=True)
        )
        records = _records(str(results[-1]["stdout"]))
        tight = next((r for r in records if r.get("method") != "proven"), {})
        proven = next((r for r in records if r.get("method") == "proven"), {})
        failed = str(results[-1]["stderr"]) if results[-1]["rc"] else ""
        print(
            f"| {n:.0e} | {rate:g} | {label} | {seconds[len(seconds) // 2]:.1f} s | "
            f"{max(float(r['peak_gb']) for r in results):.2f} GB | "
            f"{tight.get('epsilon', failed)} | {tight.get('epsilon_lower', '')} | "
            f"{proven.get('epsilon', '')} | {ratios[len(ratios) // 2]:.2f} | "
            f"{max(float(r['load']) for r in results):.1f} |"
        )


_ACCOUNTANT = """
import time
from shuffle_opacus.engine.accountants import ShuffledCheckInAccountant
acc = ShuffledCheckInAccountant()
acc.configure(population={n})
start = time.perf_counter()
for _ in range({rounds}):
    acc.step(noise_multiplier={nm}, sample_rate={rate})
    eps = acc.get_epsilon({delta})
print("epsilon", eps, "method", acc.epsilon_result({delta}).method, "seconds",
      time.perf_counter() - start)
"""

_USER_LEVEL = """
from shuffle_opacus import history_epsilon
result = history_epsilon([({nm}, {rate}, {rounds})], protocol="checkin", delta={delta},
                         population={n})
print("epsilon", result.epsilon, "method", result.method, "note", result.note)
"""


def extras(repeats: int) -> None:
    """Print calibrate, a per-round accountant, subsampled and the user-level path."""
    cases: list[tuple[str, list[str]]] = []
    for n, rate in ((10**5, 0.01), (10**9, 1e-4)):
        calibrate = [*CLI, "calibrate", "checkin", "--n", str(n), "--rate", repr(rate)]
        calibrate += ["--rounds", str(ROUNDS), "--epsilon", "1.0", "--json"]
        cases.append((f"calibrate n={n:.0e}", calibrate))
        code = _ACCOUNTANT.format(n=n, rate=rate, nm=NOISE_MULTIPLIER, rounds=200, delta=DELTA)
        cases.append((f"accountant 200 rounds n={n:.0e}", [sys.executable, "-c", code]))
    subsampled = [*CLI, "account", "subsampled", "--n", str(10**8), "--m", str(10**5)]
    subsampled += ["--noise-multiplier", repr(NOISE_MULTIPLIER), "--steps", str(ROUNDS), "--json"]
    cases.append(("account subsampled n=1e8 m=1e5", subsampled))
    code = _USER_LEVEL.format(n=10**8, rate=1e-3, nm=NOISE_MULTIPLIER, rounds=ROUNDS, delta=DELTA)
    cases.append(("user level (history_epsilon) n=1e8", [sys.executable, "-c", code]))
    for _ in range(repeats):
        for label, command in cases:
            result = measure(command)
            out = str(result["stdout"]).strip().splitlines()
            print(
                f"| {label} | {result['seconds']:.1f} s | {result['peak_gb']:.2f} GB | "
                f"rc={result['rc']} | load {result['load']:.1f} | "
                f"{(out[-1] if out else result['stderr'])[:160]} |",
                flush=True,
            )


def central_epsilon(
    n: int, rate: float, noise_multiplier: float, rounds: int, *, pessimistic: bool = True
) -> float:
    """Epsilon of the central floor: a trusted server adding the clients' total noise once.

    The same rounds, clients and Poisson check-in at ``rate``; the server sums the participants'
    clipped updates and adds one Gaussian of standard deviation ``noise_multiplier C
    sqrt(n rate)`` (the clients' noise variances over the expected cohort). Replace-one
    adjacency of one client as in the tight method: the differing client's two updates lie
    ``2C`` apart and the others are fixed, which, with the differing client's update 0 on one
    side and the sum taken relative to the others, is the pair ``(1 - rate) N(0, s^2) + rate
    N(1, s^2)`` against ``N(0, s^2)`` with ``s = noise_multiplier sqrt(n rate) / 2`` (in units of
    the ``2C`` distance; Theorem 1's pair with the shuffle replaced by the trusted sum) in both
    orders: ``dp_accounting``'s Poisson-subsampled Gaussian with add-or-remove adjacency,
    pessimistic (an upper bound, on a loss grid of 1/128 of one round's loss standard deviation)
    or optimistic (a lower estimate, on a grid eight times finer), composed by
    :func:`~shuffle_opacus.analysis.pld.powers.compose_powers`. A reference, not a theorem about
    the shuffle: the shuffle's sum carries the realised cohort's noise, which varies around this.

    Args:
        n: Population.
        rate: Check-in rate.
        noise_multiplier: Each client's noise over the clipping norm.
        rounds: Rounds composed.
        pessimistic: The upper estimate (``True``) or the lower one.

    Returns:
        Epsilon at ``DELTA`` (the larger of the two directions).
    """
    from dp_accounting.pld import privacy_loss_distribution as pld_lib

    from shuffle_opacus.analysis.pld.powers import PmfPowers, compose_powers, epsilon_for_delta

    s = noise_multiplier * math.sqrt(n * rate) / 2.0
    loss_sd = rate * math.sqrt(math.expm1(1.0 / s**2))
    points = 128.0 if pessimistic else 1024.0
    step = 2.0 ** math.floor(math.log2(max(loss_sd / points, 2.0**-40)))
    pld = pld_lib.from_gaussian_mechanism(
        s,
        sampling_prob=rate,
        value_discretization_interval=step,
        use_connect_dots=pessimistic,
        pessimistic_estimate=pessimistic,
    )
    return max(
        epsilon_for_delta(compose_powers([(PmfPowers(pmf), rounds)]), DELTA)
        for pmf in (pld._pmf_remove, pld._pmf_add)
    )


def _full_support_epsilon(powers: object, rounds: int) -> float:
    """Epsilon of ``rounds`` compositions of a pessimistic PMF over its whole support."""
    import numpy as np
    from dp_accounting.pld import pld_pmf
    from scipy import fft

    from shuffle_opacus.analysis.pld.powers import epsilon_for_delta

    probs = powers.probs  # type: ignore[attr-defined]
    width = (probs.size - 1) * rounds + 1
    length = fft.next_fast_len(width, real=True)
    spectrum = fft.rfft(probs, length)
    result = np.ones_like(spectrum)
    count = rounds
    while count:
        if count & 1:
            result = result * spectrum
        count >>= 1
        if count:
            spectrum = spectrum * spectrum
    composed = fft.irfft(result, length)[:width]
    infinity = -math.expm1(rounds * math.log1p(-powers.infinity))  # type: ignore[attr-defined]
    pmf = pld_pmf.DensePLDPmf(
        powers.discretization,  # type: ignore[attr-defined]
        powers.lower * rounds,  # type: ignore[attr-defined]
        composed,
        infinity,
        True,
    )
    return epsilon_for_delta(pmf, DELTA)


def check() -> None:
    """Print the windowed against the untruncated composition, and tight against central."""
    from shuffle_opacus.analysis.pld.powers import compose_powers, epsilon_for_delta
    from shuffle_opacus.analysis.pld.rounds import ShuffleRound, _upper, shuffle_rounds_epsilon
    from shuffle_opacus.analysis.pld.shuffle_gaussian import pld_discretization, pld_tail

    sigma = NOISE_MULTIPLIER / 2.0
    n, rate = 10**7, 0.01
    tail = pld_tail(DELTA, ROUNDS)
    powers = _upper(
        ShuffleRound(n=n, sigma=sigma, rate=rate),
        pld_discretization(n=n, sigma=sigma, rate=rate),
        tail,
    )
    start = time.perf_counter()
    windowed = compose_powers([(powers, ROUNDS)])
    eps_windowed = epsilon_for_delta(windowed, DELTA)
    t_windowed = time.perf_counter() - start
    start = time.perf_counter()
    eps_full = _full_support_epsilon(powers, ROUNDS)
    t_full = time.perf_counter() - start
    print(
        f"n=1e7: windowed {eps_windowed!r} ({windowed._probs.size} points, {t_windowed:.2f} s); "
        f"whole support {eps_full!r} ({(powers.size - 1) * ROUNDS + 1} points, {t_full:.2f} s); "
        f"difference {eps_windowed - eps_full:.3g}"
    )
    print("| n | rate | tight | lower | central (upper) | central (lower) | tight / central |")
    print("|---|---|---|---|---|---|---|")
    for n, rate in ((10**5, 0.01), (10**6, 0.01), (10**7, 0.01), (10**8, 1e-3), (10**9, 1e-4)):
        est = shuffle_rounds_epsilon(
            [(ShuffleRound(n=n, sigma=sigma, rate=rate), ROUNDS)], delta=DELTA, lower=True
        )
        central = central_epsilon(n, rate, NOISE_MULTIPLIER, ROUNDS)
        central_low = central_epsilon(n, rate, NOISE_MULTIPLIER, ROUNDS, pessimistic=False)
        ratio = est.epsilon / central if central > 0 else math.nan
        print(
            f"| {n:.0e} | {rate:g} | {est.epsilon:.6g} | {est.epsilon_lower:.6g} | "
            f"{central:.6g} | {central_low:.6g} | {ratio:.4f} |",
            flush=True,
        )


_FIGURE_POINT = """
import json, time
from shuffle_opacus.analysis.pld.rounds import ShuffleRound, shuffle_rounds_epsilon
start = time.perf_counter()
est = shuffle_rounds_epsilon([(ShuffleRound(n={n}, sigma={sigma}, rate={rate}), {rounds})],
                             delta={delta}, lower=True)
print(json.dumps({{"epsilon": est.epsilon, "lower": est.epsilon_lower,
                   "seconds": time.perf_counter() - start}}))
"""


def figure(path: Path, cohort: int = 1000) -> None:
    """Plot epsilon and time against n at a fixed cohort, with the central floor beside it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = [10**k for k in range(3, 10)]
    points = []
    for n in sizes:
        rate = min(1.0, cohort / n)
        code = _FIGURE_POINT.format(
            n=n, sigma=NOISE_MULTIPLIER / 2.0, rate=rate, rounds=ROUNDS, delta=DELTA
        )
        result = measure([sys.executable, "-c", code])
        record = json.loads(str(result["stdout"]).strip().splitlines()[-1])
        central = central_epsilon(n, rate, NOISE_MULTIPLIER, ROUNDS)
        points.append((n, rate, record, result, central))
        print(
            f"| {n:.0e} | {rate:g} | {record['epsilon']:.6g} | {record['lower']:.6g} | "
            f"{central:.6g} | {record['seconds']:.2f} s | {result['peak_gb']:.2f} GB | "
            f"load {result['load']:.1f} |",
            flush=True,
        )
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    floor = 1e-6  # epsilon 0 (the composed total variation is below delta) is drawn here
    for values, style, label in (
        ([p[2]["epsilon"] for p in points], "o-", "shuffled check-in (tight)"),
        ([p[4] for p in points], "s--", "central floor (trusted server)"),
    ):
        shown = [v if v > 0 else math.nan for v in values]  # a line breaks at each zero
        line = left.loglog(sizes, shown, style, label=label)[0]
        zeros = [n for n, v in zip(sizes, values, strict=True) if v <= 0]
        if zeros:
            left.plot(zeros, [floor] * len(zeros), "v", color=line.get_color())
    left.axhline(floor, color="grey", lw=0.5)
    left.text(sizes[0], floor * 1.3, "epsilon = 0 (markers on this line)", fontsize=7)
    left.set_xlabel("population n")
    left.set_ylabel(f"epsilon at delta = {DELTA:g}")
    left.set_title(
        f"noise multiplier {NOISE_MULTIPLIER:g} per client, {cohort} clients per round, "
        f"{ROUNDS} rounds",
        fontsize=8,
    )
    left.legend(fontsize=8)
    right.semilogx(sizes, [p[2]["seconds"] for p in points], "o-", label="time (s)")
    right.semilogx(sizes, [float(p[3]["peak_gb"]) for p in points], "s--", label="peak memory (GB)")
    right.set_xlabel("population n")
    right.set_ylim(bottom=0)
    right.set_title("tight method with its lower end, one process each", fontsize=8)
    right.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"wrote {path}")


def main(argv: Sequence[str] | None = None) -> None:
    """Parse the subcommand and run it."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=["table", "extras", "check", "figure"])
    parser.add_argument("path", nargs="?", default="docs/scale.png")
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args(argv)
    print(f"load average {os.getloadavg()}, {os.cpu_count()} cores")
    if args.what == "table":
        table(args.repeats)
    elif args.what == "extras":
        extras(args.repeats)
    elif args.what == "check":
        check()
    else:
        figure(ROOT / args.path)


if __name__ == "__main__":
    main()
