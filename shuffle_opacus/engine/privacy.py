"""Turn a model, optimizer and data loader into shuffle-model private training with Opacus.

:func:`make_private` is the package's counterpart of :meth:`opacus.PrivacyEngine.make_private`
for an engine created with one of the shuffle accountants
(``PrivacyEngine(accountant="shuffled_checkin")``, say). It replaces the loader's sampling by
the protocol's sampler (one dataset example = one client), wraps the model for per-sample
gradients, makes the optimizer add every participating client's local noise
(:class:`~shuffle_opacus.engine.noise.LocalNoiseDPOptimizer`), and configures the accountant and
makes it follow the sampler: every round the loader releases is accounted, stepped or not. Every
argument is checked before anything is changed: after a ``ValueError`` the module, the
optimizer and the accountant are as they were. :func:`make_private_with_epsilon` first
calibrates the local noise multiplier to a target ``(epsilon, delta)``
(:func:`shuffle_opacus.accounting.calibration.calibrate_noise_multiplier`), then delegates to
:func:`make_private`; the options of both are one frozen :class:`PrivacyOptions`.

A training loop: README.md, "Use it in your Opacus training loop"; the steps and the checks:
docs/opacus.md, "make_private".
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

import torch
from opacus import PrivacyEngine
from opacus.grad_sample import AbstractGradSampleModule, prepare_module
from opacus.validators import ModuleValidator
from torch import nn
from torch.utils.data import DataLoader

from ..accounting.calibration import calibrate_noise_multiplier
from ..accounting.protocols import Protocol, resolve_sensitivity
from ..common.validation import check_positive
from .accountants import ACCOUNTANTS, ShuffleAccountantBase
from .clipping import ClippedSumModule, FastGradientClipper
from .loading import (
    _first_example,
    _population,
    _private_loader,
    _sampler,
    new_sampler,
)
from .noise import NOISE_MODES, LocalNoiseDPOptimizer
from .options import PrivacyOptions
from .plan_checks import check_release_plan, optimizer_lr
from .release_registry import REGISTRY, caller, data_identity
from .sampling import ShuffleRoundSampler

__all__ = ["PrivacyOptions", "make_private", "make_private_with_epsilon", "new_sampler"]

#: Opacus's per-sample gradient modes, and ``fast``: the exact clipped sum of
#: :class:`~shuffle_opacus.engine.clipping.ClippedSumModule` (no per-sample gradients kept).
_GRAD_SAMPLE_MODES = ("hooks", "functorch", "ew", "fast")


@dataclass(frozen=True)
class _Plan:
    accountant: ShuffleAccountantBase
    protocol: Protocol
    sampler: ShuffleRoundSampler
    population: int
    sensitivity: float
    method: str | None
    first_example: Any


def shuffle_accountant_of(engine: PrivacyEngine) -> ShuffleAccountantBase:
    """Return the engine's shuffle accountant, the one that has counted its released rounds.

    Args:
        engine: An Opacus ``PrivacyEngine``.

    Returns:
        ``engine.accountant``.

    Raises:
        ValueError: if ``engine.accountant`` is not a shuffle accountant, or was replaced after
            an earlier one had rounds released under it.
    """
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


def check_noise_generator(noise_generator: Any, device: torch.device) -> None:
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


def check_secure_rng(engine: PrivacyEngine) -> None:
    """Refuse a secure-mode engine without Opacus's secure generator for the noise.

    ``PrivacyEngine(secure_mode=True)`` sets ``engine.secure_rng`` (torchcsprng's
    ``/dev/urandom`` generator); an engine whose ``secure_mode`` was switched on afterwards has
    none, and the noise would come from torch's default generator.

    Args:
        engine: The engine.

    Raises:
        ValueError: one line, if ``engine.secure_mode`` is on and ``engine.secure_rng`` is not a
            ``torch.Generator``.
    """
    if engine.secure_mode and not isinstance(getattr(engine, "secure_rng", None), torch.Generator):
        raise ValueError(
            "engine.secure_rng must be Opacus's secure generator with secure_mode=True (create "
            "the engine with PrivacyEngine(secure_mode=True), which needs torchcsprng); "
            f"found {getattr(engine, 'secure_rng', None)!r:.60}."
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
    check_secure_rng(engine)
    first = next(module.parameters(), None)
    check_noise_generator(
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
    accountant = shuffle_accountant_of(engine)
    spec = accountant.spec()
    n = _population(data_loader)
    first = _first_example(data_loader, n)
    sampler = _sampler(
        spec, accountant.mechanism(), data_loader, n, options, secure=bool(engine.secure_mode)
    )
    sens = resolve_sensitivity(options.sensitivity)
    method = spec.check_method(options.method)
    if options.grad_sample_mode == "ew":
        # Expanded weights cannot run a forward pass on an empty batch.
        remaining = len(sampler)
        p_empty = sampler.empty_round_probability(remaining)
        if p_empty > 1e-9:
            raise ValueError(
                f"grad_sample_mode='ew' cannot process an empty round, and with n={n}, "
                f"rate={sampler.sample_rate} an empty round occurs with probability "
                f"{p_empty:.2g} over {remaining} rounds; use grad_sample_mode 'hooks' or "
                f"'functorch'."
            )
    accountant.check_configuration(
        population=n, sensitivity=sens, method=method, sample_size=sampler.sample_size
    )
    accountant.check_unreleased(sampler.seed, sampler.next_round, sampler.next_round + len(sampler))
    return _Plan(accountant, spec, sampler, n, sens, method, first)


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
    sample_size = sampler.sample_size
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
        lr=optimizer_lr(optimizer),
    )
    binding = REGISTRY.new_binding(
        plan.accountant,
        data_identity(data_loader.dataset, length=plan.population),
        seed=sampler.seed,
        sampling=(sampler.protocol, plan.population, sampler.sample_rate),
        config=(plan.sensitivity, sample_size, plan.method),
        noise_multiplier=noise_multiplier,
        strict=options.strict,
        where=f"make_private at {caller()}",
    )
    REGISTRY.check(binding, sampler.next_round, sampler.next_round + len(sampler))
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
        # torch warns at every backward that a full backward hook fires for a module whose
        # inputs need no gradient (the data); Opacus's per-sample hooks still see every layer.
        warnings.filterwarnings(
            "ignore",
            message="Full backward hook is firing when gradients are computed with respect",
            category=UserWarning,
        )
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
    REGISTRY.add(binding)
    if engine.dataset is None:
        engine.dataset = data_loader.dataset
    bind_get_epsilon(engine)
    return wrapped, dp_optimizer, loader


def bind_get_epsilon(engine: PrivacyEngine) -> None:
    """Let ``engine.get_epsilon`` take the accountant's keyword arguments (``method=...``).

    Opacus's ``PrivacyEngine.get_epsilon(delta)`` forwards ``delta`` alone; after this
    ``engine.get_epsilon(delta=1e-5, method="exact")`` reaches
    :meth:`~shuffle_opacus.engine.accountants.ShuffleAccountantBase.get_epsilon`. The instance
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


