"""The ``shuffle-opacus account`` command: output formats, conventions and every error path."""

import json
import subprocess
import sys

import pytest

from shuffle_opacus.analysis.epsilon import compute_epsilon
from shuffle_opacus.cli.command import build_parser, main


def run(capsys, *args):
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def test_table_output_has_one_row_per_steps(capsys):
    code, out, err = run(
        capsys,
        "account",
        "checkin",
        "--n",
        "6000",
        "--rate",
        "0.1",
        "--sigma",
        "5",
        "--steps",
        "1",
        "500",
        "--delta",
        "1e-5",
    )
    assert code == 0
    lines = out.strip().splitlines()
    assert lines[0].split()[:3] == ["mechanism", "method", "n"]
    rows = [line for line in lines[2:] if line.startswith("checkin")]
    # One tight row and one proven row per round count, the proven one right after.
    assert [row.split()[1] for row in rows] == ["pld", "proven", "pld", "proven"]
    want = compute_epsilon("checkin", n=6000, rate=0.1, sigma=5, steps=500, delta=1e-5)
    assert f"{want.epsilon:.6f}" in rows[2] and want.method == "pld"
    proven = compute_epsilon(
        "checkin", n=6000, rate=0.1, sigma=5, steps=500, delta=1e-5, method="proven"
    )
    assert f"{proven.epsilon:.6f}" in rows[3] and proven.epsilon > want.epsilon
    assert any(line.startswith("neighbouring: replace-one user") for line in lines)
    assert any(line.startswith("assumes: Theorem 1's pair") for line in lines)
    assert any(line.startswith("assumes: proven from published theorems") for line in lines)
    assert lines[-1].startswith("guarantees: proven rests on published theorems only")
    assert err == ""


def test_account_method_pld_prints_the_tight_row_alone(capsys):
    code, out, _ = run(
        capsys,
        "account",
        "checkin",
        "--n",
        "1000",
        "--rate",
        "0.1",
        "--sigma",
        "2",
        "--steps",
        "10",
        "--method",
        "pld",
    )
    assert code == 0
    rows = [line for line in out.splitlines() if line.startswith("checkin")]
    assert [row.split()[1] for row in rows] == ["pld"]
    assert "guarantees:" not in out


@pytest.mark.parametrize(
    ("args", "mechanism", "method"),
    [
        (["shuffle", "--n", "2000", "--sigma", "3"], "shuffle", "pld"),
        (
            ["shuffle", "--n", "60000", "--sigma", "9.48", "--method", "theorem1"],
            "shuffle",
            "theorem1",
        ),
        (
            ["shuffle", "--n", "60000", "--sigma", "9.48", "--method", "corollary1"],
            "shuffle",
            "corollary1",
        ),
        (["subsampled", "--n", "1000", "--m", "100", "--sigma", "2"], "subsampled", "pld"),
        (
            ["subsampled", "--n", "1000", "--m", "100", "--sigma", "2", "--method", "theorem2"],
            "subsampled",
            "theorem2",
        ),
        (
            ["checkin", "--n", "1000", "--rate", "0.1", "--sigma", "2", "--method", "theorem3"],
            "checkin",
            "theorem3",
        ),
        (
            ["checkin", "--n", "1000", "--rate", "0.1", "--sigma", "2", "--method", "sum"],
            "checkin",
            "sum",
        ),
        (["gaussian", "--sigma", "3"], "gaussian", "rdp"),
        (["subsampled-gaussian", "--rate", "0.01", "--sigma", "1.1"], "subsampled-gaussian", "rdp"),
    ],
)
def test_json_rows(capsys, args, mechanism, method):
    code, out, _ = run(capsys, "account", *args, "--steps", "3", "10", "--json")
    assert code == 0
    every = [json.loads(line) for line in out.strip().splitlines()]
    rows = [r for r in every if r["method"] != "proven"]
    assert [r["steps"] for r in rows] == [3, 10]
    # The default of a shuffle mechanism has its proven row after each of its rows.
    proven = [r for r in every if r["method"] == "proven"]
    assert len(proven) == (2 if method == "pld" else 0)
    for tight, bound in zip(rows, proven, strict=False):
        assert bound["steps"] == tight["steps"] and bound["epsilon"] >= tight["epsilon"]
    for r in rows:
        assert {"mechanism", "method", "epsilon", "delta", "steps", "assumptions"} <= set(r)
        assert ("order" in r) == (method != "pld")
        assert ("epsilon_lower" in r) == (method == "pld")
        assert r["mechanism"] == mechanism and r["method"] == method
        assert r["delta"] == 1e-5
    assert rows[0]["epsilon"] <= rows[1]["epsilon"]


