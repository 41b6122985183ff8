"""The shared privacy configuration and the optional-dependency boundary."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytest.importorskip("flwr")

from shuffle_opacus.flower import METRIC_KEYS, ShufflePrivacyConfig  # noqa: E402


def test_round_trip_and_units():
    cfg = ShufflePrivacyConfig(
        noise_multiplier=1.5, clip_norm=0.2, rate=0.1, delta=1e-6, sensitivity="paper"
    )
    assert cfg.sensitivity == 1.0 and cfg.method is None  # the default: pld where affordable
    assert cfg.analysis_sigma == 1.5 and cfg.noise_std == pytest.approx(0.3)
    assert ShufflePrivacyConfig.from_config(cfg.to_config()) == cfg
    assert set(cfg.reply_metrics()) == set(METRIC_KEYS)
    assert cfg.differences(cfg.reply_metrics()) == []
    default = ShufflePrivacyConfig(noise_multiplier=1.0, clip_norm=1.0, rate=1.0, delta=0.5)
    assert default.sensitivity == 2.0 and default.analysis_sigma == 0.5


def test_differences_name_every_problem():
    cfg = ShufflePrivacyConfig(noise_multiplier=1.0, clip_norm=1.0, rate=0.5, delta=1e-5)
    metrics = {**cfg.reply_metrics(), "shuffle-dp.rate": 0.25, "loss": 0.1}
    del metrics["num-examples"]
    problems = cfg.differences(metrics)
    assert any("unexpected metrics ['loss']" in p for p in problems)
    assert any("shuffle-dp.rate = 0.25, expected 0.5" in p for p in problems)
    assert any("num-examples missing" in p for p in problems)
    assert len(problems) == 3


@pytest.mark.parametrize(
    ("kwargs", "text"),
    [
        ({"noise_multiplier": -1.0}, "noise_multiplier must be a finite number > 0"),
        ({"noise_multiplier": 0.0}, "noise_multiplier must be a finite number > 0"),
        ({"rate": 0.0}, r"rate must be in \(0, 1\]"),
        ({"rate": -0.1}, r"rate must be in \(0, 1\]"),
        ({"noise_multiplier": -1.0, "allow_noiseless": True}, "must be a finite number >= 0"),
        ({"allow_noiseless": 1}, "allow_noiseless must be True or False"),
        ({"clip_norm": 0.0}, "clip_norm must be a finite number > 0"),
        ({"rate": 1.5}, r"rate must be in \(0, 1\]"),
        ({"delta": 1.0}, r"delta must be in \(0, 1\)"),
        ({"sensitivity": "nope"}, "sensitivity must be one of"),
        ({"method": "magic"}, "method must be one of"),
    ],
)
def test_bad_values(kwargs, text):
    base = {"noise_multiplier": 1.0, "clip_norm": 1.0, "rate": 0.5, "delta": 1e-5}
    with pytest.raises(ValueError, match=text) as info:
        ShufflePrivacyConfig(**{**base, **kwargs})
    assert "\n" not in str(info.value)


def test_noiseless_only_when_allowed():
    cfg = ShufflePrivacyConfig(
        noise_multiplier=0.0, clip_norm=1.0, rate=0.5, delta=1e-5, allow_noiseless=True
    )
    assert cfg.noise_std == 0.0 and cfg.allow_noiseless
    with pytest.raises(ValueError, match="noise_multiplier must be a finite number > 0"):
        ShufflePrivacyConfig.from_config(cfg.to_config())
    assert ShufflePrivacyConfig.from_config(cfg.to_config(), allow_noiseless=True) == cfg


def test_from_config_needs_every_key():
    cfg = ShufflePrivacyConfig(noise_multiplier=1.0, clip_norm=1.0, rate=0.5, delta=1e-5)
    record = cfg.to_config()
    del record["shuffle-dp.delta"]
    with pytest.raises(ValueError, match="lacks the shuffle-model parameters"):
        ShufflePrivacyConfig.from_config(record)
    with pytest.raises(ValueError, match="shuffle-dp.rate must be a number"):
        ShufflePrivacyConfig.from_config({**cfg.to_config(), "shuffle-dp.rate": "0.5"})


def test_core_package_does_not_import_flwr_and_missing_flwr_has_a_one_line_hint():
    """One fresh interpreter: ``import shuffle_opacus`` leaves flwr alone; without flwr the
    subpackage raises an ImportError whose message is the install command."""
    code = (
        "import sys, shuffle_opacus, shuffle_opacus.accounting.protocols\n"
        "import shuffle_opacus.accounting.history, shuffle_opacus.accounting.calibration\n"
        "print('flwr' in sys.modules)\n"
        "sys.modules['flwr'] = None\n"
        "try:\n"
        "    import shuffle_opacus.flower\n"
        "except ImportError as exc:\n"
        "    print(exc)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [
        "False",
        "shuffle_opacus.flower needs Flower (flwr), which is not installed: "
        "pip install 'shuffle-opacus[flower]'",
    ]
