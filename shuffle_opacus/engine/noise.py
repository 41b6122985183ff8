"""Local Gaussian noise for shuffle-model training: every participating client adds its own noise.

In the protocol each of the ``B_t`` clients of round ``t`` clips its gradient to norm ``C``, adds
``N(0, sigma^2 C^2 I)`` and sends the report through the shuffler; the server sums the reports.
The sum of ``B_t`` independent ``N(0, sigma^2 C^2 I)`` vectors is exactly distributed as
``N(0, B_t sigma^2 C^2 I)``, so :class:`LocalNoiseDPOptimizer` offers two ways to produce the
aggregated update:

* ``noise_mode="sum"`` (default, the simulation of Liew & Takahashi §5.2): one Gaussian draw on
  the sum of clipped gradients with standard deviation ``sigma * C * sqrt(B_t)``. ``B_t`` is the
  round's actual number of reports, which is public in the shuffle model.
* ``noise_mode="per_client"``: one draw per client, summed; the same distribution at ``B_t``
  times the cost, kept as a reference to check the simulation against.

``noise_multiplier`` is the *local* sigma (per-client noise std over ``C``); that is what the
accountant records. An empty round (``B_t = 0``) has no reports, hence no noise and a zero
gradient; it still counts as a round for the accountant, because the check-in analysis averages
over the round's size, zero included.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from opacus.optimizers import DPOptimizer
from opacus.optimizers.optimizer import (
    _check_processed_flag,
    _generate_noise,
    _mark_as_processed,
)

from ..common.validation import check_positive, check_probability
from .parameter_seal import ParameterSeal, guarded_step, refuse_outside_steps

__all__ = ["NOISE_MODES", "LocalNoiseDPOptimizer", "local_noise_sum"]

NOISE_MODES: tuple[str, ...] = ("sum", "per_client")

_CHUNK_ELEMENTS = 1 << 22  # per-client mode: at most this many noise values in memory at once


class LocalNoiseDPOptimizer(DPOptimizer):
    """An Opacus ``DPOptimizer`` whose noise is the sum of every client's local noise.

    Clipping is Opacus's flat per-sample clipping. After clipping, the round's sum of clipped
    gradients receives noise of variance ``B_t * (noise_multiplier * max_grad_norm)^2`` per
    coordinate, where ``B_t`` is the number of per-sample gradients accumulated in the round.
    With ``loss_reduction="mean"`` the noisy sum is divided by ``expected_batch_size`` (the
    expected number of reports per round, e.g. ``n * rate``), as Opacus does.

    ``noise_multiplier``, ``max_grad_norm`` and ``accounting_sample_rate`` are fixed once the
    optimizer is built: the accountant records each round with them as the sampler releases it,
    so changing one afterwards (an Opacus noise scheduler, say) would make the recorded rounds
    disagree with the noise added. Assigning one raises ``AttributeError``; to continue with
    other parameters, prepare the next rounds with :func:`shuffle_opacus.make_private` on the
    same engine (its accountant keeps the history).

    Once a step hook is attached (an accountant follows the optimizer, as after
    :func:`shuffle_opacus.make_private`), the parameters change only through :meth:`step`: a
    step of ``original_optimizer`` outside it raises ``ValueError`` before anything changes,
    and a step that finds the parameters changed since the previous step (another optimizer, a
    manual update) is refused (:mod:`shuffle_opacus.engine.parameter_seal`). A refused step leaves
    no gradient behind: ``p.grad``, ``p.summed_grad`` and ``p.grad_sample`` are cleared.

    Attributes:
        accounting_sample_rate: Per-round inclusion probability passed to the accountant.
        noise_mode: ``"sum"`` or ``"per_client"``.
        last_report_count: ``B_t`` of the most recent noisy step.
    """

    _FIXED: tuple[str, ...] = ("noise_multiplier", "max_grad_norm", "accounting_sample_rate")

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        *,
        noise_multiplier: float,
        max_grad_norm: float,
        expected_batch_size: float,
        accounting_sample_rate: float,
        loss_reduction: str = "mean",
        generator: torch.Generator | None = None,
        secure_mode: bool = False,
        noise_mode: str = "sum",
    ) -> None:
        """Wrap ``optimizer``.

        Args:
            optimizer: The optimizer to wrap.
            noise_multiplier: Local sigma: per-client noise std divided by ``max_grad_norm`` (> 0).
            max_grad_norm: Clipping norm ``C`` (> 0).
            expected_batch_size: Expected reports per round (> 0), the divisor of a mean loss.
            accounting_sample_rate: Per-round inclusion probability of one client, in ``(0, 1]``.
            loss_reduction: ``"mean"`` or ``"sum"``, as the loss the model is trained with.
            generator: Torch generator for the noise (not allowed with ``secure_mode``).
            secure_mode: Use Opacus's floating-point-attack-resistant noise (``sum`` mode only).
            noise_mode: ``"sum"`` or ``"per_client"`` (see the module docstring).

        Raises:
            ValueError: on an out-of-range argument.
        """
        noise_multiplier = check_positive("noise_multiplier", noise_multiplier)
        max_grad_norm = check_positive("max_grad_norm", max_grad_norm)
        expected_batch_size = check_positive("expected_batch_size", expected_batch_size)
        accounting_sample_rate = check_probability("accounting_sample_rate", accounting_sample_rate)
        if loss_reduction not in ("mean", "sum"):
            raise ValueError(f"loss_reduction must be 'mean' or 'sum'. Found {loss_reduction!r}.")
        if noise_mode not in NOISE_MODES:
            raise ValueError(f"noise_mode must be one of sum, per_client. Found {noise_mode!r}.")
        if noise_mode == "per_client" and secure_mode:
            raise ValueError("noise_mode='per_client' is a reference mode; it has no secure_mode.")
        super().__init__(
            optimizer,
            noise_multiplier=noise_multiplier,
            max_grad_norm=max_grad_norm,
            expected_batch_size=expected_batch_size,  # type: ignore[arg-type]
            loss_reduction=loss_reduction,
            generator=generator,
            secure_mode=secure_mode,
        )
        self.accounting_sample_rate = accounting_sample_rate
        self.noise_mode = noise_mode
        self.last_report_count = 0
        self._pending_reports = 0
        self._clipped_sums: Any = None
        self._seal: ParameterSeal | None = None
        self._fixed = True

    def __setattr__(self, name: str, value: Any) -> None:
        """Set an attribute; the privacy parameters cannot change once the optimizer is built.

        Raises:
            AttributeError: for ``noise_multiplier``, ``max_grad_norm`` or
                ``accounting_sample_rate`` after construction.
        """
        if name in self._FIXED and self.__dict__.get("_fixed", False):
            raise AttributeError(
                f"{name} of a LocalNoiseDPOptimizer is fixed once it is built (the accountant "
                f"records every round with it); prepare further rounds with other parameters by "
                f"calling shuffle_opacus.make_private again on the same engine."
            )
        super().__setattr__(name, value)

    def use_clipped_sums(self, module: Any) -> None:
        """Take the clipped sums from a :class:`~shuffle_opacus.engine.clipping.ClippedSumModule`.

        The module computes ``sum_i c_i grad_i`` during ``loss.backward()`` with the same clip
        factor as Opacus (``min(1, C / (||grad_i|| + 1e-6))``); the optimizer then only adds
        the round's local noise and steps. Its clipping norm must be this optimizer's.

        Raises:
            ValueError: if the module clips to another norm.
        """
        if not math.isclose(module.max_grad_norm, self.max_grad_norm, rel_tol=1e-12):
            raise ValueError(
                f"the module clips to {module.max_grad_norm}, the optimizer to "
                f"{self.max_grad_norm}; they must agree."
            )
        self._clipped_sums = module

    def _batch_reports(self) -> int:
        grad_sample = self.params[0].grad_sample if self.params else None
        if isinstance(grad_sample, torch.Tensor):
            return int(grad_sample.shape[0])
        if isinstance(grad_sample, list):
            return int(sum(g.shape[0] for g in grad_sample))
        return 0

    def clip_and_accumulate(self) -> None:
        """Clip per-sample gradients into ``p.summed_grad`` and count the reports."""
        if self._clipped_sums is not None:
            sums, reports = self._clipped_sums.take()
            self._pending_reports += reports
            for p in self.params:
                total = sums[p]
                p.summed_grad = total if p.summed_grad is None else p.summed_grad + total
            return
        self._pending_reports += self._batch_reports()
        super().clip_and_accumulate()

    def attach_step_hook(self, fn: Callable[[Any], None]) -> None:
        """Call ``fn(self)`` after the noise of every step; from now on, guard the parameters.

        Steps of ``original_optimizer`` outside :meth:`step` are refused from here on, and
        every step after the first checks that nothing else changed the parameters.

        Args:
            fn: The hook (the accountant's, from ``local_noise_hook``).
        """
        super().attach_step_hook(fn)
        if self._seal is None:
            self._seal = ParameterSeal()
            refuse_outside_steps(self.original_optimizer)

    def step(self, closure: Any = None) -> Any:
        """Run ``closure``, clip, add the round's noise and step the wrapped optimizer.

        As Opacus's ``DPOptimizer.step``, with the parameter guard of the class docstring.

        Args:
            closure: Re-evaluates the model and its loss (optional, as for any optimizer).

        Returns:
            What the wrapped optimizer's ``step`` returns (``None`` for a skipped step).

        Raises:
            ValueError: if the parameters changed outside this method since the previous
                step, or the accountant's hook refuses the round (nothing is stepped then, and
                the round's gradients are cleared).
        """
        if closure is not None:
            with torch.enable_grad():
                closure()
        if self._seal is not None:
            self._check_sealed(self._seal)
        if not self.pre_step():
            return None
        with guarded_step(self.original_optimizer):
            result = self.original_optimizer.step()
        if self._seal is not None:
            self._seal.record(self.params)
        return result

    def _check_sealed(self, seal: ParameterSeal) -> None:
        changed = seal.changed(self.params)
        if not changed:
            return
        self._discard_round()
        guard = getattr(self.step_hook, "guard", None)
        done = guard.stepped if guard is not None else seal.records
        counted = (
            f"the {guard.name} accountant counts {guard.released} released rounds and covers "
            f"only the {done} steps it accepted"
            if guard is not None
            else f"only the {done} private steps are noised"
        )
        shown = ", ".join(str(i) for i in changed[:4]) + (", ..." if len(changed) > 4 else "")
        raise ValueError(
            f"optimizer.step() #{done + 1}: parameters {shown} (of {len(self.params)}) changed "
            f"since step #{done} outside optimizer.step() (another optimizer, "
            f"original_optimizer or a direct write): that update is not private, and {counted}; "
            f"restore the parameters step #{done} left, or start again from a fresh model."
        )

    def _discard_round(self) -> None:
        """Clear the round's gradients, noisy or not, and its pending report count."""
        for p in self.params:
            p.grad = None
            p.grad_sample = None
            p.summed_grad = None
        self._pending_reports = 0
        self._is_last_step_skipped = False

    def pre_step(self, closure: Any = None) -> bool:
        """Clip and accumulate, then, unless the step is skipped, add noise and scale.

        Opacus's own ``pre_step`` skips everything when no per-sample gradients exist, which
        is the case when a :class:`~shuffle_opacus.engine.clipping.ClippedSumModule` clipped
        already; this one runs the same sequence in both cases. If anything raises (the accountant's
        hook refusing the round, say), the round's gradients are cleared first, so that the
        noise of a refused round cannot be applied by other means.

        Args:
            closure: Unused (the closure runs in :meth:`step`), as in Opacus.

        Returns:
            ``True`` when the wrapped optimizer should step, ``False`` for a skipped step.
        """
        try:
            return self._noisy_pre_step(closure)
        except BaseException:
            self._discard_round()
            raise

    def _noisy_pre_step(self, closure: Any) -> bool:
        if self._clipped_sums is None:
            return bool(super().pre_step(closure))
        self.clip_and_accumulate()
        if self._check_skip_next_step():
            self._is_last_step_skipped = True
            return False
        self.add_noise()
        self.scale_grad()
        if self.step_hook:
            self.step_hook(self)
        self._is_last_step_skipped = False
        return True

    def add_noise(self) -> None:
        """Add the round's local noise to every ``p.summed_grad`` (result in ``p.grad``)."""
        reports = self._pending_reports
        self._pending_reports = 0
        self.last_report_count = reports
        std = self.noise_multiplier * self.max_grad_norm
        for p in self.params:
            _check_processed_flag(p.summed_grad)
            noise = local_noise_sum(
                std,
                reports,
                p.summed_grad,
                mode=self.noise_mode,
                generator=self.generator,
                secure_mode=self.secure_mode,
            )
            p.grad = (p.summed_grad + noise).view_as(p)
            _mark_as_processed(p.summed_grad)

    def scale_grad(self) -> None:
        """Divide by the expected reports per round when the loss is a mean."""
        if self.loss_reduction == "mean":
            for p in self.params:
                p.grad /= self.expected_batch_size


def local_noise_sum(
    std: float,
    reports: int,
    reference: torch.Tensor,
    *,
    mode: str = "sum",
    generator: torch.Generator | None = None,
    secure_mode: bool = False,
) -> torch.Tensor:
    """Return the sum of ``reports`` independent ``N(0, std^2 I)`` draws shaped as ``reference``.

    This is the noise of one round's aggregate when each of ``reports`` clients adds its own
    ``N(0, std^2 I)`` to its report; both the example-level optimizer
    (:class:`LocalNoiseDPOptimizer`) and the user-level trainer
    (:mod:`shuffle_opacus.federated`) draw it here, so the same generator state gives the same
    noise on both paths.

    Args:
        std: Each client's noise standard deviation (``noise_multiplier * C``), >= 0.
        reports: Number of reports ``B`` (>= 0); ``0`` gives zeros and draws nothing.
        reference: Tensor whose shape, dtype and device the noise takes.
        mode: ``"sum"``: one draw with std ``std * sqrt(B)`` (Opacus's noise function, hence
            its ``secure_mode``); ``"per_client"``: ``B`` draws summed, in chunks of at most
            about four million values.
        generator: Torch generator (``None``: the global one).
        secure_mode: Opacus's floating-point-attack-resistant sampler (``sum`` mode only).

    Returns:
        The noise tensor.

    Raises:
        ValueError: for an unknown mode, or ``per_client`` with ``secure_mode``.
    """
    if mode not in NOISE_MODES:
        raise ValueError(f"noise_mode must be one of {', '.join(NOISE_MODES)}. Found {mode!r}.")
    if mode == "sum":
        return _generate_noise(
            std=std * math.sqrt(reports),
            reference=reference,
            generator=generator,
            secure_mode=secure_mode,
        )
    if secure_mode:
        raise ValueError("noise_mode='per_client' is a reference mode; it has no secure_mode.")
    total = torch.zeros_like(reference)
    if reports == 0:
        return total
    chunk = max(1, _CHUNK_ELEMENTS // max(1, reference.numel()))
    done = 0
    while done < reports:
        k = min(chunk, reports - done)
        draws = torch.normal(
            0.0,
            std,
            size=(k, *reference.shape),
            device=reference.device,
            dtype=reference.dtype,
            generator=generator,
        )
        total += draws.sum(dim=0)
        done += k
    return total