def test_table1_value_with_cap_warns(capsys):
    code, out, err = run(
        capsys,
        "account",
        "shuffle",
        "--n",
        "60000",
        "--sigma",
        "9.48",
        "--delta",
        str(1 / 60000),
        "--max-order",
        "30",
        "--json",
    )
    assert code == 0
    row = json.loads(out)
    assert round(row["epsilon"], 5) == 0.22820  # Liew & Takahashi, Table 1
    assert row["order"] == 30 and row["at_cap"] is True
    assert "note:" in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["shuffle", "--n", "0", "--sigma", "1"], "--n must be an integer >= 1"),
        (["shuffle", "--n", "2.5", "--sigma", "1"], "--n must be an integer >= 1"),
        (["shuffle", "--n", "abc", "--sigma", "1"], "--n must be an integer >= 1"),
        (["shuffle", "--n", "10", "--sigma", "0"], "--sigma must be a finite number > 0"),
        (["shuffle", "--n", "10", "--sigma", "-1"], "--sigma must be a finite number > 0"),
        (["shuffle", "--n", "10", "--sigma", "nan"], "--sigma must be a finite number > 0"),
        (["shuffle", "--n", "10", "--sigma", "1", "--delta", "1"], "--delta must be in (0, 1)"),
        (["shuffle", "--n", "10", "--sigma", "1", "--delta", "0"], "--delta must be in (0, 1)"),
        (["checkin", "--n", "10", "--sigma", "1", "--rate", "1.5"], "--rate must be in (0, 1]"),
        (["checkin", "--n", "10", "--sigma", "1", "--rate", "0"], "--rate must be in (0, 1]"),
        (
            ["subsampled", "--n", "10", "--m", "11", "--sigma", "1"],
            "m must be an integer in [1, 10]",
        ),
        (
            ["shuffle", "--n", "10", "--sigma", "1", "--steps", "0"],
            "--steps must be an integer >= 1",
        ),
        (
            ["shuffle", "--n", "10", "--sigma", "1", "--max-order", "1"],
            "--max-order must be an integer >= 2",
        ),
        (["shuffle", "--sigma", "1"], "--n is required for the shuffle mechanism"),
        (["checkin", "--n", "10", "--sigma", "1"], "--rate is required for the checkin mechanism"),
        (
            ["shuffle", "--n", "10", "--sigma", "1", "--rate", "0.1"],
            "--rate is not an option of the shuffle mechanism",
        ),
        (["shuffle", "--n", "10", "--sigma", "1", "--method", "exact"], "method must be one of"),
        (["bogus", "--sigma", "1"], "invalid choice"),
        (["shuffle", "--n", "10"], "required"),
    ],
)
def test_errors_are_one_line(capsys, args, fragment):
    code, out, err = run(capsys, "account", *args)
    assert code == 2
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("shuffle-opacus: error: ")
    assert fragment in lines[0]
    assert "Traceback" not in err


