"""The ``shuffle-experiment`` command: the MNIST experiment and the paper figures.

``shuffle-experiment train --config FILE`` runs the MNIST experiment of Liew & Takahashi (one
image per client, the config's protocol, local noise, an epsilon curve per accountant);
``train --resume RUN_DIR`` continues an interrupted run (a finished one gets its summary.json
and plots written again); ``plot RUN_DIR`` redraws a run's figures, and a finished run's
summary.json, from its checkpoint and metrics.csv without training; ``sweep SWEEP_FILE`` runs
short trials over config overrides (:mod:`.sweep`); ``table1`` and ``pld-figures`` redraw the
published tables and figures into ``docs/figures``. Errors, a file that cannot be written
included (named, with the cause), are reported on one line (``shuffle-experiment: error:
...``) with exit status 2;
Ctrl-C during training saves a checkpoint and exits with status 130. A config that uses a key's
old name (``privacy.accountants``) runs as under the new one, with one line
``shuffle-experiment: note: ...`` on standard error.
"""

from __future__ import annotations

import argparse
import sys
import warnings
from collections.abc import Sequence
from typing import Any

from shuffle_opacus.common.suggestions import argparse_suggestion

__all__ = ["main", "build_parser"]

PROG = "shuffle-experiment"


class CliError(Exception):
    """A user error to be reported on one line."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise CliError(message + argparse_suggestion(self, message))


def build_parser() -> argparse.ArgumentParser:
    """Build the argument parser of the ``shuffle-experiment`` command."""
    parser = _Parser(prog=PROG, description="The MNIST shuffle-model experiment and figures.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    train = sub.add_parser(
        "train",
        help="run the MNIST shuffle-model experiment from a YAML config",
        description=(
            "Train on MNIST under the config's protocol (one image per client, or clients of "
            "many images that train locally when the config has a clients section), writing "
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
        "--resume",
        metavar="RUN_DIR",
        help=(
            "continue an interrupted run from its checkpoint (a finished run: write its "
            "summary.json and plots again)"
        ),
    )
    train.add_argument("--no-progress", action="store_true", help="no progress bar")
    unsigned_help = (
        "with --resume: accept a checkpoint without checksum (layout 2, written by an earlier "
        "version); it cannot be verified, so an edited weight or accountant state would go "
        "unnoticed. Refused without this flag"
    )
    train.add_argument("--allow-unsigned-checkpoint", action="store_true", help=unsigned_help)
    plot = sub.add_parser(
        "plot",
        help="redraw a run's accuracy-vs-epsilon and epsilon-vs-rounds plots",
        description=(
            "Redraw the plots (PNG plus the plotted data as CSV) into RUN_DIR. A finished run "
            "also gets its summary.json written again, from its checkpoint and metrics.csv "
            "(both checked, and the epsilon columns repaired, first); nothing is trained."
        ),
    )
    plot.add_argument("run_dir", metavar="RUN_DIR", help="a run directory of train")
    plot.add_argument(
        "--allow-unsigned-checkpoint",
        action="store_true",
        help=unsigned_help.replace("with --resume: ", "a finished run: "),
    )
    sweep = sub.add_parser(
        "sweep",
        help="run short training trials over a grid of config overrides",
        description=(
            "Run every trial of a sweep file (a base config, common overrides, a grid and/or "
            "a list of trials) into OUT/trial-NN, then write OUT/results.md, results.csv and "
            "accuracy.png. Started again, it keeps finished trials and resumes the rest."
        ),
    )
    sweep.add_argument("sweep_file", metavar="SWEEP_FILE", help="e.g. configs/sweeps/paper-1.yaml")
    sweep.add_argument("--out", help="output directory (default: runs/sweeps/<name of SWEEP_FILE>)")
    sweep.add_argument(
        "--trial",
        type=int,
        nargs="+",
        metavar="K",
        help="run only these trials (e.g. one per process on a multi-core machine)",
    )
    sweep.add_argument("--no-progress", action="store_true", help="no progress bars")
    for name, what in (
        ("table1", "Table 1 of Liew & Takahashi (clones against RDP)"),
        ("pld-figures", "Figures 1-5 of Koskela, Heikkilä & Honkela (PLD accounting)"),
    ):
        fig = sub.add_parser(name, help=f"redraw {what}", description=f"Redraw {what}.")
        fig.add_argument("--out", default="docs/figures", help="output directory")
    return parser


def _train(args: argparse.Namespace) -> int:
    if (args.config is None) == (args.resume is None):
        raise CliError("give exactly one of --config FILE (a new run) or --resume RUN_DIR")
    if args.resume is not None and args.overrides:
        raise CliError("--set cannot change a run being resumed; it keeps its config.yaml")
    if args.resume is None and args.allow_unsigned_checkpoint:
        raise CliError("--allow-unsigned-checkpoint applies to --resume RUN_DIR only")
    from .config import load_config
    from .runner import RunInterrupted, resume, run, summary_table

    try:
        if args.resume is not None:
            result = resume(
                args.resume,
                progress=not args.no_progress,
                allow_unsigned_checkpoint=args.allow_unsigned_checkpoint,
            )
        else:
            config = load_config(args.config, args.overrides)
            result = run(config, progress=not args.no_progress)
    except RunInterrupted as stopped:
        # The summary and the plots so far; the run continues with --resume.
        if stopped.result.rounds_done:
            print(summary_table(stopped.result), flush=True)
        return 130
    print(summary_table(result), flush=True)
    return 0


def _plot(args: argparse.Namespace) -> int:
    from .runner import redraw

    for path in redraw(args.run_dir, allow_unsigned_checkpoint=args.allow_unsigned_checkpoint):
        print(path)
    return 0


def _sweep(args: argparse.Namespace) -> int:
    from pathlib import Path

    from .sweep import load_sweep, run_sweep

    sweep = load_sweep(args.sweep_file)
    out = Path(args.out) if args.out else Path("runs") / "sweeps" / Path(args.sweep_file).stem
    run_sweep(sweep, out, progress=not args.no_progress, only=args.trial)
    print(f"results         {out / 'results.md'}")
    return 0


def _one_line_notes(show: Any) -> Any:
    """Return a ``warnings.showwarning`` that prints a renamed key's note as one line."""

    def showwarning(message: Any, category: Any, *args: Any, **kwargs: Any) -> None:
        from .renamed_keys import ConfigDeprecationWarning

        if issubclass(category, ConfigDeprecationWarning):
            print(f"{PROG}: note: {message}", file=sys.stderr, flush=True)
        else:
            show(message, category, *args, **kwargs)

    return showwarning


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line interface.

    Args:
        argv: Arguments without the program name (``sys.argv[1:]`` by default).

    Returns:
        The exit status (0 on success, 2 on a usage or input error, 130 after Ctrl-C).
    """
    with warnings.catch_warnings():  # restores the caller's showwarning afterwards
        warnings.showwarning = _one_line_notes(warnings.showwarning)
        return _main(argv)


def _main(argv: Sequence[str] | None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        if args.command == "train":
            return _train(args)
        if args.command == "plot":
            return _plot(args)
        if args.command == "sweep":
            return _sweep(args)
        if args.command == "table1":
            from .table1 import main as table1

            return table1(["--out", args.out])
        from .pld_figures import main as pld_figures

        return pld_figures(["--out", args.out])
    except (CliError, ValueError, OSError) as exc:
        message = str(exc).splitlines()[0] if str(exc) else "invalid arguments"
        print(f"{PROG}: error: {message}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130  # the runner has saved a checkpoint and said how to resume


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
