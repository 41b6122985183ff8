"""Run the MNIST shuffle-model experiment from a validated config, with checkpoints and resume.

Without a ``clients:`` section one MNIST training image is one client and each round is a
private step of :func:`shuffle_opacus.make_private`: the sampler picks the reporting clients,
each clips the gradient of its image to ``privacy.clipping_norm`` and adds Gaussian noise, and
the server averages the reports. With one, each client trains locally on its images and
reports its clipped, noised update (:func:`shuffle_opacus.federated.make_private_clients`).
:func:`run` trains in a new run directory (``config.yaml``, ``metrics.csv``, ``checkpoint.pt``,
``summary.json``, plots); :func:`resume` continues one after a stop or a crash, bit for bit as
an uninterrupted run with the same number of threads; :func:`redraw` writes a finished run's
summary and plots without training. Every check of a resumed run (checksum, history,
``metrics.csv``, epsilon columns) runs before anything is written, and a file that cannot be
written raises :class:`RunFileError`, one line naming it.

The files, resuming and the checks: experiments/README.md ("A run's files", "Check, then write").
"""

from __future__ import annotations

import csv
import io
import json
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from shuffle_opacus.common.provenance import provenance, provenance_lines

from .checkpoint import CHECKPOINT_FORMAT, load_checkpoint, save_checkpoint
from .config import ConfigError, ExperimentConfig, load_config, validate
from .console import auto_threads, machine_load, usable_cores
from .console import progress as _progress
from .curves import PROVEN, REPLACE_ONE, curve_label
from .files import (
    CHECKPOINT_FILE,
    CONFIG_FILE,
    METRICS_FILE,
    SUMMARY_FILE,
    AppendedFile,
    RunFileError,
    write_file,
)
from .guarantee import _check_accountant, _check_curves, _check_history, guarantee_record
from .metrics_file import (
    _checked_epsilons,
    _epsilon_record,
    _metric_columns,
    _metrics_rows,
    metrics_row,
)
from .plan import RunPlan, build_plan
from .preflight import check_plan
from .rundir import (
    _make_dir,
    _point_latest_at,
    _remove_stale_temporaries,
    _run_lock,
    _write_yaml,
    new_run_dir,
)
from .session import Session, evaluate, open_session, resolve_device
from .signals import StopRequest
from .summary import summary_table

__all__ = [
    "RunFileError",
    "RunResult",
    "run",
    "resume",
    "summary_table",
    "redraw",
    "new_run_dir",
    "load_checkpoint",
    "CHECKPOINT_FORMAT",
    "METRICS_FILE",
    "CHECKPOINT_FILE",
]


@dataclass
class RunResult:
    """What a finished (or interrupted) run produced.

    Attributes:
        run_dir: The run directory.
        rounds_done: Rounds completed (and checkpointed).
        rounds: Rounds the config asks for.
        test_accuracy: Accuracy at the last evaluation (``None`` if there was none).
        epsilon: ``{accountant: epsilon}`` after ``rounds_done`` rounds.
        delta: The delta of those epsilons.
        seconds: Wall time spent training, summed over resumed sessions.
        mean_participants: Mean number of reports per round.
        plots: Files written by the plots.
        guarantee: What the run may claim (:func:`guarantee_record`): the accountant's epsilon
            and method, its optimistic estimate, the neighbouring relation, the sensitivity
            convention, the assumptions and how the seed was chosen.
        labels: The label of each curve of ``epsilon`` (:func:`~.curves.curve_label`).
        provenance: Where the run came from (:func:`shuffle_opacus.common.provenance.provenance`):
            the package's version, commit and dirtiness, the libraries' versions, the config's
            hash and the seed with whether it was given.
    """

    run_dir: Path
    rounds_done: int
    rounds: int
    test_accuracy: float | None
    epsilon: dict[str, float]
    delta: float
    seconds: float
    mean_participants: float
    plots: list[Path] = field(default_factory=list)
    guarantee: dict[str, Any] = field(default_factory=dict)
    labels: dict[str, str] = field(default_factory=dict)
    provenance: dict[str, Any] = field(default_factory=dict)

    @property
    def seconds_per_round(self) -> float:
        """Wall time per completed round (0 when nothing ran)."""
        return self.seconds / self.rounds_done if self.rounds_done else 0.0

    def to_dict(self) -> dict[str, Any]:
        """Return a JSON-serialisable dictionary."""
        out = asdict(self)
        out["run_dir"] = str(self.run_dir)
        out["plots"] = [str(p) for p in self.plots]
        out["seconds_per_round"] = self.seconds_per_round
        return out


