"""Checks of a training plan that run before its first round is released.

Refusing after a release is too late: the round has left the device. :func:`check_release_plan`
runs when :func:`shuffle_opacus.make_private` or :func:`shuffle_opacus.make_private_clients`
prepares training and refuses

* rounds of the sampler's seed that the engine's accountant already released (a second loader
  or trainer, a copy, a restart at ``start_round=0`` after loading a state);
* noise, clipping and steps whose arithmetic is not finite in the parameters' dtype (the noise
  std ``sigma C sqrt(n)`` of a round's sum, the clipping norm, the local learning rate, the
  optimizer's learning rate), with headroom: every such value must stay below the square root of
  the dtype's largest number;
* a plan whose epsilon cannot be computed or is not finite: the analysis sigma (noise multiplier
  / sensitivity) outside the analyses' range, or the Rényi bound of the accountant's history plus
  the planned rounds, with the order capped at :data:`CHECK_MAX_ORDER` so that the check costs
  milliseconds (a looser number than the accounting's, used only as a test of computability).

:func:`check_plan_values` runs the same checks on the values alone (no accountant, no model),
with the caller's names for the parameters: the MNIST experiment checks its config with it
before anything is created.
"""

from __future__ import annotations

import math
import numbers
import warnings
from collections.abc import Mapping, Sequence

import torch

from ..accounting.history import history_epsilon
from ..accounting.protocols import HistoryEntry, Protocol, get_protocol, resolve_sensitivity
from ..common.validation import SIGMA_RANGE
from .accountants import ShuffleAccountantBase

__all__ = [
    "CHECK_DELTA",
    "CHECK_MAX_ORDER",
    "check_plan_values",
    "check_release_plan",
    "finite_limit",
    "optimizer_lr",
]

#: Rényi order cap of the computability check (a cheap, loose bound).
CHECK_MAX_ORDER = 32

#: Delta of the computability check.
CHECK_DELTA = 1e-5


def finite_limit(dtype: torch.dtype) -> float:
    """Return the largest value the plan checks accept in ``dtype`` (sqrt of its maximum).

    Args:
        dtype: A floating-point torch dtype.

    Returns:
        ``sqrt(torch.finfo(dtype).max)``.
    """
    return math.sqrt(torch.finfo(dtype).max)


def _check_below(
    name: str, value: float, limit: float, dtype: torch.dtype, what: str | None = None
) -> None:
    if not value <= limit:
        subject = f"{name}" if what is None else f"{name} must keep {what}"
        verb = " must be" if what is None else ""
        raise ValueError(
            f"{subject}{verb} at most {limit:.3g} (the square root of the largest "
            f"{dtype} number, so that the round's arithmetic stays finite). Found {value:.3g}."
        )


def optimizer_lr(optimizer: torch.optim.Optimizer) -> float | None:
    """Return the largest learning rate of ``optimizer``'s parameter groups.

    Args:
        optimizer: A torch optimizer (its groups' ``lr`` a number or a one-element tensor).

    Returns:
        The largest ``lr``, or ``None`` when no group has a numeric one.
    """
    rates = []
    for group in optimizer.param_groups:
        lr = group.get("lr")
        if isinstance(lr, torch.Tensor) and lr.numel() == 1:
            lr = lr.item()
        if isinstance(lr, numbers.Real) and not isinstance(lr, bool):
            rates.append(float(lr))
    return max(rates, default=None)


#: How messages name the parameters of :func:`check_plan_values` by default (the API's names).
API_NAMES: Mapping[str, str] = {
    "noise_multiplier": "noise_multiplier",
    "max_norm": "max_grad_norm",
    "client_lr": "client_lr",
    "lr": "the optimizer's lr",
}


