"""Text and JSON for result records: the one renderer of the command line.

:func:`table` lays out any list of :class:`~shuffle_opacus.analysis.AccountingResult` records
(whatever produced them) as aligned columns, with a footer stating the neighbouring relation and
how epsilon was obtained; :func:`json_lines` gives one JSON object per record.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

from ..analysis.results import CONVERSION_SHARE, NO_PRIVACY_EPSILON, AccountingResult

__all__ = ["table", "json_lines", "grid", "fmt", "calibration_text"]


def fmt(value: object) -> str:
    """Format one cell: ``-`` for ``None``, six significant digits for floats."""
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)


def grid(headers: Sequence[str], body: Sequence[Sequence[str]]) -> str:
    """Left-aligned columns under a header and a rule."""
    widths = [max(len(h), *(len(row[i]) for row in body)) for i, h in enumerate(headers)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip()]
    lines.append("  ".join("-" * w for w in widths))
    for row in body:
        lines.append("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
    return "\n".join(lines)


def _epsilon_cell(result: AccountingResult) -> str:
    if result.finite:
        return f"{result.epsilon:.6f}"
    return f"n/a ({result.note})" if result.note else "inf"


#: The note-column marker of each regime other than ``normal``, and its footnote.
REGIME_NOTES: dict[str, tuple[str, str]] = {
    "conversion-floor": (
        "[conversion floor]",
        "[conversion floor]: at least {share:.0%} of epsilon is Lemma 2's own term at that "
        "order, (log(1/delta) + (l-1) log(1-1/l) - log l)/(l-1); the mechanism may be far more "
        "private than epsilon says",
    ),
    "order-cap": (
        "[order cap]",
        "[order cap]: the optimal Rényi order is the largest evaluated; a larger --max-order may "
        "give a smaller epsilon",
    ),
    "no-privacy": (
        "[no privacy]",
        "[no privacy]: epsilon > {threshold:g} allows a change of odds by more than e^{threshold:g}"
        " (a valid bound, but effectively no privacy guarantee)",
    ),
}


#: The footnote of the ``lower`` column.
LOWER_NOTE = (
    "lower: the optimistic estimate of the same pair or bound (docs/maths.md); its exact "
    "epsilon lies in [lower, epsilon]"
)


def _note_cell(result: AccountingResult) -> str:
    parts = [REGIME_NOTES[result.regime][0]] if result.regime in REGIME_NOTES else []
    if result.note and result.finite:
        parts.append(result.note)
    return "; ".join(parts)


def table(results: Sequence[AccountingResult]) -> str:
    """Lay out result records as a table.

    Columns: mechanism, method, the parameters (in the order they first appear), steps, delta,
    epsilon, the Rényi order for Rényi-DP results (``(cap)`` when it sits at the order cap) and
    a note column when a finite result carries a note or an edge regime (a marker of
    :data:`REGIME_NOTES`, see :attr:`~shuffle_opacus.analysis.AccountingResult.regime`).
    Footer lines state, for each distinct kind of result, the neighbouring relation, the unit of
    privacy and the accounting; a line above them explains each marker used.

    Args:
        results: At least one record.

    Returns:
        The table as text (no trailing newline).

    Raises:
        ValueError: if ``results`` is empty.
    """
    if not results:
        raise ValueError("results must hold at least one AccountingResult. Found none.")
    names: list[str] = []
    for r in results:
        names.extend(k for k in r.parameters if k not in names)
    rdp = any(r.kind == "rdp" for r in results)
    notes = any(_note_cell(r) for r in results)
    lower = any(r.epsilon_lower is not None for r in results)
    headers = ["mechanism", "method", *names, "steps", "delta", "epsilon"]
    headers += ["lower"] * lower + ["order"] * rdp + ["note"] * notes
    body = []
    for r in results:
        row = [r.mechanism, r.method, *(fmt(r.parameters.get(k)) for k in names)]
        row += [str(r.steps), fmt(r.delta), _epsilon_cell(r)]
        if lower:
            row.append("-" if r.epsilon_lower is None else f"{r.epsilon_lower:.6f}")
        if rdp:
            row.append("-" if r.order is None else f"{r.order}{' (cap)' if r.at_cap else ''}")
        if notes:
            row.append(_note_cell(r))
        body.append(row)
    footers: list[str] = []
    for r in results:
        lines = [f"neighbouring: {r.neighbouring}; unit of privacy: one user; {r.accounting}"]
        if "tail" in r.extra:
            lines[0] += f"; left-out mass (budget {r.extra['tail']:.3g} per round) added to delta"
        if r.sensitivity:
            lines.append(f"sensitivity: {r.sensitivity}")
        lines += [f"assumes: {a}" for a in r.assumptions]
        footers.extend(line for line in lines if line not in footers)
    marks = [
        footnote.format(share=CONVERSION_SHARE, threshold=NO_PRIVACY_EPSILON)
        for regime, (_, footnote) in REGIME_NOTES.items()
        if any(r.regime == regime for r in results)
    ]
    if lower:
        marks.append(LOWER_NOTE)
    return "\n".join([grid(headers, body), *marks, *footers])


def _plain(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def json_lines(results: Sequence[AccountingResult]) -> str:
    """One JSON object per record (:meth:`~shuffle_opacus.analysis.AccountingResult.to_dict`)."""
    return "\n".join(json.dumps({k: _plain(v) for k, v in r.to_dict().items()}) for r in results)


def calibration_text(row: Mapping[str, Any]) -> str:
    """Return the summary of a noise calibration (``shuffle-opacus calibrate``).

    Three lines (the noise multiplier, its epsilon, the setting), then the neighbouring relation,
    the sensitivity convention and one line per assumption.
    """
    lines = [
        f"noise_multiplier  {row['noise_multiplier']:.6g}  (local sigma: each client's noise "
        "std / C; give it to account as --noise-multiplier)",
        f"epsilon           {row['epsilon']:.6f} <= {row['target_epsilon']:g} at "
        f"delta={row['delta']:g}",
        f"setting           {row['protocol']}, n={row['n']}, rate={row['rate']:g}, "
        f"rounds={row['rounds']}, sensitivity={row['sensitivity']:g} C, "
        f"method={row['method']}",
    ]
    if "neighbouring" in row:
        lines.append(f"neighbouring      {row['neighbouring']}; unit of privacy: one client")
    if "sensitivity_convention" in row:
        lines.append(f"sensitivity       {row['sensitivity_convention']}")
    lines += [f"assumes           {a}" for a in row.get("assumptions", ())]
    return "\n".join(lines)
