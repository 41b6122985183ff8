"""Opacus accountants ``shuffle``, ``subsampled_shuffle`` and ``shuffled_checkin``.

:class:`ShuffleAccountant`, :class:`SubsampledShuffleAccountant` and
:class:`ShuffledCheckInAccountant` are :class:`opacus.accountants.IAccountant` subclasses
registered under those names, so ``PrivacyEngine(accountant="shuffled_checkin")`` works after
``import shuffle_opacus``. The history is Opacus's ``(noise_multiplier, sample_rate, steps)``,
with the **local** noise multiplier; what it cannot carry (the population ``n``, the
sensitivity, the method, ``m``) is set by :func:`shuffle_opacus.make_private` or
:meth:`~ShuffleAccountantBase.configure`, and without a population :meth:`get_epsilon` raises
rather than fall back to a central-DP number. The default method is ``pld`` where the work
limits allow it, else the protocol's Rényi bound (:meth:`epsilon_result` says which). Attaching
one with :meth:`opacus.PrivacyEngine.make_private` (central noise) is refused.

Every epsilon holds for replace-one adjacency of one client under
:data:`shuffle_opacus.analysis.SHUFFLE_ASSUMPTIONS` (Theorem 1's pair is the worst case; the
shuffle and the check-in coins are secret); with ``sensitivity="paper"`` it also needs every
clipped update within ``C`` of every other (:mod:`shuffle_opacus.accounting.protocols`).
Configuration, checks, following the sampler: docs/opacus.md, "Accountants and Opacus's
constraints".
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

from opacus.accountants import IAccountant, register_accountant
from opacus.accountants import registry as _opacus_registry

from ..analysis.rdp.conversion import EpsilonResult
from .accountant_core import ShuffleAccountantCore
from .accountant_state import HistoryRollbackWarning, load_state, state_of
from .step_guard import HELPER_HINT as _HELPER_HINT
from .step_guard import follow_sampler

__all__ = [
    "ShuffleAccountantBase",
    "ShuffleAccountant",
    "SubsampledShuffleAccountant",
    "ShuffledCheckInAccountant",
    "ACCOUNTANTS",
    "HistoryRollbackWarning",
    "register_all",
]


class ShuffleAccountantBase(ShuffleAccountantCore, IAccountant):
    """Shared logic of the three shuffle-model accountants (see the module docstring).

    Configuration, rounds, releases and epsilon come from
    :class:`~shuffle_opacus.engine.accountant_core.ShuffleAccountantCore` (its attributes:
    ``history``, ``population``, ``sensitivity``, ``method``, ``sample_size``, ``releases``,
    ``ledger``); this class is their adapter to Opacus's ``IAccountant``.
    """

    def get_privacy_spent(self, *, delta: float, max_order: int | None = None) -> tuple[float, int]:
        """Return ``(epsilon, order)`` for the history so far (``(0.0, 0)`` when empty).

        Raises:
            ValueError: if the accountant is not configured and the history is not empty, or on
                an invalid ``delta``.
        """
        result = self._result(delta, max_order)
        return result.epsilon, result.order

    def _result(self, delta: float, max_order: int | None) -> EpsilonResult:
        return self.epsilon_result(delta, max_order=max_order)

    def state_dict(self, destination: Mapping[str, Any] | None = None) -> Mapping[str, Any]:
        """History, mechanism and configuration, for ``PrivacyEngine.save_checkpoint``.

        Args:
            destination: Mapping to fill; a new ``OrderedDict`` by default.

        Returns:
            The filled mapping.
        """
        return state_of(self, destination)

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Restore a :meth:`state_dict`; all checks run before anything changes.

        A checkpoint overrides an unconfigured accountant. If this accountant is already
        configured, loading is refused when the checkpoint's population, sensitivity, sample size
        or method differs: the checkpoint's epsilon would not describe the current training (to
        continue with another method, say so first with :meth:`configure`). A checkpoint without
        a configuration takes this accountant's, and its history must fit it.

        Loading replaces the history, as Opacus's accountants do. Loading a state with fewer
        rounds than the accountant holds therefore lowers epsilon although the later rounds were
        released all the same; that is allowed (to restart training from an earlier point) but
        warned about with :class:`HistoryRollbackWarning`. The record of released rounds
        (``state_dict['released']``, absent from states saved before it existed) is added to
        this accountant's, never replaced: a round released once stays released, so that
        training again from an earlier point must use new rounds (a later ``start_round`` or
        another seed). A state without that record, or whose record holds fewer rounds than its
        history, is never trusted to have released nothing: its ``L`` rounds count as rounds
        ``0 .. L - 1`` of every seed (:mod:`shuffle_opacus.engine.releases`), so training from it
        continues at ``start_round=L`` or later; its epsilon is reported as before.

        Args:
            state_dict: Output of :meth:`state_dict`.

        Raises:
            ValueError: on a missing key, a different mechanism, a malformed history, an invalid
                entry or a configuration conflict (one line each).
        """
        load_state(self, state_dict)

    def get_optimizer_hook_fn(self, sample_rate: float) -> Callable[[Any], None]:
        """Refuse Opacus's own attachment, which would pair this accountant with central noise.

        Raises:
            ValueError: always; the message points to :func:`shuffle_opacus.make_private`.
        """
        raise ValueError(
            f"the {self.name} accountant cannot be attached by PrivacyEngine.make_private, which "
            f"adds one central noise draw to the sum; shuffle-model accounting needs every "
            f"client's local noise: {_HELPER_HINT}. (Opacus has already wrapped the module "
            f"passed to make_private; pass a fresh module.)"
        )

    def local_noise_hook(self, sampler: Any, *, noise_multiplier: float) -> Callable[[Any], None]:
        """Make the accountant follow ``sampler``; return the step hook of the optimizer.

        From now on every round the sampler releases is recorded at once, with
        ``noise_multiplier`` and the sampler's sample rate, whether or not the training code
        then steps the optimizer: a round handed out and skipped (``if len(x) == 0: continue``)
        was part of the protocol all the same, and leaving it out would condition the accounted
        rounds on their content (for check-in, an empty round is evidence that a client did not
        check in). :func:`shuffle_opacus.make_private` calls this.

        A round is recorded once per accountant: a ``(seed, round)`` pair released before (by
        another loader or trainer on this engine, or in a loaded state) is refused with
        :class:`~shuffle_opacus.engine.releases.ReplayError` before its batch is handed out.

        The returned hook runs at every noisy step of a
        :class:`~shuffle_opacus.engine.noise.LocalNoiseDPOptimizer` and refuses (``ValueError``,
        before the parameters are updated) a step whose noise multiplier or sample rate is not the
        one recorded, whose number of reports does not fit the protocol, or that does not process
        the private loader's current round exactly once
        (:class:`~shuffle_opacus.engine.step_guard.StepGuard`, reached as ``hook.guard``; the loader
        tells it which batch it delivered).

        Args:
            sampler: A :class:`~shuffle_opacus.engine.sampling.ShuffleRoundSampler` of this
                accountant's protocol, not yet followed by another accountant.
            noise_multiplier: The optimizer's (local) noise multiplier (> 0), fixed for the run.

        Returns:
            A callable taking the optimizer.

        Raises:
            ValueError: if the accountant is not configured, the sampler belongs to another
                protocol or already feeds an accountant, or ``noise_multiplier`` is invalid.
        """
        return follow_sampler(self, sampler, noise_multiplier=noise_multiplier)


