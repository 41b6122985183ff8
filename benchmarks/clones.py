"""The clones bound against Apple's reference code, as whole processes (not a test).

    .venv/bin/python benchmarks/clones.py --apple DIR [--n 100000 1000000] [--json PATH]

``DIR`` holds ``computeamplification.py`` of Apple's ``ml-shuffling-amplification`` (the code
of Feldman, McMillan & Talwar, *Hiding Among the Clones*, arXiv:2012.12803; not shipped here,
it has its own licence). Without it the script says so and stops.

For each n (ε0 = 4, δ = 1e-6, the setting of Apple's ``example.py``) every contender is a fresh
process, run **interleaved** by ``benchmarks/timing.py`` (round ``r`` runs every command once,
in alternating order), pinned with this process to one CPU, one thread; the load of other
processes is recorded and the result flagged busy when they used more than a tenth of a core:

* ``Apple, example.py's bounds``: ``numericalanalysis(n, 4, 1e-6, 10, 100, True)`` and the
  same with ``False``, the upper and lower bound ``example.py`` prints (its defaults: 10
  bisection steps, step 100);
* ``ours, shuffle-opacus account clones``: the command, which prints the certified upper and
  lower ε (within 1e-6 of each other);
* ``ours, clones_epsilon in python -c``: the library call without the command's parsing;
* ``floor: python -c "import numpy, scipy.stats"``: what both import before computing.

Before timing, each contender runs once with its output shown, so that the table compares
answers to the same question. Goal: ours ahead of Apple's at n = 10^5, as a whole process.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path
from typing import Any

from timing import compare_commands, per_core, thread_env, write_json

BIN = Path(sys.executable).parent
CLI = str(BIN / "shuffle-opacus")
EPS0, DELTA = 4, 1e-6
APPLE = "Apple, example.py's bounds"
OURS = "ours, shuffle-opacus account clones"


def commands(n: int, apple: Path) -> dict[str, list[str]]:
    apple_code = (
        f"import sys; sys.path.insert(0, {str(apple)!r}); import computeamplification as CA; "
        f"up = CA.numericalanalysis({n}, {EPS0}, {DELTA}, 10, 100, True); "
        f"low = CA.numericalanalysis({n}, {EPS0}, {DELTA}, 10, 100, False); "
        "print('upper', up, 'lower', low)"
    )
    ours_code = (
        "from shuffle_opacus.analysis import clones_epsilon; "
        f"r = clones_epsilon(n={n}, eps0={EPS0}, delta={DELTA}); print('upper', r.upper, "
        "'lower', r.lower)"
    )
    return {
        APPLE: [sys.executable, "-c", apple_code],
        OURS: [CLI, "account", "clones", "--n", str(n), "--eps0", str(EPS0), "--delta",
               str(DELTA)],
        "ours, clones_epsilon in python -c": [sys.executable, "-c", ours_code],
        'floor: python -c "import numpy, scipy.stats"': [
            sys.executable, "-c", "import numpy, scipy.stats",
        ],
    }  # fmt: skip


def main() -> None:
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
    per_core(1)
    env = thread_env(1)
    results: list[dict[str, Any]] = []
    for i, n in enumerate(args.n):
        argvs = commands(n, args.apple.resolve())
        answers = {}
        for name, argv in argvs.items():
            done = subprocess.run(argv, env=env, capture_output=True, text=True, check=True)
            lines = done.stdout.strip().splitlines() or [""]
            # The command prints a table: its row; the others print one line.
            answers[name] = next((x for x in lines if x.startswith(("upper", "clones"))), lines[-1])
        rounds = args.repeats[min(i, len(args.repeats) - 1)]
        result = compare_commands(
            argvs,
            rounds=rounds,
            warmup=0,
            env=env,
            baseline=APPLE,
            title=f"clones bound, n = {n:,}, eps0 = {EPS0}, delta = {DELTA:g} (whole processes)",
            probe_s=args.probe,
            wait_quiet_s=args.wait_quiet,
        )
        result["n"] = n
        result["answers"] = answers
        for name, text in answers.items():
            print(f"{name}: {text}")
        ratio = result["ratios"][OURS]
        verdict = "ahead" if ratio["median"] < 1 else "behind"
        print(
            f"n = {n:,}: ours / Apple's = {ratio['median']:.2f}x (medians), {ratio['min']:.2f}x "
            f"(minimums), per round {ratio['per_round']['min']:.2f}-"
            f"{ratio['per_round']['max']:.2f}: ours {verdict}"
        )
        if result["busy"]:
            print("BUSY: " + "; ".join(result["busy_reasons"]))
        results.append(result)
    if args.json is not None:
        write_json(args.json, {"eps0": EPS0, "delta": DELTA, "results": results})


if __name__ == "__main__":
    main()
