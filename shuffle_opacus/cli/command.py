"""The ``shuffle-opacus`` command: parse, call the maths layer, print one result record per row.

``shuffle-opacus account MECHANISM [options]`` prints epsilon for one or more step counts of any
mechanism of :data:`shuffle_opacus.analysis.MECHANISM_TABLE`; ``shuffle-opacus calibrate PROTOCOL
[options]`` prints the local noise multiplier that meets a target (epsilon, delta). Neither
imports torch, so they start quickly. Errors are reported on one line (``shuffle-opacus: error:
...``) with exit status 2. The MNIST experiment has its own command, ``shuffle-experiment``,
in the separate ``experiments`` project.

Every request is costed before it starts (:mod:`shuffle_opacus.analysis.limits`): one estimated
above :data:`~shuffle_opacus.analysis.limits.CLI_MAX_SECONDS` is refused with the argument to
lower and its largest acceptable value. Work that takes longer than a moment shows a progress
bar on standard error when standard error is a terminal; standard output is the same either
way.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import os
import re
import sys
import threading
import warnings
from collections.abc import Iterator, Sequence

from ..accounting.calibration import UnreachableTargetError, calibrate
from ..accounting.protocols import (
    PROTOCOL_NAMES,
    SENSITIVITIES,
    PaperConventionWarning,
    get_protocol,
    sensitivity_assumptions,
    sensitivity_label,
)
from ..analysis.limits import CLI_MAX_SECONDS, PldRangeError, observe
from ..analysis.mechanisms import MECHANISM_TABLE
from ..analysis.query import account
from ..analysis.rdp.conversion import OrderCapWarning
from ..analysis.records import Parameter
from ..analysis.registry import parameter_specs
from ..analysis.results import AccountingResult
from ..common.validation import (
    SIGMA_RANGE,
    check_positive,
    check_probability,
)
from . import render
from .args import (
    CliError,
    _choices,
    _delta_arg,
    _float_arg,
    _int_arg,
    _Parser,
    _sensitivity_arg,
    _VersionAction,
)

__all__ = ["main", "build_parser"]

PROG = "shuffle-opacus"

#: The command-line flag of each protocol parameter.


def build_parser() -> argparse.ArgumentParser:
    """Build the argument parser of the ``shuffle-opacus`` command."""
    parser = _Parser(prog=PROG, description="Shuffle-model differential privacy accounting.")
    parser.add_argument(
        "--version",
        action=_VersionAction,
        help="print the version, the commit and the libraries' versions, then exit",
    )
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    _add_account(sub)
    _add_calibrate(sub)
    return parser


#: The parser last built by :func:`_parser` and what it was built from.
_BUILT: tuple[tuple[object, ...], argparse.ArgumentParser] | None = None


def _parser() -> argparse.ArgumentParser:
    """Return :func:`build_parser`'s parser, built again only when what it reads has changed.

    Building it costs about 2 ms, as much as many requests. It reads the mechanism table (which
    :func:`~shuffle_opacus.analysis.registry.register_mechanism` changes) and the protocols;
    the key holds those very records, so a replaced or added one is never served a stale parser.
    """
    global _BUILT
    key = (
        *MECHANISM_TABLE.items(),
        *((name, get_protocol(name)) for name in PROTOCOL_NAMES),
    )
    if _BUILT is not None:
        old, parser = _BUILT
        if len(old) == len(key) and all(
            a[0] == b[0] and a[1] is b[1]  # type: ignore[index]
            for a, b in zip(old, key, strict=True)
        ):
            return parser
    parser = build_parser()
    _BUILT = (key, parser)
    return parser


def _noise_multiplier_mechanisms() -> tuple[str, ...]:
    """Return the mechanisms whose noise may be a noise multiplier with a sensitivity."""
    return tuple(e.name for e in MECHANISM_TABLE.values() if e.noise_multiplier)


def _and(names: Sequence[str]) -> str:
    """Join names as ``a, b and c``."""
    return " and ".join(filter(None, (", ".join(names[:-1]), names[-1]))) if names else ""


def _add_parameter(acc: argparse.ArgumentParser, spec: Parameter) -> None:
    """Add the flag of one mechanism parameter, as its record describes it."""
    if spec.kind == "int":
        acc.add_argument(spec.flag, type=_int_arg(spec.flag, spec.minimum), help=spec.help)
    elif spec.kind == "choice":
        acc.add_argument(spec.flag, choices=spec.choices, help=spec.help)
    else:
        check = spec.check or check_positive
        acc.add_argument(spec.flag, type=_float_arg(spec.flag, check), help=spec.help)


def _add_account(sub: argparse._SubParsersAction) -> None:
    rows = "; ".join(
        f"{e.name} ({', '.join(e.parameters + e.optional)}): {e.summary}"
        for e in MECHANISM_TABLE.values()
    )
    noise = _noise_multiplier_mechanisms()
    acc = sub.add_parser(
        "account",
        help="epsilon of a shuffle (or central reference) mechanism after some rounds",
        description=(
            f"Epsilon after --steps rounds. For {_and(noise)} give the noise as "
            "in the API and in calibrate's output: --noise-multiplier (each user's noise std / "
            "the clipping norm C) with --sensitivity (replace-one by default: clipped updates "
            "up to 2C apart); or --sigma, the analysis sigma of the maths (each user's noise std "
            "/ the L2 distance of the differing user's two inputs; replace-one sigma = noise "
            "multiplier / 2). For gaussian and subsampled-gaussian --sigma is the noise on the "
            "sum divided by its sensitivity; for clones-gaussian the noise std over the diameter "
            f"of the input domain. Mechanisms: {rows}."
        ),
    )
    acc.add_argument("mechanism", choices=tuple(MECHANISM_TABLE), help="mechanism to account")
    for spec in parameter_specs().values():
        if spec.name == "sigma":  # the two ways of giving the noise, side by side
            acc.add_argument(
                "--noise-multiplier",
                type=_float_arg("--noise-multiplier", check_positive),
                help=f"{', '.join(noise)}: each user's noise std / the clipping norm (the unit "
                "of calibrate and of the Opacus API); turned into sigma by --sensitivity",
            )
            acc.add_argument(
                "--sensitivity",
                type=_sensitivity_arg,
                help="with --noise-multiplier, in units of the clipping norm: replace-one (2, "
                "default), paper (1: the paper's convention, holds only if every clipped update "
                "lies within C of every other) or a number in [1, 2]",
            )
        _add_parameter(acc, spec)
    methods = sorted({m for e in MECHANISM_TABLE.values() for m in e.method_names})
    acc.add_argument(
        "--method",
        choices=methods,
        help="bound to use (default: the mechanism's first; for shuffle, subsampled and checkin "
        "pld, the tight one resting on Theorem 1's pair, or its Rényi bound with a note where "
        "pld is beyond the work limits, printed with a proven row beside it; --method proven "
        "prints the proven bound alone): "
        + "; ".join(f"{e.name}: {_choices(e.method_names)}" for e in MECHANISM_TABLE.values()),
    )
    acc.add_argument("--delta", type=_delta_arg(), default=1e-5, help="target delta (1e-5)")
    acc.add_argument(
        "--steps",
        "--rounds",
        dest="steps",
        type=_int_arg("--steps"),
        nargs="+",
        default=[1],
        help="number of rounds (--rounds is the same flag, as in calibrate); several values "
        "give one row each (default 1)",
    )
    acc.add_argument(
        "--max-order",
        type=_int_arg("--max-order", minimum=2),
        help="cap on the Rényi order (default: grow until the optimum is interior)",
    )
    acc.add_argument("--json", action="store_true", help="one JSON object per line")


def _add_calibrate(sub: argparse._SubParsersAction) -> None:
    cal = sub.add_parser(
        "calibrate",
        help="local noise multiplier meeting a target (epsilon, delta) after some rounds",
        description=(
            "Smallest local noise multiplier (each client's noise std divided by the clipping "
            "norm) whose epsilon after --rounds rounds is at most --epsilon. Protocols: "
            + "; ".join(
                f"{p}: {get_protocol(p).summary}"
                + (f" ({q})" if (q := get_protocol(p).flag) else "")
                for p in PROTOCOL_NAMES
            )
            + "."
        ),
    )
    cal.add_argument("protocol", choices=PROTOCOL_NAMES, help="client-sampling protocol")
    cal.add_argument("--n", type=_int_arg("--n"), required=True, help="number of clients")
    cal.add_argument("--rate", type=_float_arg("--rate", check_probability), help="check-in rate")
    cal.add_argument("--m", type=_int_arg("--m"), help="clients per round (subsampled)")
    cal.add_argument(
        "--rounds",
        "--steps",
        dest="rounds",
        type=_int_arg("--rounds"),
        required=True,
        help="rounds >= 1 (--steps is the same flag, as in account)",
    )
    cal.add_argument(
        "--epsilon",
        type=_float_arg("--epsilon", check_positive),
        required=True,
        help="target epsilon > 0",
    )
    cal.add_argument("--delta", type=_delta_arg(), default=1e-5, help="target delta (1e-5)")
    cal.add_argument(
        "--sensitivity",
        type=_sensitivity_arg,
        default=SENSITIVITIES["replace-one"],
        help="in units of the clipping norm: replace-one (2, default), paper (1) or a number",
    )
    methods = sorted({m for p in PROTOCOL_NAMES for m in get_protocol(p).methods})
    cal.add_argument(
        "--method",
        choices=methods,
        help="core method (default: pld, the tight one, or the protocol's Rényi bound with a "
        "note where pld is beyond the work limits)",
    )
    cal.add_argument(
        "--guarantee",
        choices=("tight", "proven"),
        help="calibrate to the tight epsilon (pld, resting on Theorem 1's pair; the default) "
        "or to the proven one (published theorems only); same as --method pld or proven",
    )
    cal.add_argument("--json", action="store_true", help="print one JSON object")


def _flag_error(message: str) -> str:
    """Name a parameter by its flag (``m must ...`` becomes ``--m must ...``)."""
    head, _, rest = message.partition(" ")
    if head in ("population", "target_epsilon"):
        return f"{'--n' if head == 'population' else '--epsilon'} {rest}"
    if head in parameter_specs() or head in ("max_order", "steps", "delta", "rounds"):
        return f"--{head.replace('_', '-')} {rest}"
    return message


@contextlib.contextmanager
def _progress(label: str) -> Iterator[None]:
    """Show a progress bar on standard error while the block runs, when it is a terminal.

    The bar counts the stages the maths layer reports (Rényi order ranges, calibration steps;
    :func:`~shuffle_opacus.analysis.limits.report_progress`) and shows the elapsed time; it
    appears only after half a second and is erased at the end. Nothing is written when standard
    error is not a terminal.

    Args:
        label: What the bar describes (the subcommand).
    """
    isatty = getattr(sys.stderr, "isatty", None)
    if not (callable(isatty) and isatty()):
        yield
        return
    from tqdm import tqdm  # imported here: the commands without a terminal never need it

    bar = tqdm(desc=f"{PROG} {label}", unit=" stage", file=sys.stderr, delay=0.5, leave=False)
    done = threading.Event()

    def tick() -> None:  # refresh the elapsed time while a long stage runs
        while not done.wait(0.5):
            bar.refresh()

    def stage(text: str) -> None:
        bar.set_postfix_str(text, refresh=False)
        bar.update(1)

    ticker = threading.Thread(target=tick, daemon=True)
    ticker.start()
    try:
        with observe(stage):
            yield
    finally:
        done.set()
        ticker.join()
        bar.close()


def _noise_to_sigma(args: argparse.Namespace) -> tuple[float | None, float | None]:
    """Return ``(sigma, sensitivity)`` from ``--noise-multiplier``/``--sensitivity`` or ``--sigma``.

    The sensitivity is ``None`` when the analysis sigma was given directly.
    """
    if args.noise_multiplier is None:
        if args.sensitivity is not None:
            raise CliError("--sensitivity applies to --noise-multiplier; --sigma is the analysis "
                           "sigma already")  # fmt: skip
        return args.sigma, None
    if args.sigma is not None:
        raise CliError(
            "give --noise-multiplier (with --sensitivity) or --sigma (the analysis sigma), not both"
        )
    if not MECHANISM_TABLE[args.mechanism].noise_multiplier:
        raise CliError(
            f"--noise-multiplier is not an option of the {args.mechanism} mechanism (one of "
            f"{', '.join(_noise_multiplier_mechanisms())}); use --sigma"
        )
    sens = SENSITIVITIES["replace-one"] if args.sensitivity is None else args.sensitivity
    sigma = args.noise_multiplier / sens
    low, high = SIGMA_RANGE
    if not low <= sigma <= high:
        raise CliError(
            f"--noise-multiplier / --sensitivity (the analysis sigma) must be in [{low:g}, "
            f"{high:g}]. Found {args.noise_multiplier!r} / {sens:g}."
        )
    return sigma, sens


def _in_noise_units(
    result: AccountingResult, noise_multiplier: float, sensitivity: float
) -> AccountingResult:
    """Show a record in the API's units: the noise multiplier beside the analysis sigma."""
    parameters = {"noise_multiplier": noise_multiplier, **result.parameters}
    return dataclasses.replace(
        result,
        parameters=parameters,
        sensitivity=sensitivity_label(sensitivity),
        assumptions=(*result.assumptions, *sensitivity_assumptions(sensitivity)),
    )


