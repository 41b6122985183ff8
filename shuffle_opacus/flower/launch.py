"""Command line: run a Flower app on this machine and print one line per round.

``python -m shuffle_opacus.flower.launch simulation|deployment APP_DIR --nodes N`` starts a
:class:`~shuffle_opacus.flower.federation.LocalFederation`, submits the app once with ``flwr run``
and stops every process afterwards. ``--nodes`` sets the app's ``num-nodes`` (a different
``-c num-nodes`` is refused before anything starts) and ``--out-dir`` its ``out-dir``, where the
MNIST app writes ``run-<run id>/rounds.csv``. While the run goes, :class:`RoundPrinter` turns the
strategies' JSON round lines (:func:`~shuffle_opacus.flower.checkin_base.round_line`) into one
console line per round; ``--help`` says where every file goes, ``docs/flower.md`` the rest.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from .checkin_base import EPSILON_PROVEN_KEY, read_round_line
from .federation import ENGINES, LocalFederation, RunOutcome, write_config

__all__ = ["ENGINES", "LocalFederation", "RoundPrinter", "RunOutcome", "main", "write_config"]


class RoundPrinter:
    """Turn the strategies' round lines into one console line per round.

    After every round both check-in strategies log one JSON line
    (:func:`~shuffle_opacus.flower.checkin_base.round_line`); this prints it as
    ``round N/T: <counts>, epsilon E (delta D)`` (``R reports`` in the trusted-server mode; the
    nodes in the secure sum and the number checked in under SecAgg+), with ``proven epsilon P``
    where the line carries the proven ε (evaluation rounds and the last round), the accuracy of
    the round's server evaluation when there is one, and the stop reason of a round that ended
    the run. Every other line is ignored.

    Args:
        write: Where the lines go (``print`` by default).
        total: Rounds configured, shown as ``N/total`` (default: the round line's
            ``num_rounds``).
    """

    def __init__(self, write: Callable[[str], None] = print, total: int | None = None) -> None:
        self.write = write
        self.total = total
        self.rounds_printed = 0
        self.guarantee_printed = False
        self._last_round = 0

    def __call__(self, line: str) -> None:
        """Read one log line; print it if it is a round line.

        After the run's last round (the configured last one, or one that stopped the run) the
        guarantee block follows (:func:`guarantee_lines`), once per run (a round number below the
        previous one starts another run).
        """
        record = read_round_line(line)
        if record is not None:
            number = record.get("round")
            if isinstance(number, int) and number < self._last_round:
                self.guarantee_printed = False  # a new run on the same console
            self._last_round = number if isinstance(number, int) else self._last_round
            self.write(self.format(record))
            self.rounds_printed += 1
            total = self.total or record.get("num_rounds")
            last = record.get("stop_reason") or (total and record.get("round") == total)
            if last and record.get("guarantees") and not self.guarantee_printed:
                for text in guarantee_lines(record["guarantees"]):
                    self.write(text)
                self.guarantee_printed = True

    def format(self, record: Mapping[str, Any]) -> str:
        """Return the console line of one round's record.

        Args:
            record: The record of a round line (:func:`~.checkin_base.read_round_line`).

        Returns:
            The line, without a newline.
        """
        metrics = record.get("metrics") or {}
        total = self.total or record.get("num_rounds")
        where = f"{record.get('round')}/{total}" if total else f"{record.get('round')}"
        if "num-in-sum" in metrics:
            count = metrics.get("num-checked-in", -1)
            checked = "?" if not isinstance(count, int) or count < 0 else str(count)
            counts = f"{metrics['num-in-sum']} nodes in the secure sum, {checked} checked in"
        else:
            counts = f"{metrics.get('num-reports', '?')} reports"
        epsilon, delta = _number(metrics.get("epsilon"), ".6g"), _number(metrics.get("delta"), "g")
        text = f"round {where}: {counts}, epsilon {epsilon} (delta {delta})"
        if EPSILON_PROVEN_KEY in metrics:
            text += f", proven epsilon {_number(metrics[EPSILON_PROVEN_KEY], '.6g')}"
        evaluation = record.get("evaluation") or {}
        accuracy = next((k for k in evaluation if "accuracy" in k), None)
        if accuracy is not None:
            text += f", {accuracy} {_number(evaluation[accuracy], 'g')}"
        if record.get("stop_reason"):
            text += f"; {record['stop_reason']}"
        return text


def guarantee_lines(guarantees: Mapping[str, Any]) -> list[str]:
    """Return the lines that say what each ε of a Flower run is and rests on.

    Args:
        guarantees: The ``guarantees`` of a round line
            (:meth:`~shuffle_opacus.flower.checkin_base.CheckInBase.guarantees`).

    Returns:
        For the tight ε and then the proven one: a ``guarantee`` line (neighbouring relation,
        unit of privacy, method, sensitivity in units of C, δ), its ``note`` if any, and one
        ``assumes:`` line per assumption.
    """
    lines: list[str] = []
    for key, label in (("epsilon", "epsilon"), (EPSILON_PROVEN_KEY, "proven epsilon")):
        g = guarantees.get(key)
        if not isinstance(g, Mapping):
            continue
        lines.append(
            f"guarantee: {label} is replace-one of one node (unit of privacy: one node), method "
            f"{g.get('method')}, sensitivity {_number(g.get('sensitivity'), 'g')} C, delta "
            f"{_number(g.get('delta'), 'g')}"
        )
        if g.get("note"):
            lines.append(f"  note: {g['note']}")
        lines.extend(f"  assumes: {a}" for a in g.get("assumptions") or ())
    return lines


def _number(value: Any, spec: str) -> str:
    """``value`` formatted with ``spec`` if it is a number, else as it is (``inf``, ``?``)."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return format(value, spec)
    return "?" if value is None else str(value)


