"""``metrics.csv``: its columns, one row builder, and reading it back with repairs on resume."""

from __future__ import annotations

import csv
import hashlib
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from .config import ConfigError, ExperimentConfig
from .files import cause as _cause
from .plan import RunPlan, as_plan
from .session import Session

__all__: list[str] = []


def _metric_columns(plan: RunPlan | ExperimentConfig) -> list[str]:
    base = ["round", "participants", "train_loss", "test_loss", "test_accuracy"]
    return base + [f"eps_{name}" for name in as_plan(plan).curves]


def _fmt(value: float | None) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    return repr(float(value))


def _row_is_sound(plan: RunPlan, row: dict[str, str], round_number: int) -> bool:
    """Whether a ``metrics.csv`` row of a round holds every measured value that round must have.

    The epsilon columns are not judged here: :func:`_checked_epsilons` recomputes them.
    """
    try:
        if int(row["participants"]) < 0:
            return False
        for key in ("train_loss", "test_loss", "test_accuracy"):
            if row[key]:
                float(row[key])
    except ValueError:
        return False
    return bool(row["test_accuracy"]) == plan.evaluated(round_number)


def metrics_row(
    session: Session,
    round_number: int,
    participants: int,
    *,
    train_loss: float | None = None,
    test: tuple[float, float] | None = None,
) -> tuple[dict[str, str], dict[str, float | None]]:
    """Return a round's ``metrics.csv`` row and its epsilons (the one place rows are built).

    Args:
        session: The session (its curves give the epsilon columns).
        round_number: The round (1-based).
        participants: Its number of reports.
        train_loss: The participants' mean training loss, if known.
        test: ``(test loss, test accuracy)`` at an evaluation round, if known.

    Returns:
        The row as text, and the epsilons by curve (``None`` where a sparse curve skips it).
    """
    test_loss, accuracy = test if test is not None else (None, None)
    row = {
        "round": str(round_number),
        "participants": str(participants),
        "train_loss": _fmt(train_loss),
        "test_loss": _fmt(test_loss),
        "test_accuracy": _fmt(accuracy),
    }
    eps = session.curves.row(round_number, sparse=session.plan.evaluated(round_number))
    row.update({f"eps_{k}": _fmt(v) for k, v in eps.items()})
    return row, eps


def _rebuilt_row(session: Session, round_number: int) -> dict[str, str]:
    """Return a round's row as far as the checkpoint determines it (no losses, no accuracy)."""
    participants = len(session.sampler.batch(round_number - 1))
    return metrics_row(session, round_number, participants)[0]


def _epsilon_record(row: dict[str, str], names: Sequence[str]) -> bytes:
    """Return what the digest of the epsilon columns takes from a row: its round and epsilons."""
    return ",".join([row["round"], *(row[f"eps_{name}"] for name in names)]).encode() + b"\n"


def _checked_epsilons(
    session: Session,
    path: Path,
    rows: list[dict[str, str]],
    expected: str | None,
    echo: Callable[[str], None],
) -> Any:
    """Check the epsilon columns of rows ``1 .. len(rows)`` against the accountant's history.

    Epsilon after round ``t`` is a function of the history, which :func:`_check_history` has
    found to be the config's, so it is what the curves compute for ``t``, exactly as training
    writes it. When the digest of the rows' epsilon columns is ``expected`` (the one the
    checkpoint stores) and the last row recomputes to what it holds (so the accounting has not
    changed since), nothing else is recomputed. Otherwise (an edited file, or a layout 2
    checkpoint without a digest) every row's epsilons are recomputed and those that differ are
    replaced in ``rows``, with one line per column naming the file and the rounds. Nothing is
    written here.

    Returns:
        The SHA-256 object of the rows' :func:`_epsilon_record`, for the rounds that follow.
    """
    names = session.curves.names

    def computed(t: int) -> dict[str, str]:
        values = session.curves.row(t, sparse=session.plan.evaluated(t))
        return {f"eps_{name}": _fmt(value) for name, value in values.items()}

    def digest_of(table: list[dict[str, str]]) -> Any:
        digest = hashlib.sha256()
        for row in table:
            digest.update(_epsilon_record(row, names))
        return digest

    digest = digest_of(rows)
    if digest.hexdigest() == expected and rows:
        last = computed(len(rows))
        if all(rows[-1][column] == text for column, text in last.items()):
            return digest
    wrong: dict[str, list[int]] = {}
    for t, row in enumerate(rows, start=1):
        for column, text in computed(t).items():
            if row[column] != text:
                row[column] = text
                wrong.setdefault(column, []).append(t)
    for column, numbers in wrong.items():
        echo(
            f"{path}: {column} of rounds {_ranges(numbers)} did not match the accountant's "
            f"history; recomputed"
        )
    return digest_of(rows)


