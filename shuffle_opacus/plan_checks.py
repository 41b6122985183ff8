"""Checks of a training plan that run before its first round is released.

Refusing after a release is too late: the round has left the device. :func:`check_release_plan`
runs when :func:`shuffle_opacus.make_private` or :func:`shuffle_opacus.make_private_clients`
prepares training and refuses

* rounds of the sampler's seed that the engine's accountant already released (a second loader
  or trainer, a copy, a restart at ``start_round=0`` after loading a state);
* noise and clipping whose arithmetic is not finite in the parameters' dtype (the noise std
  ``sigma C sqrt(n)`` of a round's sum, the clipping norm, the local learning rate), with
  headroom: every such value must stay below the square root of the dtype's largest number;
* a plan whose epsilon cannot be computed or is not finite: the Rényi bound of the accountant's
  history plus the planned rounds, with the order capped at :data:`CHECK_MAX_ORDER` so that the
  check costs milliseconds (a looser number than the accounting's, used only as a test of
  computability).
"""

from __future__ import annotations

import math
import warnings

import torch

from .accountants import ShuffleAccountantBase
from .history import history_epsilon

__all__ = ["CHECK_DELTA", "CHECK_MAX_ORDER", "check_release_plan", "finite_limit"]

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

    Raises:
        ReplayError: if a planned round of ``seed`` was released under this accountant.
        ValueError: for arithmetic beyond the dtype's headroom, or an epsilon of the plan that
            cannot be computed or is not finite (one line, naming the parameter).
    """
    accountant.check_unreleased(seed, start, start + rounds)
    limit = finite_limit(dtype)
    _check_below(norm_name, max_norm, limit, dtype)
    if client_lr is not None:
        _check_below("client_lr", client_lr, limit, dtype)
    std = noise_multiplier * max_norm * math.sqrt(population)
    _check_below("noise_multiplier", std, limit, dtype, f"noise_multiplier * {norm_name} * sqrt(n)")
    history = [*accountant.history, (noise_multiplier, sample_rate, rounds)]
    fallback = accountant.spec().fallback
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            result = history_epsilon(
                history,
                protocol=accountant.spec(),
                delta=CHECK_DELTA,
                population=population,
                sensitivity=sensitivity,
                method=fallback,
                max_order=CHECK_MAX_ORDER,
            )
    except ValueError as exc:
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ValueError(
            f"noise_multiplier={noise_multiplier!r}: epsilon of the {rounds} planned rounds "
            f"cannot be computed ({reason}); nothing was released."
        ) from None
    if not math.isfinite(result.epsilon):
        raise ValueError(
            f"noise_multiplier={noise_multiplier!r}: epsilon of the {rounds} planned rounds is "
            f"not finite; nothing was released. Use more noise."
        )
