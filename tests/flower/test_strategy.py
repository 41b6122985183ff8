"""The strategy: accounting, budget stop, empty rounds, agreement checks, aggregation."""

from __future__ import annotations

import logging
import math

import numpy as np
import pytest

pytest.importorskip("flwr")

import opacus.accountants  # noqa: E402, F401  (registration runs before the import below)
from flwr.app import Array, ArrayRecord, ConfigRecord, MetricRecord  # noqa: E402

from shuffle_opacus.analysis import MECHANISM_TABLE  # noqa: E402
from shuffle_opacus.analysis.epsilon import rounds_epsilon
from shuffle_opacus.engine.accountants import ShuffledCheckInAccountant  # noqa: E402
from shuffle_opacus.flower import (  # noqa: E402
    ROUND_METRIC_KEYS,
    InProcessGrid,
    LocalShuffleDPMod,
    ProtocolViolationError,
    ShuffleCheckInFedAvg,
    ShufflePrivacyConfig,
)
from shuffle_opacus.flower.checkin_base import (  # noqa: E402
    EPSILON_PROVEN_KEY,
    read_round_line,
    round_line,
)

from .helpers import coordinate_update, model, numpy_app, shift_update  # noqa: E402

# The accountant's cost is building one round's loss distribution for each (n, σ, γ, sensitivity)
# and the proven ε for each number of rounds; both are cached for the session
# (tests/conftest.py). The tests whose numbers are not the point therefore share a few settings:
# σ = 1.5, γ = 0.5 on 4 nodes (the setting of the ``flwr run`` of test_launch.py and of the
# secure-aggregation tests), and σ = 1, γ = 1 on 4 nodes where every node must report.
HOUSE = {"sigma": 1.5, "rate": 0.5}


def privacy(sigma=1.0, rate=0.3, clip=1.0, **kw) -> ShufflePrivacyConfig:
    return ShufflePrivacyConfig(
        noise_multiplier=sigma,
        clip_norm=clip,
        rate=rate,
        delta=1e-5,
        allow_noiseless=sigma == 0.0,
        **kw,
    )


def run(strategy, grid, rounds, arrays=None, **kw):
    return strategy.start(grid, arrays or model(), num_rounds=rounds, **kw)


@pytest.mark.parametrize("sensitivity", ["replace-one", "paper"])
def test_epsilon_equals_the_package_accountant(sensitivity):
    """ε of every round = the Opacus accountant ``shuffled_checkin`` after as many rounds.

    The accountant is configured with population n = number of nodes and the same
    sensitivity, and stepped once per round with (noise_multiplier, rate), empty rounds
    included.
    """
    n, rounds, cfg = 4, 4, privacy(**HOUSE, sensitivity=sensitivity)
    mod = LocalShuffleDPMod(min_noise_multiplier=1.0, sensitivity=sensitivity)
    grid = InProcessGrid(numpy_app(shift_update(), mod=mod), n)
    strategy = ShuffleCheckInFedAvg(privacy=cfg, num_nodes=n, seed=4)
    result = run(strategy, grid, rounds)
    accountant = ShuffledCheckInAccountant().configure(population=n, sensitivity=sensitivity)
    assert sorted(result.train_metrics_clientapp) == list(range(1, rounds + 1))
    for r in range(1, rounds + 1):
        accountant.step(noise_multiplier=HOUSE["sigma"], sample_rate=HOUSE["rate"])
        metrics = result.train_metrics_clientapp[r]
        last = {EPSILON_PROVEN_KEY} if r == rounds else set()
        assert set(metrics) == set(ROUND_METRIC_KEYS) | last
        assert metrics["epsilon"] == pytest.approx(accountant.get_epsilon(1e-5), rel=1e-12)
        assert metrics["rounds-accounted"] == r and metrics["num-nodes"] == n
    assert strategy.epsilon() == pytest.approx(accountant.get_epsilon(1e-5), rel=1e-12)
    assert strategy.history == accountant.history
    # ε grows with the rounds.
    eps = [result.train_metrics_clientapp[r]["epsilon"] for r in range(1, rounds + 1)]
    assert all(a < b for a, b in zip(eps, eps[1:], strict=False))