GUARANTEES: dict[str, str] = {"tight": "pld", "proven": "proven"}
"""The method behind each guarantee a user can ask for."""


def method_for_guarantee(guarantee: str | None, method: str | None) -> str | None:
    """Return the method that gives ``guarantee`` (``method`` itself when it is ``None``).

    Raises:
        ValueError: for an unknown guarantee, or a method that gives another one.
    """
    if guarantee is None:
        return method
    if guarantee not in GUARANTEES:
        raise ValueError(f"guarantee must be 'tight' or 'proven'. Found {guarantee!r}.")
    wanted = GUARANTEES[guarantee]
    if method is not None and method != wanted:
        raise ValueError(
            f"method must be {wanted!r} or None with guarantee={guarantee!r}. Found {method!r}."
        )
    return wanted


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
    guarantee: str | None = None,
    noise_mode: str = "sum",
    loss_reduction: str = "mean",
    grad_sample_mode: str = "hooks",
    batch_first: bool = True,
    noise_generator: torch.Generator | None = None,
    strict: bool = False,
) -> tuple[nn.Module, LocalNoiseDPOptimizer, DataLoader]:
    """Prepare shuffle-model private training on an engine with a shuffle accountant.

    The protocol follows ``engine.accountant``: ``shuffled_checkin`` needs ``rate``,
    ``subsampled_shuffle`` needs ``sample_size`` (``m < n``), ``shuffle`` uses all ``n`` clients.
    ``n`` is the dataset size (one example = one client). If ``data_loader`` already samples with
    a :class:`~shuffle_opacus.engine.sampling.ShuffleRoundSampler`, that sampler is used (and must
    match the accountant); otherwise its batching is replaced by the protocol's sampler.

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
        guarantee: ``"tight"`` (method ``pld``, resting on Theorem 1's pair) or ``"proven"``
            (method ``proven``, from published theorems only), or ``None`` for ``method``.
            The accountant reports, and a target epsilon is calibrated to, that guarantee.
        noise_mode: See :class:`PrivacyOptions`.
        loss_reduction: See :class:`PrivacyOptions`.
        grad_sample_mode: See :class:`PrivacyOptions`.
        batch_first: See :class:`PrivacyOptions`.
        noise_generator: See :class:`PrivacyOptions`.
        strict: See :class:`PrivacyOptions`.

    Returns:
        ``(module, optimizer, data_loader)``: the wrapped module (Opacus's per-sample wrapper, or
        a :class:`~shuffle_opacus.engine.clipping.ClippedSumModule`), a
        :class:`~shuffle_opacus.engine.noise.LocalNoiseDPOptimizer`, and a loader whose batches are
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
        method=method_for_guarantee(guarantee, method),
        noise_mode=noise_mode,
        loss_reduction=loss_reduction,
        grad_sample_mode=grad_sample_mode,
        batch_first=batch_first,
        noise_generator=noise_generator,
        strict=strict,
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
    guarantee: str | None = None,
    noise_mode: str = "sum",
    loss_reduction: str = "mean",
    grad_sample_mode: str = "hooks",
    batch_first: bool = True,
    noise_generator: torch.Generator | None = None,
    strict: bool = False,
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
        guarantee: ``"tight"`` (method ``pld``, resting on Theorem 1's pair) or ``"proven"``
            (method ``proven``, from published theorems only), or ``None`` for ``method``.
            The accountant reports, and a target epsilon is calibrated to, that guarantee.
        noise_mode: See :class:`PrivacyOptions`.
        loss_reduction: See :class:`PrivacyOptions`.
        grad_sample_mode: See :class:`PrivacyOptions`.
        batch_first: See :class:`PrivacyOptions`.
        noise_generator: See :class:`PrivacyOptions`.
        strict: See :class:`PrivacyOptions`.
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
        method=method_for_guarantee(guarantee, method),
        noise_mode=noise_mode,
        loss_reduction=loss_reduction,
        grad_sample_mode=grad_sample_mode,
        batch_first=batch_first,
        noise_generator=noise_generator,
        strict=strict,
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
        sample_size=sampler.sample_size,
        sensitivity=plan.sensitivity,
        method=plan.method,
        rel_tol=rel_tol,
    )
    return _make_private(engine, module, optimizer, data_loader, noise_multiplier, options)
