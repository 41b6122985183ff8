"""The line a check-in strategy logs after each round, and reading it back.

After every round a strategy of :mod:`.checkin_base` logs one line that starts with
:data:`ROUND_LINE_PREFIX` (:func:`round_line`): the round's record as compact JSON. The lines
that carry the proven ε also carry what each ε rests on
(:func:`~.run_accounting.guarantees_record`). :func:`read_round_line` reads a record back from
any log line, as the launcher's console does. Nothing here imports flwr.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

__all__ = ["ROUND_LINE_PREFIX", "read_round_line", "round_line", "round_record"]

#: The start of the JSON line a strategy logs after every round (see :func:`round_line`).
ROUND_LINE_PREFIX = "shuffle-dp.round "


def _jsonable(value: Any) -> Any:
    """``value`` with non-finite floats as the strings ``inf``, ``-inf`` and ``nan``."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    return value


def round_record(
    server_round: int,
    num_rounds: int,
    *,
    mode: str,
    metrics: Mapping[str, float | int],
    evaluation: Mapping[str, Any] | None,
    stop_reason: str | None,
    guarantees: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Return the record of one round, as :func:`round_line` writes it.

    Args:
        server_round: The round's number.
        num_rounds: The rounds the run was started for.
        mode: The trust mode.
        metrics: The round's metrics (copied).
        evaluation: The server's evaluation after the round, or ``None``.
        stop_reason: Why the run ends early, or ``None``.
        guarantees: What each ε rests on (:func:`~.run_accounting.guarantees_record`), on the
            rounds that carry the proven ε; left out when ``None``.

    Returns:
        ``round``, ``num_rounds``, ``mode``, ``metrics``, ``evaluation``, ``stop_reason`` and,
        when given, ``guarantees``.
    """
    record: dict[str, Any] = {
        "round": server_round,
        "num_rounds": num_rounds,
        "mode": mode,
        "metrics": dict(metrics),
        "evaluation": None if evaluation is None else dict(evaluation),
        "stop_reason": stop_reason,
    }
    if guarantees is not None:
        record["guarantees"] = guarantees
    return record


def round_line(record: Mapping[str, Any]) -> str:
    """Return ``record`` as one line: :data:`ROUND_LINE_PREFIX` and compact JSON.

    Args:
        record: The round's record (``round``, ``num_rounds``, ``mode``, ``metrics``,
            ``evaluation``, ``stop_reason``, and ``guarantees`` on the lines that carry the
            proven ε); non-finite floats become ``"inf"``/``"nan"``.

    Returns:
        The line, without a newline.
    """
    return ROUND_LINE_PREFIX + json.dumps(_jsonable(record), separators=(",", ":"))


def read_round_line(line: str) -> dict[str, Any] | None:
    """Return the record of a line written by :func:`round_line`, wherever it sits in ``line``.

    Args:
        line: One line of a log (a logger's prefix before the record is allowed).

    Returns:
        The record, or ``None`` for a line without one (or whose JSON does not parse).
    """
    start = line.find(ROUND_LINE_PREFIX)
    if start < 0:
        return None
    try:
        record = json.loads(line[start + len(ROUND_LINE_PREFIX) :])
    except ValueError:
        return None
    return record if isinstance(record, dict) else None
