"""End to end with Opacus: train a tiny model with each accountant, checkpoint, resume, reject."""

from __future__ import annotations

import copy
import itertools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from opacus import PrivacyEngine
from torch.utils.data import DataLoader

import shuffle_opacus
from shuffle_opacus import history_epsilon
from shuffle_opacus.analysis.epsilon import compute_epsilon
from shuffle_opacus.engine.sampling import FixedSizeShuffledSampler, ShuffledCheckInSampler
from tests.opacus_helpers import (
    N_CLIENTS,
    SETTINGS,
    dataset,
    has_grad_sample_hooks,
    loader,
    model,
    train,
)

ROUNDS = 10


def private(name: str, *, seed: int = 0, rounds: int = ROUNDS, **overrides):
    engine = PrivacyEngine(accountant=name)
    net = model()
    opt = torch.optim.SGD(net.parameters(), lr=0.2)
    kwargs = {
        "module": net,
        "optimizer": opt,
        "data_loader": loader(),
        "noise_multiplier": 2.0,
        "max_grad_norm": 1.0,
        "rounds": rounds,
        "seed": seed,
        **SETTINGS[name][0],
        **overrides,
    }
    return (engine, *shuffle_opacus.make_private(engine, **kwargs))


@pytest.mark.parametrize("name", sorted(SETTINGS))
def test_training_epsilon_equals_the_core(name):
    engine, module, optimizer, data = private(name)
    sizes, eps = train(module, optimizer, data, engine)
    assert len(sizes) == ROUNDS and len(engine.accountant) == ROUNDS
    core = compute_epsilon(
        **SETTINGS[name][1], n=N_CLIENTS, sigma=1.0, steps=ROUNDS, delta=1e-5
    )  # sigma = noise_multiplier / 2 (replace-one)
    assert eps[-1] == pytest.approx(core.epsilon, rel=1e-12)
    assert all(a < b for a, b in zip(eps, eps[1:], strict=False))
    assert all(torch.isfinite(p).all() for p in module.parameters())


def test_accountant_records_the_local_noise_multiplier():
    engine, module, optimizer, data = private("shuffled_checkin", noise_multiplier=3.5)
    train(module, optimizer, data)
    assert engine.accountant.history == [(3.5, 0.25, ROUNDS)]


def test_checkin_batches_vary_and_empty_rounds_are_accounted():
    engine, module, optimizer, data = private("shuffled_checkin", rate=0.01, rounds=60)
    sizes, _ = train(module, optimizer, data)
    assert 0 in sizes and max(sizes) > 0
    assert len(engine.accountant) == 60
    assert all(torch.isfinite(p).all() for p in module.parameters())


def test_an_empty_first_round_survives():
    first_empty = next(
        s for s in range(1000) if not ShuffledCheckInSampler(N_CLIENTS, 0.02, 30, seed=s).batch(0)
    )
    sampler = ShuffledCheckInSampler(N_CLIENTS, 0.02, 30, seed=first_empty)
    engine = PrivacyEngine(accountant="shuffled_checkin")
    net = model()
    module, optimizer, data = shuffle_opacus.make_private(
        engine,
        module=net,
        optimizer=torch.optim.SGD(net.parameters(), lr=0.1),
        data_loader=DataLoader(dataset(), batch_sampler=sampler),
        noise_multiplier=2.0,
        max_grad_norm=1.0,
    )
    sizes, _ = train(module, optimizer, data)
    assert sizes[0] == 0 and len(engine.accountant) == 30


def test_checkpoint_and_resume_give_the_same_epsilon_trajectory(tmp_path):
    name, rounds, cut = "shuffled_checkin", 12, 5
    engine, module, optimizer, data = private(name, rounds=rounds, seed=4)
    full_sizes, full_eps = train(module, optimizer, data, engine)

    engine, module, optimizer, data = private(name, rounds=rounds, seed=4)
    sizes, eps = [], []
    # islice stops before drawing round `cut`: a round the loader hands out is released, and
    # accounted, whether or not the loop then uses it.
    for x, y in itertools.islice(data, cut):
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(module(x), y).backward()
        optimizer.step()
        sizes.append(len(x))
        eps.append(engine.get_epsilon(1e-5))
    path = tmp_path / "ckpt.pt"
    engine.save_checkpoint(path=path, module=module, optimizer=optimizer)
    saved = copy.deepcopy(engine.accountant.state_dict())

    engine2, module2, optimizer2, data2 = private(name, rounds=rounds, seed=4, start_round=cut)
    engine2.load_checkpoint(path=path, module=module2, optimizer=optimizer2)
    assert engine2.accountant.state_dict() == saved
    assert engine2.get_epsilon(1e-5) == eps[-1]
    more_sizes, more_eps = train(module2, optimizer2, data2, engine2)
    assert sizes + more_sizes == full_sizes
    assert eps + more_eps == full_eps


