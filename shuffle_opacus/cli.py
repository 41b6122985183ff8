"""The ``shuffle-opacus`` command.

``shuffle-opacus account MECHANISM [options]`` prints epsilon for one or more step counts;
``shuffle-opacus calibrate PROTOCOL [options]`` prints the local noise multiplier that meets a
target (epsilon, delta). Both import only the maths layer, never torch, so they start quickly.
``shuffle-opacus train --config FILE`` runs the MNIST experiment of :mod:`experiments` and
``shuffle-opacus plot RUN_DIR`` redraws its figures; those two import torch and matplotlib only
when called. Errors are reported on one line (``shuffle-opacus: error: ...``) with exit status 2.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
import warnings
from collections.abc import Callable, Sequence
from typing import TypeVar

from .analysis._validation import check_delta, check_positive, check_probability
from .analysis.accounting import MECHANISMS, METHODS, AccountingResult, compute_epsilon
from .analysis.baselines import composed_epsilons
from .analysis.clones import (
    CLONES_METHODS,
    ClonesValidityWarning,
    clones_epsilon,
    closed_form_limit,
)
from .analysis.conversion import OrderCapWarning
from .analysis.pld import DEFAULT_TAIL, ldp_shuffle_pld, subsampled_ldp_shuffle_pld
from .protocols import (
    DEFAULT_METHODS,
    PROTOCOLS,
    calibrate_noise_multiplier,
    history_epsilon,
    protocol_sample_rate,
    resolve_sensitivity,
)

__all__ = ["main", "build_parser"]

PROG = "shuffle-opacus"
CLONES_MECHANISMS = ("clones", "clones-gaussian")
PLD_MECHANISMS = ("ldp-shuffle", "krr")
T = TypeVar("T")


class CliError(Exception):
    """A user error to be reported on one line."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise CliError(message)


