"""Decode a SecAgg+ aggregate and check it against what honest nodes can produce.

Under SecAgg+ the server sees one aggregate per round, never a report. :func:`decode_sum` turns it
into the sum of the reports and the count ``K`` of nodes that checked in, and rejects the round's
sum when a value is not finite, the count is not a whole number of nodes in ``[0, m]`` (``m`` the
nodes in the sum), or the sum's L2 norm exceeds
:meth:`~shuffle_opacus.flower.secagg.parameters.SecAggParameters.honest_sum_bound` ``(K, m)`` (an
honest round exceeds it with probability at most ``10⁻¹² (1 + K)``). The checks are post-processing
of what SecAgg+ releases, so they cost no privacy. They bound what a deviating node can do to one
round's update (at most ``bound(K, m) / K`` in the average), not the drift over many rounds, and
they cannot say which node deviated.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .parameters import SecAggParameters

__all__ = ["DecodedSum", "decode_sum"]


@dataclass(frozen=True)
class DecodedSum:
    """A round's decoded SecAgg+ sum.

    Attributes:
        sums: The sum of the reports, one float64 array per model array.
        count: ``K``, the number of nodes that checked in (``None`` if it does not decode).
        norm: The L2 norm of the sum over all model arrays (``inf`` if not finite).
        bound: The bound an honest sum meets (``nan`` when the count does not decode).
        problem: Why the sum is rejected, or ``None`` when it is accepted.
    """

    sums: list[np.ndarray]
    count: int | None
    norm: float
    bound: float
    problem: str | None

    @property
    def rejected(self) -> bool:
        """Whether the sum is rejected (its update must not be applied)."""
        return self.problem is not None


def decode_sum(
    aggregate: list[np.ndarray],
    num_in_sum: int,
    shapes: list[tuple[int, ...]],
    parameters: SecAggParameters,
) -> DecodedSum:
    """Turn SecAgg+'s aggregate into the sum of the reports and ``K``, and check them.

    Args:
        aggregate: What SecAgg+ hands ``aggregate_fit``: the mean over the ``m`` nodes in the
            sum, one array per model array and the count coordinate last.
        num_in_sum: ``m`` (integer >= 1).
        shapes: The model's array shapes.
        parameters: The run's SecAgg+ parameters.

    Returns:
        The :class:`DecodedSum` (its ``problem`` says why it is rejected, if it is).

    Raises:
        ValueError: if the aggregate does not have the model's shapes plus the count (the
            masked vectors are checked for that before they are summed).
    """
    if len(aggregate) != len(shapes) + 1 or [tuple(a.shape) for a in aggregate[:-1]] != shapes:
        raise ValueError("the secure sum does not have the model's shapes")
    m = num_in_sum
    with np.errstate(all="ignore"):
        total = [m * np.asarray(a, dtype=np.float64) for a in aggregate]
        squares = math.fsum(float(np.dot(t.ravel(), t.ravel())) for t in total[:-1])
    norm = math.sqrt(squares) if math.isfinite(squares) else math.inf
    count_raw = float(total[-1].reshape(-1)[0]) / parameters.count_value
    count = round(count_raw) if math.isfinite(count_raw) else None
    sums = total[:-1]
    problem: str | None = None
    if count is None or not 0 <= count <= m or abs(count_raw - count) > 0.25:
        problem = f"the secure count {count_raw:.6g} is not a whole number of nodes in [0, {m}]"
        return DecodedSum(sums, None, norm, math.nan, problem)
    bound = parameters.honest_sum_bound(count, m)
    if not all(np.all(np.isfinite(t)) for t in sums):
        problem = "the decoded sum is not finite"
    elif norm > bound:
        problem = (
            f"the decoded sum has norm {norm:.6g}, above the bound {bound:.6g} that a sum of "
            f"{count} honest reports among {m} nodes meets"
        )
    return DecodedSum(sums, count, norm, bound, problem)
