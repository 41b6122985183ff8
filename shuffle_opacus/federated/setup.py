"""``make_private_clients``: every check of user-level training before its first round.

The model, the data, the partition, the local training, the noise and the plan are checked, and
the set-up check runs on a copy of the model, before the accountant is configured and the
trainer built; after a ``ValueError`` nothing has changed.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import torch
from opacus import PrivacyEngine
from opacus.grad_sample import AbstractGradSampleModule
from torch import Tensor, nn
from torch.utils.data import Dataset, TensorDataset, default_collate

from ..accounting.protocols import resolve_sensitivity
from ..common.validation import check_int, check_positive
from ..engine.noise import NOISE_MODES
from ..engine.plan_checks import check_release_plan, optimizer_lr
from ..engine.privacy import (
    PrivacyOptions,
    bind_get_epsilon,
    check_noise_generator,
    check_secure_rng,
    new_sampler,
    shuffle_accountant_of,
)
from ..engine.release_registry import REGISTRY, caller, data_identity
from .local import LocalTraining
from .partition import ClientPartition, as_partition
from .trainer import AVERAGES, DEFAULT_CLIENT_CHUNK, FederatedTrainer, _optimizer_params

__all__ = ["make_private_clients"]


def _first_line(exc: BaseException) -> str:
    """Return an exception as one line: its type and the first line of its message."""
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__


def _materialise(data: Any) -> tuple[Tensor, Tensor]:
    """Return the ``(inputs, targets)`` tensors of ``data``, one row per example.

    Args:
        data: A ``TensorDataset`` of two tensors, a pair of tensors, or a map-style ``Dataset``
            of ``(input, target)`` pairs (read once, ``data[0] .. data[len(data) - 1]``, and
            stacked with ``default_collate``).

    Returns:
        ``(inputs, targets)`` with the same first dimension ``>= 1``.

    Raises:
        ValueError: one line, for another kind of ``data``, an example that cannot be read
            (the dataset's own exception is named, not re-raised), examples that are not
            ``(input, target)`` pairs or do not stack, or tensors of unequal lengths.
    """
    if isinstance(data, TensorDataset):
        tensors = data.tensors
    elif isinstance(data, (tuple, list)) and all(isinstance(t, Tensor) for t in data):
        tensors = tuple(data)
    elif isinstance(data, Dataset) and hasattr(data, "__len__"):
        size = len(data)  # type: ignore[arg-type]
        if size == 0:
            raise ValueError("data must hold at least one example. Found an empty dataset.")
        items = []
        for i in range(size):
            try:
                item = data[i]
            except Exception as exc:  # noqa: BLE001 - the dataset's failure becomes one line
                raise ValueError(
                    f"data[{i}] cannot be read (data is read once, indices 0 .. {size - 1}): "
                    f"{_first_line(exc)}"
                ) from None
            if not isinstance(item, (tuple, list)) or len(item) != 2:
                raise ValueError(
                    f"data's examples must be (input, target) pairs. Found data[{i}] of type "
                    f"{type(item).__name__}."
                )
            items.append(item)
        try:
            tensors = tuple(default_collate(items))
        except Exception as exc:  # noqa: BLE001 - a collation failure becomes one line
            raise ValueError(
                f"data's examples must stack into an inputs tensor and a targets tensor: "
                f"{_first_line(exc)}"
            ) from None
        if not all(isinstance(t, Tensor) for t in tensors):
            found = ", ".join(type(t).__name__ for t in tensors)
            raise ValueError(
                f"data's inputs and targets must stack into tensors (numbers, arrays or "
                f"tensors). Found {found}."
            )
    else:
        raise ValueError(
            "data must be a TensorDataset of (inputs, targets), a pair of tensors, or a "
            f"map-style Dataset of (input, target) pairs. Found {type(data).__name__}."
        )
    if len(tensors) != 2:
        raise ValueError(f"data must hold two tensors, inputs and targets. Found {len(tensors)}.")
    inputs, targets = tensors
    if inputs.ndim == 0 or targets.ndim == 0 or inputs.shape[0] != targets.shape[0]:
        raise ValueError(
            "data's inputs and targets must have the same first dimension (one row per "
            f"example). Found shapes {tuple(inputs.shape)} and {tuple(targets.shape)}."
        )
    if inputs.shape[0] == 0:
        raise ValueError("data must hold at least one example. Found an empty dataset.")
    return inputs, targets


def _check_module(module: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    if not isinstance(module, nn.Module):
        raise ValueError(f"module must be a torch.nn.Module. Found {type(module)!r}.")
    if isinstance(module, AbstractGradSampleModule):
        raise ValueError("module is wrapped for per-sample gradients; pass the plain module.")
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise ValueError(f"optimizer must be a torch.optim.Optimizer. Found {type(optimizer)!r}.")
    trainable = [p for p in module.parameters() if p.requires_grad]
    if not trainable:
        raise ValueError("module has no trainable parameter (requires_grad=True).")
    held = _optimizer_params(optimizer)
    if {id(p) for p in held} != {id(p) for p in trainable} or len(held) != len(trainable):
        raise ValueError(
            "optimizer must hold exactly the module's trainable parameters, each once "
            f"({len(trainable)} tensors); it holds {len(held)}."
        )
    for name, sub in module.named_modules():
        if isinstance(sub, nn.modules.batchnorm._NormBase) and sub.track_running_stats:
            raise ValueError(
                f"module layer {name or type(sub).__name__} ({type(sub).__name__}) keeps running "
                "statistics, which local training cannot update per client; use GroupNorm or "
                "track_running_stats=False."
            )


def _snapshot(module: nn.Module) -> dict[str, Any]:
    """Everything a forward pass could write into ``module``: tensors and plain attributes."""
    state: dict[str, Any] = {}
    for name, sub in module.named_modules():
        for key, value in vars(sub).items():
            if key in ("_parameters", "_buffers", "_modules") or key.endswith("hooks"):
                continue
            state[f"{name}:{key}"] = value
        for key, tensor in [*sub._parameters.items(), *sub._buffers.items()]:
            state[f"{name}.{key}"] = None if tensor is None else tensor.detach().clone()
    return state


def _changed(before: dict[str, Any], after: dict[str, Any]) -> str | None:
    for key in sorted(set(before) | set(after)):
        old, new = before.get(key), after.get(key)
        if isinstance(old, Tensor) and isinstance(new, Tensor):
            if old.shape != new.shape or not torch.equal(old, new):
                return key
        elif old is not new and not (isinstance(old, (bool, int, str, type(None))) and old == new):
            return key
    return None


def _dry_run(
    module: nn.Module,
    inputs: Tensor,
    targets: Tensor,
    partition: ClientPartition,
    loss_fn: Callable[[Tensor, Tensor], Tensor],
) -> None:
    """Evaluate the loss on up to two examples of client 0, on a copy of ``module``.

    The copy runs in training mode (as local training does) and, if the module is in evaluation
    mode, in that mode too; ``module`` itself is never called, so no client data reaches it
    outside the protocol. A module whose forward pass writes into its state (a buffer, a
    parameter or a plain attribute, as BatchNorm's running statistics do) is refused: local
    training would write one client's data into the global model without noise.

    Raises:
        ValueError: naming the cause (loss, shape, or the attribute the forward pass changed).
    """
    if not callable(loss_fn):
        raise ValueError(f"loss_fn must be callable. Found {type(loss_fn).__name__}.")
    rows = torch.as_tensor(partition.client(0)[:2], device=inputs.device)
    try:
        probe = copy.deepcopy(module)
    except Exception as exc:  # noqa: BLE001 - any failure becomes one line
        raise ValueError(
            f"module cannot be copied for the set-up check ({type(exc).__name__}: "
            f"{str(exc).strip().splitlines()[0] if str(exc).strip() else ''}); the check runs "
            f"on a copy so that no client data reaches the model outside the protocol."
        ) from None
    modes = [True] if module.training else [True, False]
    for training in modes:
        probe.train(training)
        before = _snapshot(probe)
        try:
            with torch.no_grad():
                losses = loss_fn(probe(inputs[rows]), targets[rows])
        except Exception as exc:  # noqa: BLE001 - any failure becomes one line
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise ValueError(
                f"loss_fn(module(inputs), targets) fails on client 0's examples: {first}"
            ) from None
        changed = _changed(before, _snapshot(probe))
        if changed is not None:
            mode = "training" if training else "evaluation"
            raise ValueError(
                f"module's forward pass in {mode} mode changes its state ({changed}): local "
                f"training would write a client's data into the global model outside the "
                f"protocol, with no noise and no accounting. Use layers without running state "
                f"(as for BatchNorm: GroupNorm, or track_running_stats=False)."
            )
        if not isinstance(losses, Tensor) or tuple(losses.shape) != (rows.numel(),):
            shape = tuple(losses.shape) if isinstance(losses, Tensor) else type(losses).__name__
            raise ValueError(
                f"loss_fn must return one loss per example (shape ({rows.numel()},) here). "
                f"Found {shape}; e.g. pass reduction='none' to torch's losses."
            )


def make_private_clients(
    engine: PrivacyEngine,
    *,
    module: nn.Module,
    optimizer: torch.optim.Optimizer,
    data: Any,
    partition: Any,
    loss_fn: Callable[[Tensor, Tensor], Tensor],
    noise_multiplier: float,
    max_update_norm: float,
    client_lr: float,
    local_steps: int | None = None,
    local_epochs: int | None = None,
    local_batch_size: int | None = None,
    rounds: int | None = None,
    rate: float | None = None,
    sample_size: int | None = None,
    seed: int | None = None,
    start_round: int = 0,
    sensitivity: float | str = "replace-one",
    method: str | None = None,
    noise_mode: str = "sum",
    average: str = "expected",
    noise_generator: torch.Generator | None = None,
    client_chunk: int = DEFAULT_CLIENT_CHUNK,
    strict: bool = False,
) -> FederatedTrainer:
    """Prepare user-level shuffle-model training: clients with many examples train locally.

    The protocol follows ``engine.accountant`` as in :func:`shuffle_opacus.make_private`
    (``shuffled_checkin`` needs ``rate``, ``subsampled_shuffle`` needs ``sample_size``,
    ``shuffle`` uses all clients), with ``n`` the **number of clients** of ``partition``. The
    accountant is configured with that population. See :mod:`shuffle_opacus.federated` for the
    round, the privacy statement and the units. Everything is checked first; after a
    ``ValueError`` the module, the optimizer and the accountant are as they were.

    Args:
        engine: A ``PrivacyEngine(accountant=...)`` with a shuffle accountant.
        module: The global model (trainable parameters are trained and clipped together;
            buffers and frozen parameters stay fixed during local training).
        optimizer: The server's optimizer over exactly the module's trainable parameters (SGD
            with ``lr=1`` is FedAvg).
        data: A ``TensorDataset`` of ``(inputs, targets)``, a pair of tensors, or a map-style
            ``Dataset`` of ``(input, target)`` pairs (stacked once), on the module's device.
        partition: A :class:`ClientPartition`, one client id per example, or a list of index
            lists; it must cover every example exactly once, every client non-empty.
        loss_fn: ``loss_fn(outputs, targets)`` returning **one loss per example** (e.g.
            ``functools.partial(F.cross_entropy, reduction="none")``).
        noise_multiplier: Each client's noise std divided by ``max_update_norm`` (> 0).
        max_update_norm: Clipping norm ``C`` of a client's whole update (> 0).
        client_lr: Local SGD learning rate (> 0).
        local_steps: Local steps per round; exactly one of it and ``local_epochs``.
        local_epochs: Local epochs per round.
        local_batch_size: Examples per local step (``None``: the whole client).
        rounds: Number of rounds (integer >= 1).
        rate: Check-in probability (``shuffled_checkin``), in ``(0, 1]``.
        sample_size: Clients per round (``subsampled_shuffle``), in ``[1, n - 1]``.
        seed: Seed of the client sampling and of the local mini-batch order (integer in
            ``[0, 2**128 - 1]``; ``None`` draws one, kept in ``trainer.sampler.seed``). Must be
            ``None`` with ``engine.secure_mode``: the check-ins and cohorts then come from the
            operating system (:mod:`shuffle_opacus.common.secure_random`); the local mini-batch
            order stays PCG64 from the sampler's random label (it is not part of the guarantee: the
            clipped update may be any function of the client's data).
        start_round: First round iteration releases, to resume a run (same seed).
        sensitivity: ``"replace-one"`` (2, default), ``"paper"`` (1) or a number, in units of
            ``C``; see :mod:`shuffle_opacus.accounting.protocols`.
        method: Core analysis method of the accountant; ``None`` (default) is pld, the tightest
            sound one, or the Rényi bound where pld is beyond the work limits.
        noise_mode: ``"sum"`` (one draw of std ``sigma C sqrt(B_t)`` per parameter tensor) or
            ``"per_client"`` (every client's draw).
        average: ``"expected"`` (divide by the expected reports per round) or ``"reports"``
            (by the round's actual number).
        noise_generator: Torch generator of the noise, on the data's device, or ``None``
            (torch's default generator); must be ``None`` in secure mode.
        client_chunk: Clients trained together in one vectorised call (integer >= 1); memory
            grows with it.
        strict: Refuse rather than warn about a round that another engine in this process
            released on the same data and partition with the same seed
            (:mod:`shuffle_opacus.engine.release_registry`).

    Returns:
        A :class:`FederatedTrainer`; iterate over it and call ``optimizer.step()`` each round.

    Raises:
        ValueError: on any invalid or inconsistent argument; nothing has been changed then.
    """
    _check_module(module, optimizer)
    accountant = shuffle_accountant_of(engine)
    spec = accountant.spec()
    inputs, targets = _materialise(data)
    check_noise_generator(noise_generator, inputs.device)
    clients = as_partition(partition, int(inputs.shape[0]))
    training = LocalTraining(
        client_lr=client_lr,
        local_steps=local_steps,
        local_epochs=local_epochs,
        local_batch_size=local_batch_size,
    )
    noise_multiplier = check_positive("noise_multiplier", noise_multiplier)
    max_update_norm = check_positive("max_update_norm", max_update_norm)
    if noise_mode not in NOISE_MODES:
        raise ValueError(
            f"noise_mode must be one of {', '.join(NOISE_MODES)}. Found {noise_mode!r}."
        )
    if average not in AVERAGES:
        raise ValueError(f"average must be one of {', '.join(AVERAGES)}. Found {average!r}.")
    chunk = check_int("client_chunk", client_chunk, minimum=1)
    if engine.secure_mode and noise_generator is not None:
        raise ValueError("noise_generator must be None in secure mode (Opacus's rule).")
    if engine.secure_mode and noise_mode == "per_client":
        raise ValueError("noise_mode='per_client' is a reference mode and has no secure mode.")
    check_secure_rng(engine)
    n = clients.num_clients
    options = PrivacyOptions(
        max_grad_norm=max_update_norm,
        rounds=rounds,
        rate=rate,
        sample_size=sample_size,
        seed=seed,
        start_round=start_round,
        sensitivity=sensitivity,
        method=method,
        strict=strict,
    )
    sampler = new_sampler(spec, accountant.mechanism(), n, options, secure=bool(engine.secure_mode))
    sens = resolve_sensitivity(sensitivity)
    method = spec.check_method(method)
    size = sampler.sample_size
    accountant.check_configuration(population=n, sensitivity=sens, method=method, sample_size=size)
    check_release_plan(
        accountant,
        seed=sampler.seed,
        start=sampler.start_round,
        rounds=max(0, sampler.rounds - sampler.start_round),
        noise_multiplier=noise_multiplier,
        max_norm=max_update_norm,
        population=n,
        sample_rate=sampler.sample_rate,
        sensitivity=sens,
        dtype=next(p for p in module.parameters() if p.requires_grad).dtype,
        norm_name="max_update_norm",
        client_lr=training.client_lr,
        lr=optimizer_lr(optimizer),
    )
    _dry_run(module, inputs, targets, clients, loss_fn)
    binding = REGISTRY.new_binding(
        accountant,
        data_identity(
            data,
            length=n,
            extra=clients.order.tobytes() + clients.offsets.tobytes(),
            rows=_Rows(inputs, targets),
        ),
        seed=sampler.seed,
        sampling=(sampler.protocol, n, sampler.sample_rate),
        config=(sens, size, method),
        noise_multiplier=noise_multiplier,
        strict=options.strict,
        where=f"make_private_clients at {caller()}",
    )
    REGISTRY.check(binding, sampler.start_round, max(sampler.start_round, sampler.rounds))
    accountant.configure(population=n, sensitivity=sens, method=method, sample_size=size)
    bind_get_epsilon(engine)
    trainer = FederatedTrainer(
        module=module,
        optimizer=optimizer,
        inputs=inputs,
        targets=targets,
        partition=clients,
        loss_fn=loss_fn,
        training=training,
        sampler=sampler,
        accountant=accountant,
        noise_multiplier=noise_multiplier,
        max_update_norm=max_update_norm,
        average=average,
        noise_mode=noise_mode,
        noise_generator=engine.secure_rng if engine.secure_mode else noise_generator,
        secure_mode=engine.secure_mode,
        client_chunk=chunk,
    )
    REGISTRY.add(binding)
    return trainer


class _Rows:
    """The examples ``(inputs[i], targets[i])`` of materialised data, for its identity."""

    def __init__(self, inputs: Tensor, targets: Tensor) -> None:
        self.inputs, self.targets = inputs, targets

    def __len__(self) -> int:
        return int(self.inputs.shape[0])

    def __getitem__(self, i: int) -> tuple[Tensor, Tensor]:
        return self.inputs[i], self.targets[i]
