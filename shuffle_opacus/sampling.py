"""Batch samplers for the shuffle-model protocols: one batch = one round's clients, shuffled.

Both samplers are ``torch.utils.data.Sampler`` objects yielding lists of dataset indices, for
``DataLoader(dataset, batch_sampler=...)``; one dataset index is one client. Round ``t``'s batch
is a function of ``(seed, t)`` alone (numpy ``SeedSequence(seed, spawn_key=(t,))``), so

* the same seed gives the same rounds, in any process, and iterating twice repeats them;
* a run resumed at round ``t`` (``start_round=t``) sees exactly the batches an uninterrupted
  run would have seen.

The generators are numpy's PCG64: good statistical randomness for simulations and experiments,
not a cryptographically secure source. A deployment draws check-ins on the clients' devices.

* :class:`ShuffledCheckInSampler` (protocol ``checkin``): every client checks in independently
  with probability ``rate``; batch sizes vary and a round may be empty. An empty round yields an
  empty list; with :func:`shuffle_opacus.make_private` that is a step with no reports, hence no
  noise and a zero gradient, and the accountant counts it (the check-in analysis includes it).
* :class:`FixedSizeShuffledSampler` (protocols ``subsampled`` and, with ``m = n``, ``full``):
  exactly ``m`` distinct clients per round.

Within a batch the order is uniformly random, as the shuffler's output would be.
"""

from __future__ import annotations

import abc
from collections.abc import Iterator

import numpy as np
from torch.utils.data import Sampler

from .analysis._validation import check_int, check_probability

__all__ = ["ShuffleRoundSampler", "ShuffledCheckInSampler", "FixedSizeShuffledSampler"]


def _check_seed(seed: int | None) -> int:
    if seed is None:
        return int(np.random.SeedSequence().entropy)  # type: ignore[arg-type]
    return check_int("seed", seed, minimum=0)


class ShuffleRoundSampler(Sampler[list[int]], abc.ABC):
    """Base class: ``rounds`` batches of client indices, round ``t`` derived from ``(seed, t)``.

    Attributes:
        n: Number of clients (dataset size).
        rounds: Total number of rounds.
        seed: The seed in use (drawn from the OS when ``None`` was passed; read it to reproduce).
        start_round: First round produced by iteration (0 unless resuming).
    """

    protocol: str = ""

    def __init__(self, n: int, rounds: int, seed: int | None, start_round: int) -> None:
        """Validate the common arguments (see the subclasses)."""
        self.n = check_int("n", n, minimum=1)
        self.rounds = check_int("rounds", rounds, minimum=1)
        self.seed = _check_seed(seed)
        self.start_round = check_int("start_round", start_round, minimum=0, maximum=self.rounds)

    @property
    @abc.abstractmethod
    def sample_rate(self) -> float:
        """Per-round inclusion probability of one client."""

    @property
    def expected_batch_size(self) -> float:
        """Expected number of clients per round."""
        return self.n * self.sample_rate

    def _rng(self, t: int) -> np.random.Generator:
        seq = np.random.SeedSequence(self.seed, spawn_key=(t,))
        return np.random.Generator(np.random.PCG64(seq))

    @abc.abstractmethod
    def _draw(self, rng: np.random.Generator) -> np.ndarray:
        """Return one round's client indices, shuffled, drawn from ``rng``."""

    def batch(self, t: int) -> list[int]:
        """Return the clients of round ``t`` (0-based), in shuffled order.

        Raises:
            ValueError: if ``t`` is not in ``[0, rounds)``.
        """
        t = check_int("t", t, minimum=0, maximum=self.rounds - 1)
        return self._draw(self._rng(t)).tolist()

    def __iter__(self) -> Iterator[list[int]]:
        """Yield the batches of rounds ``start_round .. rounds - 1``."""
        for t in range(self.start_round, self.rounds):
            yield self.batch(t)

    def __len__(self) -> int:
        """Return the number of batches iteration yields: ``rounds - start_round``."""
        return self.rounds - self.start_round


class ShuffledCheckInSampler(ShuffleRoundSampler):
    """Each of ``n`` clients checks in with probability ``rate`` per round, independently.

    Example:
        >>> sampler = ShuffledCheckInSampler(n=1000, rate=0.01, rounds=5, seed=0)
        >>> len(sampler), len(sampler.batch(0)) <= 1000
        (5, True)
    """

    protocol = "checkin"

    def __init__(
        self, n: int, rate: float, rounds: int, seed: int | None = None, *, start_round: int = 0
    ) -> None:
        """Create the sampler.

        Args:
            n: Number of clients (integer >= 1).
            rate: Check-in probability gamma in ``(0, 1]``.
            rounds: Number of rounds (integer >= 1); ``len(sampler) == rounds``.
            seed: Integer >= 0; ``None`` draws one from the OS (kept in ``self.seed``).
            start_round: Resume from this round (in ``[0, rounds]``).

        Raises:
            ValueError: on an out-of-range argument.
        """
        super().__init__(n, rounds, seed, start_round)
        self.rate = check_probability("rate", rate)

    @property
    def sample_rate(self) -> float:
        """The check-in probability."""
        return self.rate

    def _draw(self, rng: np.random.Generator) -> np.ndarray:
        chosen = np.flatnonzero(rng.random(self.n) < self.rate)
        return rng.permutation(chosen)

    def __repr__(self) -> str:
        """Constructor-style representation."""
        return (
            f"ShuffledCheckInSampler(n={self.n}, rate={self.rate}, rounds={self.rounds}, "
            f"seed={self.seed}, start_round={self.start_round})"
        )


class FixedSizeShuffledSampler(ShuffleRoundSampler):
    """Exactly ``m`` of ``n`` clients per round, without replacement, in random order.

    With ``m == n`` every client reports every round (the ``full`` protocol of the ``shuffle``
    accountant).
    """

    def __init__(
        self, n: int, m: int, rounds: int, seed: int | None = None, *, start_round: int = 0
    ) -> None:
        """Create the sampler.

        Args:
            n: Number of clients (integer >= 1).
            m: Clients per round (integer in ``[1, n]``).
            rounds: Number of rounds (integer >= 1).
            seed: Integer >= 0; ``None`` draws one from the OS (kept in ``self.seed``).
            start_round: Resume from this round (in ``[0, rounds]``).

        Raises:
            ValueError: on an out-of-range argument (``m > n`` included).
        """
        super().__init__(n, rounds, seed, start_round)
        self.m = check_int("m", m, minimum=1, maximum=self.n)

    @property
    def protocol(self) -> str:  # type: ignore[override]
        """``full`` when ``m == n``, else ``subsampled``."""
        return "full" if self.m == self.n else "subsampled"

    @property
    def sample_rate(self) -> float:
        """``m / n``."""
        return self.m / self.n

    def _draw(self, rng: np.random.Generator) -> np.ndarray:
        return rng.permutation(self.n)[: self.m]

    def __repr__(self) -> str:
        """Constructor-style representation."""
        return (
            f"FixedSizeShuffledSampler(n={self.n}, m={self.m}, rounds={self.rounds}, "
            f"seed={self.seed}, start_round={self.start_round})"
        )
