"""Check-in coins and the shuffler."""

from __future__ import annotations

import itertools
import random
from collections import Counter

import numpy as np
import pytest

pytest.importorskip("flwr")

from flwr.app import DEFAULT_TTL, ArrayRecord, Error, Message  # noqa: E402
from scipy import stats  # noqa: E402

from shuffle_opacus.flower import (  # noqa: E402
    InProcessGrid,
    ShuffleCheckInFedAvg,
    ShufflePrivacyConfig,
    check_in,
    make_rng,
    shuffle_replies,
)

from .helpers import coordinate_update, instruction, model, numpy_app, shift_update  # noqa: E402


def binomial_gof_pvalue(sizes: list[int], n: int, rate: float) -> float:
    """Chi-square goodness of fit of observed sizes to Binomial(n, rate), bins of mass >= 5."""
    counts = np.bincount(sizes, minlength=n + 1).astype(float)
    expected = stats.binom.pmf(np.arange(n + 1), n, rate) * len(sizes)
    obs_bins, exp_bins, acc_o, acc_e = [], [], 0.0, 0.0
    for o, e in zip(counts, expected, strict=True):
        acc_o, acc_e = acc_o + o, acc_e + e
        if acc_e >= 5:
            obs_bins.append(acc_o)
            exp_bins.append(acc_e)
            acc_o, acc_e = 0.0, 0.0
    obs_bins[-1] += acc_o
    exp_bins[-1] += acc_e
    return float(stats.chisquare(obs_bins, exp_bins).pvalue)


def test_make_rng_secure_by_default_and_seedable():
    assert isinstance(make_rng(), random.SystemRandom)
    a, b = make_rng(5), make_rng(5)
    assert [a.random() for _ in range(5)] == [b.random() for _ in range(5)]
    with pytest.raises(ValueError, match="seed must be an integer >= 0"):
        make_rng(-1)


def test_checkin_sizes_follow_the_binomial_secure_source():
    """4,000 check-ins of n = 40 nodes at rate 0.3 from SystemRandom.

    Chi-square goodness of fit to Binomial(40, 0.3): false-positive rate 1e-6 (p < 1e-6
    fails). A rate off by 0.02 or a fixed sample size fails with overwhelming probability.
    """
    rng = make_rng()
    sizes = [len(check_in(range(40), 0.3, rng)) for _ in range(4000)]
    assert binomial_gof_pvalue(sizes, 40, 0.3) > 1e-6
    # The oracle can fail: sizes drawn at the wrong rate are rejected.
    wrong = list(np.random.default_rng(0).binomial(40, 0.32, size=4000))
    assert binomial_gof_pvalue(wrong, 40, 0.3) < 1e-6


def test_each_node_checks_in_with_probability_rate_independently():
    """Per-node frequency over 3,000 draws, and pairwise independence of two nodes.

    Each of 10 frequencies: |z| < 5.3 (1e-7 each); the 2 x 2 table of nodes 0 and 9:
    chi-square independence test, p > 1e-6. Total false-positive rate below 2e-6.
    """
    rng = make_rng()
    draws = [set(check_in(range(10), 0.25, rng)) for _ in range(3000)]
    for node in range(10):
        freq = sum(node in d for d in draws) / 3000
        assert abs(freq - 0.25) / np.sqrt(0.25 * 0.75 / 3000) < 5.3
    table = np.zeros((2, 2))
    for d in draws:
        table[int(0 in d), int(9 in d)] += 1
    assert stats.chi2_contingency(table).pvalue > 1e-6


def test_strategy_checkin_sizes_follow_the_binomial():
    """The strategy's own rounds (configure_train, secure source): same test as above."""
    privacy = ShufflePrivacyConfig(noise_multiplier=1.0, clip_norm=1.0, rate=0.2, delta=1e-5)
    strategy = ShuffleCheckInFedAvg(privacy=privacy, num_nodes=30)
    grid = InProcessGrid(numpy_app(shift_update()), 30)
    arrays = model()
    sizes = []
    for r in range(1, 2001):
        messages = strategy.configure_train(r, arrays, strategy_config(), grid)
        sizes.append(len(messages))
        assert len({m.metadata.dst_node_id for m in messages}) == len(messages)
    assert binomial_gof_pvalue(sizes, 30, 0.2) > 1e-6
    assert strategy.rounds_accounted == 2000


def strategy_config():
    from flwr.app import ConfigRecord

    return ConfigRecord()


def test_checkin_is_reproducible_with_a_seed_and_validates():
    assert check_in([5, 1, 3], 1.0, make_rng(0)) == [1, 3, 5]
    assert check_in(range(50), 0.5, make_rng(7)) == check_in(range(50), 0.5, make_rng(7))
    with pytest.raises(ValueError, match=r"rate must be in \(0, 1\]"):
        check_in(range(3), 0.0, make_rng(0))
    with pytest.raises(ValueError, match="distinct"):
        check_in([1, 1], 0.5, make_rng(0))


def replies_from_grid(n: int = 5) -> tuple[list[Message], ArrayRecord]:
    grid = InProcessGrid(numpy_app(coordinate_update()), n)
    privacy = ShufflePrivacyConfig(
        noise_multiplier=0.0, clip_norm=1.0, rate=1.0, delta=1e-5, allow_noiseless=True
    )
    strategy = ShuffleCheckInFedAvg(privacy=privacy, num_nodes=n, seed=0)
    messages = strategy.configure_train(1, model(), strategy_config(), grid)
    return grid.send_and_receive(messages), model()


def test_shuffler_removes_identities():
    replies, _ = replies_from_grid()
    assert sorted(r.metadata.src_node_id for r in replies) == [1001, 1002, 1003, 1004, 1005]
    out = shuffle_replies(replies, make_rng())
    assert out.num_errors == 0 and len(out.reports) == 5
    seen = set()
    for report in out.reports:
        md = report.metadata
        assert md.src_node_id == 0
        assert md.message_id == "" and md.reply_to_message_id == ""
        assert md.created_at == 0.0 and md.ttl == DEFAULT_TTL
        assert md.src_task_id is None and md.dst_task_id is None
        seen.add((md.run_id, md.dst_node_id, md.group_id, md.message_type))
    assert len(seen) == 1  # identical metadata for every report
    # Same contents, as a multiset.
    before = sorted(tuple(r.content["arrays"]["a"].numpy().ravel()) for r in replies)
    after = sorted(tuple(r.content["arrays"]["a"].numpy().ravel()) for r in out.reports)
    assert before == after and len(set(before)) == 5


def test_shuffler_permutation_is_uniform():
    """3,000 shuffles of 3 replies: chi-square against the uniform law on the 6 orders.

    False-positive rate 1e-6. Returning the replies in their arrival order fails.
    """
    replies, _ = replies_from_grid(3)
    rng = make_rng()

    def order(messages):
        return tuple(int(np.argmax(m.content["arrays"]["a"].numpy())) for m in messages)

    counts = Counter(order(shuffle_replies(replies, rng).reports) for _ in range(3000))
    assert len(counts) == 6
    assert stats.chisquare(list(counts.values())).pvalue > 1e-6
    assert set(counts) == set(itertools.permutations(order(replies)))


def test_shuffler_drops_and_counts_errors():
    replies, _ = replies_from_grid(3)
    msg = instruction(model(), {})
    error = Message(Error(code=6, reason="refused"), reply_to=msg)
    out = shuffle_replies([*replies, error, error], make_rng(1))
    assert len(out.reports) == 3 and out.num_errors == 2
    assert out.error_reasons == ["refused"]
