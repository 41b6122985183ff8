"""The proven bound against the tight one at the shipped settings (issue 40): a table, not a test.

    .venv/bin/python benchmarks/proven.py            # five settings, a few minutes
    .venv/bin/python benchmarks/proven.py --only paper

For each setting: the tight epsilon (``pld``, resting on Theorem 1's pair), the proven one
(``proven``: route, level and how delta splits between the privacy loss distribution and the
stand-ins), their ratio, the earlier proven route (``clones-gaussian``: the clones bound composed
round by round in approximate DP) and the time of the proven answer from a cold start (the
level search included), measured in a fresh process so that no cache helps it.

    .venv/bin/python benchmarks/proven.py --every-round 5540

asks both methods after every round 1..R of the paper setting, interleaved in one process (as an
accountant reporting every round does), and prints each one's total and slowest answer, with the
on-disk cache off (the computation alone). With ``--cache disk`` both methods use the on-disk
cache as a user's accountant does: a fresh process on an empty cache directory (``cold``, a first
run), then another on the directory it filled (``warm``, a rerun or a resumed run).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

# Time the computation, not the on-disk PMF cache (docs/accounting.md), unless asked to.
os.environ.setdefault("SHUFFLE_OPACUS_CACHE_DIR", "off")

SETTINGS: dict[str, dict[str, float | int]] = {
    # name: check-in population, rate, analysis sigma (noise multiplier / 2), rounds
    "paper": {"n": 60000, "rate": 0.1, "sigma": 2.5, "steps": 5540},
    "quick.yaml": {"n": 60000, "rate": 0.05, "sigma": 0.5, "steps": 1400},
    "users.yaml": {"n": 6000, "rate": 0.1, "sigma": 0.7965, "steps": 1000},
    "README Opacus": {"n": 1000, "rate": 0.05, "sigma": 2.0, "steps": 50},
    "README user-level": {"n": 300, "rate": 0.1, "sigma": 1.0, "steps": 40},
}
DELTA = 1e-5


def _one(name: str) -> dict[str, object]:
    """Run in a child process: one setting, cold."""
    from shuffle_opacus.analysis import account
    from shuffle_opacus.analysis.epsilon import compute_epsilon

    s = SETTINGS[name]
    kw = {"sigma": s["sigma"], "n": s["n"], "rate": s["rate"], "steps": s["steps"]}
    start = time.perf_counter()
    proven = compute_epsilon("checkin", delta=DELTA, method="proven", **kw)  # type: ignore[arg-type]
    seconds = time.perf_counter() - start
    tight = compute_epsilon("checkin", delta=DELTA, **kw)  # type: ignore[arg-type]
    old = account(
        "clones-gaussian",
        {"n": s["n"], "sigma": s["sigma"], "rate": s["rate"]},
        steps=[int(s["steps"])],
        delta=DELTA,
        max_seconds=None,
    )[0]
    return {
        "setting": name,
        **s,
        "tight": tight.epsilon,
        "tight_lower": tight.epsilon_lower,
        "proven": proven.epsilon,
        "details": proven.extra,
        "old_proven": old.epsilon,
        "proven_seconds": seconds,
    }


def _every_round(rounds: int) -> None:
    """Ask ``pld`` and ``proven`` after every round of the paper setting, interleaved."""
    from shuffle_opacus.analysis.pld.proven import proven_rounds_epsilon
    from shuffle_opacus.analysis.pld.rounds import ShuffleRound, shuffle_rounds_epsilon

    paper = SETTINGS["paper"]
    setting = ShuffleRound(
        n=int(paper["n"]), sigma=float(paper["sigma"]), rate=float(paper["rate"])
    )
    methods = {"pld": shuffle_rounds_epsilon, "proven": proven_rounds_epsilon}
    total = dict.fromkeys(methods, 0.0)
    slowest = dict.fromkeys(methods, 0.0)
    load = os.getloadavg()[0]
    for r in range(1, rounds + 1):
        for name, fn in methods.items():
            start = time.perf_counter()
            fn([(setting, r)], delta=1e-5)
            took = time.perf_counter() - start
            total[name] += took
            slowest[name] = max(slowest[name], took)
        if r % 500 == 0:
            print(f"[every-round] {r}/{rounds}", file=sys.stderr, flush=True)
    print(f"load average: {load:.2f} at the start, {os.getloadavg()[0]:.2f} at the end (2 cores)")
    print("| method | total over rounds 1..R | slowest answer | mean per round |")
    print("|---|---|---|---|")
    for name in methods:
        print(
            f"| {name} | {total[name]:.1f} s | {slowest[name]:.2f} s | "
            f"{1e3 * total[name] / rounds:.1f} ms |"
        )
    print(f"proven/pld total: {total['proven'] / total['pld']:.2f} (R = {rounds})")


def _every_round_cached(rounds: int) -> None:
    """Run :func:`_every_round` in a fresh process on an empty cache, then on the filled one."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="proven-bench-") as directory:
        for state in ("cold", "warm"):
            print(f"\n## cache {state} ({directory})", flush=True)
            command = [sys.executable, __file__, "--every-round", str(rounds)]
            subprocess.run([*command, "--cache-dir", directory], check=True)


def main() -> None:
    """Print one JSON line per setting, then a table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", choices=list(SETTINGS), default=list(SETTINGS))
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument(
        "--every-round", type=int, metavar="R", help="time both methods asked after every round"
    )
    parser.add_argument(
        "--cache",
        choices=("off", "disk"),
        default="off",
        help="--every-round with the on-disk cache off, or on (cold, then warm)",
    )
    parser.add_argument("--cache-dir", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.every_round is not None:
        if args.every_round < 1:
            parser.error(f"--every-round must be an integer >= 1. Found {args.every_round}.")
        if args.cache_dir:
            os.environ["SHUFFLE_OPACUS_CACHE_DIR"] = args.cache_dir
            _every_round(args.every_round)
        elif args.cache == "disk":
            _every_round_cached(args.every_round)
        else:
            _every_round(args.every_round)
        return
    if args.child:
        print(json.dumps(_one(args.child)))
        return
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "OPENBLAS_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
    }
    rows = []
    for name in args.only:
        print(f"[proven] {name} ...", file=sys.stderr, flush=True)
        out = subprocess.run(
            [sys.executable, __file__, "--child", name], capture_output=True, text=True, env=env
        )
        if out.returncode:
            print(out.stderr, file=sys.stderr)
            continue
        row = json.loads(out.stdout.strip().splitlines()[-1])
        rows.append(row)
        print(json.dumps(row), flush=True)
    load = os.getloadavg()[0]
    print(f"\nload average at the end: {load:.2f} (2 cores)")
    print(
        "| setting | tight (pld) | proven | proven/tight | route | old proven (clones-gaussian) "
        "| delta: PLD + stand-ins | proven time (cold) |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        d = r["details"]
        lev = d.get("eps0") or d.get("blanket_weight")
        route = d["route"] + (f" ({'eps0' if 'eps0' in d else 'p'} = {lev:.3g})" if lev else "")
        print(
            f"| {r['setting']} | {r['tight']:.4g} | {r['proven']:.4g} | "
            f"{r['proven'] / r['tight']:.3g} | {route} | {r['old_proven']:.4g} | "
            f"{d['delta_pld']:.2g} + {d.get('delta_coupling', 0.0):.2g} | "
            f"{r['proven_seconds']:.1f} s |"
        )


if __name__ == "__main__":
    main()
