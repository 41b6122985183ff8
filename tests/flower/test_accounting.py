"""The accountant of Flower's accounting shape: numbers equal to ``account``, its protocol's
members, state round trips, refusals, and the strategies' ledger."""

from __future__ import annotations

import importlib.util
import json
import math

import pytest

from shuffle_opacus.cli.command import main
from shuffle_opacus.flower import (
    ShuffleAccountingConfig,
    ShuffleCheckInAccountant,
    ShuffleCheckInEvent,
    ShuffleCheckInFedAvg,
    ShufflePrivacyConfig,
)

N, RATE, NOISE, ROUNDS, DELTA = 50, 0.5, 2.0, 6, 1e-5

#: The members of ``flwr.supercore.privacy_accounting.PrivacyAccountant`` in flwr 1.42.0.
PROTOCOL_MEMBERS = {
    "config",
    "num_releases",
    "compose",
    "get_epsilon",
    "get_delta",
    "get_privacy_spent",
    "would_exceed",
    "state_dict",
    "load_state_dict",
}


def _accountant(**kwargs) -> ShuffleCheckInAccountant:
    return ShuffleCheckInAccountant(
        ShuffleAccountingConfig(target_delta=DELTA, population_size=N, **kwargs)
    )


def _event(noise: float = NOISE) -> ShuffleCheckInEvent:
    return ShuffleCheckInEvent(noise_multiplier=noise, rate=RATE, population_size=N)


@pytest.fixture(scope="module")
def cli_rows():
    """``account checkin`` for the same setting: the tight row and the proven row."""
    args = ["account", "checkin", "--n", str(N), "--rate", str(RATE)]
    args += ["--noise-multiplier", str(NOISE), "--steps", str(ROUNDS), "--delta", str(DELTA)]
    rows = {}
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main([*args, "--json"]) == 0
    for line in out.getvalue().strip().splitlines():
        row = json.loads(line)
        rows[row["method"]] = row["epsilon"]
    return rows


@pytest.mark.parametrize("method", [None, "proven"])
def test_composed_events_give_the_cli_numbers(cli_rows, method):
    acc = _accountant(method=method)
    acc.compose(_event(), 2)
    acc.compose(_event(), ROUNDS - 2)  # merged with the previous entry
    spent = acc.get_privacy_spent()
    assert spent.num_releases == acc.num_releases == ROUNDS
    assert spent.epsilon == cli_rows[method or "pld"]
    assert spent.accounting_method == f"shuffle-{method or 'pld'}"
    assert spent.neighboring_relation == "replace-one" and spent.sensitivity == 2.0
    assumptions = " ".join(spent.assumptions)
    if method is None:
        assert "Theorem 1's pair" in assumptions
    else:
        assert "proven from published theorems" in assumptions
        assert spent.note and spent.note.startswith("route ")
    assert acc.get_epsilon(DELTA) == spent.epsilon


def test_get_delta_is_a_tight_upper_bound():
    acc = ShuffleCheckInAccountant(ShuffleAccountingConfig(target_delta=DELTA, population_size=8))
    acc.compose(ShuffleCheckInEvent(noise_multiplier=NOISE, rate=RATE, population_size=8), 2)
    target = acc.get_epsilon(1e-3)
    delta = acc.get_delta(target)
    assert acc.get_epsilon(delta) <= target
    assert acc.get_epsilon(delta / 1.02) > target  # within the 1 % bisection
    assert _accountant().get_delta(1.0) == 0.0


def test_would_exceed_composes_nothing():
    acc = _accountant(max_epsilon=10.0)
    acc.compose(_event(), 1)
    before = acc.get_epsilon(DELTA)
    assert not acc.would_exceed(_event(), count=1)
    assert acc.would_exceed(_event(), max_epsilon=before, count=1)
    assert acc.num_releases == 1 and acc.get_epsilon(DELTA) == before
    with pytest.raises(ValueError, match="^max_epsilon must be given"):
        _accountant().would_exceed(_event())


