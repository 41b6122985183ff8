"""The rounds an accountant has seen released, so that no round is released (and counted) twice.

A round's participants are a function of the sampler's seed and the round's index
(:mod:`shuffle_opacus.engine.sampling`). Releasing the pair ``(seed, t)`` a second time reuses the
same check-in set, which composition of independent rounds does not cover: the accountant would
count it as a fresh round while the adversary sees a correlated one. A :class:`ReleaseRecord`
keeps the released pairs of one accountant as half-open intervals of rounds per seed; the
accountant refuses a pair it already holds before anything is released.

A state saved without a record (before it existed, or edited) says how many rounds were released
but not which: its ``L`` rounds might be any rounds of any seed. The record keeps them as rounds
released under an unknown seed (:attr:`ReleaseRecord.any_seed`): rounds ``0 .. L - 1`` of every
seed count as released, so a restart at ``start_round=0`` with the same seed is refused and
training continues at ``start_round=L`` (the rounds an earlier run of the package released from
round 0 on).

A round drawn from the operating system (a ``secure`` sampler, ``secure_mode=True``) has no seed
that could replay it; its sampler's ``seed`` is only a random label. So that a resume never
releases its index again, whatever label or seed it uses, such a round ``t`` makes rounds
``0 .. t`` of every seed count as released (:attr:`ReleaseRecord.secret`, saved as
``released_secret``): a run resumes after the last round it drew from the operating system.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol

from ..common.validation import check_int, describe_value

__all__ = [
    "MAX_ROUND",
    "MAX_SEED",
    "ReleaseRecord",
    "ReleasingAccountant",
    "ReplayError",
    "check_seed",
]

#: Largest round index a sampler may release (the rounds' seeds are 64-bit spawn keys).
MAX_ROUND = 2**63 - 1

#: Largest seed a sampler (and a saved state) accepts. Round ``t`` of seed ``s`` is the stream
#: of numpy's ``SeedSequence(s, spawn_key=(t,))``, which hashes the 32-bit words of ``s``, padded
#: with zeros to four words, followed by the words of ``t``. For ``s < 2**128`` and
#: ``t <= MAX_ROUND`` those inputs are distinct for distinct pairs: four words of seed, then
#: one word of round (``t < 2**32``) or two whose second is not zero. A larger seed fills a fifth
#: word and shares its input with a smaller one (seed ``2**128`` at round ``r`` is seed 0 at round
#: ``1 + r * 2**32``: the same check-ins), so it is refused. Distinct inputs still meet in the
#: 128-bit hash only by chance, as two seeds drawn from the OS would (about ``2**-128`` a pair).
MAX_SEED = 2**128 - 1


def check_seed(value: object, name: str = "seed") -> int:
    """Return ``value`` as ``int`` if it is a seed samplers accept (integer in ``[0, 2**128 - 1]``).

    Args:
        value: The seed.
        name: How the message names it.

    Returns:
        The seed.

    Raises:
        ValueError: one line naming ``name`` and the range, otherwise (see :data:`MAX_SEED`).
    """
    try:
        return check_int(name, value, minimum=0, maximum=MAX_SEED)
    except ValueError:
        raise ValueError(
            f"{name} must be an integer in [0, 2**128 - 1] (a larger seed repeats the rounds of a "
            f"smaller one in numpy's SeedSequence). Found {describe_value(value)}."
        ) from None


class ReplayError(ValueError):
    """A round ``(seed, t)`` that was released already would be released again."""


class ReleaseRecord:
    """Released rounds per seed, as sorted disjoint half-open intervals ``[start, stop)``."""

    def __init__(self) -> None:
        """Create an empty record."""
        self._runs: dict[int, list[list[int]]] = {}
        self._any_seed = 0
        self._secret = 0

    def __len__(self) -> int:
        """Return the number of released rounds recorded with their seed (not :attr:`any_seed`)."""
        return sum(stop - start for runs in self._runs.values() for start, stop in runs)

    @property
    def any_seed(self) -> int:
        """``L``: rounds ``0 .. L - 1`` of every seed count as released (see the module docstring).

        0 unless a state without a release record was loaded.
        """
        return self._any_seed

    @property
    def secret(self) -> int:
        """``S``: one past the last round drawn from the operating system (0 if none was).

        Rounds ``0 .. S - 1`` of every seed count as released (see the module docstring).
        """
        return self._secret

    @property
    def floor(self) -> int:
        """Rounds below this count as released for every seed: ``max(any_seed, secret)``."""
        return max(self._any_seed, self._secret)

    def release_secret(self, rounds: int) -> None:
        """Count rounds ``0 .. rounds - 1`` of every seed as released (the record only grows).

        Args:
            rounds: One past the last round drawn from the operating system (integer >= 0).

        Raises:
            ValueError: if ``rounds`` is not an integer in ``[0, MAX_ROUND]``.
        """
        rounds = check_int("rounds", rounds, minimum=0, maximum=MAX_ROUND)
        self._secret = max(self._secret, rounds)

    def release_any_seed(self, rounds: int) -> None:
        """Count rounds ``0 .. rounds - 1`` of every seed as released (the record only grows).

        Args:
            rounds: Rounds released under a seed nobody recorded (integer >= 0).

        Raises:
            ValueError: if ``rounds`` is not an integer in ``[0, MAX_ROUND]``.
        """
        rounds = check_int("rounds", rounds, minimum=0, maximum=MAX_ROUND)
        self._any_seed = max(self._any_seed, rounds)

    def first_released(self, seed: int, start: int, stop: int) -> int | None:
        """Return the first released round of ``seed`` in ``[start, stop)``, or ``None``.

        Args:
            seed: The sampler's seed.
            start: First round of the range.
            stop: One past the last round of the range.

        Returns:
            The smallest released round in the range, or ``None`` if none is.
        """
        if start < self.floor and start < stop:
            return start
        for run_start, run_stop in self._runs.get(seed, ()):
            if run_stop > start and run_start < stop:
                return max(run_start, start)
        return None

    def next_free(self, seed: int, start: int) -> int:
        """Return the first round ``>= start`` of ``seed`` that was not released.

        Args:
            seed: The sampler's seed.
            start: Where to look from.

        Returns:
            That round.
        """
        start = max(start, self.floor)
        for run_start, run_stop in self._runs.get(seed, ()):
            if run_start <= start < run_stop:
                return run_stop
        return start

    def add(self, seed: int, t: int) -> None:
        """Record round ``t`` of ``seed`` as released.

        Args:
            seed: The sampler's seed.
            t: The round.

        Raises:
            ReplayError: if the round was released already (nothing is changed then).
        """
        if t < self._any_seed:
            raise ReplayError(
                f"round {t} of seed {seed} may have been released already: the accountant "
                f"loaded {self._any_seed} rounds from a state without a release record, so "
                f"rounds 0..{self._any_seed - 1} of every seed count as released; continue "
                f"with start_round={self.floor} or later."
            )
        if t < self._secret:
            raise ReplayError(
                f"round {t} of seed {seed} counts as released: rounds up to {self._secret - 1} "
                f"were drawn from the operating system (secure mode), which no seed replays, so "
                f"rounds 0..{self._secret - 1} of every seed count as released; continue with "
                f"start_round={self.floor} or later."
            )
        runs = self._runs.setdefault(seed, [])
        i = bisect.bisect_right(runs, [t, MAX_ROUND + 1])
        if i > 0 and runs[i - 1][1] > t:
            raise ReplayError(
                f"round {t} of seed {seed} was released already; releasing it again would "
                f"reuse its check-ins, which the accountant cannot count as a new round."
            )
        if i > 0 and runs[i - 1][1] == t:
            runs[i - 1][1] = t + 1
            if i < len(runs) and runs[i][0] == t + 1:
                runs[i - 1][1] = runs[i][1]
                del runs[i]
        elif i < len(runs) and runs[i][0] == t + 1:
            runs[i][0] = t
        else:
            runs.insert(i, [t, t + 1])

    def merge(self, other: ReleaseRecord) -> None:
        """Add every round of ``other`` (a union; rounds held by both are kept once).

        Args:
            other: Another record.
        """
        self._any_seed = max(self._any_seed, other._any_seed)
        self._secret = max(self._secret, other._secret)
        for seed, runs in other._runs.items():
            merged = sorted([*self._runs.get(seed, []), *([a, b] for a, b in runs)])
            out: list[list[int]] = []
            for start, stop in merged:
                if out and start <= out[-1][1]:
                    out[-1][1] = max(out[-1][1], stop)
                else:
                    out.append([start, stop])
            self._runs[seed] = out

    def state(self) -> list[list[int]]:
        """Return the record as ``[seed, start, stop]`` triples (for a state dict).

        Returns:
            The triples, sorted.
        """
        return [[seed, a, b] for seed in sorted(self._runs) for a, b in self._runs[seed]]

    @classmethod
    def from_state(cls, raw: object, where: str = "state_dict['released']") -> ReleaseRecord:
        """Rebuild a record from :meth:`state`; every entry is checked.

        Args:
            raw: A sequence of ``[seed, start, stop]`` triples.
            where: Name of the value, for messages.

        Returns:
            The record.

        Raises:
            ValueError: one line naming the first malformed entry.
        """
        if isinstance(raw, (str, bytes, Mapping)) or not isinstance(raw, Iterable):
            raise ValueError(
                f"{where} must be a list of [seed, start, stop] triples. Found "
                f"{type(raw).__name__}."
            )
        record = cls()
        entries: dict[int, list[list[int]]] = {}
        for i, entry in enumerate(raw):
            if isinstance(entry, (str, bytes)) or not isinstance(entry, Iterable):
                raise ValueError(f"{where}[{i}] must be a [seed, start, stop] triple.")
            values = list(entry)
            if len(values) != 3:
                raise ValueError(f"{where}[{i}] must be a [seed, start, stop] triple.")
            seed = check_seed(values[0], f"{where}[{i}] seed")
            start = check_int(f"{where}[{i}] start", values[1], minimum=0, maximum=MAX_ROUND)
            stop = check_int(f"{where}[{i}] stop", values[2], minimum=start + 1, maximum=MAX_ROUND)
            entries.setdefault(seed, []).append([start, stop])
        staged = cls()
        staged._runs = entries
        record.merge(staged)
        return record


class ReleasingAccountant(Protocol):
    """What the state, registry and step-guard modules need of a shuffle accountant.

    :class:`~shuffle_opacus.engine.accountants.ShuffleAccountantBase` satisfies it; the modules that
    serve it annotate with this protocol instead of importing the class, so that none of them
    imports :mod:`shuffle_opacus.engine.accountants` (which imports them).
    """

    name: str
    history: list[tuple[float, float, int]]
    population: int | None
    sensitivity: float
    method: str | None
    sample_size: int | None
    releases: ReleaseRecord

    def mechanism(self) -> str:
        """Return the mechanism's name in the mechanism table."""
        ...

    def spec(self) -> Any:
        """Return the protocol (:class:`~shuffle_opacus.accounting.protocols.Protocol`)."""
        ...

    def configure(
        self,
        *,
        population: int,
        sensitivity: float | str = "replace-one",
        method: str | None = None,
        sample_size: int | None = None,
    ) -> Any:
        """Set the population, sensitivity, method and sample size."""
        ...

    def get_epsilon(self, delta: float, max_order: int | None = None) -> float:
        """Return epsilon at ``delta`` of the rounds recorded."""
        ...

    def __len__(self) -> int: ...

    def _require_configured(self, what: str) -> None: ...

    def _check_rates(
        self, history: Sequence[tuple[Any, Any, Any]], population: int, sample_size: int | None
    ) -> None: ...

    def _check_step(self, noise_multiplier: float, sample_rate: float) -> tuple[float, float]: ...

    def release(
        self,
        seed: int,
        t: int,
        *,
        noise_multiplier: float,
        sample_rate: float,
        secret: bool = False,
    ) -> None:
        """Record the release of round ``t`` of the sampler seeded ``seed``, once."""
        ...