def test_epsilon_of_future_rounds_and_validation():
    strategy = ShuffleCheckInFedAvg(privacy=privacy(**HOUSE), num_nodes=4)
    accountant = ShuffledCheckInAccountant().configure(population=4)
    accountant.history = [(HOUSE["sigma"], HOUSE["rate"], 10)]
    assert strategy.epsilon() == 0.0
    assert strategy.epsilon(10) == pytest.approx(accountant.get_epsilon(1e-5), rel=1e-12)
    with pytest.raises(ValueError, match="rounds must be an integer >= 0"):
        strategy.epsilon(-1)


def test_empty_rounds_are_rounds():
    """With rate 0.05 and 8 nodes many rounds are empty: accounted, recorded, model unchanged."""
    n = 8
    grid = InProcessGrid(numpy_app(shift_update()), n)
    # The proven epsilon of the last round (20 rounds at rate 0.05: 1 s) is not what this tests.
    strategy = ShuffleCheckInFedAvg(
        privacy=privacy(rate=0.05), num_nodes=n, seed=1, report_proven=False
    )
    result = run(strategy, grid, 20)
    metrics = result.train_metrics_clientapp
    assert sorted(metrics) == list(range(1, 21))
    empty = [r for r in metrics if metrics[r]["num-reports"] == 0]
    assert empty and len(empty) < 20
    # The start-up check reaches every node; then nothing is sent in an empty round.
    assert sorted(grid.deliveries[0]) == sorted(grid.contexts)
    assert len(grid.deliveries) == 1 + 20 - len(empty)
    assert strategy.rounds_accounted == 20
    accountant = ShuffledCheckInAccountant().configure(population=n)
    accountant.history = [(1.0, 0.05, 20)]
    assert metrics[20]["epsilon"] == pytest.approx(accountant.get_epsilon(1e-5), rel=1e-12)


def test_all_rounds_empty_keeps_the_initial_model():
    grid = InProcessGrid(numpy_app(shift_update()), 2)
    # The proven epsilon at rate 1e-9 takes 24 s here (estimated 0.8 s), and the default method
    # tries pld before it falls back to the Rényi bound (1 s); neither is what this tests.
    strategy = ShuffleCheckInFedAvg(
        privacy=privacy(rate=1e-9, method="exact"), num_nodes=2, seed=0, report_proven=False
    )
    initial = model()
    result = run(strategy, grid, 3, arrays=initial)
    assert result.arrays is initial
    assert [m["num-reports"] for m in result.train_metrics_clientapp.values()] == [0, 0, 0]


def _proven(n, sigma, rate, rounds):
    """``rounds_epsilon`` by the method ``proven`` of ``rounds`` check-in rounds at replace-one."""
    setting = MECHANISM_TABLE["checkin"].setting(sigma=sigma / 2, n=n, rate=rate)
    return rounds_epsilon("checkin", [(setting, rounds)], delta=1e-5, method="proven")