@pytest.mark.parametrize("sensitivity", ["replace-one", "paper", 1.5])
def test_sensitivity_convention(sensitivity):
    engine, module, optimizer, data = private("shuffle", sensitivity=sensitivity)
    train(module, optimizer, data)
    scale = {"replace-one": 2.0, "paper": 1.0, 1.5: 1.5}[sensitivity]
    core = compute_epsilon("shuffle", n=N_CLIENTS, sigma=2.0 / scale, steps=ROUNDS, delta=1e-5)
    assert engine.get_epsilon(1e-5) == pytest.approx(core.epsilon, rel=1e-12)


def test_make_private_with_epsilon_meets_the_target():
    engine = PrivacyEngine(accountant="shuffled_checkin")
    net = model()
    module, optimizer, data = shuffle_opacus.make_private_with_epsilon(
        engine,
        module=net,
        optimizer=torch.optim.SGD(net.parameters(), lr=0.1),
        data_loader=loader(),
        target_epsilon=3.0,
        target_delta=1e-5,
        max_grad_norm=1.0,
        rate=0.25,
        rounds=ROUNDS,
        seed=0,
    )
    train(module, optimizer, data)
    eps = engine.get_epsilon(1e-5)
    assert eps <= 3.0
    assert eps > 3.0 * 0.99


# --- Opacus's own entry points --------------------------------------------------------------


def test_opacus_make_private_with_epsilon_points_to_the_helper():
    engine = PrivacyEngine(accountant="shuffled_checkin")
    net = model()
    with pytest.raises(ValueError, match="shuffle_opacus.make_private_with_epsilon") as info:
        engine.make_private_with_epsilon(
            module=net,
            optimizer=torch.optim.SGD(net.parameters(), lr=0.1),
            data_loader=loader(),
            target_epsilon=1.0,
            target_delta=1e-5,
            epochs=1,
            max_grad_norm=1.0,
        )
    assert not has_grad_sample_hooks(net)
    # The pointer comes first, and nothing leads towards configuring the accountant by hand
    # under Opacus's central calibration.
    message = str(info.value)
    assert "For a target epsilon use shuffle_opacus.make_private_with_epsilon" in message
    assert "configure(" not in message and "\n" not in message


def test_opacus_make_private_is_refused():
    engine = PrivacyEngine(accountant="shuffle")
    net = model()
    with pytest.raises(ValueError, match="shuffle_opacus.make_private"):
        engine.make_private(
            module=net,
            optimizer=torch.optim.SGD(net.parameters(), lr=0.1),
            data_loader=loader(),
            noise_multiplier=1.0,
            max_grad_norm=1.0,
        )


# --- bad input: a clear error and nothing applied -----------------------------------------


def fixed_loader(m: int) -> DataLoader:
    return DataLoader(dataset(), batch_sampler=FixedSizeShuffledSampler(N_CLIENTS, m, 5, seed=0))


