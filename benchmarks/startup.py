"""Start-up time of the ``shuffle-opacus`` command: prints a table (not a test).

    .venv/bin/python benchmarks/startup.py [--repeats 15] [--json PATH] [--quick]

Each command runs in a fresh process, one thread, pinned with this process to one CPU; the
commands run **interleaved** by ``benchmarks/timing.py`` (round ``r`` runs every command once,
in alternating order, after one warm-up round), ``--repeats`` rounds. The table gives each
command's median, min and max wall time, its ratio to the floor (of medians, of minimums and
the range of per-round ratios) and the peak memory of one run; the load of other processes is
recorded and the result flagged busy when they used more than a tenth of a core.
``python -c "import numpy"`` is the floor: the maths layer cannot answer without numpy. A bad
argument is refused before any heavy import; the simple accountings import only
``scipy.special`` besides numpy, so ``python -c "import numpy, scipy.special"`` is their floor
with that import (a row of its own). Goal: ``account gaussian`` at most 2x the floor.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from timing import compare_commands, per_core, thread_env, write_json

# Time the computation, not the on-disk PMF cache (docs/accounting.md), unless asked to.
os.environ.setdefault("SHUFFLE_OPACUS_CACHE_DIR", "off")

BIN = Path(sys.executable).parent
CLI = str(BIN / "shuffle-opacus")
FLOOR = 'python -c "import numpy" (floor)'
GAUSSIAN = "account gaussian --sigma 1 --steps 10"
GOAL = 2.0

COMMANDS = {
    FLOOR: [sys.executable, "-c", "import numpy"],
    'python -c "import numpy, scipy.special"': [
        sys.executable, "-c", "import numpy, scipy.special",
    ],
    "shuffle-opacus --help": [CLI, "--help"],
    "bad argument (--n -3)": [CLI, "account", "shuffle", "--n", "-3", "--sigma", "1"],
    GAUSSIAN: [CLI, "account", "gaussian", "--sigma", "1", "--steps", "10"],
    "account shuffle --n 1000 --sigma 1 --steps 10": [
        CLI, "account", "shuffle", "--n", "1000", "--sigma", "1", "--steps", "10",
    ],
    "account checkin --n 60000 --rate 0.1 --sigma 5 --steps 5540": [
        CLI, "account", "checkin", "--n", "60000", "--rate", "0.1", "--sigma", "5",
        "--steps", "5540",
    ],
}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=15, help="timed rounds (default 15)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed rounds first")
    parser.add_argument("--no-pin", action="store_true", help="do not pin to one CPU")
    parser.add_argument("--probe", type=float, default=1.0, help="seconds of each load probe")
    parser.add_argument(
        "--wait-quiet", type=float, default=0.0, help="wait up to this long for a quiet machine"
    )
    parser.add_argument("--json", type=Path, help="also write the results to this file")
    parser.add_argument("--quick", action="store_true", help="3 rounds, short load probes")
    args = parser.parse_args()
    if args.quick:
        args.repeats, args.probe = 3, 0.3
    per_core(1, pin=not args.no_pin)
    result = compare_commands(
        COMMANDS,
        rounds=args.repeats,
        warmup=args.warmup,
        env=thread_env(1),
        baseline=FLOOR,
        title="start-up of the shuffle-opacus command (whole processes)",
        probe_s=args.probe,
        wait_quiet_s=args.wait_quiet,
    )
    print("\n| command | exit status | peak RSS (MiB) |")
    print("|---|---:|---:|")
    for name, entry in result["contenders"].items():
        print(f"| {name} | {entry['returncode']} | {entry['peak_rss_mib']:.0f} |")
    ratio = result["ratios"][GAUSSIAN]
    verdict = "met" if ratio["median"] <= GOAL else "not met"
    print(
        f"\ngoal: `{GAUSSIAN}` <= {GOAL:g}x the floor: {ratio['median']:.2f}x (medians), "
        f"{ratio['min']:.2f}x (minimums): {verdict}"
    )
    if result["busy"]:
        print("BUSY: " + "; ".join(result["busy_reasons"]))
    if args.json is not None:
        write_json(args.json, result)


if __name__ == "__main__":
    main()
