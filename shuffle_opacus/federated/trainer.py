"""The rounds of user-level training: local training vectorised over clients, clipping, noise.

See :mod:`shuffle_opacus.federated` for the round and the privacy statement.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn
from torch.func import functional_call, grad, vmap

from ..engine.accountants import ShuffleAccountantBase
from ..engine.clipping import clip_factors
from ..engine.noise import local_noise_sum
from ..engine.sampling import ShuffleRoundSampler
from .local import LocalTraining, _local_positions
from .partition import ClientPartition

__all__ = ["AVERAGES", "DEFAULT_CLIENT_CHUNK", "FederatedTrainer", "RoundResult"]


#: Denominators of the server's average: the expected number of reports per round (``n * rate``,
#: ``m`` or ``n``; as the example-level path with a mean loss) or the round's actual number.
AVERAGES: tuple[str, ...] = ("expected", "reports")


#: Default number of clients trained together in one vectorised call.
DEFAULT_CLIENT_CHUNK = 128


@dataclass(frozen=True)
class RoundResult:
    """What a released round did.

    Attributes:
        round: The round's index (0-based, as the sampler's).
        reports: Number of reports ``B_t`` (public in the shuffle model).
        local_loss: Mean over the participants of their mean local training loss (``nan`` for
            an empty round). A statistic of the clients' data that the protocol does not
            release and the accountant does not cover: for monitoring simulations only.
    """

    round: int
    reports: int
    local_loss: float


class FederatedTrainer:
    """Runs the rounds of user-level shuffle-model training; built by :func:`make_private_clients`.

    Iterating over it releases the rounds ``start_round .. rounds - 1`` in order; each item is
    the :class:`RoundResult` of a round whose noisy average is already in the ``.grad`` of the
    global parameters and already recorded by the accountant. Call ``optimizer.step()`` for
    each (and do not clear the gradients in between)::

        for result in trainer:
            optimizer.step()

    Attributes:
        module: The global model (unchanged by the trainer except for ``.grad``).
        optimizer: The server's optimizer.
        partition: The clients.
        training: The local training.
        sampler: The protocol's sampler over the clients.
        accountant: The engine's accountant (population = number of clients).
        noise_multiplier: Each client's noise std divided by ``max_update_norm``.
        max_update_norm: The clipping norm ``C`` of a client's whole update.
        average: ``"expected"`` or ``"reports"`` (see :data:`AVERAGES`).
        noise_mode: ``"sum"`` or ``"per_client"``
            (:func:`~shuffle_opacus.engine.noise.local_noise_sum`).
        client_chunk: Clients trained together in one vectorised call.
        rounds_released: Rounds released (and accounted) so far by this trainer.
    """

    def __init__(
        self,
        *,
        module: nn.Module,
        optimizer: torch.optim.Optimizer,
        inputs: Tensor,
        targets: Tensor,
        partition: ClientPartition,
        loss_fn: Callable[[Tensor, Tensor], Tensor],
        training: LocalTraining,
        sampler: ShuffleRoundSampler,
        accountant: ShuffleAccountantBase,
        noise_multiplier: float,
        max_update_norm: float,
        average: str,
        noise_mode: str,
        noise_generator: torch.Generator | None,
        secure_mode: bool,
        client_chunk: int,
    ) -> None:
        """Store the validated pieces (use :func:`make_private_clients`, which checks them)."""
        self.module = module
        self.optimizer = optimizer
        self.inputs = inputs
        self.targets = targets
        self.partition = partition
        self.loss_fn = loss_fn
        self.training = training
        self.sampler = sampler
        # Rounds are released once each, in order: a round's clients are a function of the seed
        # and its index, so releasing it again would reuse the same check-in set, which
        # composition of independent rounds does not cover.
        self._next_round = sampler.start_round
        self.accountant = accountant
        self.noise_multiplier = noise_multiplier
        self.max_update_norm = max_update_norm
        self.average = average
        self.noise_mode = noise_mode
        self.noise_generator = noise_generator
        self.secure_mode = secure_mode
        self.client_chunk = client_chunk
        self.rounds_released = 0
        named = [(k, p) for k, p in module.named_parameters() if p.requires_grad]
        self._names = [k for k, _ in named]
        self._params = [p for _, p in named]
        self._fixed: dict[str, Tensor] = {
            k: p for k, p in module.named_parameters() if not p.requires_grad
        }
        self._fixed.update(dict(module.named_buffers()))
        self._order = torch.tensor(partition.order, dtype=torch.long, device=inputs.device)
        self._offsets = partition.offsets
        self._sizes = partition.sizes
        self._step_grad = vmap(
            grad(self._client_loss, has_aux=True), in_dims=(0, 0, 0, 0), randomness="different"
        )
        self._built = True

    def _client_loss(
        self, params: tuple[Tensor, ...], x: Tensor, y: Tensor, w: Tensor
    ) -> tuple[Tensor, Tensor]:
        state = dict(zip(self._names, params, strict=True))
        state.update(self._fixed)
        losses = self.loss_fn(functional_call(self.module, state, (x,)), y)
        total = (losses * w).sum()
        return total, total.detach()

    @property
    def expected_reports(self) -> float:
        """Expected reports per round (``n * rate``, ``m`` or ``n``)."""
        return float(self.sampler.expected_batch_size)

    def __len__(self) -> int:
        """Return the number of rounds iteration still releases (``rounds - next round``)."""
        return max(0, self.sampler.rounds - self._next_round)

    def __setattr__(self, name: str, value: Any) -> None:
        """Refuse to change the trainer once it is built (the accountant follows its plan).

        Raises:
            AttributeError: for every attribute after construction.
        """
        if self.__dict__.get("_built", False):
            raise AttributeError(
                f"{name} of a FederatedTrainer is fixed once it is built (its accountant records "
                f"the rounds with the sampler, noise and clients it holds); call "
                f"make_private_clients again on the same engine for other settings."
            )
        super().__setattr__(name, value)

    def __delattr__(self, name: str) -> None:
        """Refuse to delete an attribute.

        Raises:
            AttributeError: always.
        """
        raise AttributeError(f"{name} of a FederatedTrainer cannot be deleted.")

    def _refuse_copy(self, how: str) -> TypeError:
        return TypeError(
            f"a FederatedTrainer cannot be {how}: the copy would release rounds its engine's "
            f"accountant counts once, or not at all. Call make_private_clients again on the "
            f"same engine (new rounds are accounted with the others)."
        )

    def __copy__(self) -> FederatedTrainer:
        """Refuse (see :meth:`_refuse_copy`).

        Raises:
            TypeError: always.
        """
        raise self._refuse_copy("copied")

    def __deepcopy__(self, memo: dict[int, Any]) -> FederatedTrainer:
        """Refuse (see :meth:`_refuse_copy`).

        Raises:
            TypeError: always.
        """
        raise self._refuse_copy("deep-copied")

    def __reduce_ex__(self, protocol: Any) -> Any:
        """Refuse pickling (a pickled trainer would be a copy).

        Raises:
            TypeError: always.
        """
        raise self._refuse_copy("pickled")

    def __iter__(self) -> Iterator[RoundResult]:
        """Release the rounds not released yet, up to ``rounds - 1`` (see the class docstring).

        A second loop continues where the first stopped; once every round is released it yields
        nothing.
        """
        while self._next_round < self.sampler.rounds:
            yield self.run_round(self._next_round)

    def run_round(self, round_index: int) -> RoundResult:
        """Release round ``round_index``: train, clip, noise, average into ``.grad``, account.

        Every call is a release and is accounted. Each round is released at most once, in
        order: an index below the next round to release is refused (its clients are those of the
        earlier release, a reuse that independent-round composition does not cover); skipping
        ahead leaves the skipped rounds unreleased.

        Args:
            round_index: The round (in ``[0, rounds)``); its clients are the sampler's.

        Returns:
            The round's :class:`RoundResult`.

        Raises:
            ValueError: if ``round_index`` is out of range or was released already.
        """
        if (
            isinstance(round_index, bool)
            or not isinstance(round_index, (int, np.integer))
            or not self._next_round <= int(round_index) < self.sampler.rounds
        ):
            if isinstance(round_index, (int, np.integer)) and 0 <= round_index < self._next_round:
                raise ValueError(
                    f"round_index {round_index} was released already (the next round is "
                    f"{self._next_round}); its clients would be the same again, which the "
                    f"accountant cannot count as a new round. Release round_index >= "
                    f"{self._next_round}."
                )
            raise ValueError(
                f"round_index must be an integer in [{self._next_round}, {self.sampler.rounds}) "
                f"(the planned rounds not released yet). Found {round_index!r}."
            )
        round_index = int(round_index)
        # Refuse a round this engine's accountant has seen already, before any work.
        self.accountant.check_unreleased(
            self.sampler.seed, round_index, round_index + 1, what="round_index"
        )
        participants = np.asarray(self.sampler.batch(round_index), dtype=np.int64)
        sums, loss = self._clipped_sum(participants, round_index)
        reports = int(participants.size)
        expected = self.accountant.spec().reports_per_round(
            population=self.partition.num_clients, sample_size=self.accountant.sample_size
        )
        if expected is not None and reports != expected:
            raise RuntimeError(f"round {round_index} has {reports} reports, not {expected}")
        if self.average == "expected":
            denominator = self.expected_reports
        else:
            denominator = float(max(reports, 1))
        std = self.noise_multiplier * self.max_update_norm
        grads = {}
        for p in _optimizer_params(self.optimizer):
            total = sums[p]
            noise = local_noise_sum(
                std,
                reports,
                total,
                mode=self.noise_mode,
                generator=self.noise_generator,
                secure_mode=self.secure_mode,
            )
            grads[p] = ((total + noise) / denominator).view_as(p)
        self.accountant.release(
            self.sampler.seed,
            round_index,
            noise_multiplier=self.noise_multiplier,
            sample_rate=self.sampler.sample_rate,
            secret=self.sampler.secure,
        )
        for p, g in grads.items():
            p.grad = g
        object.__setattr__(self, "rounds_released", self.rounds_released + 1)
        object.__setattr__(self, "_next_round", round_index + 1)
        return RoundResult(round=int(round_index), reports=reports, local_loss=loss)

    def _clipped_sum(
        self, participants: np.ndarray, round_index: int
    ) -> tuple[dict[Tensor, Tensor], float]:
        """Return the sum of the participants' clipped updates and their mean local loss."""
        sums: dict[Tensor, Tensor] = {
            p: torch.zeros_like(p, memory_format=torch.contiguous_format) for p in self._params
        }
        loss_total = 0.0
        for start in range(0, participants.size, self.client_chunk):
            clients = participants[start : start + self.client_chunk]
            updates, losses = self.local_updates(clients, round_index)
            for p, s in zip(self._params, self.clip_sum(updates), strict=True):
                s = s.view_as(p)
                sums[p] += s
            loss_total += float(losses.sum())
        loss = loss_total / participants.size if participants.size else math.nan
        return sums, loss

    def clip_sum(self, updates: Sequence[Tensor]) -> list[Tensor]:
        """Return the sum over clients of ``updates`` clipped as one vector per client.

        Factor ``min(1, C / (||u_i|| + 1e-6))`` (Opacus's, :func:`shuffle_opacus.engine.clipping.
        clip_factors`), ``||u_i||`` over all parameters; a non-finite update counts as zero.

        Args:
            updates: One ``(B, *shape)`` tensor per trainable parameter.

        Returns:
            One ``shape`` tensor per trainable parameter.
        """
        b = updates[0].shape[0]
        norms = torch.stack([u.reshape(b, -1).norm(2, dim=1) for u in updates], dim=1)
        norm = norms.norm(2, dim=1)
        finite = torch.isfinite(norm)
        factors = clip_factors(torch.where(finite, norm, 0.0), self.max_update_norm)
        if not bool(finite.all()):
            updates = [torch.where(finite.view(-1, *[1] * (u.ndim - 1)), u, 0.0) for u in updates]
            factors = torch.where(finite, factors, 0.0)
        return [torch.einsum("i,i...->...", factors, u) for u in updates]

    def local_updates(self, clients: np.ndarray, round_index: int) -> tuple[list[Tensor], Tensor]:
        """Train ``clients`` locally from the global weights; return their updates ``w - w_i``.

        Not private on its own (no clipping, no noise, nothing accounted); :meth:`run_round`
        releases only the clipped, noised sum.

        Args:
            clients: Client ids (``int64`` array).
            round_index: The round (seeds the local mini-batch order).

        Returns:
            ``(updates, losses)``: one ``(B, *shape)`` tensor per trainable parameter, and each
            client's mean local loss ``(B,)``.
        """
        index, weight = self._schedule(clients, round_index)
        b = len(clients)
        base = [p.detach() for p in self._params]
        updates = [torch.zeros((b, *p.shape), dtype=p.dtype, device=p.device) for p in base]
        losses = torch.zeros(b, dtype=weight.dtype, device=weight.device)
        if b == 0:
            return updates, losses
        lr = self.training.client_lr
        active = (weight > 0).any(dim=2)
        for s in range(index.shape[1]):
            rows = index[:, s]
            local = tuple(p.unsqueeze(0) - u for p, u in zip(base, updates, strict=True))
            grads, step_loss = self._step_grad(
                local, self.inputs[rows], self.targets[rows], weight[:, s]
            )
            for u, g in zip(updates, grads, strict=True):
                u.add_(g, alpha=lr)
            losses += step_loss.detach().to(losses.dtype)
        steps = active.sum(dim=1).clamp(min=1).to(losses.dtype)
        return updates, losses / steps

    def _schedule(self, clients: np.ndarray, round_index: int) -> tuple[Tensor, Tensor]:
        """Return ``(index, weight)`` of shape ``(B, steps, batch)``: dataset rows and weights."""
        sizes = self._sizes[clients]
        training = self.training
        b = len(clients)
        if b == 0:
            return (
                torch.zeros((0, 0, 0), dtype=torch.long, device=self.inputs.device),
                torch.zeros((0, 0, 0), dtype=self._params[0].dtype, device=self.inputs.device),
            )
        limit = training.local_batch_size
        batch = sizes if limit is None else np.minimum(sizes, int(limit))
        if training.local_steps is not None:
            steps = np.full(b, int(training.local_steps), dtype=np.int64)
        else:
            steps = int(training.local_epochs) * -(-sizes // batch)  # type: ignore[arg-type]
        width, depth = int(batch.max()), int(steps.max())
        positions = np.full((b, depth, width), -1, dtype=np.int64)
        whole = batch == sizes
        if whole.any():  # batches are the whole client: positions 0 .. size - 1, nothing drawn
            grid = np.arange(width)
            rows = np.flatnonzero(whole)
            valid = grid[None, :] < sizes[rows, None]
            for_steps = np.arange(depth)[None, :] < steps[rows, None]
            positions[rows] = np.where(valid[:, None, :] & for_steps[:, :, None], grid, -1)
        for row in np.flatnonzero(~whole):
            drawn = _local_positions(
                int(sizes[row]), training, self.sampler.seed, round_index, int(clients[row])
            )
            positions[row, : drawn.shape[0], : drawn.shape[1]] = drawn
        valid = positions >= 0
        counts = valid.sum(axis=2, keepdims=True)
        weight = np.where(valid, 1.0 / np.maximum(counts, 1), 0.0)
        rows = self._offsets[clients][:, None, None] + np.where(valid, positions, 0)
        device = self.inputs.device
        index = self._order[torch.as_tensor(rows, device=device)]
        dtype = self._params[0].dtype
        return index, torch.as_tensor(weight, dtype=dtype, device=device)


def _optimizer_params(optimizer: torch.optim.Optimizer) -> list[Tensor]:
    return [p for group in optimizer.param_groups for p in group["params"]]
