"""The front door of ``shuffle_opacus.analysis``: the table, ``account`` and the result record.

``account`` answers for every mechanism of the table what the per-family function it replaces
gave (bit for bit where the same code runs); the old per-family names still work through the
package for one release, each read warning once and naming its new place; ``__all__`` and
``dir`` show the front door only; and the repository itself reads no old name.
"""

from __future__ import annotations

import importlib
import re
import warnings
from pathlib import Path

import pytest

import shuffle_opacus.analysis as analysis
from shuffle_opacus.analysis import MECHANISM_TABLE, AccountingResult, account
from shuffle_opacus.analysis.approximate.baselines import clones_results
from shuffle_opacus.analysis.approximate.clones import clones_epsilon
from shuffle_opacus.analysis.epsilon import compute_epsilon
from shuffle_opacus.analysis.pld.krr import krr_epsilon
from shuffle_opacus.analysis.pld.ldp import ldp_shuffle_epsilon
from shuffle_opacus.analysis.pld.shuffle_gaussian import shuffle_gaussian_epsilon

ROOT = Path(__file__).resolve().parents[2]
DELTA = 1e-5

FRONT_DOOR = {
    "MECHANISM_TABLE",
    "SHUFFLE_ASSUMPTIONS",
    "Mechanism",
    "Method",
    "RoundSetting",
    "get_mechanism",
    "account",
    "AccountingResult",
    "OrderCapWarning",
}

#: Every old name of the package -> the module it is imported from now, and whether the warning
#: names ``account`` (the names the front door replaces for a mechanism of the table).
OLD_NAMES = {
    "compute_epsilon": ("shuffle_opacus.analysis.epsilon", True),
    "rounds_epsilon": ("shuffle_opacus.analysis.epsilon", False),
    "per_step_rdp": ("shuffle_opacus.analysis.mechanisms", False),
    "EpsilonResult": ("shuffle_opacus.analysis.rdp.conversion", False),
    "epsilon_from_rdp": ("shuffle_opacus.analysis.rdp.conversion", False),
    "rdp_to_dp": ("shuffle_opacus.analysis.rdp.conversion", False),
    "shuffle_gaussian_epsilon": ("shuffle_opacus.analysis.pld.shuffle_gaussian", True),
    "ldp_shuffle_epsilon": ("shuffle_opacus.analysis.pld.ldp", True),
    "krr_epsilon": ("shuffle_opacus.analysis.pld.krr", True),
    "clones_epsilon": ("shuffle_opacus.analysis.approximate.clones", True),
    "compose_best_epsilon": ("shuffle_opacus.analysis.approximate.composition", False),
    "gaussian_dp_epsilon": ("shuffle_opacus.analysis.approximate.analytic_gaussian", False),
    "girgis_epsilon": ("shuffle_opacus.analysis.rdp.girgis", False),
    "shuffled_gaussian_delta_mc": ("shuffle_opacus.analysis.montecarlo", False),
}

#: A small, cheap setting of every mechanism of the table.
CHEAP: dict[str, dict[str, object]] = {
    "shuffle": {"n": 20, "sigma": 2.0},
    "subsampled": {"n": 20, "m": 5, "sigma": 2.0},
    "checkin": {"n": 20, "rate": 0.25, "sigma": 2.0},
    "gaussian": {"sigma": 2.0},
    "subsampled-gaussian": {"rate": 0.1, "sigma": 2.0},
    "clones": {"n": 50, "eps0": 1.0},
    "clones-gaussian": {"n": 50, "sigma": 2.0},
    "ldp-shuffle": {"n": 50, "eps0": 1.0},
    "krr": {"n": 50, "k": 4, "gamma": 0.9},
}


def _steps(mechanism: str) -> int:
    """Two rounds, but one for the clones bounds (their family function is one round)."""
    return 1 if mechanism.startswith("clones") else 2


def _family_epsilon(mechanism: str, parameters: dict[str, object]) -> float:
    """Epsilon of the default method by the family function that ``account`` replaces."""
    steps = _steps(mechanism)
    if MECHANISM_TABLE[mechanism].by_rounds:
        return compute_epsilon(mechanism, steps=steps, delta=DELTA, **parameters).epsilon  # type: ignore[arg-type]
    if mechanism == "clones":
        return clones_epsilon(delta=DELTA, **parameters).upper  # type: ignore[arg-type]
    if mechanism == "clones-gaussian":
        return clones_results(steps=[steps], delta=DELTA, **parameters)[0].epsilon  # type: ignore[arg-type]
    if mechanism == "ldp-shuffle":
        return ldp_shuffle_epsilon(DELTA, steps=steps, **parameters)  # type: ignore[arg-type]
    assert mechanism == "krr"
    return krr_epsilon(DELTA, steps=steps, **parameters)  # type: ignore[arg-type]