BAD = [
    ("shuffled_checkin", {"rate": 0.0}, r"rate must be in \(0, 1\]"),
    ("shuffled_checkin", {"rate": 1.5}, r"rate must be in \(0, 1\]"),
    ("shuffled_checkin", {"rate": None}, r"rate is required"),
    ("shuffled_checkin", {"rate": 0.1, "sample_size": 3}, "sample_size is not a parameter"),
    ("shuffled_checkin", {"rounds": None}, "rounds is required"),
    ("shuffled_checkin", {"rounds": 0}, r"rounds must be an integer >= 1"),
    ("shuffled_checkin", {"noise_multiplier": 0.0}, "noise_multiplier must be a finite number > 0"),
    ("shuffled_checkin", {"noise_multiplier": -2.0}, "noise_multiplier must be"),
    ("shuffled_checkin", {"max_grad_norm": 0.0}, "max_grad_norm must be"),
    ("shuffled_checkin", {"sensitivity": "huge"}, "sensitivity must be one of"),
    ("shuffled_checkin", {"method": "theorem2"}, "method must be one of"),
    ("shuffled_checkin", {"noise_mode": "central"}, "noise_mode must be one of"),
    ("shuffled_checkin", {"grad_sample_mode": "ghost"}, "grad_sample_mode must be one of"),
    ("shuffled_checkin", {"data_loader": "fixed"}, "needs the checkin protocol"),
    ("subsampled_shuffle", {"sample_size": N_CLIENTS + 1}, r"sample_size must be an integer"),
    ("subsampled_shuffle", {"sample_size": N_CLIENTS}, r"use the shuffle accountant"),
    ("subsampled_shuffle", {"sample_size": None}, "sample_size is required"),
    ("subsampled_shuffle", {"sample_size": 8, "rate": 0.1}, "rate is not a parameter"),
    ("shuffle", {"sample_size": 3}, "sample_size of the shuffle accountant must equal"),
    ("shuffle", {"data_loader": "fixed"}, "needs the full protocol"),
    ("prv", {}, "engine.accountant must be one of"),
    # Strict numbers: a bool or a string is not a number, whatever it would convert to.
    ("shuffled_checkin", {"noise_multiplier": True}, "noise_multiplier must be a finite number"),
    ("shuffled_checkin", {"noise_multiplier": "1.0"}, r"Found '1.0' \(a str, not a real"),
    ("shuffled_checkin", {"max_grad_norm": True}, "max_grad_norm must be a finite number"),
    ("shuffled_checkin", {"noise_multiplier": torch.tensor(1.0)}, r"a Tensor, not a real number"),
    ("shuffled_checkin", {"rate": "0.1"}, r"rate must be a number in \(0, 1\]"),
    ("shuffled_checkin", {"sensitivity": 1e-9}, r"sensitivity must be .* number in \[1, 2\]"),
    ("shuffled_checkin", {"sensitivity": True}, r"sensitivity must be .* number in \[1, 2\]"),
    ("shuffled_checkin", {"data_loader": "broken"}, r"dataset\[0\] raised IndexError: gone;"),
    ("shuffled_checkin", {"data_loader": "followed"}, "already feeds an accountant"),
]


class _BrokenDataset(torch.utils.data.Dataset):
    """A dataset whose every item raises."""

    def __len__(self) -> int:
        return N_CLIENTS

    def __getitem__(self, index: int):
        raise IndexError("gone")


def _followed_loader() -> DataLoader:
    """A loader whose sampler already feeds another engine's accountant."""
    sampler = ShuffledCheckInSampler(N_CLIENTS, 0.25, 5, seed=0)
    private("shuffled_checkin", rounds=5, data_loader=DataLoader(dataset(), batch_sampler=sampler))
    return DataLoader(dataset(), batch_sampler=sampler)


@pytest.mark.parametrize(("name", "overrides", "message"), BAD)
def test_bad_input_is_rejected_before_anything_changes(name, overrides, message):
    engine = PrivacyEngine(accountant=name)
    net = model()
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    params_before = copy.deepcopy(net.state_dict())
    opt_before = copy.deepcopy(opt.state_dict())
    kwargs = {
        "module": net,
        "optimizer": opt,
        "data_loader": loader(),
        "noise_multiplier": 1.0,
        "max_grad_norm": 1.0,
        "rounds": 5,
        "seed": 0,
        **SETTINGS.get(name, ({}, {}))[0],
        **overrides,
    }
    special = {
        "fixed": lambda: fixed_loader(8),
        "broken": lambda: DataLoader(_BrokenDataset(), batch_size=8),
        "followed": _followed_loader,
    }
    if isinstance(kwargs["data_loader"], str):
        kwargs["data_loader"] = special[kwargs["data_loader"]]()
        if kwargs["data_loader"].batch_sampler.__class__ is ShuffledCheckInSampler:
            kwargs = {k: v for k, v in kwargs.items() if k not in ("rate", "rounds", "seed")}
    kwargs = {k: v for k, v in kwargs.items() if v is not None}
    with pytest.raises(ValueError, match=message):
        shuffle_opacus.make_private(engine, **kwargs)
    assert not has_grad_sample_hooks(net)
    assert type(opt) is torch.optim.SGD and opt.state_dict() == opt_before
    assert all(torch.equal(v, params_before[k]) for k, v in net.state_dict().items())
    if hasattr(engine.accountant, "population"):
        assert engine.accountant.population is None