class RunInterrupted(KeyboardInterrupt):
    """Ctrl-C honoured between rounds: the run stopped with a checkpoint at its last round.

    Attributes:
        result: What the run had produced by then (its plots drawn, no summary.json written).
    """

    def __init__(self, result: RunResult) -> None:
        super().__init__(f"interrupted after round {result.rounds_done} of {result.rounds}")
        self.result = result


def _provenance(plan: RunPlan, run_dir: Path) -> dict[str, Any]:
    """Return the run's provenance record (config hashed as saved in the run directory)."""
    saved = run_dir / CONFIG_FILE
    text = saved.read_bytes() if saved.is_file() else None
    return provenance(config_text=text, seed=plan.seed, seed_given=plan.seed_given)


def _header(session: Session, run_dir: Path, start: int) -> list[str]:
    """Return the lines printed before training: where the run is and what it will claim."""
    plan, config = session.plan, session.config
    t = config.training
    load = machine_load()
    cores = usable_cores()
    load_text = "" if load is None else f", load {load:.1f}"
    lines = [
        f"run directory   {run_dir}",
        f"config          {config.name} ({run_dir / CONFIG_FILE})",
        f"device          {session.device}, {t.threads} threads ({cores} usable cores{load_text})",
        *(f"provenance      {line}" for line in provenance_lines(_provenance(plan, run_dir))),
    ]
    free = max(1, cores - round(load)) if load is not None else cores
    if session.device.type == "cpu" and t.threads > free:
        lines.append(
            f"note            {t.threads} threads but about {free} free core(s) here: a shared "
            f"machine runs faster with --set training.threads={free} (the results then differ "
            f"in their last digits from a run with {t.threads})"
        )
    who = (
        f"rate {plan.rate}"
        if plan.rate is not None
        else f"{plan.sample_size or plan.population} a round"
    )
    lines.append(
        f"protocol        {plan.protocol.name}: {plan.population:,} clients, {who}, "
        f"{plan.rounds} rounds (from round {start + 1}), seed {plan.seed} (given: a "
        f"reproducible simulation)"
    )
    names = session.curves.names
    headline = "pld" if "pld" in names else names[0]
    # The proven bound first: _check_curves has just computed it at the last round (kept).
    proven = (
        f"; proven {session.curves.epsilon(PROVEN, plan.rounds):.6g}"
        if PROVEN in names and headline != PROVEN
        else ""
    )
    budget = session.curves.epsilon(headline, plan.rounds)
    lines.append(
        f"privacy         noise multiplier {plan.noise_multiplier}, clipping "
        f"{plan.clipping_norm}; epsilon after all rounds {budget:.6g} "
        f"({headline}, delta {plan.delta:g}){proven}"
    )
    return lines