def test_every_mechanism_of_the_table_has_a_cheap_setting_here() -> None:
    assert set(CHEAP) == set(MECHANISM_TABLE)


@pytest.mark.parametrize("mechanism", list(CHEAP))
def test_account_gives_what_the_family_function_gave(mechanism: str) -> None:
    parameters = CHEAP[mechanism]
    result = account(mechanism, steps=_steps(mechanism), delta=DELTA, **parameters)
    assert isinstance(result, AccountingResult)
    assert (result.mechanism, result.steps, result.delta) == (mechanism, _steps(mechanism), DELTA)
    assert result.method == MECHANISM_TABLE[mechanism].default_method
    for name, value in parameters.items():
        assert result.parameters[name] == value
    # The same code runs behind both: the same bits.
    assert result.epsilon == _family_epsilon(mechanism, parameters)
    assert 0.0 < result.epsilon < float("inf")


@pytest.mark.parametrize("mechanism", ["shuffle", "subsampled", "checkin"])
def test_account_pld_agrees_with_the_shuffle_gaussian_function(mechanism: str) -> None:
    # The rounds' PLD (pld.rounds) and shuffle_gaussian_epsilon compose the same pair by
    # different code (cached powers against one composition), so they agree to rounding only.
    parameters = CHEAP[mechanism]
    result = account(mechanism, steps=2, delta=DELTA, method="pld", **parameters)
    family = shuffle_gaussian_epsilon(DELTA, steps=2, **parameters)  # type: ignore[arg-type]
    assert result.epsilon == pytest.approx(family, rel=1e-9)


def test_clones_records_keep_the_certified_lower_end() -> None:
    result = account("clones", steps=1, delta=DELTA, **CHEAP["clones"])
    bounds = clones_epsilon(delta=DELTA, **CHEAP["clones"])  # type: ignore[arg-type]
    assert (result.epsilon, result.epsilon_lower) == (bounds.upper, bounds.lower)


def test_a_sequence_of_counts_gives_one_record_per_count() -> None:
    one = [account("gaussian", sigma=2.0, steps=k, delta=DELTA) for k in (1, 3)]
    many = account("gaussian", {"sigma": 2.0}, steps=[1, 3], delta=DELTA)
    assert isinstance(many, list)
    assert [r.steps for r in many] == [1, 3]
    assert [r.epsilon for r in many] == [r.epsilon for r in one]
    assert many[0].epsilon < many[1].epsilon


def test_parameters_as_a_mapping_or_as_keywords_are_the_same_question() -> None:
    by_mapping = account("subsampled-gaussian", {"rate": 0.1, "sigma": 2.0}, steps=2, delta=DELTA)
    by_keywords = account("subsampled-gaussian", rate=0.1, sigma=2.0, steps=2, delta=DELTA)
    mixed = account("subsampled-gaussian", {"rate": 0.1}, sigma=2.0, steps=2, delta=DELTA)
    assert by_mapping == by_keywords == mixed


@pytest.mark.parametrize(
    ("call", "named"),
    [
        (lambda: account("shufle", n=20, sigma=2.0, steps=1, delta=DELTA), "'shufle'"),
        (lambda: account("shuffle", n=20, sigmaa=2.0, steps=1, delta=DELTA), "sigmaa"),
        (lambda: account("shuffle", n=20, steps=1, delta=DELTA), "sigma is required"),
        (lambda: account("gaussian", sigma=2.0, n=20, steps=1, delta=DELTA), "n is not a"),
        (lambda: account("gaussian", sigma=-1.0, steps=1, delta=DELTA), "sigma"),
        (lambda: account("gaussian", sigma=2.0, steps=0, delta=DELTA), "steps"),
        (lambda: account("gaussian", sigma=2.0, steps="3", delta=DELTA), "steps"),
        (lambda: account("gaussian", sigma=2.0, steps=[], delta=DELTA), "steps"),
        (lambda: account("gaussian", sigma=2.0, steps=1, delta=2.0), "delta"),
        (lambda: account("gaussian", sigma=2.0, steps=1, delta=DELTA, method="pld"), "method"),
        (lambda: account("gaussian", {"sigma": 2.0}, sigma=3.0, steps=1, delta=DELTA), "sigma"),
    ],
)
def test_bad_input_gets_a_one_line_error_naming_it(call, named: str) -> None:
    with pytest.raises(ValueError) as caught:
        call()
    message = str(caught.value)
    assert named in message and "\n" not in message, message


