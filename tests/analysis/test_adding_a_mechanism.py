"""A new mechanism is one module of maths plus one record, and nothing else.

This file is the proof: it defines two toy mechanisms here (a central Gaussian composed round by
round, and a randomised response accounted whole with a parameter of its own), registers their
records with :func:`~shuffle_opacus.analysis.registry.register_mechanism`, and gets their
epsilon through :func:`~shuffle_opacus.analysis.query.account` and the ``account`` command, with
their cost estimated and their work limits enforced, without changing any other file. The
records are removed again at the end of each test (:func:`~.registry.registered`).
CONTRIBUTING.md ("Adding a mechanism") points here.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest

from shuffle_opacus.analysis import costs, limits
from shuffle_opacus.analysis.mechanisms import MECHANISM_TABLE, get_mechanism
from shuffle_opacus.analysis.query import account
from shuffle_opacus.analysis.records import (
    Cost,
    Driver,
    Mechanism,
    Method,
    Parameter,
    RdpFn,
)
from shuffle_opacus.analysis.registry import (
    curve_labels,
    parameter_specs,
    register_mechanism,
    registered,
    unregister_mechanism,
)
from shuffle_opacus.analysis.results import AccountingResult
from shuffle_opacus.analysis.setting import RoundSetting
from shuffle_opacus.cli.command import main

DELTA = 1e-5

# --- the toy Gaussian: its maths, its cost, its record ------------------------------------------


def toy_gaussian_rdp(s: RoundSetting) -> RdpFn:
    """The Gaussian mechanism's RDP, lambda / (2 sigma^2), written afresh."""
    return lambda orders: np.asarray(orders, dtype=float) / (2.0 * s.sigma**2)


def toy_stage(order: int, *, n: int | None, m: int | None, rate: float | None) -> float:
    """A made-up cost: 10 ms per order."""
    return 0.01 * order


TOY_GAUSSIAN = Mechanism(
    name="toy-gaussian",
    parameters=("sigma",),
    methods=(
        Method(
            "rdp",
            toy_gaussian_rdp,
            "toy Gaussian, lambda / 2 sigma^2",
            cost=Cost(stage=toy_stage),
            label="toy Gaussian (test)",
        ),
    ),
    neighbouring="sum changes by at most the sensitivity",
    summary="a toy central Gaussian (tests only)",
    drivers=(Driver("max_order", 2), Driver("steps")),
)

# --- the toy randomised response: accounted whole, with a parameter of its own ------------------


def toy_rr_results(
    *, steps: Sequence[int], delta: float, method: str | None, **parameters: Any
) -> list[AccountingResult]:
    """Basic composition of ``reps`` eps0-LDP reports per round: epsilon = steps reps eps0."""
    eps0, reps = float(parameters["eps0"]), int(parameters["reps"])
    return [
        AccountingResult(
            mechanism="toy-rr",
            method=method or "basic",
            epsilon=k * reps * eps0,
            delta=0.0,
            steps=k,
            parameters={"eps0": eps0, "reps": reps},
            kind="approximate",
            accounting="basic composition",
            neighbouring="replace-one user",
        )
        for k in steps
    ]


def toy_rr_request(values: Any, steps: Sequence[int], base: float) -> float:
    """A made-up cost: 1 ms per report and round."""
    return base + 1e-3 * int(values["reps"]) * max(steps)


TOY_RR = Mechanism(
    name="toy-rr",
    parameters=("eps0", "reps"),
    methods=(Method("basic", None, "basic composition", cost=Cost(request=toy_rr_request)),),
    neighbouring="replace-one user",
    summary="toy randomised response, reps reports a round (tests only)",
    results=toy_rr_results,
    drivers=(Driver("reps"), Driver("steps")),
    cli=(Parameter("reps", "toy-rr: reports per user and round", kind="int"),),
)


def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    status = main(list(argv))
    out, err = capsys.readouterr()
    return status, out, err


# --- the proof ----------------------------------------------------------------------------------


