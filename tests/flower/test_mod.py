"""The client-side mod: clipping, noise, what leaves the node, and the noise floor."""

from __future__ import annotations

import math

import numpy as np
import pytest

pytest.importorskip("flwr")

from flwr.app import Array, ArrayRecord, Message, MetricRecord  # noqa: E402
from scipy import stats  # noqa: E402

from shuffle_opacus.flower import (  # noqa: E402
    METRIC_KEYS,
    LocalShuffleDPMod,
    ShufflePrivacyConfig,
)
from shuffle_opacus.flower.mod import REFUSED, clip_factor  # noqa: E402

from .helpers import SECRET, context, instruction, model, numpy_app, shift_update  # noqa: E402


def privacy(sigma: float = 0.0, clip: float = 1.0, **kw) -> ShufflePrivacyConfig:
    return ShufflePrivacyConfig(
        noise_multiplier=sigma, clip_norm=clip, rate=0.5, delta=1e-5, allow_noiseless=True, **kw
    )


def run(app, arrays, cfg, *, pid=0, node_config=None, message_type="train", extra=None):
    config = {**cfg.to_config(), "server-round": 1, **(extra or {})}
    msg = instruction(arrays, config, node=1001 + pid, message_type=message_type)
    return app(msg, context(pid, 4, node_config))


def report_minus_received(reply: Message, arrays: ArrayRecord) -> dict[str, np.ndarray]:
    out = reply.content["arrays"]
    return {k: out[k].numpy().astype(np.float64) - arrays[k].numpy() for k in arrays}


def flat(d: dict[str, np.ndarray]) -> np.ndarray:
    return np.concatenate([v.ravel() for v in d.values()])


@pytest.mark.parametrize("scale", [1e-3, 0.05, 1.0, 37.0, 1e6])
@pytest.mark.parametrize("clip", [0.01, 1.0, 5.0])
def test_clip_bound_holds_and_keeps_direction(scale, clip):
    arrays = model(shapes=((3, 4), (5,), (2, 2, 2)))
    app = numpy_app(shift_update(scale))
    reply = run(app, arrays, privacy(0.0, clip), pid=2)
    got = flat(report_minus_received(reply, arrays))
    raw = flat(shift_update(scale)(2, {k: v.numpy() for k, v in arrays.items()}))
    norm = np.linalg.norm(raw)
    # The report (float32 weights) is within rounding of the clipped update.
    assert np.linalg.norm(got) <= clip * (1 + 1e-6)
    expected = raw * min(1.0, clip / norm)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-7 * clip)


def test_clip_factor_exact():
    assert clip_factor(0.0, 1.0) == 1.0
    assert clip_factor(1.0, 1.0) == 1.0
    assert clip_factor(4.0, 1.0) == 0.25
    for norm in np.geomspace(1e-3, 1e9, 200):
        assert norm * clip_factor(norm, 0.7) <= 0.7 * (1 + 2**-52)


def test_non_finite_update_is_replaced_by_zero():
    def bad(pid, received):
        return {k: np.full_like(v, np.nan) for k, v in received.items()}

    arrays = model()
    reply = run(numpy_app(bad), arrays, privacy(0.0))
    assert np.all(flat(report_minus_received(reply, arrays)) == 0.0)


