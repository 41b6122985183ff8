"""Batch samplers for the shuffle-model protocols: one batch = one round's clients, shuffled.

:class:`ShuffledCheckInSampler` (protocol ``checkin``) lets every client check in
independently with probability ``rate``, so a round may be empty; :class:`FixedSizeShuffledSampler`
(protocols ``subsampled`` and, with ``m = n``, ``full``) draws exactly ``m`` distinct clients.
Both are ``torch.utils.data.Sampler`` objects yielding lists of dataset indices (one index, one
client) in uniformly random order, as the shuffler's output would be. Round ``t`` is a function
of ``(seed, t)`` alone (numpy ``SeedSequence(seed, spawn_key=(t,))``), so a seed fixes every
round and ``start_round=t`` resumes on the same batches. Seeds lie in ``[0, 2**128 - 1]`` and
rounds in ``[0, 2**63 - 1]``, where no two pairs share their stream's input
(:data:`shuffle_opacus.engine.releases.MAX_SEED` says why; a larger seed would repeat another's
rounds). A sampler releases every round once: its cursor
:attr:`~ShuffleRoundSampler.next_round` never goes back, so a second ``for`` continues with new
rounds, and an accountant that follows the sampler records each round as it is released. Its
parameters are fixed once it is built. The generators (numpy's PCG64) are for simulation, not
cryptographically secure. With ``secure=True`` (what ``secure_mode=True`` builds) a sampler draws
every round from the operating system instead (:mod:`shuffle_opacus.common.secure_random`): no seed
is accepted, ``seed`` is a random label that keys the release records, and a round exists only as
it is drawn (``batch(t)`` draws fresh coins at every call).

Passes, cursors and why rounds are never replayed: docs/opacus.md, "Samplers".
"""

from __future__ import annotations

import abc
import math
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
from torch.utils.data import Sampler

from ..accounting.protocols import CheckIn, FixedSize, FullParticipation, Protocol, register_sampler
from ..common import secure_random
from ..common.validation import check_int, check_probability
from .releases import MAX_ROUND, check_seed

__all__ = ["ShuffleRoundSampler", "ShuffledCheckInSampler", "FixedSizeShuffledSampler"]


def _check_seed(seed: int | None) -> int:
    if seed is None:
        return int(np.random.SeedSequence().entropy)  # type: ignore[arg-type]
    return check_seed(seed)


#: Called with ``(t, batch)`` just before a sampler releases round ``t``.
ReleaseHook = Callable[[int, list[int]], None]