def test_proven_epsilon_at_evaluation_rounds_and_the_last_round():
    """Beside every round's tight epsilon, the proven one at the rounds ``evaluate_fn``
    evaluated and at the last round (not every round: it costs more): ``rounds_epsilon`` of the
    same history by the method ``proven``, at least the tight one; the round lines that carry it
    say what each number rests on."""
    messages: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: messages.append(record.getMessage())  # type: ignore[method-assign]
    logger = logging.getLogger("flwr")
    logger.addHandler(handler)
    n, sigma, rate = 4, HOUSE["sigma"], HOUSE["rate"]
    try:
        strategy = ShuffleCheckInFedAvg(
            privacy=privacy(sigma=sigma, rate=rate), num_nodes=n, seed=2
        )
        result = run(
            strategy,
            InProcessGrid(numpy_app(shift_update()), n),
            3,
            evaluate_fn=lambda r, arrays: MetricRecord({"test-accuracy": 0.5}) if r == 1 else None,
        )
    finally:
        logger.removeHandler(handler)
    metrics = result.train_metrics_clientapp
    assert [EPSILON_PROVEN_KEY in metrics[r] for r in (1, 2, 3)] == [True, False, True]
    assert sorted(strategy.epsilons_proven) == [1, 3]
    for r in (1, 3):
        expected = _proven(n, sigma, rate, r)
        assert expected.method == "proven"
        proven = metrics[r][EPSILON_PROVEN_KEY]
        assert proven == pytest.approx(expected.epsilon, rel=1e-12)
        assert (
            proven == strategy.round_metrics[r][EPSILON_PROVEN_KEY] == strategy.epsilons_proven[r]
        )
        assert proven >= metrics[r]["epsilon"]
    assert strategy.epsilon_proven() == metrics[3][EPSILON_PROVEN_KEY]
    records = {r["round"]: r for r in map(read_round_line, messages) if r is not None}
    assert EPSILON_PROVEN_KEY not in records[2]["metrics"] and "guarantees" not in records[2]
    checkin = MECHANISM_TABLE["checkin"]
    for r in (1, 3):
        assert records[r]["metrics"] == dict(metrics[r])
        tight, proven = (
            records[r]["guarantees"]["epsilon"],
            records[r]["guarantees"][EPSILON_PROVEN_KEY],
        )
        assert tight["method"] == "pld" and tight["sensitivity"] == 2.0
        assert tight["assumptions"] == list(checkin.assumptions_of("pld"))
        assert any("Theorem 1's pair" in a for a in tight["assumptions"])
        assert proven["method"] == "proven" and proven["sensitivity"] == 2.0
        assert proven["assumptions"] == list(checkin.assumptions_of("proven"))
        assert not any("Theorem 1's pair" in a for a in proven["assumptions"])
        assert proven["note"].startswith("route ")
    assert strategy.guarantees() == records[3]["guarantees"]


def test_proven_epsilon_is_replace_one_whatever_the_convention():
    """Under the paper's convention (sensitivity C) the tight epsilon assumes every update lies
    within C of every other; the proven one assumes nothing on where the updates lie, so it is
    taken at replace-one (analysis sigma = noise_multiplier / 2)."""
    n, sigma, rate = 4, HOUSE["sigma"], HOUSE["rate"]
    cfg = privacy(sigma=sigma, rate=rate, sensitivity="paper")
    strategy = ShuffleCheckInFedAvg(privacy=cfg, num_nodes=n)
    assert strategy.epsilon_proven() == 0.0  # no round yet
    strategy.history = [(sigma, rate, 3)]  # as after three rounds
    assert strategy.epsilon_proven() == pytest.approx(_proven(n, sigma, rate, 3).epsilon, rel=1e-12)
    assert strategy.epsilon_proven() >= strategy.epsilon()
    guarantees = strategy.guarantees()
    assert guarantees["epsilon"]["sensitivity"] == 1.0
    assert any("within 1 C of every other" in a for a in guarantees["epsilon"]["assumptions"])
    assert guarantees[EPSILON_PROVEN_KEY]["sensitivity"] == 2.0
    assert not any("within" in a for a in guarantees[EPSILON_PROVEN_KEY]["assumptions"])