def test_noise_has_the_right_covariance():
    """Noise of reports with a zero update: mean 0, covariance (σC)² I, independent reports.

    The mod draws from the operating system's entropy (the production path). N = 400 reports
    of d = 6 coordinates plus one report of 200,000 coordinates. Tests, each at false-positive
    rate 1e-6 or below (so about 5e-6 for the whole test):
    * the large report's sum of squares / (σC)² against chi-square(200,000), two-sided;
    * its mean against N(0, (σC)²/200,000), |z| < 5.3;
    * the 6 x 6 sample covariance of the 400 reports: each diagonal / (σC)² times N against
      chi-square(N), two-sided at 1e-6 / 6; each off-diagonal correlation times sqrt(N)
      against N(0, 1), |z| < 5.9 (1e-6 / 15 Bonferroni per pair, rounded up).
    A wrong scale (σ instead of σC, or σC·sqrt(2)) or noise shared between reports fails.
    """
    sigma, clip = 1.7, 0.3
    std = sigma * clip
    app = numpy_app(lambda pid, r: r)
    big = ArrayRecord({"w": Array(np.zeros(200_000, dtype=np.float64))})
    noise = flat(report_minus_received(run(app, big, privacy(sigma, clip)), big))
    k = noise.size
    q = np.sum(noise**2) / std**2
    assert stats.chi2.ppf(0.5e-6, k) < q < stats.chi2.ppf(1 - 0.5e-6, k)
    assert abs(noise.mean() / (std / math.sqrt(k))) < 5.3

    small = ArrayRecord({"a": Array(np.zeros((2, 3), dtype=np.float64))})
    n = 400
    samples = np.stack(
        [
            flat(report_minus_received(run(app, small, privacy(sigma, clip), pid=i % 4), small))
            for i in range(n)
        ]
    )
    cov = samples.T @ samples / n  # known mean 0
    lo, hi = stats.chi2.ppf(1e-6 / 12, n), stats.chi2.ppf(1 - 1e-6 / 12, n)
    for i in range(6):
        assert lo < cov[i, i] * n / std**2 < hi
        for j in range(i + 1, 6):
            corr = cov[i, j] / math.sqrt(cov[i, i] * cov[j, j])
            assert abs(corr * math.sqrt(n)) < 5.9


def test_seeded_noise_is_reproducible_and_differs_between_nodes():
    arrays = ArrayRecord({"w": Array(np.zeros(50, dtype=np.float64))})
    mod = LocalShuffleDPMod(min_noise_multiplier=0.0, noise_seed=3)
    app = numpy_app(lambda pid, r: r, mod=mod)
    a = flat(report_minus_received(run(app, arrays, privacy(1.0)), arrays))
    b = flat(report_minus_received(run(app, arrays, privacy(1.0)), arrays))
    c = flat(report_minus_received(run(app, arrays, privacy(1.0), pid=1), arrays))
    np.testing.assert_array_equal(a, b)
    assert not np.allclose(a, c)


def test_metrics_are_stripped():
    """Only the array and the protocol's metrics leave the node, whatever the code adds."""

    def inner_mod(msg, ctx, call_next):
        reply = call_next(msg, ctx)
        reply.content["extra"] = MetricRecord({"leak": 1.0})
        return reply

    cfg = privacy(0.5)
    app = numpy_app(shift_update(), extra_mods=[inner_mod])
    reply = run(app, model(), cfg, pid=1)
    content = reply.content
    assert set(content.keys()) == {"arrays", "metrics"}
    assert len(content.config_records) == 0
    assert dict(content["metrics"]) == cfg.reply_metrics()
    assert set(content["metrics"]) == set(METRIC_KEYS)
    assert SECRET not in repr(content)
    # The reply goes to the server and answers the instruction.
    assert reply.metadata.dst_node_id == 1 and reply.metadata.reply_to_message_id == "m-1"


def test_without_the_mod_the_leak_is_there():
    """The test above can fail: the same app without the mod releases its metrics."""
    reply = run(numpy_app(shift_update(), with_mod=False), model(), privacy(0.5))
    assert "private" in reply.content.keys()
    assert reply.content["metrics"]["num-examples"] == 600


def refused(reply: Message) -> str:
    assert reply.has_error(), reply
    assert reply.error.code == REFUSED
    return reply.error.reason


def recording_update():
    """A training step that returns the weights it received and records the node that ran it."""
    calls: list[int] = []

    def update(pid, received):
        calls.append(pid)
        return received

    return calls, update


def test_floor_refuses_less_noise_and_does_not_train():
    calls, update = recording_update()
    app = numpy_app(update, min_noise_multiplier=0.8)
    reason = refused(run(app, model(), privacy(0.79)))
    assert "below this node's floor 0.8" in reason
    assert calls == []
    assert not run(app, model(), privacy(0.8)).has_error()
    # A SuperNode can raise the floor with its node config, not lower it.
    assert "floor 1.5" in refused(
        run(app, model(), privacy(1.2), node_config={"min-noise-multiplier": 1.5})
    )
    assert not run(
        app, model(), privacy(0.9), node_config={"min-noise-multiplier": 0.1}
    ).has_error()
    assert "min-noise-multiplier" in refused(
        run(app, model(), privacy(0.9), node_config={"min-noise-multiplier": -1})
    )
    assert calls == [0, 0]


