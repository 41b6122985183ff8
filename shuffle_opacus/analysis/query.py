"""Epsilon of any mechanism of the table by name: the front door of :mod:`shuffle_opacus.analysis`.

:func:`account` checks the parameters against the mechanism's record in
:data:`~shuffle_opacus.analysis.mechanisms.MECHANISM_TABLE`, estimates the cost before any work,
and answers with :class:`~shuffle_opacus.analysis.AccountingResult` records (one for a round
count, one per count for several), so a front end (the command line, a notebook) needs no
knowledge of any single mechanism.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import overload

from ..common.validation import (
    check_int,
    check_positive,
    check_probability,
    check_sigma,
    check_target_delta,
)
from .epsilon import compute_epsilon
from .limits import API_MAX_SECONDS, MAX_ORDER, check_budget, work_budget
from .mechanisms import get_mechanism
from .registry import parameter_specs
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


@overload
def account(
    mechanism: str,
    parameters: Mapping[str, object] | None = None,
    *,
    steps: int,
    delta: float,
    method: str | None = None,
    max_order: int | None = None,
    max_seconds: float | None = API_MAX_SECONDS,
    **named: object,
) -> AccountingResult: ...


@overload
def account(
    mechanism: str,
    parameters: Mapping[str, object] | None = None,
    *,
    steps: Sequence[int],
    delta: float,
    method: str | None = None,
    max_order: int | None = None,
    max_seconds: float | None = API_MAX_SECONDS,
    **named: object,
) -> list[AccountingResult]: ...


def account(
    mechanism: str,
    parameters: Mapping[str, object] | None = None,
    *,
    steps: int | Sequence[int],
    delta: float,
    method: str | None = None,
    max_order: int | None = None,
    max_seconds: float | None = API_MAX_SECONDS,
    **named: object,
) -> AccountingResult | list[AccountingResult]:
    """Epsilon of ``mechanism`` after ``steps`` rounds: the one way to ask for an epsilon.

    Any mechanism of the table, by its default method or the one named, answers here with a
    record that names the mechanism, its parameters, the method, epsilon with its delta and the
    neighbouring relation. ``steps`` an integer asks one question and gets one record; a
    sequence of counts gets one record per count, in order, and shares the per-round work
    between them (one PLD or one Rényi table per round setting, composed for each count).

    The cost of the request is estimated before any work (:mod:`.limits`, from measured unit
    timings); a request estimated above ``max_seconds`` is refused with a message naming the
    parameter to lower and its largest acceptable value. The automatic growth of the Rényi
    order range charges each stage to the same budget before computing it.

    Example::

        from shuffle_opacus.analysis import account

        res = account("shuffle", n=1000, sigma=2.0, steps=100, delta=1e-5)
        print(res.epsilon, res.method, res.neighbouring)

    Args:
        mechanism: A key of :data:`~.mechanisms.MECHANISM_TABLE`.
        parameters: The mechanism's parameters by name (see :func:`~.registry.parameter_specs`),
            as a mapping; ``None`` values count as absent. They may also be given as keywords
            (``named``), but a name only once.
        steps: A round count (integer >= 1), or a sequence of them.
        delta: Target delta in ``[1e-200, 1)`` (a smaller one underflows the accounting).
        method: One of the mechanism's methods (the default when ``None``).
        max_order: Cap on the Rényi order (mechanisms composed by rounds only), at most
            :data:`~shuffle_opacus.analysis.limits.MAX_ORDER`.
        max_seconds: Work budget in estimated seconds (:data:`.limits.API_MAX_SECONDS` by
            default, :data:`.limits.CLI_MAX_SECONDS` for the command line); ``None`` turns the
            budget off (the order cap still applies).
        **named: The mechanism's parameters as keywords (``n=1000, sigma=2.0``).

    Returns:
        One :class:`~shuffle_opacus.analysis.AccountingResult` when ``steps`` is an integer;
        a list of them, one per count in order, when it is a sequence.

    Raises:
        ValueError: for an unknown mechanism or method, a missing, extraneous or repeated
            parameter, an out-of-range value, or a request over the work budget
            (:class:`~.limits.WorkLimitError`).
    """
    single = isinstance(steps, (str, bytes)) or not isinstance(steps, Iterable)
    given_all: dict[str, object] = dict(parameters or {})
    for name, value in named.items():
        if given_all.get(name) is not None:
            raise ValueError(f"{name} is given twice: in parameters and as a keyword.")
        given_all[name] = value
    results = _account(
        mechanism,
        given_all,
        steps=[steps] if single else list(steps),  # type: ignore[arg-type]
        delta=delta,
        method=method,
        max_order=max_order,
        max_seconds=max_seconds,
    )
    return results[0] if single else results


def _account(
    mechanism: str,
    parameters: Mapping[str, object],
    *,
    steps: Sequence[object],
    delta: float,
    method: str | None,
    max_order: int | None,
    max_seconds: float | None,
) -> list[AccountingResult]:
    """:func:`account` with the parameters gathered and ``steps`` a list."""
    entry = get_mechanism(mechanism)
    given = {k: v for k, v in parameters.items() if v is not None}
    known = parameter_specs()
    for name in given:
        if name not in known:
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
            entry,
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
