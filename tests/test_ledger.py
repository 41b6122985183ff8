"""The ledger of released rounds: recording, counting, extending, saving, loading, epsilon."""

import pickle
import warnings

import pytest

from shuffle_opacus.accounting.history import history_epsilon
from shuffle_opacus.accounting.ledger import RoundLedger, read_history
from shuffle_opacus.engine.accountants import ShuffledCheckInAccountant

N = 40
DELTA = 1e-5


def test_equal_consecutive_rounds_share_an_entry():
    ledger = RoundLedger()
    for settings in [(2.0, 0.1)] * 3 + [(3.0, 0.1)] * 2 + [(2.0, 0.1)]:
        ledger.record(*settings)
    assert ledger.entries == [(2.0, 0.1, 3), (3.0, 0.1, 2), (2.0, 0.1, 1)]
    assert ledger.rounds == 6


def test_a_round_with_another_rate_starts_an_entry():
    ledger = RoundLedger()
    ledger.record(2.0, 0.1)
    ledger.record(2.0, 0.2)
    assert ledger.entries == [(2.0, 0.1, 1), (2.0, 0.2, 1)]


def test_extending_adds_one_entry_and_records_nothing():
    ledger = RoundLedger([(2.0, 0.1, 3)])
    assert ledger.extended(5, 2.0, 0.1) == ((2.0, 0.1, 3), (2.0, 0.1, 2))
    assert ledger.extended(3, 2.0, 0.1) == ((2.0, 0.1, 3),)
    assert ledger.extended(7, 1.0, 0.1, done=4) == ((2.0, 0.1, 3), (1.0, 0.1, 3))
    assert ledger.entries == [(2.0, 0.1, 3)] and ledger.rounds == 3
    assert RoundLedger().extended(0, 2.0, 0.1) == ()


def test_extending_below_the_rounds_held_is_refused_in_one_line():
    ledger = RoundLedger([(2.0, 0.1, 3)])
    with pytest.raises(ValueError, match="^rounds ") as info:
        ledger.extended(2, 2.0, 0.1)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ("abc", r"history must be a list of \(noise_multiplier"),
        ([(2.0, 0.1)], r"history\[0\] must be a \(noise_multiplier, sample_rate, steps\)"),
        ([(2.0, 0.1, 1), (0.0, 0.1, 1)], r"history\[1\] noise_multiplier must be"),
        ([(2.0, 1.5, 1)], r"history\[0\] sample_rate must be in \(0, 1\]"),
        ([(2.0, 0.1, -1)], r"history\[0\] steps must be an integer"),
        ([(2.0, 0.1, 2**62), (2.0, 0.1, 1)], r"history must hold at most"),
    ],
)
def test_malformed_entries_are_refused_in_one_line(raw, message):
    ledger = RoundLedger()
    ledger.entries = raw  # as an accountant's history may be assigned
    with pytest.raises(ValueError, match=message) as info:
        ledger.checked()
    assert "\n" not in str(info.value)
    with pytest.raises(ValueError, match=message.replace("history", r"state_dict\['history'\]")):
        RoundLedger.from_state(raw)


def test_a_negative_cache_size_is_refused():
    with pytest.raises(ValueError, match="^cache_size "):
        RoundLedger(cache_size=-1)


def test_the_state_is_the_list_the_accountants_always_saved():
    accountant = ShuffledCheckInAccountant().configure(population=N)
    for _ in range(3):
        accountant.step(noise_multiplier=2.0, sample_rate=0.1)
    saved = accountant.state_dict()["history"]
    assert saved == [(2.0, 0.1, 3)] and type(saved) is list and type(saved[0]) is tuple
    assert pickle.dumps(saved) == pickle.dumps([(2.0, 0.1, 3)])
    assert saved == accountant.ledger.to_state() and saved is not accountant.history
    saved.append((1.0, 0.1, 1))  # a copy: the ledger is untouched
    assert accountant.history == [(2.0, 0.1, 3)]


def test_a_state_round_trips_and_an_old_one_loads():
    ledger = RoundLedger()
    ledger.record(2.0, 0.1)
    ledger.record(3.0, 0.1)
    assert RoundLedger.from_state(ledger.to_state()).entries == ledger.entries
    # Saved before the release record existed, through JSON: lists and integers.
    old = {
        "history": [[2, 0.1, 3], [3.0, 0.1, 2]],
        "mechanism": "shuffled_checkin",
        "population": N,
        "sensitivity": 2.0,
        "method": None,
    }
    assert RoundLedger.from_state(old["history"]).entries == [(2.0, 0.1, 3), (3.0, 0.1, 2)]
    accountant = ShuffledCheckInAccountant()
    accountant.load_state_dict(old)
    assert accountant.history == [(2.0, 0.1, 3), (3.0, 0.1, 2)] and len(accountant) == 5
    assert accountant.history is accountant.ledger.entries
    assert accountant.releases.any_seed == 5  # rounds 0..4 of every seed count as released


def test_an_accountants_history_is_its_ledger():
    accountant = ShuffledCheckInAccountant().configure(population=N)
    accountant.history = [(2.0, 0.1, 4)]
    assert accountant.ledger.entries == [(2.0, 0.1, 4)] and len(accountant) == 4
    accountant.step(noise_multiplier=2.0, sample_rate=0.1)
    assert accountant.history == [(2.0, 0.1, 5)]


@pytest.mark.parametrize("method", ["exact", "pld"])
def test_epsilon_is_history_epsilon_bit_for_bit(method):
    history = [(2.0, 0.1, 3), (3.0, 0.1, 2)]
    args = {"protocol": "checkin", "delta": DELTA, "population": N, "method": method}
    expected = history_epsilon(history, **args)
    ledger = RoundLedger(history)
    got = ledger.epsilon(**args)
    assert got.epsilon == expected.epsilon and got.method == expected.method
    assert ledger.epsilon(**args) is got  # kept
    extended = ledger.extended(7, 2.0, 0.1)
    other = ledger.epsilon(**args, history=extended)
    assert other.epsilon == history_epsilon(list(extended), **args).epsilon > got.epsilon
    accountant = ShuffledCheckInAccountant().configure(population=N, method=method)
    accountant.history = history
    assert accountant.get_epsilon(DELTA) == expected.epsilon


def test_results_are_kept_up_to_the_cache_size():
    args = {"protocol": "checkin", "delta": DELTA, "population": N, "method": "exact"}
    ledger = RoundLedger([(2.0, 0.1, 1)], cache_size=2)
    first = ledger.epsilon(**args)
    ledger.epsilon(**args, history=[(2.0, 0.1, 2)])
    assert ledger.epsilon(**args) is first
    ledger.epsilon(**args, history=[(2.0, 0.1, 3)])  # the oldest (first) goes
    again = ledger.epsilon(**args)
    assert again is not first and again.epsilon == first.epsilon
    unkept = RoundLedger([(2.0, 0.1, 1)], cache_size=0)
    assert unkept.epsilon(**args) is not unkept.epsilon(**args)


def test_a_history_of_lists_is_computed_without_keeping():
    args = {"protocol": "checkin", "delta": DELTA, "population": N, "method": "exact"}
    ledger = RoundLedger([[2.0, 0.1, 2]])  # type: ignore[list-item]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        result = ledger.epsilon(**args)
    assert result.epsilon == history_epsilon([(2.0, 0.1, 2)], **args).epsilon
    assert not ledger._results


def test_read_history_is_the_one_the_state_module_uses():
    from shuffle_opacus.engine import accountant_state

    assert accountant_state.read_history is read_history
