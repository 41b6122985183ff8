"""The clones bound against Apple's reference code, equal work, as whole processes (not a test).

    .venv/bin/python benchmarks/clones.py --apple DIR [--n 100000 1000000] [--json PATH]

``DIR`` holds ``computeamplification.py`` of Apple's ``ml-shuffling-amplification`` (the code
of Feldman, McMillan & Talwar, *Hiding Among the Clones*, arXiv:2012.12803; not shipped here,
it has its own licence). Without it the script says so and stops.

Apple's ``example.py`` calls its solver twice, once for an upper and once for a lower bound on
epsilon; ``clones_epsilon`` returns both bounds from one call (two bisections). So the work is
matched two ways, and each is timed and reported:

* **one bound each**: ``numericalanalysis(n, 4, 1e-6, 10, 100, True)`` (Apple's upper bound,
  its defaults: 10 bisection steps, step 100) against ours' upper bound alone, the first of
  ``clones_epsilon``'s two bisections written out (on ``clones_delta(...).upper``, to 1e-6);
* **both bounds on both sides**: Apple's upper and lower bound (``example.py``) against
  ``clones_epsilon`` (upper and lower) in ``python -c``, and against the command
  ``shuffle-opacus account clones``, which prints the same two bounds.

The answers differ in accuracy, and the script says by how much: ours' two bounds lie within
the bisection tolerance (1e-6) of each other; Apple's lie about 3% apart (its grid of step 100
and its 10 bisection steps). ``python -c "import numpy, scipy.stats"``, what Apple's code
imports, is timed as a floor.

For each n (eps0 = 4, delta = 1e-6, the setting of Apple's ``example.py``) every contender is
a fresh process, run **interleaved** by ``benchmarks/timing.py`` (round ``r`` runs every
command once, in alternating order), pinned with this process to one CPU, one thread. Each
ratio is ours' time over Apple's: the median of the per-round ratios (the two processes of a
round ran next to each other), with their min-max and the ratio of the medians. Before timing,
each contender runs once with its answer shown, so that the table compares answers to the same
question.

Load: as in ``benchmarks/training.py``, the run is **busy** and gets no verdict ("busy: no
verdict") when the 1-minute load average is above 0.5 before it or above 0.5 + 1 (its own
process) after it, or when ``timing.compare`` flags a comparison (other processes used more
than a tenth of a core). The load averages are printed beside the ratios. Goal: ours ahead of
Apple's at n = 10^5 for equal work, as a whole process.
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

from timing import compare_commands, per_core, thread_env, write_json
from training import beside, load_verdict, loadavg, spread

BIN = Path(sys.executable).parent
CLI = str(BIN / "shuffle-opacus")
EPS0, DELTA, TOL = 4, 1e-6, 1e-6
APPLE_UPPER = "Apple, upper bound only"
APPLE_BOTH = "Apple, both bounds (example.py)"
OURS_UPPER = "ours, upper bound only"
OURS_BOTH = "ours, both bounds (clones_epsilon)"
OURS_CLI = "ours, both bounds (shuffle-opacus account clones)"
FLOOR = 'floor: python -c "import numpy, scipy.stats"'
#: (ours, Apple's, what is compared): the equal-work pairs.
PAIRS = (
    (OURS_UPPER, APPLE_UPPER, "one bound each"),
    (OURS_BOTH, APPLE_BOTH, "both bounds on both sides"),
    (OURS_CLI, APPLE_BOTH, "both bounds on both sides, our command"),
)


def commands(n: int, apple: Path) -> dict[str, list[str]]:
    """The contenders at ``n``: name -> argument vector; each prints ``upper U [lower L]``."""
    apple_head = (
        f"import sys; sys.path.insert(0, {str(apple)!r}); import computeamplification as CA; "
    )
    upper = f"CA.numericalanalysis({n}, {EPS0}, {DELTA}, 10, 100, True)"
    lower = f"CA.numericalanalysis({n}, {EPS0}, {DELTA}, 10, 100, False)"
    both = f"print('upper', {upper}, 'lower', {lower})"
    # The first bisection of clones_epsilon (its upper bound), on its own.
    ours_upper = (
        "from shuffle_opacus.analysis.approximate.clones import clones_delta\n"
        f"lo, hi = 0.0, float({EPS0})\n"
        f"while hi - lo > {TOL}:\n"
        "    mid = 0.5 * (lo + hi)\n"
        f"    if clones_delta(mid, n={n}, eps0={EPS0}).upper <= {DELTA}:\n"
        "        hi = mid\n"
        "    else:\n"
        "        lo = mid\n"
        "print('upper', hi)\n"
    )
    ours_both = (
        "from shuffle_opacus.analysis.approximate.clones import clones_epsilon; "
        f"r = clones_epsilon(n={n}, eps0={EPS0}, delta={DELTA}, tol={TOL}); "
        "print('upper', r.upper, 'lower', r.lower)"
    )
    return {
        APPLE_UPPER: [sys.executable, "-c", apple_head + f"print('upper', {upper})"],
        APPLE_BOTH: [sys.executable, "-c", apple_head + both],
        OURS_UPPER: [sys.executable, "-c", ours_upper],
        OURS_BOTH: [sys.executable, "-c", ours_both],
        OURS_CLI: [CLI, "account", "clones", "--n", str(n), "--eps0", str(EPS0), "--delta",
                   str(DELTA)],
        FLOOR: [sys.executable, "-c", "import numpy, scipy.stats"],
    }  # fmt: skip


def parse_bounds(text: str) -> dict[str, float]:
    """``{"upper": U, "lower": L}`` (those present) from a line ``upper U lower L``."""
    return {k: float(v) for k, v in re.findall(r"(upper|lower) (\S+)", text)}


def accuracy(answers: dict[str, dict[str, float]]) -> list[str]:
    """Lines stating how far apart each side's bounds are, and how their upper bounds differ."""
    apple, ours = answers.get(APPLE_BOTH, {}), answers.get(OURS_BOTH, {})
    lines = []
    for who, b, how in (
        ("ours", ours, f"bisection to {TOL:g}"),
        ("Apple's", apple, "10 bisection steps, step 100"),
    ):
        if "upper" in b and "lower" in b:
            gap = b["upper"] - b["lower"]
            rel = gap / b["lower"] if b["lower"] > 0 else float("inf")
            lines.append(
                f"{who} bounds: [{b['lower']:.6f}, {b['upper']:.6f}], {gap:.2e} apart "
                f"({rel * 100:.3g}% of the lower bound; {how})"
            )
    alone = answers.get(OURS_UPPER, {}).get("upper")
    if alone is not None and "upper" in ours and alone != ours["upper"]:
        lines.append(
            f"warning: ours' upper bound alone {alone!r} != clones_epsilon's {ours['upper']!r}"
        )
    if "upper" in ours and "upper" in apple:
        lines.append(
            f"Apple's upper bound is {apple['upper'] / ours['upper'] - 1:.2%} above ours "
            "(both are valid upper bounds; the smaller is the tighter)"
        )
    return lines