def _train(
    plan: RunPlan,
    run_dir: Path,
    *,
    state: dict[str, Any] | None,
    progress: bool,
    stop_after: int | None,
    echo: Callable[[str], None],
    session: Session | None = None,
) -> RunResult:
    start = int(state["round"]) if state is not None else 0
    if session is None:  # a new run opens (and checks) its session before its directory
        session = open_session(plan, run_dir, start)
        if state is not None:
            try:
                session.load(state)
            except (RuntimeError, KeyError, ValueError, TypeError, IndexError) as exc:
                text = str(exc).strip()
                first = text.splitlines()[0] if text else type(exc).__name__
                raise ConfigError(
                    f"checkpoint {run_dir / CHECKPOINT_FILE} does not fit this run: {first}"
                ) from None
            _check_history(session, start, f"checkpoint {run_dir / CHECKPOINT_FILE}")
        _check_curves(session)
    seconds = float(state["seconds"]) if state is not None else 0.0
    participants_total = int(state["participants"]) if state is not None else 0
    plan, config = session.plan, session.config  # the plan over the session's population
    columns = _metric_columns(plan)
    metrics_path = run_dir / METRICS_FILE
    # Every check has passed once the rows are read and their epsilons checked; only then is
    # anything written.
    rows = _metrics_rows(session, metrics_path, start, participants_total, echo)
    expected = state.get("epsilon_sha256") if state is not None else None
    epsilon_digest = _checked_epsilons(session, metrics_path, rows, expected, echo)
    last_acc: float | None = None
    last_proven: float | None = None  # shown beside the accuracy: both change at evaluations
    for row in rows:
        if row["test_accuracy"]:
            last_acc = float(row["test_accuracy"])
        if row.get(f"eps_{PROVEN}"):
            last_proven = float(row[f"eps_{PROVEN}"])
    rounds = plan.rounds
    t = config.training
    names = plan.curves
    first_curve = REPLACE_ONE if REPLACE_ONE in names else names[0]  # the guarantee
    done = start
    for line in _header(session, run_dir, start):
        echo(line)
    bar = _progress(rounds, start, progress, echo)
    saved = start
    saved_at = time.monotonic()
    flushed_at = saved_at
    interrupted = False
    # The rows up to the checkpoint are rewritten to a temporary file and renamed into place, so
    # that a kill during the rewrite cannot lose rounds; new rounds are then appended.
    text = io.StringIO()
    writer = csv.DictWriter(text, fieldnames=columns)
    writer.writeheader()
    writer.writerows(rows)
    write_file(metrics_path, text.getvalue())
    # A finished run (resumed to rewrite its summary and plots) releases no more rounds.
    batches = session.sampler if start < rounds else ()
    with StopRequest() as stop, AppendedFile(metrics_path) as fh:
        if stop.sigint_ignored and start < rounds:
            echo(
                f"note: Ctrl-C is ignored in this process (started in the background); stop it "
                f"with kill -TERM {os.getpid()}, which finishes the round and checkpoints"
            )
        writer = csv.DictWriter(fh, fieldnames=columns)
        try:
            for t_index, indices in enumerate(batches, start=start + 1):
                began = time.perf_counter()
                loss = session.round(indices, t_index)
                seconds += time.perf_counter() - began
                done = t_index
                participants_total += len(indices)
                evaluated = done % t.eval_every == 0 or done == rounds
                test = None
                if evaluated:
                    s = session
                    test = evaluate(s.evaluated_model, s.test_x, s.test_y)
                    last_acc = test[1]
                row, eps = metrics_row(session, done, len(indices), train_loss=loss, test=test)
                writer.writerow(row)
                epsilon_digest.update(_epsilon_record(row, names))
                now = time.monotonic()
                if row["test_accuracy"] or now - flushed_at >= 1.0:
                    fh.flush()  # rows reach the file within a second: plot and tail work live
                    flushed_at = now
                shown = eps[first_curve]
                postfix = {f"eps[{first_curve}]": "-" if shown is None else f"{shown:.4g}"}
                if eps.get(PROVEN) is not None:
                    last_proven = eps[PROVEN]
                if last_proven is not None and first_curve != PROVEN:
                    # Computed at evaluation rounds only (a sparse curve): the latest, as acc.
                    postfix[f"eps[{PROVEN}]"] = f"{last_proven:.4g}"
                if last_acc is not None:
                    postfix["acc"] = f"{last_acc:.2%}"
                bar.set_postfix(postfix, refresh=False)
                bar.update(1)
                overdue = t.checkpoint_minutes and now - saved_at >= 60.0 * t.checkpoint_minutes
                if done % t.checkpoint_every == 0 or done == rounds or stop.requested or overdue:
                    fh.flush()
                    _check_history(session, done, "this session")
                    save_checkpoint(
                        session.state(
                            done, seconds, participants_total, epsilon_digest.hexdigest()
                        ),
                        run_dir / CHECKPOINT_FILE,
                    )
                    saved, saved_at = done, time.monotonic()
                if stop.requested:
                    echo(
                        f"{stop.signal_name}: stopped after round {done} with a checkpoint; "
                        f"continue with: shuffle-experiment train --resume {run_dir}"
                    )
                    raise KeyboardInterrupt
                if stop_after is not None and done >= stop_after:
                    break
        except KeyboardInterrupt:
            fh.flush()
            if not stop.requested:
                where = f"round {saved}" if saved else "no checkpoint yet"
                echo(f"interrupted; last checkpoint: {where}; continue with --resume {run_dir}")
                raise
            interrupted = True
        finally:
            bar.close()
    if interrupted:
        # Ctrl-C honoured between rounds: the checkpoint, metrics.csv and the accountant agree
        # on round ``done`` (checked when the checkpoint was written), so the summary and the
        # plots so far describe exactly what was released.
        partial = RunResult(
            run_dir=run_dir,
            rounds_done=done,
            rounds=rounds,
            test_accuracy=last_acc,
            epsilon=session.curves.row(done) if done else {},
            delta=plan.delta,
            seconds=seconds,
            mean_participants=participants_total / done if done else 0.0,
            labels={name: curve_label(name, plan) for name in session.curves.names},
        )
        if done:
            from .plots import plot_run

            partial.plots = plot_run(run_dir, plan)
            partial.guarantee = guarantee_record(plan, session.curves, done)
        raise RunInterrupted(partial)
    if done != rounds and (stop_after is None or done < stop_after):
        # Only reachable if the sampler produced fewer rounds than configured.
        raise RuntimeError(f"the sampler stopped after round {done} of {rounds}")
    result = RunResult(
        run_dir=run_dir,
        rounds_done=done,
        rounds=rounds,
        test_accuracy=last_acc,
        epsilon=session.curves.row(done),
        delta=plan.delta,
        seconds=seconds,
        mean_participants=participants_total / done if done else 0.0,
        labels={name: curve_label(name, plan) for name in session.curves.names},
    )
    if done == rounds:
        from .plots import plot_run

        _check_accountant(session, done)  # before the summary and the plots are written
        result.guarantee = guarantee_record(plan, session.curves, done)
        result.provenance = _provenance(plan, run_dir)
        result.plots = plot_run(run_dir, plan)
        write_file(run_dir / SUMMARY_FILE, json.dumps(result.to_dict(), indent=2) + "\n")
    return result


