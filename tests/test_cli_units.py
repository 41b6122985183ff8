"""One noise unit on the command line: calibrate's output pastes into account and gives it back.

Before, ``account --sigma`` took the analysis sigma (half the noise multiplier under replace-one)
while ``calibrate`` printed the noise multiplier, so chaining the two understated epsilon (by 7.5
times at the review's setting). These tests fail on the old command line: it had no
``--noise-multiplier``, its default was the Rényi bound, and its records named no assumption.
"""

from __future__ import annotations

import json

import pytest

from shuffle_opacus.analysis.epsilon import compute_epsilon
from shuffle_opacus.cli.command import main


def run(capsys, *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize(
    ("protocol", "flags", "method", "target"),
    [
        # The default, pld, with 50 clients: at 2000 (rate 0.05) the search's pld pairs cost
        # 4 s of CPU instead of 1.5 s.
        ("checkin", ["--n", "50", "--rate", "0.2"], [], 0.5),
        ("subsampled", ["--n", "2000", "--m", "100"], ["--method", "theorem2"], 2.0),
        (
            "checkin",
            ["--n", "2000", "--rate", "0.05", "--sensitivity", "1.5"],
            ["--method", "exact"],
            0.5,
        ),
    ],
)
def test_calibrate_output_pastes_into_account_and_gives_back_the_target(
    capsys, protocol, flags, method, target
):
    code, out, _ = run(
        capsys, "calibrate", protocol, *flags, *method, "--rounds", "60", "--epsilon", str(target),
        "--json",
    )  # fmt: skip
    assert code == 0
    row = json.loads(out)
    assert row["method"] == (method[1] if method else "pld") and row["epsilon"] <= target
    code, out, _ = run(
        capsys, "account", protocol, *flags, *method, "--noise-multiplier",
        repr(row["noise_multiplier"]), "--steps", "60", "--json",
    )  # fmt: skip
    assert code == 0
    back = json.loads(out.splitlines()[0])  # the default's row; a proven row follows it
    assert back["method"] == row["method"]
    assert back["epsilon"] == pytest.approx(row["epsilon"], rel=1e-12)
    assert target * (1 - 5e-3) <= back["epsilon"] <= target  # calibrate's tolerance
    assert back["noise_multiplier"] == row["noise_multiplier"]
    assert back["sigma"] == pytest.approx(row["noise_multiplier"] / row["sensitivity"])
    # The old mistake, the noise multiplier read as the analysis sigma, understates epsilon.
    code, out, _ = run(
        capsys, "account", protocol, *[f for f in flags if f not in ("--sensitivity", "1.5")],
        *method, "--sigma", repr(row["noise_multiplier"]), "--steps", "60", "--json",
    )  # fmt: skip
    assert json.loads(out.splitlines()[0])["epsilon"] < 0.7 * target


def test_noise_multiplier_with_paper_sensitivity_is_the_sigma_and_labelled(capsys):
    code, out, err = run(
        capsys,
        "account",
        "checkin",
        "--n",
        "1000",
        "--rate",
        "0.1",
        "--noise-multiplier",
        "2",
        "--sensitivity",
        "paper",
        "--steps",
        "10",
        "--json",
    )
    assert code == 0
    row, proven = (json.loads(line) for line in out.splitlines())
    assert proven["method"] == "proven"
    assert any("within 1 C of every other" in a for a in proven["assumptions"])
    direct = compute_epsilon("checkin", n=1000, rate=0.1, sigma=2.0, steps=10, delta=1e-5)
    assert row["epsilon"] == pytest.approx(direct.epsilon, rel=1e-12)
    assert "paper's convention" in row["sensitivity"]
    assert any("within 1 C of every other" in a for a in row["assumptions"])


@pytest.mark.parametrize(
    ("extra", "fragment"),
    [
        (["--noise-multiplier", "2", "--sigma", "1"], "not both"),
        (["--sigma", "1", "--sensitivity", "paper"], "--sensitivity applies to --noise-multiplier"),
        (["--noise-multiplier", "0"], "--noise-multiplier must be"),
        (["--noise-multiplier", "1e-200"], "--noise-multiplier / --sensitivity"),
        (["--noise-multiplier", "2", "--sensitivity", "3"], "--sensitivity must be"),
        ([], "--noise-multiplier or --sigma is required"),
    ],
)
def test_noise_unit_errors_are_one_line(capsys, extra, fragment):
    code, out, err = run(capsys, "account", "checkin", "--n", "100", "--rate", "0.1", *extra)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and fragment in err


def test_noise_multiplier_is_refused_for_central_mechanisms(capsys):
    code, _, err = run(capsys, "account", "gaussian", "--noise-multiplier", "2")
    assert code == 2 and "--noise-multiplier is not an option of the gaussian" in err


def test_account_default_is_pld_with_bracket_and_assumptions(capsys):
    code, out, err = run(
        capsys, "account", "checkin", "--n", "1000", "--rate", "0.1", "--noise-multiplier", "2",
        "--steps", "20",
    )  # fmt: skip
    assert code == 0 and err == ""
    lines = out.splitlines()
    header, row = lines[0].split(), lines[2].split()
    assert row[header.index("method")] == "pld"
    epsilon, lower = float(row[header.index("epsilon")]), float(row[header.index("lower")])
    assert 0 < lower <= epsilon
    renyi = compute_epsilon("checkin", n=1000, rate=0.1, sigma=1.0, steps=20, delta=1e-5,
                            method="exact")  # fmt: skip
    assert epsilon < renyi.epsilon
    assert any(line.startswith("sensitivity: replace-one") for line in lines)
    assert any("Theorem 1's pair" in line and line.startswith("assumes:") for line in lines)
    assert any("sampling coins are secret" in line for line in lines)


def test_calibrate_prints_the_guarantee(capsys):
    # The setting of the first case of the paste test above, whose search built the pld pairs
    # this one needs.
    code, out, _ = run(
        capsys, "calibrate", "checkin", "--n", "50", "--rate", "0.2", "--rounds", "60",
        "--epsilon", "0.5",
    )  # fmt: skip
    assert code == 0
    assert "method=pld" in out and "replace-one" in out and "assumes" in out
    assert "give it to account as --noise-multiplier" in out
