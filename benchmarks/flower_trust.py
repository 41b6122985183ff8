"""What one node, or a server that skips a rule, can do in each trust mode (issue 32's findings).

Run: ``python benchmarks/flower_trust.py [1 2 3 4 5 6 7]`` (all by default). Every run is
Flower's own SecAgg+ (or the trusted-server mode) on an
:class:`~shuffle_opacus.flower.InProcessGrid` with a 10-weight numpy model, so it takes
seconds. It also runs against the package before issue 32 (``git checkout 9dd4dbb --
shuffle_opacus`` in a scratch copy), which is how ``docs/flower.md`` got its "before" column:
the few lines that detect the version are marked.

1. reply time of the masked-vector step when node i's training takes 0.05 (i + 1) s;
2. how much of Flower's quantised report the training code decides by seeding numpy's global
   generator (σ = 0, the mod's seed fixed);
3. a server that does not halt a round whose sum misses more than D nodes (n = 10, D = 2, 3
   lost);
4. a node whose training raises MemoryError, and one whose training overruns;
5. one node of 6 that does not follow the protocol: a zero count with +c on every
   coordinate, +8T on its masked vector after quantisation, a count raised by 3 after
   quantisation; the largest weight after 2 rounds, the decoded counts and rejections;
6. a masked vector with one coordinate too many;
7. trusted-server mode: one node of 4 reporting at 0.999 × the norm bound along one direction
   for 20 rounds, against an honest run (the projection of the model on that direction).
"""

from __future__ import annotations

import inspect
import math
import sys
import time
import traceback

import numpy as np
from flwr.app import Array, ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.client.mod import secaggplus_mod
from flwr.clientapp import ClientApp
from flwr.common import bytes_to_ndarray, ndarray_to_bytes
from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS

import shuffle_opacus.flower as sf
from shuffle_opacus.flower import (
    InProcessGrid,
    LocalShuffleDPMod,
    SecAggCheckInFedAvg,
    SecAggCheckInMod,
    ShuffleCheckInFedAvg,
    ShufflePrivacyConfig,
)

# Version detection (the package before issue 32 had an optional reply_after).
NEW = "reply_after" in inspect.signature(SecAggCheckInMod).parameters and (
    inspect.signature(SecAggCheckInMod).parameters["reply_after"].default is inspect.Parameter.empty
)


def mod(**kw):
    kw.setdefault("min_noise_multiplier", 0.0)
    kw.setdefault("allow_noiseless", True)
    if NEW:
        kw.setdefault("reply_after", 0.05)
    return SecAggCheckInMod(**kw)


def app_with(mod_obj, update, before_train=None):
    app = ClientApp(mods=[mod_obj] if mod_obj is not None else [])

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        pid = int(context.node_config["partition-id"])
        if before_train is not None:
            before_train(pid)
        got = {k: v.numpy().copy() for k, v in msg.content["arrays"].items()}
        new = update(pid, got)
        return Message(
            RecordDict(
                {
                    "arrays": ArrayRecord({k: Array(np.asarray(v)) for k, v in new.items()}),
                    "metrics": MetricRecord({"num-examples": 1}),
                }
            ),
            reply_to=msg,
        )

    return app


def model():
    return ArrayRecord(
        {"a": Array(np.zeros((2, 3), np.float32)), "b": Array(np.zeros(4, np.float32))}
    )


def shift(pid, got):
    return {k: v + np.float32(0.05 * (pid + 1)) for k, v in got.items()}


def privacy(sigma=1.0, rate=0.5, clip=0.5):
    return ShufflePrivacyConfig(
        noise_multiplier=sigma,
        clip_norm=clip,
        rate=rate,
        delta=1e-5,
        allow_noiseless=sigma == 0.0,
    )


class Mixed:
    """A ClientApp stand-in: node ids in ``bad`` run ``bad_app``, the others ``good_app``."""

    def __init__(self, good_app, bad_app, bad):
        self.good_app, self.bad_app, self.bad = good_app, bad_app, bad

    def __call__(self, msg, ctx):
        app = self.bad_app if int(ctx.node_id) in self.bad else self.good_app
        return app(msg, ctx)


def stage_of(msg):
    cfg = msg.content.config_records.get(RECORD_KEY_CONFIGS)
    return None if cfg is None else cfg.get("stage")


