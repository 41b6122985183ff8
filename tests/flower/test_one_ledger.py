"""One history per Flower run: the strategy's ledger is its accountant's (issue 43).

A round composed once appears once, whichever side records or reads it; a noiseless round is in
that history and makes ε infinite; a state the accountant saved, before this change or after,
loads into a strategy and gives the ε the strategy then reports.
"""

from __future__ import annotations

import json
import math

import pytest

pytest.importorskip("flwr")

from shuffle_opacus import history_epsilon  # noqa: E402
from shuffle_opacus.accounting.ledger import RoundLedger  # noqa: E402
from shuffle_opacus.flower import (  # noqa: E402
    SecAggCheckInFedAvg,
    ShuffleAccountingConfig,
    ShuffleCheckInAccountant,
    ShuffleCheckInEvent,
    ShuffleCheckInFedAvg,
    ShufflePrivacyConfig,
)

N, RATE, NOISE, DELTA = 100, 0.5, 2.0, 1e-5

#: ``strategy.accountant.state_dict()`` as the code before the one ledger saved it (main at
#: b959744): three rounds of a ShuffleCheckInFedAvg(n = 100, sigma = 2, gamma = 0.5, budget 40)
#: and two rounds at sigma = 3 composed into its accountant directly.
OLD_STATE = json.loads(
    '{"backend": "shuffle_opacus.checkin", "compositions": [{"count": 3, "event": '
    '{"noise_multiplier": 2.0, "population_size": 100, "rate": 0.5}}, {"count": 2, "event": '
    '{"noise_multiplier": 3.0, "population_size": 100, "rate": 0.5}}], "config": '
    '{"max_epsilon": 40.0, "method": null, "neighboring_relation": "replace-one", '
    '"population_size": 100, "sampling_method": "poisson", "sensitivity": 2.0, '
    '"target_delta": 1e-05}, "schema_version": 1}'
)
#: ``get_epsilon(1e-5)`` of that accountant then (the same code, the same commit).
OLD_EPSILON = 0.8087359514937411


def _privacy(noise: float = NOISE, rate: float = RATE) -> ShufflePrivacyConfig:
    return ShufflePrivacyConfig(
        noise_multiplier=noise,
        clip_norm=1.0,
        rate=rate,
        delta=DELTA,
        allow_noiseless=noise == 0.0,
    )


def _strategy(noise: float = NOISE, rate: float = RATE, **kwargs) -> ShuffleCheckInFedAvg:
    return ShuffleCheckInFedAvg(privacy=_privacy(noise, rate), num_nodes=N, **kwargs)


# --- the ledger -------------------------------------------------------------------------------


def test_a_ledger_records_several_rounds_at_once_and_merges_them():
    ledger = RoundLedger()
    ledger.record(2.0, 0.5, 3)
    ledger.record(2.0, 0.5)
    ledger.record(0.0, 0.5, 2)
    assert ledger.entries == [(2.0, 0.5, 4), (0.0, 0.5, 2)]
    assert ledger.rounds == 6  # noiseless rounds are rounds


def test_trivial_epsilon_is_zero_without_rounds_and_infinite_with_a_noiseless_one():
    assert RoundLedger().trivial_epsilon() == 0.0
    assert RoundLedger([(2.0, 0.5, 0)]).trivial_epsilon() == 0.0
    assert RoundLedger([(2.0, 0.5, 3)]).trivial_epsilon() is None  # the analysis answers
    noiseless = RoundLedger([(2.0, 0.5, 3), (0.0, 0.5, 1)])
    assert noiseless.trivial_epsilon() == math.inf
    # A hypothetical history is judged instead of the held one.
    assert noiseless.trivial_epsilon([(2.0, 0.5, 3)]) is None
    extended = RoundLedger([(2.0, 0.5, 3)]).extended(4, 0.0, 0.5)
    assert RoundLedger().trivial_epsilon(extended) == math.inf


# --- one history ------------------------------------------------------------------------------


def test_the_strategys_ledger_is_its_accountants():
    strategy = _strategy()
    for _ in range(3):
        strategy._account_round()
    accountant = strategy.accountant
    assert strategy.ledger is accountant.ledger
    assert strategy.history is accountant.ledger.entries
    assert strategy.history == [(NOISE, RATE, 3)]
    assert strategy.rounds_accounted == accountant.num_releases == 3


def test_a_round_composed_into_the_accountant_is_the_strategys_round_once():
    strategy = _strategy(max_epsilon=40.0)
    for _ in range(3):
        strategy._account_round()
    strategy.accountant.compose(ShuffleCheckInEvent(3.0, RATE, N), 2)
    assert strategy.rounds_accounted == strategy.accountant.num_releases == 5
    assert strategy.history == [(NOISE, RATE, 3), (3.0, RATE, 2)]
    expected = history_epsilon(strategy.history, protocol="checkin", delta=DELTA, population=N)
    assert strategy.epsilon() == strategy.accountant.get_epsilon(DELTA) == expected.epsilon
    assert strategy.epsilon() == OLD_EPSILON  # the accountant's number before the change


def test_a_history_assigned_to_the_strategy_is_the_accountants():
    strategy = _strategy()
    strategy.history = [(NOISE, RATE, 4)]
    assert strategy.accountant.num_releases == 4
    assert strategy.accountant.get_epsilon(DELTA) == strategy.epsilon()
    replacement = RoundLedger([(NOISE, RATE, 2)])
    strategy.ledger = replacement
    assert strategy.accountant.ledger is replacement and strategy.rounds_accounted == 2


