"""The protocol's sampler over a dataset, and the private loader whose batches are its rounds.

:func:`new_sampler` builds the sampler of a protocol from the options (shared by the example
and the user level); :class:`PrivateDataLoader` yields one round per batch and tells the step
guard (:mod:`shuffle_opacus.engine.step_guard`) which round it has just delivered.
"""

from __future__ import annotations

import warnings
from collections import deque
from typing import Any

from opacus.data_loader import dtype_safe, shape_safe, wrap_collate_with_empty
from torch.utils.data import DataLoader, IterableDataset

from ..accounting.protocols import Protocol
from .options import PrivacyOptions
from .sampling import ShuffleRoundSampler
from .step_guard import RoundQueue, StepGuard

__all__ = ["PrivateDataLoader", "new_sampler"]


def _population(data_loader: DataLoader) -> int:
    if not isinstance(data_loader, DataLoader):
        raise ValueError(f"data_loader must be a torch DataLoader. Found {type(data_loader)!r}.")
    dataset = data_loader.dataset
    if isinstance(dataset, IterableDataset) or not hasattr(dataset, "__len__"):
        raise ValueError(
            "data_loader.dataset must be a map-style dataset with a length (one example per "
            "client); iterable datasets have no population size."
        )
    n = len(dataset)  # type: ignore[arg-type]
    if n < 1:
        raise ValueError("data_loader.dataset must hold at least one example (client).")
    return n


def _first_example(data_loader: DataLoader, n: int) -> Any:
    """Read example 0, which shapes the empty rounds' batches; a failure is one line."""
    try:
        return data_loader.dataset[0]
    except Exception as exc:  # noqa: BLE001 - whatever the dataset raises becomes one line
        text = str(exc).strip().splitlines()
        detail = f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__
        raise ValueError(
            f"data_loader.dataset[0] raised {detail}; a dataset of {n} clients must return an "
            f"example for every index in [0, {n})."
        ) from None


def _existing_sampler(
    spec: Protocol,
    name: str,
    sampler: ShuffleRoundSampler,
    n: int,
    options: PrivacyOptions,
    secure: bool,
) -> ShuffleRoundSampler:
    if secure and not sampler.secure:
        raise ValueError(
            f"data_loader's sampler ({sampler!r}) draws its rounds from numpy's PCG64; with "
            f"secure_mode=True build it with secure=True, or pass a plain loader."
        )
    if sampler.protocol != spec.name:
        raise ValueError(
            f"the {name} accountant needs the {spec.name} protocol ({spec.sampler}); "
            f"data_loader samples with {type(sampler).__name__} (protocol {sampler.protocol})."
        )
    if sampler.n != n:
        raise ValueError(
            f"data_loader's sampler has n={sampler.n} but the dataset holds {n} examples."
        )
    given = {
        "rounds": options.rounds,
        "rate": options.rate,
        "sample_size": options.sample_size,
        "seed": options.seed,
    }
    actual = {
        "rounds": sampler.rounds,
        "rate": sampler.sample_rate if sampler.sample_size is None else None,
        "sample_size": sampler.sample_size,
        "seed": sampler.seed,
    }
    for key, value in given.items():
        if value is not None and value != actual[key]:
            raise ValueError(
                f"{key}={value!r} contradicts data_loader's sampler ({sampler!r}); pass one "
                f"or the other."
            )
    if options.start_round:
        raise ValueError("start_round applies to a sampler built here; set it on your sampler.")
    if sampler.release_hook is not None:
        raise ValueError(
            f"data_loader's sampler ({sampler!r}) already feeds an accountant; build a new "
            f"sampler (with a new seed, or start_round at its next_round) for this engine."
        )
    return sampler


def _check_secure_seed(options: PrivacyOptions, secure: bool) -> None:
    """Refuse a seed in secure mode: the operating system's draws cannot be seeded."""
    if secure and options.seed is not None:
        raise ValueError(
            f"seed must be None with secure_mode=True: the check-in coins and cohorts then come "
            f"from the operating system, which cannot be seeded. Found {options.seed!r}."
        )


def _sampler(
    spec: Protocol,
    name: str,
    data_loader: DataLoader,
    n: int,
    options: PrivacyOptions,
    *,
    secure: bool = False,
) -> ShuffleRoundSampler:
    _check_secure_seed(options, secure)
    existing = data_loader.batch_sampler
    if isinstance(existing, ShuffleRoundSampler):
        return _existing_sampler(spec, name, existing, n, options, secure)
    return new_sampler(spec, name, n, options, secure=secure)


