"""The protocol table, the one path from a history to epsilon, and the reference curves."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
from opacus.accountants.analysis.rdp import compute_rdp, get_privacy_spent

from shuffle_opacus import PROTOCOLS, analysis_sigma, get_protocol, history_epsilon
from shuffle_opacus.accounting.protocols import protocol_for_accountant
from shuffle_opacus.analysis import MECHANISM_TABLE, get_mechanism
from shuffle_opacus.analysis.epsilon import compute_epsilon
from shuffle_opacus.engine.accountants import ACCOUNTANTS


def test_every_protocol_has_its_accountant_and_mechanism():
    assert {p.accountant for p in PROTOCOLS.values()} == set(ACCOUNTANTS)
    for name, cls in ACCOUNTANTS.items():
        assert cls.spec() is protocol_for_accountant(name)
        assert cls.protocol() == cls.spec().name
    for protocol in PROTOCOLS.values():
        assert protocol.mechanism in MECHANISM_TABLE
        assert protocol.methods == MECHANISM_TABLE[protocol.mechanism].method_names
        assert set(protocol.references) == {"no-shuffle", "central"}


def test_lookups_refuse_unknown_names():
    with pytest.raises(ValueError, match="protocol must be one of full, subsampled, checkin"):
        get_protocol("poisson")
    with pytest.raises(ValueError, match="accountant must be one of"):
        protocol_for_accountant("rdp")
    with pytest.raises(ValueError, match="reference must be one of no-shuffle, central"):
        get_mechanism("checkin").reference("clones")
    with pytest.raises(ValueError, match="method must be one of pld, proven, exact, sum, theorem3"):
        get_protocol("checkin").check_method("theorem1")


@pytest.mark.parametrize(
    ("protocol", "kwargs", "expected"),
    [
        ("full", {}, 1.0),
        ("subsampled", {"sample_size": 25}, 0.25),
        ("checkin", {"rate": 0.3}, 0.3),
    ],
)
def test_sample_rate_and_round_setting(protocol, kwargs, expected):
    spec = get_protocol(protocol)
    assert spec.sample_rate(population=100, **kwargs) == expected
    setting = spec.round_setting(population=100, sigma=2.0, sample_rate=expected)
    assert setting.n == 100 and setting.sigma == 2.0
    assert setting.m == kwargs.get("sample_size") and setting.rate == kwargs.get("rate")


def test_analysis_sigma_divides_by_the_sensitivity():
    assert analysis_sigma(5.0, "paper") == 5.0
    assert analysis_sigma(5.0, "replace-one") == 2.5
    assert analysis_sigma(3.0, 1.5) == 2.0
    with pytest.raises(ValueError, match="noise_multiplier must be a finite number > 0"):
        analysis_sigma(0.0, "paper")


@pytest.mark.parametrize("protocol", sorted(PROTOCOLS))
def test_history_epsilon_is_the_core_computation(protocol):
    spec = get_protocol(protocol)
    extra = {"full": {}, "subsampled": {"m": 50}, "checkin": {"rate": 0.05}}[protocol]
    rate = {"full": 1.0, "subsampled": 0.05, "checkin": 0.05}[protocol]
    for method in spec.methods:
        core = compute_epsilon(
            spec.mechanism, n=1000, sigma=1.5, steps=40, delta=1e-5, method=method, **extra
        )
        got = history_epsilon(
            [(3.0, rate, 15), (3.0, rate, 25)],
            protocol=protocol,
            delta=1e-5,
            population=1000,
            method=method,
        )
        assert got.epsilon == pytest.approx(core.epsilon, rel=1e-12), method


# --- reference curves against independent implementations ----------------------------------


@pytest.mark.parametrize(("rate", "local", "sens"), [(0.1, 5.0, 1.0), (0.01, 2.0, 2.0)])
def test_checkin_references_match_opacus_rdp_accountant(rate, local, sens):
    n = 60000
    sigma = analysis_sigma(local, sens)
    setting = get_mechanism("checkin").setting(sigma=sigma, n=n, rate=rate)
    orders = np.array([2, 3, 5, 10, 33, 100, 300, 1000])  # Opacus overflows beyond
    # No shuffling: Poisson-subsampled Gaussian with the local sigma / sensitivity.
    no_shuffle = get_mechanism("checkin").reference("no-shuffle")(setting)
    ns = compute_rdp(q=rate, noise_multiplier=sigma, steps=1, orders=orders.tolist())
    np.testing.assert_allclose(no_shuffle(orders), ns, rtol=1e-6)
    # Central: the same total noise on the sum, sigma * sqrt(rate * n).
    sigma_c = sigma * math.sqrt(rate * n)
    central = get_mechanism("checkin").reference("central")(setting)
    c = compute_rdp(q=rate, noise_multiplier=sigma_c, steps=1, orders=orders.tolist())
    np.testing.assert_allclose(central(orders), c, rtol=1e-6)
    # Epsilon: Opacus converts with the same Lemma 2 but over fewer orders, so ours is at most
    # theirs, and equal when their optimum is interior.
    grid = list(range(2, 257))
    for name, s in (("no-shuffle", sigma), ("central", sigma_c)):
        # compute_rdp returns its one-step curve times steps: computed once, scaled per count
        # (the same floats; each call costs Opacus 0.2-0.3 s over 255 orders).
        one_step = compute_rdp(q=rate, noise_multiplier=s, steps=1, orders=grid)
        for steps in (1, 100, 3000):
            rdp = one_step * steps
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)  # optimum at the largest order
                theirs, best = get_privacy_spent(orders=grid, rdp=rdp, delta=1e-5)
                ours = history_epsilon(
                    [(local, rate, steps)], protocol="checkin", delta=1e-5, population=n,
                    sensitivity=sens, reference=name,
                ).epsilon  # fmt: skip
            assert ours <= theirs * (1 + 1e-9)
            if best < grid[-1]:
                assert ours == pytest.approx(theirs, rel=1e-6)


def test_full_protocol_references_have_closed_forms():
    orders = np.arange(2, 20)
    mech = get_mechanism("shuffle")
    ns = mech.reference("no-shuffle")(mech.setting(sigma=analysis_sigma(3.0, "paper"), n=100))
    np.testing.assert_allclose(ns(orders), orders / (2 * 9.0))
    c = mech.reference("central")(mech.setting(sigma=analysis_sigma(3.0, 2.0), n=100))
    np.testing.assert_allclose(c(orders), orders / (2 * (1.5 * 10.0) ** 2))


def test_subsampled_references_are_the_wang_bound_of_the_gaussian():
    from shuffle_opacus.analysis.rdp.subsampling import (
        subsampled_gaussian_rdp,
        subsampled_shuffle_rdp,
    )

    orders = np.arange(2, 40)
    mech = get_mechanism("subsampled")
    setting = mech.setting(sigma=2.0, n=1000, m=10)
    ns = mech.reference("no-shuffle")(setting)(orders)
    np.testing.assert_allclose(ns, subsampled_gaussian_rdp(rate=0.01, sigma=2.0, orders=orders))
    # Theorem 2 with one user per round is the Wang bound of the Gaussian itself, and more users
    # shuffled together can only help.
    one = subsampled_shuffle_rdp(n=1000, m=1, sigma=2.0, orders=orders)
    np.testing.assert_allclose(
        one, subsampled_gaussian_rdp(rate=0.001, sigma=2.0, orders=orders), rtol=1e-12
    )
    assert np.all(subsampled_shuffle_rdp(n=1000, m=10, sigma=2.0, orders=orders) <= ns + 1e-15)
    c = mech.reference("central")(setting)(orders)
    np.testing.assert_allclose(
        c, subsampled_gaussian_rdp(rate=0.01, sigma=2.0 * math.sqrt(10), orders=orders)
    )