def test_noiseless_instructions_refused_by_default():
    """A floor of 0 does not let a server switch the noise off: σ = 0 needs allow_noiseless."""
    calls, update = recording_update()
    app = numpy_app(update, mod=LocalShuffleDPMod(min_noise_multiplier=0.0))
    assert "noise_multiplier must be a finite number > 0" in refused(
        run(app, model(), privacy(0.0))
    )
    assert calls == []
    assert not run(app, model(), privacy(0.1)).has_error()


def test_handshake_echoes_without_training():
    """The start-up check: the echo (or a refusal) only; the training code never runs."""
    calls, update = recording_update()
    app = numpy_app(update, min_noise_multiplier=0.8)
    cfg = privacy(1.0)
    reply = run(app, model(), cfg, extra={"shuffle-dp.handshake": True})
    assert set(reply.content.keys()) == {"metrics"}
    assert dict(reply.content["metrics"]) == cfg.reply_metrics()
    assert "floor 0.8" in refused(
        run(app, model(), privacy(0.5), extra={"shuffle-dp.handshake": True})
    )
    assert calls == []


def test_sensitivity_convention_must_agree():
    app = numpy_app(shift_update(), min_noise_multiplier=0.0)
    assert "sensitivity 1.0" in refused(run(app, model(), privacy(1.0, sensitivity="paper")))
    paper = numpy_app(
        shift_update(), mod=LocalShuffleDPMod(min_noise_multiplier=0.0, sensitivity="paper")
    )
    assert not run(paper, model(), privacy(1.0, sensitivity="paper")).has_error()


def test_instruction_without_parameters_is_refused():
    app = numpy_app(shift_update())
    msg = instruction(model(), {"server-round": 1})
    assert "shuffle-model parameters" in refused(app(msg, context()))


def test_evaluate_and_query_are_refused_unless_allowed():
    cfg = privacy(1.0)
    app = numpy_app(shift_update())
    assert "only training" in refused(run(app, model(), cfg, message_type="evaluate"))
    assert "only training" in refused(run(app, model(), cfg, message_type="query"))
    allowed = numpy_app(
        shift_update(), mod=LocalShuffleDPMod(min_noise_multiplier=0.0, allow_evaluate=True)
    )
    reply = run(allowed, model(), cfg, message_type="evaluate")
    assert reply.content["metrics"]["accuracy"] == 0.9
    assert refused(run(allowed, model(), cfg, message_type="query"))


def test_training_errors_are_withheld():
    def boom(pid, received):
        raise RuntimeError(SECRET)

    reason = refused(run(numpy_app(boom), model(), privacy(1.0)))
    assert SECRET not in reason and "withheld" in reason


@pytest.mark.parametrize(
    ("update", "text"),
    [
        (lambda pid, r: {"a": r["a"]}, "same arrays"),
        (lambda pid, r: {"a": r["a"], "b": np.zeros(5, np.float32)}, "shape"),
    ],
)
def test_reply_must_match_the_model(update, text):
    assert text in refused(run(numpy_app(update), model(), privacy(1.0)))


def test_integer_arrays_are_refused():
    arrays = ArrayRecord({"n": Array(np.zeros(3, dtype=np.int64))})
    assert "floating-point" in refused(run(numpy_app(shift_update()), arrays, privacy(1.0)))


@pytest.mark.parametrize(
    ("kwargs", "text"),
    [
        ({"min_noise_multiplier": -0.1}, "min_noise_multiplier must be a finite number >= 0"),
        ({"min_noise_multiplier": float("nan")}, "min_noise_multiplier"),
        ({"min_noise_multiplier": 0.0, "sensitivity": "central"}, "sensitivity must be one of"),
        ({"min_noise_multiplier": 0.0, "noise_seed": -1}, "noise_seed must be an integer"),
        ({"min_noise_multiplier": 0.0, "allow_evaluate": 1}, "allow_evaluate must be True"),
        ({"min_noise_multiplier": 0.0, "allow_noiseless": 0}, "allow_noiseless must be True"),
    ],
)
def test_bad_arguments(kwargs, text):
    with pytest.raises(ValueError, match=text) as info:
        LocalShuffleDPMod(**kwargs)
    assert "\n" not in str(info.value)