def test_command_does_not_import_torch():
    code = (
        "import sys; from shuffle_opacus.cli.command import main; "
        "rc = main(['account', 'shuffle', '--n', '100', '--sigma', '2', '--json']); "
        "assert 'torch' not in sys.modules and 'opacus' not in sys.modules, 'torch imported'; "
        "sys.exit(rc)"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert [json.loads(line)["method"] for line in proc.stdout.splitlines()] == ["pld", "proven"]


def test_module_entry_point_exit_status():
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "shuffle_opacus.cli",
            "account",
            "shuffle",
            "--n",
            "-3",
            "--sigma",
            "1",
        ],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip() == "shuffle-opacus: error: --n must be an integer >= 1. Found '-3'."


def test_calibrate_meets_the_target_and_matches_the_library(capsys):
    from shuffle_opacus import calibrate_noise_multiplier, history_epsilon

    code, out, err = run(
        capsys,
        "calibrate",
        "checkin",
        "--n",
        "60000",
        "--rate",
        "0.1",
        "--rounds",
        "5540",
        "--epsilon",
        "1",
        "--sensitivity",
        "paper",
        "--json",
    )
    assert code == 0, err
    row = json.loads(out)
    sigma = calibrate_noise_multiplier(
        target_epsilon=1.0,
        delta=1e-5,
        population=60000,
        rounds=5540,
        rate=0.1,
        sensitivity="paper",
    )
    assert row["noise_multiplier"] == sigma
    assert row["epsilon"] <= 1.0
    eps = history_epsilon(
        [(sigma, 0.1, 5540)], protocol="checkin", delta=1e-5, population=60000, sensitivity=1.0
    )
    assert row["epsilon"] == eps.epsilon
    # Replace-one adjacency halves the analysis sigma, so it needs twice the noise multiplier.
    code, out, _ = run(
        capsys, "calibrate", "checkin", "--n", "60000", "--rate", "0.1", "--rounds", "5540",
        "--epsilon", "1", "--json",
    )  # fmt: skip
    assert json.loads(out)["noise_multiplier"] == pytest.approx(2 * sigma, rel=2e-3)


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["checkin", "--n", "100", "--rounds", "5", "--epsilon", "1"], "--rate is required"),
        (
            [
                "checkin",
                "--n",
                "100",
                "--rate",
                "0.1",
                "--m",
                "3",
                "--rounds",
                "5",
                "--epsilon",
                "1",
            ],
            "--m is not an option",
        ),
        (["subsampled", "--n", "100", "--rounds", "5", "--epsilon", "1"], "--m is required"),
        (
            ["subsampled", "--n", "10", "--m", "11", "--rounds", "5", "--epsilon", "1"],
            "--m must be an integer in [1, 10]",
        ),
        (["full", "--n", "100", "--rounds", "0", "--epsilon", "1"], "--rounds must be an integer"),
        (["full", "--n", "100", "--rounds", "5", "--epsilon", "-1"], "--epsilon must be"),
        (
            ["full", "--n", "100", "--rounds", "5", "--epsilon", "1", "--sensitivity", "x"],
            "--sensitivity must be replace-one, paper or a number in [1, 2]",
        ),
        (
            ["full", "--n", "2", "--rounds", "5", "--epsilon", "1e-6"],
            "--epsilon must be >= ",
        ),
    ],
)
def test_calibrate_errors_are_one_line(capsys, args, fragment):
    code, out, err = run(capsys, "calibrate", *args)
    assert code == 2 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and fragment in lines[0], err


def test_clones_default_is_the_numerical_upper_bound(capsys):
    from shuffle_opacus.analysis.approximate.clones import clones_epsilon

    code, out, _ = run(
        capsys, "account", "clones", "--n", "100000", "--eps0", "4", "--delta", "1e-6", "--json"
    )
    assert code == 0
    row = json.loads(out)
    bounds = clones_epsilon(n=100_000, eps0=4.0, delta=1e-6)
    assert row["method"] == "numerical"
    assert row["epsilon"] == bounds.upper and row["epsilon_lower"] == bounds.lower
    assert 0.1675 <= row["epsilon_lower"] <= row["epsilon"] <= 0.1728  # published range


