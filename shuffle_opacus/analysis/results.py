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

__all__ = [
    "AccountingResult",
    "ACCOUNTING_KINDS",
    "REGIMES",
    "NO_PRIVACY_EPSILON",
    "CONVERSION_SHARE",
    "conversion_term",
]

ACCOUNTING_KINDS: tuple[str, ...] = ("rdp", "pld", "approximate")
"""How a result was obtained: Rényi DP + Lemma 2, a privacy loss distribution, or an
approximate-DP composition theorem."""

REGIMES: tuple[str, ...] = ("normal", "conversion-floor", "order-cap", "no-privacy", "no-bound")
"""What dominates a result (:attr:`AccountingResult.regime`), in the order they are checked
last to first: ``no-bound`` (epsilon is infinite), ``no-privacy`` (epsilon above
:data:`NO_PRIVACY_EPSILON`), ``order-cap`` (a Rényi optimum at the largest order evaluated),
``conversion-floor`` (a Rényi result made almost entirely of the conversion's own term) and
``normal``."""

PLD_ACCOUNTING = (
    "privacy loss distribution (dp_accounting; an upper bound in exact arithmetic, "
    "floating-point rounding not bounded)"
)
"""How PLD results describe themselves: every truncation and discretisation is pessimistic and
bounded, but the floating-point rounding of the masses and of ``dp_accounting``'s FFT
compositions is not (a few 1e-11 of the mass per round, see docs/maths.md)."""

PLD_ACCOUNTING_SYMMETRISED = (
    "privacy loss distribution of the symmetrised pair (dp_accounting; an upper bound in exact "
    "arithmetic, floating-point rounding not bounded)"
)
"""The same for the shuffle Gaussian's PLD, built from one pair that covers both orientations."""

PLD_ACCOUNTING_PROVEN = (
    "privacy loss distribution of the reports' clones or blanket pair, plus the total variation "
    "of their stand-ins (dp_accounting; an upper bound in exact arithmetic, floating-point "
    "rounding not bounded)"
)
"""How ``proven`` results describe themselves."""

NO_PRIVACY_EPSILON = 50.0
"""Epsilon above which a guarantee is reported as effectively no privacy: it lets one user's
presence change the odds of any event by a factor up to ``e^50``, about ``5e21``, more than the
number of outcomes any attacker can tell apart, so no practical inference is ruled out."""

CONVERSION_SHARE = 0.9
"""Share of epsilon above which a Rényi result is dominated by the conversion (see
:func:`conversion_term`): epsilon is then at most ``1 / 0.9`` times what Lemma 2 gives for a
mechanism with no privacy loss at all at the same order."""


def conversion_term(order: int, delta: float) -> float:
    """Lemma 2's own term at a Rényi order: the epsilon it certifies for zero RDP.

    Lemma 2 of Liew & Takahashi, "Shuffle Gaussian Mechanism for Differential Privacy"
    (arXiv:2206.09569), from Canonne, Kamath & Steinke, "The Discrete Gaussian for
    Differential Privacy" (arXiv:2004.00010, Proposition 12), turns ``(l, rho)``-RDP into
    ``(rho + c(l), delta)``-DP with

        ``c(l) = (log(1/delta) + (l - 1) log(1 - 1/l) - log(l)) / (l - 1)``.

    ``c(l)`` is the floor of the conversion at order ``l``: no mechanism, however private,
    gets a smaller epsilon from that order.

    Args:
        order: Integer Rényi order ``l >= 2``.
        delta: Delta in ``(0, 1)``.

    Returns:
        ``c(l)`` (may be negative when ``l`` is large enough).
    """
    lam = float(order)
    return (math.log(1.0 / delta) + (lam - 1.0) * math.log1p(-1.0 / lam) - math.log(lam)) / (
        lam - 1.0
    )


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
        epsilon_lower: A lower end for the epsilon of the analysed pair or bound, when the
            method has one: the clones method's certified lower bound, or for ``pld`` results
            the optimistic discretisation of the same pair (so the pair's exact epsilon lies in
            ``[epsilon_lower, epsilon]``, up to floating-point rounding).
        note: A one-line remark that changes how epsilon should be read, or ``None``.
        regime: What dominates epsilon, one of :data:`REGIMES` (derived, see :attr:`regime`).
        extra: Method-specific facts kept in the JSON output (e.g. ``tail``, ``composition``).
        sensitivity: The sensitivity convention behind ``sigma`` (what distance the noise is
            measured against), or ``None`` where the mechanism has no such parameter.
        assumptions: What the guarantee rests on beyond the neighbouring relation (one
            sentence each, e.g. that Theorem 1's pair is the worst case, or that the check-in
            coins are secret).
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
    sensitivity: str | None = None
    assumptions: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.kind not in ACCOUNTING_KINDS:
            raise ValueError(
                f"kind must be one of {', '.join(ACCOUNTING_KINDS)}. Found {self.kind!r}."
            )
        # Private copies, so that a caller's dictionary changing later cannot change the record.
        object.__setattr__(self, "parameters", dict(self.parameters))
        object.__setattr__(self, "extra", dict(self.extra))
        object.__setattr__(self, "assumptions", tuple(self.assumptions))

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

    @property
    def regime(self) -> str:
        """What dominates epsilon: one of :data:`REGIMES`.

        * ``no-bound``: epsilon is infinite (the method has no finite bound here);
        * ``no-privacy``: epsilon exceeds :data:`NO_PRIVACY_EPSILON`;
        * ``order-cap``: a Rényi result whose optimal order is the largest evaluated
          (``at_cap``), so a larger cap may give a smaller epsilon;
        * ``conversion-floor``: a Rényi result of which the conversion's own term
          :func:`conversion_term` at the chosen order makes at least :data:`CONVERSION_SHARE`
          (the composed RDP at that order is at most a tenth of epsilon). Epsilon is then what
          Lemma 2 can certify from the orders evaluated, not what the mechanism leaks; the
          mechanism may be far more private than it says;
        * ``normal``: none of these.
        """
        if not self.finite:
            return "no-bound"
        if self.epsilon > NO_PRIVACY_EPSILON:
            return "no-privacy"
        if self.kind != "rdp" or not self.order:
            return "normal"
        if self.at_cap:
            return "order-cap"
        term = conversion_term(self.order, self.delta)
        if self.epsilon > 0.0 and term >= CONVERSION_SHARE * self.epsilon:
            return "conversion-floor"
        return "normal"

    def to_dict(self) -> dict[str, Any]:
        """Return the result as a JSON-serialisable dictionary.

        Keys: ``mechanism``, ``method``, ``epsilon`` (``None`` when infinite), ``delta``,
        ``steps``, the parameters, ``order``/``max_order``/``at_cap`` for Rényi results,
        ``epsilon_lower`` when known, the ``extra`` facts, ``accounting``, ``neighbouring``,
        ``note``, ``sensitivity``, ``assumptions`` and ``regime`` (:attr:`regime`).
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
        out.update(sensitivity=self.sensitivity, assumptions=list(self.assumptions))
        out["regime"] = self.regime
        return out