PROVEN_FOOTER = (
    "guarantees: proven rests on published theorems only (no assumption on where the other "
    "users' updates lie); the default row (pld) is tight but rests on Theorem 1's pair being "
    "the worst case (numerical evidence). Both need secret noise, a secret shuffle and "
    "secret sampling coins."
)
"""The footer line under an ``account`` table that shows both guarantees."""


def _beside(mechanism: str, args: argparse.Namespace) -> str | None:
    """Return the method whose row ``account`` adds beside the default's, or ``None``.

    Only for the default method of a mechanism whose record names one
    (:attr:`~shuffle_opacus.analysis.mechanisms.Mechanism.beside_default`).
    """
    entry = MECHANISM_TABLE[mechanism]
    if args.method is None and args.max_order is None and not getattr(args, "tight_only", False):
        return entry.beside_default
    return None


def _account(args: argparse.Namespace) -> int:
    entry = MECHANISM_TABLE[args.mechanism]
    sigma, sensitivity = _noise_to_sigma(args)
    given = {name: getattr(args, name) for name in parameter_specs()}
    given["sigma"] = sigma
    for name in entry.parameters:
        if given[name] is None:
            if name == "sigma" and entry.noise_multiplier:
                raise CliError(
                    f"--noise-multiplier or --sigma is required for the {entry.name} mechanism"
                )
            raise CliError(f"--{name} is required for the {entry.name} mechanism")
    for name, value in given.items():
        if value is not None and name not in entry.parameters + entry.optional:
            raise CliError(f"--{name} is not an option of the {entry.name} mechanism")
    if args.method is not None and args.method not in entry.method_names:
        raise CliError(
            f"--method must be one of {_choices(entry.method_names)} for {entry.name}. "
            f"Found {args.method!r}."
        )
    if args.max_order is not None and not entry.by_rounds:
        raise CliError(f"--max-order is not an option of the {entry.name} mechanism")
    with warnings.catch_warnings():
        # An optimum at the order cap is reported below, from the records themselves.
        warnings.simplefilter("ignore", OrderCapWarning)
        runs = [(args.method, args.max_order, "")]
        beside = _beside(entry.name, args)
        if beside is not None:
            runs.append((beside, None, f" ({beside})"))
        found = []
        for method, max_order, label in runs:
            try:
                with _progress(f"account {entry.name}{label}"):
                    found.append(
                        account(
                            entry.name,
                            given,
                            steps=args.steps,
                            delta=args.delta,
                            method=method,
                            max_order=max_order,
                            max_seconds=CLI_MAX_SECONDS,
                        )
                    )
            except PldRangeError as exc:
                if not label:
                    raise CliError(_flag_error(str(exc))) from None
                # The row beside the default was not asked for: the default's rows still stand.
                print(
                    f"{PROG}: note: no {method} row here: {str(exc).rstrip('.')}",
                    file=sys.stderr,
                )
            except ValueError as exc:
                raise CliError(_flag_error(str(exc))) from None
        # Each count's default row, then its proven row.
        results = [r for rows in zip(*found, strict=True) for r in rows]
    if sensitivity is not None:
        results = [_in_noise_units(r, args.noise_multiplier, sensitivity) for r in results]
    text = render.json_lines(results) if args.json else render.table(results)
    if not args.json and any(r.method == "proven" for r in results):
        text += "\n" + PROVEN_FOOTER
    print(text, flush=True)
    if any(r.at_cap for r in results):
        print(
            f"{PROG}: note: the optimal order sits at the largest order evaluated; "
            "raise --max-order for a possibly smaller epsilon",
            file=sys.stderr,
        )
    return 0


