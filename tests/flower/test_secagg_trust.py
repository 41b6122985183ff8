"""The secure-aggregation mode meets its own assumptions: what the nodes enforce, what the
server checks (issue 32).

Node side: padding to ``reply_after`` (required), the rounding drawn inside the mod, the
dropout rule checked before unmasking, and a failed or overrunning training that stays in the
sum with zeros. Server side: the decoded sum checked against what honest nodes produce, and
malformed replies ending the run with one line, the round's metrics and a stop reason. Every
run is Flower's SecAgg+ on an :class:`~shuffle_opacus.flower.InProcessGrid`.
"""

from __future__ import annotations

import math
import sys
import time

import numpy as np
import pytest

pytest.importorskip("flwr")

from flwr.app import ConfigRecord, Context  # noqa: E402
from flwr.common.secure_aggregation.quantization import quantize  # noqa: E402
from flwr.server.workflow import SecAggPlusWorkflow  # noqa: E402

import shuffle_opacus.flower.secagg.mod as secagg_mod_module  # noqa: E402
import shuffle_opacus.flower.secagg.strategy as secagg_strategy  # noqa: E402
from shuffle_opacus.flower import (  # noqa: E402
    InProcessGrid,
    ProtocolViolationError,
    SecAggCheckInFedAvg,
    SecAggCheckInMod,
    ShufflePrivacyConfig,
    secagg_parameters,
)
from shuffle_opacus.flower.secagg.node import (  # noqa: E402
    NOT_IN_SUM_KEY,
    local_report,
    open_round,
    unmask_problem,
)
from shuffle_opacus.flower.secagg.parameters import round_onto_grid  # noqa: E402
from shuffle_opacus.flower.secagg.workflow import SecAggWorkflow  # noqa: E402

from .helpers import (  # noqa: E402
    context,
    deviant_secagg,
    mixed,
    model,
    numpy_app,
    secagg_spy,
    shift_update,
)

STAGE = "secaggplus_configs"


def privacy(sigma=1.0, rate=1.0, clip=0.5) -> ShufflePrivacyConfig:
    # The Rényi method ("exact"): epsilon after each round in milliseconds (nothing here is
    # about its value).
    return ShufflePrivacyConfig(
        noise_multiplier=sigma,
        clip_norm=clip,
        rate=rate,
        delta=1e-5,
        allow_noiseless=sigma == 0,
        method="exact",
    )


def secagg_mod(recorded=None, **kw) -> SecAggCheckInMod:
    kw.setdefault("min_noise_multiplier", 0.0)
    kw.setdefault("allow_noiseless", True)
    kw.setdefault("reply_after", 30.0)
    if recorded is not None:
        kw["secure_aggregation_mod"] = secagg_spy(recorded)
    return SecAggCheckInMod(**kw)


@pytest.fixture
def no_wait(monkeypatch):
    """Skip the padding's wait (the training thread's deadline stays ``reply_after``)."""
    monkeypatch.setattr(secagg_mod_module, "_SLEEP", lambda seconds: None)


def flat(arrays) -> np.ndarray:
    return np.concatenate([a.numpy().astype(np.float64).ravel() for a in arrays.values()])


def stage_of(msg) -> str | None:
    record = msg.content.config_records.get(STAGE) if msg.has_content() else None
    return None if record is None else record.get("stage")


# --- padding ---------------------------------------------------------------------------------


def test_padding_is_required_and_a_node_can_only_raise_it():
    with pytest.raises(TypeError, match="reply_after"):
        SecAggCheckInMod(min_noise_multiplier=0.5)  # type: ignore[call-arg]
    for bad in (0.0, -1.0, math.inf):
        with pytest.raises(ValueError, match="reply_after must be a finite number > 0"):
            SecAggCheckInMod(min_noise_multiplier=0.5, reply_after=bad)
    mod = SecAggCheckInMod(min_noise_multiplier=0.5, reply_after=2.0)
    assert mod.padding(context()) == 2.0
    assert mod.padding(context(node_config={"reply-after": 5.0})) == 5.0
    assert mod.padding(context(node_config={"reply-after": 1.0})) == 2.0
    with pytest.raises(ValueError, match="node config reply-after must be a finite number > 0"):
        mod.padding(context(node_config={"reply-after": -3.0}))
    # A function of the node's Context (its public run config, say).
    derived = SecAggCheckInMod(
        min_noise_multiplier=0.5, reply_after=lambda ctx: ctx.run_config["padding"]
    )
    ctx = context()
    ctx.run_config["padding"] = 3.0
    assert derived.padding(ctx) == 3.0
    ctx.run_config["padding"] = 0.0
    with pytest.raises(ValueError, match=r"reply_after\(context\) must be a finite number > 0"):
        derived.padding(ctx)


