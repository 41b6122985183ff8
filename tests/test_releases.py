"""Only what is accounted is released: replays, copies, replaced parts, set-up leaks, steps.

Each test names the way ordinary or careless code could release more than the accountant
counts, and checks that it is refused before anything leaves (the accountant, the weights and
the buffers unchanged), or that it continues with new rounds that are counted.
"""

from __future__ import annotations

import copy
import functools
import pickle
import warnings

import hypothesis.strategies as st
import pytest
import torch
from hypothesis import given, settings
from opacus import PrivacyEngine
from torch import nn
from torch.nn import functional as F  # noqa: N812
from torch.utils.data import DataLoader

import shuffle_opacus
from shuffle_opacus.engine.releases import ReleaseRecord, ReplayError
from shuffle_opacus.federated import make_private_clients

from .opacus_helpers import SETTINGS, dataset, loader, model

LOSS = functools.partial(F.cross_entropy, reduction="none")
X = torch.randn(20, 3, generator=torch.Generator().manual_seed(0))
Y = torch.randint(0, 2, (20,), generator=torch.Generator().manual_seed(1))
CLIENTS = [list(range(0, 5)), list(range(5, 10)), list(range(10, 20))]
USER_SETTINGS = {
    "shuffle": {},
    "subsampled_shuffle": {"sample_size": 2},
    "shuffled_checkin": {"rate": 0.5},
}


def users(engine: PrivacyEngine, net: nn.Module | None = None, **kw):
    net = net if net is not None else nn.Linear(3, 2)
    optimizer = torch.optim.SGD(net.parameters(), lr=1.0)
    args = {
        "module": net,
        "optimizer": optimizer,
        "data": (X, Y),
        "partition": CLIENTS,
        "loss_fn": LOSS,
        "noise_multiplier": 2.0,
        "max_update_norm": 1.0,
        "client_lr": 0.1,
        "local_steps": 1,
        "rounds": 6,
        "seed": 0,
        **USER_SETTINGS[engine.accountant.mechanism()],
        **kw,
    }
    return make_private_clients(engine, **args), optimizer


def state(net: nn.Module) -> list[torch.Tensor]:
    return [t.detach().clone() for t in [*net.parameters(), *net.buffers()]]


def same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return len(a) == len(b) and all(torch.equal(u, v) for u, v in zip(a, b, strict=True))


# -- User level -------------------------------------------------------------------------------


@pytest.mark.parametrize("accountant", sorted(USER_SETTINGS))
def test_a_second_trainer_with_the_same_seed_is_refused_or_continues(accountant):
    engine = PrivacyEngine(accountant=accountant)
    run, opt = users(engine)
    for _ in run:
        opt.step()
    eps = engine.get_epsilon(1e-5, method=engine.accountant.spec().fallback)
    with pytest.raises(ReplayError, match=r"start_round=0: round 0 of seed 0 .* start_round=6"):
        users(engine)
    with pytest.raises(ReplayError, match="round 3 of seed 0"):
        users(engine, start_round=3, rounds=12)
    assert len(engine.accountant) == 6
    assert engine.get_epsilon(1e-5, method=engine.accountant.spec().fallback) == eps
    run, opt = users(engine, start_round=6, rounds=9)  # new rounds of the same seed
    assert len(run) == 3
    for _ in run:
        opt.step()
    assert len(engine.accountant) == 9
    assert engine.get_epsilon(1e-5, method=engine.accountant.spec().fallback) > eps


def test_a_restart_from_a_loaded_state_cannot_replay_its_rounds():
    engine = PrivacyEngine(accountant="shuffled_checkin")
    run, opt = users(engine)
    for _ in run:
        opt.step()
    saved = engine.accountant.state_dict()
    assert saved["released"] == [[0, 0, 6]]
    fresh = PrivacyEngine(accountant="shuffled_checkin")
    fresh.accountant.load_state_dict(saved)
    with pytest.raises(ReplayError, match="start_round=0"):
        users(fresh, start_round=0)
    # Loading an earlier state does not forget what was released since.
    engine.accountant.load_state_dict({**saved, "history": [], "released": []})
    with pytest.raises(ReplayError):
        users(engine, start_round=0)


