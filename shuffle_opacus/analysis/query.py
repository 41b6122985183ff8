"""Epsilon of any mechanism of the table by name: the entry point of the ``account`` command.

:func:`account` checks the parameters against the mechanism's record in
:data:`~shuffle_opacus.analysis.mechanisms.MECHANISM_TABLE`, estimates the cost before any work,
and returns one :class:`~shuffle_opacus.analysis.AccountingResult` per round count, so a front
end (the command line, a notebook) needs no knowledge of any single mechanism.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from .._validation import (
    check_int,
    check_positive,
    check_probability,
    check_sigma,
    check_target_delta,
)
from .epsilon import compute_epsilon
from .limits import API_MAX_SECONDS, MAX_ORDER, check_budget, work_budget
from .mechanisms import PARAMETERS, get_mechanism
from .results import AccountingResult

__all__ = ["account"]


def _checked(given: Mapping[str, object]) -> dict[str, object]:
    """Validate the parameters as the mechanisms do, for the cost estimate."""
    out: dict[str, object] = dict(given)
    if "n" in given:
        out["n"] = check_int("n", given["n"], minimum=1)
    if "m" in given:
        out["m"] = check_int("m", given["m"], minimum=1, maximum=out.get("n"))  # type: ignore[arg-type]
    if "k" in given:
        out["k"] = check_int("k", given["k"], minimum=2)
    if "sigma" in given:
        out["sigma"] = check_sigma(given["sigma"])
    if "eps0" in given:
        out["eps0"] = check_positive("eps0", given["eps0"])
    for name in ("rate", "gamma"):
        if name in given:
            out[name] = check_probability(name, given[name])
    return out


def account(
    mechanism: str,
    parameters: Mapping[str, object],
    *,
    steps: Sequence[int],
    delta: float,
    method: str | None = None,
    max_order: int | None = None,
    max_seconds: float | None = API_MAX_SECONDS,
) -> list[AccountingResult]:
    """Epsilon of ``mechanism`` after each round count in ``steps``.

    The cost of the request is estimated before any work (:mod:`.limits`, from measured unit
    timings); a request estimated above ``max_seconds`` is refused with a message naming the
    parameter to lower and its largest acceptable value. The automatic growth of the Rényi
    order range charges each stage to the same budget before computing it.

    Args:
        mechanism: A key of :data:`~.mechanisms.MECHANISM_TABLE`.
        parameters: The mechanism's parameters by name (see
            :data:`~.mechanisms.PARAMETERS`); ``None`` values count as absent.
        steps: Round counts (integers >= 1), one result each.
        delta: Target delta in ``[1e-200, 1)`` (a smaller one underflows the accounting).
        method: One of the mechanism's methods (the default when ``None``).
        max_order: Cap on the Rényi order (mechanisms composed by rounds only), at most
            :data:`~shuffle_opacus.analysis.limits.MAX_ORDER`.
        max_seconds: Work budget in estimated seconds (:data:`.limits.API_MAX_SECONDS` by
            default, :data:`.limits.CLI_MAX_SECONDS` for the command line); ``None`` turns the
            budget off (the order cap still applies).

    Returns:
        One :class:`~shuffle_opacus.analysis.AccountingResult` per count, in order.

    Raises:
        ValueError: for an unknown mechanism or method, a missing or extraneous parameter, an
            out-of-range value, or a request over the work budget
            (:class:`~.limits.WorkLimitError`).
    """
    entry = get_mechanism(mechanism)
    given = {k: v for k, v in parameters.items() if v is not None}
    for name in given:
        if name not in PARAMETERS:
            raise ValueError(f"{name} is not a mechanism parameter. Found {given[name]!r}.")
    for name in entry.parameters:
        if name not in given:
            raise ValueError(f"{name} is required for the {mechanism} mechanism.")
    for name, value in given.items():
        if name not in entry.parameters + entry.optional:
            raise ValueError(
                f"{name} is not a parameter of the {mechanism} mechanism. Found {value!r}."
            )
    if method is not None:
        entry.method(method)
    if max_order is not None:
        if not entry.by_rounds:
            raise ValueError(f"max_order is not a parameter of the {mechanism} mechanism.")
        max_order = check_int("max_order", max_order, minimum=2, maximum=MAX_ORDER)
    counts = [check_int("steps", s, minimum=1) for s in steps]
    if not counts:
        raise ValueError("steps must list at least one round count.")
    delta = check_target_delta(delta)
    if max_seconds is not None:
        check_budget(
            mechanism,
            _checked(given),
            steps=counts,
            method=method,
            max_order=max_order,
            budget=float(max_seconds),
        )
    with work_budget(max_seconds):
        if entry.results is not None:
            return entry.results(steps=counts, delta=delta, method=method, **given)
        return [
            compute_epsilon(
                mechanism,
                steps=k,
                delta=delta,
                method=method,
                max_order=max_order,
                **given,  # type: ignore[arg-type]
            )
            for k in counts
        ]