def check_plan_values(
    *,
    noise_multiplier: float,
    max_norm: float,
    population: int,
    sample_rate: float,
    sensitivity: float | str,
    rounds: int,
    protocol: str | Protocol,
    dtype: torch.dtype,
    lr: float | None = None,
    client_lr: float | None = None,
    history: Sequence[HistoryEntry] = (),
    names: Mapping[str, str] = API_NAMES,
) -> None:
    """Refuse plan values whose arithmetic overflows or whose epsilon cannot be computed.

    Args:
        noise_multiplier: Each client's noise std divided by the clipping norm.
        max_norm: The clipping norm ``C``.
        population: Number of clients ``n``.
        sample_rate: Per-round inclusion probability of one client.
        sensitivity: Sensitivity in units of ``C`` (see
            :func:`~shuffle_opacus.accounting.protocols.resolve_sensitivity`).
        rounds: Number of rounds planned.
        protocol: The protocol (name or record).
        dtype: The parameters' dtype.
        lr: The optimizer's (largest) learning rate, checked like the norm; ``None`` to skip.
        client_lr: The local learning rate (user level), checked like the norm.
        history: Rounds already accounted, composed with the planned ones.
        names: How messages name ``noise_multiplier``, ``max_norm``, ``client_lr`` and ``lr``
            (:data:`API_NAMES` by default; the experiment passes its config keys).

    Raises:
        ValueError: one line naming the parameter (by ``names``) and its allowed range.
    """
    name = {**API_NAMES, **names}
    nm_name, norm_name = name["noise_multiplier"], name["max_norm"]
    limit = finite_limit(dtype)
    _check_below(norm_name, max_norm, limit, dtype)
    if client_lr is not None:
        _check_below(name["client_lr"], client_lr, limit, dtype)
    if lr is not None:
        _check_below(name["lr"], lr, limit, dtype)
    scale = max_norm * math.sqrt(population)
    if not noise_multiplier * scale <= limit:
        raise ValueError(
            f"{nm_name} must keep {nm_name} * {norm_name} * sqrt(n) at most {limit:.3g} (the "
            f"square root of the largest {dtype} number, so that the round's arithmetic stays "
            f"finite): {nm_name} <= {limit / scale:.3g} with {norm_name} {max_norm:g} and n = "
            f"{population}. Found {noise_multiplier:.3g}."
        )
    sens = resolve_sensitivity(sensitivity)
    low, high = SIGMA_RANGE
    if not low * sens <= noise_multiplier <= high * sens:
        raise ValueError(
            f"{nm_name}={noise_multiplier!r}: epsilon of the {rounds} planned rounds cannot be "
            f"computed: {nm_name} must be in [{low * sens:.3g}, {high * sens:.3g}] (with "
            f"sensitivity {sens:g} C, the analysis sigma {nm_name} / sensitivity must lie in "
            f"[{low:g}, {high:g}]); nothing was released."
        )
    record = get_protocol(protocol)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            result = history_epsilon(
                [*history, (noise_multiplier, sample_rate, rounds)],
                protocol=record,
                delta=CHECK_DELTA,
                population=population,
                sensitivity=sens,
                method=record.fallback,
                max_order=CHECK_MAX_ORDER,
            )
    except ValueError as exc:
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ValueError(
            f"{nm_name}={noise_multiplier!r}: epsilon of the {rounds} planned rounds "
            f"cannot be computed ({reason}); nothing was released."
        ) from None
    if not math.isfinite(result.epsilon):
        raise ValueError(
            f"{nm_name}={noise_multiplier!r}: epsilon of the {rounds} planned rounds is "
            f"not finite; nothing was released. Use more noise."
        )


def check_release_plan(
    accountant: ShuffleAccountantBase,
    *,
    seed: int,
    start: int,
    rounds: int,
    noise_multiplier: float,
    max_norm: float,
    population: int,
    sample_rate: float,
    sensitivity: float,
    dtype: torch.dtype,
    norm_name: str = "max_grad_norm",
    client_lr: float | None = None,
    lr: float | None = None,
) -> None:
    """Refuse a plan that would release unaccountable rounds; change nothing.

    Args:
        accountant: The engine's accountant (configured or not; nothing is changed).
        seed: The sampler's seed.
        start: First round to be released.
        rounds: Number of rounds planned from ``start``.
        noise_multiplier: Each client's noise std divided by the clipping norm.
        max_norm: The clipping norm ``C``.
        population: Number of clients ``n``.
        sample_rate: Per-round inclusion probability of one client.
        sensitivity: Sensitivity in units of ``C``.
        dtype: The parameters' dtype.
        norm_name: The clipping norm's parameter name, for messages.
        client_lr: The local learning rate (user level), checked like the norm.
        lr: The optimizer's largest learning rate (:func:`optimizer_lr`), checked like the
            norm (``lr=1e300`` overflows the first step).

    Raises:
        ReplayError: if a planned round of ``seed`` was released under this accountant.
        ValueError: for arithmetic beyond the dtype's headroom, or an epsilon of the plan that
            cannot be computed or is not finite (one line, naming the parameter).
    """
    accountant.check_unreleased(seed, start, start + rounds)
    check_plan_values(
        noise_multiplier=noise_multiplier,
        max_norm=max_norm,
        population=population,
        sample_rate=sample_rate,
        sensitivity=sensitivity,
        rounds=rounds,
        protocol=accountant.spec(),
        dtype=dtype,
        lr=lr,
        client_lr=client_lr,
        history=accountant.history,
        names={**API_NAMES, "max_norm": norm_name},
    )
