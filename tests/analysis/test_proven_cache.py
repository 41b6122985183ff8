"""The proven method's pairs, statistics and level choices kept on disk (method ``proven``).

A proven answer must not depend on whether anything came from the cache: the same bits cold,
warm, and after a corrupt entry; and a warm process must build no pair and search no level
(which is what makes the method cheap to ask every round and in a repeated command).
"""

from __future__ import annotations

import pytest

from shuffle_opacus.analysis.pld import disk_cache, proven
from shuffle_opacus.analysis.pld.disk_cache import ENV_DIR
from shuffle_opacus.analysis.pld.rounds import ShuffleRound

SETTING = ShuffleRound(n=400, sigma=1.0, rate=0.2)
FIXED = ShuffleRound(n=300, sigma=1.0, m=60)
LOCAL = ShuffleRound(n=50, sigma=4.0, rate=0.5)  # route gaussian: the shuffle does not help


def _clear() -> None:
    for fn in (
        proven._plan,
        proven._pair_stats,
        proven._pair_powers,
        proven._route_pair,
        proven._gaussian_powers,
    ):
        fn.cache_clear()


def _fields(est: proven.ProvenEstimate) -> str:
    return repr(
        (est.epsilon, est.route, est.level, est.delta_pld, est.delta_coupling, est.discretization)
    )


def _entries(directory):
    return sorted(p.name.rsplit("-", 1)[0] for p in directory.glob(f"*{disk_cache.SUFFIX}"))


@pytest.mark.parametrize(
    "rounds", [[(SETTING, 7)], [(FIXED, 5)], [(SETTING, 3), (FIXED, 4)], [(LOCAL, 7)]]
)
def test_a_cached_proven_epsilon_is_bit_for_bit_a_fresh_one(tmp_path, monkeypatch, rounds):
    monkeypatch.setenv(ENV_DIR, "off")
    _clear()
    fresh = _fields(proven.proven_rounds_epsilon(rounds, delta=1e-5))
    monkeypatch.setenv(ENV_DIR, str(tmp_path))
    for attempt in ("stored", "read back"):
        _clear()
        assert _fields(proven.proven_rounds_epsilon(rounds, delta=1e-5)) == fresh, attempt
    kinds = {"proven-plan", "proven-gaussian"} if rounds[0][0] is LOCAL else {"proven-pmf"}
    assert {"proven-plan", "proven-stats"} | kinds <= set(_entries(tmp_path))
    _clear()


@pytest.mark.parametrize("setting", [SETTING, LOCAL])
def test_a_warm_process_builds_no_pair_and_searches_no_level(tmp_path, monkeypatch, setting):
    monkeypatch.setenv(ENV_DIR, str(tmp_path))
    _clear()
    cold = _fields(proven.proven_rounds_epsilon([(setting, 9)], delta=1e-5))
    _clear()

    def refuse(*args, **kwargs):
        raise AssertionError("built although cached")

    monkeypatch.setattr(proven, "_route_pair", refuse)
    monkeypatch.setattr(proven, "_searched_plan", refuse)
    monkeypatch.setattr(proven, "_built_gaussian", refuse)
    assert _fields(proven.proven_rounds_epsilon([(setting, 9)], delta=1e-5)) == cold
    monkeypatch.undo()
    _clear()


def test_a_corrupt_proven_entry_is_rebuilt_to_the_same_bits(tmp_path, monkeypatch):
    monkeypatch.setenv(ENV_DIR, str(tmp_path))
    _clear()
    cold = _fields(proven.proven_rounds_epsilon([(SETTING, 6)], delta=1e-5))
    for path in tmp_path.glob(f"proven-*{disk_cache.SUFFIX}"):
        data = bytearray(path.read_bytes())
        data[len(data) // 2] ^= 0xFF
        path.write_bytes(bytes(data))
    _clear()
    assert _fields(proven.proven_rounds_epsilon([(SETTING, 6)], delta=1e-5)) == cold
    _clear()
    assert _fields(proven.proven_rounds_epsilon([(SETTING, 6)], delta=1e-5)) == cold
    _clear()


@pytest.mark.parametrize("start", [0, 3, 17, 18, 19, 40, 99])
@pytest.mark.parametrize("best", [0, 18, 99])
def test_the_level_search_finds_the_minimum_of_a_unimodal_curve(start, best):
    seen: list[int] = []

    def value(i: int) -> float:
        seen.append(i)
        return (i - best) ** 2 + 0.5 * (i > best)

    assert proven._descend(value, start, 0, 99) == best
    if abs(start - best) <= 1:  # next to the minimum: four levels looked at, at most
        assert len(set(seen)) <= 4


def test_the_level_search_stays_inside_its_range():
    def value(i: int) -> float:
        assert 5 <= i <= 9, i
        return -float(i)

    assert proven._descend(value, 5, 5, 9) == 9
    assert proven._descend(lambda i: float(i), 9, 5, 9) == 5