@pytest.mark.parametrize("how", [copy.copy, copy.deepcopy, lambda t: pickle.loads(pickle.dumps(t))])
def test_trainers_cannot_be_copied(how):
    run, _ = users(PrivacyEngine(accountant="shuffled_checkin"))
    with pytest.raises(TypeError, match="FederatedTrainer cannot be"):
        how(run)


@pytest.mark.parametrize(
    "name", ["sampler", "accountant", "noise_multiplier", "max_update_norm", "partition"]
)
def test_a_built_trainer_is_read_only(name):
    run, _ = users(PrivacyEngine(accountant="shuffled_checkin"))
    with pytest.raises(AttributeError, match=f"{name} of a FederatedTrainer is fixed"):
        setattr(run, name, None)
    with pytest.raises(AttributeError):
        delattr(run, name)


def test_rounds_outside_the_plan_are_refused_and_len_counts_down():
    engine = PrivacyEngine(accountant="shuffled_checkin")
    run, opt = users(engine, rounds=4)
    assert len(run) == 4
    for bad in (10**6, 4, -1, 1.0, True):
        with pytest.raises(ValueError, match=r"round_index must be an integer in \[0, 4\)"):
            run.run_round(bad)
    run.run_round(0)
    assert len(run) == 3
    with pytest.raises(ValueError, match="round_index 0 was released already"):
        run.run_round(0)
    assert len(engine.accountant) == 1


class RunningMean(nn.Module):
    """A layer that writes a statistic of its input into a buffer in training mode."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(3, 2)
        self.register_buffer("mean", torch.zeros(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training:
            self.mean.mul_(0.9).add_(0.1 * x.mean(0))
        return self.lin(x - self.mean)


class LastInput(nn.Module):
    """A layer that keeps a number computed from its input as a plain attribute."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(3, 2)
        self.last: float | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.last = float(x.sum())
        return self.lin(x)


@pytest.mark.parametrize(("layer", "what"), [(RunningMean, r"\.mean"), (LastInput, ":last")])
def test_the_set_up_check_never_writes_client_data_into_the_model(layer, what):
    engine = PrivacyEngine(accountant="shuffled_checkin")
    net = layer()
    before = state(net)
    with pytest.raises(ValueError, match=f"changes its state \\({what}\\)"):
        users(engine, net=net)
    assert same(before, state(net))
    assert getattr(net, "last", None) is None
    assert len(engine.accountant) == 0


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"noise_multiplier": 1e-300}, "noise_multiplier=1e-300: epsilon of the 6 planned"),
        ({"noise_multiplier": 1e300}, "noise_multiplier must keep"),
        ({"noise_multiplier": 1e25}, "noise_multiplier must keep"),
        ({"max_update_norm": 1e300}, "max_update_norm must be at most"),
        ({"client_lr": 1e300}, "client_lr must be at most"),
    ],
)
def test_unaccountable_noise_and_overflowing_arithmetic_are_refused_before_round_0(change, message):
    engine = PrivacyEngine(accountant="shuffled_checkin")
    net = nn.Linear(3, 2)
    before = state(net)
    with pytest.raises(ValueError, match=message):
        users(engine, net=net, **change)
    assert same(before, state(net))
    assert len(engine.accountant) == 0 and not engine.accountant.is_configured


# -- Example level (make_private) --------------------------------------------------------------


def private(accountant="shuffled_checkin", data=None, **kw):
    engine = PrivacyEngine(accountant=accountant)
    net = model()
    args = {"noise_multiplier": 2.0, "max_grad_norm": 1.0, "rounds": 8, "seed": 4}
    args.update(SETTINGS[accountant][0])
    args.update(kw)
    net, opt, private_loader = shuffle_opacus.make_private(
        engine,
        module=net,
        optimizer=torch.optim.SGD(net.parameters(), lr=0.1),
        data_loader=data if data is not None else loader(),
        **args,
    )
    return engine, net, opt, private_loader


