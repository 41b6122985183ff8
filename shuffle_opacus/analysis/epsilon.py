"""From rounds to epsilon: the default method of a mechanism, its fallback, and the records.

:func:`rounds_epsilon` composes a sequence of rounds of one mechanism of
:data:`~shuffle_opacus.analysis.mechanisms.MECHANISM_TABLE` by the method named, or by the
mechanism's default: for the shuffle mechanisms ``pld``, the tightest sound method, falling back
to the Rényi bound (:attr:`~shuffle_opacus.analysis.mechanisms.Mechanism.fallback`) with a note
where the work limits do not allow it. :func:`compute_epsilon` returns the result of identical
rounds as an :class:`~shuffle_opacus.analysis.AccountingResult`, which states the neighbouring
relation, the unit of ``sigma`` and the assumptions. docs/maths.md, "The default: ``pld``,
reported every round", gives the rule and the costs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from ..common.validation import check_delta, check_int
from .limits import (
    API_MAX_SECONDS,
    MAX_ORDER,
    PldRangeError,
    remaining_budget,
    shuffle_pld_seconds,
)
from .mechanisms import Mechanism, RoundSetting, _step_table, round_mechanism
from .rdp.conversion import EpsilonResult, epsilon_from_rdp
from .results import PLD_ACCOUNTING_PROVEN, PLD_ACCOUNTING_SYMMETRISED, AccountingResult

if TYPE_CHECKING:
    from .pld.rounds import PldEstimate

__all__ = ["rounds_epsilon", "compute_epsilon"]


def _pld_affordable(mech: Mechanism, parts: Sequence[tuple[RoundSetting, int]]) -> str | None:
    """Why the default ``pld`` cannot be used for these rounds, or ``None`` when it can."""
    low = min(s.sigma for s, _ in parts)
    if low < 0.05:
        return f"the pld method needs sigma >= 0.05 (got {low:g})"
    distinct = {
        (int(s.n or 1), s.m if s.m is not None else int(s.n or 1), s.sigma, s.rate)
        for s, _ in parts
    }
    estimate = shuffle_pld_seconds(
        sorted(distinct, key=lambda row: tuple(-1.0 if v is None else v for v in row)),
        sum(k for _, k in parts),
    )
    remaining = remaining_budget()
    limit = API_MAX_SECONDS if remaining is None else remaining
    if estimate > limit:
        return f"the pld method is estimated at {estimate:.3g} s, over the {limit:.3g} s left"
    return None


def _fallback_note(mech: Mechanism, reason: str) -> str:
    return f"{reason}; Rényi bound (method {mech.fallback}) instead"


def _run_pld(
    mech: Mechanism,
    method: str | None,
    parts: Sequence[tuple[RoundSetting, int]],
    delta: float,
    lower: bool,
) -> tuple[PldEstimate | None, str | None]:
    """Evaluate ``pld`` if it is the method asked for (or the affordable default).

    Returns:
        ``(estimate, None)`` when ``pld`` was used; ``(None, note)`` when the default falls back
        to :attr:`Mechanism.fallback` (``note`` says why); ``(None, None)`` when another method
        was asked for.

    Raises:
        ValueError: when ``pld`` was asked for by name and cannot evaluate the setting.
    """
    chosen = mech.method(method)
    if chosen.pld is None:
        return None, None
    if method is not None or mech.fallback is None:
        return chosen.pld(parts, delta, lower), None
    reason = _pld_affordable(mech, parts)
    if reason is not None:
        return None, _fallback_note(mech, reason)
    try:
        return chosen.pld(parts, delta, lower), None
    except PldRangeError as exc:  # a setting the engines cannot hold: the Rényi bound can
        return None, _fallback_note(mech, str(exc).rstrip("."))


def rounds_epsilon(
    mechanism: str,
    rounds: Sequence[tuple[RoundSetting, int]],
    *,
    delta: float,
    method: str | None = None,
    reference: str | None = None,
    max_order: int | None = None,
    lower: bool = False,
) -> EpsilonResult:
    """Epsilon of a sequence of rounds, by the mechanism's default method or the one named.

    The default of the shuffle mechanisms is ``pld`` (the rounds' privacy loss distributions
    composed, :mod:`.pld.rounds`), falling back to the Rényi bound where the work limits do not
    allow it (the result's ``note`` says why). Rényi-DP methods add the rounds' RDP at each
    order (Mironov 2017, Proposition 1) and convert by Lemma 2, the order chosen by
    :func:`~.rdp.conversion.epsilon_from_rdp`. Per-round tables and PMFs are cached, so
    asking again after more rounds (an accountant's ``get_epsilon``, a curve evaluated every
    round) costs only the composition or the conversion.

    Args:
        mechanism: A mechanism of :data:`~.mechanisms.MECHANISM_TABLE` composed round by round.
        rounds: ``(setting, steps)`` pairs, settings from :meth:`Mechanism.setting`.
        delta: Target delta in ``(0, 1)``.
        method: A method of the mechanism (the default when ``None``).
        reference: A reference curve instead of a method (``no-shuffle`` or ``central``).
        max_order: Optional cap on the Rényi order (Rényi-DP methods, and the fallback).
        lower: For ``pld``, also compute the optimistic estimate (``epsilon_lower``).

    Returns:
        An :class:`~.rdp.conversion.EpsilonResult` with the method used; epsilon 0 at
        order 0 when there are no rounds.

    Raises:
        ValueError: on an invalid argument.
    """
    mech = round_mechanism(mechanism)
    delta = check_delta(delta)
    if reference is not None and method is not None:
        raise ValueError(
            f"give a method or a reference, not both. Found {method!r}, {reference!r}."
        )
    if reference is not None:
        mech.reference(reference)
    else:
        mech.method(method)
    if max_order is not None:
        max_order = check_int("max_order", max_order, minimum=2, maximum=MAX_ORDER)
        if method is not None and mech.method(method).kind == "pld":
            raise ValueError(f"max_order applies to Rényi-DP methods, not to the {method} method.")
    parts = [(s, check_int("steps", k, minimum=0)) for s, k in rounds]
    parts = [(s, k) for s, k in parts if k > 0]
    named = reference is None and method is not None
    if not parts:
        empty = mech.method(method).name if reference is None else None
        if reference is None and method is None and mech.fallback and max_order is not None:
            empty = mech.fallback
        return EpsilonResult(
            epsilon=0.0, delta=delta, order=0, max_order=0, at_cap=False, method=empty
        )
    note = None
    if reference is None:
        if method is None and max_order is not None and mech.fallback is not None:
            # An order cap asks for a Rényi bound: the default's Rényi fallback.
            curve: str = mech.fallback
        else:
            estimate, note = _run_pld(mech, method, parts, delta, lower)
            if estimate is not None:
                return EpsilonResult(
                    epsilon=estimate.epsilon,
                    delta=delta,
                    order=0,
                    max_order=0,
                    at_cap=False,
                    method=mech.method(method).name,
                    epsilon_lower=estimate.epsilon_lower,
                    details=estimate.details,
                )
            curve = mech.method(method).name if named or note is None else mech.fallback  # type: ignore[assignment]
    else:
        curve = reference

    def total(orders: np.ndarray) -> np.ndarray:
        top = max(2, int(orders[-1]))
        out = np.zeros(orders.shape)
        for setting, steps in parts:
            out = out + steps * _step_table(mech.name, curve, setting, top)[orders - 2]
        return out

    res = epsilon_from_rdp(total, delta=delta, max_order=max_order)
    return EpsilonResult(
        epsilon=res.epsilon,
        delta=delta,
        order=res.order,
        max_order=res.max_order,
        at_cap=res.at_cap,
        method=None if reference is not None else curve,
        note=note,
    )


def proven_note(details: dict[str, object]) -> str:
    """One line on how a ``proven`` result was obtained: its route and how delta was spent.

    Args:
        details: The ``details`` of a ``proven`` estimate.

    Returns:
        The line.
    """
    route = details.get("route")
    spent = f"delta {details.get('delta_pld', 0.0):.2g} to the PLD"
    if route == "gaussian":
        return f"route gaussian (the local Gaussian alone beats the shuffle bounds); {spent}"
    level = (
        f"eps0 {details.get('eps0'):.4g}"
        if route == "clones"
        else f"blanket weight {details.get('blanket_weight'):.3g}"
    )
    return (
        f"route {route}, {level}; {spent}, {details.get('delta_coupling', 0.0):.2g} to the "
        "stand-ins"
    )


def compute_epsilon(
    mechanism: str,
    *,
    sigma: float,
    steps: int,
    delta: float,
    n: int | None = None,
    m: int | None = None,
    rate: float | None = None,
    method: str | None = None,
    max_order: int | None = None,
) -> AccountingResult:
    """Epsilon of ``steps`` rounds of ``mechanism`` at ``delta``, as a result record.

    By the mechanism's default method (for the shuffle mechanisms ``pld``, which also reports
    its optimistic estimate as ``epsilon_lower``, falling back to the Rényi bound with a note
    where the work limits do not allow it) or the method named. Rényi-DP methods compose the
    rounds' RDP and convert by Lemma 2.

    Args:
        mechanism: A mechanism of :data:`~.mechanisms.MECHANISM_TABLE` composed round by round.
        sigma: Noise parameter (see the module docstring for its unit).
        steps: Number of rounds composed (integer >= 1).
        delta: Target delta in ``(0, 1)``.
        n: Population size (shuffle mechanisms).
        m: Users per round (``subsampled``).
        rate: Check-in rate (``checkin``) or Poisson rate (``subsampled-gaussian``).
        method: Bound to use; the mechanism's default by default.
        max_order: Cap on the Rényi order (Rényi-DP methods; with the default method of a
            shuffle mechanism it selects the Rényi fallback). A warning
            (:class:`~shuffle_opacus.analysis.OrderCapWarning`) is issued when the optimum sits
            at the cap.

    Returns:
        An :class:`~shuffle_opacus.analysis.AccountingResult` (``kind`` ``pld`` or ``rdp``).

    Raises:
        ValueError: on any invalid argument.
    """
    mech = round_mechanism(mechanism)
    mech.method(method)
    setting = mech.setting(sigma=sigma, n=n, m=m, rate=rate)
    steps = check_int("steps", steps, minimum=1)
    delta = check_delta(delta)
    res = rounds_epsilon(
        mech.name, [(setting, steps)], delta=delta, method=method, max_order=max_order, lower=True
    )
    common = {
        "mechanism": mech.name,
        "epsilon": res.epsilon,
        "delta": delta,
        "steps": steps,
        "parameters": setting.as_dict(),
        "neighbouring": mech.neighbouring,
        "note": res.note,
        "sensitivity": mech.sigma_unit,
        "assumptions": mech.assumptions_of(res.method if res.method in mech.method_names else None),
    }
    if res.method == "proven":
        details = dict(res.details or {})
        common["note"] = proven_note(details)
        return AccountingResult(
            method="proven",
            kind="pld",
            accounting=PLD_ACCOUNTING_PROVEN,
            extra=details,
            **common,  # type: ignore[arg-type]
        )
    if res.method == "pld" and setting.n is not None:  # pld: the shuffle mechanisms, n given
        from .pld.shuffle_gaussian import pld_discretization, pld_tail

        grid = pld_discretization(n=setting.n, sigma=setting.sigma, rate=setting.rate, m=setting.m)
        return AccountingResult(
            method="pld",
            kind="pld",
            accounting=PLD_ACCOUNTING_SYMMETRISED,
            epsilon_lower=res.epsilon_lower,
            extra={"discretization": grid, "tail": pld_tail(delta, steps)},
            **common,  # type: ignore[arg-type]
        )
    return AccountingResult(
        method=res.method or mech.default_method,
        kind="rdp",
        accounting="Rényi DP composed, converted by Lemma 2",
        order=res.order,
        max_order=res.max_order,
        at_cap=res.at_cap,
        **common,  # type: ignore[arg-type]
    )
