"""The run plan (read once from the config) and ``privacy.curves``, once ``privacy.accountants``.

* the plan of the shipped configs holds what the code derived from the config before it
  existed (the protocol, the sample rate, the sensitivity and its label, the analysis sigmas,
  the curves), and the numbers those configs are documented with;
* a run reads its config into a plan once, and every part of it uses that plan;
* ``privacy.accountants`` still works with one note naming ``privacy.curves`` and gives the
  same plan; giving both is a one-line error.
"""

from __future__ import annotations

import dataclasses
import warnings
from pathlib import Path

import pytest
import yaml
from shuffle_experiments import plan as plan_module
from shuffle_experiments import plots, runner
from shuffle_experiments.cli import main
from shuffle_experiments.config import (
    ConfigDeprecationWarning,
    ConfigError,
    apply_overrides,
    load_config,
    validate,
)
from shuffle_experiments.curves import EpsilonCurves, curve_label, curve_list
from shuffle_experiments.guarantee import guarantee_record
from shuffle_experiments.plan import REPLACE_ONE, RunPlan, build_plan

from shuffle_opacus import analysis_sigma, get_protocol
from shuffle_opacus.accounting.protocols import resolve_sensitivity, sensitivity_label

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
#: A run of a few seconds: a small MLP on 200 clients, 3 rounds, the cheap Rényi curve.
TINY = [
    "model.name=mlp",
    "data.train_subset=200",
    "data.test_subset=100",
    "training.rounds=3",
    "training.eval_every=1",
    "training.checkpoint_every=1",
    "privacy.curves=[exact]",
    "training.threads=1",
]


def _old_key_copy(name: str, tmp_path: Path) -> Path:
    """Write ``configs/NAME.yaml`` with ``privacy.curves`` under its old name."""
    text = (CONFIGS / f"{name}.yaml").read_text()
    assert text.count("\n  curves: [") == 1
    path = tmp_path / f"{name}.yaml"
    path.write_text(text.replace("\n  curves: [", "\n  accountants: ["))
    return path


@pytest.mark.parametrize("name", ["quick", "users", "paper", "users_cohort"])
def test_the_plan_holds_what_the_config_gave_before(name: str) -> None:
    config = load_config(CONFIGS / f"{name}.yaml")
    plan = build_plan(config)
    # What each consumer worked out from the config itself before the plan.
    p, privacy = config.protocol, config.privacy
    population = config.clients.count if config.clients else config.data.train_subset or 60000
    protocol = get_protocol(p.kind)
    assert plan.protocol == protocol
    assert plan.population == population
    assert plan.sample_rate == protocol.sample_rate(
        population=population, rate=p.rate, sample_size=p.sample_size
    )
    assert plan.sensitivity == resolve_sensitivity(privacy.sensitivity)
    assert plan.sensitivity_label == sensitivity_label(privacy.sensitivity)
    assert plan.analysis_sigma == analysis_sigma(privacy.noise_multiplier, privacy.sensitivity)
    assert plan.replace_one_sigma == analysis_sigma(privacy.noise_multiplier, "replace-one")
    below = resolve_sensitivity(privacy.sensitivity) < 2.0
    assert plan.curves == (*privacy.curves, *([REPLACE_ONE] if below else []))
    assert (plan.delta, plan.rounds, plan.seed) == (privacy.delta, config.training.rounds, 0)
    assert plan.user_level == (config.clients is not None)
    assert plan.unit == ("one client (all its examples)" if plan.user_level else "one client")
    assert curve_list(config) == curve_list(plan) == plan.curves


def test_the_shipped_settings_as_documented() -> None:
    quick = build_plan(load_config(CONFIGS / "quick.yaml"))
    assert (quick.population, quick.sample_rate, quick.rounds) == (60000, 0.05, 1400)
    assert (quick.sensitivity, quick.analysis_sigma, quick.user_level) == (2.0, 0.5, False)
    users = build_plan(load_config(CONFIGS / "users.yaml"))
    assert (users.population, users.sample_rate, users.rounds, users.user_level) == (
        6000,
        0.1,
        1000,
        True,
    )
    assert users.analysis_sigma == 1.593 / 2
    # The paper's convention: sensitivity C, sigma 5 for its curves, 2.5 for the guarantee.
    paper = build_plan(load_config(CONFIGS / "paper.yaml"))
    assert (paper.sensitivity_setting, paper.sensitivity) == ("paper", 1.0)
    assert (paper.analysis_sigma, paper.replace_one_sigma) == (5.0, 2.5)
    assert paper.below_replace_one and paper.curves[-1] == REPLACE_ONE
    assert paper.sensitivity_assumptions and not quick.sensitivity_assumptions


