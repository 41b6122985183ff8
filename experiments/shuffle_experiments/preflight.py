"""Checks of a validated config's numbers before anything of a run is created.

The schema (:mod:`.config`) checks each value on its own; the library checks the training plan
again before round 0 (:func:`shuffle_opacus.engine.plan_checks.check_release_plan`), but only once
the data, the model and the engine exist, which is after the run directory. :func:`check_plan`
runs the library's checks of the plan's values first, from the config alone and with the
config's own keys in the messages: a learning rate, clipping norm or local learning rate whose
arithmetic overflows the parameters' dtype, a noise std ``noise_multiplier * clipping_norm *
sqrt(n)`` that does, and a noise multiplier whose epsilon cannot be computed.
"""

from __future__ import annotations

import torch

from shuffle_opacus.engine.plan_checks import check_plan_values

from .config import ConfigError, ExperimentConfig
from .datasets import MNIST_TRAIN_IMAGES
from .plan import RunPlan, as_plan

__all__ = ["CONFIG_NAMES", "MNIST_TRAIN_IMAGES", "check_plan"]

#: How the messages of :func:`check_plan` name the plan's values: by their config keys.
CONFIG_NAMES = {
    "noise_multiplier": "privacy.noise_multiplier",
    "max_norm": "privacy.clipping_norm",
    "lr": "optimizer.lr",
    "client_lr": "clients.client_lr",
}


def check_plan(plan: RunPlan | ExperimentConfig) -> None:
    """Refuse a config whose training plan the library would refuse, before any file exists.

    The population is ``clients.count`` at user level, else ``data.train_subset`` (all the
    dataset's training examples by default, MNIST's 60,000); the parameters' dtype is torch's
    default, in which the models are built.

    Args:
        plan: The run plan (:func:`~.plan.build_plan`); a validated config is still accepted.

    Raises:
        ConfigError: one line naming the config key and its allowed range.
    """
    plan = as_plan(plan)
    config = plan.config
    try:
        check_plan_values(
            noise_multiplier=plan.noise_multiplier,
            max_norm=plan.clipping_norm,
            population=plan.population,
            sample_rate=plan.sample_rate,
            sensitivity=plan.sensitivity_setting,
            rounds=plan.rounds,
            protocol=plan.protocol,
            dtype=torch.get_default_dtype(),
            lr=config.optimizer.lr,
            client_lr=config.clients.client_lr if config.clients is not None else None,
            names=CONFIG_NAMES,
        )
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