def test_reply_times_do_not_follow_training_time():
    """Node i's training takes 0.03 i s (its data size, say), node 3's 0.5 s. With
    ``reply_after = 0.2`` every node's masked-vector step takes at least 0.2 s, and node 3
    does not wait for its training: it replies at the same time, with the zero update, stays
    in the sum and counts the overrun in its local record."""
    recorded: dict = {}

    def update(pid, received):
        time.sleep(0.5 if pid == 3 else 0.03 * pid)
        return shift_update(0.04)(pid, received)

    app = numpy_app(update, mod=secagg_mod(recorded, reply_after=0.2))
    times = {}

    def timed(msg, ctx):
        stage = stage_of(msg)
        started = time.monotonic()
        reply = app(msg, ctx)
        if stage == "collect_masked_vectors":
            times[int(ctx.node_id)] = time.monotonic() - started
        return reply

    grid = InProcessGrid(app, 4)
    grid.client_app = timed
    strategy = SecAggCheckInFedAvg(privacy=privacy(sigma=0.0), num_nodes=4)
    strategy.start(grid, model(), num_rounds=1)
    assert len(times) == 4 and all(0.2 <= t < 0.45 for t in times.values()), times
    assert strategy.round_metrics[1]["num-in-sum"] == 4
    reports = {
        node: np.concatenate([a.ravel() for a in recorded[(1, node)][:-1]]) for node in times
    }
    assert np.all(reports[1004] == 0.0) and all(np.any(reports[i] != 0) for i in (1001, 1002))
    assert local_report(grid.contexts[1004])["training-overran"] == 1
    assert local_report(grid.contexts[1001])["training-overran"] == 0


# --- rounding --------------------------------------------------------------------------------


def test_rounding_does_not_depend_on_numpys_global_generator(monkeypatch, no_wait):
    """The training code seeds numpy's global generator (from its data, say): 0, then 1. With
    the mod's own seed fixed, Flower's quantised integers are the same in both runs, and they
    are exactly the grid points the mod chose."""
    module = sys.modules["flwr.client.mod.secure_aggregation.secaggplus_mod"]
    seen: list = []

    def spy(values, clipping_range, target_range):
        out = quantize(values, clipping_range, target_range)
        step = 2 * clipping_range / target_range
        for v, q in zip(values, out, strict=True):
            exact = (np.asarray(v) + clipping_range) / step
            assert np.array_equal(exact, q)  # the mod's values are grid points
        seen.append(np.concatenate([q.ravel() for q in out]))
        return out

    monkeypatch.setattr(module, "quantize", spy)
    runs = []
    for global_seed in (0, 1):

        def update(pid, received, s=global_seed):
            np.random.seed(s)
            return shift_update(0.04)(pid, received)

        seen.clear()
        # 4 nodes at σ = 1, γ = 1: the proven epsilon of the last round is that of test_strategy.py
        # (the session's cache keeps it).
        grid = InProcessGrid(numpy_app(update, mod=secagg_mod(seed=3)), 4)
        SecAggCheckInFedAvg(privacy=privacy(), num_nodes=4).start(grid, model(), num_rounds=1)
        runs.append(np.concatenate(seen))
    assert np.array_equal(runs[0], runs[1])