def test_toy_gaussian_through_account_and_the_command(capsys: pytest.CaptureFixture[str]) -> None:
    shipped = account("gaussian", sigma=2.0, steps=[1, 50], delta=DELTA)
    with registered(TOY_GAUSSIAN):
        found = account("toy-gaussian", sigma=2.0, steps=[1, 50], delta=DELTA)
        # Same RDP as the shipped Gaussian: the same epsilon, from the toy's own function.
        assert [r.epsilon for r in found] == pytest.approx([r.epsilon for r in shipped], 1e-12)
        assert [r.mechanism for r in found] == ["toy-gaussian"] * 2
        assert found[1].epsilon > found[0].epsilon > 0

        status, out, err = _cli(
            capsys, "account", "toy-gaussian", "--sigma", "2", "--steps", "1", "50", "--json"
        )
        assert (status, err) == (0, "")
        rows = [json.loads(line) for line in out.splitlines()]
        assert [r["epsilon"] for r in rows] == [r.epsilon for r in found]
        assert [r["mechanism"] for r in rows] == ["toy-gaussian"] * 2

        with pytest.raises(SystemExit):
            main(["account", "--help"])
        out = capsys.readouterr().out
        assert ",toy-gaussian}" in out  # the mechanism's choices, built after registration
        assert "(sigma): a toy central Gaussian (tests only)" in " ".join(out.split())
        assert curve_labels(["toy-gaussian"]) == {"rdp": "toy Gaussian (test)"}
    assert "toy-gaussian" not in MECHANISM_TABLE
    with pytest.raises(ValueError, match="mechanism must be one of"):
        account("toy-gaussian", sigma=2.0, steps=1, delta=DELTA)
    status, _, err = _cli(capsys, "account", "toy-gaussian", "--sigma", "2")
    assert status == 2 and "invalid choice: 'toy-gaussian'" in err