def _app_config_keys(app_dir: Path) -> dict[str, Any]:
    """Return the app's ``[tool.flwr.app.config]`` table (empty if there is none)."""
    tomllib = _tomllib()
    try:
        data = tomllib.loads((app_dir / "pyproject.toml").read_text())
    except (OSError, ValueError):
        return {}
    config = data.get("tool", {}).get("flwr", {}).get("app", {}).get("config", {})
    return config if isinstance(config, dict) else {}


def _tomllib() -> Any:
    """``tomllib`` (Python 3.11+) or ``tomli`` (3.10, a dependency of flwr)."""
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover
        import tomli as tomllib
    return tomllib


def _parse_overrides(text: str) -> dict[str, Any]:
    tomllib = _tomllib()
    values: dict[str, Any] = {}
    for item in text.split():
        key, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"-c takes key=value pairs. Found {item!r}.")
        values[key] = tomllib.loads(f"v = {value}")["v"]
    return values


_OUTPUTS = """\
where things go:
  WORK_DIR/logs/        superlink.log, supernode-<i>.log and run-<run id>.log (the whole log
                        of the run); WORK_DIR is --work-dir or a new folder under the system's
                        temporary directory, named in the first line printed;
                        WORK_DIR/config/ holds the TOML files given to Flower and
                        WORK_DIR/home/ is its FLWR_HOME
  OUT_DIR/run-<run id>/ the app's own results, where the app writes them: the MNIST app
                        (experiments/flower_mnist) writes rounds.csv (one row per round:
                        epsilon, check-ins, reports, test accuracy when evaluated) and
                        summary.json there when --out-dir is given (or -c "out-dir='/abs'");
                        without it, it writes no file
  the console           one line per round (reports, epsilon, the proven epsilon and the
                        accuracy when evaluated, the proven epsilon at the last round)
"""


def main(argv: list[str] | None = None) -> int:
    """Command line: start a local federation, run an app once, stop everything.

    Args:
        argv: The arguments (default: ``sys.argv[1:]``).

    Returns:
        0 if the run completed, 1 otherwise.
    """
    parser = argparse.ArgumentParser(
        prog="python -m shuffle_opacus.flower.launch",
        description="Run a Flower app on loopback and stop every process afterwards.",
        epilog=_OUTPUTS,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("engine", choices=ENGINES)
    parser.add_argument("app_dir", type=Path)
    parser.add_argument("--nodes", type=int, required=True, help="number of nodes")
    parser.add_argument("-c", "--run-config", default="", help="overrides, 'k=v k2=v2'")
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds for the run")
    parser.add_argument(
        "--work-dir", type=Path, default=None, help="logs and Flower home (default: a new temp dir)"
    )
    parser.add_argument(
        "--out-dir",
        type=Path,
        default=None,
        help="sets the app's out-dir (made absolute): rounds.csv and summary.json go to "
        "OUT_DIR/run-<run id>/",
    )
    args = parser.parse_args(argv)
    try:
        overrides = _parse_overrides(args.run_config)
    except ValueError as exc:
        parser.error(str(exc))
    if args.nodes < 1:
        parser.error(f"--nodes must be an integer >= 1. Found {args.nodes}.")
    # The app's num-nodes (its population n, the accountant's n) and the nodes started must be
    # one number: --nodes sets it, and a different -c num-nodes is refused before anything starts.
    app_config = _app_config_keys(args.app_dir)
    if "num-nodes" in overrides and overrides["num-nodes"] != args.nodes:
        parser.error(
            f"-c num-nodes={overrides['num-nodes']} disagrees with --nodes {args.nodes}; give one "
            f"number (--nodes sets the app's num-nodes)."
        )
    if "num-nodes" in app_config:
        overrides["num-nodes"] = args.nodes
    if args.out_dir is not None:
        if "out-dir" not in app_config:
            parser.error(f"--out-dir: the app in {args.app_dir} has no out-dir setting.")
        if "out-dir" in overrides:
            parser.error("give the output folder once: --out-dir or -c out-dir=..., not both.")
        overrides["out-dir"] = str(args.out_dir.resolve())
    out_dir = overrides.get("out-dir", app_config.get("out-dir", ""))
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="flower-"))
    started = time.monotonic()
    printer = RoundPrinter(lambda text: print(text, flush=True))
    print(
        f"starting a local {args.engine} federation of {args.nodes} nodes "
        f"(logs in {work / 'logs'})",
        flush=True,
    )
    with LocalFederation(args.engine, num_nodes=args.nodes, work_dir=work) as federation:
        up = time.monotonic() - started
        print(f"federation up in {up:.1f} s; running {args.app_dir}", flush=True)
        outcome = federation.run(args.app_dir, overrides, timeout=args.timeout, on_line=printer)
    total_s = time.monotonic() - started
    print(f"run {outcome.run_id}: {outcome.status}")
    print(f"federation up in {up:.1f} s, run {outcome.seconds:.1f} s, total {total_s:.1f} s")
    print(f"{federation.processes_stopped} processes stopped; log {outcome.log_path}")
    results = Path(str(out_dir)) / f"run-{outcome.run_id}" if out_dir else None
    if results is not None and results.is_dir():
        print(f"results in {results} ({', '.join(sorted(p.name for p in results.iterdir()))})")
    return 0 if outcome.completed else 1


if __name__ == "__main__":
    sys.exit(main())