def test_clones_closed_form_rows_and_invalid_note(capsys):
    code, out, _ = run(
        capsys, "account", "clones", "--n", "100000", "--eps0", "4", "--delta", "1e-6",
        "--method", "closed-form", "--steps", "1", "3",
    )  # fmt: skip
    assert code == 0
    rows = [line.split() for line in out.splitlines() if line.startswith("clones ")]
    assert [r[5] for r in rows] == ["1", "3"]
    assert float(rows[0][7]) == pytest.approx(0.5378, abs=5e-5)
    assert float(rows[1][7]) > float(rows[0][7])
    code, out, err = run(
        capsys, "account", "clones", "--n", "1000", "--eps0", "4", "--delta", "1e-6",
        "--method", "closed-form",
    )  # fmt: skip
    assert code == 0 and err == ""
    assert "n/a (closed form invalid: needs eps0 <= log(n/(16 log(4/delta))) = 1.414)" in out
    code, out, _ = run(
        capsys, "account", "clones", "--n", "1000", "--eps0", "4", "--delta", "1e-6",
        "--method", "closed-form", "--json",
    )  # fmt: skip
    row = json.loads(out)
    assert row["epsilon"] is None and "closed form invalid" in row["note"]


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["clones", "--n", "10", "--sigma", "1"], "--eps0 is required for the clones mechanism"),
        (["clones", "--eps0", "1"], "--n is required for the clones mechanism"),
        (["clones", "--n", "10", "--eps0", "1", "--sigma", "1"], "--sigma is not an option"),
        (
            ["clones", "--n", "10", "--eps0", "1", "--method", "exact"],
            "--method must be one of numerical, closed-form",
        ),
        (["clones", "--n", "10", "--eps0", "1", "--rate", "0.5"], "--rate is not an option"),
        (["clones", "--n", "10", "--eps0", "-1"], "--eps0 must be a finite number > 0"),
        (["clones-gaussian", "--n", "10", "--eps0", "1"], "--sigma is required"),
        (["shuffle", "--n", "10", "--sigma", "1", "--eps0", "1"], "--eps0 is not an option"),
    ],
)
def test_clones_errors_are_one_line(capsys, args, fragment):
    code, out, err = run(capsys, "account", *args)
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1
    assert fragment in err


def test_ldp_shuffle_matches_the_maths_layer(capsys):
    from shuffle_opacus.analysis.pld import ldp_shuffle_epsilon

    code, out, _ = run(
        capsys, "account", "ldp-shuffle", "--n", "20000", "--eps0", "2", "--delta", "1e-6",
        "--steps", "1", "4", "--json",
    )  # fmt: skip
    assert code == 0
    rows = [json.loads(line) for line in out.splitlines()]
    assert [r["steps"] for r in rows] == [1, 4]
    for row in rows:
        expected = ldp_shuffle_epsilon(1e-6, n=20_000, eps0=2.0, steps=row["steps"], tail=1e-12)
        assert row["epsilon"] == pytest.approx(expected, rel=1e-9)
        assert row["neighbouring"] == "replace-one user"
    # Composition can only increase epsilon.
    assert rows[1]["epsilon"] > rows[0]["epsilon"]


