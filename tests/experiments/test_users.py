"""The experiment's user-level runs (a ``clients:`` section): smoke run, resume, configs."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from shuffle_experiments import runner
from shuffle_experiments.config import ConfigError, load_config
from shuffle_experiments.curves import EpsilonCurves

from shuffle_opacus import history_epsilon
from shuffle_opacus.engine.release_registry import REGISTRY

from .support import record_plots

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "configs"


def rows(run_dir: Path) -> list[dict[str, str]]:
    with (run_dir / "metrics.csv").open(newline="") as fh:
        return list(csv.DictReader(fh))


def test_users_smoke_runs_and_resumes_exactly(tmp_path, small_mnist, monkeypatch):
    # Analysis sigma 1 (the config's 0.5 has heavy-tailed reports, a pld pair of seconds); one
    # torch thread (the suite's two workers share two cores; the thread count changes the speed
    # and the last digits only); its 2,000 + 500 images from the small copy of MNIST.
    cfg = load_config(
        CONFIGS / "users_smoke.yaml",
        [f"output_dir={tmp_path}", "privacy.noise_multiplier=2.0", "training.threads=1",
         *small_mnist],
    )  # fmt: skip
    whole = runner.run(cfg, run_dir=tmp_path / "whole", progress=False)
    assert whole.rounds_done == 10 and whole.test_accuracy is not None
    for name in ("summary.json", "accuracy_vs_epsilon.png", "accuracy_vs_epsilon.csv"):
        assert (tmp_path / "whole" / name).is_file(), name
    table = rows(tmp_path / "whole")
    # Participants are clients: Binomial(200, 0.1) per round, not Binomial(2000, 0.1).
    counts = np.array([int(r["participants"]) for r in table])
    assert 5 < counts.mean() < 40
    # Epsilon is accounted over the 200 clients (the run itself also checks that the Opacus
    # accountant agrees with this curve).
    expected = history_epsilon(
        [(2.0, 0.1, 10)], protocol="checkin", delta=1e-5, population=200
    ).epsilon  # the default, pld
    assert float(table[-1]["eps_pld"]) == pytest.approx(expected, rel=1e-12)
    renyi = history_epsilon(
        [(2.0, 0.1, 10)], protocol="checkin", delta=1e-5, population=200, method="exact"
    ).epsilon
    assert float(table[-1]["eps_exact"]) == pytest.approx(renyi, rel=1e-12)
    assert renyi > expected
    part = tmp_path / "part"
    plotted = record_plots(monkeypatch)  # the whole run's are checked above; here the rows
    # The stopped run and its resumption start with an empty release registry, as separate
    # processes do: in this one the registry would compute, for its SharedCoinsWarning, the
    # epsilon of each with the runs before it on the same coins (about 0.4 s CPU each).
    REGISTRY.clear()
    runner.run(cfg, run_dir=part, progress=False, stop_after=7)
    assert torch.load(part / "checkpoint.pt", weights_only=True)["round"] == 5
    REGISTRY.clear()
    resumed = runner.resume(part, progress=False, echo=lambda _: None)
    assert len(plotted) == 1
    assert (part / "metrics.csv").read_bytes() == (tmp_path / "whole" / "metrics.csv").read_bytes()
    a = torch.load(part / "checkpoint.pt", weights_only=True)["model"]
    b = torch.load(tmp_path / "whole" / "checkpoint.pt", weights_only=True)["model"]
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert resumed.epsilon == whole.epsilon


def test_users_config_stays_within_epsilon_one():
    cfg = load_config(CONFIGS / "users.yaml")
    assert (cfg.clients.count, cfg.clients.partition, cfg.clients.alpha) == (6000, "dirichlet", 0.5)
    assert cfg.protocol.rate == 0.1 and cfg.privacy.delta == 1e-5
    assert cfg.data.train_subset is None  # 6,000 clients x 10 images
    # sigma is calibrated with the tight accountant (the privacy loss distribution of the
    # symmetrised pair), as the MNIST headline is; the RDP bound of the same run is larger.
    curves = EpsilonCurves(cfg, 6000)
    eps = curves.epsilon("pld", cfg.training.rounds)
    assert 0.99 < eps <= 1.0
    rdp = curves.epsilon("exact", cfg.training.rounds)
    assert rdp > eps
    shipped = json.loads((ROOT / "docs" / "figures" / "users_summary.json").read_text())
    assert shipped["epsilon"]["pld"] == pytest.approx(eps, rel=1e-9)
    assert shipped["epsilon"]["exact"] == pytest.approx(rdp, rel=1e-9)
    assert shipped["noise_multiplier"] == cfg.privacy.noise_multiplier
    # Counted over the 60,000 images instead of the 6,000 clients, the number would be another.
    assert abs(EpsilonCurves(cfg, 60000).epsilon("exact", cfg.training.rounds) - rdp) > 0.05


def test_users_cohort_config_and_its_shipped_run_stay_within_epsilon_one():
    cfg = load_config(CONFIGS / "users_cohort.yaml")
    assert (cfg.clients.count, cfg.protocol.rate, cfg.privacy.delta) == (6000, 0.4, 1e-5)
    eps = EpsilonCurves(cfg, 6000).epsilon("pld", cfg.training.rounds)
    assert 0.99 < eps <= 1.0
    shipped = json.loads((ROOT / "docs" / "figures" / "users_cohort_summary.json").read_text())
    assert shipped["epsilon"]["pld"] == pytest.approx(eps, rel=1e-9)
    assert shipped["noise_multiplier"] == cfg.privacy.noise_multiplier
    assert shipped["rate"] == cfg.protocol.rate and shipped["rounds"] == cfg.training.rounds


def test_users_flower_config_has_the_flower_runs_epsilon():
    cfg = load_config(CONFIGS / "users_flower.yaml")
    flower = json.loads((ROOT / "docs" / "figures" / "flower" / "summary.json").read_text())
    app = json.loads((ROOT / "docs" / "figures" / "flower" / "run_config.json").read_text())
    assert cfg.clients.count == app["num-nodes"] and cfg.protocol.rate == app["rate"]
    assert cfg.privacy.noise_multiplier == app["noise-multiplier"]
    assert cfg.privacy.clipping_norm == app["clip-norm"]
    assert cfg.clients.local_batch_size == app["local-batch-size"]
    assert cfg.clients.client_lr == app["local-lr"]
    assert cfg.training.rounds == flower["rounds"] == app["num-server-rounds"]
    eps = EpsilonCurves(cfg, cfg.clients.count).epsilon("pld", cfg.training.rounds)
    assert eps == pytest.approx(flower["epsilon"], rel=1e-9)


@pytest.mark.parametrize(
    ("override", "message"),
    [
        (["clients.count=3000"], "clients.count must be <= the number of training examples (2000)"),
        (["clients.local_epochs=1"], "exactly one of local_steps and local_epochs"),
        (["clients.partition=iid"], "clients.alpha applies to partition dirichlet only"),
        (["clients.alpha=null"], "clients.alpha is required for clients.partition dirichlet"),
        (["clients.client_lr=0"], "clients.client_lr must be > 0"),
        (["clients.local_steps=0"], "clients.local_steps must be a positive integer"),
    ],
)
def test_bad_clients_sections_are_one_line(override, message):
    with pytest.raises(ConfigError) as info:
        load_config(CONFIGS / "users_smoke.yaml", override)
    assert message in str(info.value) and "\n" not in str(info.value)