def tampering_secagg(edit_step=None, edit_masked=None):
    """secaggplus_mod with the node's report (edit_step) or masked vector (edit_masked) changed."""

    def m(msg, ctx, call_next):
        stage = stage_of(msg)

        def step(inner, c):
            reply = call_next(inner, c)
            if edit_step is None:
                return reply
            return edit_step(reply, c)

        out = secaggplus_mod(msg, ctx, step)
        if stage == "collect_masked_vectors" and edit_masked is not None:
            rec = out.content.config_records[RECORD_KEY_CONFIGS]
            arrays = [bytes_to_ndarray(b) for b in rec["masked_params"]]
            arrays = edit_masked(arrays, ctx)
            rec["masked_params"] = [ndarray_to_bytes(a) for a in arrays]
        return out

    return m


def run_secagg(bad_behaviour=None, n=6, rounds=2, seed=5):
    cfg = privacy()
    good = app_with(mod(seed=seed), shift)
    bad_ids = set()
    app = good
    if bad_behaviour is not None:
        bad = app_with(mod(seed=seed, secure_aggregation_mod=bad_behaviour), shift)
        bad_ids = {1001}
        app = Mixed(good, bad, bad_ids)
    grid = InProcessGrid(good, n)
    grid.client_app = app
    strategy = SecAggCheckInFedAvg(privacy=cfg, num_nodes=n)
    error = None
    try:
        result = strategy.start(grid, model(), num_rounds=rounds)
        arrays = result.arrays
    except Exception as exc:  # noqa: BLE001
        error = exc
        arrays = strategy._model
    w = np.concatenate([a.numpy().ravel() for a in arrays.values()])
    return strategy, w, error


def report(name, strategy, w, error):
    ks = {r: m.get("num-checked-in") for r, m in strategy.round_metrics.items()}
    rej = {r: m.get("sum-rejected") for r, m in strategy.round_metrics.items()}
    print(
        f"   {name:<36} largest |weight| {np.max(np.abs(w)):7.3f}; K by round {ks}; "
        f"rejected {rej}; error {type(error).__name__ if error else None}"
        + (f" ({str(error)[:120]})" if error else "")
    )


def finding_1_timing():
    print("1. reply time of the masked-vector step (training sleeps 0.05 (i + 1) s on node i)")
    times = {}

    def slow(pid):
        time.sleep(0.05 * (pid + 1))

    kw = {"reply_after": 0.4} if NEW else {}
    app = app_with(mod(**kw), shift, before_train=slow)

    def timed(msg, ctx):
        t0 = time.monotonic()
        stage = stage_of(msg)
        out = app(msg, ctx)
        if stage == "collect_masked_vectors":
            times[int(ctx.node_id)] = time.monotonic() - t0
        return out

    grid = InProcessGrid(app, 4)
    grid.client_app = timed
    SecAggCheckInFedAvg(privacy=privacy(), num_nodes=4).start(grid, model(), num_rounds=1)
    print(
        "   seconds by node:",
        {k: round(v, 3) for k, v in sorted(times.items())},
        "(reply_after =",
        kw.get("reply_after", 0.0),
        ")",
    )


def finding_2_rounding():
    print("2. stochastic rounding against numpy's global generator (sigma = 0, same mod seed)")
    import flwr.client.mod.secure_aggregation.secaggplus_mod  # noqa: F401

    sm = sys.modules["flwr.client.mod.secure_aggregation.secaggplus_mod"]

    seen = []
    real = sm.quantize

    def spy(params, c, t):
        q = real(params, c, t)
        seen.append(np.concatenate([a.ravel() for a in q]))
        return q

    sm.quantize = spy
    try:
        runs = []
        for global_seed in (0, 1, 0):
            seen.clear()
            app = app_with(
                mod(seed=3), shift, before_train=lambda pid, s=global_seed: np.random.seed(s)
            )
            grid = InProcessGrid(app, 4)
            SecAggCheckInFedAvg(privacy=privacy(sigma=0.0, rate=1.0), num_nodes=4).start(
                grid, model(), num_rounds=1
            )
            runs.append(np.concatenate(seen))
    finally:
        sm.quantize = real
    diff01 = float(np.mean(runs[0] != runs[1]))
    same00 = float(np.mean(runs[0] == runs[2]))
    print(
        f"   quantised integers differing between training seeds 0 and 1: {diff01:.1%}; "
        f"identical between two runs with training seed 0: {same00:.1%}"
    )


