"""The end-of-run summary printed by ``shuffle-experiment train``: where, how long, epsilon."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .runner import RunResult

__all__ = ["summary_table"]


def summary_table(result: RunResult) -> str:
    """Return the end-of-run summary as aligned text."""
    lines = [
        f"run directory   {result.run_dir}",
        f"rounds          {result.rounds_done} of {result.rounds} "
        f"(mean {result.mean_participants:,.1f} reports per round)",
        f"training time   {result.seconds:,.1f} s ({result.seconds_per_round:.3f} s per round)",
    ]
    if result.test_accuracy is not None:
        lines.append(f"test accuracy   {result.test_accuracy:.2%}")
    g = result.guarantee
    if g:
        lower = g.get("epsilon_lower")
        bracket = f"; optimistic estimate {lower:.6g}" if lower is not None else ""
        lines.append(
            f"epsilon         {g['epsilon']:.6g} at delta={g['delta']:g} ({g['method']}{bracket})"
        )
        if g.get("proven"):
            lines.append(f"proven          {_proven_text(g['proven'], g['delta'])}")
        lines.append(f"guarantee       {g['neighbouring']}, unit of privacy: {g['unit']}")
        lines.append(f"sensitivity     {g['sensitivity']}")
        lines.extend(f"assumes         {a}" for a in g["assumptions"])
        lines.append(f"seed            {g['seed']}")
        if g.get("note"):
            lines.append(f"note            {g['note']}")
        if g.get("convention"):
            c = g["convention"]
            lines.append(f"convention      epsilon {c['epsilon']:.6g} with {c['sensitivity']}")
    lines.append("")
    labels = {name: result.labels.get(name, name) for name in result.epsilon}
    width = max(len(label) for label in labels.values())
    lines.append(f"{'accountant'.ljust(width)}  epsilon at delta={result.delta:g}")
    for name, eps in result.epsilon.items():
        lines.append(f"{labels[name].ljust(width)}  {eps:.6g}")
    if g and g.get("rests_on"):
        lines.append(f"rests on        {g['rests_on']}")
    if result.plots:
        lines.append("")
        lines.extend(f"plot            {p}" for p in result.plots if p.suffix == ".png")
    return "\n".join(lines)


def _proven_text(proven: dict[str, Any], delta: float) -> str:
    """Return the summary's proven line after its key: epsilon, route and delta's split."""
    split = ""
    if proven.get("delta_pld") is not None:
        split = f"; delta {proven['delta_pld']:.3g} to the PLD"
        if proven.get("delta_coupling"):
            split += f", {proven['delta_coupling']:.3g} to the stand-ins"
    return f"{proven['epsilon']:.6g} at delta={delta:g} (proven: {proven['route_text']}{split})"