def test_budget_stop_fires_before_the_round_that_would_exceed_it():
    n, cfg = 4, privacy(**HOUSE)
    probe = ShuffleCheckInFedAvg(privacy=cfg, num_nodes=n)
    eps3, eps4 = probe.epsilon(3), probe.epsilon(4)
    budget = (eps3 + eps4) / 2
    grid = InProcessGrid(numpy_app(shift_update()), n)
    strategy = ShuffleCheckInFedAvg(privacy=cfg, num_nodes=n, max_epsilon=budget, seed=3)
    result = run(strategy, grid, 10)
    assert sorted(result.train_metrics_clientapp) == [1, 2, 3]
    assert strategy.rounds_accounted == 3
    assert result.train_metrics_clientapp[3]["epsilon"] == pytest.approx(eps3, rel=1e-12)
    assert strategy.epsilon() <= budget
    # The last round the budget allowed carries the proven epsilon; the others do not.
    assert sorted(strategy.epsilons_proven) == [3]
    assert EPSILON_PROVEN_KEY in result.train_metrics_clientapp[3]
    assert strategy.stop_reason.startswith("stopped before round 4")
    # Exactly at the budget the round runs.
    exact = ShuffleCheckInFedAvg(privacy=cfg, num_nodes=n, max_epsilon=eps4, seed=3)
    run(exact, InProcessGrid(numpy_app(shift_update()), n), 10)
    assert exact.rounds_accounted == 4


def test_budget_below_one_round_runs_nothing():
    cfg = privacy(**HOUSE)
    grid = InProcessGrid(numpy_app(shift_update()), 4)
    strategy = ShuffleCheckInFedAvg(privacy=cfg, num_nodes=4, max_epsilon=1e-3)
    evaluations = []
    result = run(strategy, grid, 5, evaluate_fn=lambda r, a: evaluations.append(r))
    assert result.train_metrics_clientapp == {} and grid.deliveries == []
    assert strategy.rounds_accounted == 0 and evaluations == [0]
    # configure_train called directly after the stop sends nothing and accounts nothing.
    assert strategy.configure_train(1, model(), ConfigRecord(), grid) == []
    assert strategy.aggregate_train(1, []) == (None, None)


def test_noiseless_rounds_have_infinite_epsilon():
    grid = InProcessGrid(numpy_app(shift_update()), 4)
    strategy = ShuffleCheckInFedAvg(privacy=privacy(sigma=0.0, rate=1.0), num_nodes=4)
    result = run(strategy, grid, 2)
    assert math.isinf(result.train_metrics_clientapp[1]["epsilon"])
    assert math.isinf(result.train_metrics_clientapp[2][EPSILON_PROVEN_KEY])
    budgeted = ShuffleCheckInFedAvg(
        privacy=privacy(sigma=0.0, rate=1.0), num_nodes=4, max_epsilon=100.0
    )
    assert run(budgeted, grid, 2).train_metrics_clientapp == {}


def test_aggregate_is_the_mean_of_clipped_updates():
    """σ = 0: the new model = received + mean over participants of clip_C(update) (numpy oracle)."""
    n, clip = 6, 0.4
    update = coordinate_update(scale=0.3)
    big = shift_update(scale=2.0)

    def mixed(pid, received):  # some updates clipped, some not
        return update(pid, received) if pid % 2 else big(pid, received)

    grid = InProcessGrid(numpy_app(mixed), n)
    strategy = ShuffleCheckInFedAvg(privacy=privacy(sigma=0.0, rate=0.6, clip=clip), num_nodes=n)
    initial = model()
    result = run(strategy, grid, 1, arrays=initial)
    participants = [node - 1001 for node in grid.deliveries[1]]  # [0]: start-up check
    assert participants, "seedless draw gave an empty round; rate 0.6 makes this 4e-3 likely"
    base = {k: v.numpy().astype(np.float64) for k, v in initial.items()}
    clipped = []
    for pid in participants:
        new = mixed(pid, {k: v.astype(np.float32) for k, v in base.items()})
        u = np.concatenate([(new[k] - base[k]).ravel() for k in base])
        clipped.append(u * min(1.0, clip / np.linalg.norm(u)))
    expected = base_flat(base) + np.mean(clipped, axis=0)
    got = np.concatenate([result.arrays[k].numpy().ravel() for k in base])
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-7)