def ratios(result: dict[str, Any]) -> list[dict[str, Any]]:
    """Ours / Apple's time for each pair of :data:`PAIRS`: per round and of the medians."""
    table = result["contenders"]
    out = []
    for ours, apple, what in PAIRS:
        a, b = table[ours]["seconds"], table[apple]["seconds"]
        per_round = [p / q for p, q in zip(a, b, strict=True)]
        out.append({"work": what, "ours": ours, "apple": apple, "per_round": spread(per_round),
                    "of_medians": statistics.median(a) / statistics.median(b)})  # fmt: skip
    return out


def main() -> None:
    """Parse the options, check Apple's code is there, time every n, print the ratios."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--apple", type=Path, required=True, help="folder of Apple's code")
    parser.add_argument("--n", type=int, nargs="+", default=[100_000, 1_000_000])
    parser.add_argument(
        "--repeats", type=int, nargs="+", default=[8, 2], help="timed rounds for each n"
    )
    parser.add_argument("--probe", type=float, default=1.0, help="seconds of each load probe")
    parser.add_argument(
        "--wait-quiet", type=float, default=0.0, help="wait up to this long for a quiet machine"
    )
    parser.add_argument("--json", type=Path, help="also write the results to this file")
    parser.add_argument("--quick", action="store_true", help="n = 10^5 only, 2 rounds")
    args = parser.parse_args()
    if not (args.apple / "computeamplification.py").exists():
        sys.exit(f"{args.apple}/computeamplification.py not found: --apple names a checkout "
                 "of apple/ml-shuffling-amplification")  # fmt: skip
    if args.quick:
        args.n, args.repeats, args.probe = [100_000], [2], 0.3
    before = loadavg()
    per_core(1)
    env = thread_env(1)
    results: list[dict[str, Any]] = []
    for i, n in enumerate(args.n):
        argvs = commands(n, args.apple.resolve())
        answers: dict[str, dict[str, float]] = {}
        texts: dict[str, str] = {}
        for name, argv in argvs.items():
            done = subprocess.run(argv, env=env, capture_output=True, text=True, check=True)
            lines = done.stdout.strip().splitlines() or [""]
            # The command prints a table: its row; the others print one line.
            found = next((x for x in lines if x.startswith(("upper", "clones"))), lines[-1])
            texts[name] = found or "(no output)"
            answers[name] = parse_bounds(texts[name])
        rounds = args.repeats[min(i, len(args.repeats) - 1)]
        result = compare_commands(
            argvs,
            rounds=rounds,
            warmup=0,
            env=env,
            baseline=APPLE_BOTH,
            title=f"clones bound, n = {n:,}, eps0 = {EPS0}, delta = {DELTA:g} (whole processes)",
            probe_s=args.probe,
            wait_quiet_s=args.wait_quiet,
        )
        result.update(n=n, answers=texts, accuracy=accuracy(answers), equal_work=ratios(result))
        for name, text in texts.items():
            print(f"{name}: {text}")
        for line in result["accuracy"]:
            print(line)
        results.append(result)
    after = loadavg()
    flagged = [f"n = {r['n']:,}: {why}" for r in results for why in r["busy_reasons"]]
    busy = load_verdict(before, after, 1, flagged)
    shown = [f"{v:.2f}" if v is not None else "?" for v in (before, after)]
    print(f"\nload average (1 min): {shown[0]} before, {shown[1]} after (limit 0.5 before, "
          "0.5 + 1 own after)")  # fmt: skip
    for result in results:
        for line in result["equal_work"]:
            s = line["per_round"]
            shown = beside(s["median"], 1, scale=1, digits=3)
            text = (
                f"n = {result['n']:,}, {line['work']}: ours / Apple's = {shown}x "
                f"(median of {s['n']} rounds, min-max {s['min']:.3f}-{s['max']:.3f}; "
                f"of medians {line['of_medians']:.3f}x, {1 / line['of_medians']:.1f}x faster)"
            )
            if busy:
                print(f"{text}: busy: no verdict")
            else:
                print(f"{text}: ours {'ahead' if s['median'] < 1 else 'behind'}")
    if busy:
        print("busy: " + "; ".join(busy))
    if args.json is not None:
        payload = {"eps0": EPS0, "delta": DELTA, "loadavg": {"before": before, "after": after},
                   "busy": busy, "results": results}  # fmt: skip
        write_json(args.json, payload)


if __name__ == "__main__":
    main()
