"""Turn a model, optimizer and data loader into shuffle-model private training with Opacus.

:func:`make_private` is the package's counterpart of :meth:`opacus.PrivacyEngine.make_private`
for an engine created with one of the shuffle accountants::

    import shuffle_opacus
    from opacus import PrivacyEngine

    engine = PrivacyEngine(accountant="shuffled_checkin")
    model, optimizer, loader = shuffle_opacus.make_private(
        engine, module=model, optimizer=optimizer, data_loader=loader,
        noise_multiplier=5.0, max_grad_norm=0.01, rate=0.1, rounds=5540, seed=0,
    )

It replaces the loader's sampling by the protocol's sampler (one dataset example = one client),
wraps the model for per-sample gradients, makes the optimizer add every participating client's
local noise (:class:`~shuffle_opacus.noise.LocalNoiseDPOptimizer`), and configures the
accountant and makes it follow the sampler: every round the loader releases is accounted, stepped
or not. Every argument is checked before anything is changed: after a ``ValueError`` the module,
the optimizer and the accountant are as they were.

:func:`make_private_with_epsilon` first calibrates the local noise multiplier to a target
``(epsilon, delta)`` with :func:`shuffle_opacus.accounting.calibrate_noise_multiplier` and then
delegates to :func:`make_private`. The options of both are gathered in one frozen
:class:`PrivacyOptions`, validated once before anything changes.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Any

import torch
from opacus import PrivacyEngine
from opacus.data_loader import dtype_safe, shape_safe, wrap_collate_with_empty
from opacus.grad_sample import AbstractGradSampleModule, prepare_module
from opacus.validators import ModuleValidator
from torch import nn
from torch.utils.data import DataLoader, IterableDataset

from .accountants import ACCOUNTANTS, ShuffleAccountantBase
from .accounting import calibrate_noise_multiplier
from .analysis._validation import check_positive
from .clipping import ClippedSumModule, FastGradientClipper
from .noise import NOISE_MODES, LocalNoiseDPOptimizer
from .plan_checks import check_release_plan
from .protocols import PROTOCOLS, Protocol, resolve_sensitivity
from .sampling import FixedSizeShuffledSampler, ShuffledCheckInSampler, ShuffleRoundSampler
from .step_guard import StepGuard

__all__ = ["PrivacyOptions", "make_private", "make_private_with_epsilon"]

#: Opacus's per-sample gradient modes, and ``fast``: the exact clipped sum of
#: :class:`~shuffle_opacus.clipping.ClippedSumModule` (no per-sample gradients kept).
_GRAD_SAMPLE_MODES = ("hooks", "functorch", "ew", "fast")


@dataclass(frozen=True)
class PrivacyOptions:
    """The options of :func:`make_private` besides the model, optimizer, loader and noise.

    Attributes:
        max_grad_norm: Clipping norm ``C`` of each client's gradient (> 0).
        rounds: Number of rounds (required unless the loader has a shuffle sampler).
        rate: Check-in probability (``shuffled_checkin``), in ``(0, 1]``.
        sample_size: Clients per round (``subsampled_shuffle``), in ``[1, n - 1]``.
        seed: Sampling seed (integer >= 0); ``None`` draws one (read ``loader.batch_sampler.seed``).
        start_round: First round to produce, to resume a run (with the same seed).
        sensitivity: ``"replace-one"`` (2, default), ``"paper"`` (1) or a number, in units of
            ``C``; see :mod:`shuffle_opacus.protocols`.
        method: Core analysis method; ``None`` (default) is pld, the tightest sound one, or the
            protocol's Rényi bound where pld is beyond the work limits.
        noise_mode: ``"sum"`` (one draw with std ``sigma C sqrt(B_t)``) or ``"per_client"``.
        loss_reduction: ``"mean"`` or ``"sum"``, matching the training loss.
        grad_sample_mode: Opacus per-sample gradient mode, ``hooks``, ``functorch`` or ``ew``, or
            ``fast``: the exact clipped sum of :class:`~shuffle_opacus.clipping.ClippedSumModule`
            computed during ``loss.backward()`` without keeping per-sample gradients (models of
            ``Conv2d``, ``Linear`` and ``GroupNorm`` layers).
        batch_first: Whether the batch dimension of inputs is the first one.
        noise_generator: Torch generator for the noise (not in secure mode).
    """

    max_grad_norm: float
    rounds: int | None = None
    rate: float | None = None
    sample_size: int | None = None
    seed: int | None = None
    start_round: int = 0
    sensitivity: float | str = "replace-one"
    method: str | None = None
    noise_mode: str = "sum"
    loss_reduction: str = "mean"
    grad_sample_mode: str = "hooks"
    batch_first: bool = True
    noise_generator: torch.Generator | None = None


@dataclass(frozen=True)
class _Plan:
    accountant: ShuffleAccountantBase
    protocol: Protocol
    sampler: ShuffleRoundSampler
    population: int
    sensitivity: float
    method: str | None
    first_example: Any


def _shuffle_accountant(engine: PrivacyEngine) -> ShuffleAccountantBase:
    accountant = getattr(engine, "accountant", None)
    held = getattr(getattr(engine, "get_epsilon", None), "bound_accountant", None)
    if isinstance(held, ShuffleAccountantBase) and held is not accountant and len(held) > 0:
        raise ValueError(
            f"engine.accountant was replaced after {len(held)} rounds were released under "
            f"its earlier accountant; a new accountant would not count them. Restore it, or use "
            f"a new PrivacyEngine for an independent training."
        )
    if not isinstance(accountant, ShuffleAccountantBase):
        found = (
            accountant.mechanism()
            if accountant is not None and hasattr(accountant, "mechanism")
            else accountant
        )
        raise ValueError(
            f"engine.accountant must be one of {', '.join(ACCOUNTANTS)} "
            f"(PrivacyEngine(accountant=...)). Found {found!r}."
        )
    return accountant


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
    spec: Protocol, name: str, sampler: ShuffleRoundSampler, n: int, options: PrivacyOptions
) -> ShuffleRoundSampler:
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
        "rate": getattr(sampler, "rate", None),
        "sample_size": getattr(sampler, "m", None),
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


def _sampler(
    spec: Protocol, name: str, data_loader: DataLoader, n: int, options: PrivacyOptions
) -> ShuffleRoundSampler:
    existing = data_loader.batch_sampler
    if isinstance(existing, ShuffleRoundSampler):
        return _existing_sampler(spec, name, existing, n, options)
    return new_sampler(spec, name, n, options)


def new_sampler(spec: Protocol, name: str, n: int, options: PrivacyOptions) -> ShuffleRoundSampler:
    """Build the protocol's sampler over ``n`` clients from the options, after checking them.

    Shared by :func:`make_private` (one example = one client) and
    :func:`shuffle_opacus.clients.make_private_clients` (``n`` = number of clients).

    Raises:
        ValueError: for missing or out-of-range ``rounds``, ``rate``, ``sample_size``, ``seed``
            or ``start_round``, naming the accountant to use where another one fits.
    """
    if options.rounds is None:
        raise ValueError("rounds is required (an integer >= 1): the number of training rounds.")
    size = options.sample_size
    # Messages that name the accountant to use instead; the rest is the protocol's own check.
    if spec.parameter is None and size is not None and size != n:
        raise ValueError(
            f"sample_size of the {name} accountant must equal the number of clients ({n}); use "
            f"{PROTOCOLS['subsampled'].accountant} for fewer clients per round. Found {size!r}."
        )
    if spec.parameter == "sample_size" and size == n:
        raise ValueError(
            f"sample_size must be an integer in [1, {n - 1}] for {name}; with all {n} clients "
            f"per round use the {PROTOCOLS['full'].accountant} accountant. Found {size!r}."
        )
    spec.sample_rate(population=n, rate=options.rate, sample_size=size)
    return spec.make_sampler(
        n,
        rate=options.rate,
        sample_size=size,
        rounds=options.rounds,
        seed=options.seed,
        start_round=options.start_round,
    )


def _check_noise_generator(noise_generator: Any, device: torch.device) -> None:
    """Refuse a noise generator that torch could not use to draw noise on ``device``.

    Args:
        noise_generator: The caller's ``noise_generator``.
        device: Where the noise is drawn (the module's device).

    Raises:
        ValueError: one line, if it is neither ``None`` nor a ``torch.Generator``, or if it is
            a generator of another device.
    """
    if noise_generator is None:
        return
    if not isinstance(noise_generator, torch.Generator):
        raise ValueError(
            "noise_generator must be a torch.Generator (e.g. torch.Generator().manual_seed(0)) "
            f"or None. Found {type(noise_generator).__name__} {noise_generator!r:.60}."
        )
    where = noise_generator.device
    if where.type != device.type or (
        where.index is not None and device.index is not None and where.index != device.index
    ):
        raise ValueError(
            f"noise_generator must be a generator of the device {device} (the noise is "
            f"drawn there). Found a generator of {where}; use torch.Generator(device="
            f"{str(device)!r})."
        )


def _check_training_args(
    engine: PrivacyEngine,
    module: nn.Module,
    optimizer: torch.optim.Optimizer,
    options: PrivacyOptions,
) -> None:
    if not isinstance(module, nn.Module):
        raise ValueError(f"module must be a torch.nn.Module. Found {type(module)!r}.")
    if isinstance(module, AbstractGradSampleModule):
        raise ValueError(
            "module is already wrapped for per-sample gradients; pass the plain module."
        )
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise ValueError(f"optimizer must be a torch.optim.Optimizer. Found {type(optimizer)!r}.")
    check_positive("max_grad_norm", options.max_grad_norm)
    if options.noise_mode not in NOISE_MODES:
        raise ValueError(
            f"noise_mode must be one of {', '.join(NOISE_MODES)}. Found {options.noise_mode!r}."
        )
    if options.loss_reduction not in ("mean", "sum"):
        raise ValueError(
            f"loss_reduction must be 'mean' or 'sum'. Found {options.loss_reduction!r}."
        )
    if options.grad_sample_mode not in _GRAD_SAMPLE_MODES:
        raise ValueError(
            f"grad_sample_mode must be one of {', '.join(_GRAD_SAMPLE_MODES)}. "
            f"Found {options.grad_sample_mode!r}."
        )
    if engine.secure_mode and options.noise_generator is not None:
        raise ValueError("noise_generator must be None in secure mode (Opacus's rule).")
    first = next(module.parameters(), None)
    _check_noise_generator(
        options.noise_generator, first.device if first is not None else torch.device("cpu")
    )
    if engine.secure_mode and options.noise_mode == "per_client":
        raise ValueError("noise_mode='per_client' is a reference mode and has no secure mode.")
    params = set(module.parameters())
    for group in optimizer.param_groups:
        for p in group["params"]:
            if p not in params:
                raise ValueError("optimizer holds parameters that are not the module's.")
    if options.grad_sample_mode == "fast":
        FastGradientClipper(module).remove()  # raises for a layer it cannot clip
    errors = ModuleValidator.validate(module, strict=False)
    if errors:
        raise ValueError(
            "module is not compatible with per-sample clipping: "
            + "; ".join(str(e) for e in errors)
            + " (opacus.validators.ModuleValidator.fix can replace such layers)."
        )


def _prepare(
    engine: PrivacyEngine,
    module: nn.Module,
    optimizer: torch.optim.Optimizer,
    data_loader: DataLoader,
    options: PrivacyOptions,
) -> _Plan:
    """Run every check shared by the two public helpers; change nothing."""
    _check_training_args(engine, module, optimizer, options)
    accountant = _shuffle_accountant(engine)
    spec = accountant.spec()
    n = _population(data_loader)
    first = _first_example(data_loader, n)
    sampler = _sampler(spec, accountant.mechanism(), data_loader, n, options)
    sens = resolve_sensitivity(options.sensitivity)
    method = spec.check_method(options.method)
    if options.grad_sample_mode == "ew" and isinstance(sampler, ShuffledCheckInSampler):
        # Expanded weights cannot run a forward pass on an empty batch.
        remaining = len(sampler)
        p_empty = -math.expm1(remaining * math.log1p(-math.exp(n * math.log1p(-sampler.rate))))
        if sampler.rate < 1.0 and p_empty > 1e-9:
            raise ValueError(
                f"grad_sample_mode='ew' cannot process an empty round, and with n={n}, "
                f"rate={sampler.rate} an empty round occurs with probability {p_empty:.2g} over "
                f"{remaining} rounds; use grad_sample_mode 'hooks' or 'functorch'."
            )
    sample = sampler.m if isinstance(sampler, FixedSizeShuffledSampler) else None
    accountant.check_configuration(
        population=n, sensitivity=sens, method=method, sample_size=sample
    )
    accountant.check_unreleased(sampler.seed, sampler.next_round, sampler.next_round + len(sampler))
    return _Plan(accountant, spec, sampler, n, sens, method, first)


class PrivateDataLoader(DataLoader):
    """A loader whose batches are the rounds of a shuffle sampler, each one told to a guard.

    As it yields a round's batch it tells the accountant's
    :class:`~shuffle_opacus.step_guard.StepGuard` that this round is now the current one, so
    that the next ``optimizer.step()`` is checked against it (with worker processes the sampler
    releases rounds ahead of the batches the loop sees).
    """

    _guard: StepGuard | None = None

    def __iter__(self) -> Any:
        """Yield the batches of the sampler's next rounds (see :class:`DataLoader`)."""
        if self._guard is not None:
            self._guard.use_loader()
        for batch in super().__iter__():
            if self._guard is not None:
                self._guard.on_deliver()
            yield batch


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


def _make_private(
    engine: PrivacyEngine,
    module: nn.Module,
    optimizer: torch.optim.Optimizer,
    data_loader: DataLoader,
    noise_multiplier: float,
    options: PrivacyOptions,
) -> tuple[nn.Module, LocalNoiseDPOptimizer, DataLoader]:
    check_positive("noise_multiplier", noise_multiplier)
    plan = _prepare(engine, module, optimizer, data_loader, options)
    sampler = plan.sampler
    sample_size = sampler.m if isinstance(sampler, FixedSizeShuffledSampler) else None
    params = [p for p in module.parameters() if p.requires_grad]
    check_release_plan(
        plan.accountant,
        seed=sampler.seed,
        start=sampler.next_round,
        rounds=len(sampler),
        noise_multiplier=noise_multiplier,
        max_norm=options.max_grad_norm,
        population=plan.population,
        sample_rate=sampler.sample_rate,
        sensitivity=plan.sensitivity,
        dtype=params[0].dtype if params else torch.get_default_dtype(),
    )
    if engine.secure_mode:
        warnings.warn(
            "secure_mode protects the noise; client sampling uses numpy's PCG64, which is a "
            "simulation-grade generator.",
            stacklevel=3,
        )
    loader = _private_loader(data_loader, sampler, plan.first_example)
    plan.accountant.configure(
        population=plan.population,
        sensitivity=plan.sensitivity,
        method=plan.method,
        sample_size=sample_size,
    )
    wrapped: nn.Module
    if options.grad_sample_mode == "fast":
        wrapped = ClippedSumModule(
            module, max_grad_norm=options.max_grad_norm, loss_reduction=options.loss_reduction
        )
    else:
        sampled: AbstractGradSampleModule = prepare_module(
            module,
            options.grad_sample_mode,
            batch_first=options.batch_first,
            loss_reduction=options.loss_reduction,
        )
        sampled.forbid_grad_accumulation()
        wrapped = sampled
    dp_optimizer = LocalNoiseDPOptimizer(
        optimizer,
        noise_multiplier=noise_multiplier,
        max_grad_norm=options.max_grad_norm,
        expected_batch_size=sampler.expected_batch_size,
        accounting_sample_rate=sampler.sample_rate,
        loss_reduction=options.loss_reduction,
        generator=engine.secure_rng if engine.secure_mode else options.noise_generator,
        secure_mode=engine.secure_mode,
        noise_mode=options.noise_mode,
    )
    if isinstance(wrapped, ClippedSumModule):
        dp_optimizer.use_clipped_sums(wrapped)
    # Last: from here on the accountant records every round the sampler releases.
    hook = plan.accountant.local_noise_hook(sampler, noise_multiplier=dp_optimizer.noise_multiplier)
    dp_optimizer.attach_step_hook(hook)
    loader._guard = hook.guard  # type: ignore[attr-defined]
    if engine.dataset is None:
        engine.dataset = data_loader.dataset
    bind_get_epsilon(engine)
    return wrapped, dp_optimizer, loader


def bind_get_epsilon(engine: PrivacyEngine) -> None:
    """Let ``engine.get_epsilon`` take the accountant's keyword arguments (``method=...``).

    Opacus's ``PrivacyEngine.get_epsilon(delta)`` forwards ``delta`` alone; after this
    ``engine.get_epsilon(delta=1e-5, method="exact")`` reaches
    :meth:`~shuffle_opacus.accountants.ShuffleAccountantBase.get_epsilon`. The instance
    attribute goes with the engine; nothing else of it changes.

    The bound accountant is the one that records the released rounds: if ``engine.accountant``
    is replaced afterwards, ``engine.get_epsilon`` refuses instead of reporting the new one's
    (possibly empty) history.

    Args:
        engine: An engine whose accountant is one of the package's.
    """
    bound = engine.accountant

    def get_epsilon(delta: float, **kwargs: Any) -> float:
        if engine.accountant is not bound:
            raise ValueError(
                "engine.accountant was replaced after training was prepared; the released "
                "rounds are recorded in the accountant make_private bound, so the new one's "
                "epsilon would not cover them. Restore it (or use a new PrivacyEngine)."
            )
        return float(bound.get_epsilon(delta, **kwargs))

    get_epsilon.__doc__ = ShuffleAccountantBase.get_epsilon.__doc__
    get_epsilon.bound_accountant = bound  # type: ignore[attr-defined]
    engine.get_epsilon = get_epsilon  # type: ignore[method-assign]


def make_private(
    engine: PrivacyEngine,
    *,
    module: nn.Module,
    optimizer: torch.optim.Optimizer,
    data_loader: DataLoader,
    noise_multiplier: float,
    max_grad_norm: float,
    rounds: int | None = None,
    rate: float | None = None,
    sample_size: int | None = None,
    seed: int | None = None,
    start_round: int = 0,
    sensitivity: float | str = "replace-one",
    method: str | None = None,
    noise_mode: str = "sum",
    loss_reduction: str = "mean",
    grad_sample_mode: str = "hooks",
    batch_first: bool = True,
    noise_generator: torch.Generator | None = None,
) -> tuple[nn.Module, LocalNoiseDPOptimizer, DataLoader]:
    """Prepare shuffle-model private training on an engine with a shuffle accountant.

    The protocol follows ``engine.accountant``: ``shuffled_checkin`` needs ``rate``,
    ``subsampled_shuffle`` needs ``sample_size`` (``m < n``), ``shuffle`` uses all ``n`` clients.
    ``n`` is the dataset size (one example = one client). If ``data_loader`` already samples with
    a :class:`~shuffle_opacus.sampling.ShuffleRoundSampler`, that sampler is used (and must match
    the accountant); otherwise its batching is replaced by the protocol's sampler.

    The accountant follows the sampler: every batch the returned loader hands out is one round,
    recorded when it is released, whether or not ``optimizer.step()`` runs for it (skipping an
    empty round does not make it disappear from the accounting). Step once per batch; a step
    without a released round is refused. A second ``for`` over the loader continues with new
    rounds (``rounds``, ``rounds + 1``, ...), which are accounted too; it never repeats the
    check-ins of the first pass. ``noise_multiplier``, ``max_grad_norm``, the sampler's
    parameters and the optimizer's ``accounting_sample_rate`` are fixed from here on.

    Args:
        engine: A ``PrivacyEngine(accountant=...)`` with a shuffle accountant.
        module: The model (plain ``nn.Module`` in training mode).
        optimizer: Optimizer over the module's parameters.
        data_loader: Loader over the clients' data.
        noise_multiplier: Local sigma: each client's noise std divided by ``max_grad_norm``.
        max_grad_norm: See :class:`PrivacyOptions`, as are all the remaining arguments.
        rounds: See :class:`PrivacyOptions`.
        rate: See :class:`PrivacyOptions`.
        sample_size: See :class:`PrivacyOptions`.
        seed: See :class:`PrivacyOptions`.
        start_round: See :class:`PrivacyOptions`.
        sensitivity: See :class:`PrivacyOptions`.
        method: See :class:`PrivacyOptions`.
        noise_mode: See :class:`PrivacyOptions`.
        loss_reduction: See :class:`PrivacyOptions`.
        grad_sample_mode: See :class:`PrivacyOptions`.
        batch_first: See :class:`PrivacyOptions`.
        noise_generator: See :class:`PrivacyOptions`.

    Returns:
        ``(module, optimizer, data_loader)``: the wrapped module (Opacus's per-sample wrapper, or
        a :class:`~shuffle_opacus.clipping.ClippedSumModule`), a
        :class:`~shuffle_opacus.noise.LocalNoiseDPOptimizer`, and a loader whose batches are
        rounds.

    Raises:
        ValueError: on any invalid or inconsistent argument; nothing has been changed then.
    """
    options = PrivacyOptions(
        max_grad_norm=max_grad_norm,
        rounds=rounds,
        rate=rate,
        sample_size=sample_size,
        seed=seed,
        start_round=start_round,
        sensitivity=sensitivity,
        method=method,
        noise_mode=noise_mode,
        loss_reduction=loss_reduction,
        grad_sample_mode=grad_sample_mode,
        batch_first=batch_first,
        noise_generator=noise_generator,
    )
    return _make_private(engine, module, optimizer, data_loader, noise_multiplier, options)


def make_private_with_epsilon(
    engine: PrivacyEngine,
    *,
    module: nn.Module,
    optimizer: torch.optim.Optimizer,
    data_loader: DataLoader,
    target_epsilon: float,
    target_delta: float,
    max_grad_norm: float,
    rounds: int | None = None,
    rate: float | None = None,
    sample_size: int | None = None,
    seed: int | None = None,
    start_round: int = 0,
    sensitivity: float | str = "replace-one",
    method: str | None = None,
    noise_mode: str = "sum",
    loss_reduction: str = "mean",
    grad_sample_mode: str = "hooks",
    batch_first: bool = True,
    noise_generator: torch.Generator | None = None,
    rel_tol: float = 1e-3,
) -> tuple[nn.Module, LocalNoiseDPOptimizer, DataLoader]:
    """Like :func:`make_private`, with the local noise multiplier calibrated to a budget.

    The noise multiplier is the smallest (to ``rel_tol``) for which all the sampler's rounds
    stay within ``(target_epsilon, target_delta)``; it never overshoots the target. It is
    available afterwards as ``optimizer.noise_multiplier``. Everything is checked first; then
    the noise is calibrated and :func:`make_private` does the rest.

    Args:
        engine: See :func:`make_private`.
        module: See :func:`make_private`.
        optimizer: See :func:`make_private`.
        data_loader: See :func:`make_private`.
        target_epsilon: Budget epsilon after all rounds (> 0).
        target_delta: Budget delta in ``(0, 1)``.
        max_grad_norm: See :class:`PrivacyOptions`, as are the arguments up to ``noise_generator``.
        rounds: See :class:`PrivacyOptions`.
        rate: See :class:`PrivacyOptions`.
        sample_size: See :class:`PrivacyOptions`.
        seed: See :class:`PrivacyOptions`.
        start_round: See :class:`PrivacyOptions`.
        sensitivity: See :class:`PrivacyOptions`.
        method: See :class:`PrivacyOptions`.
        noise_mode: See :class:`PrivacyOptions`.
        loss_reduction: See :class:`PrivacyOptions`.
        grad_sample_mode: See :class:`PrivacyOptions`.
        batch_first: See :class:`PrivacyOptions`.
        noise_generator: See :class:`PrivacyOptions`.
        rel_tol: Relative precision of the calibrated noise multiplier.

    Returns:
        As :func:`make_private`.

    Raises:
        ValueError: on invalid arguments or an unreachable budget; nothing has been changed then.
    """
    options = PrivacyOptions(
        max_grad_norm=max_grad_norm,
        rounds=rounds,
        rate=rate,
        sample_size=sample_size,
        seed=seed,
        start_round=start_round,
        sensitivity=sensitivity,
        method=method,
        noise_mode=noise_mode,
        loss_reduction=loss_reduction,
        grad_sample_mode=grad_sample_mode,
        batch_first=batch_first,
        noise_generator=noise_generator,
    )
    plan = _prepare(engine, module, optimizer, data_loader, options)
    if len(plan.accountant) > 0:
        warnings.warn(
            "engine.accountant already holds rounds; the calibrated noise assumes a fresh budget, "
            "so the total epsilon will exceed the target.",
            stacklevel=2,
        )
    sampler = plan.sampler
    noise_multiplier = calibrate_noise_multiplier(
        target_epsilon=target_epsilon,
        delta=target_delta,
        population=plan.population,
        rounds=sampler.rounds,
        protocol=plan.protocol,
        rate=sampler.sample_rate if not plan.protocol.fixed_size else None,
        sample_size=sampler.m if isinstance(sampler, FixedSizeShuffledSampler) else None,
        sensitivity=plan.sensitivity,
        method=plan.method,
        rel_tol=rel_tol,
    )
    return _make_private(engine, module, optimizer, data_loader, noise_multiplier, options)
