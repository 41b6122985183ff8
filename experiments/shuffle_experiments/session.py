"""One training session: the data, the model, the engine and the round, at either level.

:class:`ExampleSession` trains with :func:`shuffle_opacus.make_private` (one example, one client),
:class:`UserSession` with :func:`shuffle_opacus.federated.make_private_clients` (clients train
locally); :func:`open_session` builds the one the run plan (:mod:`.plan`) asks for.
"""

from __future__ import annotations

import abc
import copy
import functools
import math
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from opacus import PrivacyEngine
from torch import nn
from torch.nn import functional as F  # noqa: N812
from torch.utils.data import DataLoader, TensorDataset

import shuffle_opacus
from shuffle_opacus.engine.noise import LocalNoiseDPOptimizer
from shuffle_opacus.engine.sampling import ShuffleRoundSampler
from shuffle_opacus.federated import (
    ClientPartition,
    FederatedTrainer,
    dirichlet_partition,
    iid_partition,
    make_private_clients,
    shard_partition,
)

from .checkpoint import CHECKPOINT_FORMAT, comparable
from .config import ConfigError, ExperimentConfig
from .curves import EpsilonCurves
from .datasets import MNIST_MEAN, MNIST_STD, DatasetError, dataset_tensors
from .models import build_model
from .plan import RunPlan, as_plan

__all__ = [
    "ExampleSession",
    "MNIST_MEAN",
    "MNIST_STD",
    "Session",
    "UserSession",
    "evaluate",
    "open_session",
    "resolve_device",
]


_EVAL_BATCH = 2000


def _optimizer(config: ExperimentConfig, model: nn.Module) -> torch.optim.Optimizer:
    o = config.optimizer
    if o.name == "sgd":
        return torch.optim.SGD(model.parameters(), lr=o.lr, momentum=o.momentum)
    return torch.optim.Adam(model.parameters(), lr=o.lr)


def resolve_device(name: str) -> torch.device:
    """Return the device of ``training.device``: ``auto`` is CUDA when available, else the CPU.

    Raises:
        ConfigError: for a CUDA device that this machine does not have.
    """
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda":
        index = device.index or 0
        if not torch.cuda.is_available() or index >= torch.cuda.device_count():
            raise ConfigError(f"training.device {name} is not available here; use auto or cpu")
    return device


class _Average:
    """Exponential moving average of a model's weights (what is evaluated when ``ema`` is set).

    ``avg = decay * avg + (1 - decay) * weights`` after every round, with the usual warm-up
    ``decay_t = min(decay, (1 + t) / (10 + t))`` so that early averages are not dominated by the
    initial weights. It only reads the trained weights, so it is post-processing: it changes no
    privacy number.
    """

    def __init__(self, model: nn.Module, decay: float) -> None:
        self.decay = decay
        self.model = copy.deepcopy(model).eval()
        for p in self.model.parameters():
            p.requires_grad_(False)

    @torch.no_grad()
    def update(self, model: nn.Module, round_number: int) -> None:
        decay = min(self.decay, (1.0 + round_number) / (10.0 + round_number))
        for avg, p in zip(self.model.parameters(), model.parameters(), strict=True):
            avg.mul_(decay).add_(p.detach(), alpha=1.0 - decay)