def test_ldp_shuffle_subsampled_table(capsys):
    from shuffle_opacus.analysis.pld import subsampled_ldp_shuffle_pld

    code, out, _ = run(
        capsys, "account", "ldp-shuffle", "--n", "10000", "--m", "100", "--eps0", "3",
        "--delta", "1e-6", "--steps", "10",
    )  # fmt: skip
    assert code == 0
    header = out.splitlines()[0].split()
    row = next(line.split() for line in out.splitlines() if line.startswith("ldp-shuffle"))
    assert row[:6] == ["ldp-shuffle", "pld", "10000", "3", "100", "10"]
    pld = subsampled_ldp_shuffle_pld(n=10_000, m=100, eps0=3.0, steps=10, tail=1e-12)
    epsilon = float(row[header.index("epsilon")])
    assert epsilon == pytest.approx(pld.get_epsilon_for_delta(1e-6), abs=1e-6)
    assert float(row[header.index("lower")]) <= epsilon


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["ldp-shuffle", "--n", "10"], "--eps0 is required for the ldp-shuffle mechanism"),
        (["ldp-shuffle", "--eps0", "1"], "--n is required for the ldp-shuffle mechanism"),
        (["ldp-shuffle", "--n", "10", "--eps0", "1", "--sigma", "1"], "--sigma is not an option"),
        (["ldp-shuffle", "--n", "10", "--eps0", "1", "--k", "3"], "--k is not an option"),
        (["ldp-shuffle", "--n", "10", "--eps0", "1", "--m", "11"], "--m must be an integer in"),
        (["ldp-shuffle", "--n", "10", "--eps0", "0"], "--eps0 must be a finite number > 0"),
        (["krr", "--n", "10", "--gamma", "0.5"], "--k is required for the krr mechanism"),
        (["krr", "--n", "10", "--k", "4"], "--gamma is required for the krr mechanism"),
        (["krr", "--n", "10", "--k", "4", "--gamma", "0.5", "--eps0", "1"], "--eps0 is not an"),
        (["krr", "--n", "10", "--k", "1", "--gamma", "0.5"], "--k must be an integer >= 2"),
        (["krr", "--n", "10", "--k", "4", "--gamma", "1.5"], "--gamma must be in (0, 1]"),
        (
            ["shuffle", "--n", "10", "--sigma", "1", "--k", "4"],
            "--k is not an option of the shuffle",
        ),
    ],
)
def test_pld_mechanism_errors_are_one_line(capsys, args, fragment):
    code, out, err = run(capsys, "account", *args)
    assert code == 2
    assert out == ""
    assert fragment in err
    assert len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("adversary", ["strong", "weak"])
def test_krr_matches_the_maths_layer(capsys, adversary):
    from shuffle_opacus.analysis.pld.krr import krr_epsilon

    code, out, _ = run(
        capsys, "account", "krr", "--n", "300", "--k", "4", "--gamma", "0.25",
        "--adversary", adversary, "--delta", "1e-6", "--steps", "1", "5", "--json",
    )  # fmt: skip
    assert code == 0
    rows = [json.loads(line) for line in out.splitlines()]
    for row in rows:
        assert row["adversary"] == adversary
        expected = krr_epsilon(
            1e-6, n=300, k=4, gamma=0.25, adversary=adversary, steps=row["steps"], tail=1e-12
        )
        assert row["epsilon"] == pytest.approx(expected, rel=1e-9)


def test_calibrate_guarantee_proven_targets_the_proven_epsilon(capsys):
    # The proven epsilon is the looser one: calibrated to it, the noise is larger than for the
    # tight one, and the epsilon it reports is the proven epsilon of that noise.
    common = ["calibrate", "checkin", "--n", "300", "--rate", "0.1", "--rounds", "4"]
    code, out, _ = run(capsys, *common, "--epsilon", "3", "--guarantee", "proven", "--json")
    assert code == 0
    proven = json.loads(out)
    code, out, _ = run(capsys, *common, "--epsilon", "3", "--method", "theorem3", "--json")
    tight = json.loads(out)  # a Rényi method: cheaper than pld, and pld's epsilon is lower
    assert proven["method"] == "proven" and tight["method"] == "theorem3"
    assert proven["noise_multiplier"] > tight["noise_multiplier"]
    assert proven["epsilon"] <= 3.0
    assert any("published theorems" in a for a in proven["assumptions"])
    assert not any("Theorem 1's pair" in a for a in proven["assumptions"])
    check = compute_epsilon(
        "checkin",
        n=300,
        rate=0.1,
        sigma=proven["noise_multiplier"] / 2,
        steps=4,
        delta=1e-5,
        method="proven",
    )
    assert check.epsilon == pytest.approx(proven["epsilon"], rel=1e-9)


