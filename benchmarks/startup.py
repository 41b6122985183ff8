"""Start-up time of the ``shuffle-opacus`` command: prints a table (not a test).

    .venv/bin/python benchmarks/startup.py [--repeats 15]

Each command runs in a fresh process, one thread, ``--repeats`` times; the table gives the
median wall time and the peak memory of one run. ``python -c "import numpy"`` is the floor: the
maths layer cannot answer without numpy. A bad argument is refused before any heavy import; the
simple accountings import only ``scipy.special`` besides numpy.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

BIN = Path(sys.executable).parent
CLI = str(BIN / "shuffle-opacus")

COMMANDS = {
    'python -c "import numpy" (floor)': [sys.executable, "-c", "import numpy"],
    "shuffle-opacus --help": [CLI, "--help"],
    "bad argument (--n -3)": [CLI, "account", "shuffle", "--n", "-3", "--sigma", "1"],
    "account gaussian --sigma 1 --steps 10": [
        CLI, "account", "gaussian", "--sigma", "1", "--steps", "10",
    ],
    "account shuffle --n 1000 --sigma 1 --steps 10": [
        CLI, "account", "shuffle", "--n", "1000", "--sigma", "1", "--steps", "10",
    ],
    "account checkin --n 60000 --rate 0.1 --sigma 5 --steps 5540": [
        CLI, "account", "checkin", "--n", "60000", "--rate", "0.1", "--sigma", "5",
        "--steps", "5540",
    ],
}  # fmt: skip


def measure(argv: list[str], repeats: int) -> tuple[float, float]:
    """Median seconds over ``repeats`` fresh runs and the children's peak RSS in MB."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        times.append(time.perf_counter() - start)
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    return statistics.median(times), peak


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()
    print("| command | median wall (s) | x floor |")
    print("|---|---|---|")
    floor = None
    for label, argv in COMMANDS.items():
        seconds, _ = measure(argv, args.repeats)
        floor = floor or seconds
        print(f"| {label} | {seconds:.3f} | {seconds / floor:.1f} |", flush=True)


if __name__ == "__main__":
    main()
