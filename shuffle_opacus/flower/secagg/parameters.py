"""SecAgg+ parameters of the secure-aggregation mode, derived from C, σ, n, D and the model size.

Every node sends, every round, ``d + 1`` numbers to Flower's SecAgg+ (Bell, Bonawitz, Gascón,
Lepoint and Raykova, CCS 2020, IACR ePrint 2020/704): its report (clipped update plus noise, or
zeros) and a count coordinate. SecAgg+ clips each coordinate to ``[-c, c]`` (clipping range),
maps it to an integer in ``[0, T]`` (quantisation range) and masks it modulo ``M``.
:func:`secagg_parameters` chooses ``c`` so that an honest coordinate exceeds it with probability
at most :data:`CLIPPING_TAIL`, ``M = 2³²`` with ``T`` small enough that the sum never wraps
around, a step ``Δ = 2c / T`` that is a power of two so that every grid value maps to its integer
exactly, and ``s`` shares with threshold ``t = ⌊s/2⌋ + 1`` (``s`` the smallest odd number
``≥ max(9, 2D + 1)``). :func:`round_onto_grid` is the node's own unbiased rounding onto that
grid (so Flower's rounding, drawn from numpy's global generator, decides nothing). The accountant
uses the population ``n − D`` (:attr:`SecAggParameters.population`). ``docs/flower.md``
("SecAgg+ parameters and their bounds") derives every choice and its bounds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy.special import ndtri

from ...common.secure_random import Draws
from ...common.validation import check_int, check_nonnegative, check_positive

__all__ = [
    "CLIPPING_TAIL",
    "HONEST_SUM_TAIL",
    "MAX_NODES",
    "MIN_SHARES",
    "MODULUS",
    "SecAggParameters",
    "round_onto_grid",
    "secagg_parameters",
]

#: Probability with which one honest report has a coordinate beyond the clipping range.
CLIPPING_TAIL = 1e-12
#: SecAgg+ modulus ``M`` (Flower's default and documented maximum).
MODULUS = 2**32
#: Smallest number of shares (and so of neighbours, the node included) when ``n`` allows it.
MIN_SHARES = 9
#: Largest population of the mode: beyond it ``T > 4n`` fails for ``M = 2³²``.
MAX_NODES = 10_000
#: Probability with which the Gaussian part of an honest sum exceeds its bound in
#: :meth:`SecAggParameters.honest_sum_bound`.
HONEST_SUM_TAIL = 1e-12


@dataclass(frozen=True)
class SecAggParameters:
    """The SecAgg+ parameters of one run (``docs/flower.md`` derives them).

    Attributes:
        num_nodes: ``n``, the nodes taking part in every round's secure sum.
        max_dropouts: ``D``, the most nodes a round's sum may miss before the round is halted.
        dimension: ``d``, the number of model coordinates (the count coordinate excluded).
        clip_norm: ``C``.
        noise_multiplier: σ.
        num_shares: ``s``, each node's secret shares (its neighbours, itself included).
        threshold: ``t``, the shares needed to reconstruct a secret.
        clipping_range: ``c``; every coordinate is clipped to ``[-c, c]`` before quantisation.
        quantization_range: ``T``; ``[-c, c]`` maps onto the integers ``0 .. T``.
        modulus_range: ``M``.
    """

    num_nodes: int
    max_dropouts: int
    dimension: int
    clip_norm: float
    noise_multiplier: float
    num_shares: int
    threshold: int
    clipping_range: float
    quantization_range: int
    modulus_range: int

    @property
    def population(self) -> int:
        """``n − D``: the population the accountant uses (the fewest nodes in a released sum)."""
        return self.num_nodes - self.max_dropouts

    @property
    def complete_graph(self) -> bool:
        """Whether every node shares with every other (``s = n``: SecAgg of Bonawitz et al.)."""
        return self.num_shares == self.num_nodes

    @property
    def step(self) -> float:
        """``Δ = 2c / T``: one quantisation step in parameter units."""
        return 2.0 * self.clipping_range / self.quantization_range

    @property
    def count_value(self) -> float:
        """Value of the count coordinate of a node that checked in (``c``; 0 otherwise)."""
        return self.clipping_range

    @property
    def tail_quantile(self) -> float:
        """``z = Φ̄⁻¹(p / (2d))`` with ``p`` = :data:`CLIPPING_TAIL`."""
        return _tail_quantile(self.dimension)

    def sum_error_bound(self, num_in_sum: int) -> float:
        """Bound on the error of the decoded sum of ``num_in_sum`` reports, per coordinate.

        Each report's coordinate moves by less than one step ``Δ`` under stochastic rounding;
        the floating-point arithmetic of the encoding and decoding adds less than ``10⁻⁶ Δ``
        per report (its relative error is about ``2⁻⁵²``, against ``Δ / c = 2 / T >= 2⁻³¹``).

        Args:
            num_in_sum: ``m``, the nodes whose reports are in the sum (integer >= 1).

        Returns:
            ``m Δ (1 + 10⁻⁶)``, in parameter units.
        """
        m = check_int("num_in_sum", num_in_sum, minimum=1)
        return m * self.step * (1.0 + 1e-6)

    def clipping_bias_bound(self) -> float:
        """Bound on the expected clipping error of one coordinate of an honest report.

        ``E[(|x| − c)₊] <= σC E[(|Z| − z')₊] = 2σC (φ(z') − z' Φ̄(z'))`` for ``x = u + σC Z``
        with ``|u| <= C`` and ``c = C + σC z'`` (``z' >= z``: ``c`` is rounded up to the grid).

        Returns:
            The bound, in parameter units (0 when σ = 0: nothing is ever clipped).
        """
        if self.noise_multiplier == 0.0:
            return 0.0
        z = (self.clipping_range / self.clip_norm - 1.0) / self.noise_multiplier
        phi = math.exp(-0.5 * z * z) / math.sqrt(2.0 * math.pi)
        tail = 0.5 * math.erfc(z / math.sqrt(2.0))
        return 2.0 * self.noise_multiplier * self.clip_norm * max(phi - z * tail, 0.0)

    def honest_sum_bound(self, num_checked_in: int, num_in_sum: int) -> float:
        """Bound on the L2 norm of a decoded sum of ``K`` honest reports among ``m`` nodes.

        The sum of ``K`` honest reports is the sum of ``K`` clipped updates (norm at most
        ``K C``) plus ``N(0, K σ²C² I_d)``, whose norm is below ``σC √K (√d + √(2 ln(1/p)))``
        except with probability ``p`` = :data:`HONEST_SUM_TAIL` (Laurent and Massart,
        *Adaptive estimation of a quadratic functional by model selection*, Annals of
        Statistics 28(5), 2000, Lemma 1); the ``m − K`` nodes that did not check in add exact
        zeros, and the quantisation moves every coordinate of the sum by less than
        :meth:`sum_error_bound` ``(m)``. So an honest round's decoded sum (model coordinates,
        count excluded) exceeds

            ``K C + σC √K (√d + √(2 ln(1/p))) + √d · m Δ (1 + 10⁻⁶)``

        with probability at most ``p + K ·`` :data:`CLIPPING_TAIL` (the second term: some
        honest coordinate was clipped to ``[-c, c]``).

        Args:
            num_checked_in: ``K``, the decoded count (integer in ``[0, m]``).
            num_in_sum: ``m``, the nodes in the sum (integer >= 1).

        Returns:
            The bound, in parameter units.

        Raises:
            ValueError: for counts outside their ranges.
        """
        m = check_int("num_in_sum", num_in_sum, minimum=1)
        k = check_int("num_checked_in", num_checked_in, minimum=0, maximum=m)
        d = self.dimension
        gaussian = math.sqrt(d) + math.sqrt(2.0 * math.log(1.0 / HONEST_SUM_TAIL))
        noise = self.noise_multiplier * self.clip_norm * math.sqrt(k) * gaussian
        return k * self.clip_norm + noise + math.sqrt(d) * self.sum_error_bound(m)

    def workflow_arguments(self) -> dict[str, int | float]:
        """Keyword arguments of ``flwr.server.workflow.SecAggPlusWorkflow`` for these values.

        ``num_shares = 1.0`` asks Flower for all sampled nodes (the complete graph); Flower
        converts an integer ``reconstruction_threshold`` of 1 to a fraction, which ``t >= 2``
        avoids.
        """
        return {
            "num_shares": 1.0 if self.complete_graph else self.num_shares,
            "reconstruction_threshold": self.threshold,
            "max_weight": 1.0,
            "clipping_range": self.clipping_range,
            "quantization_range": self.quantization_range,
            "modulus_range": self.modulus_range,
        }


def _tail_quantile(dimension: int) -> float:
    return float(-ndtri(CLIPPING_TAIL / (2.0 * dimension)))


def max_dropouts_allowed(num_nodes: int) -> int:
    """Return the largest ``D`` the mode accepts for ``n`` nodes: ``⌈n/2⌉ − 1``.

    Beyond it the complete graph (``s = n``, ``t = ⌊n/2⌋ + 1``) cannot keep ``t`` live
    neighbours per node.
    """
    return (num_nodes + 1) // 2 - 1


def secagg_parameters(
    *,
    num_nodes: int,
    dimension: int,
    clip_norm: float,
    noise_multiplier: float,
    max_dropouts: int = 0,
) -> SecAggParameters:
    """Derive the SecAgg+ parameters of a run (``docs/flower.md`` derives each choice).

    Args:
        num_nodes: ``n``, integer in ``[2, 10000]``.
        dimension: ``d``, the model's number of coordinates (integer >= 1).
        clip_norm: ``C`` (> 0).
        noise_multiplier: σ (>= 0).
        max_dropouts: ``D``, integer in ``[0, ⌈n/2⌉ − 1]``.

    Returns:
        The :class:`SecAggParameters`.

    Raises:
        ValueError: naming the first argument outside its range.
    """
    n = check_int("num_nodes", num_nodes, minimum=2, maximum=MAX_NODES)
    d = check_int("dimension", dimension, minimum=1)
    c_norm = check_positive("clip_norm", clip_norm)
    sigma = check_nonnegative("noise_multiplier", noise_multiplier)
    top = max_dropouts_allowed(n)
    if isinstance(max_dropouts, bool) or not isinstance(max_dropouts, int):
        raise ValueError(
            f"max_dropouts must be an integer in [0, {top}] for num_nodes = {n}. "
            f"Found {max_dropouts!r}."
        )
    if not 0 <= max_dropouts <= top:
        raise ValueError(
            f"max_dropouts must be an integer in [0, {top}] for num_nodes = {n}. "
            f"Found {max_dropouts!r}."
        )
    shares = max(MIN_SHARES, 2 * max_dropouts + 1)
    shares += 1 - shares % 2
    if shares >= n:
        shares = n
    threshold = shares // 2 + 1
    target = c_norm * (1.0 + sigma * _tail_quantile(d))
    step, half = _grid(target, MODULUS >> (math.ceil(math.log2(n)) + 1))
    return SecAggParameters(
        num_nodes=n,
        max_dropouts=max_dropouts,
        dimension=d,
        clip_norm=c_norm,
        noise_multiplier=sigma,
        num_shares=shares,
        threshold=threshold,
        clipping_range=half * step,
        quantization_range=2 * half,
        modulus_range=MODULUS,
    )


def _grid(target: float, top: int) -> tuple[float, int]:
    """Return ``(Δ, j)``, the step and the half range of the grid.

    ``Δ`` is the smallest power of two with ``2 target / Δ <= top − 2`` and
    ``j = ⌈target / Δ⌉``, so that ``c = j Δ >= target`` and ``T = 2j <= top``.
    """
    step = 2.0 ** math.ceil(math.log2(2.0 * target / (top - 2)))
    while 2.0 * target / step > top - 2:
        step *= 2.0
    while 2.0 * target / (step / 2.0) <= top - 2:
        step /= 2.0
    return step, math.ceil(target / step)


def round_onto_grid(
    values: list[np.ndarray], parameters: SecAggParameters, rng: Draws
) -> list[np.ndarray]:
    """Round a report stochastically onto SecAgg+'s grid, with the caller's generator.

    Each coordinate is clipped to ``[-c, c]``, then replaced by one of the two neighbouring
    grid values ``(k − j) Δ`` (``k`` in ``0 .. T``, ``j = T / 2``), the upper one with
    probability equal to the coordinate's distance above the lower one in steps: unbiased,
    and off by less than ``Δ``. Flower's quantiser maps each result onto ``k`` exactly (``Δ`` is
    a power of two; ``docs/flower.md``), so its own stochastic rounding, which draws from
    numpy's global generator, changes nothing.

    Args:
        values: The report's arrays (finite floats).
        parameters: The run's :class:`SecAggParameters`.
        rng: The generator of the rounding (the mod's: the operating system's draws, or
            numpy's PCG64 when the mod is given a seed).

    Returns:
        float64 arrays of the same shapes, on the grid.

    Raises:
        ValueError: for a non-finite value.
    """
    c, step, top = parameters.clipping_range, parameters.step, parameters.quantization_range
    half = top // 2
    out = []
    for value in values:
        x = np.asarray(value, dtype=np.float64)
        if not np.all(np.isfinite(x)):
            raise ValueError("round_onto_grid needs finite values.")
        position = (np.clip(x, -c, c) + c) / step
        low = np.floor(position)
        k = np.clip(low + (rng.random(position.shape) < position - low), 0, top)
        out.append((k - half) * step)
    return out
