"""Saving and loading an accountant's state: the history, the configuration and the released rounds.

The functions here are the bodies of :meth:`ShuffleAccountantBase.state_dict` and
:meth:`~ShuffleAccountantBase.load_state_dict` (:mod:`shuffle_opacus.engine.accountants`), which
keep their documentation.
"""

from __future__ import annotations

import warnings
from collections import OrderedDict
from collections.abc import Mapping
from copy import deepcopy
from typing import TYPE_CHECKING, Any

from ..accounting.ledger import RoundLedger, read_history
from ..common.validation import check_int
from .releases import MAX_ROUND, ReleaseRecord

if TYPE_CHECKING:
    from .releases import ReleasingAccountant

__all__ = ["HistoryRollbackWarning", "load_state", "read_history", "read_released", "state_of"]


def _method_text(method: str | None) -> str:
    return "the default method (pld where affordable)" if method is None else f"method {method!r}"


class HistoryRollbackWarning(UserWarning):
    """A loaded state holds fewer rounds than the accountant had: epsilon goes back with it."""


def state_of(
    accountant: ReleasingAccountant, destination: Mapping[str, Any] | None = None
) -> Mapping[str, Any]:
    """Return ``accountant``'s state (see :meth:`ShuffleAccountantBase.state_dict`).

    Args:
        accountant: The accountant.
        destination: Mapping to fill; a new ``OrderedDict`` by default.

    Returns:
        The filled mapping.
    """
    out: Any = OrderedDict() if destination is None else destination
    out["history"] = deepcopy(accountant.history)
    out["mechanism"] = accountant.mechanism()
    out["population"] = accountant.population
    out["sensitivity"] = accountant.sensitivity
    out["method"] = accountant.method
    out["sample_size"] = accountant.sample_size
    out["released"] = accountant.releases.state()
    if accountant.releases.any_seed:
        out["released_any_seed"] = accountant.releases.any_seed
    if accountant.releases.secret:
        out["released_secret"] = accountant.releases.secret
    return out


def read_released(state_dict: Mapping[str, Any], rounds: int) -> ReleaseRecord:
    """Return the release record of a saved state; one without a full record is never trusted.

    A state without ``released`` (saved before the record existed, or edited), or whose record
    holds fewer rounds than its history, does not say which rounds it released: its ``rounds``
    rounds count as released under an unknown seed (rounds ``0 .. rounds - 1`` of every seed,
    :attr:`~shuffle_opacus.engine.releases.ReleaseRecord.any_seed`), so that training from it
    resumes at ``start_round=rounds`` or later. Epsilon is read from the history as before. Its
    ``released_secret`` (one past the last round drawn from the operating system in secure mode)
    is restored as well: a resume continues after those rounds, which no seed can replay.

    Args:
        state_dict: A saved state.
        rounds: The rounds its history holds.

    Returns:
        The record (with ``released_any_seed`` and ``released_secret`` of the state, if any,
        restored).

    Raises:
        ValueError: one line naming the first malformed entry.
    """
    if "released" not in state_dict:
        record = ReleaseRecord()
        any_seed = rounds
    else:
        record = ReleaseRecord.from_state(state_dict["released"])
        saved = state_dict.get("released_any_seed", 0)
        any_seed = check_int("state_dict['released_any_seed']", saved, minimum=0, maximum=MAX_ROUND)
        if len(record) + any_seed < rounds:
            any_seed = max(any_seed, rounds)
        secret = state_dict.get("released_secret", 0)
        record.release_secret(
            check_int("state_dict['released_secret']", secret, minimum=0, maximum=MAX_ROUND)
        )
    record.release_any_seed(min(any_seed, MAX_ROUND))
    return record


def load_state(accountant: ReleasingAccountant, state_dict: Mapping[str, Any]) -> None:
    """Load ``state_dict`` into ``accountant`` (see :meth:`ShuffleAccountantBase.load_state_dict`).

    Args:
        accountant: The accountant.
        state_dict: Output of ``state_dict()``.

    Raises:
        ValueError: on a missing key, a different mechanism, a malformed history, an invalid
            entry or a configuration conflict (one line each).
    """
    if not isinstance(state_dict, Mapping) or not state_dict:
        raise ValueError(
            f"state_dict must be a non-empty mapping saved by {accountant.name}'s state_dict(). "
            f"Found {type(state_dict).__name__}."
        )
    for key in ("history", "mechanism", "population", "sensitivity", "method"):
        if key not in state_dict:
            raise ValueError(
                f"state_dict has no key {key!r}; it was not saved by {accountant.name}."
            )
    if state_dict["mechanism"] != accountant.mechanism():
        raise ValueError(
            f"state_dict of mechanism {state_dict['mechanism']!r} cannot be loaded into the "
            f"{accountant.name} accountant."
        )
    history = RoundLedger.from_state(state_dict["history"]).entries
    released = read_released(state_dict, sum(steps for _, _, steps in history))
    fresh = type(accountant)()
    if state_dict["population"] is not None:
        fresh.configure(
            population=state_dict["population"],
            sensitivity=state_dict["sensitivity"],
            method=state_dict["method"],
            sample_size=state_dict.get("sample_size"),
        )
        if accountant.population is not None:
            mine = (accountant.population, accountant.sensitivity, accountant.sample_size)
            theirs = (fresh.population, fresh.sensitivity, fresh.sample_size)
            if mine != theirs:
                raise ValueError(
                    f"checkpoint of the {accountant.name} accountant has (population, "
                    f"sensitivity, sample_size) = {theirs}, but this accountant is "
                    f"configured with {mine}."
                )
            if fresh.method != accountant.method:
                raise ValueError(
                    f"checkpoint of the {accountant.name} accountant was computed with "
                    f"{_method_text(fresh.method)}, but this accountant is configured with "
                    f"{_method_text(accountant.method)}; to switch, call configure(..., method="
                    f"{fresh.method!r}) before loading."
                )
    elif accountant.population is not None:
        fresh.configure(
            population=accountant.population,
            sensitivity=accountant.sensitivity,
            method=accountant.method,
            sample_size=accountant.sample_size,
        )
    for nm, rate, _ in history:
        fresh._check_step(nm, rate)
    if fresh.population is not None:
        fresh._check_rates(history, fresh.population, fresh.sample_size)
    rounds = sum(steps for _, _, steps in history)
    if rounds < len(accountant):
        warnings.warn(
            f"the {accountant.name} accountant held {len(accountant)} rounds and the loaded state "
            f"{rounds}: epsilon goes back to that state's, although the later rounds were "
            f"released. Load an earlier state only to train again from it, with new rounds.",
            HistoryRollbackWarning,
            stacklevel=3,
        )
    accountant.history = history
    # The record only grows: a round released before a rollback stays released.
    accountant.releases.merge(released)
    if fresh.population is not None:
        accountant.population = fresh.population
        accountant.sensitivity = fresh.sensitivity
        accountant.method = fresh.method
        accountant.sample_size = fresh.sample_size
