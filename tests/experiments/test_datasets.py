"""The dataset registry: MNIST as before bit for bit, a user's .npz, a dataset registered here.

The runs train two rounds of a tiny MLP on a few hundred generated examples through the
experiment's own entry points (the ``shuffle-experiment train`` command in-process and
:func:`shuffle_experiments.runner.run`), at example level and at user level.
"""

from __future__ import annotations

import csv
import re
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from shuffle_experiments import cli, runner
from shuffle_experiments.checkpoint import comparable
from shuffle_experiments.config import ConfigError, load_config, validate
from shuffle_experiments.data import load_mnist
from shuffle_experiments.datasets import (
    DATASETS,
    Dataset,
    DatasetArrays,
    DatasetError,
    dataset_tensors,
    register_dataset,
)
from shuffle_experiments.models import build_model
from shuffle_experiments.session import open_session
from shuffle_experiments.sweep import load_sweep

from shuffle_opacus import history_epsilon
from shuffle_opacus.engine.release_registry import SharedCoinsWarning

from .support import SMALL_TEST, SMALL_TRAIN, record_plots

ROOT = Path(__file__).resolve().parents[2]
TRAIN, TEST, FEATURES, CLASSES = 300, 60, 6, 3


@pytest.fixture(autouse=True)
def _registry_as_shipped():
    """Every test starts and ends with the shipped registry (mnist, npz)."""
    before = dict(DATASETS)
    yield
    DATASETS.clear()
    DATASETS.update(before)