def step(net: nn.Module, opt, x: torch.Tensor, y: torch.Tensor) -> None:
    opt.zero_grad()
    F.cross_entropy(net(x), y).backward()
    opt.step()


@pytest.mark.parametrize("accountant", sorted(SETTINGS))
def test_a_second_step_on_one_round_is_refused_before_the_weights_change(accountant):
    engine, net, opt, private_loader = private(accountant)
    batches = iter(private_loader)
    next(batches)  # a round skipped: accounted, never stepped
    x, y = next(batches)
    step(net, opt, x, y)
    weights = state(net)
    with pytest.raises(ValueError, match="round 1, the private loader's current batch, was"):
        step(net, opt, x, y)
    assert same(weights, state(net))
    assert len(engine.accountant) == 2


def test_a_batch_from_elsewhere_is_refused_after_a_pass_without_steps():
    engine, net, opt, private_loader = private("shuffled_checkin")
    for _ in private_loader:
        pass
    last = private_loader.batch_sampler.batch(7)
    assert len(last) != 8
    foreign = next(iter(loader()))  # 8 examples of the original loader
    weights = state(net)
    with pytest.raises(
        ValueError, match=f"processes 8 per-sample gradients, but round 7 .* {len(last)} clients"
    ):
        step(net, opt, *foreign)
    assert same(weights, state(net))
    step(net, opt, *dataset()[last])  # round 7's own batch
    with pytest.raises(ValueError, match="was stepped already"):
        step(net, opt, *dataset()[last])
    assert len(engine.accountant) == 8


def test_steps_follow_the_batches_when_workers_prefetch_rounds():
    data = DataLoader(dataset(), batch_size=8, num_workers=1)
    engine, net, opt, private_loader = private("shuffled_checkin", data=data, rounds=6)
    steps = 0
    for x, y in private_loader:
        step(net, opt, x, y)
        steps += 1
    assert steps == len(engine.accountant) == 6


def test_a_second_loader_on_the_same_engine_cannot_replay_its_rounds():
    engine, net, opt, private_loader = private("shuffled_checkin")
    for x, y in private_loader:
        step(net, opt, x, y)
    net2 = model()
    with pytest.raises(ReplayError, match="start_round=0: round 0 of seed 4"):
        shuffle_opacus.make_private(
            engine,
            module=net2,
            optimizer=torch.optim.SGD(net2.parameters(), lr=0.1),
            data_loader=loader(),
            noise_multiplier=2.0,
            max_grad_norm=1.0,
            rounds=8,
            seed=4,
            rate=0.25,
        )
    assert len(engine.accountant) == 8


# -- The record ---------------------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(
    rounds=st.lists(
        st.tuples(st.integers(0, 3), st.integers(0, 40)), min_size=1, max_size=60, unique=True
    )
)
def test_the_release_record_holds_exactly_the_released_pairs(rounds):
    record = ReleaseRecord()
    for seed, t in rounds:
        record.add(seed, t)
    assert len(record) == len(rounds)
    held = {(seed, t) for seed, a, b in record.state() for t in range(a, b)}
    assert held == set(rounds)
    for seed, t in rounds[:5]:
        with pytest.raises(ReplayError):
            record.add(seed, t)
        assert record.first_released(seed, 0, 41) == min(u for s, u in rounds if s == seed)
        assert (seed, record.next_free(seed, t)) not in held
    again = ReleaseRecord.from_state(record.state())
    assert again.state() == record.state()
    half = ReleaseRecord()
    for seed, t in rounds[::2]:
        half.add(seed, t)
    half.merge(record)
    assert half.state() == record.state()


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ("abc", "must be a list"),
        ([[0, 1]], r"\[0\] must be a \[seed, start, stop\] triple"),
        ([[0, 3, 3]], r"stop must be an integer"),
        ([[-1, 0, 2]], r"seed must be an integer"),
    ],
)
def test_a_malformed_record_is_refused_in_one_line(raw, message):
    engine = PrivacyEngine(accountant="shuffled_checkin")
    saved = {**engine.accountant.state_dict(), "released": raw}
    with pytest.raises(ValueError, match=message):
        engine.accountant.load_state_dict(saved)


