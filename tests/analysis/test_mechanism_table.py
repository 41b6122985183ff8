"""One table says what a mechanism is: the command line, ``account`` and the protocols read it.

These fail if a second table of mechanisms comes back (a catalogue beside the table), if a method
is reached through a module path stored as a string again, or if the package's front door grows
back the four flavours of every PLD mechanism.
"""

from __future__ import annotations

import inspect

import pytest

import shuffle_opacus.analysis as analysis
from shuffle_opacus import PROTOCOLS
from shuffle_opacus.analysis import MECHANISM_TABLE, account
from shuffle_opacus.analysis import methods as method_functions
from shuffle_opacus.analysis.epsilon import compute_epsilon
from shuffle_opacus.analysis.mechanisms import PARAMETERS, per_step_rdp
from shuffle_opacus.cli.command import build_parser


def test_the_command_line_offers_exactly_the_mechanisms_of_the_table() -> None:
    parser = build_parser()
    account_parser = parser._subparsers._group_actions[0].choices["account"]  # type: ignore[union-attr]
    mechanism = next(a for a in account_parser._actions if a.dest == "mechanism")
    assert tuple(mechanism.choices) == tuple(MECHANISM_TABLE)


def test_every_protocol_names_a_mechanism_composed_round_by_round() -> None:
    for protocol in PROTOCOLS.values():
        assert MECHANISM_TABLE[protocol.mechanism].by_rounds
        assert MECHANISM_TABLE[protocol.mechanism].sigma_unit is not None


def test_records_are_complete_and_name_known_parameters() -> None:
    for name, mech in MECHANISM_TABLE.items():
        assert mech.name == name
        assert mech.methods and mech.summary and mech.neighbouring
        assert set(mech.parameters + mech.optional) <= set(PARAMETERS)
        if mech.by_rounds:
            # every method of a round-by-round mechanism is a Rényi curve or a PLD
            assert all(m.kind in ("rdp", "pld") for m in mech.methods), name
            if mech.fallback is not None:
                assert mech.method(mech.fallback).kind == "rdp"
        else:
            assert all(m.kind == "whole" for m in mech.methods), name
            assert not mech.references and mech.fallback is None


def test_methods_are_functions_of_the_methods_module_not_strings() -> None:
    for mech in MECHANISM_TABLE.values():
        functions = [m.step_rdp for m in mech.methods] + [m.pld for m in mech.methods]
        functions += [*mech.references.values(), mech.results]
        for fn in functions:
            if fn is None:
                continue
            assert inspect.isfunction(fn), (mech.name, fn)
            assert fn.__module__ == method_functions.__name__, (mech.name, fn)


def test_mechanisms_accounted_as_a_whole_are_refused_by_the_round_functions() -> None:
    with pytest.raises(ValueError, match=r"clones is accounted as a whole: use account\(\)"):
        compute_epsilon("clones", sigma=1.0, n=100, steps=1, delta=1e-5)
    with pytest.raises(ValueError, match="krr is accounted as a whole"):
        per_step_rdp("krr", sigma=1.0, n=100)
    # ... and account() takes every mechanism of the table
    out = account("clones", {"n": 1000, "eps0": 1.0}, steps=[1, 2], delta=1e-6)
    assert [r.steps for r in out] == [1, 2]
    assert account("gaussian", {"sigma": 2.0}, steps=[3], delta=1e-5)[0].mechanism == "gaussian"


def test_the_front_door_is_the_table_and_account() -> None:
    names = set(analysis.__all__)
    # one function answers for every mechanism: no family flavour (*_epsilon, *_pld, *_delta,
    # *_results) at the top; they live in their subpackages (tests/analysis/test_front_door.py)
    assert not {n for n in names if n.endswith(("_epsilon", "_pld", "_delta", "_results"))}
    assert {"MECHANISM_TABLE", "account", "AccountingResult"} <= names
    assert "CATALOGUE" not in names and not hasattr(analysis, "CATALOGUE")
    assert len(names) <= 10


@pytest.mark.parametrize(
    ("mechanism", "parameters"),
    [
        ("clones", {"n": 1000, "eps0": 1.0}),
        ("clones-gaussian", {"n": 1000, "sigma": 2.0, "rate": 0.1}),
        ("ldp-shuffle", {"n": 1000, "eps0": 1.0}),
        ("krr", {"n": 1000, "k": 4, "gamma": 0.5}),
    ],
)
def test_mechanisms_accounted_as_a_whole_state_their_assumptions(mechanism, parameters) -> None:
    # Their table records leave the assumptions to the results (they depend on the method).
    (result,) = account(mechanism, parameters, steps=[1], delta=1e-6)
    assert result.neighbouring == "replace-one user"
    assert any("shuffle" in a or "shuffled" in a for a in result.assumptions), result.assumptions