class ShuffleAccountant(ShuffleAccountantBase):
    """All ``n`` clients report every round (Theorem 1 of Liew & Takahashi per round)."""

    name: ClassVar[str] = "shuffle"


class SubsampledShuffleAccountant(ShuffleAccountantBase):
    """``m`` of ``n`` clients, without replacement, per round (Theorem 2 per round)."""

    name: ClassVar[str] = "subsampled_shuffle"


class ShuffledCheckInAccountant(ShuffleAccountantBase):
    """Each client checks in independently with probability ``gamma`` every round.

    Per-round RDP from :func:`shuffle_opacus.analysis.rdp.checkin_rdp` (``exact`` by default,
    ``sum`` or the paper's ``theorem3`` on request). Empty rounds are part of the protocol and
    are accounted as rounds.
    """

    name: ClassVar[str] = "shuffled_checkin"


ACCOUNTANTS: dict[str, type[ShuffleAccountantBase]] = {
    cls.name: cls
    for cls in (ShuffleAccountant, SubsampledShuffleAccountant, ShuffledCheckInAccountant)
}


def _is_ours(cls: object, name: str) -> bool:
    return (
        isinstance(cls, type)
        and getattr(cls, "__module__", None) == __name__
        and getattr(cls, "name", None) == name
    )


def register_all() -> None:
    """Register the three accountants with Opacus; repeated calls are harmless.

    A name already taken by some other accountant class is left alone, with a warning.
    """
    # Read-only look at Opacus's table so that a foreign class is never instantiated here.
    table: Mapping[str, type] = getattr(_opacus_registry, "_ACCOUNTANTS", {})
    for name, cls in ACCOUNTANTS.items():
        existing = table.get(name)
        if existing is None or _is_ours(existing, name):
            register_accountant(name, cls, force=True)
        else:
            warnings.warn(
                f"Opacus accountant name {name!r} is taken by {existing.__module__}."
                f"{existing.__qualname__}; shuffle_opacus did not replace it.",
                stacklevel=2,
            )


register_all()
