"""One record for every (epsilon, delta) statement the package makes.

Whatever produced it (Rényi DP and Lemma 2, a privacy loss distribution, or an approximate-DP
composition theorem), a result carries the mechanism and its parameters, the method, epsilon with
its delta, the number of rounds, how it was obtained (the Rényi order, or the loss grid), an
optional certified lower end and a note, and the neighbouring relation it holds for. The command
line prints these records as tables or JSON through one renderer.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["AccountingResult", "ACCOUNTING_KINDS"]

ACCOUNTING_KINDS: tuple[str, ...] = ("rdp", "pld", "approximate")
"""How a result was obtained: Rényi DP + Lemma 2, a privacy loss distribution, or an
approximate-DP composition theorem."""


@dataclass(frozen=True)
class AccountingResult:
    """An (epsilon, delta) statement with everything needed to interpret it.

    Attributes:
        mechanism: Mechanism name (as in ``shuffle-opacus account MECHANISM``).
        method: The bound used (e.g. ``exact``, ``theorem1``, ``numerical``, ``pld``).
        epsilon: Epsilon after ``steps`` rounds (``inf`` when no finite bound exists).
        delta: Delta of the guarantee.
        steps: Number of composed rounds.
        parameters: The mechanism's parameters in display order (``n``, ``sigma``, ``m``,
            ``rate``, ``eps0``, ``k``, ``gamma``, ``adversary``, ...); ``None`` for a parameter
            the mechanism does not have.
        kind: One of :data:`ACCOUNTING_KINDS`.
        accounting: How epsilon was obtained, in words.
        neighbouring: The neighbouring relation the guarantee is stated for.
        order: Rényi order that achieved ``epsilon`` (``rdp`` results).
        max_order: Largest order evaluated (``rdp`` results).
        at_cap: True when ``order == max_order``: the optimum may lie beyond the cap.
        epsilon_lower: A certified lower end for epsilon, when the method has one.
        note: A one-line remark that changes how epsilon should be read, or ``None``.
        extra: Method-specific facts kept in the JSON output (e.g. ``tail``, ``composition``).
    """

    mechanism: str
    method: str
    epsilon: float
    delta: float
    steps: int
    parameters: Mapping[str, Any]
    kind: str
    accounting: str
    neighbouring: str
    order: int | None = None
    max_order: int | None = None
    at_cap: bool = False
    epsilon_lower: float | None = None
    note: str | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.kind not in ACCOUNTING_KINDS:
            raise ValueError(
                f"kind must be one of {', '.join(ACCOUNTING_KINDS)}. Found {self.kind!r}."
            )
        # Private copies, so that a caller's dictionary changing later cannot change the record.
        object.__setattr__(self, "parameters", dict(self.parameters))
        object.__setattr__(self, "extra", dict(self.extra))

    def __getattr__(self, name: str) -> Any:
        """Give the mechanism's parameters as attributes (``result.n``, ``result.sigma``)."""
        parameters = self.__dict__.get("parameters", {})
        if name in parameters:
            return parameters[name]
        raise AttributeError(f"{type(self).__name__!s} has no attribute {name!r}")

    @property
    def finite(self) -> bool:
        """True when epsilon is a finite number."""
        return math.isfinite(self.epsilon)

    def to_dict(self) -> dict[str, Any]:
        """Return the result as a JSON-serialisable dictionary.

        Keys: ``mechanism``, ``method``, ``epsilon`` (``None`` when infinite), ``delta``,
        ``steps``, the parameters, ``order``/``max_order``/``at_cap`` for Rényi results,
        ``epsilon_lower`` when known, the ``extra`` facts, ``accounting``, ``neighbouring`` and
        ``note``.
        """
        out: dict[str, Any] = {
            "mechanism": self.mechanism,
            "method": self.method,
            "epsilon": self.epsilon if self.finite else None,
            "delta": self.delta,
            "steps": self.steps,
        }
        if self.kind == "rdp":
            out.update(order=self.order, max_order=self.max_order, at_cap=self.at_cap)
        out.update(self.parameters)
        if self.epsilon_lower is not None:
            out["epsilon_lower"] = self.epsilon_lower
        out.update(self.extra)
        out.update(accounting=self.accounting, neighbouring=self.neighbouring, note=self.note)
        return out
