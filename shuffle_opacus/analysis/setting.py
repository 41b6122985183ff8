"""The validated setting of one round of a mechanism (the key of the per-round caches).

Its own module so that the mechanism table (:mod:`.mechanisms`) and the functions behind its
methods (:mod:`.methods`) both import it from below instead of from each other.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["RoundSetting"]

_PARAMETER_ORDER = ("n", "sigma", "m", "rate")


@dataclass(frozen=True)
class RoundSetting:
    """The validated parameters of one round of a mechanism (hashable, so results can be cached).

    Attributes:
        sigma: Noise parameter (unit as in the module docstring).
        n: Number of users (shuffle mechanisms).
        m: Users per round (``subsampled``).
        rate: Check-in or Poisson rate.
    """

    sigma: float
    n: int | None = None
    m: int | None = None
    rate: float | None = None

    def as_dict(self) -> dict[str, float | int | None]:
        """Return the parameters in display order (``n``, ``sigma``, ``m``, ``rate``)."""
        return {name: getattr(self, name) for name in _PARAMETER_ORDER}
