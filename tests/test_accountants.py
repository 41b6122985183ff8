"""One contract, run against all three accountants (registry, construction, history, state)."""

from __future__ import annotations

import copy
import math

import pytest
from opacus.accountants import create_accountant
from opacus.accountants.utils import get_noise_multiplier

import shuffle_opacus
from shuffle_opacus.analysis.epsilon import compute_epsilon
from shuffle_opacus.engine.accountants import ACCOUNTANTS, ShuffleAccountantBase

N = 1000
CONFIG = {
    "shuffle": {"population": N},
    "subsampled_shuffle": {"population": N, "sample_size": 50},
    "shuffled_checkin": {"population": N},
}
RATE = {"shuffle": 1.0, "subsampled_shuffle": 0.05, "shuffled_checkin": 0.05}
CORE = {
    "shuffle": {"mechanism": "shuffle"},
    "subsampled_shuffle": {"mechanism": "subsampled", "m": 50},
    "shuffled_checkin": {"mechanism": "checkin", "rate": 0.05},
}
NAMES = sorted(ACCOUNTANTS)


def configured(name: str, **extra) -> ShuffleAccountantBase:
    acc = create_accountant(name)
    acc.configure(**CONFIG[name], **extra)
    return acc


@pytest.mark.parametrize("name", NAMES)
class TestContract:
    def test_registered_under_its_name(self, name):
        acc = create_accountant(name)
        assert type(acc) is ACCOUNTANTS[name]
        assert acc.mechanism() == name

    def test_no_argument_construction_is_empty(self, name):
        acc = ACCOUNTANTS[name]()
        assert acc.history == [] and len(acc) == 0 and acc.population is None
        assert acc.get_epsilon(delta=1e-5) == 0.0

    def test_unconfigured_history_raises_instead_of_guessing(self, name):
        acc = ACCOUNTANTS[name]()
        acc.history = [(2.0, RATE[name], 10)]
        with pytest.raises(ValueError, match="population"):
            acc.get_epsilon(delta=1e-5)

    def test_epsilon_equals_core_with_replace_one_sensitivity(self, name):
        acc = configured(name)
        acc.history = [(3.0, RATE[name], 40)]
        core = compute_epsilon(**CORE[name], n=N, sigma=1.5, steps=40, delta=1e-5)
        assert acc.get_epsilon(delta=1e-5) == pytest.approx(core.epsilon, rel=1e-12)

    def test_paper_sensitivity_uses_noise_multiplier_as_sigma(self, name):
        acc = configured(name, sensitivity="paper")
        acc.history = [(3.0, RATE[name], 40)]
        core = compute_epsilon(**CORE[name], n=N, sigma=3.0, steps=40, delta=1e-5)
        assert acc.get_epsilon(delta=1e-5) == pytest.approx(core.epsilon, rel=1e-12)

    def test_get_epsilon_does_not_mutate(self, name):
        acc = configured(name)
        for _ in range(3):
            acc.step(noise_multiplier=2.0, sample_rate=RATE[name])
        before = copy.deepcopy(acc.state_dict())
        acc.get_epsilon(delta=1e-5)
        acc.get_privacy_spent(delta=1e-6)
        assert acc.state_dict() == before

    def test_steps_merge_and_compose(self, name):
        acc = configured(name)
        for _ in range(5):
            acc.step(noise_multiplier=2.0, sample_rate=RATE[name])
        for _ in range(3):
            acc.step(noise_multiplier=4.0, sample_rate=RATE[name])
        assert acc.history == [(2.0, RATE[name], 5), (4.0, RATE[name], 3)]
        assert len(acc) == 8
        only_first = configured(name)
        only_first.history = [(2.0, RATE[name], 5)]
        assert acc.get_epsilon(1e-5) > only_first.get_epsilon(1e-5)

    def test_state_round_trip_restores_epsilon_and_configuration(self, name):
        acc = configured(name, sensitivity="paper")
        acc.history = [(2.0, RATE[name], 7), (3.0, RATE[name], 4)]
        state = acc.state_dict()
        fresh = create_accountant(name)
        fresh.load_state_dict(state)
        assert fresh.get_epsilon(1e-5) == acc.get_epsilon(1e-5)
        assert (fresh.population, fresh.sensitivity, fresh.method, fresh.sample_size) == (
            acc.population,
            acc.sensitivity,
            acc.method,
            acc.sample_size,
        )

    def test_load_refuses_other_mechanism_and_conflicting_configuration(self, name):
        other = next(n for n in NAMES if n != name)
        with pytest.raises(ValueError, match="mechanism"):
            create_accountant(name).load_state_dict(configured(other).state_dict())
        acc = configured(name)
        acc.history = [(2.0, RATE[name], 3)]
        state = acc.state_dict()
        target = create_accountant(name)
        extra = {"sample_size": 10} if name == "subsampled_shuffle" else {}
        target.configure(population=N // 2, **extra)
        with pytest.raises(ValueError, match="population"):
            target.load_state_dict(state)
        assert target.history == [] and target.population == N // 2

    def test_calibration_through_history(self, name):
        target = 2.0
        sigma = shuffle_opacus.calibrate_noise_multiplier(
            target_epsilon=target,
            delta=1e-5,
            population=N,
            rounds=100,
            protocol=create_accountant(name).protocol(),
            **({"rate": RATE[name]} if name == "shuffled_checkin" else {}),
            **({"sample_size": 50} if name == "subsampled_shuffle" else {}),
        )
        acc = configured(name)
        acc.history = [(sigma, RATE[name], 100)]
        assert acc.get_epsilon(delta=1e-5) <= target
        acc.history = [(sigma / 1.002, RATE[name], 100)]
        assert acc.get_epsilon(delta=1e-5) > target

    def test_opacus_calibration_fails_with_a_pointer(self, name):
        with pytest.raises(ValueError, match="shuffle_opacus.make_private"):
            get_noise_multiplier(
                target_epsilon=1.0,
                target_delta=1e-5,
                sample_rate=RATE[name],
                steps=10,
                accountant=name,
            )

    def test_opacus_hook_is_refused(self, name):
        with pytest.raises(ValueError, match="central noise"):
            create_accountant(name).get_optimizer_hook_fn(sample_rate=RATE[name])

    @pytest.mark.parametrize("bad", [0.0, -1.0, math.nan, math.inf])
    def test_step_rejects_bad_noise(self, name, bad):
        acc = configured(name)
        with pytest.raises(ValueError, match="noise_multiplier must be"):
            acc.step(noise_multiplier=bad, sample_rate=RATE[name])
        assert acc.history == []


def test_sample_rate_must_match_protocol():
    acc = configured("shuffle")
    with pytest.raises(ValueError, match="sample_rate"):
        acc.step(noise_multiplier=1.0, sample_rate=0.5)
    acc = configured("subsampled_shuffle")
    with pytest.raises(ValueError, match="sample_rate"):
        acc.step(noise_multiplier=1.0, sample_rate=0.06)
    acc = configured("shuffled_checkin")
    for bad in (0.0, 1.5, -0.1):
        with pytest.raises(ValueError, match=r"sample_rate must be in \(0, 1\]"):
            acc.step(noise_multiplier=1.0, sample_rate=bad)


@pytest.mark.parametrize(
    ("name", "kwargs", "message"),
    [
        ("shuffle", {"population": 0}, r"population must be an integer >= 1"),
        ("shuffle", {"population": 10, "sample_size": 5}, "sample_size"),
        ("subsampled_shuffle", {"population": 10}, "sample_size is required"),
        ("subsampled_shuffle", {"population": 10, "sample_size": 11}, r"in \[1, 10\]"),
        ("shuffled_checkin", {"population": 10, "sample_size": 5}, "sample_size is not"),
        ("shuffled_checkin", {"population": 10, "sensitivity": -1}, "sensitivity"),
        ("shuffled_checkin", {"population": 10, "sensitivity": "l2"}, "sensitivity must be one"),
        ("shuffled_checkin", {"population": 10, "method": "theorem1"}, "method must be one of"),
    ],
)
def test_configure_rejects_bad_values_atomically(name, kwargs, message):
    acc = create_accountant(name)
    with pytest.raises(ValueError, match=message):
        acc.configure(**kwargs)
    assert acc.population is None and acc.sensitivity == 2.0


def test_checkin_default_is_the_tightest_method():
    acc = configured("shuffled_checkin")
    acc.history = [(5.0, 0.1, 200)]
    eps = {method: acc.get_epsilon(1e-5, method=method) for method in ("exact", "sum", "theorem3")}
    assert create_accountant("shuffled_checkin").method is None  # the default
    default = acc.epsilon_result(1e-5)
    assert default.method == "pld" and default.note is None
    assert acc.get_epsilon(1e-5) == default.epsilon == acc.get_epsilon(1e-5, method="pld")
    assert default.epsilon < eps["exact"] == min(eps.values())
    with pytest.raises(ValueError, match="method must be one of pld, proven, exact, sum, theorem3"):
        acc.get_epsilon(1e-5, method="theorem1")


def test_unexpected_keyword_arguments_are_rejected():
    acc = configured("shuffled_checkin")
    acc.history = [(2.0, 0.05, 3)]
    with pytest.raises(ValueError, match="unexpected arguments"):
        acc.get_epsilon(1e-5, population=5)


def test_negative_steps_in_a_history_are_rejected():
    acc = configured("shuffled_checkin")
    acc.history = [(2.0, 0.05, 10), (2.0, 0.05, -3)]
    with pytest.raises(ValueError, match=r"history\[1\] steps must be an integer in \[0, "):
        acc.get_epsilon(1e-5)


def test_unconfigured_step_still_checks_the_rate():
    acc = create_accountant("subsampled_shuffle")
    with pytest.raises(ValueError, match=r"sample_rate must be in \(0, 1\]"):
        acc.step(noise_multiplier=1.0, sample_rate=2.0)


# --- the history and the configuration agree, whichever comes first --------------------------


def test_rounds_recorded_before_configure_are_checked_against_it():
    acc = shuffle_opacus.SubsampledShuffleAccountant()
    for _ in range(10):
        acc.step(noise_multiplier=2.0, sample_rate=0.01)
    with pytest.raises(ValueError, match=r"sample_rate 0.01, which contradicts .* sample rate 0.1"):
        acc.configure(population=100, sample_size=10)
    assert acc.population is None and acc.history == [(2.0, 0.01, 10)]
    acc.configure(population=100, sample_size=1)  # the rate the rounds were recorded with
    assert acc.get_epsilon(1e-5) > 0


def test_a_history_assigned_after_configure_is_checked_at_get_epsilon():
    acc = configured("subsampled_shuffle")
    acc.history = [(2.0, 0.01, 10)]  # m = 10 of N, not the configured 50
    with pytest.raises(ValueError, match="contradicts its configuration"):
        acc.get_epsilon(1e-5)


def test_an_unconfigured_state_must_fit_the_configured_accountant():
    state = create_accountant("subsampled_shuffle").state_dict()
    state["history"] = [(2.0, 0.01, 10)]
    acc = configured("subsampled_shuffle")
    with pytest.raises(ValueError, match="sample_rate of the subsampled_shuffle accountant"):
        acc.load_state_dict(state)
    assert acc.history == []


def test_load_refuses_to_switch_the_method_silently():
    source = configured("shuffled_checkin", method="theorem3")
    source.history = [(2.0, 0.05, 10)]
    target = configured("shuffled_checkin")
    with pytest.raises(ValueError, match="with method 'theorem3'.*configured with the default"):
        target.load_state_dict(source.state_dict())
    assert target.method is None and target.history == []
    target.configure(**CONFIG["shuffled_checkin"], method="theorem3")  # explicit
    target.load_state_dict(source.state_dict())
    assert target.get_epsilon(1e-5) == source.get_epsilon(1e-5)


def test_loading_an_older_state_warns_that_epsilon_goes_back():
    acc = configured("shuffled_checkin")
    acc.history = [(2.0, 0.05, 3)]
    older = acc.state_dict()
    acc.step(noise_multiplier=2.0, sample_rate=0.05)
    with pytest.warns(
        shuffle_opacus.engine.accountants.HistoryRollbackWarning, match="held 4 rounds"
    ):
        acc.load_state_dict(older)
    assert len(acc) == 3


@pytest.mark.parametrize(
    ("history", "message"),
    [
        (None, r"state_dict\['history'\] must be a list .* Found NoneType"),
        ([(2.0, 0.05)], r"state_dict\['history'\]\[0\] must be a \(noise_multiplier"),
        ("abc", r"must be a list of .* Found str"),
        ([(2.0, "0.05", 3)], r"\[0\] sample_rate must be a number in \(0, 1\]"),
        ([(True, 0.05, 3)], r"\[0\] noise_multiplier must be a finite number > 0"),
        ([(2.0, 0.05, 1.5)], r"\[0\] steps must be an integer >= 0"),
        # len() and epsilon need the rounds as a count the analyses take (at most 2**62).
        ([(2.0, 0.05, 10**30)], r"\[0\] steps must be an integer in \[0, 4611686018427387904\]"),
        ([(2.0, 0.05, 2**62), (2.0, 0.05, 1)], r"at most 4611686018427387904 rounds in all"),
    ],
)
def test_malformed_saved_history_is_one_line(history, message):
    state = configured("shuffled_checkin").state_dict()
    state["history"] = history
    acc = create_accountant("shuffled_checkin")
    with pytest.raises(ValueError, match=message) as info:
        acc.load_state_dict(state)
    assert "\n" not in str(info.value) and acc.history == []


def test_a_saved_history_of_2_62_rounds_loads_and_counts():
    """The bound on a loaded history is the largest count, not a smaller one."""
    state = configured("shuffled_checkin").state_dict()
    state["history"] = [(2.0, 0.05, 2**62 - 1), (3.0, 0.05, 1)]
    acc = create_accountant("shuffled_checkin")
    acc.load_state_dict(state)
    assert len(acc) == 2**62


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda a: a.step(noise_multiplier="1.0", sample_rate=0.05), "noise_multiplier must be"),
        (lambda a: a.step(noise_multiplier=True, sample_rate=0.05), "noise_multiplier must be"),
        (lambda a: a.step(noise_multiplier=2.0, sample_rate="0.1"), "sample_rate must be"),
        (lambda a: a.get_epsilon(delta="1e-5"), r"delta must be a number in \(0, 1\)"),
        (lambda a: a.configure(population=N, sensitivity=1e-9), r"number in \[1, 2\]"),
        (lambda a: a.configure(population=N, sensitivity=3.0), r"number in \[1, 2\]"),
        (lambda a: a.configure(population=True), "population must be an integer"),
    ],
)
def test_numbers_are_strict(call, message):
    acc = configured("shuffled_checkin")
    with pytest.raises(ValueError, match=message):
        call(acc)
    assert acc.history == [] and acc.sensitivity == 2.0
