"""The run plan: what a validated config means for a run, worked out once and then frozen.

:func:`build_plan` reads an :class:`~.config.ExperimentConfig` once: the protocol record, the
population and sample rate, the sensitivity (as written, resolved, labelled), the noise
multiplier and its analysis sigmas, delta, the curves to report, the level (example or user)
and the seed. The session, the curves, the guarantee, ``metrics.csv``, the checks before a run
and the plots all take the resulting :class:`RunPlan` rather than deriving these again.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from shuffle_opacus import Protocol, analysis_sigma, get_protocol
from shuffle_opacus.accounting.protocols import (
    SENSITIVITIES,
    resolve_sensitivity,
    sensitivity_assumptions,
    sensitivity_label,
)

from .config import ConfigError, ExperimentConfig
from .datasets import DatasetError, check_data

__all__ = ["REPLACE_ONE", "RunPlan", "as_plan", "build_plan"]

#: The curve every run reports at replace-one sensitivity when its config uses a smaller one.
REPLACE_ONE = "replace-one"


@dataclass(frozen=True)
class RunPlan:
    """One run's protocol, privacy parameters and curves, derived once from its config.

    Attributes:
        config: The validated config (its training, optimizer, model and data sections).
        protocol: The library's protocol record of ``protocol.kind``.
        rate: ``protocol.rate`` (check-in protocols), else ``None``.
        sample_size: ``protocol.sample_size`` (fixed-size protocols), else ``None``.
        population: Clients: ``clients.count`` at user level, else the training examples used.
        sample_rate: The rate each round is recorded with (the protocol's, for ``population``).
        rounds: ``training.rounds``.
        eval_every: ``training.eval_every``.
        noise_multiplier: ``privacy.noise_multiplier`` (noise std over the clipping norm).
        clipping_norm: ``privacy.clipping_norm``.
        noise_mode: ``privacy.noise_mode``.
        sensitivity_setting: ``privacy.sensitivity`` as written (``replace-one``, ``paper`` or
            a number); what the library is given.
        sensitivity: The sensitivity resolved, in units of the clipping norm.
        sensitivity_label: How the summary names it.
        sensitivity_assumptions: What it assumes (none at replace-one).
        analysis_sigma: ``noise_multiplier / sensitivity``: the sigma of the config's curves.
        replace_one_sigma: ``noise_multiplier / 2``: the sigma of the guarantee, ``proven`` and
            ``clones`` (replace-one adjacency whatever the config's sensitivity).
        delta: ``privacy.delta``.
        curves: The curves to report: ``privacy.curves``, then ``replace-one`` when the
            sensitivity is below replace-one's.
        user_level: Whether the config has a ``clients:`` section.
        seed: ``seed``.
        seed_given: Whether the config gave the seed.
    """

    config: ExperimentConfig
    protocol: Protocol
    rate: float | None
    sample_size: int | None
    population: int
    sample_rate: float
    rounds: int
    eval_every: int
    noise_multiplier: float
    clipping_norm: float
    noise_mode: str
    sensitivity_setting: float | str
    sensitivity: float
    sensitivity_label: str
    sensitivity_assumptions: tuple[str, ...]
    analysis_sigma: float
    replace_one_sigma: float
    delta: float
    curves: tuple[str, ...]
    user_level: bool
    seed: int
    seed_given: bool

    @property
    def below_replace_one(self) -> bool:
        """Whether the sensitivity is below replace-one's 2 C (the paper's convention, say)."""
        return self.sensitivity < SENSITIVITIES["replace-one"]

    @property
    def unit(self) -> str:
        """The unit of privacy, as the guarantee names it."""
        return "one client (all its examples)" if self.user_level else "one client"

    def evaluated(self, round_number: int) -> bool:
        """Return whether round ``round_number`` (1-based) evaluates the model."""
        return round_number % self.eval_every == 0 or round_number == self.rounds

    def for_population(self, population: int) -> RunPlan:
        """Return the plan over ``population`` clients (itself when that is its population).

        Args:
            population: Number of clients (at least 1).

        Raises:
            ConfigError: one line, if the protocol refuses the population.
        """
        if population == self.population:
            return self
        rate = _sample_rate(self.protocol, population, self.rate, self.sample_size)
        return dataclasses.replace(self, population=population, sample_rate=rate)


def _sample_rate(
    protocol: Protocol, population: int, rate: float | None, sample_size: int | None
) -> float:
    try:
        return protocol.sample_rate(population=population, rate=rate, sample_size=sample_size)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def build_plan(config: ExperimentConfig, *, population: int | None = None) -> RunPlan:
    """Work out a run's plan from its validated config; the one place that reads it so.

    Args:
        config: A validated config (:func:`~.config.load_config`, :func:`~.config.validate`).
        population: Clients, when known otherwise (a session's partition); by default
            ``clients.count`` at user level, else the examples :func:`~.datasets.check_data`
            counts.

    Returns:
        The frozen :class:`RunPlan`.

    Raises:
        ConfigError: one line, if the dataset or the protocol refuses the config.
    """
    p, privacy = config.protocol, config.privacy
    if population is None:
        try:
            examples = check_data(config.data, config.clients)
        except DatasetError as exc:
            raise ConfigError(str(exc)) from None
        population = examples if config.clients is None else config.clients.count
    protocol = get_protocol(p.kind)
    sensitivity = resolve_sensitivity(privacy.sensitivity)
    curves = tuple(privacy.curves)
    if sensitivity < SENSITIVITIES["replace-one"]:
        curves += (REPLACE_ONE,)
    return RunPlan(
        config=config,
        protocol=protocol,
        rate=p.rate,
        sample_size=p.sample_size,
        population=population,
        sample_rate=_sample_rate(protocol, population, p.rate, p.sample_size),
        rounds=config.training.rounds,
        eval_every=config.training.eval_every,
        noise_multiplier=privacy.noise_multiplier,
        clipping_norm=privacy.clipping_norm,
        noise_mode=privacy.noise_mode,
        sensitivity_setting=privacy.sensitivity,
        sensitivity=sensitivity,
        sensitivity_label=sensitivity_label(privacy.sensitivity),
        sensitivity_assumptions=tuple(sensitivity_assumptions(privacy.sensitivity)),
        analysis_sigma=analysis_sigma(privacy.noise_multiplier, privacy.sensitivity),
        replace_one_sigma=analysis_sigma(privacy.noise_multiplier, "replace-one"),
        delta=privacy.delta,
        curves=curves,
        user_level=config.clients is not None,
        seed=config.seed,
        seed_given="seed" in config.model_fields_set,
    )


def as_plan(plan: RunPlan | ExperimentConfig) -> RunPlan:
    """Return ``plan`` itself, or the plan of a config (for callers that still pass one).

    Args:
        plan: A plan, or a validated config.

    Returns:
        The plan.

    Raises:
        ConfigError: as :func:`build_plan`.
    """
    return plan if isinstance(plan, RunPlan) else build_plan(plan)