@torch.no_grad()
def evaluate(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> tuple[float, float]:
    """Return ``(mean cross-entropy, accuracy)`` of ``model`` on ``(x, y)``."""
    was_training = model.training
    model.eval()
    loss, correct = 0.0, 0
    for start in range(0, x.shape[0], _EVAL_BATCH):
        logits = model(x[start : start + _EVAL_BATCH])
        target = y[start : start + _EVAL_BATCH]
        loss += float(F.cross_entropy(logits, target, reduction="sum"))
        correct += int((logits.argmax(dim=1) == target).sum())
    model.train(was_training)
    return loss / x.shape[0], correct / x.shape[0]


class Session(abc.ABC):
    """Everything one training session holds; built fresh for a new run or a resume.

    The common part: data, model, server optimizer, moving average, noise generator and the
    engine. A subclass prepares the protocol (:meth:`_prepare`) and runs a round
    (:meth:`_round`); :func:`open_session` picks it from the plan.

    Args:
        plan: The run plan (:func:`~.plan.build_plan`); a validated config is still accepted.
        run_dir: The run directory.
        start_round: Rounds already released (0 for a new run).

    Attributes:
        plan: The run plan over :attr:`population` clients.
        config: The plan's config.
        sampler: The protocol's sampler (round ``t``'s clients are ``sampler.batch(t)``).
        curves: The epsilon curves of the plan over :attr:`population` clients.
    """

    sampler: ShuffleRoundSampler
    population: int
    model: nn.Module
    plain_model: nn.Module
    server_optimizer: torch.optim.Optimizer

    def __init__(self, plan: RunPlan | ExperimentConfig, run_dir: Path, start_round: int) -> None:
        self.plan = as_plan(plan)
        self.config = config = self.plan.config
        self.run_dir = run_dir
        torch.set_num_threads(config.training.threads)
        self.device = resolve_device(config.training.device)
        try:
            data = dataset_tensors(config.data)
        except DatasetError as exc:
            raise ConfigError(str(exc)) from None
        self.train_x, self.train_y, self.test_x, self.test_y = (
            t.to(self.device) for t in (data.train_x, data.train_y, data.test_x, data.test_y)
        )
        #: The client of every training example in the dataset's own partition, or None.
        self.train_client = data.train_client
        self.population = int(self.train_x.shape[0])
        torch.manual_seed(self.plan.seed)
        try:  # a CNN refuses examples that are not 1 x 28 x 28 images, before drawing weights
            model = build_model(config.model.name, data.input_shape, data.num_classes)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        model = model.to(self.device)
        optimizer = _optimizer(config, model)
        # Copied before Opacus attaches its hooks to the model's layers.
        self.average = _Average(model, config.training.ema) if config.training.ema else None
        # The noise is drawn on the device that holds the gradients.
        self.noise_generator = torch.Generator(device=self.device).manual_seed(self.plan.seed + 1)
        with warnings.catch_warnings():
            # Opacus's reminder that its RNG is not cryptographically secure: this is a
            # simulation whose noise must be reproducible from the seed.
            warnings.filterwarnings("ignore", message="Secure RNG turned off")
            self.engine = PrivacyEngine(accountant=self.plan.protocol.accountant)
        self._prepare(model, optimizer, start_round)
        # The population the data gave (check_data counts the same; a stand-in data set may not).
        self.plan = self.plan.for_population(self.population)
        self.curves = EpsilonCurves(self.plan)

    @abc.abstractmethod
    def _prepare(
        self, model: nn.Module, optimizer: torch.optim.Optimizer, start_round: int
    ) -> None:
        """Prepare the protocol: the private model, the sampler, the population."""

    @abc.abstractmethod
    def _round(self, indices: Sequence[int], round_number: int) -> float:
        """Release round ``round_number`` on ``indices``; return the mean training loss."""

    @property
    def evaluated_model(self) -> nn.Module:
        """The weights that are evaluated: their moving average when ``training.ema`` is set."""
        return self.average.model if self.average is not None else self.plain_model

    def state(
        self, round_done: int, seconds: float, participants: int, epsilon_sha256: str
    ) -> dict[str, Any]:
        """Return the checkpoint: tensors and plain containers only (:func:`load_checkpoint`).

        ``epsilon_sha256`` is the digest of the epsilon columns of rows ``1 .. round_done``;
        :func:`~.checkpoint.save_checkpoint` adds the checksum.
        """
        return {
            "format": CHECKPOINT_FORMAT,
            "config": comparable(self.config),
            "round": round_done,
            "model": self.plain_model.state_dict(),
            "average": self.average.model.state_dict() if self.average is not None else None,
            "optimizer": self.server_optimizer.state_dict(),
            "accountant": self.engine.accountant.state_dict(),
            "noise_generator": self.noise_generator.get_state(),  # a CPU tensor on any device
            "torch_rng": torch.get_rng_state(),
            "cuda_rng": torch.cuda.get_rng_state_all() if self.device.type == "cuda" else None,
            "seconds": seconds,
            "participants": participants,
            "epsilon_sha256": epsilon_sha256,
        }

    def load(self, state: dict[str, Any]) -> None:
        """Restore a checkpoint's state (checked by :func:`load_checkpoint` first)."""
        self.plain_model.load_state_dict(state["model"])
        if self.average is not None:
            self.average.model.load_state_dict(state["average"])
        self.server_optimizer.load_state_dict(state["optimizer"])
        self.engine.accountant.load_state_dict(state["accountant"])
        self.noise_generator.set_state(state["noise_generator"])
        torch.set_rng_state(state["torch_rng"])
        if self.device.type == "cuda" and state.get("cuda_rng") is not None:
            torch.cuda.set_rng_state_all(state["cuda_rng"])

    def learning_rate(self, round_number: int) -> float:
        """Return the learning rate of round ``round_number`` (1-based) under the schedule.

        ``optimizer.warmup`` rounds rise linearly to ``optimizer.lr``; then ``cosine`` decays to 0
        over the remaining rounds: ``lr (1 + cos(pi (t - 1 - W) / (T - W))) / 2``. It is a
        function of the round only, so a resumed run needs no extra state.
        """
        o = self.config.optimizer
        if round_number <= o.warmup:
            return o.lr * round_number / (o.warmup + 1)
        if o.schedule == "constant":
            return o.lr
        frac = (round_number - 1 - o.warmup) / (self.config.training.rounds - o.warmup)
        return o.lr * 0.5 * (1.0 + math.cos(math.pi * frac))

    def round(self, indices: Sequence[int], round_number: int) -> float:
        """Run round ``round_number`` (1-based) on the clients ``indices``; one server step.

        Returns:
            The participants' mean training loss (``nan`` for an empty round).
        """
        for group in self.server_optimizer.param_groups:
            group["lr"] = self.learning_rate(round_number)
        loss = self._round(indices, round_number)
        if self.average is not None:
            self.average.update(self.plain_model, round_number)
        return loss


class ExampleSession(Session):
    """One training example is one client: :func:`shuffle_opacus.make_private`."""

    optimizer: LocalNoiseDPOptimizer

    def _prepare(
        self, model: nn.Module, optimizer: torch.optim.Optimizer, start_round: int
    ) -> None:
        plan = self.plan
        loader = DataLoader(TensorDataset(self.train_x, self.train_y), batch_size=1)
        self.model, self.optimizer, private_loader = shuffle_opacus.make_private(
            self.engine,
            module=model,
            optimizer=optimizer,
            data_loader=loader,
            noise_multiplier=plan.noise_multiplier,
            max_grad_norm=plan.clipping_norm,
            rounds=plan.rounds,
            rate=plan.rate,
            sample_size=plan.sample_size,
            seed=plan.seed,
            start_round=start_round,
            sensitivity=plan.sensitivity_setting,
            noise_mode=plan.noise_mode,
            grad_sample_mode=self.config.training.grad_sample_mode,
            noise_generator=self.noise_generator,
        )
        # Index the tensors with the sampler's batches directly: the same rounds as the
        # private loader, without collating thousands of single examples per round.
        self.sampler = private_loader.batch_sampler  # type: ignore[assignment]
        # Evaluation uses the wrapped network itself: no per-sample machinery (Opacus's ``ew``
        # wrapper would try to compute per-sample gradients even under no_grad).
        self.plain_model = self.model._module  # type: ignore[assignment]
        self.server_optimizer = self.optimizer.original_optimizer

    def _round(self, indices: Sequence[int], round_number: int) -> float:
        """Per-client gradients, clipping, local noise, one noisy step.

        With ``training.micro_batch`` the reports are processed in chunks: every chunk but the
        last only clips and accumulates (Opacus's ``signal_skip_step``), the last adds the
        noise of all the round's reports and steps, so a round is still one noisy step and one
        accountant step. Chunks keep the per-sample gradients small (faster on CPU); the result
        equals the unchunked round up to floating-point rounding.
        """
        idx = torch.as_tensor(indices, dtype=torch.long, device=self.device)
        x, y = self.train_x[idx], self.train_y[idx]
        size = int(idx.numel())
        chunk = self.config.training.micro_batch or max(size, 1)
        starts = list(range(0, size, chunk)) or [0]
        loss_sum = 0.0
        self.optimizer.zero_grad(set_to_none=True)
        for i, start in enumerate(starts):
            last = i == len(starts) - 1
            xc, yc = x[start : start + chunk], y[start : start + chunk]
            loss = F.cross_entropy(self.model(xc), yc)
            loss.backward()
            if size:
                loss_sum += loss.item() * int(yc.shape[0])
            if len(starts) > 1:
                self.optimizer.signal_skip_step(do_skip=not last)
            self.optimizer.step()
            if not last:
                self.optimizer.zero_grad(set_to_none=True)  # the clipped sum is kept
        return loss_sum / size if size else math.nan


class UserSession(Session):
    """``clients.count`` clients training locally: :func:`shuffle_opacus.make_private_clients`."""

    trainer: FederatedTrainer

    def _prepare(
        self, model: nn.Module, optimizer: torch.optim.Optimizer, start_round: int
    ) -> None:
        config, plan = self.config, self.plan
        c = config.clients
        assert c is not None
        labels = self.train_y.cpu().numpy()
        if c.partition == "iid":
            partition = iid_partition(labels.size, c.count, seed=plan.seed)
        elif c.partition == "dirichlet":
            partition = dirichlet_partition(labels, c.count, alpha=c.alpha, seed=plan.seed)
        elif c.partition == "shards":
            partition = shard_partition(
                labels, c.count, shards_per_client=c.shards_per_client, seed=plan.seed
            )
        else:  # the dataset's own (the config checked that it has one of clients.count)
            partition = ClientPartition.from_client_ids(self.train_client, num_clients=c.count)
        self.trainer = make_private_clients(
            self.engine,
            module=model,
            optimizer=optimizer,
            data=(self.train_x, self.train_y),
            partition=partition,
            loss_fn=functools.partial(F.cross_entropy, reduction="none"),
            noise_multiplier=plan.noise_multiplier,
            max_update_norm=plan.clipping_norm,
            client_lr=c.client_lr,
            local_steps=c.local_steps,
            local_epochs=c.local_epochs,
            local_batch_size=c.local_batch_size,
            rounds=plan.rounds,
            rate=plan.rate,
            sample_size=plan.sample_size,
            seed=plan.seed,
            start_round=start_round,
            sensitivity=plan.sensitivity_setting,
            noise_mode=plan.noise_mode,
            average=c.average,
            noise_generator=self.noise_generator,
            client_chunk=c.chunk,
        )
        self.population = partition.num_clients
        self.sampler = self.trainer.sampler
        self.model = self.plain_model = model
        self.server_optimizer = optimizer

    def _round(self, indices: Sequence[int], round_number: int) -> float:
        """Let the trainer release the round into ``.grad``; then the server steps.

        Returns the participants' mean local training loss (``nan`` for an empty round).
        """
        result = self.trainer.run_round(round_number - 1)
        if result.reports != len(indices):
            raise RuntimeError(f"round {round_number}: the trainer and the sampler disagree")
        self.server_optimizer.step()
        return result.local_loss


def open_session(plan: RunPlan | ExperimentConfig, run_dir: Path, start_round: int) -> Session:
    """Build the session of the plan's level, starting at ``start_round``.

    Args:
        plan: The run plan (:func:`~.plan.build_plan`); a validated config is still accepted.
        run_dir: The run directory.
        start_round: Rounds already released (0 for a new run).

    Returns:
        A :class:`UserSession` at user level (a ``clients:`` section), else an
        :class:`ExampleSession`.
    """
    plan = as_plan(plan)
    kind = UserSession if plan.user_level else ExampleSession
    return kind(plan, run_dir, start_round)