def base_flat(base):
    return np.concatenate([v.ravel() for v in base.values()])


def _forging(pid_forged: int, value: float):
    """An outer mod: node ``pid_forged`` replaces its report by ``value`` everywhere, keeping
    the mod's echo (a node that skips the privacy mod but answers like one)."""

    def forge(msg, ctx, call_next):
        reply = call_next(msg, ctx)
        if int(ctx.node_config["partition-id"]) == pid_forged and reply.content.array_records:
            arrays = reply.content["arrays"]
            for name in list(arrays.keys()):
                big = np.full_like(arrays[name].numpy(), value)
                arrays[name] = Array(big)
        return reply

    return forge


@pytest.mark.parametrize("value", [1e30, np.inf])
def test_a_report_beyond_the_honest_bound_is_dropped_and_counted(value):
    """One node of four sends 1e30 (or inf) with the right echo: dropped, counted, no effect."""
    mod = LocalShuffleDPMod(min_noise_multiplier=0.0)
    app = numpy_app(
        shift_update(0.1), with_mod=False, leak=False, extra_mods=[_forging(0, value), mod]
    )
    strategy = ShuffleCheckInFedAvg(privacy=privacy(sigma=1.0, rate=1.0), num_nodes=4, seed=2)
    result = run(strategy, InProcessGrid(app, 4), 2)
    d = 10  # the model's coordinates: (2, 3) and (4,)
    bound = 1.0 + 1.0 * (math.sqrt(d) + math.sqrt(2 * math.log(1e12)))
    assert strategy.report_bound(d) == pytest.approx(bound, rel=1e-15)
    for metrics in result.train_metrics_clientapp.values():
        assert (metrics["num-reports"], metrics["num-rejected"]) == (4, 1)
    weights = np.concatenate([a.numpy().ravel() for a in result.arrays.values()])
    assert np.all(np.abs(weights) <= 2 * bound)  # two rounds of honest averages at most


def test_honest_reports_are_never_dropped():
    """Clipped updates plus noise stay within the bound (big updates, several noise levels)."""
    for sigma in (0.0, 0.5, 3.0):
        grid = InProcessGrid(numpy_app(shift_update(50.0)), 6)
        # The proven epsilon at sigma 0.5 takes 40 s here, and the default method's loss
        # distributions 1 s per noise level; the value of epsilon is not what this test checks.
        strategy = ShuffleCheckInFedAvg(
            privacy=privacy(sigma=sigma, rate=1.0, method="exact"),
            num_nodes=6,
            report_proven=False,
        )
        result = run(strategy, grid, 3)
        assert [m["num-rejected"] for m in result.train_metrics_clientapp.values()] == [0] * 3
        assert strategy.epsilons_proven == {}


def test_a_client_without_the_mod_stops_the_run_at_start_up():
    grid = InProcessGrid(numpy_app(shift_update(), with_mod=False), 5)
    strategy = ShuffleCheckInFedAvg(privacy=privacy(rate=1.0), num_nodes=5)
    with pytest.raises(ProtocolViolationError, match="LocalShuffleDPMod the first mod") as info:
        run(strategy, grid, 1)
    assert str(info.value).startswith("start-up check") and "\n" not in str(info.value)
    assert strategy.rounds_accounted == 0 and len(grid.deliveries) == 1


def test_a_client_without_the_mod_stops_the_round_without_the_check():
    grid = InProcessGrid(numpy_app(shift_update(), with_mod=False), 4)
    strategy = ShuffleCheckInFedAvg(privacy=privacy(rate=1.0), num_nodes=4, verify_nodes=False)
    with pytest.raises(ProtocolViolationError, match="LocalShuffleDPMod the first mod") as info:
        run(strategy, grid, 1)
    assert str(info.value).startswith("round 1")


