"""SecAgg+ parameters of the secure-aggregation mode, derived from C, σ, n and the model size.

In the secure-aggregation mode (:class:`~shuffle_opacus.flower.SecAggCheckInMod` on the nodes,
:class:`~shuffle_opacus.flower.SecAggCheckInFedAvg` on the server) every node sends, in every
round, a vector of ``d + 1`` real numbers: its report (clipped update plus Gaussian noise if it
checked in, zeros otherwise; ``d`` coordinates) and a count coordinate (``c`` if it checked in,
0 otherwise). Flower's SecAgg+ (``flwr.client.mod.secaggplus_mod`` and
``flwr.server.workflow.SecAggPlusWorkflow``, the protocol of Bell, Bonawitz, Gascón, Lepoint
and Raykova, *Secure Single-Server Aggregation with (Poly)Logarithmic Overhead*, CCS 2020,
IACR ePrint 2020/704) then, on each node, clips every coordinate to ``[-c, c]`` (the *clipping
range*), maps it to an integer in ``[0, T]`` by unbiased stochastic rounding (``T`` is the
*quantisation range*), masks it modulo ``M`` (the *modulus*), and the server recovers the sum
of the integers modulo ``M`` and maps it back.

On the node, :class:`~shuffle_opacus.flower.SecAggCheckInMod` does the stochastic rounding
itself (:func:`round_onto_grid`), with a generator seeded from the operating system inside the
mod, and hands SecAgg+ values that Flower's quantiser maps onto its grid **exactly**, so that
Flower's own rounding (which draws from numpy's global generator, a generator the training code
can seed or advance from its data) has nothing left to decide.

:func:`secagg_parameters` chooses every SecAgg+ parameter so that this costs nothing that
matters:

* **clipping range** ``c >= C (1 + σ z)`` with ``z = Φ̄⁻¹(p / (2d))`` and ``p = 10⁻¹²``
  (:data:`CLIPPING_TAIL`): a coordinate of an honest report is a clipped-update coordinate
  (at most ``C`` in absolute value, since the whole update has norm at most ``C``) plus
  ``σC Z`` with ``Z ~ N(0, 1)``; ``P(|Z| > z) = 2 Φ̄(z)``, so by the union bound over the
  ``d`` coordinates a report has a coordinate beyond ``c`` with probability at most ``p``.
  When that happens the coordinate is clipped on the node (post-processing of the node's own
  report, no privacy cost); the expected clipping error of a coordinate is at most
  ``2 σC (φ(z') − z' Φ̄(z'))`` with ``z' = (c/C − 1)/σ >= z``
  (:meth:`SecAggParameters.clipping_bias_bound`);
* **modulus** ``M = 2³²`` (:data:`MODULUS`; Flower documents ``2³²`` as the largest it
  supports) and **quantisation range** ``T``, an even number at most
  ``T_max = M / 2^(⌈log₂ n⌉ + 1)``: each node's integers lie in ``[0, T]``, so the sum of the
  ``m ≤ n`` nodes of a round is below ``n (T + 1) < M``: **no wrap-around**. The weight factor
  Flower adds (``T`` per node, since every node reports weight 1 = ``max_weight``) sums to
  ``m T < M`` as well;
* **an exact grid**: the step ``Δ = 2c / T`` is a power of two, the smallest with
  ``2 C (1 + σ z) / Δ <= T_max − 2``, and ``c`` is that target rounded up to a whole number
  ``j`` of steps (``c = j Δ``, ``T = 2j``; so ``c`` exceeds its target by less than ``Δ`` and
  ``T > T_max / 2 − 1``). Then for every integer ``k`` in ``[0, T]`` the value
  ``(k − j) Δ`` is a float64 that Flower's quantiser, ``(x + c) · (T / (2c))``, maps to ``k``
  with no rounding error at all (sums and products of multiples of a power of two below
  ``2⁵³ Δ``, and ``T / (2c) = 1/Δ``);
* **quantisation error**: the node rounds each coordinate of its report (clipped to
  ``[-c, c]``) to one of the two neighbouring grid values, unbiased, so it moves by less than
  one step ``Δ``; the decoded sum of ``m`` reports differs from the plain sum of the
  ``[-c, c]``-clipped reports by less than ``m Δ`` in every coordinate (standard deviation at
  most ``Δ √m / 2``), and the averaged update by less than ``m Δ / K`` for ``K`` participants
  (:meth:`SecAggParameters.sum_error_bound`); the count decodes exactly because ``m Δ < c / 2``
  (``T > 4n``);
* **shares** ``s`` and **reconstruction threshold** ``t``: Flower places the nodes of a round on
  a ring in random order and makes each node share its secrets with the ``(s − 1) / 2`` nodes
  on each side (all nodes when ``s = n``, which is the SecAgg protocol of Bonawitz, Ivanov,
  Kreuter, Marcedone, McMahan, Patel, Ramage, Segal and Seth, *Practical Secure Aggregation
  for Privacy-Preserving Machine Learning*, CCS 2017, IACR ePrint 2017/281). We take the
  smallest odd ``s ≥ max(9, 2D + 1)`` (:data:`MIN_SHARES`; ``s = n`` when that is not below
  ``n``) and ``t = ⌊s/2⌋ + 1``. Then

  - up to ``D`` = ``max_dropouts`` nodes may be lost in a round and every node still has ``t``
    live neighbours (``s − t ≥ D``), which Flower needs to unmask;
  - the secrets of a node are safe from any coalition of fewer than ``t`` of its neighbours;
  - for ``s < n`` the neighbour graph is the circulant graph with ``(s − 1)/2`` neighbours on
    each side, which is ``(s − 1)``-connected (Harary, *The maximum connectivity of a graph*,
    PNAS 48(7), 1962), so it stays connected after removing up to ``s − 2`` nodes: with ``D``
    lost nodes and ``k`` nodes colluding with the server, ``D + k ≤ s − 2`` keeps the
    honest live nodes connected, and the server learns only their total (Bell et al.);
  - every masked vector carries at least ``min(s, n) − 1`` pairwise masks. Flower 1.41
    expands each mask from a 32-bit seed (``pseudo_rand_gen`` folds the 32-byte seed to 32 bits
    and draws with numpy's Mersenne Twister), not from the cryptographic generator the
    protocol assumes; ``s ≥ 9`` puts eight or more such masks (256 seed bits) on every vector.
    See ``docs/flower.md`` for what this means.

The accountant of the mode uses the population ``n − D`` (:attr:`SecAggParameters.population`)
and the server halts, before unmasking, any round whose sum would hold fewer than ``n − D``
nodes; ``docs/maths.md`` derives why this keeps the check-in analysis valid.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy.special import ndtri

from ..analysis._validation import check_int, check_nonnegative, check_positive

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
    """The SecAgg+ parameters of one run (see the module docstring for the derivation).

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
    """Derive the SecAgg+ parameters of a run (see the module docstring).

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
    values: list[np.ndarray], parameters: SecAggParameters, rng: np.random.Generator
) -> list[np.ndarray]:
    """Round a report stochastically onto SecAgg+'s grid, with the caller's generator.

    Each coordinate is clipped to ``[-c, c]``, then replaced by one of the two neighbouring
    grid values ``(k − j) Δ`` (``k`` in ``0 .. T``, ``j = T / 2``), the upper one with
    probability equal to the coordinate's distance above the lower one in steps: unbiased,
    and off by less than ``Δ``. Flower's quantiser maps each result onto ``k`` exactly (see the
    module docstring), so its own stochastic rounding, which draws from numpy's global
    generator, changes nothing.

    Args:
        values: The report's arrays (finite floats).
        parameters: The run's :class:`SecAggParameters`.
        rng: The generator of the rounding (the mod's, seeded from the operating system).

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