def finding_3_dropout_rule():
    print(
        "3. a server without the n - D halt (n = 10, D = 2, 3 nodes lost at the masked-vector "
        "stage)"
    )

    try:
        import shuffle_opacus.flower.secagg.workflow as wf

        cls = wf.SecAggWorkflow
    except ImportError:
        import shuffle_opacus.flower.secagg.strategy as wf

        cls = wf._Workflow
    real = cls.collect_masked_vectors_stage

    def no_halt(self, grid, context, state):
        self.min_in_sum = 0
        return real(self, grid, context, state)

    cls.collect_masked_vectors_stage = no_halt
    try:
        app = app_with(mod(), shift)
        grid = InProcessGrid(app, 10)
        ids = sorted(grid.contexts)
        lost = {ids[0], ids[5], ids[9]}

        def dropping(msg, ctx):
            if stage_of(msg) == "collect_masked_vectors" and int(ctx.node_id) in lost:
                raise ConnectionError("lost")
            return app(msg, ctx)

        grid.client_app = dropping
        strategy = SecAggCheckInFedAvg(
            privacy=privacy(sigma=0.0, rate=1.0), num_nodes=10, max_dropouts=2
        )
        try:
            strategy.start(grid, model(), num_rounds=1)
            error = None
        except Exception as exc:  # noqa: BLE001
            error = exc
        w = np.concatenate([a.numpy().ravel() for a in strategy._model.values()])
        print(
            f"   num-in-sum {strategy.round_metrics[1]['num-in-sum']}, model moved: "
            f"{bool(np.any(w != 0))}, error: {str(error)[:160] if error else None}"
        )
    finally:
        cls.collect_masked_vectors_stage = real


def finding_4_failure():
    print("4. a node whose training raises MemoryError (node 1002) or overruns (node 1003)")
    recorded = {}

    def spy_mod(msg, ctx, call_next):
        def step(inner, c):
            reply = call_next(inner, c)
            from flwr.common import parameters_to_ndarrays
            from flwr.compat.common import recorddict_compat as compat

            fitres = compat.recorddict_to_fitres(reply.content, keep_input=True)
            recorded[int(c.node_id)] = parameters_to_ndarrays(fitres.parameters)
            return reply

        return secaggplus_mod(msg, ctx, step)

    def update(pid, got):
        if pid == 1:
            raise MemoryError("out of memory on a large batch")
        if pid == 2:
            time.sleep(0.5)
        return shift(pid, got)

    kw = {"reply_after": 0.2} if NEW else {}
    app = app_with(mod(secure_aggregation_mod=spy_mod, **kw), update)
    times = {}

    def timed(msg, ctx):
        t0 = time.monotonic()
        stage = stage_of(msg)
        out = app(msg, ctx)
        if stage == "collect_masked_vectors":
            times[int(ctx.node_id)] = round(time.monotonic() - t0, 3)
        return out

    grid = InProcessGrid(app, 4)
    grid.client_app = timed
    strategy = SecAggCheckInFedAvg(privacy=privacy(sigma=0.0, rate=1.0), num_nodes=4)
    strategy.start(grid, model(), num_rounds=1)
    zero = {k: bool(all(np.all(a == 0) for a in v[:-1])) for k, v in sorted(recorded.items())}
    print(
        f"   num-in-sum {strategy.round_metrics[1]['num-in-sum']}; zero update by node {zero}; "
        f"seconds {times}"
    )