def test_the_command_kept_from_a_call_before_registration_knows_the_toy(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # The command keeps its parser between calls (building it costs as much as a request):
    # a record registered, replaced or removed since must still be seen at the next call.
    from shuffle_opacus.cli import command

    assert _cli(capsys, "account", "gaussian", "--sigma", "2")[0] == 0
    kept = command._parser()
    assert command._parser() is kept  # nothing changed: the same parser
    with registered(TOY_GAUSSIAN):
        status, out, err = _cli(capsys, "account", "toy-gaussian", "--sigma", "2", "--json")
        assert (status, err) == (0, "") and json.loads(out)["mechanism"] == "toy-gaussian"
        assert command._parser() is not kept
        # The same name, another record: its summary, not the first one's, is in the help.
        MECHANISM_TABLE["toy-gaussian"] = dataclasses.replace(TOY_GAUSSIAN, summary="a re-made toy")
        with pytest.raises(SystemExit):
            main(["account", "--help"])
        assert "(sigma): a re-made toy" in " ".join(capsys.readouterr().out.split())
    status, _, err = _cli(capsys, "account", "toy-gaussian", "--sigma", "2")
    assert status == 2 and "invalid choice: 'toy-gaussian'" in err


def test_toy_gaussian_cost_and_work_limit(capsys: pytest.CaptureFixture[str]) -> None:
    with registered(TOY_GAUSSIAN):
        base = costs.BASE_SECONDS + 1e-4
        estimate = costs.account_seconds(
            TOY_GAUSSIAN, {"sigma": 2.0}, steps=[10], method=None, max_order=300
        )
        assert estimate == base + 0.01 * 300
        assert costs.rdp_stage_seconds(TOY_GAUSSIAN, "rdp", 300) == toy_stage(
            300, n=None, m=None, rate=None
        )
        # The record's stage cost and drivers decide the refusal: 0.0501 + 0.01 x <= 1.
        with pytest.raises(limits.WorkLimitError, match=r"^max_order must be <= 94 for toy-g"):
            account("toy-gaussian", sigma=2.0, steps=10, delta=DELTA, max_order=300, max_seconds=1)
        # The command's limit, 60 s: 0.0501 + 0.01 x <= 60.
        status, _, err = _cli(
            capsys, "account", "toy-gaussian", "--sigma", "2", "--max-order", "9000"
        )
        assert status == 2 and "--max-order must be <= 5994 for toy-gaussian" in err
        # While it runs: the automatic order range charges each stage (64 orders: 0.64 s).
        with pytest.raises(limits.WorkLimitError, match="max_order must be <= "):
            with limits.work_budget(0.5):
                from shuffle_opacus.analysis.epsilon import compute_epsilon

                compute_epsilon("toy-gaussian", steps=10, delta=DELTA, sigma=2.5)


def test_toy_rr_with_its_own_parameter(capsys: pytest.CaptureFixture[str]) -> None:
    with registered(TOY_RR):
        assert parameter_specs()["reps"].flag == "--reps"
        found = account("toy-rr", eps0=0.5, reps=3, steps=[2, 4], delta=DELTA)
        assert [r.epsilon for r in found] == [3.0, 6.0]

        status, out, err = _cli(
            capsys, "account", "toy-rr", "--eps0", "0.5", "--reps", "3", "--steps", "2", "--json"
        )
        assert (status, err) == (0, "")
        assert json.loads(out)["epsilon"] == 3.0
        status, _, err = _cli(capsys, "account", "toy-rr", "--eps0", "0.5", "--reps", "0")
        assert status == 2 and "--reps must be an integer >= 1" in err
        # Its driver first: 0.0501 + 1e-3 reps <= 60.
        status, _, err = _cli(capsys, "account", "toy-rr", "--eps0", "0.5", "--reps", "100000")
        assert status == 2 and "--reps must be <= 59949 for toy-rr" in err
        # The shipped mechanisms still refuse the new flag.
        status, _, err = _cli(capsys, "account", "gaussian", "--sigma", "1", "--reps", "2")
        assert status == 2 and "--reps is not an option of the gaussian mechanism" in err
    assert "reps" not in parameter_specs()
    status, _, err = _cli(capsys, "account", "gaussian", "--sigma", "1", "--reps", "2")
    assert status == 2 and "unrecognized arguments: --reps 2" in err


# --- what registration refuses ------------------------------------------------------------------


def _gaussian_like(**changes: Any) -> Mechanism:
    import dataclasses

    return dataclasses.replace(TOY_GAUSSIAN, **changes)


@pytest.mark.parametrize(
    ("record", "message"),
    [
        (_gaussian_like(name="gaussian"), "record.name must be a name not in the table"),
        (
            _gaussian_like(methods=(Method("rdp", toy_gaussian_rdp, "no cost"),)),
            "method rdp needs a cost with a stage",
        ),
        (
            _gaussian_like(
                methods=(Method("w", None, "whole", cost=Cost(request=toy_rr_request)),)
            ),
            "method w needs step_rdp or pld",
        ),
        (_gaussian_like(parameters=("sigma", "eps0")), "parameter eps0 of a mechanism by rounds"),
        (_gaussian_like(parameters=("n",)), "must include sigma"),
        (_gaussian_like(fallback="theorem1"), "fallback must be one of rdp"),
        (_gaussian_like(drivers=(Driver("n"),)), "driver n must be one of sigma, max_order"),
        (
            _gaussian_like(references={"central": toy_gaussian_rdp}),
            "reference_cost must be given with references",
        ),
        (
            _gaussian_like(cli=(Parameter("n", "another help", kind="int"),)),
            "cli parameter n must be described as the table does",
        ),
        (
            _gaussian_like(name="toy-2", results=toy_rr_results, parameters=("sigma", "x")),
            "parameter x must be one of",
        ),
    ],
)
def test_register_refuses_an_incomplete_record(record: Mechanism, message: str) -> None:
    before = dict(MECHANISM_TABLE)
    with pytest.raises(ValueError, match=message):
        register_mechanism(record)
    assert MECHANISM_TABLE == before


def test_unregister_refuses_a_shipped_or_unknown_mechanism() -> None:
    for name in ("gaussian", "no-such"):
        with pytest.raises(ValueError, match=r"^name must be a registered mechanism \(none\)"):
            unregister_mechanism(name)
    assert get_mechanism("gaussian").name == "gaussian"


def test_registered_removes_the_record_on_error() -> None:
    with pytest.raises(RuntimeError), registered(TOY_GAUSSIAN):
        raise RuntimeError
    assert "toy-gaussian" not in MECHANISM_TABLE


# --- the labels the experiment's figures show ---------------------------------------------------


def test_curve_labels_of_the_shipped_table() -> None:
    # As shipped in the figures (experiments/shuffle_experiments/curves.py, CURVE_LABELS).
    assert curve_labels() == {
        "pld": "shuffle, privacy loss distribution (this package)",
        "proven": "shuffle, proven bound (this package)",
        "corollary1": "shuffle, Corollary 1",
        "exact": "shuffle, Rényi bound (this package)",
        "sum": "shuffle, binomial sum (Eq. 17)",
        "theorem3": "shuffle, Theorem 3 (paper)",
        "no-shuffle": "no shuffling (Corollary 1)",
        "central": "central DP reference",
    }
    assert curve_labels(["gaussian"]) == {}
    with pytest.raises(ValueError, match="mechanism must be one of"):
        curve_labels(["no-such"])


def test_the_records_say_what_the_command_reads() -> None:
    from shuffle_opacus.accounting.protocols import PROTOCOLS

    noise = {e.name for e in MECHANISM_TABLE.values() if e.noise_multiplier}
    assert noise == {p.mechanism for p in PROTOCOLS.values()}
    for entry in MECHANISM_TABLE.values():
        assert (entry.beside_default == "proven") == ("proven" in entry.method_names)
        assert math.isfinite(
            costs.account_seconds(
                entry,
                {p: 1 if p in ("n", "m", "k") else 0.5 for p in entry.parameters},
                steps=[10],
                method=None,
                max_order=None,
            )
        )