def _calibrate(args: argparse.Namespace) -> int:
    protocol = get_protocol(args.protocol)
    needs = protocol.flag
    for flag, value in (("--rate", args.rate), ("--m", args.m)):
        if flag == needs and value is None:
            raise CliError(f"{flag} is required for the {protocol.name} protocol")
        if flag != needs and value is not None:
            raise CliError(f"{flag} is not an option of the {protocol.name} protocol")
    if args.m is not None and args.m > args.n:
        raise CliError(f"--m must be an integer in [1, {args.n}]. Found {args.m}.")
    rate = protocol.sample_rate(population=args.n, rate=args.rate, sample_size=args.m)
    if args.guarantee is not None:
        wanted = "proven" if args.guarantee == "proven" else "pld"
        if args.method is not None and args.method != wanted:
            raise CliError(
                f"--guarantee {args.guarantee} and --method {args.method} disagree: give one"
            )
        args.method = wanted
    method = protocol.check_method(args.method)
    try:
        with _progress(f"calibrate {protocol.name}"):
            found = calibrate(
                target_epsilon=args.epsilon,
                delta=args.delta,
                rounds=args.rounds,
                protocol=protocol,
                rate=args.rate,
                sample_size=args.m,
                max_seconds=CLI_MAX_SECONDS,
                population=args.n,
                sensitivity=args.sensitivity,
                method=method,
            )
    except UnreachableTargetError as exc:
        raise CliError(_unreachable(exc, args.method)) from None
    except ValueError as exc:
        text = str(exc)
        if text.startswith("sigma "):  # the analysis sigma, noise multiplier / sensitivity
            low, high = SIGMA_RANGE
            text = (
                f"--sensitivity {args.sensitivity:g} puts the analysis sigma (noise multiplier "
                f"/ sensitivity) outside [{low:g}, {high:g}]."
            )
        raise CliError(_flag_error(text)) from None
    method_used = found.method if found.method in protocol.methods else None
    assumptions = (
        *protocol.analysis.assumptions_of(method_used),
        *sensitivity_assumptions(args.sensitivity),
    )
    row = {
        "protocol": protocol.name,
        "method": found.method,
        "n": args.n,
        "rate": rate,
        "rounds": args.rounds,
        "sensitivity": args.sensitivity,
        "delta": args.delta,
        "target_epsilon": args.epsilon,
        "noise_multiplier": found.noise_multiplier,
        "epsilon": found.epsilon,
        "neighbouring": protocol.analysis.neighbouring,
        "sensitivity_convention": sensitivity_label(args.sensitivity),
        "assumptions": list(assumptions),
        "note": found.note,
    }
    print(json.dumps(row) if args.json else render.calibration_text(row), flush=True)
    if found.note and not args.json:
        print(f"{PROG}: note: {found.note}", file=sys.stderr)
    return 0


