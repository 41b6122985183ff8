"""The secure-aggregation mode: SecAgg+ parameters, what the server sees, sums, dropouts, checks.

Everything runs Flower's own SecAgg+ (``secaggplus_mod`` on the nodes, ``SecAggPlusWorkflow``
on the server) on an :class:`~shuffle_opacus.flower.InProcessGrid`. The nodes are instrumented
(``helpers.secagg_spy`` records the plain report each node hands to SecAgg+), and so is the
server (a grid that keeps every reply it delivers to the ServerApp, and the results the
strategy's ``aggregate_fit`` receives).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

pytest.importorskip("flwr")

from flwr.app import Array, ArrayRecord, Message  # noqa: E402
from flwr.common import bytes_to_ndarray  # noqa: E402
from flwr.common.secure_aggregation.quantization import dequantize, quantize  # noqa: E402
from scipy import stats  # noqa: E402

import shuffle_opacus.flower.secagg.strategy as secagg_strategy  # noqa: E402
from shuffle_opacus import history_epsilon  # noqa: E402
from shuffle_opacus.analysis import MECHANISM_TABLE  # noqa: E402
from shuffle_opacus.analysis.epsilon import rounds_epsilon
from shuffle_opacus.flower import (  # noqa: E402
    SECAGG_ROUND_METRIC_KEYS,
    InProcessGrid,
    LocalShuffleDPMod,
    PrivacyModeMod,
    ProtocolViolationError,
    SecAggCheckInFedAvg,
    SecAggCheckInMod,
    ShuffleCheckInFedAvg,
    ShufflePrivacyConfig,
    secagg_parameters,
)
from shuffle_opacus.flower.checkin_base import EPSILON_PROVEN_KEY  # noqa: E402
from shuffle_opacus.flower.secagg.parameters import (  # noqa: E402
    CLIPPING_TAIL,
    MIN_SHARES,
    MODULUS,
)

from .helpers import (  # noqa: E402
    SECRET,
    context,
    drop_at,
    instruction,
    model,
    numpy_app,
    secagg_spy,
    shift_update,
)


@pytest.fixture(autouse=True)
def no_padding_wait(monkeypatch):
    """The mods pad to ``reply_after`` = 30 s; skip that wait (the thread's deadline stays)."""
    import shuffle_opacus.flower.secagg.mod as secagg_mod_module

    waits: list[float] = []
    monkeypatch.setattr(secagg_mod_module, "_SLEEP", waits.append)
    return waits


# The accountant builds one round's loss distribution per (population, σ, γ) and a proven ε per
# number of rounds, cached for the session (tests/conftest.py); where the numbers are not the
# point the tests below take σ = 1.5, γ = 0.5 on 4 nodes, the setting of the ``flwr run`` of
# test_launch.py and of test_strategy.py.
HOUSE = {"sigma": 1.5, "rate": 0.5}


def privacy(sigma=0.0, rate=0.5, clip=0.5, **kw) -> ShufflePrivacyConfig:
    return ShufflePrivacyConfig(
        noise_multiplier=sigma,
        clip_norm=clip,
        rate=rate,
        delta=1e-5,
        allow_noiseless=sigma == 0.0,
        **kw,
    )


def secagg_mod(recorded=None, **kw) -> SecAggCheckInMod:
    kw.setdefault("min_noise_multiplier", 0.0)
    kw.setdefault("allow_noiseless", True)
    kw.setdefault("reply_after", 30.0)  # never reached: the autouse fixture skips the wait
    if recorded is not None:
        kw["secure_aggregation_mod"] = secagg_spy(recorded)
    return SecAggCheckInMod(**kw)


class RecordingGrid(InProcessGrid):
    """An InProcessGrid that keeps every reply it delivers to the ServerApp."""

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self.received: list[Message] = []

    def pull_messages(self, message_ids):
        replies = super().pull_messages(message_ids)
        self.received.extend(replies)
        return replies


class RecordingStrategy(SecAggCheckInFedAvg):
    """Keeps what ``aggregate_fit`` receives."""

    seen: list

    def aggregate_fit(self, server_round, results, failures):
        self.seen = getattr(self, "seen", []) + [list(results)]
        return super().aggregate_fit(server_round, results, failures)


def flat_model(arrays: ArrayRecord) -> np.ndarray:
    return np.concatenate([a.numpy().astype(np.float64).ravel() for a in arrays.values()])


def clipped(update: np.ndarray, clip: float) -> np.ndarray:
    norm = float(np.linalg.norm(update))
    return update if norm <= clip else update * (clip / norm)


# --- parameters ---------------------------------------------------------------------------


@pytest.mark.parametrize("n", [2, 3, 5, 8, 9, 10, 20, 50, 100, 1000, 10_000])
@pytest.mark.parametrize("dropouts", ["none", "most"])
def test_derived_parameters_meet_their_bounds(n, dropouts):
    top = (n + 1) // 2 - 1
    d_max = 0 if dropouts == "none" else top
    p = secagg_parameters(
        num_nodes=n, dimension=5154, clip_norm=0.1, noise_multiplier=1.5, max_dropouts=d_max
    )
    t, s, big_t = p.threshold, p.num_shares, p.quantization_range
    assert p.modulus_range == MODULUS == 2**32
    assert n * (big_t + 1) < MODULUS  # no wrap-around, even one step over the top
    assert n * big_t < MODULUS  # Flower's weight factor (T per node)
    assert big_t > 4 * n  # the count decodes exactly
    assert big_t < 2**31  # Flower rounds into int32
    # The exact grid: Δ a power of two, c = (T/2) Δ, T at least half its largest value.
    top = MODULUS >> (math.ceil(math.log2(n)) + 1)
    assert math.log2(p.step).is_integer() and p.clipping_range == (big_t // 2) * p.step
    assert big_t % 2 == 0 and top / 2 - 1 < big_t <= top
    assert s == n or (s % 2 == 1 and s >= MIN_SHARES and s < n)
    assert s >= min(n, MIN_SHARES)
    assert t == s // 2 + 1 and 2 <= t <= s
    assert s - t >= d_max  # t live neighbours with D lost, wherever they are
    if s < n:
        assert d_max <= s - 2  # the (s-1)-connected ring stays connected
    assert p.population == n - d_max
    # P(a report has a coordinate beyond c) = 2 d Φ̄(z) <= 10⁻¹² for c = C (1 + σ z): c is the
    # target rounded up to the grid, by less than one step.
    target = 0.1 * (1.0 + 1.5 * stats.norm.isf(CLIPPING_TAIL / (2 * 5154)))
    assert 0.0 <= p.clipping_range - target < p.step
    z = (p.clipping_range / 0.1 - 1.0) / 1.5
    assert 2 * 5154 * stats.norm.sf(z) <= CLIPPING_TAIL * (1 + 1e-9)
    assert p.step == 2 * p.clipping_range / big_t
    assert p.sum_error_bound(n) < p.count_value / 2
    # With the defaults of the MNIST app the error is negligible next to the noise.
    if n == 100:
        assert p.sum_error_bound(n) / 50 < 1e-4 * 0.15 / math.sqrt(50)
        assert p.clipping_bias_bound() < 1e-12


def test_flower_quantiser_error_is_below_one_step():
    """Flower's own quantize/dequantize move a coordinate by less than Δ, and by nothing in
    expectation; the top of the range may round to T + 1 at most."""
    p = secagg_parameters(num_nodes=20, dimension=50, clip_norm=1.0, noise_multiplier=1.0)
    c, big_t = p.clipping_range, p.quantization_range
    rng = np.random.default_rng(3)
    x = np.concatenate([rng.normal(0, 3 * c, 20_000), [c, -c, 0.0, 2 * c, -5 * c]])
    np.random.seed(5)  # Flower's stochastic rounding uses numpy's global generator
    (q,) = quantize([x], c, big_t)
    assert q.min() >= 0 and q.max() <= big_t + 1
    (back,) = dequantize([q.astype(np.int64)], c, big_t)
    error = back - np.clip(x, -c, c)
    assert np.max(np.abs(error)) < p.step
    # Unbiased: the mean error of 20,000 roundings is within 5 standard errors of 0.
    assert abs(error.mean()) < 5 * p.step / (2 * math.sqrt(len(x)))


@pytest.mark.parametrize(
    ("kwargs", "text"),
    [
        ({"num_nodes": 1}, r"num_nodes must be an integer in \[2, 10000\]. Found 1."),
        ({"num_nodes": 10_001}, r"num_nodes must be an integer in \[2, 10000\]"),
        ({"max_dropouts": 5}, r"max_dropouts must be an integer in \[0, 4\] for num_nodes = 10"),
        ({"max_dropouts": -1}, r"max_dropouts must be an integer in \[0, 4\]"),
        ({"max_dropouts": True}, r"max_dropouts must be an integer"),
        ({"dimension": 0}, r"dimension must be an integer >= 1"),
        ({"clip_norm": 0.0}, r"clip_norm must be a finite number > 0"),
    ],
)
def test_parameter_errors(kwargs, text):
    args = {"num_nodes": 10, "dimension": 3, "clip_norm": 1.0, "noise_multiplier": 1.0}
    with pytest.raises(ValueError, match=text):
        secagg_parameters(**{**args, **kwargs})


# --- sums, zeros, what the server sees -----------------------------------------------------


def test_secure_sum_equals_the_plain_sum_within_the_quantisation_bound():
    """σ = 0, seeded coins, 10 nodes (9 shares: a sparse SecAgg+ graph), 2 rounds.

    The server's new model minus the old one equals the plain sum of the reports the nodes
    handed to SecAgg+ divided by the number that checked in, within ``m Δ / K`` per coordinate;
    nodes that did not check in handed over exact zeros (count included); the secure count is
    the number of participants; the plain part of every node's reply is the same whatever its
    coin; the training code ran on every node in every round (timing does not tell), and a
    node whose training fails contributes the zero update.
    """
    n, clip, rounds = 10, 0.5, 2
    recorded: dict = {}
    calls = []

    def update(pid, received):
        calls.append(pid)
        if pid == 4:
            raise RuntimeError(SECRET)
        return shift_update(0.04)(pid, received)

    app = numpy_app(update, mod=secagg_mod(recorded, seed=11))
    grid = RecordingGrid(app, n)
    strategy = SecAggCheckInFedAvg(privacy=privacy(clip=clip), num_nodes=n)
    models = {}

    def snapshot(server_round, arrays):
        models[server_round] = flat_model(arrays)

    strategy.start(grid, model(), num_rounds=rounds, evaluate_fn=snapshot)
    params = strategy.parameters
    assert params.num_shares == 9 < n and params.threshold == 5
    participants = []
    for r in range(1, rounds + 1):
        reports = {node: recorded.pop((r, node)) for node in grid.contexts}
        flags = {node: rep[-1][0] for node, rep in reports.items()}
        assert set(flags.values()) <= {0.0, params.count_value}
        ins = sorted(node for node, f in flags.items() if f > 0)
        outs = sorted(set(grid.contexts) - set(ins))
        assert ins and outs, "the seed must give participants and non-participants"
        for node in outs:
            assert all(np.all(a == 0.0) for a in reports[node])
        k, m = len(ins), n
        total = np.sum([np.concatenate([a.ravel() for a in reports[i][:-1]]) for i in ins], 0)
        got = models[r] - models[r - 1]
        bound = params.sum_error_bound(m) / k
        assert np.max(np.abs(got - total / k)) <= bound + 1e-7  # + float32 storage of the model
        assert bound < 1e-6 * np.max(np.abs(total / k))
        metrics = strategy.round_metrics[r]
        assert metrics["num-checked-in"] == k and metrics["num-in-sum"] == n
        proven = {EPSILON_PROVEN_KEY} if r == rounds else set()  # the last round's
        assert set(metrics) == set(SECAGG_ROUND_METRIC_KEYS) | proven
        # A participant's report is its clipped update (σ = 0); node 4 failed: zero update.
        for i in ins:
            pid = i - 1001
            expected = np.zeros(10) if pid == 4 else clipped(np.full(10, 0.04 * (pid + 1)), clip)
            np.testing.assert_allclose(
                np.concatenate([a.ravel() for a in reports[i][:-1]]), expected, atol=1e-7
            )
        participants.append(tuple(ins))
    assert len(set(participants)) > 1  # the coins change between rounds
    assert sorted(calls) == sorted(list(range(n)) * rounds)  # everyone trains every round
    # The plain part of the masked-vector replies: one value for every node and round.
    plain = set()
    for reply in grid.received:
        if reply.has_content() and "fitres.metrics" in reply.content.config_records:
            content = reply.content
            plain.add(
                (
                    repr(sorted(content.config_records["fitres.metrics"].items())),
                    repr(dict(content.metric_records["fitres.num_examples"])),
                    len(content.array_records["fitres.parameters"]),
                    tuple(
                        len(b)
                        for b in content.config_records["secaggplus_configs"]["masked_params"]
                    ),
                )
            )
    assert len(plain) == 1
    assert SECRET not in repr([r.content for r in grid.received if r.has_content()])


def _arrays_in(messages):
    """Every numeric array in the messages: ArrayRecords and serialised arrays in configs."""
    for msg in messages:
        if not msg.has_content():
            continue
        for record in msg.content.array_records.values():
            for array in record.values():
                yield np.asarray(array.numpy(), dtype=np.float64).ravel()
        for record in msg.content.config_records.values():
            for value in record.values():
                for item in value if isinstance(value, list) else [value]:
                    if isinstance(item, bytes):
                        try:
                            yield np.asarray(bytes_to_ndarray(item), dtype=np.float64).ravel()
                        except Exception:  # noqa: BLE001 - not a serialised array
                            continue


def _revealed(secrets, arrays, clipping_range, levels):
    """Node ids one of whose report arrays appears in ``arrays``, in the clear or quantised
    (within one step)."""
    found = set()
    arrays = list(arrays)
    for node, pieces in secrets.items():
        for secret in pieces:
            quantised = (np.clip(secret, -clipping_range, clipping_range) + clipping_range) * (
                levels / (2 * clipping_range)
            )
            for a in arrays:
                if a.size != secret.size:
                    continue
                clear = np.allclose(a, secret, rtol=0, atol=1e-6)
                if clear or np.all(np.abs(a - quantised) <= 1.0):
                    found.add(node)
    return found


def test_the_server_never_receives_an_unmasked_report():
    """Every node checks in (rate 1, σ = 0), so every node's report is its clipped update.

    Positive control: in the trusted-server mode the replies the ServerApp receives reveal
    every node's report. In the secure-aggregation mode neither the replies (masked vectors,
    plain parts) nor what ``aggregate_fit`` receives reveal any, in the clear or quantised;
    ``aggregate_fit`` gets one aggregate, shared by all results.
    """
    n, clip = 6, 0.5

    def update(pid, received):
        return {
            k: v + np.float32(0.013 * (pid + 1)) * (1 + np.arange(v.size).reshape(v.shape))
            for k, v in received.items()
        }

    zeros = {k: v.numpy() for k, v in model().items()}
    secrets = {}
    for pid in range(n):
        raw = {k: u.astype(np.float64).ravel() for k, u in update(pid, zeros).items()}
        norm = math.sqrt(sum(float(np.sum(u * u)) for u in raw.values()))
        secrets[1001 + pid] = [u * min(1.0, clip / norm) for u in raw.values()]
    # Positive control: the trusted-server mode.
    trusted_grid = RecordingGrid(numpy_app(update), n)
    ShuffleCheckInFedAvg(privacy=privacy(rate=1.0, clip=clip), num_nodes=n, seed=0).start(
        trusted_grid, model(), num_rounds=1
    )
    p = secagg_parameters(num_nodes=n, dimension=10, clip_norm=clip, noise_multiplier=0.0)
    assert _revealed(
        secrets, _arrays_in(trusted_grid.received), p.clipping_range, p.quantization_range
    ) == set(secrets)
    # The secure-aggregation mode.
    grid = RecordingGrid(numpy_app(update, mod=secagg_mod()), n)
    strategy = RecordingStrategy(privacy=privacy(rate=1.0, clip=clip), num_nodes=n)
    result = strategy.start(grid, model(), num_rounds=1)
    assert strategy.parameters == p
    assert not _revealed(secrets, _arrays_in(grid.received), p.clipping_range, p.quantization_range)
    (results,) = strategy.seen
    assert len(results) == n
    assert len({id(fitres.parameters) for _, fitres in results}) == 1
    from flwr.common import parameters_to_ndarrays

    aggregate = parameters_to_ndarrays(results[0][1].parameters)
    seen = [a.ravel() for a in aggregate[:-1]]
    assert not _revealed(secrets, seen, p.clipping_range, p.quantization_range)
    # ... and the model moved by the mean of the clipped updates.
    mean = np.mean([np.concatenate(pieces) for pieces in secrets.values()], axis=0)
    assert np.max(np.abs(flat_model(result.arrays) - mean)) <= p.sum_error_bound(n) / n + 1e-7


# --- dropouts -------------------------------------------------------------------------------


def test_dropouts_within_the_threshold_and_beyond():
    """n = 10, D = 2 (population 8, 9 shares, threshold 5), σ = 0, rate 1.

    Round 1: one node is lost at the masked-vector stage and another at the unmask stage: the
    sum holds 9 reports (the second node's included) and equals their plain sum within the
    bound. Round 2: three nodes lost at the masked-vector stage: fewer than n − D = 8 in the
    sum, so the round halts before unmasking, is accounted, and the model stays.
    """
    n, clip = 10, 0.5
    recorded: dict = {}
    app = numpy_app(shift_update(0.04), mod=secagg_mod(recorded))
    grid = InProcessGrid(app, n)
    ids = sorted(grid.contexts)
    grid.client_app = drop_at(
        app,
        {
            (1, "collect_masked_vectors"): {ids[2]},
            (1, "unmask"): {ids[7]},
            (2, "collect_masked_vectors"): {ids[0], ids[5], ids[9]},
        },
    )
    strategy = SecAggCheckInFedAvg(
        privacy=privacy(rate=1.0, clip=clip), num_nodes=n, max_dropouts=2
    )
    arrays = model()
    with pytest.raises(
        ProtocolViolationError,
        match="round 2: the secure aggregation halted at the 'collect masked vectors' stage",
    ):
        strategy.start(grid, arrays, num_rounds=3)
    assert strategy.rounds_accounted == 2
    first, second = strategy.round_metrics[1], strategy.round_metrics[2]
    assert first["num-in-sum"] == 9 and first["num-dropped"] == 1 and first["population"] == 8
    assert first["num-checked-in"] == 9
    assert second["num-in-sum"] == 0 and second["rounds-accounted"] == 2
    in_sum = [node for node in ids if (1, node) in recorded]
    assert ids[2] not in in_sum and ids[7] in in_sum and len(in_sum) == 9
    total = np.sum([np.concatenate([a.ravel() for a in recorded[(1, i)][:-1]]) for i in in_sum], 0)
    got = flat_model(strategy._model)
    assert np.max(np.abs(got - total / 9)) <= strategy.parameters.sum_error_bound(9) / 9 + 1e-7


def test_a_node_lost_before_it_shared_its_keys_halts_the_round():
    """Flower 1.41's workflow cannot recover a node lost at the set-up stage (its secrets were
    never shared), whatever D: the round halts at unmasking and the run stops."""
    n = 10
    app = numpy_app(shift_update(0.04), mod=secagg_mod())
    grid = InProcessGrid(app, n)
    grid.client_app = drop_at(app, {(1, "setup"): {sorted(grid.contexts)[3]}})
    strategy = SecAggCheckInFedAvg(privacy=privacy(rate=1.0), num_nodes=n, max_dropouts=2)
    with pytest.raises(ProtocolViolationError, match="round 1: the secure aggregation halted"):
        strategy.start(grid, model(), num_rounds=2)
    assert strategy.rounds_accounted == 1 and strategy.round_metrics[1]["num-in-sum"] == 0
    assert flat_model(strategy._model).tolist() == [0.0] * 10


# --- accounting -----------------------------------------------------------------------------


@pytest.mark.parametrize("max_dropouts", [0, 1])
def test_epsilon_is_the_check_in_accountant_with_population_n_minus_d(max_dropouts):
    # n = 4 + D: the population n - D is 4 in both cases (the setting's loss distribution and
    # proven epsilon are then the session's); with D = 1 the accountant must take 4, not n = 5.
    n, sigma, rate = 4 + max_dropouts, HOUSE["sigma"], HOUSE["rate"]
    cfg = privacy(sigma=sigma, rate=rate)
    grid = InProcessGrid(numpy_app(shift_update(0.04), mod=secagg_mod()), n)
    strategy = SecAggCheckInFedAvg(privacy=cfg, num_nodes=n, max_dropouts=max_dropouts)
    result = strategy.start(grid, model(), num_rounds=3)
    trusted = ShuffleCheckInFedAvg(privacy=cfg, num_nodes=n - max_dropouts)
    for r in (1, 2, 3):
        expected = history_epsilon(
            [(sigma, rate, r)], protocol="checkin", delta=1e-5, population=n - max_dropouts
        ).epsilon
        got = result.train_metrics_clientapp[r]["epsilon"]
        assert got == pytest.approx(expected, rel=1e-12)
        assert got == pytest.approx(trusted.epsilon(r), rel=1e-12)  # the same accountant
    assert strategy.history == [(sigma, rate, 3)]
    # The last round also carries the proven epsilon: the same history, method proven, n - D.
    assert [EPSILON_PROVEN_KEY in result.train_metrics_clientapp[r] for r in (1, 2, 3)] == [
        False,
        False,
        True,
    ]
    setting = MECHANISM_TABLE["checkin"].setting(sigma=sigma / 2, n=n - max_dropouts, rate=rate)
    proven = rounds_epsilon("checkin", [(setting, 3)], delta=1e-5, method="proven").epsilon
    last = result.train_metrics_clientapp[3]
    assert last[EPSILON_PROVEN_KEY] == pytest.approx(proven, rel=1e-12)
    assert strategy.epsilons_proven == {3: last[EPSILON_PROVEN_KEY]}
    assert last[EPSILON_PROVEN_KEY] >= last["epsilon"]


def test_budget_stop_before_the_round_that_would_exceed_it():
    n, cfg = 4, privacy(**HOUSE)
    probe = SecAggCheckInFedAvg(privacy=cfg, num_nodes=n)
    budget = (probe.epsilon(2) + probe.epsilon(3)) / 2
    grid = InProcessGrid(numpy_app(shift_update(0.04), mod=secagg_mod()), n)
    strategy = SecAggCheckInFedAvg(privacy=cfg, num_nodes=n, max_epsilon=budget)
    result = strategy.start(grid, model(), num_rounds=5)
    assert sorted(result.train_metrics_clientapp) == [1, 2]
    assert strategy.stop_reason.startswith("stopped before round 3")
    assert strategy.epsilon() <= budget


# --- agreement: floor, ceiling, convention, mode -------------------------------------------


def _counting_app(mod, calls):
    def update(pid, received):
        calls.append(pid)
        return shift_update(0.04)(pid, received)

    return numpy_app(update, mod=mod)


@pytest.mark.parametrize(
    ("mod", "node_config", "text"),
    [
        (
            secagg_mod(min_noise_multiplier=0.5),
            {"min-noise-multiplier": 2.0},
            "noise_multiplier 1.0 is below this node's floor 2.0",
        ),
        (
            secagg_mod(max_rate=0.8),
            {"max-checkin-rate": 0.25},
            "rate 0.5 is above this node's check-in ceiling 0.25",
        ),
        (secagg_mod(max_rate=0.4), {}, "rate 0.5 is above this node's check-in ceiling 0.4"),
        (secagg_mod(sensitivity="paper"), {}, "differs from this node's convention 1.0"),
        (
            LocalShuffleDPMod(min_noise_multiplier=0.0),
            {},
            "is not the secure-aggregation mode's echo",
        ),
        (
            PrivacyModeMod(
                trusted_server=LocalShuffleDPMod(min_noise_multiplier=0.0), secagg=secagg_mod()
            ),
            {"privacy-mode": "trusted-server"},
            "this node takes part only in the trusted-server mode; the server runs secagg",
        ),
        (None, {}, "is SecAggCheckInMod the first mod of the ClientApp?"),
        # A padding beyond an hour (the wait's timer overflowed in round 1, after the release).
        (
            secagg_mod(),
            {"reply-after": 1e300},
            "node config reply-after must be a finite number > 0 and <= 3600",
        ),
        (
            secagg_mod(reply_after=lambda context: 1e300),
            {},
            "reply_after(context) must be a finite number > 0 and <= 3600",
        ),
    ],
)
def test_start_up_check_refuses_before_any_round(mod, node_config, text):
    calls = []
    app = (
        _counting_app(mod, calls) if mod is not None else numpy_app(shift_update(), with_mod=False)
    )
    grid = InProcessGrid(app, 3, node_config=lambda i: {"partition-id": i, **node_config})
    strategy = SecAggCheckInFedAvg(privacy=privacy(sigma=1.0), num_nodes=3)
    with pytest.raises(ProtocolViolationError, match="start-up check") as info:
        strategy.start(grid, model(), num_rounds=2)
    assert text in str(info.value) and "\n" not in str(info.value)
    assert strategy.rounds_accounted == 0 and calls == []


@pytest.mark.parametrize(
    "mod",
    [
        secagg_mod(),
        PrivacyModeMod(
            trusted_server=LocalShuffleDPMod(min_noise_multiplier=0.0), secagg=secagg_mod()
        ),
    ],
)
def test_a_secagg_node_refuses_the_trusted_server_mode(mod):
    """A node that runs only the secure-aggregation mode (or pins it) stops a trusted-server
    run at its start-up check."""
    calls = []
    grid = InProcessGrid(
        _counting_app(mod, calls),
        3,
        node_config=lambda i: {"partition-id": i, "privacy-mode": "secagg"},
    )
    strategy = ShuffleCheckInFedAvg(privacy=privacy(sigma=1.0), num_nodes=3)
    with pytest.raises(ProtocolViolationError, match="takes part only in the (secagg|secure-agg)"):
        strategy.start(grid, model(), num_rounds=2)
    assert strategy.rounds_accounted == 0 and calls == []


def test_nodes_refuse_a_secagg_set_up_that_differs_from_the_derived_one(monkeypatch):
    """A server whose SecAgg+ clipping range is not the one derived from (C, σ, n, D, d): every
    node leaves the round at the masked-vector stage, with the reason; the round is accounted."""
    real = secagg_strategy.secagg_parameters

    def tampered(**kw):
        p = real(**kw)
        return dataclasses.replace(p, clipping_range=2 * p.clipping_range)

    monkeypatch.setattr(secagg_strategy, "secagg_parameters", tampered)
    calls = []
    grid = InProcessGrid(_counting_app(secagg_mod(), calls), 4)
    strategy = SecAggCheckInFedAvg(privacy=privacy(**HOUSE), num_nodes=4)
    with pytest.raises(ProtocolViolationError, match="SecAgg\\+ set-up differs"):
        strategy.start(grid, model(), num_rounds=2)
    assert strategy.rounds_accounted == 1 and calls == []


def test_the_secagg_mod_refuses_other_instructions():
    mod = secagg_mod()
    app = numpy_app(shift_update(), mod=mod)
    cfg = privacy(sigma=1.0)
    for message_type in ("evaluate", "query"):
        reply = app(instruction(model(), cfg.to_config(), message_type=message_type), context())
        assert reply.has_error() and "only training instructions" in reply.error.reason
    # A trusted-server training instruction (no SecAgg+ records, no mode).
    reply = app(instruction(model(), {**cfg.to_config(), "server-round": 1}), context())
    assert reply.has_error() and "only in the secure-aggregation mode" in reply.error.reason


# --- arguments ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "text"),
    [
        ({"max_rate": 0.0}, r"max_rate must be in \(0, 1\]"),
        ({"max_rate": 1.5}, r"max_rate must be in \(0, 1\]"),
        ({"min_noise_multiplier": -1.0}, "min_noise_multiplier must be"),
        ({"train_when_absent": "yes"}, "train_when_absent must be True or False"),
        ({"seed": -1}, "seed must be an integer >= 0"),
        ({"reply_after": -1.0}, "reply_after must be a finite number > 0"),
        ({"reply_after": 0.0}, "reply_after must be a finite number > 0"),
        (
            {"reply_after": 1e300},
            r"^reply_after must be a finite number > 0 and <= 3600 \(seconds; one hour\)\. "
            r"Found 1e\+300\.$",
        ),
        ({"reply_after": 3600.5}, "reply_after must be a finite number > 0 and <= 3600"),
        ({"secure_aggregation_mod": 3}, "secure_aggregation_mod must be a mod"),
    ],
)
def test_mod_arguments(kwargs, text):
    with pytest.raises(ValueError, match=text):
        SecAggCheckInMod(**{"min_noise_multiplier": 0.5, "reply_after": 1.0, **kwargs})


def test_an_hour_of_padding_is_accepted():
    assert SecAggCheckInMod(min_noise_multiplier=0.5, reply_after=3600.0).reply_after == 3600.0


def test_strategy_and_router_arguments():
    cfg = privacy(sigma=1.0)
    with pytest.raises(ValueError, match=r"num_nodes must be an integer in \[2, 10000\]"):
        SecAggCheckInFedAvg(privacy=cfg, num_nodes=1)
    with pytest.raises(ValueError, match=r"max_dropouts must be an integer in \[0, 1\]"):
        SecAggCheckInFedAvg(privacy=cfg, num_nodes=3, max_dropouts=2)
    strategy = SecAggCheckInFedAvg(privacy=cfg, num_nodes=3)
    grid = InProcessGrid(numpy_app(shift_update(), mod=secagg_mod()), 3)
    with pytest.raises(ValueError, match=r"train_config must not set \['shuffle-dp.mode'\]"):
        strategy.start(grid, model(), train_config={"shuffle-dp.mode": "x"})
    ints = ArrayRecord({"w": Array(np.zeros(3, dtype=np.int64))})
    with pytest.raises(ValueError, match=r"initial_arrays\['w'\] must be floating-point"):
        strategy.start(grid, ints)
    assert strategy.rounds_accounted == 0
    with pytest.raises(ValueError, match="needs the mod of at least one mode"):
        PrivacyModeMod()
    router = PrivacyModeMod(secagg=secagg_mod())
    reply = router(
        instruction(model(), cfg.to_config()), context(node_config={"privacy-mode": "both"}), None
    )
    assert reply.has_error() and "privacy-mode must be one of trusted-server, secagg" in (
        reply.error.reason
    )


def test_fewer_nodes_never_lower_epsilon():
    """The dropout rule accounts a sum of m >= n − D nodes with population n − D: that needs ε
    non-increasing in the population (the post-processing argument of docs/maths.md)."""
    # By the default method (pld) at populations across both of its engines (the geometric grid
    # up to 12 reports: 2, 4, 8, 12; the lattice above: 13, 20, 40), and by the Rényi bound at
    # every population. The populations 4 and 20 at this σ and γ are the accountant's of other
    # tests (the session's cache keeps their loss distributions); each other one costs a build.
    for method, populations in (
        (None, [2, 4, 8, 12, 13, 20, 40]),
        ("exact", list(range(2, 41))),
    ):
        eps = [
            history_epsilon(
                [(1.5, 0.5, 20)], protocol="checkin", delta=1e-5, population=p, method=method
            ).epsilon
            for p in populations
        ]
        assert all(a >= b for a, b in zip(eps, eps[1:], strict=False)), method
        assert eps[0] > eps[-1]


def test_documented_parameters_of_the_mnist_app():
    """docs/flower.md quotes the SecAgg+ parameters of the MNIST app's defaults (n = 100,
    cnn_small's 5,154 weights, C = 0.1, σ = 1.5); they must be what the code derives."""
    from pathlib import Path

    p = secagg_parameters(num_nodes=100, dimension=5154, clip_norm=0.1, noise_multiplier=1.5)
    assert (p.num_shares, p.threshold, p.step) == (9, 5, 2.0**-22)
    doc = (Path(__file__).resolve().parents[2] / "docs" / "flower.md").read_text()
    quoted = (
        f"s = 9, t = 5, c = {p.clipping_range:.3f}, T = {p.quantization_range:,}, "
        f"Δ = 2⁻²² ≈ {p.step:.1e}"
    )
    assert quoted.replace("e-07", "·10⁻⁷") in doc
    assert f"{p.sum_error_bound(100) / 50:.1e}".replace("e-07", "·10⁻⁷") in doc


def test_reply_after_pads_the_masked_vector_step(no_padding_wait):
    """Every node waits until ``reply_after`` seconds after the masked-vector instruction
    arrived before handing over its report, whatever its training took."""
    grid = InProcessGrid(numpy_app(shift_update(0.04), mod=secagg_mod(reply_after=30.0)), 3)
    SecAggCheckInFedAvg(privacy=privacy(), num_nodes=3).start(grid, model(), num_rounds=1)
    assert len(no_padding_wait) == 3 and all(29.0 < s <= 30.0 for s in no_padding_wait)
