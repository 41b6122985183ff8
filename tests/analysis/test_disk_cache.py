"""The on-disk cache of per-round PMFs (shuffle_opacus.analysis.pld.disk_cache).

What a cache must never do: hand back other bits than a fresh build, read a corrupt or half
written file as a number, crash, grow without bound, or write where it was told not to. Each
test points the cache at its own directory (tests/conftest.py already keeps the whole suite
away from the user's cache).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from scipy.special import logsumexp

from shuffle_opacus.analysis.limits import memory_limit
from shuffle_opacus.analysis.pld import disk_cache, moments, powers, rounds
from shuffle_opacus.analysis.pld.disk_cache import ENV_DIR, ENV_MAX_BYTES

SOURCES = ("analysis/pld/disk_cache.py",)
KEY = {"n": 1000, "sigma": 2.5, "rate": None, "grid": [1, 2.0, "x"]}


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """An empty cache directory of this test's own."""
    directory = tmp_path / "cache"
    monkeypatch.setenv(ENV_DIR, str(directory))
    monkeypatch.delenv(ENV_MAX_BYTES, raising=False)
    return directory


def _entries(directory: Path) -> list[Path]:
    return sorted(directory.glob(f"*{disk_cache.SUFFIX}"))


def _same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def test_the_suite_never_writes_to_the_users_cache():
    directory = disk_cache.cache_directory()
    assert directory is not None
    assert directory != Path.home() / ".cache" / "shuffle_opacus"
    assert os.environ[ENV_DIR] == str(directory)


def test_a_round_trip_gives_back_the_same_bits(cache):
    rng = np.random.default_rng(7)
    arrays = {
        "probs": rng.random(1001),
        "special": np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 5e-324, 1.7976931348623157e308]),
        "index": np.arange(-5, 6, dtype=np.int64).reshape(1, 11),
        "spectrum": rng.random(4) + 1j * rng.random(4),
        "mask": np.array([True, False, True]),
        "empty": np.zeros(0),
    }
    scalars = {"lower": -123456789012, "infinity": 1e-300, "zero": -0.0, "big": math.inf,
               "third": 1.0 / 3.0, "label": "é", "flag": False, "none": None}  # fmt: skip
    assert disk_cache.store("test-entry", 1, KEY, arrays, scalars, sources=SOURCES)
    entry = disk_cache.load("test-entry", 1, KEY, sources=SOURCES)
    assert entry is not None
    assert set(entry.arrays) == set(arrays)
    for name, array in arrays.items():
        assert _same_bits(entry.arrays[name], array), name
        assert not entry.arrays[name].flags.writeable
    assert set(entry.scalars) == set(scalars)
    for name, value in scalars.items():
        got = entry.scalars[name]
        assert type(got) is type(value)
        if isinstance(value, float):
            assert np.float64(got).tobytes() == np.float64(value).tobytes(), name
        else:
            assert got == value


def test_a_different_key_version_or_kind_misses(cache):
    disk_cache.store("test-entry", 1, KEY, {"a": np.ones(3)}, {}, sources=SOURCES)
    assert disk_cache.load("test-entry", 1, dict(KEY), sources=SOURCES) is not None
    numpy_key = {**KEY, "n": np.int64(1000), "sigma": np.float64(2.5)}  # the same values
    assert disk_cache.load("test-entry", 1, numpy_key, sources=SOURCES) is not None
    assert disk_cache.load("test-entry", 2, KEY, sources=SOURCES) is None
    assert disk_cache.load("test-other", 1, KEY, sources=SOURCES) is None
    assert (
        disk_cache.load("test-entry", 1, {**KEY, "sigma": 2.5000000000000004}, sources=SOURCES)
        is None
    )
    assert disk_cache.load("test-entry", 1, {**KEY, "rate": 0.0}, sources=SOURCES) is None
    zero = disk_cache.load("test-entry", 1, {**KEY, "n": 1000.0}, sources=SOURCES)
    assert zero is None  # 1000 and 1000.0 are different keys
    assert disk_cache.load("test-entry", 1, KEY, sources=("analysis/pld/rounds.py",)) is None


def test_an_unreadable_source_switches_the_cache_off(cache):
    missing = ("analysis/pld/no_such_module.py",)
    assert not disk_cache.store("test-entry", 1, KEY, {"a": np.ones(3)}, {}, sources=missing)
    assert disk_cache.load("test-entry", 1, KEY, sources=missing) is None
    assert not cache.exists()


