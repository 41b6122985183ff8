"""What a run may claim, and the checks that its epsilons describe what it released."""

from __future__ import annotations

import math
from typing import Any

from shuffle_opacus.accounting.protocols import sensitivity_label
from shuffle_opacus.analysis.limits import PldRangeError

from .config import ConfigError, ExperimentConfig
from .curves import PROVEN, REPLACE_ONE, EpsilonCurves
from .plan import RunPlan, as_plan
from .session import Session

__all__ = ["guarantee_record", "proven_record", "rests_on"]

#: How each route of the proven bound is named in the summary.
_ROUTES = {
    "blanket": "the reports' blanket pair, Theorem 4.1 of arXiv:2012.12803",
    "clones": "the reports' clones pair, Theorem 3.8 of arXiv:2012.12803",
    "gaussian": "the local Gaussian alone, no amplification by shuffling proven at this noise",
}

#: How the guarantee's sensitivity is named: replace-one, whatever the config's convention.
_REPLACE_ONE_LABEL = sensitivity_label("replace-one")

#: The secret coins each protocol's guarantees need besides the noise and the shuffle.
_COINS = {"checkin": ", secret check-in coins", "subsampled": ", secret sampling coins"}


def rests_on(protocol: str, method: str | None) -> str:
    """Return the one line that says what the tight and the proven epsilon each rest on.

    Args:
        protocol: The protocol's name (``checkin``, ``subsampled`` or ``full``).
        method: The tight guarantee's method (``pld``, or the Rényi bound it fell back to).
    """
    tight = method or "pld"
    return (
        f"tight ({tight}): Theorem 1's pair is the worst case (numerical evidence); proven: "
        f"published theorems, no assumption on the other users' updates; both: secret noise, "
        f"secret shuffle{_COINS.get(protocol, '')}"
    )


def proven_record(curves: EpsilonCurves, rounds: int) -> dict[str, Any]:
    """Return the proven epsilon after ``rounds`` rounds with what it rests on.

    Returns:
        ``epsilon``, ``method`` (``proven``), ``route`` and ``route_text`` (which pair bounds
        it), ``delta_pld`` and ``delta_coupling`` (how delta was split between the composed
        pair and the stand-ins' total variation), ``details`` (the library's, level included),
        ``sensitivity`` (always replace-one) and ``assumptions``.
    """
    result = curves.proven(rounds)
    details = dict(result.details or {})
    route = details.get("route")
    return {
        "epsilon": result.epsilon,
        "method": PROVEN,
        "route": route,
        "route_text": _ROUTES.get(str(route), str(route)),
        "delta_pld": details.get("delta_pld"),
        "delta_coupling": details.get("delta_coupling"),
        "details": details,
        "sensitivity": _REPLACE_ONE_LABEL,
        "assumptions": list(curves.protocol.analysis.assumptions_of(PROVEN)),
    }


def guarantee_record(
    plan: RunPlan | ExperimentConfig, curves: EpsilonCurves, rounds: int
) -> dict[str, Any]:
    """Return what a run of ``rounds`` rounds may claim (for the summary and summary.json).

    Args:
        plan: The run plan (:func:`~.plan.build_plan`); the run's config is still accepted.
        curves: Its epsilon curves.
        rounds: Rounds released.

    Returns:
        ``epsilon`` (the accountant's default: ``pld`` where the work limits allow it, else the
        Rényi bound), ``method``, ``epsilon_lower`` (the optimistic estimate of a ``pld``
        result), ``note``, ``delta``, ``neighbouring``, ``unit``, ``sensitivity``,
        ``assumptions`` and ``seed``; when ``proven`` is a curve of the run, also ``proven``
        (:func:`proven_record`) and ``rests_on`` (:func:`rests_on`, what each epsilon rests on).
    """
    plan = as_plan(plan)
    result = curves.guarantee(rounds, lower=True) if rounds else None
    protocol = curves.protocol
    record: dict[str, Any] = {
        "epsilon": result.epsilon if result is not None else 0.0,
        "method": result.method if result is not None else None,
        "epsilon_lower": result.epsilon_lower if result is not None else None,
        "note": result.note if result is not None else None,
        "delta": plan.delta,
        "neighbouring": protocol.analysis.neighbouring,
        "unit": plan.unit,
        "sensitivity": _REPLACE_ONE_LABEL,
        "assumptions": list(protocol.analysis.assumptions),
        "seed": (
            f"{plan.seed} (given): a reproducible simulation; its epsilon does not hold "
            f"against anyone who knows the seed (a deployment draws its coins from the OS)"
        ),
    }
    if REPLACE_ONE in curves.names and rounds:
        # The config's own convention, beside the guarantee and labelled with what it assumes.
        record["convention"] = {
            "sensitivity": plan.sensitivity_label,
            "epsilon": curves.convention(rounds).epsilon,
            "assumptions": list(plan.sensitivity_assumptions),
        }
    if PROVEN in curves.names and rounds:
        record["proven"] = proven_record(curves, rounds)
        record["rests_on"] = rests_on(protocol.name, record["method"])
    return record


def _check_curves(session: Session) -> None:
    """Check, before anything is written, that every configured curve can be evaluated.

    The per-round PMF of ``pld`` is built here (once per process), at the planned last round;
    ``proven`` is evaluated there too, so that a setting it cannot evaluate fails before
    training rather than at the summary.

    Raises:
        ConfigError: one line naming ``privacy.curves`` when ``pld`` or ``proven`` cannot
            evaluate the setting.
    """
    rounds = session.plan.rounds
    fixes = {"pld": "the exact curve is the Rényi bound", PROVEN: "pld is the tight guarantee"}
    for name, fix in fixes.items():
        if name not in session.curves.names:
            continue
        try:
            session.curves.epsilon(name, rounds)
        except PldRangeError as exc:
            raise ConfigError(
                f"privacy.curves: {name} cannot evaluate this setting "
                f"({str(exc).rstrip('.')}); remove it ({fix})"
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
    sigma = float(session.plan.noise_multiplier)
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
    theirs = session.engine.accountant.epsilon_result(session.plan.delta)
    curve = "pld" if theirs.method == "pld" else "exact"
    if curve not in session.curves.names:
        return
    ours = session.curves.epsilon(curve, rounds)
    if not math.isclose(ours, theirs.epsilon, rel_tol=1e-9, abs_tol=1e-12):
        raise ConfigError(
            f"the accountant's epsilon {theirs.epsilon} ({theirs.method}) differs from the "
            f"{curve} curve's {ours}; no summary or plot was written"
        )