def run(
    config: ExperimentConfig,
    *,
    run_dir: Path | None = None,
    progress: bool = True,
    stop_after: int | None = None,
    echo: Callable[[str], None] = print,
) -> RunResult:
    """Train from scratch according to ``config``.

    Args:
        config: A validated config (see :func:`shuffle_experiments.config.load_config`).
        run_dir: Directory to write into (must be empty or absent); by default a new
            ``output_dir/name/<timestamp>``.
        progress: Show a progress bar.
        stop_after: Stop (with a checkpoint) after this round, as an interruption would; for
            tests and for splitting long runs.
        echo: Where messages go.

    Returns:
        A :class:`RunResult`; plots and ``summary.json`` are written once all rounds are done.

    Raises:
        ConfigError: if a value of the plan is refused (:func:`~.preflight.check_plan`, the
            library's checks, a curve that cannot be evaluated), ``run_dir`` is not empty or
            is in use, or a directory cannot be created (``output_dir`` a file, say); all but
            the last two before anything is created.
        RunFileError: if a file of the run cannot be written (a full disk).
        shuffle_experiments.data.MnistNotFoundError: if MNIST cannot be found (before anything
            is created).
    """
    config = validate(config.model_dump(mode="json"))
    if config.training.threads == "auto":
        training = config.training.model_copy(update={"threads": auto_threads()})
        config = config.model_copy(update={"training": training})
    plan = build_plan(config)  # the one reading of the config that every part of the run uses
    check_plan(plan)  # before anything is created, as the device, the data and the curves
    resolve_device(config.training.device)
    own_dir = run_dir is None
    if run_dir is not None:
        run_dir = Path(run_dir)
        if run_dir.exists() and not run_dir.is_dir():
            raise ConfigError(f"run directory {run_dir} exists and is not a directory")
        if run_dir.is_dir() and any(run_dir.iterdir()):
            raise ConfigError(f"run directory {run_dir} is not empty; use --resume to continue it")
    # The data, the model, the engine (the library's checks of the plan) and the curves.
    session = open_session(plan, run_dir or Path(config.output_dir) / config.name, 0)
    _check_curves(session)
    if run_dir is None:
        run_dir = new_run_dir(config)
    else:
        _make_dir(run_dir, "run directory")
    session.run_dir = run_dir
    with _run_lock(run_dir):
        if not own_dir and any(run_dir.iterdir()):
            raise ConfigError(f"run directory {run_dir} is not empty; use --resume to continue it")
        _write_yaml(config, run_dir / CONFIG_FILE)
        if own_dir:
            _point_latest_at(run_dir)
        return _train(
            plan,
            run_dir,
            state=None,
            progress=progress,
            stop_after=stop_after,
            echo=echo,
            session=session,
        )