class ShuffleRoundSampler(Sampler[list[int]], abc.ABC):
    """Base class: passes of ``rounds`` batches of client indices, round ``t`` from ``(seed, t)``.

    Attributes:
        n: Number of clients (dataset size).
        rounds: Number of rounds of one pass (what ``len`` of a fresh sampler gives).
        seed: The seed in use (drawn from the OS when ``None`` was passed; read it to reproduce).
            With ``secure`` it is a random 128-bit label that keys the release records and
            draws nothing.
        seed_given: Whether the seed was given rather than drawn from the operating system's
            entropy. The guarantee needs the rounds' participants to be unknown to the
            adversary: with a given seed it holds only against whoever does not know the seed,
            so such a run is a reproducible simulation.
        start_round: The round the first iteration starts at (0 unless resuming).
        secure: Whether the rounds are drawn from the operating system's secure source
            (:mod:`shuffle_opacus.common.secure_random`) rather than numpy's PCG64 from ``(seed,
            t)``.
    """

    protocol: str = ""
    secure: bool = False
    #: Attributes that are fixed once the sampler is built.
    _FIXED: tuple[str, ...] = ("n", "rounds", "seed", "seed_given", "start_round", "secure")
    # The round state, set only through object.__setattr__ (see __setattr__).
    _next_round: int
    _released: int
    _release_hook: ReleaseHook | None

    def __init__(
        self, n: int, rounds: int, seed: int | None, start_round: int, secure: bool = False
    ) -> None:
        """Validate the common arguments (see the subclasses)."""
        if not isinstance(secure, bool):
            raise ValueError(f"secure must be True or False. Found {secure!r}.")
        if secure and seed is not None:
            raise ValueError(
                f"seed must be None with secure=True (secure_mode): the operating system's "
                f"coins cannot be seeded. Found {seed!r}."
            )
        self.n = check_int("n", n, minimum=1)
        self.rounds = check_int("rounds", rounds, minimum=1)
        self.seed = secure_random.label() if secure else _check_seed(seed)
        self.seed_given = seed is not None
        self.secure = secure
        self.start_round = check_int("start_round", start_round, minimum=0, maximum=MAX_ROUND)
        object.__setattr__(self, "_next_round", self.start_round)
        object.__setattr__(self, "_released", 0)
        object.__setattr__(self, "_release_hook", None)

    def __setattr__(self, name: str, value: Any) -> None:
        """Set an attribute; the protocol's parameters cannot be changed once set.

        Raises:
            AttributeError: for a parameter that is already set, or the private round state.
        """
        if name in type(self)._FIXED and name in self.__dict__:
            raise AttributeError(
                f"{name} of a {type(self).__name__} is fixed once it is built (an accountant "
                f"may already follow its rounds); build a new sampler instead."
            )
        if name in ("_next_round", "_released", "_release_hook"):
            raise AttributeError(f"{name} is the sampler's own round state; it cannot be set.")
        super().__setattr__(name, value)

    def __delattr__(self, name: str) -> None:
        """Refuse to delete a parameter or the round state.

        Raises:
            AttributeError: always for those names.
        """
        if name in type(self)._FIXED or name in ("_next_round", "_released", "_release_hook"):
            raise AttributeError(f"{name} of a {type(self).__name__} cannot be deleted.")
        super().__delattr__(name)

    def __copy__(self) -> ShuffleRoundSampler:
        """Copy a sampler that no accountant follows; refuse to copy one that is followed.

        A copy of a followed sampler would release the same rounds a second time.

        Raises:
            TypeError: if a release hook is attached.
        """
        return self._copy()

    def __deepcopy__(self, memo: dict[int, Any]) -> ShuffleRoundSampler:
        """As :meth:`__copy__` (the sampler holds no mutable containers to copy deeply).

        Raises:
            TypeError: if a release hook is attached.
        """
        return self._copy()

    def __reduce_ex__(self, protocol: Any) -> Any:
        """Pickle a sampler that no accountant follows; refuse one that is followed.

        Raises:
            TypeError: if a release hook is attached (the copy would replay its rounds).
        """
        if self._release_hook is not None:
            raise TypeError(
                f"a {type(self).__name__} that an accountant follows cannot be pickled: the copy "
                f"would release the same rounds (the same check-ins) a second time."
            )
        return super().__reduce_ex__(protocol)

    def _copy(self) -> ShuffleRoundSampler:
        if self._release_hook is not None:
            raise TypeError(
                f"a {type(self).__name__} that an accountant follows cannot be copied: the copy "
                f"would release the same rounds (the same check-ins) a second time."
            )
        clone = object.__new__(type(self))
        for key, value in self.__dict__.items():
            object.__setattr__(clone, key, value)
        return clone

    @property
    def next_round(self) -> int:
        """The round the next iteration starts with (0-based); it only ever grows."""
        return self._next_round

    @property
    def released(self) -> int:
        """Number of rounds this sampler has released since it was built."""
        return self._released

    @property
    def release_hook(self) -> ReleaseHook | None:
        """The callable told of every round released (``None`` until one is attached)."""
        return self._release_hook

    def attach_release_hook(self, hook: ReleaseHook) -> None:
        """Call ``hook(t, batch)`` just before each round ``t`` is released.

        :func:`shuffle_opacus.make_private` attaches the accountant here, so that every round
        the sampler hands out is accounted. If the hook raises, the round is not released.

        Args:
            hook: The callable.

        Raises:
            ValueError: if a hook is already attached (a sampler feeds one accountant), or
                ``hook`` is not callable.
        """
        if not callable(hook):
            raise ValueError(f"hook must be callable. Found {hook!r}.")
        if self._release_hook is not None:
            raise ValueError(
                f"this {type(self).__name__} already reports its rounds to an accountant; a "
                f"sampler can feed only one (build a new sampler for another run)."
            )
        object.__setattr__(self, "_release_hook", hook)

    @property
    @abc.abstractmethod
    def sample_rate(self) -> float:
        """Per-round inclusion probability of one client."""

    @property
    def sample_size(self) -> int | None:
        """Clients in every round when that number is fixed (``m``), else ``None`` (check-in)."""
        return None

    @property
    def expected_batch_size(self) -> float:
        """Expected number of clients per round."""
        return self.n * self.sample_rate

    def empty_round_probability(self, rounds: int) -> float:
        """Return the probability that at least one of ``rounds`` rounds has no client.

        A sampler of fixed size ``m >= 1`` never draws an empty round; the base class assumes
        the worst (1) for one whose size varies, and :class:`ShuffledCheckInSampler` computes it.

        Args:
            rounds: Number of rounds (integer >= 0).

        Returns:
            A probability in ``[0, 1]``.

        Raises:
            ValueError: if ``rounds`` is not an integer >= 0.
        """
        rounds = check_int("rounds", rounds, minimum=0)
        return 0.0 if self.sample_size is not None or rounds == 0 else 1.0

    def _rng(self, t: int) -> np.random.Generator:
        seq = np.random.SeedSequence(self.seed, spawn_key=(t,))
        return np.random.Generator(np.random.PCG64(seq))

    @abc.abstractmethod
    def _draw(self, rng: np.random.Generator) -> np.ndarray:
        """Return one round's client indices, shuffled, drawn from ``rng``."""

    @abc.abstractmethod
    def _draw_secure(self) -> np.ndarray:
        """Return one round's client indices, shuffled, drawn from the operating system."""

    def batch(self, t: int) -> list[int]:
        """Return the clients of round ``t`` (0-based), in shuffled order.

        A pure function of ``(seed, t)``: it releases nothing (no hook is called, the cursor
        does not move). A ``secure`` sampler draws fresh coins from the operating system at
        every call instead: its round ``t`` is whatever the call that released it drew.

        Raises:
            ValueError: if ``t`` is not an integer >= 0.
        """
        t = check_int("t", t, minimum=0, maximum=MAX_ROUND)
        if self.secure:
            return self._draw_secure().tolist()
        return self._draw(self._rng(t)).tolist()

    def _describe_seed(self) -> str:
        return "secure=True" if self.secure else f"seed={self.seed}"

    def _pass_end(self) -> int:
        """Return the round after the cursor's pass (a whole new pass at a boundary)."""
        return (self._next_round // self.rounds + 1) * self.rounds

    def __iter__(self) -> Iterator[list[int]]:
        """Yield the remaining rounds of the current pass, each released once.

        Starts at :attr:`next_round` and stops at the end of its pass (a multiple of
        ``rounds``); the cursor moves past each round as it is released, so a later iteration
        continues with new rounds.
        """
        end = self._pass_end()
        while self._next_round < end:
            t = self._next_round
            object.__setattr__(self, "_next_round", t + 1)
            batch = self.batch(t)
            if self._release_hook is not None:
                self._release_hook(t, batch)
            object.__setattr__(self, "_released", self._released + 1)
            yield batch

    def __len__(self) -> int:
        """Return the number of batches the next iteration yields (the rest of the pass)."""
        return self._pass_end() - self._next_round


class ShuffledCheckInSampler(ShuffleRoundSampler):
    """Each of ``n`` clients checks in with probability ``rate`` per round, independently.

    Example:
        >>> sampler = ShuffledCheckInSampler(n=1000, rate=0.01, rounds=5, seed=0)
        >>> len(sampler), len(sampler.batch(0)) <= 1000
        (5, True)
    """

    protocol = "checkin"
    _FIXED = (*ShuffleRoundSampler._FIXED, "rate")

    def __init__(
        self,
        n: int,
        rate: float,
        rounds: int,
        seed: int | None = None,
        *,
        start_round: int = 0,
        secure: bool = False,
    ) -> None:
        """Create the sampler.

        Args:
            n: Number of clients (integer >= 1).
            rate: Check-in probability gamma in ``(0, 1]``.
            rounds: Rounds of one pass (integer >= 1); a fresh sampler has ``len == rounds``.
            seed: Integer in ``[0, 2**128 - 1]``; ``None`` draws one from the OS (kept in
                ``self.seed``).
            start_round: Resume from this round (integer >= 0).
            secure: Flip the coins and shuffle with the operating system's secure source
                (then ``seed`` must be ``None``).

        Raises:
            ValueError: on an out-of-range argument, or a seed with ``secure=True``.
        """
        super().__init__(n, rounds, seed, start_round, secure)
        self.rate = check_probability("rate", rate)

    @property
    def sample_rate(self) -> float:
        """The check-in probability."""
        return self.rate

    def empty_round_probability(self, rounds: int) -> float:
        """Return ``1 - (1 - (1 - rate)**n)**rounds``: some round among ``rounds`` is empty.

        Args:
            rounds: Number of rounds (integer >= 0).

        Returns:
            The probability (0 when ``rate == 1``).

        Raises:
            ValueError: if ``rounds`` is not an integer >= 0.
        """
        rounds = check_int("rounds", rounds, minimum=0)
        if self.rate == 1.0 or rounds == 0:
            return 0.0
        empty = math.exp(self.n * math.log1p(-self.rate))  # one round's
        if empty >= 1.0:  # rate below the float's resolution: every round empty, up to rounding
            return 1.0
        return -math.expm1(rounds * math.log1p(-empty))

    def _draw(self, rng: np.random.Generator) -> np.ndarray:
        chosen = np.flatnonzero(rng.random(self.n) < self.rate)
        return rng.permutation(chosen)

    def _draw_secure(self) -> np.ndarray:
        chosen = np.flatnonzero(secure_random.bernoulli(self.n, self.rate))
        return chosen[secure_random.sample(chosen.size, chosen.size)]

    def __repr__(self) -> str:
        """Constructor-style representation."""
        return (
            f"ShuffledCheckInSampler(n={self.n}, rate={self.rate}, rounds={self.rounds}, "
            f"{self._describe_seed()}, start_round={self.start_round}, "
            f"next_round={self.next_round})"
        )


class FixedSizeShuffledSampler(ShuffleRoundSampler):
    """Exactly ``m`` of ``n`` clients per round, without replacement, in random order.

    With ``m == n`` every client reports every round (the ``full`` protocol of the ``shuffle``
    accountant).
    """

    _FIXED = (*ShuffleRoundSampler._FIXED, "m")

    def __init__(
        self,
        n: int,
        m: int,
        rounds: int,
        seed: int | None = None,
        *,
        start_round: int = 0,
        secure: bool = False,
    ) -> None:
        """Create the sampler.

        Args:
            n: Number of clients (integer >= 1).
            m: Clients per round (integer in ``[1, n]``).
            rounds: Rounds of one pass (integer >= 1).
            seed: Integer in ``[0, 2**128 - 1]``; ``None`` draws one from the OS (kept in
                ``self.seed``).
            start_round: Resume from this round (integer >= 0).
            secure: Draw the cohort with the operating system's secure source (then ``seed``
                must be ``None``).

        Raises:
            ValueError: on an out-of-range argument (``m > n`` included), or a seed with
                ``secure=True``.
        """
        super().__init__(n, rounds, seed, start_round, secure)
        self.m = check_int("m", m, minimum=1, maximum=self.n)

    @property
    def protocol(self) -> str:  # type: ignore[override]
        """``full`` when ``m == n``, else ``subsampled``."""
        return "full" if self.m == self.n else "subsampled"

    @property
    def sample_rate(self) -> float:
        """``m / n``."""
        return self.m / self.n

    @property
    def sample_size(self) -> int:
        """``m``, the clients of every round."""
        return self.m

    def _draw(self, rng: np.random.Generator) -> np.ndarray:
        return rng.permutation(self.n)[: self.m]

    def _draw_secure(self) -> np.ndarray:
        return secure_random.sample(self.n, self.m)

    def __repr__(self) -> str:
        """Constructor-style representation."""
        return (
            f"FixedSizeShuffledSampler(n={self.n}, m={self.m}, rounds={self.rounds}, "
            f"{self._describe_seed()}, start_round={self.start_round}, "
            f"next_round={self.next_round})"
        )


def _full_sampler(
    protocol: Protocol, n: int, *, rate: float | None, sample_size: int | None, rounds: int,
    seed: int | None, start_round: int, secure: bool = False,
) -> FixedSizeShuffledSampler:  # fmt: skip
    return FixedSizeShuffledSampler(n, n, rounds, seed, start_round=start_round, secure=secure)


def _fixed_size_sampler(
    protocol: Protocol, n: int, *, rate: float | None, sample_size: int | None, rounds: int,
    seed: int | None, start_round: int, secure: bool = False,
) -> FixedSizeShuffledSampler:  # fmt: skip
    m = n if sample_size is None else int(sample_size)
    return FixedSizeShuffledSampler(n, m, rounds, seed, start_round=start_round, secure=secure)


def _checkin_sampler(
    protocol: Protocol, n: int, *, rate: float | None, sample_size: int | None, rounds: int,
    seed: int | None, start_round: int, secure: bool = False,
) -> ShuffledCheckInSampler:  # fmt: skip
    if rate is None:
        raise ValueError("rate is required by the checkin protocol (a probability in (0, 1]).")
    return ShuffledCheckInSampler(n, rate, rounds, seed, start_round=start_round, secure=secure)


# The accounting layer's protocols build their samplers here (it never imports torch).
register_sampler(FullParticipation, _full_sampler)
register_sampler(FixedSize, _fixed_size_sampler)
register_sampler(CheckIn, _checkin_sampler)