# --- the accountant follows the sampler ------------------------------------------------------


def test_skipped_empty_rounds_are_accounted():
    """``if len(x) == 0: continue`` leaves no round out: n = 3, rate 0.2, 40 rounds."""
    engine, module, optimizer, data = private(
        "shuffled_checkin", rate=0.2, rounds=40, data_loader=loader(n=3)
    )
    stepped = 0
    for x, y in data:
        if len(x) == 0:
            continue
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(module(x), y).backward()
        optimizer.step()
        stepped += 1
    assert 0 < stepped < 40  # the seed gives both kinds of rounds
    assert engine.accountant.history == [(2.0, 0.2, 40)]
    every_round = history_epsilon(
        [(2.0, 0.2, 40)], protocol="checkin", delta=1e-5, population=3
    ).epsilon
    stepped_only = history_epsilon(
        [(2.0, 0.2, stepped)], protocol="checkin", delta=1e-5, population=3
    ).epsilon
    assert engine.get_epsilon(1e-5) == every_round > stepped_only


def test_a_round_drawn_and_abandoned_is_accounted_and_a_step_without_a_round_is_refused():
    engine, module, optimizer, data = private("shuffled_checkin")
    plain = next(iter(loader()))  # a batch that did not come from the private loader
    params = [p.detach().clone() for p in module.parameters()]
    optimizer.zero_grad()
    torch.nn.functional.cross_entropy(module(plain[0]), plain[1]).backward()
    with pytest.raises(ValueError, match=r"optimizer.step\(\) #1 has no round to process"):
        optimizer.step()
    assert all(torch.equal(a, b) for a, b in zip(params, module.parameters(), strict=True))
    assert len(engine.accountant) == 0
    for _ in data:
        break  # drawn, never stepped: released all the same
    assert len(engine.accountant) == 1 and data.batch_sampler.next_round == 1


def test_protocol_parameters_are_fixed_after_make_private():
    engine, module, optimizer, data = private("shuffled_checkin")
    sampler = data.batch_sampler
    for target, name, value in [
        (sampler, "rate", 0.9),
        (sampler, "n", 3),
        (sampler, "seed", 1),
        (optimizer, "accounting_sample_rate", 0.9),
        (optimizer, "noise_multiplier", 0.1),
        (optimizer, "max_grad_norm", 100.0),
    ]:
        with pytest.raises(AttributeError, match=f"{name} of a .* is fixed"):
            setattr(target, name, value)
    assert (sampler.rate, optimizer.accounting_sample_rate, optimizer.noise_multiplier) == (
        0.25,
        0.25,
        2.0,
    )
    train(module, optimizer, data)
    assert engine.accountant.history == [(2.0, 0.25, ROUNDS)]


def test_a_second_pass_continues_with_new_rounds():
    engine, module, optimizer, data = private("shuffled_checkin", rounds=5)
    sampler, x_all = data.batch_sampler, dataset()[:][0]
    passes = []
    for _ in range(2):
        assert len(data) == 5
        seen = []
        for x, y in data:
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(module(x), y).backward()
            optimizer.step()
            seen.append(x)
        passes.append(seen)
    for t, x in enumerate(passes[0] + passes[1]):
        assert torch.equal(x, x_all[sampler.batch(t)])  # rounds 0-4, then the new rounds 5-9
    assert [len(x) for x in passes[0]] != [len(x) for x in passes[1]]
    assert engine.accountant.history == [(2.0, 0.25, 10)]