def _corruptions(data: bytes) -> list[bytes]:
    middle = len(data) // 2
    flipped = bytearray(data)
    flipped[-9] ^= 0x01  # one bit of the last array
    header = bytearray(data)
    header[60] ^= 0x20  # inside the header
    return [
        b"",
        data[:10],
        data[:middle],
        data[:-1],
        bytes(flipped),
        bytes(header),
        b"SOCACHE2" + data[8:],
        b"\0" * len(data),
        os.urandom(len(data)),
    ]


def test_a_corrupt_or_truncated_file_is_ignored_rebuilt_and_overwritten(cache):
    arrays = {"probs": np.linspace(0.0, 1.0, 500)}
    disk_cache.store("test-entry", 1, KEY, arrays, {"lower": 3}, sources=SOURCES)
    (path,) = _entries(cache)
    good = path.read_bytes()
    builds = []

    def build() -> disk_cache.Entry:
        builds.append(1)
        return disk_cache.Entry(arrays, {"lower": 3})

    for bad in _corruptions(good):
        path.write_bytes(bad)
        assert disk_cache.load("test-entry", 1, KEY, sources=SOURCES) is None
        entry = disk_cache.cached("test-entry", 1, KEY, build, sources=SOURCES)
        assert _same_bits(entry.arrays["probs"], arrays["probs"])
        assert path.read_bytes() == good  # overwritten with a whole entry
    assert len(builds) == len(_corruptions(good))


def test_a_file_of_another_key_under_this_name_is_not_read(cache):
    disk_cache.store("test-entry", 1, KEY, {"a": np.ones(3)}, {}, sources=SOURCES)
    other = {**KEY, "n": 1001}
    disk_cache.store("test-entry", 1, other, {"a": np.zeros(3)}, {}, sources=SOURCES)
    first, second = _entries(cache)
    first.write_bytes(second.read_bytes())  # the right name, someone else's (whole) content
    assert [disk_cache.load("test-entry", 1, k, sources=SOURCES) is None
            for k in (KEY, other)].count(True) == 1  # fmt: skip


WRITER = """
import sys
import numpy as np
from shuffle_opacus.analysis.pld import disk_cache

me, rounds = int(sys.argv[1]), int(sys.argv[2])
key = {"shared": True}
for i in range(rounds):
    size = 1000 + 997 * ((me * 7 + i) % 5)
    disk_cache.store("test-race", 1, key, {"a": np.full(size, float(me))},
                     {"writer": me, "size": size}, sources=("analysis/pld/disk_cache.py",))
    entry = disk_cache.load("test-race", 1, key, sources=("analysis/pld/disk_cache.py",))
    if entry is not None:  # whatever was read is one writer's whole entry
        who, a = entry.scalars["writer"], entry.arrays["a"]
        assert a.size == entry.scalars["size"] and np.all(a == float(who)), (who, a.size)
print("ok")
"""