def new_sampler(
    spec: Protocol, name: str, n: int, options: PrivacyOptions, *, secure: bool = False
) -> ShuffleRoundSampler:
    """Build the protocol's sampler over ``n`` clients from the options, after checking them.

    Shared by :func:`make_private` (one example = one client) and
    :func:`shuffle_opacus.federated.make_private_clients` (``n`` = number of clients).

    Args:
        spec: The protocol.
        name: The accountant's name, for messages.
        n: Number of clients.
        options: The caller's options (``rounds``, ``rate``, ``sample_size``, ``seed``,
            ``start_round``).
        secure: The engine's ``secure_mode``: draw every round from the operating system's
            secure source (:mod:`shuffle_opacus.common.secure_random`) instead of numpy's PCG64.

    Returns:
        The sampler.

    Raises:
        ValueError: for missing or out-of-range ``rounds``, ``rate``, ``sample_size``, ``seed``
            or ``start_round``, naming the accountant to use where another one fits; for a
            ``seed`` with ``secure=True`` (secure draws cannot be seeded).
    """
    _check_secure_seed(options, secure)
    if options.rounds is None:
        raise ValueError("rounds is required (an integer >= 1): the number of training rounds.")
    size = options.sample_size
    spec.check_sampling(population=n, accountant=name, rate=options.rate, sample_size=size)
    return spec.make_sampler(
        n,
        rate=options.rate,
        sample_size=size,
        rounds=options.rounds,
        seed=options.seed,
        start_round=options.start_round,
        secure=secure,
    )


class PrivateDataLoader(DataLoader):
    """A loader whose batches are the rounds of a shuffle sampler, each one told to a guard.

    As it yields a round's batch it tells the accountant's
    :class:`~shuffle_opacus.engine.step_guard.StepGuard` that this round is now the current one, so
    that the next ``optimizer.step()`` is checked against it. Each iteration pairs its batches
    with the rounds it released itself: with worker processes the sampler releases rounds ahead
    of the batches the loop sees, and a loop left early abandons those rounds (they stay
    accounted; a ``UserWarning`` names them), while the next loop starts afresh.
    """

    _guard: StepGuard | None = None

    def __iter__(self) -> Any:
        """Yield the batches of the sampler's next rounds (see :class:`DataLoader`).

        Warns (``UserWarning``) when the iteration ends before the rounds its workers fetched
        ahead were yielded.
        """
        guard = self._guard
        if guard is None:
            yield from super().__iter__()
            return
        queue: RoundQueue = deque()
        try:
            with guard.collecting(queue):
                batches = super().__iter__()
            while True:
                with guard.collecting(queue):
                    try:
                        batch = next(batches)
                    except StopIteration:
                        return
                guard.on_deliver(queue)
                yield batch
        finally:
            if queue:
                _warn_abandoned(guard.name, list(queue), self.num_workers)


def _warn_abandoned(name: str, rounds: list[tuple[int, int]], workers: int) -> None:
    first, last = rounds[0][0], rounds[-1][0]
    which = f"round {first}" if first == last else f"rounds {first}-{last}"
    warnings.warn(
        f"the loop over the private loader ended before {which} arrived: its {workers} worker "
        f"processes had fetched them ahead, so the {name} accountant counts them as released "
        f"though no step used them; the next loop continues with new rounds (loop to the end, "
        f"or use num_workers=0, to release only the rounds you take).",
        UserWarning,
        stacklevel=3,  # the loop that let the iteration go
    )


def _private_loader(
    data_loader: DataLoader, sampler: ShuffleRoundSampler, first: Any
) -> PrivateDataLoader:
    dataset = data_loader.dataset
    if isinstance(first, (tuple, list)):
        shapes = [(0, *shape_safe(x)) for x in first]
        dtypes = [dtype_safe(x) for x in first]
    else:
        shapes, dtypes = None, None
    collate = wrap_collate_with_empty(
        collate_fn=data_loader.collate_fn, sample_empty_shapes=shapes, dtypes=dtypes
    )
    kwargs: dict[str, Any] = {
        "num_workers": data_loader.num_workers,
        "pin_memory": data_loader.pin_memory,
        "timeout": data_loader.timeout,
        "worker_init_fn": data_loader.worker_init_fn,
    }
    if data_loader.num_workers > 0:
        kwargs["persistent_workers"] = data_loader.persistent_workers
        kwargs["prefetch_factor"] = data_loader.prefetch_factor
        kwargs["multiprocessing_context"] = data_loader.multiprocessing_context
    return PrivateDataLoader(dataset, batch_sampler=sampler, collate_fn=collate, **kwargs)