def test_wrong_sampler_for_subsampled_accountant():
    engine = PrivacyEngine(accountant="subsampled_shuffle")
    net = model()
    bad = DataLoader(dataset(), batch_sampler=ShuffledCheckInSampler(N_CLIENTS, 0.1, 5, seed=0))
    with pytest.raises(ValueError, match="needs the subsampled protocol"):
        shuffle_opacus.make_private(
            engine,
            module=net,
            optimizer=torch.optim.SGD(net.parameters(), lr=0.1),
            data_loader=bad,
            noise_multiplier=1.0,
            max_grad_norm=1.0,
        )
    assert not has_grad_sample_hooks(net)


def test_loader_sampler_is_used_and_must_agree_with_arguments():
    engine = PrivacyEngine(accountant="subsampled_shuffle")
    net = model()
    data = fixed_loader(8)
    with pytest.raises(ValueError, match="sample_size=9 contradicts"):
        shuffle_opacus.make_private(
            engine,
            module=net,
            optimizer=torch.optim.SGD(net.parameters(), lr=0.1),
            data_loader=data,
            noise_multiplier=1.0,
            max_grad_norm=1.0,
            sample_size=9,
        )
    module, optimizer, private_data = shuffle_opacus.make_private(
        engine,
        module=net,
        optimizer=torch.optim.SGD(net.parameters(), lr=0.1),
        data_loader=data,
        noise_multiplier=1.0,
        max_grad_norm=1.0,
    )
    assert private_data.batch_sampler is data.batch_sampler
    sizes, _ = train(module, optimizer, private_data)
    assert sizes == [8] * 5
    assert engine.accountant.history == [(1.0, 8 / N_CLIENTS, 5)]


def test_report_count_mismatch_is_caught_at_the_step():
    # A subsampled accountant fed rounds of another size (a user swapping loaders).
    engine, module, optimizer, _ = private("subsampled_shuffle")
    wrong = DataLoader(dataset(), batch_sampler=FixedSizeShuffledSampler(N_CLIENTS, 5, 2, seed=0))
    x, y = next(iter(wrong))
    optimizer.zero_grad()
    torch.nn.functional.cross_entropy(module(x), y).backward()
    with pytest.raises(ValueError, match="expects 16 reports per round; this round had 5"):
        optimizer.step()
    assert len(engine.accountant) == 0


# --- calibration never overshoots ---------------------------------------------------------


# 20 examples (the least the project allows; 30 before): one example costs up to 7 s of CPU
# where a tiny target at delta 1e-9 needs a noise multiplier in the hundreds.
@settings(max_examples=20, deadline=None)
@given(
    n=st.integers(2, 100_000),
    rate=st.floats(0.001, 1.0),
    rounds=st.integers(1, 2000),
    target=st.floats(0.05, 8.0),
    log_delta=st.floats(-9, -3),
)
def test_calibration_never_overshoots(n, rate, rounds, target, log_delta):
    # The search on its own, with the Rényi bound (cheap): each pld evaluation builds a pair.
    delta = 10.0**log_delta
    try:
        sigma = shuffle_opacus.calibrate_noise_multiplier(
            target_epsilon=target,
            delta=delta,
            population=n,
            rounds=rounds,
            rate=rate,
            max_noise_multiplier=1e3,
            method="exact",
        )
    except ValueError as err:
        assert "not reached" in str(err)
        return
    eps = history_epsilon(
        [(sigma, rate, rounds)], protocol="checkin", delta=delta, population=n, method="exact"
    ).epsilon
    assert eps <= target


def test_default_calibration_refuses_an_unreachable_target_after_one_look_at_the_cap():
    # pld has no conversion floor: only the noise cap says that a target cannot be met. (50
    # clients at rate 0.2: the first look, at noise multiplier 1, costs 4 s of CPU at 2000.)
    with pytest.raises(ValueError, match="is not reached with noise_multiplier <= 64"):
        shuffle_opacus.calibrate(
            target_epsilon=1e-300, delta=1e-5, population=50, rounds=3, rate=0.2,
            max_noise_multiplier=64.0, max_seconds=None,
        )  # fmt: skip