def test_a_followed_sampler_cannot_be_pickled():
    engine, net, opt, private_loader = private("shuffled_checkin")
    with pytest.raises(TypeError, match="follows cannot be pickled"):
        pickle.dumps(private_loader.batch_sampler)


def test_a_replaced_engine_accountant_is_refused():
    engine = PrivacyEngine(accountant="shuffled_checkin")
    run, opt = users(engine)
    for _ in run:
        opt.step()
    engine.accountant = type(engine.accountant)()
    with pytest.raises(ValueError, match="engine.accountant was replaced"):
        engine.get_epsilon(1e-5)
    with pytest.raises(ValueError, match="replaced after 6 rounds"):
        users(engine, seed=1)


def test_a_noise_generator_that_is_not_one_is_refused_at_make_private():
    with pytest.raises(ValueError, match="noise_generator must be a torch.Generator"):
        private("shuffled_checkin", noise_generator="gen")


def test_a_directly_assigned_history_of_too_many_rounds_is_one_line():
    engine = PrivacyEngine(accountant="shuffled_checkin")
    engine.accountant.configure(population=10)
    engine.accountant.history = [(1.0, 0.1, 10**30)]
    with pytest.raises(ValueError, match=r"history\[0\] steps must be an integer"):
        len(engine.accountant)
    with pytest.raises(ValueError, match=r"history\[0\] steps must be an integer"):
        engine.accountant.get_epsilon(1e-5)


