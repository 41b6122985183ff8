"""The options of :func:`shuffle_opacus.make_private`, validated once before anything changes."""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["PrivacyOptions"]


@dataclass(frozen=True)
class PrivacyOptions:
    """The options of :func:`make_private` besides the model, optimizer, loader and noise.

    Attributes:
        max_grad_norm: Clipping norm ``C`` of each client's gradient (> 0).
        rounds: Number of rounds (required unless the loader has a shuffle sampler).
        rate: Check-in probability (``shuffled_checkin``), in ``(0, 1]``.
        sample_size: Clients per round (``subsampled_shuffle``), in ``[1, n - 1]``.
        seed: Sampling seed, an integer in ``[0, 2**128 - 1]`` (larger seeds would repeat the
            rounds of smaller ones); ``None`` draws one (read ``loader.batch_sampler.seed``).
            Must be ``None`` on a ``secure_mode`` engine, whose samplers draw every round from
            the operating system (:mod:`shuffle_opacus.common.secure_random`) and cannot be seeded.
        start_round: First round to produce, to resume a run (with the same seed).
        sensitivity: ``"replace-one"`` (2, default), ``"paper"`` (1) or a number, in units of
            ``C``; see :mod:`shuffle_opacus.accounting.protocols`.
        method: Core analysis method; ``None`` (default) is pld, the tightest sound one, or the
            protocol's Rényi bound where pld is beyond the work limits.
        noise_mode: ``"sum"`` (one draw with std ``sigma C sqrt(B_t)``) or ``"per_client"``.
        loss_reduction: ``"mean"`` or ``"sum"``, matching the training loss.
        grad_sample_mode: Opacus per-sample gradient mode, ``hooks``, ``functorch`` or ``ew``, or
            ``fast``: the exact clipped sum of
            :class:`~shuffle_opacus.engine.clipping.ClippedSumModule` computed during
            ``loss.backward()`` without keeping per-sample gradients (models of ``Conv2d``,
            ``Linear`` and ``GroupNorm`` layers).
        batch_first: Whether the batch dimension of inputs is the first one.
        noise_generator: Torch generator for the noise (not in secure mode).
        strict: Refuse (:class:`~shuffle_opacus.engine.release_registry.SharedCoinsError`) rather
            than
            warn about a round that another engine in this process released on the same data with
            the same seed (:mod:`shuffle_opacus.engine.release_registry`).
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
    strict: bool = False

    def __post_init__(self) -> None:
        """Check ``strict`` (the other fields are checked where they are used).

        Raises:
            ValueError: if ``strict`` is not a bool.
        """
        if not isinstance(self.strict, bool):
            raise ValueError(f"strict must be True or False. Found {self.strict!r}.")