def test_a_noiseless_round_makes_epsilon_infinite():
    acc = _accountant()
    acc.compose(_event(0.0))
    assert math.isinf(acc.get_epsilon(DELTA))


def test_state_round_trips_through_json_and_refuses_another_config():
    acc = _accountant(method="proven")
    acc.compose(_event(), 3)
    acc.compose(_event(3.0), 1)
    state = json.loads(json.dumps(acc.state_dict()))
    again = _accountant(method="proven")
    again.load_state_dict(state)
    assert again.state_dict() == acc.state_dict()
    other = _accountant()
    with pytest.raises(ValueError, match=r"^state\['config'\] must be"):
        other.load_state_dict(state)
    broken = json.loads(json.dumps(state))
    broken["compositions"][1]["event"]["rate"] = 2.0
    with pytest.raises(ValueError, match=r"^state\['compositions'\]\[1\] is not valid: rate"):
        again.load_state_dict(broken)
    assert again.num_releases == 4  # nothing half-applied


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"neighboring_relation": "add-or-remove-one"}, "^neighboring_relation must be"),
        ({"sampling_method": "without-replacement"}, "^sampling_method must be 'poisson'"),
        ({"method": "no-such-method"}, "^method"),
        ({"max_epsilon": -1.0}, "^max_epsilon"),
        ({"target_delta": 1.0}, "^delta"),
    ],
)
def test_configurations_outside_the_guarantee_are_refused(kwargs, message):
    base = {"target_delta": DELTA, "population_size": N, **kwargs}
    with pytest.raises(ValueError, match=message):
        ShuffleAccountingConfig(**base)


def test_events_of_another_kind_or_population_are_refused():
    acc = _accountant()
    with pytest.raises(ValueError, match="^event must be a ShuffleCheckInEvent"):
        acc.compose(object())  # e.g. Flower's GaussianPrivacyEvent: central noise
    with pytest.raises(ValueError, match="^event.population_size must be the configuration's"):
        acc.compose(ShuffleCheckInEvent(noise_multiplier=1.0, rate=0.5, population_size=N + 1))
    with pytest.raises(ValueError, match="^count"):
        acc.compose(_event(), 0)
    with pytest.raises(ValueError, match="^noise_multiplier must be a finite float"):
        ShuffleCheckInEvent(noise_multiplier=math.nan, rate=0.5, population_size=N)
    assert acc.num_releases == 0


def test_flower_enum_members_are_accepted_by_value():
    """Flower's enums are ``str`` enums with these values: ours stand for them."""
    from shuffle_opacus.flower.accounting import NeighboringRelation, SamplingMethod

    config = ShuffleAccountingConfig(
        target_delta=DELTA,
        population_size=N,
        neighboring_relation=NeighboringRelation.REPLACE_ONE,
        sampling_method=SamplingMethod.POISSON,
    )
    assert (
        _accountant().state_dict()["config"]
        == ShuffleCheckInAccountant(config).state_dict()["config"]
    )


def test_has_the_members_of_flowers_protocol():
    members = PROTOCOL_MEMBERS
    if importlib.util.find_spec("flwr.supercore.privacy_accounting") is not None:
        from flwr.supercore.privacy_accounting import PrivacyAccountant

        members = {m for m in vars(PrivacyAccountant) if not m.startswith("_")}
        assert members == PROTOCOL_MEMBERS
    for name in members:
        assert hasattr(ShuffleCheckInAccountant, name), name


@pytest.mark.parametrize("method", [None, "exact"])
def test_the_strategy_composes_every_round_into_its_accountant(method):
    privacy = ShufflePrivacyConfig(
        noise_multiplier=NOISE, clip_norm=1.0, rate=RATE, delta=DELTA, method=method
    )
    strategy = ShuffleCheckInFedAvg(privacy=privacy, num_nodes=N, max_epsilon=50.0)
    for _ in range(3):
        strategy._account_round()
    acc = strategy.accountant
    assert acc.num_releases == 3 and acc.config.max_epsilon == 50.0
    assert acc.get_epsilon(DELTA) == strategy.epsilon()