@pytest.mark.parametrize(("n", "d", "clip", "sigma"), [(2, 10, 0.5, 1.0), (100, 5154, 0.1, 1.5)])
def test_the_grid_is_exact_for_flowers_quantiser_and_the_rounding_unbiased(n, d, clip, sigma):
    p = secagg_parameters(num_nodes=n, dimension=d, clip_norm=clip, noise_multiplier=sigma)
    c, big_t = p.clipping_range, p.quantization_range
    x = np.random.default_rng(7).normal(0.0, c, 100_000)
    x[:4] = [c, -c, 0.0, 3 * c]
    y = round_onto_grid([x], p, np.random.default_rng(8))[0]
    assert np.array_equal(y, round_onto_grid([x], p, np.random.default_rng(8))[0])
    outs = []
    for seed in (1, 2):
        np.random.seed(seed)
        outs.append(quantize([y], c, big_t)[0])
    assert np.array_equal(outs[0], outs[1])
    assert np.array_equal(outs[0], np.round((y + c) / p.step))
    assert outs[0][:3].tolist() == [big_t, 0, big_t // 2]
    error = y - np.clip(x, -c, c)
    assert np.max(np.abs(error)) < p.step
    assert abs(error.mean()) < 5 * p.step / (2 * math.sqrt(len(x)))  # unbiased
    with pytest.raises(ValueError, match="finite"):
        round_onto_grid([np.array([np.nan])], p, np.random.default_rng(0))


# --- the dropout rule, on the nodes ----------------------------------------------------------


def _deviating_server(monkeypatch, **overrides):
    """Make SecAggCheckInFedAvg run a workflow without some of its checks (a deviating server)."""
    monkeypatch.setattr(
        secagg_strategy,
        "SecAggWorkflow",
        type("Deviating", (SecAggWorkflow,), dict(overrides)),
    )


def test_nodes_refuse_to_unmask_a_sum_the_server_should_have_halted(monkeypatch, no_wait):
    """n = 10, D = 2. A server that skips the halt loses 3 nodes at the masked-vector stage
    and asks to unmask the other 7 (fewer than n − D = 8): every live node refuses its shares,
    so the round halts at unmasking; it is accounted and the model stays."""

    def no_halt(self, grid, context, state):
        self.min_in_sum = 0
        return SecAggWorkflow.collect_masked_vectors_stage(self, grid, context, state)

    _deviating_server(monkeypatch, collect_masked_vectors_stage=no_halt)
    app = numpy_app(shift_update(0.04), mod=secagg_mod())
    grid = InProcessGrid(app, 10)
    lost = set(sorted(grid.contexts)[:3])

    def dropping(msg, ctx):
        if stage_of(msg) == "collect_masked_vectors" and int(ctx.node_id) in lost:
            raise ConnectionError("node lost")
        return app(msg, ctx)

    grid.client_app = dropping
    strategy = SecAggCheckInFedAvg(privacy=privacy(sigma=0.0), num_nodes=10, max_dropouts=2)
    with pytest.raises(ProtocolViolationError, match="halted at the 'unmask' stage") as info:
        strategy.start(grid, model(), num_rounds=2)
    assert (
        "no unmasking shares: 3 of the round's 10 nodes are missing from the sum, more than "
        "max_dropouts D = 2" in str(info.value)
    )
    assert strategy.rounds_accounted == 1 and strategy.round_metrics[1]["num-in-sum"] == 0
    assert np.all(flat(strategy._model) == 0.0)
    refused = [local_report(c)["refused-unmask"] for node, c in grid.contexts.items()]
    assert sorted(refused) == [0] * 3 + [1] * 7


def test_nodes_refuse_to_unmask_for_a_server_that_does_not_name_the_missing(monkeypatch, no_wait):
    """Flower's own unmasking stage (no list of missing nodes): the nodes cannot check the
    rule, so they send no shares, even with no dropout."""

    def plain_unmask(self, grid, context, state):
        return self._watch(
            "unmask", SecAggPlusWorkflow.unmask_stage(self, grid, context, state), state
        )

    _deviating_server(monkeypatch, unmask_stage=plain_unmask)
    grid = InProcessGrid(numpy_app(shift_update(0.04), mod=secagg_mod()), 4)
    strategy = SecAggCheckInFedAvg(privacy=privacy(sigma=0.0), num_nodes=4)
    with pytest.raises(ProtocolViolationError, match="does not name the nodes missing"):
        strategy.start(grid, model(), num_rounds=1)
    assert np.all(flat(strategy._model) == 0.0)


def _unmask_context(share_num=9, n=10, dropouts=2, opened=True) -> Context:
    ctx = context()  # node 1001
    state = ConfigRecord({"share_num": share_num, "sample_num": n})
    ctx.state.config_records["secaggplus_state"] = state
    if opened:
        open_round(ctx, 1, n, dropouts)
    return ctx


@pytest.mark.parametrize(
    ("active", "dead", "missing", "kw", "text"),
    [
        ([1001, 1002], [1003], [1003], {}, None),
        ([1001, 1002], [], [1003, 1004], {}, None),  # missing nodes beyond the neighbourhood
        ([1001, 1002], [1003], None, {}, "does not name the nodes missing from the sum"),
        ([1001, 1002], [1003], [1003, 1004, 1005], {}, "3 of the round's 10 nodes are missing"),
        ([1001, 1002], [1003], [1004], {}, "contradicts"),  # a lost neighbour not listed
        ([1001, 1002], [1003], [1003, 1002], {}, "contradicts"),  # a listed neighbour in it
        ([1002], [1001], [1001], {}, "contradicts"),  # itself listed
        ([1001], [1003], [1003, 1003], {}, "repeats a node"),
        ([1001], [1003], [1003], {"opened": False}, "no masked vector of this node"),
        (
            [1001, *range(1004, 1011)],
            [1003],
            [1003],
            {"share_num": 10},
            "must cover the n = 10 nodes",
        ),  # complete graph: 9 listed of 10
        ([1001, 1002, *range(1004, 1011)], [1003], [1003], {"share_num": 10}, None),
    ],
)
def test_the_unmask_check(active, dead, missing, kw, text):
    ctx = _unmask_context(**kw)
    configs = ConfigRecord({"active_nids": active, "dead_nids": dead})
    if missing is not None:
        configs[NOT_IN_SUM_KEY] = missing
    problem = unmask_problem(configs, ctx)
    assert problem is None if text is None else text in problem
    assert unmask_problem(configs, ctx) == "no masked vector of this node is waiting to be unmasked"


# --- a failing training: zeros, in the sum ---------------------------------------------------


@pytest.mark.parametrize(
    ("failure", "counter"),
    [
        ("raises", "training-failed"),
        ("wrong arrays", "training-failed"),
        ("nan", "non-finite-update"),
    ],
)
def test_a_node_whose_training_fails_stays_in_the_sum_with_zeros(failure, counter, no_wait):
    recorded: dict = {}

    def update(pid, received):
        if pid == 1 and failure == "raises":
            raise MemoryError("out of memory on this node's largest example")
        out = shift_update(0.04)(pid, received)
        if pid == 1 and failure == "wrong arrays":
            return {"other": np.zeros(3, np.float32)}
        if pid == 1 and failure == "nan":
            out["a"][0, 0] = np.nan
        return out

    grid = InProcessGrid(numpy_app(update, mod=secagg_mod(recorded)), 4)
    received = []
    pull = grid.pull_messages
    grid.pull_messages = lambda ids: received.extend(pull(ids)) or received[-4:]
    strategy = SecAggCheckInFedAvg(privacy=privacy(sigma=0.0), num_nodes=4)
    strategy.start(grid, model(), num_rounds=1)
    assert not any(r.has_error() for r in received)  # the server sees no failure
    assert "training-failed" not in repr([r.content for r in received])
    metrics = strategy.round_metrics[1]
    assert metrics["num-in-sum"] == 4 and metrics["num-checked-in"] == 4
    assert all(np.all(a == 0.0) for a in recorded[(1, 1002)][:-1])
    assert all(np.any(a != 0.0) for node in (1001, 1003) for a in recorded[(1, node)][:-1])
    assert local_report(grid.contexts[1002])[counter] == 1
    assert local_report(grid.contexts[1001]) == {
        "rounds": 1,
        "training-failed": 0,
        "training-overran": 0,
        "non-finite-update": 0,
        "refused-unmask": 0,
    }


# --- the decoded sum against what honest nodes produce ---------------------------------------


def _count_zero_plus_c(arrays, state):
    c = float(state["clipping_range"])
    return [np.full(a.shape, c) for a in arrays[:-1]] + [np.zeros(1)]


def _shift_masked(arrays, state):
    t, m = int(state["target_range"]), int(state["mod_range"])
    return [arrays[0], *[(a + 8 * t) % m for a in arrays[1:-1]], arrays[-1]]


def _count_beyond_m(arrays, state):
    t, m = int(state["target_range"]), int(state["mod_range"])
    return [*arrays[:-1], (arrays[-1] + 7 * (t // 2)) % m]


def _zero_weight_total(arrays, state):
    t, m = int(state["target_range"]), int(state["mod_range"])
    return [(arrays[0] - 6 * t) % m, *arrays[1:]]  # the six weight factors sum to 0 mod M


@pytest.mark.parametrize(
    ("attack", "text"),
    [
        (deviant_secagg(report=_count_zero_plus_c), "above the bound"),
        (deviant_secagg(masked=_shift_masked), "above the bound"),
        (deviant_secagg(masked=_count_beyond_m), "is not a whole number of nodes in [0, 6]"),
        (deviant_secagg(masked=_zero_weight_total), "is not a whole number of nodes"),
    ],
    ids=["count 0 and +c", "+8T after quantising", "count beyond m", "weight factors to 0"],
)
def test_a_sum_no_honest_round_produces_is_rejected(attack, text, no_wait):
    """One node of 6 does not follow the protocol (σ = 1, C = 0.5, γ = 0.5, seeded coins): in
    both rounds the sum is rejected, the model stays, the round says so, and the run goes on."""
    honest = numpy_app(shift_update(0.05), mod=secagg_mod(seed=5, min_noise_multiplier=0.5))
    bad = numpy_app(
        shift_update(0.05),
        mod=secagg_mod(seed=5, min_noise_multiplier=0.5, secure_aggregation_mod=attack),
    )
    grid = InProcessGrid(honest, 6)
    grid.client_app = mixed(honest, bad, {1001})
    # The proven epsilon of the last round (1 s for 6 nodes) is not what this tests.
    strategy = SecAggCheckInFedAvg(privacy=privacy(rate=0.5), num_nodes=6, report_proven=False)
    result = strategy.start(grid, model(), num_rounds=2)
    assert np.all(flat(result.arrays) == 0.0)
    assert [m["sum-rejected"] for m in strategy.round_metrics.values()] == [1, 1]
    assert strategy.round_metrics[2]["rounds-rejected"] == 2 == strategy.rounds_rejected
    assert sorted(strategy.skip_reasons) == [1, 2] and strategy.stop_reason is None
    assert text in strategy.skip_reasons[1] and "the model is unchanged" in strategy.skip_reasons[1]
    assert strategy.rounds_accounted == 2


def test_honest_rounds_pass_the_check(no_wait):
    """Positive control of the test above: the same run with six honest nodes (and a node whose
    training failed) moves the model and rejects nothing."""
    app = numpy_app(shift_update(0.05), mod=secagg_mod(seed=5, min_noise_multiplier=0.5))
    strategy = SecAggCheckInFedAvg(privacy=privacy(rate=0.5), num_nodes=6, report_proven=False)
    result = strategy.start(InProcessGrid(app, 6), model(), num_rounds=2)
    assert [m["sum-rejected"] for m in strategy.round_metrics.values()] == [0, 0]
    assert np.any(flat(result.arrays) != 0.0) and strategy.skip_reasons == {}


def test_the_honest_sum_bound_holds_for_honest_sums():
    """Simulated honest sums (K clipped updates of norm C in random directions plus the noise
    of K reports) at the MNIST app's size stay within the bound; one node's +c on every
    coordinate does not, up to K = 50."""
    p = secagg_parameters(num_nodes=100, dimension=5154, clip_norm=0.1, noise_multiplier=1.5)
    rng = np.random.default_rng(0)
    for k in (0, 1, 5, 50, 100):
        for _ in range(20):
            updates = rng.normal(size=(k, 5154))
            updates *= 0.1 / np.linalg.norm(updates, axis=1, keepdims=True).clip(1e-12)
            total = updates.sum(0) + rng.normal(0.0, 0.15 * math.sqrt(k), 5154)
            assert np.linalg.norm(total) <= p.honest_sum_bound(k, 100)
        if k <= 50:
            attacked = total + p.clipping_range
            assert np.linalg.norm(attacked) > p.honest_sum_bound(k, 100)
    with pytest.raises(ValueError, match=r"num_checked_in must be an integer in \[0, 3\]"):
        p.honest_sum_bound(4, 3)


# --- malformed replies -----------------------------------------------------------------------


def _masked_edit(edit):
    return deviant_secagg(masked=lambda arrays, state: edit(arrays, int(state["mod_range"])))


def _reply_edit(stage, edit):
    def reply(at, content):
        if at == stage:
            edit(content)

    return deviant_secagg(reply=reply)


@pytest.mark.parametrize(
    ("attack", "stage", "text"),
    [
        (
            _masked_edit(lambda a, m: [a[0], np.append(a[1].ravel(), 0), *a[2:]]),
            "collect masked vectors",
            "masked array 1 has shape (7,), expected (2, 3)",
        ),
        (
            _masked_edit(lambda a, m: [a[0], a[1].astype(np.float64), *a[2:]]),
            "collect masked vectors",
            "masked array 1 has dtype float64, not integers",
        ),
        (
            _masked_edit(lambda a, m: a[:-1]),
            "collect masked vectors",
            "3 masked arrays where 4 were expected",
        ),
        (
            _masked_edit(lambda a, m: [a[0], a[1] + m, *a[2:]]),
            "collect masked vectors",
            "masked array 1 has values outside [0, 4294967296)",
        ),
        (
            _reply_edit(
                "collect_masked_vectors", lambda c: c.config_records[STAGE].pop("masked_params")
            ),
            "collect masked vectors",
            "no list of masked arrays where 4 were expected",
        ),
        (
            _reply_edit(
                "collect_masked_vectors",
                lambda c: c.metric_records.pop("fitres.num_examples"),
            ),
            "collect masked vectors",
            "its FitRes part (status, weight, metrics) is missing or unreadable",
        ),
        (
            _reply_edit("setup", lambda c: c.config_records[STAGE].pop("pk1")),
            "setup",
            "the public keys are missing or not bytes",
        ),
        (
            _reply_edit("share_keys", lambda c: c.config_records[STAGE]["ctxts"].pop()),
            "share keys",
            "the destinations and ciphertexts are not two lists of equal length",
        ),
        (
            _reply_edit("unmask", lambda c: c.config_records[STAGE]["nids"].__setitem__(0, 7)),
            "unmask",
            "shares of nodes that are not in the round",
        ),
    ],
    ids=[
        "shape",
        "dtype",
        "arrays",
        "range",
        "no vector",
        "no weight",
        "keys",
        "ciphertexts",
        "shares",
    ],
)
def test_a_malformed_reply_ends_the_run_with_one_line(attack, stage, text, no_wait):
    honest = numpy_app(shift_update(0.05), mod=secagg_mod())
    grid = InProcessGrid(honest, 4)
    grid.client_app = mixed(
        honest, numpy_app(shift_update(0.05), mod=secagg_mod(secure_aggregation_mod=attack)), {1002}
    )
    strategy = SecAggCheckInFedAvg(privacy=privacy(sigma=0.0), num_nodes=4)
    with pytest.raises(ProtocolViolationError) as info:
        strategy.start(grid, model(), num_rounds=2)
    message = str(info.value)
    assert f"round 1: a node's reply at the '{stage}' stage of SecAgg+ is malformed ({text})" in (
        message
    )
    assert "\n" not in message and info.value.__cause__ is None
    assert strategy.stop_reason == message.rstrip(".")
    assert strategy.rounds_accounted == 1 and strategy.round_metrics[1]["num-in-sum"] == 0
    assert np.all(flat(strategy._model) == 0.0)


def test_a_reply_with_the_wrong_weight_ends_the_run_with_metrics(no_wait):
    """The plain part of a masked-vector reply (here the weight 2) is checked as before, and the
    round now has its metrics and a stop reason."""

    def weight_two(at, content):
        if at == "collect_masked_vectors":
            content.metric_records["fitres.num_examples"]["num_examples"] = 2

    honest = numpy_app(shift_update(0.05), mod=secagg_mod())
    bad = numpy_app(
        shift_update(0.05), mod=secagg_mod(secure_aggregation_mod=deviant_secagg(reply=weight_two))
    )
    grid = InProcessGrid(honest, 4)
    grid.client_app = mixed(honest, bad, {1003})
    strategy = SecAggCheckInFedAvg(privacy=privacy(sigma=0.0), num_nodes=4)
    with pytest.raises(ProtocolViolationError, match="weight 2, expected 1") as info:
        strategy.start(grid, model(), num_rounds=1)
    assert "\n" not in str(info.value) and strategy.stop_reason is not None
    assert strategy.round_metrics[1]["num-in-sum"] == 0
