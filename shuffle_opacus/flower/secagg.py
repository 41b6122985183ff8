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

:func:`secagg_parameters` chooses every SecAgg+ parameter so that this costs nothing that
matters:

* **clipping range** ``c = C (1 + σ z)`` with ``z = Φ̄⁻¹(p / (2d))`` and ``p = 10⁻¹²``
  (:data:`CLIPPING_TAIL`): a coordinate of an honest report is a clipped-update coordinate
  (at most ``C`` in absolute value, since the whole update has norm at most ``C``) plus
  ``σC Z`` with ``Z ~ N(0, 1)``; ``P(|Z| > z) = 2 Φ̄(z)``, so by the union bound over the
  ``d`` coordinates a report has a coordinate beyond ``c`` with probability at most ``p``.
  When that happens the coordinate is clipped on the node (post-processing of the node's own
  report, no privacy cost); the expected clipping error of a coordinate is at most
  ``2 σC (φ(z) − z Φ̄(z))`` (:meth:`SecAggParameters.clipping_bias_bound`);
* **modulus** ``M = 2³²`` (:data:`MODULUS`; Flower documents ``2³²`` as the largest it
  supports) and **quantisation range** ``T = M / 2^(⌈log₂ n⌉ + 1)``: each node's integers are
  at most ``T + 1`` (floating-point rounding can push the top of the range one step over), so
  the sum of the ``m ≤ n`` nodes of a round is below ``n (T + 1) < M``: **no wrap-around**.
  The weight factor Flower adds (``T`` per node, since every node reports weight 1 =
  ``max_weight``) sums to ``m T < M`` as well;
* **quantisation error**: stochastic rounding moves each coordinate of each report by less
  than one step ``Δ = 2c / T`` and is unbiased, so the decoded sum of ``m`` reports differs from
  the plain sum of the ``[-c, c]``-clipped reports by less than ``m Δ`` in every coordinate
  (standard deviation at most ``Δ √m / 2``), and the averaged update by less than ``m Δ / K``
  for ``K`` participants (:meth:`SecAggParameters.sum_error_bound`); the count decodes exactly
  because ``m Δ < c / 2`` (``T > 4n``);
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

from scipy.special import ndtri

from ..analysis._validation import check_int, check_nonnegative, check_positive

__all__ = [
    "CLIPPING_TAIL",
    "MAX_NODES",
    "MIN_SHARES",
    "MODULUS",
    "SecAggParameters",
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

        ``E[(|x| − c)₊] <= σC E[(|Z| − z)₊] = 2σC (φ(z) − z Φ̄(z))`` for ``x = u + σC Z`` with
        ``|u| <= C`` and ``c = C + σC z``.

        Returns:
            The bound, in parameter units (0 when σ = 0: nothing is ever clipped).
        """
        if self.noise_multiplier == 0.0:
            return 0.0
        z = self.tail_quantile
        phi = math.exp(-0.5 * z * z) / math.sqrt(2.0 * math.pi)
        tail = 0.5 * math.erfc(z / math.sqrt(2.0))
        return 2.0 * self.noise_multiplier * self.clip_norm * max(phi - z * tail, 0.0)

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
    clipping_range = c_norm * (1.0 + sigma * _tail_quantile(d))
    levels = MODULUS >> (math.ceil(math.log2(n)) + 1)
    return SecAggParameters(
        num_nodes=n,
        max_dropouts=max_dropouts,
        dimension=d,
        clip_norm=c_norm,
        noise_multiplier=sigma,
        num_shares=shares,
        threshold=threshold,
        clipping_range=clipping_range,
        quantization_range=levels,
        modulus_range=MODULUS,
    )