def test_concurrent_writers_of_one_key_leave_a_whole_file(cache):
    env = {**os.environ, ENV_DIR: str(cache)}
    procs = [
        subprocess.Popen([sys.executable, "-c", WRITER, str(me), "60"], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for me in (1, 2, 3)
    ]  # fmt: skip
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        assert out.strip() == "ok"
    (path,) = _entries(cache)
    entry = disk_cache.load("test-race", 1, {"shared": True}, sources=SOURCES)
    assert entry is not None
    assert np.all(entry.arrays["a"] == float(entry.scalars["writer"]))
    assert not [p for p in cache.iterdir() if p != path]  # no temporary file left behind


@pytest.mark.parametrize("value", ["off", "OFF", " off "])
def test_the_off_switch_reads_and_writes_nothing(tmp_path, monkeypatch, value):
    monkeypatch.setenv(ENV_DIR, value)
    monkeypatch.chdir(tmp_path)
    assert disk_cache.cache_directory() is None
    assert not disk_cache.store("test-entry", 1, KEY, {"a": np.ones(3)}, {}, sources=SOURCES)
    assert disk_cache.load("test-entry", 1, KEY, sources=SOURCES) is None
    calls = []
    entry = disk_cache.cached(
        "test-entry",
        1,
        KEY,
        lambda: calls.append(1) or disk_cache.Entry({}, {"x": 1}),
        sources=SOURCES,
    )
    assert entry.scalars == {"x": 1} and calls == [1]
    assert list(tmp_path.iterdir()) == []
    assert disk_cache.clear() == 0


def test_the_default_directory_follows_xdg_then_home(tmp_path, monkeypatch):
    monkeypatch.delenv(ENV_DIR, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert disk_cache.cache_directory() == tmp_path / "xdg" / "shuffle_opacus"
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/ignored")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert disk_cache.cache_directory() == tmp_path / "home" / ".cache" / "shuffle_opacus"
    monkeypatch.setenv(ENV_DIR, "")  # empty: as if unset
    assert disk_cache.cache_directory() == tmp_path / "home" / ".cache" / "shuffle_opacus"


def test_an_unwritable_directory_never_stops_a_computation(tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    monkeypatch.setenv(ENV_DIR, str(blocker / "cache"))
    assert not disk_cache.store("test-entry", 1, KEY, {"a": np.ones(3)}, {}, sources=SOURCES)
    entry = disk_cache.cached(
        "test-entry", 1, KEY, lambda: disk_cache.Entry({}, {"x": 2}), sources=SOURCES
    )
    assert entry.scalars == {"x": 2}


def _sizes(directory: Path) -> int:
    return sum(p.stat().st_size for p in _entries(directory))


def test_the_size_cap_evicts_the_least_recently_used_entries(cache, monkeypatch):
    one = {"a": np.zeros(1000)}  # about 8 kB an entry
    disk_cache.store("test-entry", 1, {"i": 0}, one, {}, sources=SOURCES)
    size = _sizes(cache)
    monkeypatch.setenv(ENV_MAX_BYTES, str(3 * size + size // 2))  # room for three
    (cache / "notes.txt").write_text("not an entry: never removed")
    paths = {}
    for i in range(3):
        disk_cache.store("test-entry", 1, {"i": i}, one, {}, sources=SOURCES)
        (paths[i],) = set(_entries(cache)) - set(paths.values())
        os.utime(paths[i], (1000.0 + i, 1000.0 + i))  # 0 oldest, 2 newest
    assert disk_cache.load("test-entry", 1, {"i": 0}, sources=SOURCES) is not None  # now newest
    disk_cache.store("test-entry", 1, {"i": 3}, one, {}, sources=SOURCES)
    assert _sizes(cache) <= 3 * size + size // 2
    assert not paths[1].exists()  # the least recently used
    assert paths[0].exists() and paths[2].exists()
    assert disk_cache.load("test-entry", 1, {"i": 3}, sources=SOURCES) is not None
    assert (cache / "notes.txt").exists()


def test_an_entry_over_the_cap_is_not_stored_and_a_cap_of_zero_keeps_nothing(cache, monkeypatch):
    monkeypatch.setenv(ENV_MAX_BYTES, "4096")
    assert not disk_cache.store("test-entry", 1, KEY, {"a": np.zeros(1000)}, {}, sources=SOURCES)
    assert disk_cache.store("test-entry", 1, KEY, {"a": np.zeros(10)}, {}, sources=SOURCES)
    monkeypatch.setenv(ENV_MAX_BYTES, "0")
    assert not disk_cache.store("test-entry", 1, KEY, {"a": np.zeros(10)}, {}, sources=SOURCES)


def test_stale_temporary_files_are_removed_and_fresh_ones_kept(cache):
    cache.mkdir()
    stale, fresh = cache / ".abc.tmp", cache / ".def.tmp"
    stale.write_bytes(b"half")
    fresh.write_bytes(b"half")
    os.utime(stale, (1000.0, 1000.0))
    disk_cache.store("test-entry", 1, KEY, {"a": np.zeros(3)}, {}, sources=SOURCES)
    assert not stale.exists() and fresh.exists()


@pytest.mark.parametrize("value", ["-1", "1e9", "lots"])
def test_a_bad_size_cap_is_one_line_naming_the_variable(cache, monkeypatch, value):
    monkeypatch.setenv(ENV_MAX_BYTES, value)
    with pytest.raises(ValueError, match=rf"^{ENV_MAX_BYTES} must be an integer >= 0\. Found"):
        disk_cache.store("test-entry", 1, KEY, {"a": np.zeros(3)}, {}, sources=SOURCES)


def test_bad_kinds_and_values_are_refused(cache):
    with pytest.raises(ValueError, match="kind must match"):
        disk_cache.load("Bad/Kind", 1, KEY, sources=SOURCES)
    with pytest.raises(TypeError, match="key values must be"):
        disk_cache.load("test-entry", 1, {"x": object()}, sources=SOURCES)
    with pytest.raises(TypeError, match="dtype"):
        disk_cache.store("test-entry", 1, KEY, {"a": np.zeros(3, np.float32)}, {}, sources=SOURCES)


def test_clear_removes_entries_only(cache):
    for i in range(3):
        disk_cache.store("test-entry", 1, {"i": i}, {"a": np.zeros(3)}, {}, sources=SOURCES)
    (cache / "keep.txt").write_text("x")
    assert disk_cache.clear() == 3
    assert [p.name for p in cache.iterdir()] == ["keep.txt"]


# --- the PMFs: a cached one is the fresh one, bit for bit -------------------------------------


@pytest.mark.parametrize(
    "probs",
    [
        np.array([1.0]),
        np.array([0.0]),
        np.array([0.0, 0.0, 0.5, 0.0]),
        np.random.default_rng(1).random(5000) ** 8,
        np.random.default_rng(2).dirichlet(np.ones(20000)),
        np.concatenate([np.zeros(100), np.random.default_rng(3).random(3000), np.zeros(7)]),
        # The largest exponent at index 0 (-0.0 for negative orders) and at the last index.
        np.array([0.3, 0.0, 0.0, 0.0]),
        np.array([0.0, 0.0, 0.0, 1e-300]),
        np.array([0.5, 1e-310, 0.0, 0.25, 0.0]),
    ],
)
def test_the_moments_are_scipys_logsumexp_bit_for_bit(probs):
    orders = moments.chernoff_orders(2.0**-20)
    index = np.arange(probs.size, dtype=float)
    ours = moments.log_mgf(probs, orders)
    theirs = np.array([logsumexp(index * o, b=probs) for o in orders])
    assert ours.tobytes() == theirs.tobytes()


def _fields(pmf: powers.PmfPowers) -> tuple[object, ...]:
    return (pmf.discretization, pmf.lower, pmf.infinity, pmf.pessimistic,
            pmf.probs.tobytes(), pmf.log_mgf.tobytes(), pmf.orders.tobytes())  # fmt: skip


SETTING = rounds.ShuffleRound(n=20, sigma=1.0)  # few reports: the geometric engine, quick
LATTICE = rounds.ShuffleRound(n=100, sigma=2.0)  # the lattice engine, which checks its memory


def _fresh(monkeypatch, setting, grid, tail):
    monkeypatch.setenv(ENV_DIR, "off")
    rounds._upper.cache_clear()
    rounds._lower.cache_clear()
    return rounds._upper(setting, grid, tail), rounds._lower(setting, grid, tail)


def test_a_cached_pmf_is_bit_for_bit_a_fresh_one(cache, monkeypatch):
    grid, tail = 2.0**-10, 1e-13
    upper, lower = _fresh(monkeypatch, SETTING, grid, tail)
    monkeypatch.setenv(ENV_DIR, str(cache))
    for attempt in ("stored", "read back"):
        rounds._upper.cache_clear()
        rounds._lower.cache_clear()
        again_upper = rounds._upper(SETTING, grid, tail)
        again_lower = rounds._lower(SETTING, grid, tail)
        assert _fields(again_upper) == _fields(upper), attempt
        assert [_fields(p) for p in again_lower] == [_fields(p) for p in lower], attempt
    assert {p.name.split("-")[1] for p in _entries(cache)} == {"upper", "lower"}


def test_a_cached_query_is_bit_for_bit_a_fresh_one(cache, monkeypatch):
    history = [(SETTING, 3), (rounds.ShuffleRound(n=20, sigma=1.5), 2)]
    _fresh(monkeypatch, SETTING, 2.0**-10, 1e-13)
    fresh = rounds.shuffle_rounds_epsilon(history, delta=1e-5, lower=True)
    monkeypatch.setenv(ENV_DIR, str(cache))
    for _ in range(2):
        rounds._upper.cache_clear()
        rounds._lower.cache_clear()
        again = rounds.shuffle_rounds_epsilon(history, delta=1e-5, lower=True)
        assert repr((again.epsilon, again.epsilon_lower)) == repr(
            (fresh.epsilon, fresh.epsilon_lower)
        )
    kinds = sorted(p.name.rsplit("-", 1)[0] for p in _entries(cache))
    assert kinds == ["shuffle-lower"] * 2 + ["shuffle-lower-epsilon"] + ["shuffle-upper"] * 2


def test_an_entry_serves_only_the_memory_limit_it_was_built_under(cache):
    from shuffle_opacus.analysis.pld.shuffle_gaussian import pmf

    rounds._upper.cache_clear()
    rounds._upper(LATTICE, 2.0**-10, 1e-13)
    assert len(_entries(cache)) == 1
    with memory_limit(1000):  # far too small for the lattice: refused, not read from the cache
        rounds._upper.cache_clear()
        pmf._cached_pair.cache_clear()
        with pytest.raises(ValueError, match="memory"):
            rounds._upper(LATTICE, 2.0**-10, 1e-13)
    rounds._upper.cache_clear()


def test_a_corrupt_pmf_entry_is_rebuilt_to_the_same_bits(cache, monkeypatch):
    grid, tail = 2.0**-10, 1e-13
    upper, _ = _fresh(monkeypatch, SETTING, grid, tail)
    monkeypatch.setenv(ENV_DIR, str(cache))
    rounds._upper.cache_clear()
    rounds._upper(SETTING, grid, tail)
    (path,) = [p for p in _entries(cache) if p.name.startswith("shuffle-upper-")]
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    rounds._upper.cache_clear()
    assert _fields(rounds._upper(SETTING, grid, tail)) == _fields(upper)
    key = rounds._key(SETTING, grid, tail)
    entry = disk_cache.load(
        "shuffle-upper", rounds.CACHE_VERSION, key, sources=rounds.CACHE_SOURCES
    )
    assert entry is not None  # overwritten with a whole entry
    assert entry.arrays["0.probs"].tobytes() == upper.probs.tobytes()


WARM = """
import json, sys
from shuffle_opacus.analysis.pld.rounds import ShuffleRound, shuffle_rounds_epsilon
est = shuffle_rounds_epsilon([(ShuffleRound(n=20, sigma=1.0), 3)], delta=1e-5, lower=True)
heavy = [m for m in ("dp_accounting", "scipy.stats", "scipy.signal") if m in sys.modules]
print(json.dumps([repr(est.epsilon), repr(est.epsilon_lower), heavy]))
"""


def test_a_query_answered_from_the_cache_imports_neither_dp_accounting_nor_scipy_stats(cache):
    rounds._upper.cache_clear()
    rounds._lower.cache_clear()
    fresh = rounds.shuffle_rounds_epsilon(
        [(rounds.ShuffleRound(n=20, sigma=1.0), 3)], delta=1e-5, lower=True
    )  # fills the cache in this process
    env = {**os.environ, ENV_DIR: str(cache)}
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(WARM)], env=env,
                         capture_output=True, text=True, check=True)  # fmt: skip
    eps, low, heavy = json.loads(out.stdout.strip().splitlines()[-1])
    assert (eps, low) == (repr(fresh.epsilon), repr(fresh.epsilon_lower))
    assert heavy == []


def test_from_arrays_and_compose_arrays_are_the_dp_accounting_path_bit_for_bit():
    from dp_accounting.pld import pld_pmf

    probs = np.random.default_rng(5).dirichlet(np.ones(700)) * (1 - 1e-9)
    dense = pld_pmf.DensePLDPmf(2.0**-12, -300, probs, 1e-9, True)
    ours = powers.PmfPowers.from_arrays(
        discretization=2.0**-12, lower=-300, probs=probs, infinity=1e-9, pessimistic=True
    )
    theirs = powers.PmfPowers(dense)
    assert _fields(ours) == _fields(theirs)
    again = powers.PmfPowers.from_arrays(**ours.fields())  # type: ignore[arg-type]
    assert _fields(again) == _fields(ours)
    light = powers.compose_arrays([(ours, 40)])
    heavy = powers.compose_powers([(theirs, 40)])
    assert light.probs.tobytes() == np.asarray(heavy._probs).tobytes()
    assert (light.lower, light.infinity) == (heavy._lower_loss, heavy._infinity_mass)
    for delta in (1e-3, 1e-6, 1e-9):
        assert powers.epsilon_for_delta(light, delta) == powers.epsilon_for_delta(heavy, delta)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"discretization": 0.0}, "discretization must be > 0"),
        ({"probs": np.ones((2, 2))}, "probs must be 1-D"),
        ({"log_mgf": np.zeros(3)}, "log_mgf must hold one value per Chernoff order"),
    ],
)
def test_from_arrays_refuses_bad_fields_in_one_line(fields, message):
    good = {"discretization": 2.0**-10, "lower": 0, "probs": np.array([0.5, 0.5]),
            "infinity": 0.0, "pessimistic": True}  # fmt: skip
    with pytest.raises(ValueError, match=message):
        powers.PmfPowers.from_arrays(**{**good, **fields})
