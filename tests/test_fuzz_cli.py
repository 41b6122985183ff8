"""Fuzzing the ``shuffle-opacus`` command: every option of every subcommand with hostile values.

Each call runs :func:`shuffle_opacus.cli.command.main` in-process and must either succeed (status 0,
output on stdout) or fail cleanly: status 2, exactly one line on stderr that starts with the
program name, no traceback. Expensive requests must be refused by the work limits before any
computation starts (their timings are measured in benchmarks/limits.py, not here). A few calls
go through a subprocess to check the installed entry point as a user meets it. Values tried:
negative, zero, NaN, infinities, huge, subnormal and non-numeric, plus missing, extraneous,
repeated and conflicting flags; a derandomised hypothesis search adds random argument lists
over the same vocabulary.
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shuffle_opacus.analysis import query
from shuffle_opacus.analysis.mechanisms import MECHANISM_TABLE
from shuffle_opacus.cli.command import PROG, main

#: Hostile values for any numeric option.
BAD_VALUES = ("-1", "0", "nan", "inf", "-inf", "1e400", "1e308", "abc", "", "0x10", "1e-320")
#: Huge but well-formed values: these parse, so the work limits must answer them.
HUGE = {
    "--n": "1000000000000",
    "--m": "1000000000000",
    "--steps": "1000000000000",
    "--max-order": "1000000000000",
    "--k": "1000000000000",
    "--rounds": "1000000000000",
}

#: A cheap valid call of every mechanism.
#: (Rényi-DP mechanisms with a small order cap, so that accepted extreme values stay cheap.)
VALID = {
    "shuffle": ["--n", "100", "--sigma", "2", "--max-order", "32"],
    "subsampled": ["--n", "100", "--m", "10", "--sigma", "2", "--max-order", "32"],
    "checkin": ["--n", "100", "--rate", "0.1", "--sigma", "2", "--max-order", "32"],
    "gaussian": ["--sigma", "2", "--max-order", "32"],
    "subsampled-gaussian": ["--rate", "0.1", "--sigma", "2", "--max-order", "32"],
    "clones": ["--n", "1000", "--eps0", "1"],
    "clones-gaussian": ["--n", "100", "--sigma", "2"],
    "ldp-shuffle": ["--n", "1000", "--eps0", "1"],
    "krr": ["--n", "100", "--k", "3", "--gamma", "0.5"],
}
#: The grid's calibration names the Rényi bound (cheap whatever the values); the default method,
#: pld, is called once with a valid and once with an unreachable target (end of the grid).
CALIBRATE = ["calibrate", "full", "--n", "100", "--rounds", "2", "--epsilon", "8", "--method",
             "theorem1"]  # fmt: skip
COMMON = ("--delta", "--steps", "--max-order", "--method", "--adversary")
NUMERIC_FLAGS = ("--n", "--sigma", "--eps0", "--m", "--rate", "--k", "--gamma")


def _replace(args: list[str], flag: str, value: str) -> list[str]:
    """``args`` with ``flag`` set to ``value`` (appended when absent)."""
    out = list(args)
    if flag in out:
        out[out.index(flag) + 1] = value
    else:
        out += [flag, value]
    return out


def _account_cases() -> list[list[str]]:
    cases: list[list[str]] = []
    for mechanism, args in VALID.items():
        cases.append(["account", mechanism, *args])
        for flag in (*NUMERIC_FLAGS, *COMMON):
            for value in (*BAD_VALUES, HUGE.get(flag, "1e12")):
                cases.append(["account", mechanism, *_replace(args, flag, value)])
        for i in range(0, len(args), 2):  # each required flag missing
            cases.append(["account", mechanism, *args[:i], *args[i + 2 :]])
        cases.append(["account", mechanism, *args, "--method", "pld", "--max-order", "10"])
        cases.append(["account", mechanism, *args, *args])  # every flag twice
        cases.append(["account", mechanism, *args, "--steps"])  # flag without a value
        cases.append(["account", mechanism, *args, "--steps", "1", "1", "--json"])
        cases.append(["account", mechanism, *args, "--bogus", "1"])
    return cases


def _calibrate_cases() -> list[list[str]]:
    cases = [list(CALIBRATE)]
    flags = ("--n", "--rounds", "--epsilon", "--delta", "--rate", "--m", "--sensitivity")
    for flag in flags:
        for value in (*BAD_VALUES, HUGE.get(flag, "1e12")):
            cases.append(_replace(CALIBRATE, flag, value))
    cases += [
        ["calibrate", "checkin", "--n", "100", "--rounds", "2", "--epsilon", "8"],  # no --rate
        ["calibrate", "subsampled", "--n", "100", "--rounds", "2", "--epsilon", "8", "--m", "200"],
        [*CALIBRATE, "--rate", "0.5"],  # --rate on the full protocol
        [*CALIBRATE, "--method", "exact"],  # a method of another protocol
        [*CALIBRATE[:2], "--rounds", "2", "--epsilon", "8"],  # no --n
        [*CALIBRATE, "--epsilon", "1e-300"],  # unreachable target
        ["calibrate", "full", "--n", "100", "--rounds", "2", "--epsilon", "2"],  # the default
        ["calibrate", "checkin", "--n", "1000000000000", "--rate", "0.5"]
        + ["--rounds", "10", "--epsilon", "1", "--method", "sum"],
        ["calibrate", "full", "--n", "1000000000000", "--rounds", "1000000000000"]
        + ["--epsilon", "1", "--method", "pld"],
    ]
    return cases


OTHER_CASES = [[], ["bogus"], ["account"], ["calibrate"], ["account", "bogus"], ["--n", "3"]]
CASES = [*_account_cases(), *_calibrate_cases(), *OTHER_CASES]


def _check_call(argv: list[str], capsys: pytest.CaptureFixture[str]) -> int:
    """Run one call and check the contract; return its status."""
    code = main(argv)
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err, argv
    assert code in (0, 2), (argv, code)
    if code == 2:
        lines = err.splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"{PROG}: error: "), (argv, err)
        assert out == "", argv
    else:
        assert out.strip(), argv
        assert all(line.startswith(f"{PROG}: note: ") for line in err.splitlines()), (argv, err)
    return code


def test_every_option_with_hostile_values(
    capsys: pytest.CaptureFixture[str], pytestconfig: pytest.Config
) -> None:
    """The whole grid: one clean answer per call; the tally is printed with ``-s``."""
    statuses, failures = [], []
    for argv in CASES:
        try:
            statuses.append(_check_call(argv, capsys))
        except (AssertionError, Exception) as exc:  # collect them all, then fail
            failures.append(f"{argv}: {type(exc).__name__}: {str(exc)[:200]}")
    assert not failures, "\n".join(failures)
    for argv in [["account", m, *args] for m, args in VALID.items()] + [CALIBRATE]:
        assert _check_call(argv, capsys) == 0, argv
    errors = statuses.count(2)
    if pytestconfig.getoption("capture") == "no":  # pytest -s: show the tally
        with capsys.disabled():
            print(
                f"\nCLI fuzz grid: {len(CASES)} inputs, {errors} clean errors, "
                f"{len(CASES) - errors} ok"
            )
    assert errors > len(CASES) // 2  # most of the grid is invalid on purpose


@pytest.mark.parametrize(
    ("argv", "names"),
    [
        (
            ["account", "shuffle", "--n", "60000", "--sigma", "1", "--max-order", "1000000"],
            "--max-order",
        ),
        (["account", "ldp-shuffle", "--n", "1000000000", "--eps0", "4"], "--n must be <= "),
        (
            ["account", "krr", "--n", "1000000000000", "--k", "4", "--gamma", "0.25"],
            "--n must be <= ",
        ),
        (
            ["account", "clones", "--n", "1000", "--eps0", "4", "--steps", "100000000000"],
            "--steps must be <= ",
        ),
        (
            [
                "account",
                "shuffle",
                "--n",
                "60000",
                "--sigma",
                "1",
                "--method",
                "pld",
                "--steps",
                "1000000000000",
            ],
            "--steps must be <= ",
        ),
    ],
)
def test_expensive_requests_are_refused_up_front(
    argv: list[str], names: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # "Up front": the refusal comes from the cost estimate, before any mechanism starts work
    # (how long the accepted requests take is measured in benchmarks/limits.py).
    def no_work(**_: object) -> None:
        raise AssertionError("the computation started before the request was refused")

    monkeypatch.setattr(query, "compute_epsilon", no_work)
    for name, entry in MECHANISM_TABLE.items():
        if entry.results is not None:
            monkeypatch.setitem(MECHANISM_TABLE, name, dataclasses.replace(entry, results=no_work))
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert names in err and err.count("\n") == 1


TOKENS = st.sampled_from(
    [
        "account", "calibrate", *MECHANISM_TABLE, "full", "checkin", "subsampled",
        "--n", "--sigma", "--eps0", "--m", "--rate", "--k", "--gamma", "--adversary", "--method",
        "--delta", "--steps", "--max-order", "--json", "--rounds", "--epsilon", "--sensitivity",
        "strong", "weak", "pld", "exact", "sum", "paper", "replace-one",
        *BAD_VALUES, "1", "2", "0.5", "1e-5", "3", "100", "1e9",
    ]
)  # fmt: skip


@settings(
    max_examples=150,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(argv=st.lists(TOKENS, max_size=12))
def test_random_argument_lists(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    _check_call(argv, capsys)


def test_entry_point_in_a_subprocess() -> None:
    """As a user meets it: one line on stderr, status 2, nothing on stdout."""
    proc = subprocess.run(
        [sys.executable, "-m", "shuffle_opacus.cli", "account", "shuffle", "--n", "60000"]
        + ["--sigma", "1", "--max-order", "1000000"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith(f"{PROG}: error: ")
