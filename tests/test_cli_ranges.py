"""Extreme values at the command line and the front doors: each refusal names the user's own
flag or parameter and its range, and no numpy warning reaches the terminal (issue 41, part 6)."""

from __future__ import annotations

import warnings

import pytest

import shuffle_opacus
from shuffle_opacus import history_epsilon
from shuffle_opacus.analysis import account
from shuffle_opacus.cli.command import main
from shuffle_opacus.common.validation import MIN_DELTA


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize(
    "args",
    [
        ["account", "shuffle", "--n", "1000", "--sigma", "1"],
        ["account", "checkin", "--n", "1000", "--sigma", "1", "--rate", "0.1"],
        ["account", "clones-gaussian", "--n", "1000", "--sigma", "1", "--rate", "1"],
        ["account", "ldp-shuffle", "--n", "1000", "--eps0", "1"],
        ["calibrate", "checkin", "--n", "1000", "--rate", "0.1", "--rounds", "9", "--epsilon", "1"],
    ],
)
@pytest.mark.parametrize("delta", ["1e-320", "1e-201"])
def test_a_delta_below_the_floor_names_the_flag_and_its_range(capsys, args, delta):
    # Before: "tail must be a finite number > 0. Found 0.0.", "delta must be in (0, 1). Found
    # 0.0." (a derived delta) or "math domain error" (calibrate).
    code, out, err = run(capsys, *args, "--delta", delta)
    assert code == 2 and out == ""
    assert err == (
        f"shuffle-opacus: error: --delta must be in [1e-200, 1) (a smaller delta underflows the "
        f"accounting's arithmetic). Found {delta!r}.\n"
    )


def test_the_floor_itself_is_accepted(capsys):
    code, out, _ = run(capsys, "account", "gaussian", "--sigma", "1", "--delta", "1e-200")
    assert code == 0 and "gaussian" in out
    assert MIN_DELTA == 1e-200


@pytest.mark.parametrize(
    "call",
    [
        lambda: history_epsilon(
            [(1.0, 0.1, 3)], protocol="checkin", delta=1e-320, population=100, method="exact"
        ),
        lambda: account("gaussian", {"sigma": 1.0}, steps=[1], delta=1e-320),
        lambda: shuffle_opacus.calibrate(
            target_epsilon=1.0, delta=1e-320, population=100, rounds=2, rate=0.1
        ),
    ],
)
def test_the_front_doors_name_delta_and_its_range(call):
    with pytest.raises(ValueError, match=r"^delta must be in \[1e-200, 1\) .* Found 1e-320\.$"):
        call()


def test_an_unreachable_calibration_names_epsilon_not_an_api_argument(capsys):
    # Before: "target_epsilon=1.0 is not reached with noise_multiplier <= 10000.0; raise
    # target_epsilon or max_noise_multiplier." (the command has neither).
    code, out, err = run(
        capsys, "calibrate", "checkin", "--n", "1000", "--rate", "0.1", "--rounds", "10",
        "--epsilon", "1", "--method", "theorem3",
    )  # fmt: skip
    assert code == 2 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("shuffle-opacus: error: --epsilon must be >= 1.129")
    assert "for --method theorem3" in lines[0] and lines[0].endswith("Found 1.")
    assert "max_noise_multiplier" not in err and "target_epsilon" not in err
    # The bound is the epsilon at the largest noise multiplier: that target is met there.
    floor = float(lines[0].split(">= ")[1].split()[0])
    found = shuffle_opacus.calibrate(
        target_epsilon=floor * 1.0001, delta=1e-5, population=1000, rounds=10, rate=0.1,
        method="theorem3",
    )  # fmt: skip
    assert found.epsilon <= floor * 1.0001


def test_the_api_names_the_smallest_reachable_target():
    with pytest.raises(
        shuffle_opacus.accounting.calibration.UnreachableTargetError,
        match=r"not reached with noise_multiplier <= 64.0: target_epsilon must be >= \S+ \(the "
        r"epsilon at noise_multiplier 64.0\), or raise max_noise_multiplier\.$",
    ) as caught:
        shuffle_opacus.calibrate(
            target_epsilon=1.0, delta=1e-5, population=1000, rounds=10, rate=0.1,
            method="theorem3", max_noise_multiplier=64.0, max_seconds=None,
        )  # fmt: skip
    assert caught.value.reached > 1.0


def test_ldp_shuffle_with_a_large_eps0_prints_no_numpy_warning(capsys):
    # Before: "RuntimeWarning: invalid value encountered in divide" (the 0 / 0 of outcomes that
    # neither side of the subsampled pair reaches; masked out of the result, so unchanged).
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        code, out, err = run(
            capsys, "account", "ldp-shuffle", "--n", "200", "--eps0", "50", "--m", "100", "--json"
        )
    assert code == 0 and err == ""
    expected = account("ldp-shuffle", {"n": 200, "eps0": 50.0, "m": 100}, steps=[1], delta=1e-5)
    assert f'"epsilon": {expected[0].epsilon!r}' in out