def test_all_and_dir_show_the_front_door_only() -> None:
    assert set(analysis.__all__) == FRONT_DOOR
    public = {name for name in dir(analysis) if not name.startswith("_")}
    assert public == FRONT_DOOR
    namespace: dict[str, object] = {}
    exec("from shuffle_opacus.analysis import *", namespace)
    assert set(namespace) - {"__builtins__"} == FRONT_DOOR


def test_the_front_door_reads_without_a_warning() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for name in FRONT_DOOR:
            getattr(analysis, name)


@pytest.mark.parametrize("name", list(OLD_NAMES))
def test_an_old_name_warns_once_and_names_its_new_place(name: str) -> None:
    module, by_account = OLD_NAMES[name]
    expected = getattr(importlib.import_module(module), name)
    for _ in range(2):  # never kept in the package: every read warns
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            value = getattr(analysis, name)
        assert value is expected
        assert [w.category for w in caught] == [DeprecationWarning]
        message = str(caught[0].message)
        assert f"shuffle_opacus.analysis.{name} is deprecated" in message
        assert f"import it from {module}" in message
        assert ("shuffle_opacus.analysis.account(" in message) is by_account
        assert caught[0].filename == __file__  # the warning points at the reader
    assert name not in dir(analysis)


def test_an_old_name_imported_by_a_from_statement_warns_once() -> None:
    namespace: dict[str, object] = {}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        exec("from shuffle_opacus.analysis import krr_epsilon, account", namespace)
    assert [w.category for w in caught] == [DeprecationWarning]
    assert "krr_epsilon" in str(caught[0].message)
    assert namespace["krr_epsilon"] is krr_epsilon


def test_the_new_places_read_without_a_warning() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for name, (module, _) in OLD_NAMES.items():
            getattr(importlib.import_module(module), name)
        # and the submodules themselves still import through the package
        exec("from shuffle_opacus.analysis import query, limits", {})


#: Files the repository's owners are still switching (they read an old name through the
#: package); each entry must go when its file is switched, so that this list cannot go stale.
PENDING: dict[str, set[str]] = {}

_OLD = "|".join(OLD_NAMES)
_FROM = re.compile(r"from\s+(?:shuffle_opacus)?\.*analysis\s+import\s+(\([^)]*\)|[^\n]*)")
_ATTRIBUTE = re.compile(rf"\banalysis\.({_OLD})\b")
_FENCE = re.compile(r"```python\n(.*?)```", re.S)


def _old_names_read(text: str) -> set[str]:
    """Old names that ``text`` reads through ``shuffle_opacus.analysis``."""
    found = set(_ATTRIBUTE.findall(text))
    for body in _FROM.findall(text):
        words = re.findall(r"\w+", body.split("#")[0])
        found |= {w for w in words if w in OLD_NAMES}
    return found


def test_the_repository_reads_no_old_name_through_the_package() -> None:
    sources = [
        *(ROOT / "shuffle_opacus").rglob("*.py"),
        *(ROOT / "experiments").rglob("*.py"),
        *(ROOT / "benchmarks").rglob("*.py"),
        *(ROOT / "tests").rglob("*.py"),
    ]
    found: dict[str, set[str]] = {}
    for path in sources:
        if path.resolve() == Path(__file__).resolve() or ".venv" in path.parts:
            continue
        names = _old_names_read(path.read_text(encoding="utf-8"))
        if names:
            found[path.relative_to(ROOT).as_posix()] = names
    for path in [ROOT / "README.md", *(ROOT / "docs").rglob("*.md")]:
        code = "\n".join(_FENCE.findall(path.read_text(encoding="utf-8")))
        names = _old_names_read(code)
        if names:
            found[path.relative_to(ROOT).as_posix()] = names
    assert found == PENDING, (
        "import the old names from their modules (OLD_NAMES); when a file of PENDING is "
        "switched, take it out of PENDING"
    )