def test_start_up_check_rejects_every_mismatch_before_any_round():
    """Floor, sensitivity convention and noiseless run: one line, no round run or accounted."""
    cases = [
        (LocalShuffleDPMod(min_noise_multiplier=1.5), privacy(sigma=1.0), "floor 1.5"),
        (
            LocalShuffleDPMod(min_noise_multiplier=0.5, sensitivity="paper"),
            privacy(sigma=1.0),
            "differs from this node's convention 1.0",
        ),
        (
            LocalShuffleDPMod(min_noise_multiplier=0.0),
            privacy(sigma=0.0),
            "noise_multiplier must be a finite number > 0",
        ),
    ]
    for mod, cfg, text in cases:
        calls = []

        def update(pid, received, calls=calls):
            calls.append(pid)
            return received

        grid = InProcessGrid(numpy_app(update, mod=mod), 4)
        strategy = ShuffleCheckInFedAvg(privacy=cfg, num_nodes=4, seed=0)
        with pytest.raises(ProtocolViolationError, match=text) as info:
            run(strategy, grid, 3)
        assert "\n" not in str(info.value) and "no round was run" in str(info.value)
        assert strategy.rounds_accounted == 0 and strategy.round_metrics == {}
        assert calls == [] and len(grid.deliveries) == 1


def test_a_mod_applying_other_parameters_stops_the_run():
    """A reply echoing another σ (e.g. an old mod) is refused before aggregation."""

    def forged(msg, ctx, call_next):
        reply = call_next(msg, ctx)
        reply.content["metrics"]["shuffle-dp.noise-multiplier"] = 0.5
        return reply

    mod = LocalShuffleDPMod(min_noise_multiplier=0.0)
    app = numpy_app(shift_update(), with_mod=False, leak=False, extra_mods=[forged, mod])
    grid = InProcessGrid(app, 4)
    strategy = ShuffleCheckInFedAvg(privacy=privacy(rate=1.0), num_nodes=4)
    with pytest.raises(ProtocolViolationError, match="noise-multiplier = 0.5, expected 1.0"):
        run(strategy, grid, 1)
    unchecked = ShuffleCheckInFedAvg(privacy=privacy(rate=1.0), num_nodes=4, verify_nodes=False)
    with pytest.raises(ProtocolViolationError, match="round 1: .*noise-multiplier = 0.5"):
        run(unchecked, grid, 1)


def _second_array(msg, ctx, call_next):
    """Outside the mod: a second ArrayRecord in every training reply (never in the echo)."""
    reply = call_next(msg, ctx)
    if reply.has_content() and reply.content.array_records:
        reply.content["extra"] = ArrayRecord({"x": Array(np.zeros(1, dtype=np.float32))})
    return reply


def _fails_for_node_2(pid, received):
    if pid == 2:
        raise RuntimeError("node 2 fails")
    return shift_update()(pid, received)


@pytest.mark.parametrize(
    ("update", "outer", "text", "counts"),
    [
        (shift_update(), [_second_array], "a reply holds 2 ArrayRecords", (4, 4, 0)),
        (_fails_for_node_2, [], "1 of 4 nodes that checked in sent no report", (4, 3, 1)),
    ],
    ids=["malformed", "dropout"],
)
def test_a_failed_round_ends_the_run_with_its_metrics_and_a_stop_reason(
    update, outer, text, counts
):
    """As in the secure-aggregation mode: one line, the round accounted, its metrics (the counts
    established before it failed) and the stop reason recorded, the model unchanged."""
    mod = LocalShuffleDPMod(min_noise_multiplier=0.0)
    app = numpy_app(update, with_mod=False, leak=False, extra_mods=[*outer, mod])
    strategy = ShuffleCheckInFedAvg(privacy=privacy(rate=1.0), num_nodes=4, seed=0)
    with pytest.raises(ProtocolViolationError, match=text) as info:
        run(strategy, InProcessGrid(app, 4), 3)
    message = str(info.value)
    assert message.startswith("round 1: ") and "\n" not in message
    accounted = f"; the round is accounted (epsilon = {strategy.epsilon():.6g}) and the model"
    assert message.endswith(accounted + " is unchanged.")
    assert strategy.stop_reason == message.rstrip(".")
    assert strategy.rounds_accounted == 1 and strategy.epsilons == {1: strategy.epsilon()}
    metrics = strategy.round_metrics[1]
    assert set(metrics) == {*ROUND_METRIC_KEYS, EPSILON_PROVEN_KEY}  # the run's last round
    assert metrics["epsilon"] == strategy.epsilon()
    assert metrics[EPSILON_PROVEN_KEY] == strategy.epsilon_proven() >= strategy.epsilon()
    assert (metrics["num-checked-in"], metrics["num-reports"], metrics["num-dropped"]) == counts
    assert metrics["num-rejected"] == 0 and metrics["rounds-accounted"] == 1


