"""Tie every optimizer step to the one round of the private loader whose batch it processes.

The accountant records a round when the sampler releases it. A step must then process exactly
that round's batch, once: a step on a batch from elsewhere, or a second step on one round, would
release data the accountant never saw. A :class:`StepGuard` follows the rounds from release
(the sampler hands out the clients) to delivery (the private loader yields the batch; with
worker processes the sampler runs ahead of the loader) to the step, and refuses a step

* when no delivered round is waiting (more steps than batches, or a loader built elsewhere),
* when the current round was stepped already (a skipped round does not carry over), or
* when the step's per-sample contributions differ in number from the round's batch.

A round released but never stepped stays accounted; that costs privacy budget, not safety.

Each iteration over a private loader keeps its own queue of the rounds it released: worker
processes fetch rounds ahead of the loop, and a loop left early (``break``) abandons the rounds
its workers had fetched; a new loop then starts with its own queue, so its batches and its
rounds stay paired (the abandoned rounds stay accounted, and the loader warns about them).
Code that iterates the sampler itself (indexing tensors with its batches, as the experiment
runner does) receives each batch as the sampler releases it: a round released outside a
loader's iteration is current at once.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from ..common.validation import check_positive, check_probability

if TYPE_CHECKING:
    from .releases import ReleasingAccountant

__all__ = ["HELPER_HINT", "RoundQueue", "StepGuard", "follow_sampler"]

HELPER_HINT = (
    "use shuffle_opacus.make_private(engine, ...) (or shuffle_opacus.make_private_with_epsilon), "
    "which adds each client's local noise and configures the accountant"
)
"""How to give an accountant local noise (named in the errors of the accountants and the guard)."""

#: Rounds ``(t, size)`` one loader iteration released and has not delivered yet, oldest first.
RoundQueue = deque[tuple[int, int]]


class StepGuard:
    """Released, delivered and stepped rounds of one private loader.

    Attributes:
        name: The accountant's name, for messages.
        released: Rounds released so far.
        stepped: Steps accepted so far.
    """

    def __init__(self, name: str) -> None:
        """Create a guard with nothing released.

        Args:
            name: The accountant's name, for messages.
        """
        self.name = name
        self.released = 0
        self.stepped = 0
        self._collector: RoundQueue | None = None
        self._current: tuple[int, int] | None = None
        self._current_stepped = True

    def on_release(self, t: int, size: int) -> None:
        """Note that round ``t`` with ``size`` clients was released (sampler side).

        Inside :meth:`collecting` the round joins that loader iteration's queue, to become
        current when the iteration yields its batch; otherwise it is current at once.

        Args:
            t: The round.
            size: Its number of clients.
        """
        self.released += 1
        if self._collector is not None:
            self._collector.append((t, size))
        else:
            self._current = (t, size)
            self._current_stepped = False

    @contextmanager
    def collecting(self, queue: RoundQueue) -> Iterator[None]:
        """Send the rounds released inside the ``with`` block to ``queue``.

        A private loader wraps every call into its torch iterator in this block: the rounds
        that call makes the sampler release (a worker's prefetch included) belong to that
        iteration, whichever other iteration is open.

        Args:
            queue: The iteration's queue.
        """
        outer, self._collector = self._collector, queue
        try:
            yield
        finally:
            self._collector = outer

    def on_deliver(self, queue: RoundQueue) -> None:
        """Note that a loader iteration yielded its oldest queued round's batch: it is current.

        Args:
            queue: That iteration's queue (filled inside :meth:`collecting`).
        """
        if queue:
            self._current = queue.popleft()
        else:  # a batch without a released round: the next step has nothing to process
            self._current = None
        self._current_stepped = False

    def check_step(self, reports: int) -> int:
        """Accept one step of ``reports`` per-sample contributions on the current round.

        Args:
            reports: Per-sample contributions accumulated since the previous step.

        Returns:
            The round the step processes.

        Raises:
            ValueError: if no delivered round waits for a step, the current round was stepped
                already, or ``reports`` differs from the round's batch size (nothing is
                recorded then).
        """
        if self._current is None:
            raise ValueError(
                f"optimizer.step() #{self.stepped + 1} has no round to process: the private data "
                f"loader has delivered no batch ({self.released} rounds released). Step once per "
                f"batch of "
                f"the loader returned by shuffle_opacus.make_private; batches from elsewhere are "
                f"not accounted."
            )
        t, size = self._current
        if self._current_stepped:
            raise ValueError(
                f"optimizer.step() #{self.stepped + 1}: round {t}, the private loader's current "
                f"batch, was stepped already; one step per round (a skipped round is not carried "
                f"over, and batches from elsewhere are not accounted)."
            )
        if reports != size:
            raise ValueError(
                f"optimizer.step() #{self.stepped + 1} processes {reports} per-sample gradients, "
                f"but round {t} of the private loader released {size} clients: the batch did not "
                f"come from the loader's current round, which is the only one the {self.name} "
                f"accountant can cover."
            )
        self._current_stepped = True
        self.stepped += 1
        return t


def follow_sampler(
    accountant: ReleasingAccountant, sampler: Any, *, noise_multiplier: float
) -> Callable[[Any], None]:
    """Make ``accountant`` follow ``sampler``; return the optimizer's step hook.

    The body of :meth:`ShuffleAccountantBase.local_noise_hook
    <shuffle_opacus.engine.accountants.ShuffleAccountantBase.local_noise_hook>`, which documents it.

    Args:
        accountant: A configured shuffle accountant.
        sampler: A sampler of the accountant's protocol that no accountant follows yet.
        noise_multiplier: The optimizer's local noise multiplier.

    Returns:
        The step hook (with the :class:`StepGuard` as ``hook.guard``).

    Raises:
        ValueError: as the method documents.
    """
    accountant._require_configured("the optimizer hook")
    sigma = check_positive("noise_multiplier", noise_multiplier)
    spec = accountant.spec()
    if getattr(sampler, "protocol", None) != spec.name:
        raise ValueError(
            f"the {accountant.name} accountant needs a sampler of the {spec.name} protocol "
            f"({spec.sampler}). Found {sampler!r}."
        )
    rate = check_probability("sample_rate", sampler.sample_rate)
    accountant._check_step(sigma, rate)
    expected = spec.reports_per_round(
        population=accountant.population,  # type: ignore[arg-type]
        sample_size=accountant.sample_size,
    )
    guard = StepGuard(accountant.name)
    seed = sampler.seed
    secret = bool(getattr(sampler, "secure", False))

    def release(t: int, batch: list[int]) -> None:
        accountant.release(seed, t, noise_multiplier=sigma, sample_rate=rate, secret=secret)
        guard.on_release(t, len(batch))

    def hook(optimizer: Any) -> None:
        from .noise import LocalNoiseDPOptimizer

        if not isinstance(optimizer, LocalNoiseDPOptimizer):
            raise ValueError(f"the {accountant.name} accountant needs local noise: {HELPER_HINT}.")
        if optimizer.noise_multiplier != sigma or optimizer.accounting_sample_rate != rate:
            raise ValueError(
                f"the {accountant.name} accountant records noise_multiplier={sigma!r} and "
                f"sample_rate={rate!r}; this optimizer uses "
                f"{optimizer.noise_multiplier!r} and {optimizer.accounting_sample_rate!r}."
            )
        reports = optimizer.last_report_count
        if expected is not None and reports != expected:
            raise ValueError(
                f"the {accountant.name} accountant expects {expected} reports per round; this "
                f"round had {reports}. Is the data loader's sampler the matching one?"
            )
        guard.check_step(reports)

    hook.guard = guard  # type: ignore[attr-defined]
    sampler.attach_release_hook(release)
    return hook
