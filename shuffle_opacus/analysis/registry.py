"""Adding a mechanism to the table, and what the command line and the figures read from all of it.

:func:`register_mechanism` checks a :class:`~.records.Mechanism` record and adds it to
:data:`~.mechanisms.MECHANISM_TABLE` (:func:`unregister_mechanism` and the :func:`registered`
block take it out again); from then on :func:`~shuffle_opacus.analysis.query.account`, the
``account`` command, the cost model and the work limits know it by its name.
:func:`parameter_specs` gives the command line every parameter's flag, :func:`curve_labels` the
figures every curve's legend label. tests/analysis/test_adding_a_mechanism.py adds a mechanism
with nothing but a record.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator

from .mechanisms import (
    _SHIPPED,
    COMMON_PARAMETERS,
    MECHANISM_TABLE,
    PARAMETERS,
    _step_table,
    get_mechanism,
)
from .records import Mechanism, Parameter
from .setting import RoundSetting

__all__ = [
    "register_mechanism",
    "unregister_mechanism",
    "registered",
    "parameter_specs",
    "curve_labels",
]

_ROUND_PARAMETERS = frozenset(RoundSetting.__dataclass_fields__)
_REQUEST_PARAMETERS = ("max_order", "steps")


def parameter_specs() -> dict[str, Parameter]:
    """Return how the command line takes every parameter of the table, by name.

    The shared ones (:data:`COMMON_PARAMETERS`) and each record's own (:attr:`Mechanism.cli`, the
    first record that describes a name), in the order of :data:`PARAMETERS`, then those of
    registered mechanisms in table order.
    """
    specs = dict(COMMON_PARAMETERS)
    for entry in MECHANISM_TABLE.values():
        for spec in entry.cli:
            specs.setdefault(spec.name, spec)
    order = [name for name in PARAMETERS if name in specs]
    order += [name for name in specs if name not in PARAMETERS]
    return {name: specs[name] for name in order}


def curve_labels(mechanisms: Iterable[str] | None = None) -> dict[str, str]:
    """Return the legend label of each curve that has one, by curve name.

    A curve is a method (:attr:`Method.label`) or a reference
    (:attr:`Mechanism.reference_labels`); a name shared by several mechanisms (``pld``) has one
    label.

    Args:
        mechanisms: The mechanisms whose curves to label (all of the table by default).

    Returns:
        ``{curve name: label}``, methods before references, in table order.

    Raises:
        ValueError: for an unknown mechanism.
    """
    entries = [
        get_mechanism(name) for name in (MECHANISM_TABLE if mechanisms is None else mechanisms)
    ]
    labels = {m.name: m.label for e in entries for m in e.methods if m.label is not None}
    for entry in entries:
        for name, label in entry.reference_labels.items():
            labels.setdefault(name, label)
    return labels


def _invalid(record: Mechanism) -> str | None:
    """Return what makes ``record`` unfit for the table (one line), or ``None``."""
    known = parameter_specs()
    own = {spec.name: spec for spec in record.cli}
    for name, spec in own.items():
        if spec.kind not in ("int", "float", "choice") or (spec.kind == "choice") != bool(
            spec.choices
        ):
            return f"cli parameter {name} must be of kind int, float or choice (with choices)"
        if name in known and known[name] != spec:
            return f"cli parameter {name} must be described as the table does (or left out)"
    names = record.method_names
    if not names or len(set(names)) != len(names):
        return "methods must be at least one, with distinct names"
    for name in record.parameters + record.optional:
        if name not in known and name not in own:
            return f"parameter {name} must be one of {', '.join(known)} or described in cli"
        if record.by_rounds and name not in _ROUND_PARAMETERS:
            rounds = ", ".join(sorted(_ROUND_PARAMETERS))
            return f"parameter {name} of a mechanism by rounds must be one of {rounds}"
    if record.by_rounds and "sigma" not in record.parameters:
        return "parameters of a mechanism by rounds must include sigma"
    for method in record.methods:
        if record.by_rounds and method.kind == "whole":
            return f"method {method.name} needs step_rdp or pld (the mechanism has no results)"
        if method.kind == "rdp" and method.cost.stage is None:
            return f"method {method.name} needs a cost with a stage (its Rényi order range)"
        if method.kind != "rdp" and method.cost.request is None:
            return f"method {method.name} needs a cost with a request"
    if record.fallback is not None and record.fallback not in names:
        return f"fallback must be one of {', '.join(names)}. Found {record.fallback!r}"
    if record.references and record.reference_cost is None:
        return "reference_cost must be given with references"
    if record.beside_default is not None and record.beside_default not in names:
        return f"beside_default must be one of {', '.join(names)}. Found {record.beside_default!r}"
    allowed = record.parameters + record.optional + _REQUEST_PARAMETERS
    for driver in record.drivers:
        if driver.name not in allowed:
            return f"driver {driver.name} must be one of {', '.join(allowed)}"
    return None


def register_mechanism(record: Mechanism) -> Mechanism:
    """Add ``record`` to :data:`MECHANISM_TABLE`, where every front end finds it by its name.

    ``account``, the command line, the cost model and the work limits then know it. The
    record must be complete: a cost for each method (a stage for Rényi-DP methods, a request
    otherwise), parameters the table or its own :attr:`Mechanism.cli` describes
    (those of a mechanism composed by rounds are the round's: ``n``, ``sigma``, ``m``,
    ``rate``), and a fallback, drivers and references that are its own. A command-line parser
    built afterwards (:func:`shuffle_opacus.cli.command.build_parser`, which
    :func:`~shuffle_opacus.cli.command.main` calls each time) offers it.

    Args:
        record: The mechanism's record, under a name not in the table.

    Returns:
        The record.

    Raises:
        ValueError: for a name already in the table or an incomplete record (one line).
    """
    if not isinstance(record, Mechanism):
        raise ValueError(f"record must be a Mechanism. Found {type(record).__name__}.")
    if not record.name or record.name in MECHANISM_TABLE:
        raise ValueError(
            f"record.name must be a name not in the table ({', '.join(MECHANISM_TABLE)}). "
            f"Found {record.name!r}."
        )
    problem = _invalid(record)
    if problem is not None:
        raise ValueError(f"record {record.name}: {problem}.")
    MECHANISM_TABLE[record.name] = record
    _step_table.cache_clear()
    return record


def unregister_mechanism(name: str) -> Mechanism:
    """Remove the mechanism ``name`` that :func:`register_mechanism` added, and return it.

    Raises:
        ValueError: for a name not in the table, or one of the shipped mechanisms.
    """
    if name not in MECHANISM_TABLE or name in _SHIPPED:
        added = ", ".join(n for n in MECHANISM_TABLE if n not in _SHIPPED) or "none"
        raise ValueError(f"name must be a registered mechanism ({added}). Found {name!r}.")
    _step_table.cache_clear()
    return MECHANISM_TABLE.pop(name)


@contextlib.contextmanager
def registered(record: Mechanism) -> Iterator[Mechanism]:
    """Register ``record`` for the duration of a ``with`` block (:func:`register_mechanism`).

    Raises:
        ValueError: as :func:`register_mechanism`.
    """
    register_mechanism(record)
    try:
        yield record
    finally:
        unregister_mechanism(record.name)