def test_refusals_are_dropouts():
    app = numpy_app(shift_update(), mod=LocalShuffleDPMod(min_noise_multiplier=2.0))
    strategy = ShuffleCheckInFedAvg(privacy=privacy(rate=1.0), num_nodes=4)
    with pytest.raises(ProtocolViolationError, match="below this node's floor 2.0"):
        run(strategy, InProcessGrid(app, 4), 1)
    tolerant = ShuffleCheckInFedAvg(
        privacy=privacy(rate=1.0), num_nodes=4, tolerate_dropouts=True, verify_nodes=False
    )
    result = run(tolerant, InProcessGrid(app, 4), 2)
    assert [m["num-dropped"] for m in result.train_metrics_clientapp.values()] == [4, 4]


def test_population_must_match():
    strategy = ShuffleCheckInFedAvg(privacy=privacy(), num_nodes=3)
    with pytest.raises(ProtocolViolationError, match="4 nodes are connected but num_nodes = 3"):
        run(strategy, InProcessGrid(numpy_app(shift_update()), 4), 1)
    waiting = ShuffleCheckInFedAvg(privacy=privacy(), num_nodes=5, node_wait_timeout=0.01)
    with pytest.raises(ProtocolViolationError, match="only 4 of num_nodes = 5"):
        run(waiting, InProcessGrid(numpy_app(shift_update()), 4), 1)


def test_train_config_cannot_override_the_privacy_parameters():
    strategy = ShuffleCheckInFedAvg(privacy=privacy(), num_nodes=3)
    grid = InProcessGrid(numpy_app(shift_update()), 3)
    with pytest.raises(ValueError, match=r"train_config must not set \['shuffle-dp.clip-norm'\]"):
        run(strategy, grid, 1, train_config=ConfigRecord({"shuffle-dp.clip-norm": 9.0}))
    assert strategy.rounds_accounted == 0 and grid.deliveries == []


def test_extra_train_config_reaches_the_clients():
    seen = []

    def spy(msg, ctx, call_next):
        seen.append(dict(msg.content["config"]))
        return call_next(msg, ctx)

    mod = LocalShuffleDPMod(min_noise_multiplier=0.0)
    app = numpy_app(shift_update(), with_mod=False, extra_mods=[mod, spy])
    strategy = ShuffleCheckInFedAvg(privacy=privacy(rate=1.0), num_nodes=4)
    run(strategy, InProcessGrid(app, 4), 1, train_config=ConfigRecord({"lr": 0.5}))
    # The start-up check never gets past the mod: only round 1 reaches the training code.
    assert len(seen) == 4 and all(c["lr"] == 0.5 and c["server-round"] == 1 for c in seen)
    assert all(c["shuffle-dp.rate"] == 1.0 and "shuffle-dp.handshake" not in c for c in seen)


