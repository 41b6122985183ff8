"""Every mechanism the ``account`` command knows, with its parameters and how to account it.

One :class:`CatalogueEntry` per mechanism: the Rényi-DP mechanisms of
:data:`~shuffle_opacus.analysis.mechanisms.MECHANISM_TABLE`, the approximate-DP clones baselines
and the privacy-loss-distribution mechanisms. :func:`account` checks the parameters against the
entry and returns one :class:`~shuffle_opacus.analysis.AccountingResult` per round count, so a
front end (the command line, a notebook) needs no knowledge of any single mechanism.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from .._lazy import lazy_function
from .._validation import check_delta, check_int, check_positive, check_probability, check_sigma
from .epsilon import compute_epsilon
from .limits import API_MAX_SECONDS, MAX_ORDER, check_budget, work_budget
from .mechanisms import MECHANISM_TABLE, Mechanism
from .options import CLONES_METHODS, KRR_ADVERSARIES, LDP_PAIRS, LDP_SHUFFLE_METHODS
from .results import AccountingResult

# Imported when first used: the catalogue itself stays light (see _lazy).
clones_results = lazy_function("shuffle_opacus.analysis.approximate.baselines", "clones_results")
krr_results = lazy_function("shuffle_opacus.analysis.pld.krr", "krr_results")
ldp_shuffle_results = lazy_function("shuffle_opacus.analysis.pld.ldp", "ldp_shuffle_results")

__all__ = ["CatalogueEntry", "CATALOGUE", "PARAMETERS", "account"]

PARAMETERS: tuple[str, ...] = ("n", "sigma", "eps0", "m", "rate", "k", "gamma", "adversary")
"""Every mechanism parameter, in the order results display them."""

Runner = Callable[..., list[AccountingResult]]


@dataclass(frozen=True)
class CatalogueEntry:
    """How to account one mechanism.

    Attributes:
        name: The mechanism's name.
        required: Parameters it needs.
        optional: Parameters it accepts besides those.
        methods: Its methods, the default first.
        orders: Whether it is a Rényi-DP mechanism (accepts ``max_order``).
        summary: One line for help texts.
        run: ``run(steps=..., delta=..., method=..., max_order=..., **parameters)``.
    """

    name: str
    required: tuple[str, ...]
    optional: tuple[str, ...]
    methods: tuple[str, ...]
    orders: bool
    summary: str
    run: Runner


def _rdp_entry(mechanism: Mechanism) -> CatalogueEntry:
    def run(
        *, steps: Sequence[int], delta: float, method: str | None, max_order: int | None, **p
    ) -> list[AccountingResult]:
        return [
            compute_epsilon(
                mechanism.name, steps=s, delta=delta, method=method, max_order=max_order, **p
            )
            for s in steps
        ]

    return CatalogueEntry(
        name=mechanism.name,
        required=mechanism.parameters,
        optional=(),
        methods=mechanism.method_names,
        orders=True,
        summary=mechanism.methods[0].summary,
        run=run,
    )


def _clones(
    *, steps: Sequence[int], delta: float, method: str | None, max_order: int | None, **p
) -> list[AccountingResult]:
    return clones_results(steps=steps, delta=delta, method=method or CLONES_METHODS[0], **p)


def _pld(function: Runner) -> Runner:
    def run(
        *, steps: Sequence[int], delta: float, method: str | None, max_order: int | None, **p
    ) -> list[AccountingResult]:
        return function(steps=steps, delta=delta, **p)

    return run


def _ldp_shuffle(
    *, steps: Sequence[int], delta: float, method: str | None, max_order: int | None, **p
) -> list[AccountingResult]:
    pair = LDP_PAIRS[LDP_SHUFFLE_METHODS.index(method or LDP_SHUFFLE_METHODS[0])]
    return ldp_shuffle_results(steps=steps, delta=delta, pair=pair, **p)


CATALOGUE: dict[str, CatalogueEntry] = {
    **{name: _rdp_entry(mech) for name, mech in MECHANISM_TABLE.items()},
    "clones": CatalogueEntry(
        name="clones",
        required=("n", "eps0"),
        optional=(),
        methods=CLONES_METHODS,
        orders=False,
        summary="clones bound for eps0-LDP reports (approximate DP)",
        run=_clones,
    ),
    "clones-gaussian": CatalogueEntry(
        name="clones-gaussian",
        required=("n", "sigma"),
        optional=("rate",),
        methods=CLONES_METHODS,
        orders=False,
        summary="clones bound for Gaussian reports, Theorem 3.8 (approximate DP)",
        run=_clones,
    ),
    "ldp-shuffle": CatalogueEntry(
        name="ldp-shuffle",
        required=("n", "eps0"),
        optional=("m",),
        methods=LDP_SHUFFLE_METHODS,
        orders=False,
        summary=(
            "PLD of a Feldman-McMillan-Talwar pair for eps0-LDP reports: pld, the clones pair "
            "(any eps0-LDP randomiser); pld-stronger, the 2022 pair, which its errata restrict "
            "to randomisers such as binary and k-ary randomised response"
        ),
        run=_ldp_shuffle,
    ),
    "krr": CatalogueEntry(
        name="krr",
        required=("n", "k", "gamma"),
        optional=("adversary",),
        methods=("pld",),
        orders=False,
        summary=f"PLD of shuffled k-randomised response ({' or '.join(KRR_ADVERSARIES)})",
        run=_pld(krr_results),
    ),
}
"""Every mechanism of the ``account`` command."""


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
        mechanism: A key of :data:`CATALOGUE`.
        parameters: The mechanism's parameters by name (see :data:`PARAMETERS`); ``None``
            values count as absent.
        steps: Round counts (integers >= 1), one result each.
        delta: Target delta in ``(0, 1)``.
        method: One of the entry's methods (the default when ``None``).
        max_order: Cap on the Rényi order (Rényi-DP mechanisms only), at most
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
    if mechanism not in CATALOGUE:
        raise ValueError(f"mechanism must be one of {', '.join(CATALOGUE)}. Found {mechanism!r}.")
    entry = CATALOGUE[mechanism]
    given = {k: v for k, v in parameters.items() if v is not None}
    for name in given:
        if name not in PARAMETERS:
            raise ValueError(f"{name} is not a mechanism parameter. Found {given[name]!r}.")
    for name in entry.required:
        if name not in given:
            raise ValueError(f"{name} is required for the {mechanism} mechanism.")
    for name, value in given.items():
        if name not in entry.required + entry.optional:
            raise ValueError(
                f"{name} is not a parameter of the {mechanism} mechanism. Found {value!r}."
            )
    if method is not None and method not in entry.methods:
        raise ValueError(
            f"method must be one of {', '.join(entry.methods)} for {mechanism}. Found {method!r}."
        )
    if max_order is not None:
        if not entry.orders:
            raise ValueError(f"max_order is not a parameter of the {mechanism} mechanism.")
        max_order = check_int("max_order", max_order, minimum=2, maximum=MAX_ORDER)
    counts = [check_int("steps", s, minimum=1) for s in steps]
    if not counts:
        raise ValueError("steps must list at least one round count.")
    delta = check_delta(delta)
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
        return entry.run(steps=counts, delta=delta, method=method, max_order=max_order, **given)