def _typed(name: str, convert: Callable[[str, str], T]) -> Callable[[str], T]:
    """Wrap ``convert(label, text)`` as an argparse ``type`` that reports one-line errors."""

    def parse(text: str) -> T:
        try:
            return convert(name, text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    parse.__name__ = name
    return parse


def _int_arg(name: str, minimum: int = 1) -> Callable[[str], int]:
    def convert(label: str, text: str) -> int:
        try:
            value = float(text)
        except ValueError:
            value = float("nan")
        if not value.is_integer() or value < minimum:
            raise ValueError(f"{label} must be an integer >= {minimum}. Found {text!r}.")
        return int(value)

    return _typed(name, convert)


def _float_arg(name: str, checker: Callable[[str, object], float]) -> Callable[[str], float]:
    def convert(label: str, text: str) -> float:
        try:
            return checker(label, float(text))
        except ValueError as exc:
            # Report what the user typed, not the parsed float.
            head = str(exc).rsplit(" Found ", 1)[0]
            raise ValueError(f"{head} Found {text!r}.") from None

    return _typed(name, convert)


def build_parser() -> argparse.ArgumentParser:
    """Build the argument parser of the ``shuffle-opacus`` command."""
    parser = _Parser(prog=PROG, description="Shuffle-model differential privacy accounting.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    methods = sorted({m for ms in METHODS.values() for m in ms} | set(CLONES_METHODS))
    acc = sub.add_parser(
        "account",
        help="epsilon of a shuffle (or central reference) mechanism after some rounds",
        description=(
            "Epsilon after --steps rounds, from Rényi DP minimised over integer orders. "
            "For shuffle, subsampled and checkin, --sigma is the per-user noise std divided by "
            "the L2 distance of the differing user's two inputs; for gaussian and "
            "subsampled-gaussian it is the noise on the sum divided by its sensitivity. "
            "clones (--eps0) and clones-gaussian (--sigma: noise std over the diameter of the "
            "input domain) are the approximate-DP baselines of Feldman, McMillan & Talwar, "
            "composed over --steps with the optimal composition theorem. "
            "ldp-shuffle (--eps0; --m for a random subset of m of the --n users per round) and "
            "krr (--k, --gamma, --adversary) use privacy loss distributions (dp_accounting, "
            "pessimistic) of Koskela, Heikkilä & Honkela."
        ),
    )
    acc.add_argument(
        "mechanism",
        choices=MECHANISMS + CLONES_MECHANISMS + PLD_MECHANISMS,
        help="mechanism to account",
    )
    acc.add_argument("--n", type=_int_arg("--n"), help="number of users (integer >= 1)")
    acc.add_argument(
        "--sigma",
        type=_float_arg("--sigma", check_positive),
        help="sigma > 0 (all mechanisms but clones)",
    )
    acc.add_argument(
        "--eps0",
        type=_float_arg("--eps0", check_positive),
        help="local epsilon > 0 of each report (clones, ldp-shuffle)",
    )
    acc.add_argument("--k", type=_int_arg("--k", minimum=2), help="krr: domain size (>= 2)")
    acc.add_argument(
        "--gamma",
        type=_float_arg("--gamma", check_probability),
        help="krr: probability in (0, 1] that a user answers uniformly at random",
    )
    acc.add_argument(
        "--adversary",
        choices=("strong", "weak"),
        help="krr: strong (knows who randomised, Balle et al.) or weak (default strong)",
    )
    acc.add_argument("--m", type=_int_arg("--m"), help="users per round (subsampled), 1..n")
    acc.add_argument(
        "--rate",
        type=_float_arg("--rate", check_probability),
        help="check-in or Poisson rate in (0, 1]",
    )
    acc.add_argument(
        "--method",
        choices=methods,
        help=(
            "bound: checkin exact|sum|theorem3 (default exact); shuffle theorem1|corollary1; "
            "clones numerical|closed-form (default numerical)"
        ),
    )
    acc.add_argument(
        "--delta",
        type=_float_arg("--delta", lambda label, v: check_delta(v, label)),
        default=1e-5,
        help="target delta in (0, 1) (default 1e-5)",
    )
    acc.add_argument(
        "--steps",
        type=_int_arg("--steps"),
        nargs="+",
        default=[1],
        help="number of rounds; several values give one row each (default 1)",
    )
    acc.add_argument(
        "--max-order",
        type=_int_arg("--max-order", minimum=2),
        help="cap on the Rényi order (default: grow until the optimum is interior)",
    )
    acc.add_argument("--json", action="store_true", help="one JSON object per line")
    _add_calibrate(sub)
    _add_experiment(sub)
    return parser


def _add_experiment(sub: argparse._SubParsersAction) -> None:
    train = sub.add_parser(
        "train",
        help="run the MNIST shuffle-model experiment from a YAML config",
        description=(
            "Train on MNIST with one image per client under the config's protocol, writing "
            "config.yaml, metrics.csv, checkpoint.pt, summary.json and the plots into "
            "OUTPUT_DIR/NAME/<timestamp> (OUTPUT_DIR/NAME/latest points at the newest run)."
        ),
    )
    train.add_argument("--config", help="YAML config, e.g. configs/quick.yaml")
    train.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config value, e.g. --set training.rounds=100 (repeatable)",
    )
    train.add_argument(
        "--resume", metavar="RUN_DIR", help="continue an interrupted run from its checkpoint"
    )
    train.add_argument("--no-progress", action="store_true", help="no progress bar")
    plot = sub.add_parser(
        "plot",
        help="redraw a run's accuracy-vs-epsilon and epsilon-vs-rounds plots",
        description="Redraw the plots (PNG plus the plotted data as CSV) into RUN_DIR.",
    )
    plot.add_argument("run_dir", metavar="RUN_DIR", help="a run directory of shuffle-opacus train")


def _train(args: argparse.Namespace) -> int:
    if (args.config is None) == (args.resume is None):
        raise CliError("give exactly one of --config FILE (a new run) or --resume RUN_DIR")
    if args.resume is not None and args.overrides:
        raise CliError("--set cannot change a run being resumed; it keeps its config.yaml")
    from experiments.config import load_config
    from experiments.runner import resume, run, summary_table

    if args.resume is not None:
        result = resume(args.resume, progress=not args.no_progress)
    else:
        config = load_config(args.config, args.overrides)
        result = run(config, progress=not args.no_progress)
    print(summary_table(result), flush=True)
    return 0


def _plot(args: argparse.Namespace) -> int:
    from experiments.plots import plot_run

    for path in plot_run(args.run_dir):
        print(path)
    return 0


def _sensitivity_arg(text: str) -> float:
    try:
        return resolve_sensitivity(text if text in ("replace-one", "paper") else float(text))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--sensitivity must be replace-one, paper or a number > 0. Found {text!r}."
        ) from None