def test_the_opacus_loop_does_not_print_torchs_full_backward_hook_warning():
    """The warning fires at every backward for inputs without gradients; it is filtered."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        engine, net, opt, private_loader = private("shuffled_checkin", rounds=2)
        for x, y in private_loader:
            step(net, opt, x, y)
    assert not [w for w in caught if "Full backward hook" in str(w.message)]


# -- Seeds that alias (issue 41, part 2) ------------------------------------------------------


def test_numpys_seed_sequence_aliases_seeds_above_the_bound():
    """Why the bound exists: seed 2**128 at round r >= 1 is seed 0 at round 1 + r * 2**32."""
    import numpy as np

    for r in range(1, 5):
        big = np.random.SeedSequence(2**128, spawn_key=(r,)).generate_state(4)
        small = np.random.SeedSequence(0, spawn_key=(1 + r * 2**32,)).generate_state(4)
        assert big.tolist() == small.tolist()


@pytest.mark.parametrize("seed", [2**128, 2**128 + 5, 2**200])
def test_a_seed_above_the_bound_is_refused_in_one_line(seed):
    message = r"^seed must be an integer in \[0, 2\*\*128 - 1\] .*Found \d+\.$"
    with pytest.raises(ValueError, match=message):
        shuffle_opacus.ShuffledCheckInSampler(20, 0.5, 3, seed=seed)
    engine = PrivacyEngine(accountant="shuffled_checkin")
    with pytest.raises(ValueError, match=message):
        private("shuffled_checkin", seed=seed)
    with pytest.raises(ValueError, match=message):
        users(engine, seed=seed)
    assert len(engine.accountant) == 0


def test_the_largest_seed_trains_and_its_state_loads():
    engine, net, opt, private_loader = private("shuffled_checkin", seed=2**128 - 1, rounds=2)
    for x, y in private_loader:
        step(net, opt, x, y)
    saved = engine.accountant.state_dict()
    assert saved["released"] == [[2**128 - 1, 0, 2]]
    fresh = PrivacyEngine(accountant="shuffled_checkin")
    fresh.accountant.load_state_dict(saved)
    assert fresh.accountant.releases.state() == saved["released"]
    with pytest.raises(
        ValueError, match=r"released'\]\[0\] seed must be an integer in \[0, 2\*\*128"
    ):
        fresh.accountant.load_state_dict({**saved, "released": [[2**128, 0, 2]]})


def test_the_rounds_of_seeds_in_use_are_unchanged():
    """Pinned batches (computed before the bound): the streams of accepted seeds are the same."""
    checkin = shuffle_opacus.ShuffledCheckInSampler
    assert checkin(20, 0.5, 3, seed=0).batch(0) == [19, 14, 4, 1, 18, 6, 17, 3, 11, 8]
    assert checkin(20, 0.5, 3, seed=2**32).batch(2**40) == [
        *[19, 15, 11, 1, 9, 7, 17, 10, 18, 4, 5, 2, 14, 13, 8]
    ]
    assert shuffle_opacus.FixedSizeShuffledSampler(10, 4, 3, seed=7).batch(5) == [9, 2, 4, 3]


# -- A state without its release record (issue 41, part 1) -----------------------------------


def test_a_state_without_its_record_cannot_replay_its_rounds_at_example_level():
    """n = 1, gamma = 0.1, sigma = 5: 50 rounds released twice were counted as 100 rounds."""
    one = DataLoader(dataset(1), batch_size=1)
    kw = {"noise_multiplier": 5.0, "max_grad_norm": 1.0, "rate": 0.1, "rounds": 50, "seed": 0}

    def prepare(engine: PrivacyEngine, **change):
        net = model()
        optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
        args = {**kw, **change}
        return shuffle_opacus.make_private(
            engine, module=net, optimizer=optimizer, data_loader=one, **args
        )

    engine = PrivacyEngine(accountant="shuffled_checkin")
    for _ in prepare(engine)[2]:
        pass  # released and accounted, stepped or not
    old = {k: v for k, v in engine.accountant.state_dict().items() if k != "released"}
    fresh = PrivacyEngine(accountant="shuffled_checkin")
    fresh.accountant.load_state_dict(old)
    assert fresh.get_epsilon(1e-5) == pytest.approx(4.930, abs=5e-4)  # readable for reporting
    message = (
        r"^start_round=0: .* 50 rounds from a state without a release record .*0\.\.49 of "
        r"every seed .* start_round=50 or later\.$"
    )
    with pytest.raises(ReplayError, match=message):
        prepare(fresh)
    assert len(fresh.accountant) == 50
    # Saved again, the state keeps the unknown rounds; any seed continues at round 50.
    again = PrivacyEngine(accountant="shuffled_checkin")
    again.accountant.load_state_dict(fresh.accountant.state_dict())
    assert again.accountant.state_dict()["released_any_seed"] == 50
    with pytest.raises(ReplayError, match="start_round=50 or later"):
        prepare(again, seed=7, start_round=49)
    loader_again = prepare(again, seed=7, start_round=50, rounds=52)[2]
    assert len(loader_again) == 2


def test_a_state_without_its_record_cannot_replay_its_rounds_at_user_level():
    engine = PrivacyEngine(accountant="shuffled_checkin")
    run, opt = users(engine)
    for _ in run:
        opt.step()
    saved = engine.accountant.state_dict()
    for old in ({k: v for k, v in saved.items() if k != "released"}, {**saved, "released": []}):
        fresh = PrivacyEngine(accountant="shuffled_checkin")
        fresh.accountant.load_state_dict(old)
        assert fresh.accountant.releases.any_seed == 6
        with pytest.raises(ReplayError, match=r"round_index|start_round=6 or later"):
            users(fresh, start_round=0)
        run, opt = users(fresh, start_round=6, rounds=8)
        for _ in run:
            opt.step()
        assert len(fresh.accountant) == 8


def test_the_record_counts_rounds_of_an_unknown_seed_as_released():
    record = ReleaseRecord()
    record.add(3, 10)
    record.release_any_seed(5)
    assert record.first_released(99, 0, 3) == 0 and record.first_released(99, 5, 9) is None
    assert record.next_free(99, 0) == 5 and record.next_free(3, 2) == 5
    assert record.next_free(3, 10) == 11
    with pytest.raises(ReplayError, match="rounds 0..4 of every seed"):
        record.add(99, 4)
    record.add(99, 5)
    assert len(record) == 2 and record.any_seed == 5
