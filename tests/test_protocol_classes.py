"""One class per protocol: a new sampler is one class and one record, end to end (issue 43).

The toy protocols below exist only here. Each is a sampler class, a subclass of a protocol class
that builds it, one record, and the three-line accountant class that names the record; with the
record registered, ``make_private`` trains with it and its epsilon is its mechanism's.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, fields
from pathlib import Path
from typing import ClassVar

import numpy as np
import pytest
import torch
from opacus import PrivacyEngine

import shuffle_opacus
from shuffle_opacus.accounting.protocols import (
    PROTOCOL_NAMES,
    PROTOCOLS,
    CheckIn,
    FixedSize,
    FullParticipation,
    Protocol,
    get_protocol,
    protocol_for_accountant,
    register_protocol,
    register_sampler,
    registered_protocol,
    unregister_protocol,
)
from shuffle_opacus.analysis.epsilon import compute_epsilon
from shuffle_opacus.common import secure_random
from shuffle_opacus.engine.accountants import ShuffleAccountantBase
from shuffle_opacus.engine.sampling import (
    FixedSizeShuffledSampler,
    ShuffledCheckInSampler,
    ShuffleRoundSampler,
)
from tests.opacus_helpers import N_CLIENTS, loader, model, train

PACKAGE = Path(shuffle_opacus.__file__).parent

# --- the toy protocols, defined here only --------------------------------------------------


class ChoiceSampler(ShuffleRoundSampler):
    """``m`` of ``n`` clients per round by ``Generator.choice`` (not FixedSizeShuffledSampler)."""

    protocol = "toy_fixed"
    _FIXED = (*ShuffleRoundSampler._FIXED, "m")

    def __init__(self, n, m, rounds, seed=None, *, start_round=0, secure=False):
        super().__init__(n, rounds, seed, start_round, secure)
        self.m = m

    @property
    def sample_rate(self) -> float:
        return self.m / self.n

    @property
    def sample_size(self) -> int:
        return self.m

    def _draw(self, rng):
        return rng.choice(self.n, self.m, replace=False)

    def _draw_secure(self):
        return secure_random.sample(self.n, self.m)


class CountFirstSampler(ShuffleRoundSampler):
    """Check-in drawn as a binomial count, then that many distinct clients (the same law)."""

    protocol = "toy_checkin"
    _FIXED = (*ShuffleRoundSampler._FIXED, "rate")

    def __init__(self, n, rate, rounds, seed=None, *, start_round=0, secure=False):
        super().__init__(n, rounds, seed, start_round, secure)
        self.rate = rate

    @property
    def sample_rate(self) -> float:
        return self.rate

    def _draw(self, rng):
        return rng.choice(self.n, rng.binomial(self.n, self.rate), replace=False)

    def _draw_secure(self):
        raise NotImplementedError


@dataclass(frozen=True)
class ToyFixedSize(FixedSize):
    def make_sampler(self, n, *, rate, sample_size, rounds, seed, start_round, secure=False):
        return ChoiceSampler(n, sample_size, rounds, seed, start_round=start_round, secure=secure)


@dataclass(frozen=True)
class ToyCheckIn(CheckIn):
    def make_sampler(self, n, *, rate, sample_size, rounds, seed, start_round, secure=False):
        return CountFirstSampler(n, rate, rounds, seed, start_round=start_round, secure=secure)


TOY_FIXED = ToyFixedSize(
    name="toy_fixed",
    accountant="toy_fixed_shuffle",
    mechanism="subsampled",
    summary="m of the n clients by Generator.choice",
    sampler="ChoiceSampler",
)
TOY_CHECKIN = ToyCheckIn(
    name="toy_checkin",
    accountant="toy_checkin_shuffle",
    mechanism="checkin",
    summary="a binomial number of clients, then which",
    sampler="CountFirstSampler",
)


class ToyFixedAccountant(ShuffleAccountantBase):
    name: ClassVar[str] = "toy_fixed_shuffle"


class ToyCheckInAccountant(ShuffleAccountantBase):
    name: ClassVar[str] = "toy_checkin_shuffle"


TOYS = {
    "fixed": (TOY_FIXED, ToyFixedAccountant, ChoiceSampler, {"sample_size": 16}, {"m": 16}),
    "checkin": (TOY_CHECKIN, ToyCheckInAccountant, CountFirstSampler, {"rate": 0.5}, {"rate": 0.5}),
}


def _private(accountant, *, rounds=3, **sampling):
    engine = PrivacyEngine(accountant="shuffle")
    engine.accountant = accountant  # Opacus's registry is not needed for a test's class
    net = model()
    return engine, *shuffle_opacus.make_private(
        engine,
        module=net,
        optimizer=torch.optim.SGD(net.parameters(), lr=0.1),
        data_loader=loader(),
        noise_multiplier=2.0,
        max_grad_norm=1.0,
        rounds=rounds,
        seed=3,
        **sampling,
    )


@pytest.mark.parametrize("toy", sorted(TOYS))
def test_a_new_sampler_is_one_class_and_one_record(toy):
    record, accountant_class, sampler_class, sampling, core_args = TOYS[toy]
    with registered_protocol(record):
        assert get_protocol(record.name) is record
        assert protocol_for_accountant(record.accountant) is record
        engine, module, optimizer, data = _private(accountant_class(), **sampling)
        assert type(data.batch_sampler) is sampler_class
        sizes, eps = train(module, optimizer, data, engine)
    assert record.name not in PROTOCOLS
    with pytest.raises(ValueError, match="accountant must be one of"):
        protocol_for_accountant(record.accountant)
    assert len(sizes) == 3 and len(engine.accountant) == 3
    if record.fixed_size:
        assert sizes == [16, 16, 16]
    core = compute_epsilon(
        record.mechanism, n=N_CLIENTS, sigma=1.0, steps=3, delta=1e-5, **core_args
    )
    assert eps[-1] == pytest.approx(core.epsilon, rel=1e-12)


def test_the_toy_fixed_size_run_matches_the_built_in_accounting():
    with registered_protocol(TOY_FIXED):
        toy, *_ = _private(ToyFixedAccountant(), sample_size=16)
    built_in = PrivacyEngine(accountant="subsampled_shuffle")
    net = model()
    shuffle_opacus.make_private(
        built_in, module=net, optimizer=torch.optim.SGD(net.parameters(), lr=0.1),
        data_loader=loader(), noise_multiplier=2.0, max_grad_norm=1.0, rounds=3, seed=3,
        sample_size=16,
    )  # fmt: skip
    assert toy.accountant.sample_size == built_in.accountant.sample_size == 16
    assert toy.accountant.population == built_in.accountant.population == N_CLIENTS


def test_registration_refuses_taken_names_and_built_ins():
    with pytest.raises(ValueError, match="protocol name and accountant must be new"):
        register_protocol(get_protocol("checkin"))
    clash = ToyCheckIn(
        name="other", accountant="shuffle", mechanism="checkin", summary="", sampler=""
    )
    with pytest.raises(ValueError, match="protocol name and accountant must be new"):
        register_protocol(clash)
    with pytest.raises(ValueError, match="name must be a protocol added with register_protocol"):
        unregister_protocol("full")
    with pytest.raises(ValueError, match="protocol must be a Protocol record"):
        register_protocol("checkin")  # type: ignore[arg-type]
    unknown = ToyCheckIn(name="x", accountant="x", mechanism="nope", summary="", sampler="")
    with pytest.raises(ValueError, match="mechanism"):
        register_protocol(unknown)
    assert "x" not in PROTOCOLS and "other" not in PROTOCOLS


def test_the_context_manager_removes_the_record_after_an_error():
    with pytest.raises(RuntimeError, match="inside"), registered_protocol(TOY_CHECKIN):
        raise RuntimeError("inside")
    assert TOY_CHECKIN.name not in PROTOCOLS
    register_protocol(TOY_CHECKIN)
    assert unregister_protocol(TOY_CHECKIN.name) is TOY_CHECKIN


# --- the built-in classes ----------------------------------------------------------------------


def test_each_built_in_protocol_is_an_instance_of_its_class():
    assert type(PROTOCOLS["full"]) is FullParticipation
    assert type(PROTOCOLS["subsampled"]) is FixedSize
    assert type(PROTOCOLS["checkin"]) is CheckIn
    table = {name: (p.option, p.flag, p.fixed_size) for name, p in PROTOCOLS.items()}
    assert table == {
        "full": (None, None, True),
        "subsampled": ("sample_size", "--m", True),
        "checkin": ("rate", "--rate", False),
    }
    # The deprecated string still reads as before, for one release, with a warning naming option.
    with pytest.warns(DeprecationWarning, match="Protocol.option"):
        old = [PROTOCOLS[k].parameter for k in PROTOCOL_NAMES]
    assert old == [None, "sample_size", "rate"]
    with pytest.raises(TypeError, match="abstract"):
        Protocol(name="p", accountant="a", mechanism="checkin", summary="", sampler="")  # type: ignore[abstract]


@pytest.mark.parametrize(
    ("name", "kwargs", "size"),
    [("full", {}, 10), ("subsampled", {"sample_size": 4}, 4), ("checkin", {"rate": 0.5}, None)],
)
def test_each_protocol_builds_its_sampler_and_says_its_round_size(name, kwargs, size):
    spec = get_protocol(name)
    sampler = spec.make_sampler(
        10, rate=kwargs.get("rate"), sample_size=kwargs.get("sample_size"), rounds=2, seed=0,
        start_round=0,
    )  # fmt: skip
    assert sampler.protocol == name and sampler.sample_size == size
    assert spec.reports_per_round(population=10, sample_size=kwargs.get("sample_size")) == size
    assert spec.recorded_sample_size(kwargs.get("sample_size")) == kwargs.get("sample_size")


def test_sampling_messages_name_the_accountant_that_fits():
    with pytest.raises(ValueError, match="use subsampled_shuffle for fewer clients per round"):
        get_protocol("full").check_sampling(population=10, accountant="shuffle", rate=None,
                                            sample_size=4)  # fmt: skip
    with pytest.raises(ValueError, match=r"in \[1, 9\] for subsampled_shuffle; .* use the shuffle"):
        get_protocol("subsampled").check_sampling(
            population=10, accountant="subsampled_shuffle", rate=None, sample_size=10
        )
    assert (
        get_protocol("checkin").check_sampling(
            population=10, accountant="shuffled_checkin", rate=0.25, sample_size=None
        )
        == 0.25
    )


# --- samplers: their size, their empty rounds --------------------------------------------------


def test_samplers_expose_their_sample_size():
    assert ShuffledCheckInSampler(10, 0.3, 2, seed=0).sample_size is None
    assert FixedSizeShuffledSampler(10, 4, 2, seed=0).sample_size == 4
    full = FixedSizeShuffledSampler(10, 10, 2, seed=0)
    assert full.sample_size == 10 and full.protocol == "full"
    with pytest.raises(AttributeError):
        full.sample_size = 3  # type: ignore[misc]


def test_empty_round_probability():
    checkin = ShuffledCheckInSampler(3, 0.5, 2, seed=0)
    assert checkin.empty_round_probability(2) == pytest.approx(1 - (1 - 0.125) ** 2, rel=1e-15)
    assert checkin.empty_round_probability(0) == 0.0
    assert ShuffledCheckInSampler(3, 1.0, 2, seed=0).empty_round_probability(5) == 0.0
    assert ShuffledCheckInSampler(1, 1e-300, 2, seed=0).empty_round_probability(2) == 1.0
    assert FixedSizeShuffledSampler(10, 1, 2, seed=0).empty_round_probability(100) == 0.0
    # A sampler whose size varies and that says nothing more is assumed the worst.
    assert CountFirstSampler(5, 0.9, 2, seed=0).empty_round_probability(1) == 1.0
    with pytest.raises(ValueError, match="rounds must be an integer"):
        checkin.empty_round_probability(-1)
    # Monte Carlo of the formula at a rate where empty rounds are common.
    sampler = ShuffledCheckInSampler(4, 0.3, 1, seed=1)
    empty = np.mean([len(sampler.batch(t)) == 0 for t in range(5000)])
    assert empty == pytest.approx(0.7**4, abs=4 * math.sqrt(0.24 * 0.76 / 5000))


def test_expanded_weights_runs_a_check_in_with_rate_one():
    # The old formula took log1p(-1) for rate 1 and failed with a math domain error.
    engine = PrivacyEngine(accountant="shuffled_checkin")
    net = model()
    module, optimizer, data = shuffle_opacus.make_private(
        engine, module=net, optimizer=torch.optim.SGD(net.parameters(), lr=0.1),
        data_loader=loader(), noise_multiplier=2.0, max_grad_norm=1.0, rounds=2, seed=0,
        rate=1.0, grad_sample_mode="ew",
    )  # fmt: skip
    assert train(module, optimizer, data)[0] == [N_CLIENTS, N_CLIENTS]


# --- no branching on the protocol outside its own modules --------------------------------------

# Only the deprecated property itself names Protocol.parameter.
_PARAMETER_PENDING = {"accounting/protocols.py"}


def _sources():
    for path in sorted(PACKAGE.rglob("*.py")):
        yield path.relative_to(PACKAGE).as_posix(), path.read_text()


def test_no_sampler_class_checks_outside_sampling():
    pattern = re.compile(r"isinstance\([^)]*(CheckIn|FixedSize)\w*Sampler")
    found = [
        name for name, text in _sources() if name != "engine/sampling.py" and pattern.search(text)
    ]
    assert found == []


def test_no_protocol_parameter_reads_outside_protocols():
    pattern = re.compile(r"\.parameter\b")
    found = [name for name, text in _sources() if pattern.search(text)]
    assert sorted(set(found) - _PARAMETER_PENDING) == []


# --- the samplers are the training layer's: registered, never imported from below --------------


def test_the_accounting_layer_builds_no_sampler_before_the_engine_registers_one():
    # In a fresh interpreter: the protocol table alone imports no torch, and asks for the engine.
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from shuffle_opacus.accounting.protocols import get_protocol\n"
        "spec = get_protocol('checkin')\n"
        "kw = dict(rate=0.5, sample_size=None, rounds=2, seed=0, start_round=0)\n"
        "try:\n"
        "    spec.make_sampler(10, **kw)\n"
        "except LookupError as error:\n"
        "    print('refused:', error)\n"
        "print('torch' in sys.modules)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    refused, torch_loaded = proc.stdout.splitlines()
    assert "import shuffle_opacus.engine.sampling" in refused
    assert torch_loaded == "False"
    # Once the engine's sampling module is imported (here, in this process: importing it in the
    # fresh interpreter would cost it 2-3 s of torch), the same call builds the engine's sampler.
    import shuffle_opacus.engine.sampling

    kw = {"rate": 0.5, "sample_size": None, "rounds": 2, "seed": 0, "start_round": 0}
    built = get_protocol("checkin").make_sampler(10, **kw)
    assert type(built) is shuffle_opacus.engine.sampling.ShuffledCheckInSampler


def test_a_subclass_uses_its_bases_sampler_and_register_sampler_checks_its_arguments():
    @dataclass(frozen=True)
    class Slower(CheckIn):
        pass

    spec = Slower(**{f.name: getattr(get_protocol("checkin"), f.name) for f in fields(CheckIn)})
    sampler = spec.make_sampler(
        10, rate=0.5, sample_size=None, rounds=2, seed=0, start_round=0
    )  # fmt: skip
    assert type(sampler).__name__ == "ShuffledCheckInSampler"
    with pytest.raises(TypeError, match="protocol must be a Protocol subclass"):
        register_sampler(object, lambda *a, **k: None)
    with pytest.raises(TypeError, match="builder must be callable"):
        register_sampler(Slower, "not callable")