def finding_5_integrity():
    print("5. one node of 6 (sigma 1, C 0.5, rate 0.5, seeded coins), 2 rounds")
    s, w, e = run_secagg()
    report("honest", s, w, e)

    def zero_count(reply, c):
        from flwr.common import ndarrays_to_parameters, parameters_to_ndarrays
        from flwr.compat.common import recorddict_compat as compat

        fitres = compat.recorddict_to_fitres(reply.content, keep_input=True)
        arrays = parameters_to_ndarrays(fitres.parameters)
        st = c.state.config_records["secaggplus_state"]
        cr = float(st["clipping_range"])
        arrays = [np.full(a.shape, cr) for a in arrays[:-1]] + [np.zeros(1)]
        fitres.parameters = ndarrays_to_parameters(arrays)
        return Message(compat.fitres_to_recorddict(fitres, keep_input=False), reply_to=reply)

    s, w, e = run_secagg(tampering_secagg(edit_step=zero_count))
    report("count 0, +c on every coordinate", s, w, e)

    def big_shift(arrays, ctx):
        st = ctx.state.config_records["secaggplus_state"]
        t, mod_range = int(st["target_range"]), int(st["mod_range"])
        out = [arrays[0]] + [(a + 8 * t) % mod_range for a in arrays[1:-1]] + [arrays[-1]]
        return out

    s, w, e = run_secagg(tampering_secagg(edit_masked=big_shift))
    report("masked vector + 8T after quantising", s, w, e)

    def fake_count(arrays, ctx):
        st = ctx.state.config_records["secaggplus_state"]
        t, mod_range = int(st["target_range"]), int(st["mod_range"])
        return arrays[:-1] + [(arrays[-1] + 3 * (t // 2)) % mod_range]

    s, w, e = run_secagg(tampering_secagg(edit_masked=fake_count))
    report("count + 3 after quantising", s, w, e)


def finding_6_shape():
    print("6. a masked vector with one coordinate too many")

    def extra(arrays, ctx):
        return arrays[:1] + [np.append(arrays[1].ravel(), 0)] + arrays[2:]

    s, w, e = run_secagg(tampering_secagg(edit_masked=extra), rounds=1)
    if e is not None:
        tb = "".join(traceback.format_exception(e))
        print(
            f"   {type(e).__name__}: {str(e).splitlines()[0][:150]!r}; message lines "
            f"{len(str(e).splitlines())}, traceback lines {len(tb.splitlines())}"
        )
    print(
        f"   rounds accounted {s.rounds_accounted}, round metrics {sorted(s.round_metrics)}, "
        f"stop reason {s.stop_reason!r:.120}"
    )


def finding_7_drift():
    print(
        "7. trusted server: node 0 of 4 reports at 0.999 x the bound along one direction, 20 rounds"
    )
    cfg = privacy(sigma=1.0, rate=1.0, clip=0.5)
    probe = ShuffleCheckInFedAvg(privacy=cfg, num_nodes=4)
    bound = probe.report_bound(10)
    u = np.ones(10) / math.sqrt(10)
    honest_app = app_with(LocalShuffleDPMod(min_noise_multiplier=0.0, noise_seed=1), shift)
    bad = ClientApp()

    @bad.train()
    def train(msg, context):
        if msg.content.config_records.get("config", {}).get("shuffle-dp.handshake"):
            return Message(RecordDict({"metrics": MetricRecord(cfg.reply_metrics())}), reply_to=msg)
        got = {k: v.numpy().astype(np.float64) for k, v in msg.content["arrays"].items()}
        flat = 0.999 * bound * u
        out, i = {}, 0
        for k, v in got.items():
            out[k] = Array((v + flat[i : i + v.size].reshape(v.shape)).astype(np.float32))
            i += v.size
        return Message(
            RecordDict({"arrays": ArrayRecord(out), "metrics": MetricRecord(cfg.reply_metrics())}),
            reply_to=msg,
        )

    for name, app in (
        ("honest", honest_app),
        ("one steering node", Mixed(honest_app, bad, {1001})),
    ):
        grid = InProcessGrid(honest_app, 4)
        grid.client_app = app
        st = ShuffleCheckInFedAvg(privacy=cfg, num_nodes=4, seed=0)
        res = st.start(grid, model(), num_rounds=20)
        w = np.concatenate([a.numpy().astype(np.float64).ravel() for a in res.arrays.values()])
        rej = sum(m["num-rejected"] for m in st.round_metrics.values())
        print(f"   {name:<20} projection on the direction {float(w @ u):7.2f}; rejected {rej}")


if __name__ == "__main__":
    import logging

    logging.disable(logging.WARNING)
    print("version:", "after" if NEW else "before", sf.__file__)
    which = sys.argv[1:] or ["1", "2", "3", "4", "5", "6", "7"]
    for k in which:
        globals()[
            {
                "1": "finding_1_timing",
                "2": "finding_2_rounding",
                "3": "finding_3_dropout_rule",
                "4": "finding_4_failure",
                "5": "finding_5_integrity",
                "6": "finding_6_shape",
                "7": "finding_7_drift",
            }[k]
        ]()
