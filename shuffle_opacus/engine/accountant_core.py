"""The torch-free core of the shuffle-model accountants: configuration, rounds and releases.

:class:`ShuffleAccountantCore` is everything of
:class:`~shuffle_opacus.engine.accountants.ShuffleAccountantBase` that does not need Opacus: the
configuration and its checks, the rounds (a :class:`~shuffle_opacus.accounting.ledger.RoundLedger`,
read as ``history``), the once-only release of rounds and epsilon.
:mod:`shuffle_opacus.engine.accountants` adds Opacus's interface (``IAccountant``, checkpoints, the
optimizer hooks and the registration).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar, cast

from ..accounting.ledger import HistoryEntry, RoundLedger
from ..accounting.protocols import Protocol, protocol_for_accountant, resolve_sensitivity
from ..analysis.rdp.conversion import EpsilonResult
from ..common.validation import check_int, check_positive, check_probability, real_value
from .release_registry import REGISTRY
from .releases import ReleaseRecord, ReplayError
from .step_guard import HELPER_HINT as _HELPER_HINT

if TYPE_CHECKING:
    from .releases import ReleasingAccountant

__all__ = ["ShuffleAccountantCore"]


class ShuffleAccountantCore:
    """Configuration, rounds, releases and epsilon of a shuffle-model accountant (no Opacus).

    Attributes:
        ledger: The rounds recorded (:class:`~shuffle_opacus.accounting.ledger.RoundLedger`).
        history: The ledger's ``(noise_multiplier, sample_rate, steps)`` entries (the same
            list); consecutive steps with the same parameters are merged, as in Opacus's RDP
            accountant. Assigning a list replaces them (checked when next counted).
        population: Number of clients ``n``, or ``None`` until configured.
        sensitivity: Sensitivity in units of the clipping norm (2.0 = replace-one).
        method: Core analysis method, or ``None`` for the default (``pld`` where affordable).
        sample_size: Clients per round ``m`` (``subsampled_shuffle`` only).
        releases: The ``(seed, round)`` pairs released under this accountant
            (:class:`~shuffle_opacus.engine.releases.ReleaseRecord`); each is released at most once.
    """

    name: ClassVar[str] = ""

    def __init__(self) -> None:
        """Create an unconfigured accountant with an empty history (Opacus constructs it so)."""
        # No cache: every epsilon is computed afresh, with its warnings, as Opacus expects.
        self.ledger = RoundLedger(cache_size=0)
        self.population: int | None = None
        self.sensitivity: float = resolve_sensitivity("replace-one")
        self.method: str | None = None
        self.sample_size: int | None = None
        self.releases = ReleaseRecord()

    @property
    def history(self) -> list[HistoryEntry]:
        """The entries of :attr:`ledger` (the list itself)."""
        return self.ledger.entries

    @history.setter
    def history(self, entries: list[HistoryEntry]) -> None:
        self.ledger.entries = entries

    @classmethod
    def mechanism(cls) -> str:
        """Return the name the accountant is registered under."""
        return cls.name

    @classmethod
    def spec(cls) -> Protocol:
        """Return the record of the accountant's protocol (:data:`shuffle_opacus.PROTOCOLS`)."""
        return protocol_for_accountant(cls.name)

    @classmethod
    def protocol(cls) -> str:
        """Return the protocol's name (``full``, ``subsampled`` or ``checkin``)."""
        return cls.spec().name

    def check_configuration(
        self,
        *,
        population: int,
        sensitivity: float | str = "replace-one",
        method: str | None = None,
        sample_size: int | None = None,
    ) -> tuple[int, float, str | None, int | None]:
        """Validate a configuration without applying it (see :meth:`configure`).

        Returns:
            The normalised ``(population, sensitivity, method, sample_size)``.

        Raises:
            ValueError: as :meth:`configure`.
        """
        population = check_int("population", population, minimum=1)
        sens = resolve_sensitivity(sensitivity)
        spec = self.spec()
        method = spec.check_method(method)
        if not spec.fixed_size:
            if sample_size is not None:
                raise ValueError(
                    f"sample_size is not a parameter of the {self.name} accountant (each client "
                    f"checks in independently). Found {sample_size!r}."
                )
        else:
            spec.sample_rate(population=population, sample_size=sample_size)
            sample_size = spec.recorded_sample_size(sample_size)
        if self.history and self.population is not None:
            held = (self.population, self.sensitivity, self.sample_size)
            if held != (population, sens, sample_size):
                raise ValueError(
                    f"the {self.name} accountant already holds {len(self)} rounds accounted with "
                    f"(population, sensitivity, sample_size) = {held}; got "
                    f"{(population, sens, sample_size)}. Use a new PrivacyEngine to change them."
                )
        self._check_rates(self.history, population, sample_size)
        return population, sens, method, sample_size

    def _check_rates(
        self, history: Sequence[tuple[Any, Any, Any]], population: int, sample_size: int | None
    ) -> None:
        """Refuse a history whose sample rates contradict a configuration (fixed-size protocols).

        Raises:
            ValueError: naming the first contradicting rate and the configured one.
        """
        spec = self.spec()
        if not spec.fixed_size:
            return
        expected = spec.sample_rate(population=population, sample_size=sample_size)
        for _, rate, steps in history:
            value = real_value(rate)
            if steps and (value is None or not math.isclose(value, expected, rel_tol=1e-9)):
                raise ValueError(
                    f"the {self.name} accountant holds rounds recorded with sample_rate "
                    f"{rate!r}, which contradicts its configuration (population={population}, "
                    f"sample_size={sample_size}: sample rate {expected!r}); record the rounds "
                    f"with the configured sampling, or use a new accountant."
                )

    def configure(
        self,
        *,
        population: int,
        sensitivity: float | str = "replace-one",
        method: str | None = None,
        sample_size: int | None = None,
    ) -> ShuffleAccountantCore:
        """Set what the analysis needs beyond the history. All checks run before any change.

        Args:
            population: Number of clients ``n`` (integer >= 1).
            sensitivity: ``"replace-one"`` (2, default), ``"paper"`` (1) or a number > 0, in
                units of the clipping norm.
            method: Core method; ``None`` for the default (``pld`` where the work limits allow
                it, else the protocol's Rényi bound).
            sample_size: Clients per round ``m``; required for ``subsampled_shuffle``, must be
                omitted (or equal ``population``) otherwise.

        Returns:
            ``self``.

        Raises:
            ValueError: on an invalid or inconsistent value, or when the history already
                holds rounds that contradict the new setting (nothing is changed then).
        """
        self.population, self.sensitivity, self.method, self.sample_size = self.check_configuration(
            population=population,
            sensitivity=sensitivity,
            method=method,
            sample_size=sample_size,
        )
        return self

    @property
    def is_configured(self) -> bool:
        """True once :meth:`configure` (or :func:`shuffle_opacus.make_private`) has run."""
        return self.population is not None

    def expected_sample_rate(self) -> float:
        """Per-round inclusion probability implied by the configuration (1 for ``shuffle``).

        Raises:
            ValueError: if the accountant is not configured, or for ``shuffled_checkin`` whose
                rate is not part of the configuration.
        """
        self._require_configured("expected_sample_rate")
        spec = self.spec()
        if not spec.fixed_size:
            raise ValueError(f"the {self.name} rate is not part of the configuration.")
        return spec.sample_rate(population=self.population, sample_size=self.sample_size)  # type: ignore[arg-type]

    def _require_configured(self, what: str) -> None:
        if self.population is None:
            raise ValueError(
                f"{self.name} accountant: population (the number of clients, an integer >= 1) "
                f"is not set, so {what} cannot be computed. For a target epsilon use "
                f"shuffle_opacus.make_private_with_epsilon(engine, ...): "
                f"PrivacyEngine.make_private_with_epsilon would calibrate one central noise "
                f"draw. Otherwise {_HELPER_HINT}."
            )

    def _check_step(self, noise_multiplier: float, sample_rate: float) -> tuple[float, float]:
        nm = check_positive("noise_multiplier", noise_multiplier)
        rate = check_probability("sample_rate", sample_rate)
        spec = self.spec()
        if not spec.fixed_size:
            return nm, rate
        if self.population is not None:
            expected = self.expected_sample_rate()
            if not math.isclose(float(sample_rate), expected, rel_tol=1e-9):
                raise ValueError(
                    f"sample_rate of the {self.name} accountant must be {expected!r} "
                    f"(its configured sampling). Found {sample_rate!r}."
                )
            return nm, expected
        if spec.fixed_rate is not None and rate != spec.fixed_rate:
            raise ValueError(
                f"sample_rate of the {self.name} accountant must be {spec.fixed_rate:g}. Found "
                f"{sample_rate!r}."
            )
        return nm, rate

    def step(self, *, noise_multiplier: float, sample_rate: float) -> None:
        """Record one round.

        Args:
            noise_multiplier: Local noise of one client divided by the clipping norm (> 0).
            sample_rate: Per-round inclusion probability of one client under the protocol.

        Raises:
            ValueError: on a value outside its range or inconsistent with the configuration.
        """
        self.ledger.record(*self._check_step(noise_multiplier, sample_rate))

    def check_unreleased(self, seed: int, start: int, stop: int, what: str = "start_round") -> None:
        """Refuse a plan to release rounds ``[start, stop)`` of ``seed`` if one was released.

        Args:
            seed: The sampler's seed.
            start: First planned round.
            stop: One past the last planned round.
            what: The parameter that sets ``start``, for the message.

        Raises:
            ReplayError: naming the first released round and where new rounds begin.
        """
        first = self.releases.first_released(seed, start, stop)
        unknown, secret = self.releases.any_seed, self.releases.secret
        if first is not None and first < unknown:
            raise ReplayError(
                f"{what}={start}: the {self.name} accountant loaded {unknown} rounds from a state "
                f"without a release record (saved before it existed, or edited), so rounds "
                f"0..{unknown - 1} of every seed count as released; continue with "
                f"{what}={self.releases.next_free(seed, start)} or later."
            )
        if first is not None and first < secret:
            raise ReplayError(
                f"{what}={start}: the {self.name} accountant released rounds up to {secret - 1} "
                f"from the operating system's coins (secure mode), which no seed replays, so "
                f"rounds 0..{secret - 1} of every seed count as released; continue with "
                f"{what}={self.releases.next_free(seed, start)} or later."
            )
        if first is not None:
            resume = self.releases.next_free(seed, first)
            raise ReplayError(
                f"{what}={start}: round {first} of seed {seed} was already released under this "
                f"engine's accountant (it holds rounds up to {resume - 1} of that seed); a "
                f"second release would reuse its check-ins. Continue with {what}={resume} "
                f"(rounds count from round 0), or leave seed=None for fresh coins."
            )

    def release(
        self,
        seed: int,
        t: int,
        *,
        noise_multiplier: float,
        sample_rate: float,
        secret: bool = False,
    ) -> None:
        """Record the release of round ``t`` of the sampler seeded ``seed``, once.

        Everything is checked before anything is recorded: a round already released (the same
        seed and index, whichever trainer or loader released it) is refused, so that no
        check-in set is counted twice as two independent rounds.

        Args:
            seed: The sampler's seed (a secure sampler's random label).
            t: The round's index.
            noise_multiplier: Local noise of one client divided by the clipping norm (> 0).
            sample_rate: Per-round inclusion probability of one client.
            secret: Whether the round was drawn from the operating system (a ``secure``
                sampler): no seed replays it, so rounds ``0 .. t`` of every seed then count as
                released (:attr:`~shuffle_opacus.engine.releases.ReleaseRecord.secret`).

        Raises:
            ReplayError: if ``(seed, t)`` was released already.
            SharedCoinsError: if another engine in this process released it on the same data
                and a preparation asked for ``strict=True``
                (:mod:`shuffle_opacus.engine.release_registry`; without it, a warning).
            ValueError: on a value outside its range or inconsistent with the configuration.
        """
        self._check_step(noise_multiplier, sample_rate)
        if self.releases.first_released(seed, t, t + 1) is not None:
            self.releases.add(seed, t)  # raises ReplayError
        # ``name`` is a class variable here, an instance one in the protocol: the same value.
        binding = REGISTRY.binding_for(cast("ReleasingAccountant", self), seed)
        if binding is not None:
            REGISTRY.check(binding, t, t + 1)  # another engine's same coins: warn or refuse
        self.releases.add(seed, t)
        if secret:
            self.releases.release_secret(t + 1)
        self.step(noise_multiplier=noise_multiplier, sample_rate=sample_rate)
        if binding is not None:
            REGISTRY.released(binding, t)

    def __len__(self) -> int:
        """Return the number of rounds recorded.

        Raises:
            ValueError: if the history (assigned directly) is malformed or holds more than
                ``2**62`` rounds (one line, as :meth:`load_state_dict` says it).
        """
        return int(sum(entry[2] for entry in self.ledger.checked()))

    def epsilon_result(
        self, delta: float, *, method: str | None = None, max_order: int | None = None
    ) -> EpsilonResult:
        """Epsilon spent so far, with the method that gave it and why (never mutates state).

        Args:
            delta: Target delta in ``(0, 1)``.
            method: A method of the protocol for this call; the configured one by default.
            max_order: Optional cap on the Rényi order (a Rényi method; with the default method
                it selects the Rényi fallback).

        Returns:
            An :class:`~shuffle_opacus.analysis.rdp.conversion.EpsilonResult`: ``method`` is the
            method used, ``note`` says why the default fell back to a Rényi bound; epsilon 0 for
            an empty history.

        Raises:
            ValueError: if the accountant is not configured and the history is not empty, or
                on an invalid argument.
        """
        chosen = self.method if method is None else self.spec().check_method(method)
        if not self.history or len(self) == 0:
            return self.ledger.epsilon(
                history=[],
                protocol=self.spec(),
                delta=delta,
                population=1,
                method=chosen,
                max_order=max_order,
            )
        self._require_configured("epsilon")
        self._check_rates(self.history, self.population, self.sample_size)  # type: ignore[arg-type]
        return self.ledger.epsilon(
            protocol=self.spec(),
            delta=delta,
            population=self.population,  # type: ignore[arg-type]
            sensitivity=self.sensitivity,
            method=chosen,
            max_order=max_order,
        )

    def get_epsilon(
        self,
        delta: float,
        max_order: int | None = None,
        *,
        method: str | None = None,
        **kwargs: Any,
    ) -> float:
        """Epsilon spent so far at ``delta``; 0 with an empty history. Never mutates state.

        Replace-one adjacency of one client; see the module docstring for the assumptions.

        Args:
            delta: Target delta in ``(0, 1)``.
            max_order: Optional cap on the Rényi order (automatic by default).
            method: A method of the protocol for this call (``pld``, or a Rényi bound such as
                ``exact``); the configured one by default (:meth:`epsilon_result` tells which
                method answered).
            **kwargs: Not accepted; present only because Opacus forwards its keyword arguments.

        Returns:
            Epsilon of the history: by default the composed privacy loss distribution of the
            symmetrised pair, or the protocol's Rényi bound where that is beyond the work limits.

        Raises:
            ValueError: if the accountant is not configured (see :meth:`configure`), or on
                invalid arguments.
        """
        if kwargs:
            raise ValueError(
                f"{self.name} accountant: unexpected arguments {sorted(kwargs)}; {_HELPER_HINT}."
            )
        return float(self.epsilon_result(delta, method=method, max_order=max_order).epsilon)
