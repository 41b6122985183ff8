"""What a run may claim, and the checks that its epsilons describe what it released."""

from __future__ import annotations

import math
from typing import Any

from shuffle_opacus.analysis.limits import PldRangeError
from shuffle_opacus.protocols import sensitivity_assumptions, sensitivity_label

from .config import ConfigError, ExperimentConfig
from .curves import REPLACE_ONE, EpsilonCurves
from .session import Session

__all__ = ["guarantee_record"]


def guarantee_record(
    config: ExperimentConfig, curves: EpsilonCurves, rounds: int
) -> dict[str, Any]:
    """Return what a run of ``rounds`` rounds may claim (for the summary and summary.json).

    Args:
        config: The run's config.
        curves: Its epsilon curves.
        rounds: Rounds released.

    Returns:
        ``epsilon`` (the accountant's default: ``pld`` where the work limits allow it, else the
        Rényi bound), ``method``, ``epsilon_lower`` (the optimistic estimate of a ``pld``
        result), ``note``, ``delta``, ``neighbouring``, ``unit``, ``sensitivity``,
        ``assumptions`` and ``seed``.
    """
    result = curves.guarantee(rounds, lower=True) if rounds else None
    protocol = curves.protocol
    record: dict[str, Any] = {
        "epsilon": result.epsilon if result is not None else 0.0,
        "method": result.method if result is not None else None,
        "epsilon_lower": result.epsilon_lower if result is not None else None,
        "note": result.note if result is not None else None,
        "delta": config.privacy.delta,
        "neighbouring": protocol.analysis.neighbouring,
        "unit": "one client" if config.clients is None else "one client (all its examples)",
        "sensitivity": sensitivity_label("replace-one"),
        "assumptions": list(protocol.analysis.assumptions),
        "seed": (
            f"{config.seed} (given): a reproducible simulation; its epsilon does not hold "
            f"against anyone who knows the seed (a deployment draws its coins from the OS)"
        ),
    }
    if REPLACE_ONE in curves.names and rounds:
        # The config's own convention, beside the guarantee and labelled with what it assumes.
        record["convention"] = {
            "sensitivity": sensitivity_label(config.privacy.sensitivity),
            "epsilon": curves.convention(rounds).epsilon,
            "assumptions": list(sensitivity_assumptions(config.privacy.sensitivity)),
        }
    return record


def _check_curves(session: Session) -> None:
    """Check, before anything is written, that every configured curve can be evaluated.

    The per-round PMF of ``pld`` is built here (once per process), at the planned last round.

    Raises:
        ConfigError: one line naming ``privacy.accountants`` when ``pld`` cannot evaluate the
            setting.
    """
    rounds = session.config.training.rounds
    if "pld" not in session.curves.names:
        return
    try:
        session.curves.epsilon("pld", rounds)
    except PldRangeError as exc:
        raise ConfigError(
            f"privacy.accountants: pld cannot evaluate this setting ({str(exc).rstrip('.')}); "
            f"remove it (the exact curve is the Rényi bound)"
        ) from None


def _check_history(session: Session, rounds: int, where: str) -> None:
    """Check that the accountant holds exactly the rounds the config implies.

    The epsilon curves of ``metrics.csv`` are computed from the config, ``rounds`` rounds of
    ``(noise_multiplier, sample_rate)``; the accountant must hold the same history, or the
    curves would misstate what was released.

    Raises:
        ConfigError: one line naming ``where`` the history came from.
    """
    held = [entry for entry in session.engine.accountant.history if entry[2]]
    sigma = float(session.config.privacy.noise_multiplier)
    expected = [(sigma, session.curves.sample_rate, rounds)] if rounds else []
    if held != expected:
        raise ConfigError(
            f"{where}: the accountant holds the rounds {held} (noise_multiplier, sample_rate, "
            f"rounds) but config.yaml implies {expected}; the epsilon curves would not describe "
            f"the training. Restore the config.yaml and checkpoint that belong together, or start "
            f"a new run"
        )


def _check_accountant(session: Session, rounds: int) -> None:
    """Check that the Opacus accountant and the curve of its method give the same epsilon.

    Raises:
        ConfigError: one line, if they differ.
    """
    _check_history(session, rounds, "at the end of the run")
    delta = session.config.privacy.delta
    theirs = session.engine.accountant.epsilon_result(delta)
    curve = "pld" if theirs.method == "pld" else "exact"
    if curve not in session.curves.names:
        return
    ours = session.curves.epsilon(curve, rounds)
    if not math.isclose(ours, theirs.epsilon, rel_tol=1e-9, abs_tol=1e-12):
        raise ConfigError(
            f"the accountant's epsilon {theirs.epsilon} ({theirs.method}) differs from the "
            f"{curve} curve's {ours}; no summary or plot was written"
        )
