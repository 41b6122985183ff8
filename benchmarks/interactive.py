"""Interactive speed of ``shuffle-opacus account`` and ``calibrate`` (issue 42 part 6): tables.

    .venv/bin/python benchmarks/interactive.py [--before DIR] [--method pld] [--repeats 3]
        [--query NAME ...] [--json PATH]
    .venv/bin/python benchmarks/interactive.py --breakdown [--before DIR]

The everyday queries of README.md and docs/accounting.md: ``account shuffle --n 1000 --sigma 1
--steps 10`` (benchmarks/startup.py's), ``account checkin`` over 5,540 rounds (``--sigma 5``),
the paper setting (``--noise-multiplier 5``, both rows: ``pld`` and ``proven``) and ``calibrate``
at the paper setting. Each runs in a fresh process (one thread), interleaved round by round by
:func:`timing.compare_commands` with the load recorded:

* ``cold``: the on-disk cache (:mod:`shuffle_opacus.analysis.pld.disk_cache`) emptied just
  before the process starts, as on a first query;
* ``warm``: the cache filled by one run before the timed rounds, as on a query asked again;
* ``before``: with ``--before DIR``, the package at ``DIR`` (``git archive COMMIT
  shuffle_opacus | tar -x -C DIR``), put first on ``PYTHONPATH``;
* ``--version``: start-up (import and argument parsing), the baseline.

``--method M`` adds ``--method M`` to the ``account`` queries (``pld``: the tight row alone).
``--query NAME`` (repeatable) times only the queries named, e.g. ``--query "calibrate paper"``.
``--breakdown`` runs each query once per state under ``python -X importtime`` and splits the
time after start-up into the imports it made on the way (``dp_accounting``, scipy's modules)
and the work, for the default rows and for ``--method pld`` and ``--method proven`` alone.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from timing import compare_commands, per_core, thread_env, write_json

LAUNCH = "import sys; from shuffle_opacus.cli.command import main; sys.exit(main(sys.argv[1:]))"
QUERIES = {
    "shuffle n=1000": ["account", "shuffle", "--n", "1000", "--sigma", "1", "--steps", "10"],
    "checkin sigma 5": ["account", "checkin", "--n", "60000", "--rate", "0.1", "--sigma", "5",
                        "--steps", "5540"],
    "paper": ["account", "checkin", "--n", "60000", "--rate", "0.1", "--noise-multiplier", "5",
              "--steps", "5540"],
    "calibrate paper": ["calibrate", "checkin", "--n", "60000", "--rate", "0.1", "--rounds",
                        "5540", "--epsilon", "1"],
}  # fmt: skip
VERSION = ["--version"]


def _command(state: str, argv: list[str], cache: Path, before: Path | None) -> list[str]:
    """The argument vector of one query in one state (see the module docstring)."""
    python = [sys.executable, "-P", "-c", LAUNCH, *argv]  # -P: not the current folder first
    if state == "before":
        assert before is not None
        return ["env", f"PYTHONPATH={before}", "SHUFFLE_OPACUS_CACHE_DIR=off", *python]
    if state == "cold":
        return ["sh", "-c", 'rm -rf "$0" && SHUFFLE_OPACUS_CACHE_DIR="$0" exec "$@"',
                str(cache), *python]  # fmt: skip
    return ["env", f"SHUFFLE_OPACUS_CACHE_DIR={cache}", *python]


def _states(before: Path | None) -> list[str]:
    return (["before"] if before is not None else []) + ["cold", "warm"]


def _fill(argv: list[str], cache: Path) -> None:
    subprocess.run(_command("warm", argv, cache, None), env=thread_env(1), check=True,
                   stdout=subprocess.DEVNULL)  # fmt: skip


def _queries(method: str | None) -> dict[str, list[str]]:
    if method is None:
        return QUERIES
    return {
        (f"{name} --method {method}" if argv[0] == "account" else name): (
            [*argv, "--method", method] if argv[0] == "account" else argv
        )
        for name, argv in QUERIES.items()
    }


def timed(args: argparse.Namespace, work: Path) -> dict[str, object]:
    """Interleaved whole-process times of every query in every state."""
    queries = _queries(args.method)
    if args.query:
        queries = {name: argv for name, argv in queries.items() if name in args.query}
    commands: dict[str, list[str]] = {}
    for state in _states(args.before):
        if state != "cold":
            commands[f"--version ({state})"] = _command(
                state, VERSION, work / "version", args.before
            )
        for name, argv in queries.items():
            cache = work / f"{state}-{name.replace(' ', '_')}"
            if state == "warm":
                _fill(argv, cache)
            commands[f"{name} ({state})"] = _command(state, argv, cache, args.before)
    result = compare_commands(
        commands,
        rounds=args.repeats,
        warmup=0,
        env=thread_env(1),
        baseline="--version (warm)",
        title="shuffle-opacus account and calibrate, whole processes",
        probe_s=args.probe,
    )
    medians = {name: entry["median"] for name, entry in result["contenders"].items()}
    print("\n| query | state | median s | beyond start-up s |")
    print("|---|---|---:|---:|")
    for state in _states(args.before):
        start = medians[f"--version ({'before' if state == 'before' else 'warm'})"]
        for name in queries:
            total = medians[f"{name} ({state})"]
            print(f"| {name} | {state} | {total:.2f} | {total - start:.2f} |")
    return result


_IMPORT = re.compile(r"^import time:\s+(\d+) \|\s+(\d+) \| ( *)(\S+)")
BREAKDOWN = """
import sys, time
start = time.perf_counter()
from shuffle_opacus.cli.command import main
import contextlib, io
ready = time.perf_counter()
print("#startup-done", file=sys.stderr, flush=True)
with contextlib.redirect_stdout(io.StringIO()):
    status = main(sys.argv[1:])