@pytest.mark.parametrize(
    ("n", "rate", "rounds", "target"),
    [
        (50, 0.2, 60, 0.5),  # pld everywhere on the way (2000 clients at 0.05: 2.5x the CPU)
        (300, 0.2, 10, 12.0),  # a target the pld lattice cannot reach: the Rényi bound answers
    ],
)
def test_default_calibration_never_overshoots_and_names_its_method(n, rate, rounds, target):
    found = shuffle_opacus.calibrate(
        target_epsilon=target, delta=1e-5, population=n, rounds=rounds, rate=rate
    )
    eps = history_epsilon(
        [(found.noise_multiplier, rate, rounds)],
        protocol="checkin",
        delta=1e-5,
        population=n,
        method=found.method,
    ).epsilon
    assert eps == found.epsilon <= target
    renyi = shuffle_opacus.calibrate_noise_multiplier(
        target_epsilon=target, delta=1e-5, population=n, rounds=rounds, rate=rate, method="exact"
    )
    # The tighter method never needs more noise (both searches stop within rel_tol = 1e-3).
    assert found.noise_multiplier <= renyi * (1 + 1e-3)
    assert (found.method == "pld") == (found.note is None or "limited" in found.note)


# --- per-sample gradient modes ------------------------------------------------------------


@pytest.mark.parametrize("mode", ["hooks", "functorch"])
def test_grad_sample_modes_survive_empty_rounds(mode):
    engine, module, optimizer, data = private(
        "shuffled_checkin", rate=0.02, rounds=40, grad_sample_mode=mode
    )
    sizes, _ = train(module, optimizer, data)
    assert 0 in sizes and len(engine.accountant) == 40
    assert all(torch.isfinite(p).all() for p in module.parameters())


def test_expanded_weights_mode_for_fixed_size_rounds():
    engine, module, optimizer, data = private("subsampled_shuffle", grad_sample_mode="ew")
    sizes, eps = train(module, optimizer, data, engine)
    assert sizes == [16] * ROUNDS
    core = compute_epsilon("subsampled", n=N_CLIENTS, m=16, sigma=1.0, steps=ROUNDS, delta=1e-5)
    assert eps[-1] == pytest.approx(core.epsilon, rel=1e-12)


def test_expanded_weights_mode_is_refused_when_empty_rounds_are_likely():
    engine = PrivacyEngine(accountant="shuffled_checkin")
    net = model()
    with pytest.raises(ValueError, match="grad_sample_mode='ew' cannot process an empty round"):
        shuffle_opacus.make_private(
            engine,
            module=net,
            optimizer=torch.optim.SGD(net.parameters(), lr=0.1),
            data_loader=loader(),
            noise_multiplier=1.0,
            max_grad_norm=1.0,
            rate=0.02,
            rounds=40,
            grad_sample_mode="ew",
        )
    assert not has_grad_sample_hooks(net)
    # With n * rate large an empty round is out of reach and the mode is allowed.
    _, module, optimizer, data = private("shuffled_checkin", rate=0.9, grad_sample_mode="ew")
    sizes, _ = train(module, optimizer, data)
    assert min(sizes) > 0


def test_an_engine_with_rounds_for_another_population_is_refused():
    engine, module, optimizer, data = private("shuffled_checkin")
    train(module, optimizer, data)
    net = model()
    with pytest.raises(ValueError, match="already holds 10 rounds"):
        shuffle_opacus.make_private(
            engine,
            module=net,
            optimizer=torch.optim.SGD(net.parameters(), lr=0.1),
            data_loader=loader(n=32),
            noise_multiplier=1.0,
            max_grad_norm=1.0,
            rate=0.1,
            rounds=3,
        )
    assert not has_grad_sample_hooks(net)
    assert engine.accountant.population == N_CLIENTS and len(engine.accountant) == 10


def test_guarantee_names_the_method():
    from shuffle_opacus.engine.privacy import method_for_guarantee

    assert method_for_guarantee(None, "exact") == "exact"
    assert method_for_guarantee("tight", None) == "pld"
    assert method_for_guarantee("proven", "proven") == "proven"
    with pytest.raises(ValueError, match="guarantee must be 'tight' or 'proven'. Found 'strong'"):
        method_for_guarantee("strong", None)
    with pytest.raises(ValueError, match="method must be 'proven' or None"):
        method_for_guarantee("proven", "pld")