def _ranges(numbers: Sequence[int]) -> str:
    """``[1, 2, 3, 7]`` -> ``"1-3, 7"``."""
    parts: list[str] = []
    for n in numbers:
        if parts and parts[-1].split("-")[-1] == str(n - 1):
            parts[-1] = f"{parts[-1].split('-')[0]}-{n}"
        else:
            parts.append(str(n))
    return ", ".join(parts)


def _metrics_rows(
    session: Session, path: Path, up_to: int, participants: int, echo: Callable[[str], None]
) -> list[dict[str, str]]:
    """Return the rows of rounds ``1 .. up_to`` of ``metrics.csv``, repaired where possible.

    Rows after ``up_to`` are dropped (those rounds run again), with a message. Rows of earlier
    rounds that are missing (the whole file included), cut short or unreadable are rebuilt from
    the checkpoint by :func:`_rebuilt_row`, with a message naming them. Nothing is written here.

    Raises:
        ConfigError: one line naming the file (and line) for what cannot be interpreted: another
            header, a round that is not an integer or is out of range, a round listed twice, or
            participants that do not add up to the checkpoint's.
    """
    plan = session.plan
    columns = _metric_columns(plan)
    fix = f"restore it, or delete it to rebuild rounds 1-{up_to} from the checkpoint"
    try:
        text: str | None = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        text = None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path} cannot be read ({_cause(exc)}); {fix}") from None
    rows: dict[int, dict[str, str]] = {}
    seen: dict[int, int] = {}
    after = 0
    cut_short = False
    lines = [] if text is None else text.splitlines(keepends=True)
    if lines:
        header = next(csv.reader([lines[0]]), [])
        if header != columns:
            raise ConfigError(f"{path} has the columns {header}, this run writes {columns}; {fix}")
    for number, line in enumerate(lines[1:], start=2):
        if not line.endswith(("\n", "\r")):
            cut_short = True  # only the last line can be: a write that was cut off
            continue
        fields = next(csv.reader([line]), [])
        if not fields:
            continue
        try:
            round_number = int(fields[0])
        except ValueError:
            raise ConfigError(
                f"{path} line {number}: the round {fields[0]!r} is not an integer; {fix}"
            ) from None
        if round_number > up_to:
            after += 1
            continue
        if round_number < 1:
            raise ConfigError(f"{path} line {number}: round {round_number} is not >= 1; {fix}")
        if round_number in seen:
            raise ConfigError(
                f"{path} lists round {round_number} twice (lines {seen[round_number]} and "
                f"{number}); {fix}"
            )
        seen[round_number] = number
        row = dict(zip(columns, fields, strict=False))
        if len(fields) == len(columns) and _row_is_sound(plan, row, round_number):
            rows[round_number] = row
    missing = [r for r in range(1, up_to + 1) if r not in rows]
    if cut_short and not missing:
        after += 1  # the rows up to the checkpoint are whole: the cut row came after them
    if missing:
        for r in missing:
            rows[r] = _rebuilt_row(session, r)
        why = "the file was missing" if text is None else "missing, cut short or unreadable rows"
        echo(
            f"{path}: rounds {_ranges(missing)} rebuilt from the checkpoint ({why}): round, "
            f"participants and epsilon; their losses and accuracy are lost and left empty"
        )
    if after:
        echo(f"{path}: {after} rows after the checkpoint (round {up_to}) dropped; they run again")
    ordered = [rows[r] for r in range(1, up_to + 1)]
    listed = sum(int(row["participants"]) for row in ordered)
    if listed != participants:
        raise ConfigError(
            f"{path} lists {listed} participants in rounds 1-{up_to}, the checkpoint "
            f"{participants}; the file belongs to another run or was edited; {fix}"
        )
    return ordered