def _unreachable(exc: UnreachableTargetError, method: str | None) -> str:
    """Say which ``--epsilon`` the largest noise multiplier calibrate tries still meets.

    Args:
        exc: The calibration's refusal.
        method: The ``--method`` given, or ``None`` for the default.

    Returns:
        One line naming ``--epsilon`` and its range.
    """
    by = f"--method {method}" if method is not None else "the default method"
    cap = f"a noise multiplier <= {exc.max_noise_multiplier:g} (the largest calibrate tries)"
    if not math.isfinite(exc.reached):
        return (
            f"--epsilon {exc.target_epsilon:g} is not reached by {by} with {cap}: its epsilon "
            f"there is not finite."
        )
    return (
        f"--epsilon must be >= {exc.reached:.6g} for {by}: a smaller target is not reached "
        f"with {cap}. Found {exc.target_epsilon:g}."
    )


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
    parser = _parser()
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", PaperConventionWarning)
            args = parser.parse_args(argv)
        for item in caught:  # the sensitivity's warning, as one note line
            print(f"{PROG}: note: {item.message}", file=sys.stderr)
        if args.command == "account":
            return _account(args)
        return _calibrate(args)
    except (CliError, ValueError) as exc:
        print(f"{PROG}: error: {_one_line(str(exc))}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # the reader went away (``| head``): nothing more to say
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - so that the exit flush is silent
        return 0