@pytest.mark.parametrize("cls", [ShuffleCheckInFedAvg, SecAggCheckInFedAvg])
def test_a_noiseless_round_is_in_the_history_and_makes_epsilon_infinite(cls):
    strategy = cls(privacy=_privacy(0.0, 1.0), num_nodes=N, max_epsilon=100.0)
    assert strategy.epsilon() == 0.0 and math.isinf(strategy.epsilon(1))
    strategy._account_round()
    strategy._account_round()
    assert strategy.history == [(0.0, 1.0, 2)]
    assert strategy.rounds_accounted == strategy.accountant.num_releases == 2
    assert math.isinf(strategy.epsilon()) and math.isinf(strategy.epsilon_proven())
    assert math.isinf(strategy.accountant.get_epsilon(DELTA))
    assert not strategy.budget_allows_another_round()
    assert strategy.accountant.epsilon_result() is None  # no analysis applies
    assert strategy.guarantees()["epsilon"]["note"] is None
    state = strategy.accountant.state_dict()
    assert state["compositions"] == [
        {"event": {"noise_multiplier": 0.0, "rate": 1.0, "population_size": N}, "count": 2}
    ]


def test_a_noiseless_round_composed_into_a_noisy_run_makes_its_epsilon_infinite():
    strategy = _strategy()
    strategy._account_round()
    assert math.isfinite(strategy.epsilon())
    strategy.accountant.compose(ShuffleCheckInEvent(0.0, RATE, N))
    strategy._account_round()
    assert strategy.history == [(NOISE, RATE, 1), (0.0, RATE, 1), (NOISE, RATE, 1)]
    assert math.isinf(strategy.epsilon()) and math.isinf(strategy.epsilon(5))


# --- saved states -----------------------------------------------------------------------------


def test_a_state_saved_before_the_change_loads_into_a_strategy_with_the_same_epsilon():
    strategy = _strategy(max_epsilon=40.0)
    strategy.accountant.load_state_dict(OLD_STATE)
    assert strategy.history == [(2.0, 0.5, 3), (3.0, 0.5, 2)]
    assert strategy.rounds_accounted == 5
    assert strategy.epsilon() == strategy.accountant.get_epsilon(DELTA) == OLD_EPSILON
    assert strategy.accountant.state_dict() == OLD_STATE  # saved again as it was


def test_a_state_saved_and_loaded_gives_the_same_epsilon_now_and_later():
    saved = _strategy(max_epsilon=40.0)
    for _ in range(4):
        saved._account_round()
    state = json.loads(json.dumps(saved.accountant.state_dict()))
    loaded = _strategy(max_epsilon=40.0)
    loaded.accountant.load_state_dict(state)
    assert loaded.history == saved.history and loaded.rounds_accounted == 4
    assert loaded.epsilon() == saved.epsilon()
    assert loaded.epsilon(6) == saved.epsilon(6)  # and the rounds after it
    loaded._account_round()
    saved._account_round()
    assert loaded.epsilon() == saved.epsilon() == saved.accountant.get_epsilon(DELTA)


def test_a_bad_state_changes_neither_the_accountant_nor_the_strategy():
    strategy = _strategy()
    strategy._account_round()
    broken = json.loads(json.dumps(OLD_STATE))
    broken["config"]["max_epsilon"] = None
    broken["compositions"][1]["count"] = 0
    with pytest.raises(ValueError, match=r"^state\['compositions'\]\[1\] is not valid: count"):
        strategy.accountant.load_state_dict(broken)
    assert strategy.history == [(NOISE, RATE, 1)] and strategy.rounds_accounted == 1


def test_a_standalone_accountant_keeps_its_own_ledger():
    config = ShuffleAccountingConfig(target_delta=DELTA, population_size=N)
    first, second = ShuffleCheckInAccountant(config), ShuffleCheckInAccountant(config)
    first.compose(ShuffleCheckInEvent(NOISE, RATE, N), 2)
    assert first.ledger is not second.ledger and second.num_releases == 0
    shared = RoundLedger()
    third = ShuffleCheckInAccountant(config, ledger=shared)
    third.compose(ShuffleCheckInEvent(NOISE, RATE, N))
    assert shared.entries == [(NOISE, RATE, 1)]


def test_a_state_saved_earlier_cannot_rewind_the_rounds_released_since():
    strategy = _strategy()
    strategy._account_round()
    earlier = strategy.accountant.state_dict()
    strategy._account_round()
    strategy._account_round()
    later = strategy.accountant.state_dict()
    with pytest.raises(ValueError, match="at least the 3 rounds already composed"):
        strategy.accountant.load_state_dict(earlier)
    assert strategy.rounds_accounted == 3 and strategy.history == [(NOISE, RATE, 3)]
    strategy.accountant.compose(ShuffleCheckInEvent(3.0, RATE, N))
    with pytest.raises(ValueError, match="at least the 4 rounds"):
        strategy.accountant.load_state_dict(later)  # the sigma = 3 round would be forgotten
    strategy.accountant.load_state_dict(strategy.accountant.state_dict())  # the same rounds
    fresh = _strategy()
    fresh.accountant.load_state_dict(earlier)  # a new run restores any state
    fresh.accountant.load_state_dict(later)  # and may go on to a later one
    assert fresh.rounds_accounted == 3