def _add_calibrate(sub: argparse._SubParsersAction) -> None:
    cal = sub.add_parser(
        "calibrate",
        help="local noise multiplier meeting a target (epsilon, delta) after some rounds",
        description=(
            "Smallest local noise multiplier (each client's noise std divided by the clipping "
            "norm) whose epsilon after --rounds rounds is at most --epsilon. Protocols: checkin "
            "(--rate), subsampled (--m), full (all --n clients every round)."
        ),
    )
    cal.add_argument("protocol", choices=PROTOCOLS, help="client-sampling protocol")
    cal.add_argument("--n", type=_int_arg("--n"), required=True, help="number of clients")
    cal.add_argument("--rate", type=_float_arg("--rate", check_probability), help="check-in rate")
    cal.add_argument("--m", type=_int_arg("--m"), help="clients per round (subsampled)")
    cal.add_argument("--rounds", type=_int_arg("--rounds"), required=True, help="rounds >= 1")
    cal.add_argument(
        "--epsilon",
        type=_float_arg("--epsilon", check_positive),
        required=True,
        help="target epsilon > 0",
    )
    cal.add_argument(
        "--delta",
        type=_float_arg("--delta", lambda label, v: check_delta(v, label)),
        default=1e-5,
        help="target delta in (0, 1) (default 1e-5)",
    )
    cal.add_argument(
        "--sensitivity",
        type=_sensitivity_arg,
        default=2.0,
        help="in units of the clipping norm: replace-one (2, default), paper (1) or a number",
    )
    methods = sorted({m for ms in DEFAULT_METHODS.values() for m in ms})
    cal.add_argument("--method", choices=methods, help="core method (default: the tightest)")
    cal.add_argument("--json", action="store_true", help="print one JSON object")