def test_the_plan_is_frozen_and_takes_another_population() -> None:
    plan = build_plan(load_config(CONFIGS / "users.yaml"))
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.rounds = 1  # type: ignore[misc]
    assert plan.for_population(plan.population) is plan
    other = plan.for_population(60000)
    assert (other.population, other.sample_rate, other.curves) == (60000, 0.1, plan.curves)
    fixed = build_plan(
        load_config(CONFIGS / "smoke.yaml", ["protocol.kind=subsampled", "protocol.rate=null",
                                             "protocol.sample_size=50", "privacy.curves=[exact]"])
    )  # fmt: skip
    assert (fixed.sample_rate, fixed.for_population(500).sample_rate) == (50 / 2000, 0.1)


def test_consumers_give_the_same_numbers_from_the_plan_as_from_the_config() -> None:
    config = load_config(CONFIGS / "smoke.yaml", ["privacy.curves=[exact, no-shuffle]",
                                                  "privacy.sensitivity=paper"])  # fmt: skip
    plan = build_plan(config)
    by_config, by_plan = EpsilonCurves(config, 2000), EpsilonCurves(plan)
    assert by_config.names == by_plan.names == ("exact", "no-shuffle", REPLACE_ONE)
    assert by_config.row(20) == by_plan.row(20)
    assert [curve_label(n, config) for n in plan.curves] == [
        curve_label(n, plan) for n in plan.curves
    ]
    assert guarantee_record(config, by_config, 20) == guarantee_record(plan, by_plan, 20)


def test_a_run_reads_its_config_into_a_plan_once(
    tmp_path: Path, monkeypatch, small_mnist: list[str]
) -> None:
    built: list[RunPlan] = []
    original = plan_module.build_plan

    def counted(*args, **kwargs) -> RunPlan:
        built.append(original(*args, **kwargs))
        return built[-1]

    # runner.build_plan is the run's own reading; plan.build_plan is what as_plan falls back
    # to when a part is handed a config instead of the plan; plots.build_plan reads a run
    # directory's config.yaml when it is not given the plan.
    for module in (plan_module, runner, plots):
        monkeypatch.setattr(module, "build_plan", counted)
    config = load_config(CONFIGS / "smoke.yaml", [*TINY, *small_mnist, f"output_dir={tmp_path}"])
    run_dir = tmp_path / "run"
    runner.run(config, run_dir=run_dir, progress=False, stop_after=2, echo=lambda _: None)
    assert len(built) == 1
    result = runner.resume(run_dir, progress=False, echo=lambda _: None)
    assert len(built) == 2 and result.rounds_done == 3
    assert built[0] == built[1]  # the same plan from the config.yaml the run wrote


def test_the_old_key_gives_one_note_and_the_same_plan(tmp_path: Path) -> None:
    for name in ("quick", "users"):
        with pytest.warns(ConfigDeprecationWarning) as notes:
            old = load_config(_old_key_copy(name, tmp_path))
        assert len(notes) == 1
        text = str(notes[0].message)
        assert "\n" not in text and "privacy.accountants" in text and "privacy.curves" in text
        new = load_config(CONFIGS / f"{name}.yaml")
        assert old == new
        assert build_plan(old) == build_plan(new)
    # Under its new name: no note.
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConfigDeprecationWarning)
        load_config(CONFIGS / "quick.yaml")


def test_both_keys_are_a_one_line_error() -> None:
    raw = yaml.safe_load((CONFIGS / "smoke.yaml").read_text())
    raw["privacy"]["accountants"] = ["exact"]
    with pytest.raises(ConfigError) as info:
        validate(raw)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith("privacy.accountants and privacy.curves are both given")


def test_a_set_of_either_name_replaces_the_list(tmp_path: Path) -> None:
    with pytest.warns(ConfigDeprecationWarning, match="privacy.curves"):
        cfg = load_config(CONFIGS / "smoke.yaml", ["privacy.accountants=[exact]"])
    assert cfg.privacy.curves == ["exact"]
    old_file = _old_key_copy("smoke", tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConfigDeprecationWarning)  # the file's key is replaced
        cfg = load_config(old_file, ["privacy.curves=[pld]"])
    assert cfg.privacy.curves == ["pld"]
    raw = apply_overrides({"privacy": {"accountants": ["pld"]}}, ["privacy.curves=[exact]"])
    assert raw == {"privacy": {"curves": ["exact"]}}


def test_the_old_attribute_still_reads_the_list() -> None:
    cfg = load_config(CONFIGS / "quick.yaml")
    with pytest.warns(ConfigDeprecationWarning, match="PrivacyConfig.curves"):
        assert cfg.privacy.accountants == cfg.privacy.curves


def test_the_command_line_shows_the_note_on_one_line(tmp_path: Path, capsys) -> None:
    # An override the schema refuses: the note, then the error, and nothing runs.
    path = _old_key_copy("smoke", tmp_path)
    code = main(["train", "--config", str(path), "--set", "training.rounds=-1"])
    lines = capsys.readouterr().err.splitlines()
    assert code == 2
    assert len(lines) == 2, lines
    assert lines[0].startswith("shuffle-experiment: note: privacy.accountants is the old name")
    assert "privacy.curves" in lines[0]
    assert lines[1].startswith("shuffle-experiment: error: training.rounds")