@pytest.mark.parametrize(
    ("kwargs", "text"),
    [
        ({"num_nodes": 0}, "num_nodes must be an integer >= 1"),
        ({"num_nodes": 5, "max_epsilon": 0.0}, "max_epsilon must be a finite number > 0"),
        ({"num_nodes": 5, "seed": -2}, "seed must be an integer >= 0"),
        ({"num_nodes": 5, "node_wait_timeout": -1}, "node_wait_timeout must be"),
        ({"num_nodes": 5, "tolerate_dropouts": "yes"}, "tolerate_dropouts must be True"),
        ({"num_nodes": 5, "verify_nodes": 1}, "verify_nodes must be True"),
        ({"num_nodes": 5, "report_proven": 1}, "report_proven must be True"),
        ({"num_nodes": 5, "privacy": {"rate": 0.1}}, "privacy must be a ShufflePrivacyConfig"),
    ],
)
def test_bad_arguments(kwargs, text):
    kwargs = {"privacy": privacy(), **kwargs}
    with pytest.raises(ValueError, match=text) as info:
        ShuffleCheckInFedAvg(**kwargs)
    assert "\n" not in str(info.value)


def test_start_validates_before_any_round():
    strategy = ShuffleCheckInFedAvg(privacy=privacy(), num_nodes=2)
    grid = InProcessGrid(numpy_app(shift_update()), 2)
    with pytest.raises(ValueError, match="num_rounds must be an integer >= 1"):
        run(strategy, grid, 0)
    with pytest.raises(ValueError, match="evaluate_config must be empty"):
        run(strategy, grid, 1, evaluate_config=ConfigRecord({"a": 1}))
    assert strategy.rounds_accounted == 0


def test_no_client_side_evaluation():
    strategy = ShuffleCheckInFedAvg(privacy=privacy(), num_nodes=2)
    grid = InProcessGrid(numpy_app(shift_update()), 2)
    assert strategy.configure_evaluate(1, model(), ConfigRecord(), grid) == []
    assert strategy.aggregate_evaluate(1, []) is None


def test_server_evaluation_every_round():
    grid = InProcessGrid(numpy_app(shift_update()), 4)
    strategy = ShuffleCheckInFedAvg(privacy=privacy(rate=1.0), num_nodes=4, seed=0)
    from flwr.app import MetricRecord

    def evaluate(r: int, arrays: ArrayRecord):
        return MetricRecord({"mean": float(arrays["a"].numpy().mean())}) if r % 2 == 0 else None

    result = run(strategy, grid, 4, evaluate_fn=evaluate)
    assert sorted(result.evaluate_metrics_serverapp) == [0, 2, 4]


def test_one_json_line_per_round_on_the_log():
    """After every round the strategy logs one JSON line with a fixed prefix: the round's
    metrics and its server evaluation, as the result holds them (the launcher reads these)."""
    messages: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: messages.append(record.getMessage())  # type: ignore[method-assign]
    logger = logging.getLogger("flwr")
    logger.addHandler(handler)
    try:
        strategy = ShuffleCheckInFedAvg(privacy=privacy(**HOUSE), num_nodes=4, seed=1)
        result = run(
            strategy,
            InProcessGrid(numpy_app(shift_update()), 4),
            2,
            evaluate_fn=lambda r, arrays: MetricRecord({"test-accuracy": 0.5}) if r == 2 else None,
        )
    finally:
        logger.removeHandler(handler)
    records = [r for r in map(read_round_line, messages) if r is not None]
    assert [(r["round"], r["num_rounds"], r["mode"]) for r in records] == [
        (1, 2, "trusted-server"),
        (2, 2, "trusted-server"),
    ]
    for record in records:
        assert record["metrics"] == dict(result.train_metrics_clientapp[record["round"]])
        assert record["stop_reason"] is None
    assert [r["evaluation"] for r in records] == [None, {"test-accuracy": 0.5}]
    line = round_line({"round": 1, "metrics": {"epsilon": math.inf}})
    assert "\n" not in line and read_round_line("INFO :      " + line) == {
        "round": 1,
        "metrics": {"epsilon": "inf"},
    }
    assert read_round_line("round 1: 3 reports") is None