def test_calibrate_guarantee_and_method_must_agree(capsys):
    code, _, err = run(
        capsys,
        "calibrate",
        "checkin",
        "--n",
        "1000",
        "--rate",
        "0.05",
        "--rounds",
        "20",
        "--epsilon",
        "3",
        "--guarantee",
        "proven",
        "--method",
        "exact",
    )
    assert code != 0 and "--guarantee proven and --method exact disagree" in err
    assert len(err.strip().splitlines()) == 1


@pytest.mark.parametrize(
    ("argv", "hint"),
    [
        (["account", "checkin", "--n", "9", "--noise-multiplyer", "1"], "--noise-multiplier"),
        (["account", "checkin", "--n", "9", "--stpes", "3"], "--steps"),
        (["account", "checkin", "--n", "9", "--dleta=1e-5"], "--delta"),
        (["calibrate", "checkin", "--n", "9", "--epsilon", "1", "--rounds", "2", "--rtae", "1"],
         "--rate"),
        (["account", "checkn", "--n", "9"], "'checkin'"),
        (["calibrat", "checkin"], "'calibrate'"),
    ],
)  # fmt: skip
def test_a_mistyped_flag_or_name_gets_a_suggestion(capsys, argv, hint):
    code, out, err = run(capsys, *argv)
    assert code == 2 and not out
    assert len(err.strip().splitlines()) == 1 and f"(did you mean {hint}" in err


def test_account_and_calibrate_take_both_names_for_the_rounds():
    parser = build_parser()
    base = ["checkin", "--n", "9", "--rate", "0.5"]
    assert parser.parse_args(["account", *base, "--rounds", "3", "4"]).steps == [3, 4]
    assert parser.parse_args(["account", *base, "--steps", "3"]).steps == [3]
    calibrate = ["calibrate", *base, "--epsilon", "1"]
    assert parser.parse_args([*calibrate, "--steps", "7"]).rounds == 7
    assert parser.parse_args([*calibrate, "--rounds", "7"]).rounds == 7


def test_the_experiment_command_suggests_flags_and_subcommands(capsys):
    from shuffle_experiments.cli import main as experiment

    assert experiment(["train", "--confg", "x.yaml"]) == 2
    assert "(did you mean --config for --confg?)" in capsys.readouterr().err
    assert experiment(["trian"]) == 2
    assert "(did you mean 'train'?)" in capsys.readouterr().err


def test_a_proven_row_that_cannot_be_evaluated_leaves_the_default_rows(capsys, monkeypatch):
    # The proven row was not asked for: where it cannot be evaluated (a PldRangeError, such as
    # a grid over the memory limit) the default rows still print, with a note saying why; asked
    # for by name it is a one-line error.
    from shuffle_opacus.analysis.limits import PldRangeError
    from shuffle_opacus.analysis.pld import proven

    def refuse(rounds, *, delta):
        raise PldRangeError("the proven bound's grid would not fit.")

    monkeypatch.setattr(proven, "proven_rounds_epsilon", refuse)
    argv = ["account", "checkin", "--n", "6000", "--rate", "0.1", "--sigma", "5", "--steps", "500"]
    code, out, err = run(capsys, *argv)
    assert code == 0
    assert [line.split()[1] for line in out.splitlines()[2:] if line.startswith("checkin")] == [
        "pld"
    ]
    assert (
        err == "shuffle-opacus: note: no proven row here: the proven bound's grid would not fit\n"
    )
    code, out, err = run(capsys, *argv, "--method", "proven")
    assert code == 2 and out == ""
    assert err.strip() == "shuffle-opacus: error: the proven bound's grid would not fit."