def _calibrate(args: argparse.Namespace) -> int:
    needs = {"checkin": "--rate", "subsampled": "--m", "full": None}[args.protocol]
    for flag, value in (("--rate", args.rate), ("--m", args.m)):
        if flag == needs and value is None:
            raise CliError(f"{flag} is required for the {args.protocol} protocol")
        if flag != needs and value is not None:
            raise CliError(f"{flag} is not an option of the {args.protocol} protocol")
    if args.m is not None and args.m > args.n:
        raise CliError(f"--m must be an integer in [1, {args.n}]. Found {args.m}.")
    rate = protocol_sample_rate(
        args.protocol, population=args.n, rate=args.rate, sample_size=args.m
    )
    setting = {
        "population": args.n,
        "sensitivity": args.sensitivity,
        "method": args.method,
    }
    sigma = calibrate_noise_multiplier(
        target_epsilon=args.epsilon,
        delta=args.delta,
        rounds=args.rounds,
        protocol=args.protocol,
        rate=args.rate,
        sample_size=args.m,
        **setting,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", OrderCapWarning)
        res = history_epsilon(
            [(sigma, rate, args.rounds)], protocol=args.protocol, delta=args.delta, **setting
        )
    row = {
        "protocol": args.protocol,
        "n": args.n,
        "rate": rate,
        "rounds": args.rounds,
        "sensitivity": args.sensitivity,
        "delta": args.delta,
        "target_epsilon": args.epsilon,
        "noise_multiplier": sigma,
        "epsilon": res.epsilon,
        "order": res.order,
    }
    if args.json:
        print(json.dumps(row))
    else:
        print(f"noise_multiplier  {sigma:.6g}  (local sigma: each client's noise std / C)")
        print(f"epsilon           {res.epsilon:.6f} <= {args.epsilon:g} at delta={args.delta:g}")
        print(
            f"setting           {args.protocol}, n={args.n}, rate={rate:g}, "
            f"rounds={args.rounds}, sensitivity={args.sensitivity:g} C"
        )
    return 0


def _fmt(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)


def _table(rows: Sequence[AccountingResult]) -> str:
    headers = ["mechanism", "method", "n", "sigma", "m", "rate", "steps", "delta", "epsilon"]
    headers.append("order")
    body = []
    for r in rows:
        order = f"{r.order}{' (cap)' if r.at_cap else ''}"
        body.append(
            [
                r.mechanism,
                r.method,
                _fmt(r.n),
                _fmt(r.sigma),
                _fmt(r.m),
                _fmt(r.rate),
                str(r.steps),
                _fmt(r.delta),
                f"{r.epsilon:.6f}",
                order,
            ]
        )
    lines = [_grid(headers, body)]
    lines.append(f"neighbouring: {rows[0].neighbouring}; unit of privacy: one user")
    return "\n".join(lines)


def _grid(headers: list[str], body: list[list[str]]) -> str:
    widths = [max(len(h), *(len(row[i]) for row in body)) for i, h in enumerate(headers)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip()]
    lines.append("  ".join("-" * w for w in widths))
    for row in body:
        lines.append("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
    return "\n".join(lines)


def _account(args: argparse.Namespace) -> int:
    if args.mechanism in PLD_MECHANISMS:
        return _account_pld(args)
    for flag in ("k", "gamma", "adversary"):
        if getattr(args, flag) is not None:
            raise CliError(f"--{flag} is an option of the krr mechanism only")
    if args.mechanism in CLONES_MECHANISMS:
        return _account_clones(args)
    if args.sigma is None:
        raise CliError(f"--sigma is required for the {args.mechanism} mechanism")
    if args.eps0 is not None:
        raise CliError(f"--eps0 is not an option of the {args.mechanism} mechanism")
    results = []
    capped = False
    for steps in args.steps:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", OrderCapWarning)
            res = compute_epsilon(
                args.mechanism,
                sigma=args.sigma,
                steps=steps,
                delta=args.delta,
                n=args.n,
                m=args.m,
                rate=args.rate,
                method=args.method,
                max_order=args.max_order,
            )
        capped = capped or any(issubclass(w.category, OrderCapWarning) for w in caught)
        results.append(res)
        if args.json:
            print(json.dumps(res.to_dict()), flush=True)
    if not args.json:
        print(_table(results))
    if capped:
        print(
            f"{PROG}: note: the optimal order sits at the largest order evaluated; "
            "raise --max-order for a possibly smaller epsilon",
            file=sys.stderr,
        )
    return 0


def _account_clones(args: argparse.Namespace) -> int:
    gaussian = args.mechanism == "clones-gaussian"
    needed, unwanted = ("--sigma", "--eps0") if gaussian else ("--eps0", "--sigma")
    if args.n is None:
        raise CliError(f"--n is required for the {args.mechanism} mechanism")
    if getattr(args, needed[2:]) is None:
        raise CliError(f"{needed} is required for the {args.mechanism} mechanism")
    for flag, value in ((unwanted, getattr(args, unwanted[2:])), ("--m", args.m)):
        if value is not None:
            raise CliError(f"{flag} is not an option of the {args.mechanism} mechanism")
    if args.max_order is not None:
        raise CliError(f"--max-order is not an option of the {args.mechanism} mechanism")
    method = args.method or "numerical"
    if method not in CLONES_METHODS:
        raise CliError(f"--method must be numerical or closed-form for {args.mechanism}")
    if args.rate is not None and not gaussian:
        raise CliError("--rate is not an option of the clones mechanism")
    param = {"sigma": args.sigma} if gaussian else {"eps0": args.eps0}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ClonesValidityWarning)
        epsilons = composed_epsilons(
            n=args.n, steps=args.steps, delta=args.delta, rate=args.rate, method=method, **param
        )
    rows = []
    for steps, eps in zip(args.steps, epsilons, strict=True):
        row: dict[str, object] = {
            "mechanism": args.mechanism,
            "method": method,
            "n": args.n,
            **param,
            "rate": args.rate,
            "steps": steps,
            "delta": args.delta,
            "epsilon": eps if math.isfinite(eps) else None,
            "composition": "none" if steps == 1 else "optimal (Kairouz-Oh-Viswanath)",
            "neighbouring": "replace-one user",
        }
        note = None
        if not math.isfinite(eps):
            limit = closed_form_limit(n=args.n, delta=args.delta)
            note = (
                f"closed form invalid: needs eps0 <= log(n/(16 log(4/delta))) = {limit:.4g}"
                if method == "closed-form"
                else "no bound"
            )
        if steps == 1 and not gaussian and method == "numerical":
            row["epsilon_lower"] = clones_epsilon(n=args.n, eps0=args.eps0, delta=args.delta).lower
        row["note"] = note
        rows.append(row)
        if args.json:
            print(json.dumps(row), flush=True)
    if not args.json:
        key = "sigma" if gaussian else "eps0"
        headers = ["mechanism", "method", "n", key, "rate", "steps", "delta", "epsilon"]
        body = [
            [
                r["mechanism"],
                r["method"],
                _fmt(r["n"]),
                _fmt(r[key]),
                _fmt(r["rate"]),
                str(r["steps"]),
                _fmt(r["delta"]),
                f"{r['epsilon']:.6f}" if r["epsilon"] is not None else f"n/a ({r['note']})",
            ]
            for r in rows
        ]
        print(_grid(headers, body))
        print(
            "neighbouring: replace-one user; several steps: optimal composition "
            "(Kairouz-Oh-Viswanath) with the best per-step delta"
        )
    return 0


def _account_pld(args: argparse.Namespace) -> int:
    krr = args.mechanism == "krr"
    needed = ("--n", "--k", "--gamma") if krr else ("--n", "--eps0")
    unwanted = ["--sigma", "--rate", "--method", "--max-order"]
    unwanted += ["--eps0", "--m"] if krr else ["--k", "--gamma", "--adversary"]
    for flag in needed:
        if getattr(args, flag[2:]) is None:
            raise CliError(f"{flag} is required for the {args.mechanism} mechanism")
    for flag in unwanted:
        if getattr(args, flag[2:].replace("-", "_")) is not None:
            raise CliError(f"{flag} is not an option of the {args.mechanism} mechanism")
    if args.m is not None and args.m > args.n:
        raise CliError(f"--m must be an integer in [1, --n = {args.n}]. Found {args.m}.")
    # The truncated mass of every round is added to delta: keep it far below the target.
    tail = min(DEFAULT_TAIL, 1e-3 * args.delta / max(args.steps))
    if krr:
        from .analysis.krr import krr_pld

        adversary = args.adversary or "strong"
        base = krr_pld(n=args.n, k=args.k, gamma=args.gamma, adversary=adversary, tail=tail)
        param: dict[str, object] = {"k": args.k, "gamma": args.gamma, "adversary": adversary}
    elif args.m is not None:
        base = subsampled_ldp_shuffle_pld(n=args.n, m=args.m, eps0=args.eps0, tail=tail)
        param = {"eps0": args.eps0, "m": args.m}
    else:
        base = ldp_shuffle_pld(n=args.n, eps0=args.eps0, tail=tail)
        param = {"eps0": args.eps0}
    rows = []
    for steps in args.steps:
        pld = base if steps == 1 else base.self_compose(steps)
        eps = max(0.0, float(pld.get_epsilon_for_delta(args.delta)))
        row: dict[str, object] = {
            "mechanism": args.mechanism,
            "n": args.n,
            **param,
            "steps": steps,
            "delta": args.delta,
            "epsilon": eps if math.isfinite(eps) else None,
            "accounting": "privacy loss distribution (dp_accounting, pessimistic)",
            "neighbouring": "replace-one user",
            "tail": tail,
        }
        rows.append(row)
        if args.json:
            print(json.dumps(row), flush=True)
    if not args.json:
        keys = list(param)
        headers = ["mechanism", "n", *keys, "steps", "delta", "epsilon"]
        body = [
            [
                str(r["mechanism"]),
                _fmt(r["n"]),
                *(_fmt(r[key]) for key in keys),
                str(r["steps"]),
                _fmt(r["delta"]),
                f"{r['epsilon']:.6f}" if r["epsilon"] is not None else "inf",
            ]
            for r in rows
        ]
        print(_grid(headers, body))
        print(
            "neighbouring: replace-one user; privacy loss distributions composed with "
            f"dp_accounting (pessimistic), truncated mass {tail:.3g} per round added to delta"
        )
    return 0


def _one_line(message: str) -> str:
    """Drop argparse's ``argument X:`` prefix when the message already names ``X``."""
    message = message.splitlines()[0] if message else "invalid arguments"
    match = re.match(r"argument ([^:]+): (.*)", message)
    if match:
        name, rest = match.groups()
        return rest if rest.startswith(name.split("/")[0]) else f"{name}: {rest}"
    return message


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line interface.

    Args:
        argv: Arguments without the program name (``sys.argv[1:]`` by default).

    Returns:
        The exit status (0 on success, 2 on a usage or input error).
    """
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        if args.command == "account":
            return _account(args)
        if args.command == "calibrate":
            return _calibrate(args)
        if args.command == "train":
            return _train(args)
        if args.command == "plot":
            return _plot(args)
    except (CliError, ValueError) as exc:
        message = _one_line(str(exc))
        print(f"{PROG}: error: {message}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130  # the runner has saved a checkpoint and said how to resume
    return 2  # pragma: no cover - argparse enforces a command


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
