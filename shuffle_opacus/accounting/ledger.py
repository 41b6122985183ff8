"""The ledger of released rounds and their settings, shared by every layer that counts rounds.

A history is a list of ``(noise_multiplier, sample_rate, steps)`` entries, Opacus's format:
consecutive rounds with equal settings share one entry. :class:`RoundLedger` holds one, records
rounds into it, extends it hypothetically to more rounds, saves and loads it in the form the
accountants' ``state_dict`` has always used (the list itself), and answers epsilon through
:func:`shuffle_opacus.accounting.history.history_epsilon`, the one path from a history to epsilon,
keeping the last few results. The Opacus accountants (:mod:`.accountant_core`), the Flower
accountant (:mod:`.flower.accounting`, whose ledger is also its strategy's) and the experiment's
curves use it. It does not import torch.

A ledger may hold noiseless rounds (noise multiplier 0, which only the Flower accountant
records): :attr:`RoundLedger.rounds` counts them, and :meth:`RoundLedger.trivial_epsilon` says
that epsilon is then infinite, where no analysis applies. The analyses and :func:`read_history`
refuse them, so an Opacus accountant never holds one.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from copy import deepcopy

from ..analysis.rdp.conversion import EpsilonResult
from ..common.validation import MAX_INT, check_int, check_positive, check_probability
from .history import history_epsilon
from .protocols import HistoryEntry, Protocol

__all__ = ["HistoryEntry", "RoundLedger", "read_history"]

#: Results a ledger keeps by default (those of the current and the next round count).
CACHE_SIZE = 8


def read_history(raw: object, name: str = "state_dict['history']") -> list[HistoryEntry]:
    """Validate a saved history: a sequence of ``(noise_multiplier, sample_rate, steps)``.

    ``steps`` of an entry, and the rounds of all entries together, are at most
    :data:`~shuffle_opacus.common.validation.MAX_INT` (``2**62``, the largest count the
    analyses take), so ``len(accountant)`` and epsilon can be computed for what is loaded.

    Args:
        raw: The ``history`` of a saved state (or of an accountant).
        name: How messages name it.

    Returns:
        The entries as ``(float, float, int)`` triples.

    Raises:
        ValueError: one line naming the first malformed entry, or the total when the entries
            hold more than ``2**62`` rounds together.
    """
    if isinstance(raw, (str, bytes)) or not isinstance(raw, Sequence):
        raise ValueError(
            f"{name} must be a list of (noise_multiplier, sample_rate, steps) "
            f"entries. Found {type(raw).__name__}."
        )
    history = []
    rounds = 0
    for i, entry in enumerate(raw):
        where = f"{name}[{i}]"
        if isinstance(entry, (str, bytes)) or not isinstance(entry, Sequence) or len(entry) != 3:
            raise ValueError(
                f"{where} must be a (noise_multiplier, sample_rate, steps) triple. Found {entry!r}."
            )
        nm, rate, steps = entry
        history.append(
            (
                check_positive(f"{where} noise_multiplier", nm),
                check_probability(f"{where} sample_rate", rate),
                check_int(f"{where} steps", steps, minimum=0, maximum=MAX_INT),
            )
        )
        rounds += history[-1][2]
        if rounds > MAX_INT:
            raise ValueError(
                f"{name} must hold at most {MAX_INT} rounds in all (steps summed "
                f"over the entries). Found {rounds} by entry {i}."
            )
    return history


class RoundLedger:
    """A history of released rounds: record, count, extend, save, load, and its epsilon.

    Args:
        entries: The initial entries, kept as given (see :meth:`from_state` to validate).
        name: How messages name the history (``history`` for an accountant's).
        cache_size: Results :meth:`epsilon` keeps (0 keeps none); the oldest goes first.

    Raises:
        ValueError: for ``cache_size`` below 0.

    Attributes:
        entries: The ``(noise_multiplier, sample_rate, steps)`` entries, a plain list that
            callers may read (and an accountant's users may assign, checked when next counted).
    """

    def __init__(
        self,
        entries: Iterable[HistoryEntry] = (),
        *,
        name: str = "history",
        cache_size: int = CACHE_SIZE,
    ) -> None:
        self.entries: list[HistoryEntry] = list(entries)
        self.name = name
        self.cache_size = check_int("cache_size", cache_size, minimum=0)
        self._results: dict[tuple[object, ...], EpsilonResult] = {}

    def record(self, noise_multiplier: float, sample_rate: float, count: int = 1) -> None:
        """Record ``count`` rounds, merged into the last entry when its settings are equal.

        The values are stored as given; the caller validates them (an accountant's
        ``step`` or ``compose`` does).

        Args:
            noise_multiplier: The rounds' noise multiplier.
            sample_rate: The rounds' sample rate.
            count: How many identical rounds (1 by default).
        """
        entries = self.entries
        if entries and entries[-1][:2] == (noise_multiplier, sample_rate):
            entries[-1] = (noise_multiplier, sample_rate, entries[-1][2] + count)
        else:
            entries.append((noise_multiplier, sample_rate, count))

    @property
    def rounds(self) -> int:
        """Rounds the entries hold, noiseless ones included (their ``steps`` summed, unchecked)."""
        return int(sum(steps for _, _, steps in self.entries))

    def trivial_epsilon(self, history: Sequence[HistoryEntry] | None = None) -> float | None:
        """Return epsilon where no analysis is needed: 0 for no round, ``inf`` for a noiseless one.

        A round of noise multiplier 0 releases what it was given: no finite epsilon holds after
        it, whatever came before or comes after.

        Args:
            history: Entries to use instead of the held ones (e.g. from :meth:`extended`).

        Returns:
            ``0.0`` when the entries hold no round, ``math.inf`` when one of their rounds has
            noise multiplier 0, else ``None`` (then :meth:`epsilon` answers).
        """
        entries = self.entries if history is None else history
        if not any(steps for _, _, steps in entries):
            return 0.0
        if any(steps and noise == 0.0 for noise, _, steps in entries):
            return math.inf
        return None

    def checked(self) -> list[HistoryEntry]:
        """Return the entries validated (see :func:`read_history`), named by :attr:`name`.

        Raises:
            ValueError: one line naming the first malformed entry.
        """
        return read_history(self.entries, self.name)

    def extended(
        self,
        rounds: int,
        noise_multiplier: float,
        sample_rate: float,
        *,
        done: int | None = None,
    ) -> tuple[HistoryEntry, ...]:
        """Return the history extended with identical rounds to ``rounds`` (nothing recorded).

        The added rounds form one new entry after the held ones (never merged into the last).

        Args:
            rounds: Rounds of the extended history (at least ``done``).
            noise_multiplier: Noise multiplier of the added rounds.
            sample_rate: Sample rate of the added rounds.
            done: Rounds already held; :attr:`rounds` by default.

        Returns:
            The entries, then ``(noise_multiplier, sample_rate, rounds - done)`` if positive.

        Raises:
            ValueError: if ``rounds`` is not an integer of at least ``done``.
        """
        done = self.rounds if done is None else done
        rounds = check_int("rounds", rounds, minimum=done)
        history = tuple(self.entries)
        if rounds > done:
            history += ((noise_multiplier, sample_rate, rounds - done),)
        return history

    def to_state(self) -> list[HistoryEntry]:
        """Return a copy of the entries: the ``history`` of an accountant's ``state_dict``."""
        return deepcopy(self.entries)

    @classmethod
    def from_state(
        cls,
        raw: object,
        *,
        name: str = "state_dict['history']",
        cache_size: int = CACHE_SIZE,
    ) -> RoundLedger:
        """Return a ledger of a saved ``history`` (any state saved by the accountants loads).

        Args:
            raw: The saved entries.
            name: How messages name them.
            cache_size: As for the constructor.

        Returns:
            A ledger of the validated entries (``(float, float, int)`` triples), named
            ``history``.

        Raises:
            ValueError: one line naming the first malformed entry.
        """
        return cls(read_history(raw, name), cache_size=cache_size)

    def epsilon(
        self,
        *,
        protocol: str | Protocol,
        delta: float,
        population: int,
        sensitivity: float | str = "replace-one",
        method: str | None = None,
        reference: str | None = None,
        max_order: int | None = None,
        lower: bool = False,
        history: Sequence[HistoryEntry] | None = None,
    ) -> EpsilonResult:
        """Return :func:`~shuffle_opacus.accounting.history.history_epsilon` of the entries, kept.

        The last :attr:`cache_size` results are kept by all their arguments (the history as a
        tuple of its entries); the same question again returns the same result object.

        Args:
            protocol: As for ``history_epsilon``; so are ``delta``, ``population``,
                ``sensitivity``, ``method``, ``reference``, ``max_order`` and ``lower``.
            delta: Target delta.
            population: Number of clients ``n``.
            sensitivity: Sensitivity convention or value.
            method: Analysis method; ``None`` for the default.
            reference: A reference curve instead of a method.
            max_order: Optional cap on the Rényi order.
            lower: Also compute the optimistic estimate of a ``pld`` result.
            history: Entries to use instead of the held ones (e.g. from :meth:`extended`).

        Returns:
            The result, bit for bit that of ``history_epsilon``.

        Raises:
            ValueError: as ``history_epsilon``, on an invalid argument or entry.
        """
        entries = tuple(self.entries if history is None else history)
        name = protocol if isinstance(protocol, str) else protocol.name
        key = (name, delta, population, sensitivity, method, reference, max_order, lower, entries)
        kept = self.cache_size > 0 and _hashable(key)
        if kept and key in self._results:
            return self._results[key]
        result = history_epsilon(
            entries,
            protocol=protocol,
            delta=delta,
            population=population,
            sensitivity=sensitivity,
            method=method,
            reference=reference,
            max_order=max_order,
            lower=lower,
        )
        if kept:
            if len(self._results) >= self.cache_size:
                del self._results[next(iter(self._results))]
            self._results[key] = result
        return result


def _hashable(key: tuple[object, ...]) -> bool:
    """Whether ``key`` can be kept (a history assigned with list entries cannot)."""
    try:
        hash(key)
    except TypeError:
        return False
    return True