def blobs(n: int, seed: int, shape: tuple[int, ...] = (FEATURES,)) -> tuple[np.ndarray, ...]:
    """``n`` points of ``CLASSES`` Gaussian blobs (float32) and their labels (int64)."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, CLASSES, size=n)
    x = rng.normal(size=(n, *shape)) + 2.0 * y.reshape(-1, *[1] * len(shape))
    return x.astype(np.float32), y.astype(np.int64)


def write_npz(path: Path, *, shape: tuple[int, ...] = (FEATURES,), **arrays: object) -> Path:
    """Write a valid dataset in the npz format; ``arrays`` replace (``None``: drop) entries."""
    train_x, train_y = blobs(TRAIN, 1, shape)
    test_x, test_y = blobs(TEST, 2, shape)
    content: dict[str, object] = {
        "train_x": train_x,
        "train_y": train_y,
        "test_x": test_x,
        "test_y": test_y,
        "num_classes": np.int64(CLASSES),
    }
    content.update(arrays)
    np.savez(path, **{k: v for k, v in content.items() if v is not None})
    return path


def users(count: int, seed: int = 3) -> np.ndarray:
    """A partition of the ``TRAIN`` examples into ``count`` users of uneven sizes."""
    rng = np.random.default_rng(seed)
    ids = np.concatenate([np.arange(count), rng.integers(0, count, size=TRAIN - count)])
    return rng.permutation(ids)


def base(tmp_path: Path, **sections: dict) -> dict:
    """A two-round config on an npz file in ``tmp_path`` (tiny MLP, one thread)."""
    raw = {
        "name": "npz",
        "output_dir": str(tmp_path / "runs"),
        "data": {"name": "npz", "path": str(tmp_path / "data.npz"), "normalize": "unit"},
        "model": {"name": "mlp"},
        "protocol": {"kind": "checkin", "rate": 0.2},
        "privacy": {"clipping_norm": 1.0, "noise_multiplier": 2.0, "curves": ["pld"]},
        "optimizer": {"lr": 0.5},
        "training": {"rounds": 2, "eval_every": 1, "threads": 1},
    }
    for key, value in sections.items():
        raw[key] = {**raw.get(key, {}), **value}
    return raw


def rows(run_dir: Path) -> list[dict[str, str]]:
    with (run_dir / "metrics.csv").open(newline="") as fh:
        return list(csv.DictReader(fh))


# --- MNIST: the first entry, bit for bit ---------------------------------------------------


def previous_tensors(config) -> tuple[torch.Tensor, ...]:
    """``session._tensors`` as it was before the registry (commit b7e824d), verbatim."""
    d = config.data
    mnist = load_mnist(d.source, d.root, d.pickle_path)
    train_x, train_y, test_x, test_y = mnist.normalized()
    if d.train_subset is not None:
        train_x, train_y = train_x[: d.train_subset], train_y[: d.train_subset]
    if d.test_subset is not None:
        test_x, test_y = test_x[: d.test_subset], test_y[: d.test_subset]

    def images(x: np.ndarray) -> torch.Tensor:
        pixels = torch.from_numpy(x)
        if d.normalize == "standard":
            pixels = (pixels - 0.1307) / 0.3081
        return pixels.unsqueeze(1).contiguous()

    return (
        images(train_x),
        torch.from_numpy(train_y).long(),
        images(test_x),
        torch.from_numpy(test_y).long(),
    )


@pytest.mark.parametrize(
    "overrides",
    [[], ["data.normalize=unit"], ["data.train_subset=1234", "data.test_subset=77"]],
    ids=["standard", "unit", "subsets"],
)
def test_mnist_entry_gives_the_previous_tensors_bit_for_bit(overrides):
    config = load_config(ROOT / "configs" / "quick.yaml", overrides)
    assert config.data.name == "mnist"
    new = dataset_tensors(config.data)
    assert (new.input_shape, new.num_classes, new.train_client) == ((1, 28, 28), 10, None)
    for old, mine in zip(
        previous_tensors(config), (new.train_x, new.train_y, new.test_x, new.test_y), strict=True
    ):
        assert (old.dtype, old.shape, old.is_contiguous()) == (
            mine.dtype,
            mine.shape,
            mine.is_contiguous(),
        )
        if old.dtype == torch.float32:  # compare the bits, not the values
            old, mine = old.view(torch.int32), mine.view(torch.int32)
        assert torch.equal(old, mine)


@pytest.mark.parametrize(
    "overrides",
    [[], ["data.normalize=unit"], ["data.train_subset=400", "data.test_subset=100"]],
    ids=["smoke", "unit", "fewer"],
)
def test_small_mnist_gives_the_tensors_of_the_full_copy(small_mnist, overrides):
    # The other tests' runs read the small IDX copy of conftest.small_mnist in place of the
    # installed MNIST: the same tensors, bit for bit, for the images they use.
    full = load_config(ROOT / "configs" / "smoke.yaml", overrides)
    assert full.data.source == "auto" and full.data.train_subset <= SMALL_TRAIN
    assert full.data.test_subset is not None and full.data.test_subset <= SMALL_TEST
    small = load_config(ROOT / "configs" / "smoke.yaml", [*small_mnist, *overrides])
    assert small.data.source == "idx"
    new = dataset_tensors(small.data)
    assert (new.input_shape, new.num_classes, new.train_client) == ((1, 28, 28), 10, None)
    for old, mine in zip(
        previous_tensors(full), (new.train_x, new.train_y, new.test_x, new.test_y), strict=True
    ):
        assert (old.dtype, old.shape) == (mine.dtype, mine.shape)
        if old.dtype == torch.float32:  # compare the bits, not the values
            old, mine = old.view(torch.int32), mine.view(torch.int32)
        assert torch.equal(old, mine)


def test_configs_without_a_dataset_compare_as_before():
    # A checkpoint stores comparable(config); runs begun before data.name and data.path existed
    # stored the data section without them and must still resume.
    config = load_config(ROOT / "configs" / "users_smoke.yaml")
    assert set(comparable(config)["data"]) == {
        "source",
        "root",
        "pickle_path",
        "train_subset",
        "test_subset",
        "normalize",
    }


# --- a user's npz file, end to end ---------------------------------------------------------


def test_npz_example_level_two_rounds_through_the_command(tmp_path, capsys, monkeypatch):
    write_npz(tmp_path / "data.npz", mean=np.float64(0.5), std=np.float64(2.0))
    raw = base(tmp_path, data={"normalize": "standard"})
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(raw))
    # The figures of a finished run are drawn in the worked example below (a registered dataset).
    plotted = record_plots(monkeypatch)
    assert cli.main(["train", "--config", str(tmp_path / "config.yaml")]) == 0
    assert len(plotted) == 1
    run_dir = (tmp_path / "runs" / "npz" / "latest").resolve()
    table = rows(run_dir)
    assert [r["round"] for r in table] == ["1", "2"] and table[-1]["test_accuracy"]
    # One example is one client: epsilon is accounted over the file's 300 examples.
    expected = history_epsilon(
        [(2.0, 0.2, 2)], protocol="checkin", delta=1e-5, population=TRAIN
    ).epsilon
    assert float(table[-1]["eps_pld"]) == pytest.approx(expected, rel=1e-12)
    saved = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert saved["data"]["name"] == "npz" and saved["data"]["path"] == str(tmp_path / "data.npz")
    assert comparable(validate(saved))["data"]["name"] == "npz"  # kept for another dataset


def test_npz_user_level_with_the_files_own_partition(tmp_path, monkeypatch):
    ids = users(30)
    write_npz(tmp_path / "data.npz", train_client=ids.astype(np.int32))
    clients = {"count": 30, "partition": "dataset", "local_steps": 2, "client_lr": 0.1}
    config = validate(base(tmp_path, clients=clients, optimizer={"lr": 1.0}))
    plotted = record_plots(monkeypatch)  # the figures: test_the_add_a_dataset_example_runs
    result = runner.run(config, run_dir=tmp_path / "run", progress=False, echo=lambda _: None)
    assert result.rounds_done == 2 and result.test_accuracy is not None and len(plotted) == 1
    # The population is the file's 30 users, not its 300 examples.
    expected = history_epsilon([(2.0, 0.2, 2)], protocol="checkin", delta=1e-5, population=30)
    assert result.epsilon["pld"] == pytest.approx(expected.epsilon, rel=1e-12)
    assert all(int(r["participants"]) <= 30 for r in rows(tmp_path / "run"))
    # And the trainer's clients are the file's: user u holds exactly the examples marked u.
    with pytest.warns(SharedCoinsWarning, match="same data"):  # the run's seed, again
        session = open_session(config, tmp_path / "unused", 0)
    partition = session.trainer.partition
    for u in (0, 7, 29):
        block = partition.order[partition.offsets[u] : partition.offsets[u + 1]]
        np.testing.assert_array_equal(np.sort(block), np.flatnonzero(ids == u))


def test_npz_under_the_users_config(tmp_path, monkeypatch):
    # configs/users_smoke.yaml as shipped (cnn_small, Dirichlet split into users) on 1 x 28 x 28
    # arrays from a file: the users config's own partition, over the file's examples.
    write_npz(tmp_path / "data.npz", shape=(1, 28, 28))
    config = load_config(
        ROOT / "configs" / "users_smoke.yaml",
        [
            f"output_dir={tmp_path}",
            "data.name=npz",
            f"data.path={tmp_path / 'data.npz'}",
            "data.normalize=unit",
            "data.train_subset=null",
            "data.test_subset=null",
            "clients.count=30",
            "privacy.noise_multiplier=2.0",
            "training.rounds=2",
            "training.threads=1",
        ],
    )
    assert (config.clients.partition, config.model.name) == ("dirichlet", "cnn_small")
    plotted = record_plots(monkeypatch)  # the figures: test_the_add_a_dataset_example_runs
    result = runner.run(config, run_dir=tmp_path / "run", progress=False, echo=lambda _: None)
    assert result.rounds_done == 2 and len(plotted) == 1
    expected = history_epsilon([(2.0, 0.1, 2)], protocol="checkin", delta=1e-5, population=30)
    assert result.epsilon["pld"] == pytest.approx(expected.epsilon, rel=1e-12)


# --- one-line refusals ---------------------------------------------------------------------

NAN_X = blobs(TRAIN, 1)[0].copy()
NAN_X[4, 2] = np.nan


@pytest.mark.parametrize(
    ("arrays", "message"),
    [
        ({"train_x": NAN_X}, "train_x must be finite, got nan or inf in example 4"),
        ({"train_y": np.full(TRAIN, 3)}, r"train_y must be in \[0, 2\] \(num_classes 3\), got 3"),
        ({"train_y": np.zeros(TRAIN - 1, int)}, r"train_y must have shape \(300,\)"),
        ({"test_y": np.zeros(TEST, bool)}, "test_y must hold integers, got dtype bool"),
        ({"test_x": np.zeros((TEST, 5), np.float32)}, r"test_x must have the examples' shape"),
        ({"train_x": np.zeros(TRAIN, np.float32)}, r"train_x must have shape \(N, \*S\)"),
        ({"train_client": np.full(TRAIN, -1)}, "train_client must give every example a client"),
        ({"train_client": np.arange(TRAIN) % 5 * 2}, "got no example for client 1"),
        ({"train_client": np.zeros(TRAIN, np.float32)}, "train_client must hold integers"),
        ({"train_clients": np.zeros(TRAIN, int)}, "did you mean 'train_client'"),
        ({"test_y": None}, "the array test_y is missing"),
        ({"num_classes": np.int64(1)}, r"num_classes must be in \[2, 100000\], got 1"),
        ({"num_classes": np.float64(3)}, "num_classes must be an integer of shape"),
        ({"mean": np.float64(0.0)}, "mean and std must be given together"),
        ({"mean": np.float64(0.0), "std": np.float64(0.0)}, "std finite and > 0"),
        ({"train_x": np.array([[object()]] * TRAIN)}, "cannot read without pickle"),
    ],
    ids=lambda v: v if isinstance(v, str) else "-".join(v),
)
def test_malformed_npz_is_refused_in_one_line_naming_the_array(tmp_path, arrays, message):
    write_npz(tmp_path / "data.npz", **arrays)
    with pytest.raises(ConfigError, match=message) as info:
        runner.run(validate(base(tmp_path)), run_dir=tmp_path / "run", progress=False)
    assert "\n" not in str(info.value) and str(tmp_path / "data.npz") in str(info.value)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"data": {"name": "mnst"}}, "data.name must be one of mnist, npz .did you mean 'mnist'"),
        ({"data": {"root": "/data"}}, "data.root applies to data.name mnist only"),
        ({"data": {"path": None}}, "data.path is required for data.name npz"),
        ({"data": {"train_subset": 301}}, r"data.train_subset must be <= 300"),
        ({"clients": {"count": 301}}, r"clients.count must be <= the number of training examp"),
        ({"clients": {"count": 3, "partition": "dataset"}}, "needs a dataset with its own parti"),
    ],
)
def test_config_errors_about_the_data(tmp_path, change, message):
    write_npz(tmp_path / "data.npz")
    if "clients" in change:
        change["clients"] = {**change["clients"], "local_steps": 1, "client_lr": 0.1}
    with pytest.raises(ConfigError, match=message):
        validate(base(tmp_path, **change))


def test_config_errors_about_the_partition_and_the_model(tmp_path):
    write_npz(tmp_path / "data.npz", train_client=users(30))
    clients = {"partition": "dataset", "local_steps": 1, "client_lr": 0.1}
    with pytest.raises(ConfigError, match="clients.count must be 30, the clients of npz's"):
        validate(base(tmp_path, clients={**clients, "count": 31}))
    with pytest.raises(ConfigError, match="data.train_subset cannot cut the dataset's own"):
        validate(base(tmp_path, clients={**clients, "count": 30}, data={"train_subset": 100}))
    with pytest.raises(ConfigError, match="data.path applies to data.name npz only"):
        validate(base(tmp_path, data={"name": "mnist"}))
    for config, message in [
        (base(tmp_path, model={"name": "cnn"}), "model.name cnn takes 1 x 28 x 28 images, the"),
        (base(tmp_path, data={"normalize": "standard"}), "needs the public mean and std of npz"),
    ]:
        with pytest.raises(ConfigError, match=message) as info:
            runner.run(validate(config), run_dir=tmp_path / "run", progress=False)
        assert "\n" not in str(info.value) and not (tmp_path / "run").exists()
    (tmp_path / "bad.npz").write_bytes(b"not a zip file")
    with pytest.raises(ConfigError, match="not a readable .npz file"):
        validate(base(tmp_path, data={"path": str(tmp_path / "bad.npz")}))
    with pytest.raises(ConfigError, match="is not a file"):
        validate(base(tmp_path, data={"path": str(tmp_path / "absent.npz")}))


def test_a_sweep_may_not_change_the_dataset(tmp_path):
    # The dataset sets the population every epsilon counts: a privacy setting, like
    # data.train_subset, which a sweep holds fixed.
    write_npz(tmp_path / "data.npz")
    (tmp_path / "base.yaml").write_text(yaml.safe_dump(base(tmp_path)))
    for key, value in (("data.name", "mnist"), ("data.path", str(tmp_path / "other.npz"))):
        sweep = {"base": "base.yaml", "trials": [{key: value}]}
        (tmp_path / "sweep.yaml").write_text(yaml.safe_dump(sweep))
        with pytest.raises(ConfigError, match=f"trial 1: {key} is a privacy parameter"):
            load_sweep(tmp_path / "sweep.yaml")


# --- a dataset registered in Python -------------------------------------------------------


def test_register_dataset_refuses_what_it_cannot_use():
    def load(data):  # pragma: no cover - never called
        raise AssertionError

    with pytest.raises(DatasetError, match="dataset 'mnist' is registered already"):
        register_dataset(Dataset(name="mnist", load=load))
    with pytest.raises(DatasetError, match="dataset name must be letters, digits"):
        register_dataset(Dataset(name="my data", load=load))
    with pytest.raises(DatasetError, match="keys must be among source, root, pickle_path, path"):
        register_dataset(Dataset(name="mine", load=load, keys=("file",)))
    assert list(DATASETS) == ["mnist", "npz"]


def test_a_registered_loader_must_return_dataset_arrays(tmp_path):
    register_dataset(Dataset(name="wrong", load=lambda data: blobs(10, 0)))
    with pytest.raises(ConfigError, match="load must return DatasetArrays, got tuple"):
        runner.run(validate(base(tmp_path, data={"name": "wrong", "path": None})))


def test_mlp_takes_the_datasets_shape_and_classes():
    model = build_model("mlp", (FEATURES,), CLASSES)
    assert sum(p.numel() for p in model.parameters()) == FEATURES * 128 + 128 + 128 * 3 + 3
    assert model(torch.zeros(4, FEATURES)).shape == (4, CLASSES)
    with pytest.raises(ValueError, match="model.name cnn_small takes 1 x 28 x 28 images"):
        build_model("cnn_small", (3, 32, 32), 10)


ARCHITECTURE = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")


def test_the_add_a_dataset_example_runs(tmp_path, monkeypatch, capsys):
    # docs/architecture.md's worked example, as printed there: a toy dataset registered in
    # Python, then used by name for two rounds through runner.run.
    match = re.search(r"<!-- add-a-dataset -->\n```python\n(.+?)\n```", ARCHITECTURE, re.S)
    assert match, "docs/architecture.md must show the add-a-dataset example"
    monkeypatch.chdir(tmp_path)
    exec(compile(match.group(1), "docs/architecture.md:add-a-dataset", "exec"), {})
    quoted = re.search(r"<!-- add-a-dataset-output -->\n```text\n(.+?)\n```", ARCHITECTURE, re.S)
    assert quoted, "docs/architecture.md must quote what the example prints"
    assert capsys.readouterr().out.strip() == quoted.group(1).strip()
    assert "blobs" in DATASETS and (tmp_path / "runs" / "blobs-demo" / "latest").is_dir()


def test_a_python_loaders_arrays_are_checked_and_converted():
    x, y = blobs(20, 0)
    arrays = DatasetArrays(x.astype(np.float64), y.astype(np.uint8), x[:5], y[:5], num_classes=3)
    assert (arrays.train_x.dtype, arrays.train_y.dtype, arrays.input_shape) == (
        np.float32,
        np.int64,
        (FEATURES,),
    )
    with pytest.raises(DatasetError, match=r"^toy: test_y must be in \[0, 1\] \(num_classes 2"):
        DatasetArrays(x, y % 2, x[:5], y[:5] + 2, num_classes=2, source="toy")
    with pytest.raises(DatasetError, match="train_x must hold floats or integers, got dtype bool"):
        DatasetArrays(x > 0, y, x[:5], y[:5], num_classes=3)