done = time.perf_counter()
print(f"#times {ready - start!r} {done - ready!r} {status}", file=sys.stderr, flush=True)
"""


def _breakdown_one(argv: list[str], state: str, cache: Path, before: Path | None) -> str:
    command = _command(state, argv, cache, before)
    python = command.index(sys.executable)
    command[python + 1 : python + 4] = ["-P", "-X", "importtime", "-c", BREAKDOWN]
    out = subprocess.run(command, env=thread_env(1), capture_output=True, text=True, check=True)
    after_start, lazy, heavy = False, 0.0, []
    startup = main = float("nan")
    for line in out.stderr.splitlines():
        if line.startswith("#startup-done"):
            after_start = True
        elif line.startswith("#times"):
            _, startup_s, main_s, _ = line.split()
            startup, main = float(startup_s), float(main_s)
        elif after_start and (match := _IMPORT.match(line)) and not match.group(3):
            seconds = int(match.group(2)) / 1e6  # a top-level import's cumulative time
            lazy += seconds
            if seconds > 0.05:
                heavy.append(f"{match.group(4)} {seconds:.2f}")
    return (f"| {startup:.2f} | {main:.2f} | {lazy:.2f} | {main - lazy:.2f} | "
            f"{', '.join(heavy)} |")  # fmt: skip


def breakdown(args: argparse.Namespace, work: Path) -> None:
    """One process per query and state: start-up, then the imports on the way and the work."""
    print("| query | state | start-up s | after start-up s | its imports s | work s | "
          "imports over 0.05 s |")  # fmt: skip
    print("|---|---|---:|---:|---:|---:|---|")
    for name, argv in QUERIES.items():
        variants = {"": argv}
        if argv[0] == "account":
            variants.update({" --method pld": [*argv, "--method", "pld"],
                             " --method proven": [*argv, "--method", "proven"]})  # fmt: skip
        for suffix, command in variants.items():
            for state in _states(args.before):
                cache = work / f"breakdown-{len(list(work.iterdir()))}"
                if state == "warm":
                    _fill(command, cache)
                row = _breakdown_one(command, state, cache, args.before)
                print(f"| {name}{suffix} | {state} {row}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=Path, help="a tree holding an older shuffle_opacus")
    parser.add_argument("--method", help="add --method METHOD to the account queries")
    parser.add_argument("--repeats", type=int, default=3, help="timed rounds (default 3)")
    parser.add_argument("--probe", type=float, default=1.0, help="seconds of each load probe")
    parser.add_argument("--breakdown", action="store_true", help="imports and work, -X importtime")
    parser.add_argument("--no-pin", action="store_true", help="do not pin to one CPU")
    parser.add_argument("--json", type=Path, help="also write the timed record to this file")
    parser.add_argument("--query", action="append", choices=list(QUERIES),
                        help="time only this query (repeatable; default: all)")  # fmt: skip
    args = parser.parse_args()
    if args.before is not None and not (args.before / "shuffle_opacus").is_dir():
        parser.error(f"--before must hold a shuffle_opacus folder. Found {str(args.before)!r}.")
    per_core(1, pin=not args.no_pin)
    work = Path(tempfile.mkdtemp(prefix="interactive-"))
    started = time.time()
    try:
        if args.breakdown:
            breakdown(args, work)
        else:
            result = timed(args, work)
            if args.json is not None:
                write_json(args.json, result)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"\n{time.time() - started:.0f} s in all", file=sys.stderr)


if __name__ == "__main__":
    main()