def resume(
    run_dir: Path,
    *,
    progress: bool = True,
    stop_after: int | None = None,
    echo: Callable[[str], None] = print,
    allow_unsigned_checkpoint: bool = False,
) -> RunResult:
    """Continue an interrupted run from its last checkpoint, or finish a finished one.

    A run whose checkpoint is at its last round trains no more: its ``summary.json`` and plots
    are written again from the checkpoint and ``metrics.csv`` (after the same checks and
    repairs), which is how a run whose last files could not be written (a full disk) is
    completed.

    Args:
        run_dir: A run directory written by :func:`run`.
        progress: Show a progress bar.
        stop_after: As in :func:`run`.
        echo: Where messages go.
        allow_unsigned_checkpoint: Resume from a checkpoint without checksum (layout 2,
            written by an earlier version), which cannot be verified; refused otherwise.

    Returns:
        A :class:`RunResult`.

    Raises:
        ConfigError: if ``run_dir`` is in use by another session, has no config or no
            checkpoint, or its checkpoint (checksum included), config and ``metrics.csv`` do
            not fit together (one line, before anything is written).
        RunFileError: if a file of the run cannot be written (one line naming it).
    """
    return _resume(
        Path(run_dir),
        "--resume",
        progress=progress,
        stop_after=stop_after,
        echo=echo,
        allow_unsigned=allow_unsigned_checkpoint,
    )


def redraw(
    run_dir: str | Path,
    *,
    echo: Callable[[str], None] = print,
    allow_unsigned_checkpoint: bool = False,
) -> list[Path]:
    """Write a run's plots again and, for a finished run, its ``summary.json``; no training.

    A finished run (its checkpoint at the last round) is reopened as :func:`resume` does: the
    checkpoint verified, ``metrics.csv`` checked and repaired (missing rows, epsilon columns),
    the accountant compared with its curve, then the plots and ``summary.json`` written. The
    plots of any other run (interrupted, or training in another session) are drawn from
    ``metrics.csv`` as it stands; its epsilon columns are checked when it is resumed.

    Args:
        run_dir: A run directory written by :func:`run`.
        echo: Where messages go.
        allow_unsigned_checkpoint: As in :func:`resume` (a finished run's checkpoint without
            checksum is refused otherwise; an unfinished run's plots need no checkpoint).

    Returns:
        The files written.

    Raises:
        ConfigError: if ``run_dir`` is not a run directory, its checkpoint is damaged, or (a
            finished run) it does not pass the checks of :func:`resume`.
        RunFileError: if a file cannot be written (one line naming it).
    """
    run_dir = Path(run_dir)
    config_path, checkpoint = run_dir / CONFIG_FILE, run_dir / CHECKPOINT_FILE
    if config_path.is_file() and checkpoint.is_file():
        config = load_config(config_path)
        # Only its round here (said and checked again below, an unsigned one refused there).
        state = load_checkpoint(checkpoint, config, echo=lambda _: None, allow_unsigned=True)
        if int(state["round"]) >= config.training.rounds:
            result = _resume(
                run_dir,
                "plot",
                progress=False,
                stop_after=None,
                echo=echo,
                allow_unsigned=allow_unsigned_checkpoint,
            )
            return [*result.plots, run_dir / SUMMARY_FILE]
    from .plots import plot_run

    return plot_run(run_dir)


def _resume(
    run_dir: Path,
    what: str,
    *,
    progress: bool,
    stop_after: int | None,
    echo: Callable[[str], None],
    allow_unsigned: bool = False,
) -> RunResult:
    """:func:`resume`, with errors that begin with ``what`` (the command that asked)."""
    if not run_dir.is_dir():
        raise ConfigError(f"{what} {run_dir}: not a directory; is it a run directory?")
    with _run_lock(run_dir):
        config_path = run_dir / CONFIG_FILE
        if not config_path.exists():
            raise ConfigError(f"{what} {run_dir}: no {CONFIG_FILE} there; is it a run directory?")
        config = load_config(config_path)
        ckpt = run_dir / CHECKPOINT_FILE
        if not ckpt.exists():
            raise ConfigError(
                f"{what} {run_dir}: no {CHECKPOINT_FILE} yet (the run stopped before its first "
                "checkpoint); start it again"
            )
        state = load_checkpoint(ckpt, config, echo=echo, allow_unsigned=allow_unsigned)
        _remove_stale_temporaries(run_dir)
        done, rounds = int(state["round"]), config.training.rounds
        if done >= rounds:
            echo(
                f"{run_dir}: the run is complete ({done} of {rounds} rounds); writing "
                f"{SUMMARY_FILE} and the plots from the checkpoint and {METRICS_FILE}"
            )
        else:
            echo(f"resuming {run_dir} at round {done + 1} of {rounds}")
        run_dir = run_dir.resolve()  # the summary names the run's directory, not ``latest``
        return _train(
            build_plan(config),
            run_dir,
            state=state,
            progress=progress,
            stop_after=stop_after,
            echo=echo,
        )
