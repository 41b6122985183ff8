"""The sensitivity convention: how the local noise multiplier becomes the analysis sigma.

:func:`analysis_sigma` divides the noise multiplier by the sensitivity, in units of the clipping
norm ``C``: ``"replace-one"`` (2, the default and the guarantee), ``"paper"`` (1, the convention
of Liew & Takahashi, *Shuffle Gaussian Mechanism for Differential Privacy*, arXiv:2206.09569,
§5.2) or a number in :data:`SENSITIVITY_RANGE`. **Warning:** ``"paper"``, or any number below 2,
is **not** a DP guarantee for updates clipped to ``C``: it holds only if every clipped update
lies within that many ``C`` of every other. It warns once (:class:`PaperConventionWarning`) and
:func:`sensitivity_assumptions` says so. Units, accepted values and the counterexample:
docs/opacus.md, "Units and the sensitivity convention"; docs/maths.md, "Conventions and
assumptions". :mod:`shuffle_opacus.accounting.protocols` re-exports every name. No torch import.
"""

from __future__ import annotations

import warnings

from ..common.validation import check_positive, describe_value, real_value

__all__ = [
    "SENSITIVITIES",
    "SENSITIVITY_RANGE",
    "resolve_sensitivity",
    "analysis_sigma",
    "sensitivity_label",
    "sensitivity_assumptions",
    "PaperConventionWarning",
]

#: Named sensitivity conventions, in units of the clipping norm C.
SENSITIVITIES: dict[str, float] = {"replace-one": 2.0, "paper": 1.0}

#: The numeric sensitivities accepted, in units of C: from the paper's convention (the differing
#: client's reports C apart) to replace-one (2C, the diameter of the clipping ball).
SENSITIVITY_RANGE: tuple[float, float] = (1.0, 2.0)


class PaperConventionWarning(UserWarning):
    """A sensitivity below replace-one's 2C: epsilon assumes all clipped updates are close."""


_WARNED: set[float] = set()


def _warn_below_replace_one(sensitivity: float) -> None:
    if sensitivity >= SENSITIVITIES["replace-one"] or sensitivity in _WARNED:
        return
    _WARNED.add(sensitivity)
    warnings.warn(
        f"sensitivity {sensitivity:g} C is below replace-one's 2 C (the paper's convention is "
        f"1 C), so it is no guarantee for updates clipped to C: its epsilon holds only if every "
        f"clipped update "
        f"lies within {sensitivity:g} C of every other (e.g. updates clipped to "
        f"{sensitivity / 2:g} C). Use sensitivity='replace-one' for a guarantee; see "
        f"docs/maths.md. (Shown once.)",
        PaperConventionWarning,
        stacklevel=3,
    )


def sensitivity_label(value: float | str) -> str:
    """Say what a sensitivity convention means, for results and summaries.

    Args:
        value: As for :func:`resolve_sensitivity`.

    Returns:
        One line: the convention, how it turns the noise multiplier into the analysis sigma,
        and, below replace-one, the condition under which its epsilon holds.

    Raises:
        ValueError: as :func:`resolve_sensitivity`.
    """
    sens = _resolve(value)
    if sens == SENSITIVITIES["replace-one"]:
        return "replace-one (clipped updates up to 2C apart; analysis sigma = noise_multiplier / 2)"
    name = "the paper's convention, " if sens == SENSITIVITIES["paper"] else ""
    return (
        f"{name}{sens:g} C (analysis sigma = noise_multiplier / {sens:g}): holds only if every "
        f"clipped update lies within {sens:g} C of every other, not for updates clipped to C"
    )


def sensitivity_assumptions(value: float | str) -> tuple[str, ...]:
    """Return the assumptions a sensitivity below 2 C adds to the guarantee (none at 2 C).

    Raises:
        ValueError: as :func:`resolve_sensitivity`.
    """
    sens = _resolve(value)
    if sens >= SENSITIVITIES["replace-one"]:
        return ()
    return (
        f"every clipped update lies within {sens:g} C of every other (sensitivity {sens:g} C, "
        f"below the clipping ball's diameter 2C)",
    )


def resolve_sensitivity(value: float | str) -> float:
    """Return the sensitivity in units of the clipping norm.

    Args:
        value: ``"replace-one"`` (2.0), ``"paper"`` (1.0) or a real number in
            :data:`SENSITIVITY_RANGE` (``[1, 2]``).

    Returns:
        The sensitivity as a float.

    Raises:
        ValueError: for an unknown name, a number outside ``[1, 2]`` (with the reason), or a
            value that is neither a name nor a real number (a bool or a tensor, say).

    Warns:
        PaperConventionWarning: once per value below 2 in a process (what it assumes).
    """
    sens = _resolve(value)
    _warn_below_replace_one(sens)
    return sens


def _resolve(value: float | str) -> float:
    low, high = SENSITIVITY_RANGE
    if isinstance(value, str):
        if value not in SENSITIVITIES:
            names = ", ".join(repr(k) for k in SENSITIVITIES)
            raise ValueError(
                f"sensitivity must be one of {names} or a number in [{low:g}, {high:g}] (in units "
                f"of the clipping norm). Found {value!r}."
            )
        return SENSITIVITIES[value]
    number = real_value(value)
    if number is None or not low <= number <= high:
        raise ValueError(
            f"sensitivity must be 'replace-one' (2), 'paper' (1) or a number in [{low:g}, "
            f"{high:g}] in units of the clipping norm: clipped reports are at most 2C apart, and "
            f"below C the guarantee would rest on the data, not on the clipping. Found "
            f"{describe_value(value)}."
        )
    return number


def analysis_sigma(noise_multiplier: float, sensitivity: float | str) -> float:
    """Return the analysis sigma of a noise multiplier: ``noise_multiplier / sensitivity``.

    Args:
        noise_multiplier: Each client's noise standard deviation divided by the clipping norm.
        sensitivity: See :func:`resolve_sensitivity` (in units of the clipping norm).

    Returns:
        The noise standard deviation in units of the L2 distance between the differing
        client's two possible reports (the paper's sigma).

    Raises:
        ValueError: for a non-positive noise multiplier or an invalid sensitivity.
    """
    return check_positive("noise_multiplier", noise_multiplier) / resolve_sensitivity(sensitivity)
