"""The cost model gives the same estimates and refusals as before it was read from the records.

``costs_pinned.json`` holds, for a grid of requests over every mechanism and method of the table,
the estimates of :func:`~shuffle_opacus.analysis.costs.account_seconds`,
:func:`~shuffle_opacus.analysis.costs.rdp_stage_seconds` and
:func:`~shuffle_opacus.analysis.costs.calibrate_seconds` (as ``float.hex``, so that a change in
the last bit fails) and the messages of :func:`~shuffle_opacus.analysis.limits.check_budget` and
:func:`~shuffle_opacus.analysis.limits.check_calibrate_budget` at small budgets. It was written
by ``python tests/analysis/test_costs.py --write`` at commit b81da41, before the cost model moved
into the mechanism records (issue 43), when the estimates compared mechanism and method names;
rewrite it only for a deliberate change of the cost model.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from shuffle_opacus.analysis import costs, limits
from shuffle_opacus.analysis.mechanisms import MECHANISM_TABLE

PINNED = Path(__file__).with_name("costs_pinned.json")

#: Parameters per mechanism: a few settings each, from cheap to beyond the command's limit.
_SETTINGS: dict[str, list[dict[str, object]]] = {
    "shuffle": [{"n": n, "sigma": s} for n in (10, 100, 5000, 10**7) for s in (0.03, 0.6, 4.0)],
    "subsampled": [
        {"n": n, "m": m, "sigma": s}
        for n, m in ((100, 10), (10**5, 1000), (10**8, 10**5))
        for s in (0.03, 0.6, 4.0)
    ],
    "checkin": [
        {"n": n, "rate": r, "sigma": s}
        for n, r in ((100, 0.5), (10**5, 0.01), (10**9, 1e-4))
        for s in (0.03, 0.6, 4.0)
    ],
    "gaussian": [{"sigma": s} for s in (0.5, 3.0)],
    "subsampled-gaussian": [{"rate": r, "sigma": 1.0} for r in (0.001, 0.5)],
    "clones": [{"n": n, "eps0": e} for n in (100, 10**6, 10**9) for e in (0.1, 1.0, 8.0)],
    "clones-gaussian": [
        {"n": n, "sigma": 1.0, "rate": r} for n in (100, 10**6) for r in (None, 0.01)
    ],
    "ldp-shuffle": [
        {"n": n, "eps0": e, "m": m}
        for n in (100, 10**6, 10**9)
        for e in (0.5, 4.0)
        for m in (None, 50)
    ],
    "krr": [
        {"n": n, "k": k, "gamma": g, "adversary": a}
        for n in (100, 10**5, 10**8)
        for k, g in ((2, 0.5), (10, 0.05))
        for a in (None, "strong", "weak")
    ],
}
_STEPS = ([1], [1000], [1, 10, 10**6])
_ORDERS = (None, 40, 900)


#: The records by name: the cost model reads records, not names.
_R = MECHANISM_TABLE


def _methods(name: str) -> tuple[str | None, ...]:
    return (None, *MECHANISM_TABLE[name].method_names)


def _cases() -> Iterator[tuple[str, Callable[[], object]]]:
    """Every pinned request: a key and the call that answers it."""
    for mech, settings in _SETTINGS.items():
        rounds = MECHANISM_TABLE[mech].by_rounds
        for i, values in enumerate(settings):
            for method in _methods(mech):
                for steps in _STEPS:
                    for order in _ORDERS if rounds else (None,):
                        key = f"account {mech} {i} {method} {steps} {order}"
                        yield (
                            key,
                            lambda m=mech, v=values, me=method, s=steps, o=order: (
                                costs.account_seconds(_R[m], v, steps=s, method=me, max_order=o)
                            ),
                        )
                for budget, order in ((0.2, None), (3.0, None), (0.2, 600), (3.0, 600)):
                    if order is not None and not rounds:
                        continue
                    steps = [10**5]
                    key = f"budget {mech} {i} {method} {budget} {order}"

                    def refuse(
                        m: str = mech,
                        v: dict[str, object] = values,
                        me: str | None = method,
                        s: list[int] = steps,
                        o: int | None = order,
                        b: float = budget,
                    ) -> object:
                        try:
                            return limits.check_budget(
                                _R[m], v, steps=s, method=me, max_order=o, budget=b
                            )
                        except limits.WorkLimitError as exc:
                            return str(exc)

                    yield key, refuse
    for mech in ("shuffle", "subsampled", "checkin", "gaussian", "subsampled-gaussian"):
        entry = MECHANISM_TABLE[mech]
        curves = (*entry.method_names, *entry.references, "unknown")
        for values in _SETTINGS[mech][1::3]:
            for curve in curves:
                for order in (2, 64, 1000):
                    key = f"stage {mech} {values} {curve} {order}"
                    yield (
                        key,
                        lambda m=mech, c=curve, o=order, v=values: costs.rdp_stage_seconds(
                            _R[m], c, o, n=v.get("n"), m=v.get("m"), rate=v.get("rate")
                        ),
                    )
    for mech, n, m, rate in (
        ("shuffle", 5000, None, None),
        ("subsampled", 10**5, 1000, 0.01),
        ("checkin", 10**5, None, 0.01),
        ("checkin", 10**8, None, 0.001),
    ):
        for method in MECHANISM_TABLE[mech].method_names:
            for rounds_ in (100, 10**6):
                key = f"calibrate {mech} {n} {method} {rounds_}"
                yield (
                    key,
                    lambda me=mech, mt=method, n_=n, m_=m, r=rate, k=rounds_: (
                        costs.calibrate_seconds(
                            mechanism=_R[me], method=mt, n=n_, m=m_, rate=r, rounds=k, order=64
                        )
                    ),
                )
                for budget in (0.5, 20.0):
                    key = f"calibrate-budget {mech} {n} {method} {rounds_} {budget}"

                    def refuse_cal(
                        me: str = mech,
                        mt: str = method,
                        n_: int = n,
                        m_: int | None = m,
                        r: float | None = rate,
                        k: int = rounds_,
                        b: float = budget,
                    ) -> object:
                        try:
                            return limits.check_calibrate_budget(
                                mechanism=_R[me], method=mt, n=n_, m=m_, rate=r, rounds=k, budget=b
                            )
                        except limits.WorkLimitError as exc:
                            return str(exc)

                    yield key, refuse_cal


def _shown(value: object) -> object:
    return float(value).hex() if isinstance(value, float) else value


def _answers() -> dict[str, object]:
    return {key: _shown(call()) for key, call in _cases()}


def test_estimates_and_refusals_are_pinned() -> None:
    pinned = json.loads(PINNED.read_text())
    found = _answers()
    assert found.keys() == pinned.keys()
    changed = {k: (pinned[k], v) for k, v in found.items() if v != pinned[k]}
    assert not changed, f"{len(changed)} of {len(found)} differ, e.g. {next(iter(changed.items()))}"


def test_pinned_grid_reaches_every_branch() -> None:
    """The grid holds refusals naming each driver and estimates beyond the command's limit."""
    pinned = json.loads(PINNED.read_text())
    texts = [v for v in pinned.values() if isinstance(v, str) and " " in v]
    for driver in ("max_order", "n", "steps", "rounds"):
        assert any(t.startswith(f"{driver} must be <= ") for t in texts), driver
    assert any("over the" in t for t in texts)
    seconds = [float.fromhex(v) for v in pinned.values() if isinstance(v, str) and " " not in v]
    assert max(seconds) > limits.CLI_MAX_SECONDS > min(seconds)


@pytest.mark.parametrize("mechanism", sorted(MECHANISM_TABLE))
def test_every_mechanism_is_pinned(mechanism: str) -> None:
    pinned = json.loads(PINNED.read_text())
    assert any(k.startswith(f"account {mechanism} ") for k in pinned)


if __name__ == "__main__":  # pragma: no cover
    if sys.argv[1:] != ["--write"]:
        sys.exit("usage: python tests/analysis/test_costs.py --write")
    PINNED.write_text(json.dumps(_answers(), indent=0, sort_keys=True) + "\n")


def test_the_cost_model_reads_records_not_names():
    # The table that turns a name into a record stands on the cost functions: the cost model
    # takes the record, and says so in one line when given a name.
    with pytest.raises(
        TypeError, match=r"^mechanism must be a Mechanism record .* Found 'shuffle'"
    ):
        costs.account_seconds("shuffle", {"n": 10, "sigma": 1.0}, steps=[1], method=None,
                              max_order=None)  # fmt: skip
    with pytest.raises(TypeError, match="mechanism must be a Mechanism record"):
        limits.check_calibrate_budget(
            mechanism="checkin", method="pld", n=10, m=None, rate=0.5, rounds=1, budget=1.0
        )
