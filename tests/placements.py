"""Independent Monte Carlo oracle: the shuffle Gaussian at any placement of the users.

Liew & Takahashi, *Shuffle Gaussian Mechanism for Differential Privacy* (arXiv:2206.09569),
analyse one neighbouring pair (Theorem 1): the other ``n - 1`` users at a common value, the
differing user at that value or at distance ``Delta``. This module computes the hockey-stick
divergence of the shuffled outputs for *any* placement, in any dimension, so that tests and
``benchmarks/placements.py`` can compare other placements with that pair. It shares no code with
``shuffle_opacus``.

A placement is the differing user's input ``x`` (in ``D``) and ``x'`` (in ``D'``), the other
users' inputs ``y_1 .. y_{n-1}`` (the same in both) in ``R^d``, and the noise standard deviation
``s`` of each report ``u + N(0, s^2 I_d)``. The server sees the multiset of the ``n`` reports; its
law is represented by the ordered tuple after a uniformly random permutation, whose density is the
permutation average

    p_D(v) = (1/n!) sum_pi prod_j phi_s(v_j - mu_pi(j)),    mu = (x, y_1, ..., y_{n-1}),

and the same with ``x'`` for ``D'``. Expanding the squares, ``|v_j - mu_k|^2 = |v_j|^2 - 2 <v_j,
mu_k> + |mu_k|^2``: the ``|v|^2`` terms and ``sum_k |mu_k|^2`` do not depend on the permutation, so

    log p_D(v) = c(v) - sum_k |mu_k|^2 / (2 s^2) + log mean_pi exp(sum_j <v_j, mu_pi(j)> / s^2),

a log-mean-exp over the ``n!`` permutations of the Gram matrix ``<v_j, mu_k> / s^2`` (the
default up to ``n = 3``); ``c(v)`` cancels in the likelihood ratio ``L = p_{D'} / p_D``. The mean
over permutations is a permanent; above ``n = 3`` (up to :data:`MAX_USERS`) it is expanded along
the differing user's column, whose cofactors come from a recursion over subsets of the reports
(``n 2^(n-1)`` positive terms per sample, see :func:`_log_cofactors`).

Orientations. ``forward`` is ``H_{e^eps}(M(D') || M(D))`` (Theorem 1's direction when ``D`` puts
everyone at the common value), ``reverse`` is ``H_{e^eps}(M(D) || M(D'))``. Each is estimated two
ways, from samples of either output: with ``P = M(D')``, ``Q = M(D)`` and ``a = e^eps``,

    forward = E_P[(1 - a/L)_+] = E_Q[(L - a)_+],    reverse = E_Q[(1 - a L)_+] = E_P[(1/L - a)_+],

and the estimate with the smaller standard error is reported (the bounded forms usually win).

Sampling. Each placement is moved to its canonical frame (``x = 0``, ``x' = |x - x'| e_1``; the
loss is invariant under rigid motions) and its reports are ``mu_j + s z_j`` for one array ``z``
of standard normal draws, so two placements evaluated on the same ``z`` are coupled (common
random numbers): :func:`hockey_stick_excess_mc` estimates the *difference* of two placements'
divergences with the standard error of the paired differences, far smaller than either
estimate's when the placements are close. For large ``eps`` the events that carry ``delta`` are
rare (the differing report far beyond ``x'``); :func:`draw_noise` can then draw the differing
user's first coordinate from a defensive mixture of shifted normals and weight every term by
the likelihood ratio, which keeps every estimate unbiased. Standard errors are the sample
standard deviation of the (weighted) terms over ``sqrt(samples)``.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy.special import ndtr

ORIENTATIONS = ("forward", "reverse")
#: The measure the samples come from: ``P`` = M(D') (index 0) or ``Q`` = M(D) (index 1).
MEASURES = ("P", "Q")
#: What each (orientation, measure) term estimates.
ESTIMATORS = {
    ("forward", "P"): "E_P[(1 - e^eps/L)_+]",
    ("forward", "Q"): "E_Q[(L - e^eps)_+]",
    ("reverse", "P"): "E_P[(1/L - e^eps)_+]",
    ("reverse", "Q"): "E_Q[(1 - e^eps L)_+]",
}
#: Largest exponent taken in the unbounded estimators (``e^700`` is still a finite double).
_MAX_EXPONENT = 700.0


@dataclass(frozen=True, eq=False)
class Placement:
    """The inputs of a neighbouring pair of datasets and the noise of each report.

    Attributes:
        x: The differing user's input in ``D``, shape ``(d,)``.
        x_prime: Its input in ``D'``, shape ``(d,)``.
        others: The other users' inputs (the same in ``D`` and ``D'``), shape ``(n - 1, d)``.
        noise: Standard deviation ``s`` of each coordinate of each report's noise.
    """

    x: np.ndarray
    x_prime: np.ndarray
    others: np.ndarray
    noise: float

    @property
    def n(self) -> int:
        """Number of users."""
        return 1 + self.others.shape[0]

    @property
    def dim(self) -> int:
        """Dimension ``d`` of the inputs."""
        return int(self.x.shape[0])

    @property
    def distance(self) -> float:
        """``|x - x'|``, the distance between the differing user's two inputs."""
        return float(np.linalg.norm(self.x_prime - self.x))

    def means(self, dataset: str) -> np.ndarray:
        """The ``n`` inputs of ``D`` (``"D"``) or of ``D'`` (``"D'"``), differing user first.

        Args:
            dataset: ``"D"`` or ``"D'"``.

        Returns:
            Array of shape ``(n, d)``.

        Raises:
            ValueError: if ``dataset`` is neither.
        """
        if dataset == "D":
            first = self.x
        elif dataset == "D'":
            first = self.x_prime
        else:
            raise ValueError(f"dataset must be 'D' or \"D'\". Found {dataset!r}.")
        return np.vstack([first[None, :], self.others])

    def mirrored(self) -> Placement:
        """The same users with ``D`` and ``D'`` exchanged (its forward is this one's reverse)."""
        return Placement(self.x_prime, self.x, self.others, self.noise)

    def moved(self, rotation: np.ndarray, shift: np.ndarray | None = None) -> Placement:
        """Every input mapped by ``u -> rotation @ u + shift`` (a rigid motion if orthogonal).

        Args:
            rotation: Orthogonal matrix of shape ``(d, d)``.
            shift: Translation of shape ``(d,)`` (zero by default).

        Returns:
            The moved placement (same noise).
        """
        t = np.zeros(self.dim) if shift is None else np.asarray(shift, dtype=float)
        return Placement(
            rotation @ self.x + t,
            rotation @ self.x_prime + t,
            self.others @ rotation.T + t,
            self.noise,
        )

    def canonical(self) -> Placement:
        """The rigid motion of this placement with ``x = 0`` and ``x' = |x - x'| e_1``.

        A Householder reflection takes ``x' - x`` to ``e_1``; divergences are unchanged (the
        noise is isotropic). :func:`sample_losses` works in this frame.

        Returns:
            The moved placement.
        """
        u = self.x_prime - self.x
        norm = float(np.linalg.norm(u))
        target = np.zeros(self.dim)
        target[0] = norm
        w = u - target
        w_norm = float(np.linalg.norm(w))
        rotation = np.eye(self.dim)
        if w_norm > 1e-15 * max(1.0, norm):
            w = w / w_norm
            rotation = rotation - 2.0 * np.outer(w, w)
        return self.moved(rotation, -rotation @ self.x)

    def describe(self, digits: int = 3) -> str:
        """One line: ``x``, ``x'``, the others and the noise, rounded to ``digits``."""

        def fmt(u: np.ndarray) -> str:
            return "(" + ", ".join(f"{c:.{digits}f}" for c in u) + ")"

        others = ", ".join(fmt(y) for y in self.others)
        return f"x={fmt(self.x)} x'={fmt(self.x_prime)} others=[{others}] s={self.noise:g}"


def placement(
    x: Sequence[float] | np.ndarray,
    x_prime: Sequence[float] | np.ndarray,
    others: Sequence[Sequence[float]] | np.ndarray,
    noise: float,
) -> Placement:
    """Build a :class:`Placement`, checking shapes.

    Args:
        x: The differing user's input in ``D`` (length ``d``).
        x_prime: Its input in ``D'`` (length ``d``).
        others: The other users' inputs, ``n - 1`` rows of length ``d`` (may be empty).
        noise: Noise standard deviation, ``> 0``.

    Returns:
        The placement.

    Raises:
        ValueError: on inconsistent shapes, ``n >`` :data:`MAX_USERS` or a non-positive noise.
    """
    x_arr = np.asarray(x, dtype=float).ravel()
    xp_arr = np.asarray(x_prime, dtype=float).ravel()
    d = x_arr.shape[0]
    o_arr = np.asarray(others, dtype=float).reshape(-1, d) if len(others) else np.zeros((0, d))
    if xp_arr.shape != (d,) or o_arr.shape[1] != d:
        raise ValueError(f"all inputs must have dimension {d}.")
    if o_arr.shape[0] + 1 > MAX_USERS:
        raise ValueError(f"n must be at most {MAX_USERS}. Found {o_arr.shape[0] + 1}.")
    if not noise > 0:
        raise ValueError(f"noise must be > 0. Found {noise!r}.")
    return Placement(x_arr, xp_arr, o_arr, float(noise))


def theorem1_placement(
    n: int, noise: float, *, dim: int = 1, distance: float = 1.0, mirror: bool = False
) -> Placement:
    """Theorem 1's pair as a placement: everyone at 0, the differing user at ``distance e_1``.

    Args:
        n: Number of users.
        noise: Noise standard deviation (Theorem 1's sigma is ``noise / distance``).
        dim: Dimension of the inputs.
        distance: ``|x - x'|``.
        mirror: Put the others at ``x' = distance e_1`` instead (the same pair reversed).

    Returns:
        The placement.
    """
    x = np.zeros(dim)
    xp = np.zeros(dim)
    xp[0] = distance
    others = np.tile(xp if mirror else x, (n - 1, 1))
    return placement(x, xp, others, noise)


@functools.lru_cache(maxsize=8)
def _permutations(n: int) -> np.ndarray:
    return np.array(list(itertools.permutations(range(n))), dtype=np.intp)


def _log_mean_exp_permanent(v: np.ndarray, means: np.ndarray, noise: float) -> np.ndarray:
    """``log mean_pi exp(sum_j <v_j, mu_pi(j)>/s^2) - sum_k |mu_k|^2/(2 s^2)`` per sample.

    ``sum_j <v_j, mu_pi(j)>`` is the inner product of the flattened ``v`` with the flattened
    permuted means, so all ``n!`` scores come from one matrix product.
    """
    samples = v.shape[0]
    permuted = means[_permutations(means.shape[0])].reshape(-1, means.size)  # (n!, n d)
    scores = (v.reshape(samples, -1) @ permuted.T) / noise**2
    top = scores.max(axis=1, keepdims=True)
    log_mean = top[:, 0] + np.log(np.exp(scores - top).mean(axis=1))
    return log_mean - float(np.sum(means**2)) / (2.0 * noise**2)


#: Largest ``n`` :func:`log_likelihood_ratio` takes (``n 2^(n-1)`` terms per sample by subsets).
MAX_USERS = 10
#: Up to this ``n`` the permutation sum (at most 6 terms) is the default; above it, subsets.
_MAX_PERMUTATIONS = 3
#: Table entries per batch of the subset recursion (``2^n`` per sample), to stay in cache.
_SUBSET_TABLE = 1 << 16


@functools.lru_cache(maxsize=16)
def _subset_layers(n: int) -> tuple[tuple[np.ndarray, np.ndarray, np.ndarray], ...]:
    """For ``k = 1 .. n - 1``: the row subsets with ``k`` rows (bit masks), and for each the
    ``k`` pairs (the subset without row ``j``, row ``j``) that the recursion sums over."""
    layers = []
    for k in range(1, n):
        masks = [m for m in range(1 << n) if bin(m).count("1") == k]
        rows = [[j for j in range(n) if m >> j & 1] for m in masks]
        pred = [[m & ~(1 << j) for j in r] for m, r in zip(masks, rows, strict=True)]
        layers.append((np.array(masks), np.array(pred), np.array(rows)))
    return tuple(layers)


def _log_cofactors(v: np.ndarray, others: np.ndarray, noise: float) -> np.ndarray:
    """``log m_j`` up to a per-sample constant, where ``m_j`` is the permanent of
    ``B_ik = exp(<v_i, y_k>/s^2)`` (rows ``i != j``, columns the ``n - 1`` other users).

    The permanent of the ``n x n`` matrix with first column ``a`` (the differing user) is
    ``sum_j a_j m_j`` (expansion along that column), so one table of cofactors gives both
    ``p_D`` and ``p_{D'}``. ``m_j`` comes from the recursion over row subsets ``S`` (Ryser's
    order without his signs: every term is positive, so nothing cancels),
    ``P_k(S) = sum_{j in S} P_{k-1}(S - j) B_{j,k}`` with ``|S| = k``, ``m_j = P_{n-1}(all - j)``:
    ``n 2^(n-1)`` products per sample. Each column of ``B`` and each layer of the table is
    divided by its largest entry (per sample), which scales every ``m_j`` alike.
    """
    samples, n, _ = v.shape
    if n == 1:
        return np.zeros((samples, 1))
    scores = (v.reshape(-1, v.shape[2]) @ (others.T / noise**2)).reshape(samples, n, n - 1)
    if np.all(others == others[0]):  # one common value: m_j is (n-1)! prod_{i != j} B_i1
        return -scores[:, :, 0]
    out = np.empty((samples, n))
    full = (1 << n) - 1
    last = full ^ (1 << np.arange(n))
    chunk = max(256, _SUBSET_TABLE >> n)
    for start in range(0, samples, chunk):
        # Samples last, so that every gather below copies contiguous rows.
        sc = np.ascontiguousarray(scores[start : start + chunk].transpose(1, 2, 0))
        b = np.exp(sc - sc.max(axis=0, keepdims=True))  # (n, n - 1, chunk)
        table = np.empty((1 << n, sc.shape[2]))
        table[0] = 1.0
        for k, (masks, pred, rows) in enumerate(_subset_layers(n)):
            layer = (table[pred] * b[rows, k]).sum(axis=1)  # (subsets, chunk)
            table[masks] = layer / layer.max(axis=0, keepdims=True)
        with np.errstate(divide="ignore"):
            out[start : start + chunk] = np.log(table[last]).T
    return out


def _log_sum_exp(a: np.ndarray) -> np.ndarray:
    top = a.max(axis=1, keepdims=True)
    return top[:, 0] + np.log(np.exp(a - top).sum(axis=1))


def log_likelihood_ratio(v: np.ndarray, pl: Placement, method: str = "auto") -> np.ndarray:
    """``log L(v) = log p_{D'}(v) - log p_D(v)`` of the shuffled outputs at ordered tuples ``v``.

    Args:
        v: Outputs, shape ``(samples, n, d)``.
        pl: The placement.
        method: ``"permutations"`` (the log-mean-exp over the ``n!`` orderings, one matrix
            product), ``"subsets"`` (the cofactor recursion of :func:`_log_cofactors`,
            ``n 2^(n-1)`` products per sample), or ``"auto"``: permutations up to ``n = 3``.

    Returns:
        Array of shape ``(samples,)``.

    Raises:
        ValueError: on an unknown method.
    """
    if method == "auto":
        method = "permutations" if pl.n <= _MAX_PERMUTATIONS else "subsets"
    if method == "permutations":
        return _log_mean_exp_permanent(v, pl.means("D'"), pl.noise) - _log_mean_exp_permanent(
            v, pl.means("D"), pl.noise
        )
    if method != "subsets":
        raise ValueError(f"method must be 'auto', 'permutations' or 'subsets'. Found {method!r}.")
    s2 = pl.noise**2
    log_m = _log_cofactors(v, pl.others, pl.noise)
    flat = v.reshape(-1, v.shape[2])
    first_p = (flat @ (pl.x_prime / s2)).reshape(v.shape[:2]) - float(pl.x_prime @ pl.x_prime) / (
        2 * s2
    )
    first_q = (flat @ (pl.x / s2)).reshape(v.shape[:2]) - float(pl.x @ pl.x) / (2 * s2)
    return _log_sum_exp(first_p + log_m) - _log_sum_exp(first_q + log_m)


@dataclass(frozen=True, eq=False)
class Noise:
    """Noise of the reports and the importance weight of each sample.

    Attributes:
        z: Draws of shape ``(samples, n, d)``. The reports of ``M(D')`` in the placement's
            canonical frame (:meth:`Placement.canonical`: ``x = 0``, ``x' = |x - x'| e_1``) are
            ``mu'_j + s z_j``; those of ``M(D)`` use the same ``z`` with the differing user's
            first coordinate negated, so that a shift of that coordinate pushes the differing
            report away from the other input under both outputs.
        weight: ``phi(t) / g(t)`` at ``t = z[:, 0, 0]``: the standard normal density over the
            density ``g`` the first coordinate was drawn from (1 without shifts).
    """

    z: np.ndarray
    weight: np.ndarray


def draw_noise(
    rng: np.random.Generator, samples: int, n: int, d: int, shifts: Sequence[float] = ()
) -> Noise:
    """Standard normal noise, the differing user's first coordinate optionally importance-sampled.

    With ``shifts = (b_1, ..., b_k)`` that coordinate is drawn from the defensive mixture
    ``g = (1/(k+1)) (phi + sum_l phi(. - b_l))`` (Hesterberg's defensive mixture: the weight
    ``phi/g`` is at most ``k + 1``), which makes the rare events of large ``eps`` (the differing
    report far beyond ``x'`` under ``M(D')``, far beyond ``x`` under ``M(D)``) common. Every
    estimate stays unbiased: each term is multiplied by the weight.

    Args:
        rng: numpy generator.
        samples: Number of draws.
        n: Number of users.
        d: Dimension.
        shifts: Shifts of the mixture's components, in units of the noise (``0`` is implied).

    Returns:
        :class:`Noise`.
    """
    z = rng.standard_normal((samples, n, d))
    centres = np.array([0.0, *[float(b) for b in shifts]])
    if centres.size == 1:
        return Noise(z, np.ones(samples))
    pick = rng.integers(centres.size, size=samples)
    t = z[:, 0, 0] + centres[pick]
    z[:, 0, 0] = t
    log_phi = -0.5 * (t[:, None] - centres[None, :]) ** 2
    log_g = np.log(np.exp(log_phi).mean(axis=1))
    return Noise(z, np.exp(-0.5 * t**2 - log_g))


def tilt_for(n: int, sigma: float, eps: float) -> float:
    """A shift for :func:`draw_noise` that makes ``delta(eps)`` of Theorem 1's pair a common event.

    The forward loss of the pair is about ``a t - a^2/2 - log n`` with ``a = 1/sigma`` and ``t``
    the differing report in units of the noise (``t ~ N(a, 1)`` under ``M(D')``), so it exceeds
    ``eps`` beyond ``t - a = (eps + log n) sigma - 1/(2 sigma)``.

    Args:
        n: Number of users.
        sigma: Noise over ``|x - x'|``.
        eps: Epsilon.

    Returns:
        The shift (``>= 0``).
    """
    return max(0.0, (eps + math.log(n)) * sigma - 0.5 / sigma)


def sample_losses(pl: Placement, noise: Noise) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Privacy losses ``log L`` at outputs of ``M(D')`` and of ``M(D)`` built from ``noise``.

    The placement is first moved to its canonical frame (the loss is invariant under rigid
    motions), so that two placements on the same noise are coupled the same way.

    Args:
        pl: The placement.
        noise: :class:`Noise` with ``z`` of shape ``(samples, n, d)``.

    Returns:
        ``(loss_p, loss_q, weight)``: ``log L`` under ``P = M(D')`` and under ``Q = M(D)``,
        and the importance weight of each sample.
    """
    c = pl.canonical()
    z_q = noise.z.copy()
    z_q[:, 0, 0] = -z_q[:, 0, 0]
    v_p = c.means("D'")[None] + c.noise * noise.z
    v_q = c.means("D")[None] + c.noise * z_q
    return log_likelihood_ratio(v_p, c), log_likelihood_ratio(v_q, c), noise.weight


def hockey_stick_terms(
    loss_p: np.ndarray,
    loss_q: np.ndarray,
    weight: np.ndarray | None,
    eps: Sequence[float] | np.ndarray,
) -> np.ndarray:
    """Per-sample terms of the four estimators (see the module docstring), weighted.

    Args:
        loss_p: ``log L`` at samples of ``P = M(D')``, shape ``(samples,)``.
        loss_q: ``log L`` at samples of ``Q = M(D)``, shape ``(samples,)``.
        weight: Importance weight of each sample (``None`` for 1).
        eps: Epsilons, shape ``(E,)``.

    Returns:
        Array of shape ``(2, 2, samples, E)``: ``[orientation, measure]`` with the orders of
        :data:`ORIENTATIONS` and :data:`MEASURES`; the mean over samples estimates the
        divergence.
    """
    e = np.atleast_1d(np.asarray(eps, dtype=float))[None, :]
    lp = loss_p[:, None]
    lq = loss_q[:, None]
    alpha = np.exp(e)
    out = np.empty((2, 2, loss_p.shape[0], e.shape[1]))
    out[0, 0] = -np.expm1(np.minimum(0.0, e - lp))
    out[0, 1] = np.maximum(np.exp(np.minimum(lq, _MAX_EXPONENT)) - alpha, 0.0)
    out[1, 0] = np.maximum(np.exp(np.minimum(-lp, _MAX_EXPONENT)) - alpha, 0.0)
    out[1, 1] = -np.expm1(np.minimum(0.0, e + lq))
    if weight is not None:
        out *= weight[None, None, :, None]
    return out


@dataclass(frozen=True)
class Estimate:
    """A Monte Carlo estimate with its standard error.

    Attributes:
        delta: The estimate (of a divergence, or of a difference of two).
        stderr: Its standard error (sample standard deviation over ``sqrt(samples)``).
        estimator: Which estimator produced it (a key of :data:`ESTIMATORS`, in words).
        samples: Number of samples.
    """

    delta: float
    stderr: float
    estimator: str
    samples: int

    def upper(self, k: float = 3.0) -> float:
        """``delta + k stderr``."""
        return self.delta + k * self.stderr

    def lower(self, k: float = 3.0) -> float:
        """``delta - k stderr``."""
        return self.delta - k * self.stderr


class _Moments:
    """Running sums, sums of squares and non-zero counts of per-sample terms."""

    def __init__(self) -> None:
        self.total: np.ndarray | None = None
        self.square: np.ndarray | None = None
        self.nonzero: np.ndarray | None = None
        self.count = 0

    def add(self, values: np.ndarray, axis: int, support: np.ndarray | None = None) -> None:
        """Add terms along ``axis``; non-zero counts come from ``support`` if given."""
        s = values.sum(axis=axis)
        q = np.square(values).sum(axis=axis)
        c = np.count_nonzero(values if support is None else support, axis=axis)
        if self.total is None or self.square is None or self.nonzero is None:
            self.total, self.square, self.nonzero = s, q, c
        else:
            self.total, self.square, self.nonzero = (
                self.total + s,
                self.square + q,
                self.nonzero + c,
            )
        self.count += values.shape[axis]

    def result(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Means, standard errors and non-zero counts."""
        if self.total is None or self.square is None or self.nonzero is None:
            raise ValueError("no samples were added.")
        mean = self.total / self.count
        var = np.maximum(self.square / self.count - mean**2, 0.0) * self.count / (self.count - 1)
        return mean, np.sqrt(var / self.count), self.nonzero


#: An estimator is eligible only with at least this many non-zero terms: a rare-event estimator
#: whose few terms are all zero (or one is not) would otherwise look the most precise.
MIN_NONZERO = 100


def _noise_chunks(samples: int, seed: int, chunk: int) -> list[tuple[np.random.Generator, int]]:
    if samples < 100:
        raise ValueError(f"samples must be at least 100. Found {samples}.")
    rng = np.random.default_rng(seed)
    sizes = [min(chunk, samples - start) for start in range(0, samples, chunk)]
    return [(rng, size) for size in sizes]


def hockey_stick_mc(
    pl: Placement,
    eps: Sequence[float] | np.ndarray,
    *,
    samples: int = 100_000,
    seed: int = 0,
    chunk: int = 50_000,
    shifts: Sequence[float] = (),
) -> dict[str, list[Estimate]]:
    """Both hockey-stick divergences of a placement's shuffled outputs, by Monte Carlo.

    Args:
        pl: The placement.
        eps: Epsilons (any real values).
        samples: Samples of each output (each of ``P`` and ``Q``), at least 100.
        seed: Seed of numpy's generator (the noise depends on it, ``n``, ``d``, ``chunk`` and
            ``shifts`` only).
        chunk: Samples per batch.
        shifts: Importance-sampling shifts of the differing user's noise (:func:`draw_noise`,
            :func:`tilt_for`); none by default.

    Returns:
        ``{"forward": [...], "reverse": [...]}``, one :class:`Estimate` per epsilon: the one of
        the two estimators with the smaller standard error among those with at least
        :data:`MIN_NONZERO` non-zero terms (the bounded form if neither has).
    """
    eps_arr = np.atleast_1d(np.asarray(eps, dtype=float))
    moments = _Moments()
    for rng, size in _noise_chunks(samples, seed, chunk):
        noise = draw_noise(rng, size, pl.n, pl.dim, shifts)
        moments.add(hockey_stick_terms(*sample_losses(pl, noise), eps_arr), axis=2)
    mean, se, nonzero = moments.result()
    return {
        o: [
            _best(mean[i, :, k], se[i, :, k], nonzero[i, :, k], o, samples)
            for k in range(eps_arr.size)
        ]
        for i, o in enumerate(ORIENTATIONS)
    }


def _best(
    mean: np.ndarray, se: np.ndarray, nonzero: np.ndarray, orientation: str, samples: int
) -> Estimate:
    """The eligible measure with the smaller standard error (the bounded form if neither is)."""
    bounded = 0 if orientation == "forward" else 1
    j = bounded
    for k in (0, 1):
        if nonzero[k] >= MIN_NONZERO and (nonzero[j] < MIN_NONZERO or se[k] < se[j]):
            j = k
    name = ESTIMATORS[(orientation, MEASURES[j])]
    return Estimate(float(mean[j]), float(se[j]), name, samples)


def hockey_stick_excess_mc(
    pl: Placement,
    reference: Placement,
    eps: Sequence[float] | np.ndarray,
    *,
    samples: int = 100_000,
    seed: int = 0,
    chunk: int = 50_000,
    shifts: Sequence[float] = (),
) -> dict[tuple[str, str], list[Estimate]]:
    """``delta_pl - delta_reference`` on common random numbers, for every pair of orientations.

    Both placements are sampled from the same noise, each in its canonical frame (see
    :func:`sample_losses`), and the estimate is the mean of the paired per-sample differences of
    the same estimator (same measure), so its standard error is that of the differences.

    Args:
        pl: The placement.
        reference: A placement with the same ``n`` and ``d`` (typically Theorem 1's pair,
            :func:`theorem1_placement`, or its mirror).
        eps: Epsilons.
        samples: Samples of each output, at least 100.
        seed: Seed of numpy's generator.
        chunk: Samples per batch.
        shifts: Importance-sampling shifts (:func:`draw_noise`).

    Returns:
        ``{(orientation of pl, orientation of reference): [Estimate per eps]}`` with the
        smaller-error measure for each.

    Raises:
        ValueError: if the placements differ in ``n`` or ``d``.
    """
    if (pl.n, pl.dim) != (reference.n, reference.dim):
        raise ValueError("the placements must have the same n and dimension.")
    eps_arr = np.atleast_1d(np.asarray(eps, dtype=float))
    moments = _Moments()
    for rng, size in _noise_chunks(samples, seed, chunk):
        noise = draw_noise(rng, size, pl.n, pl.dim, shifts)
        a = hockey_stick_terms(*sample_losses(pl, noise), eps_arr)
        b = hockey_stick_terms(*sample_losses(reference, noise), eps_arr)
        # [o_pl, o_ref, measure, samples, E]; eligibility counts the samples where both terms are
        # non-zero (an exactly zero difference of two well-sampled terms is exact, not rare).
        support = np.minimum(a[:, None] != 0, b[None, :] != 0)
        moments.add(a[:, None] - b[None, :], axis=3, support=support)
    mean, se, nonzero = moments.result()
    out: dict[tuple[str, str], list[Estimate]] = {}
    for i, o in enumerate(ORIENTATIONS):
        for j, o_ref in enumerate(ORIENTATIONS):
            out[(o, o_ref)] = [
                _best(mean[i, j, :, k], se[i, j, :, k], nonzero[i, j, :, k], o, samples)
                for k in range(eps_arr.size)
            ]
    return out


def gaussian_delta(eps: float | np.ndarray, sigma: float) -> np.ndarray:
    """Exact ``delta(eps)`` of one Gaussian report with noise ``sigma`` and shift 1.

    Balle & Wang, *Improving the Gaussian Mechanism for Differential Privacy: Analytical
    Calibration and Optimal Denoising* (arXiv:1805.06530), Theorem 8:
    ``Phi(1/(2 sigma) - eps sigma) - e^eps Phi(-1/(2 sigma) - eps sigma)`` (both orientations).

    Args:
        eps: Epsilon(s).
        sigma: Noise standard deviation over the shift.

    Returns:
        Array of deltas.
    """
    e = np.atleast_1d(np.asarray(eps, dtype=float))
    return ndtr(0.5 / sigma - e * sigma) - np.exp(e) * ndtr(-0.5 / sigma - e * sigma)


def distance_from_theorem1(pl: Placement, diameter: float) -> float:
    """How far a placement in a ball of ``diameter`` is from Theorem 1's pair or its mirror.

    ``(diameter - |x - x'|)`` plus the farthest other user's distance from ``x`` (or from ``x'``,
    whichever is smaller): zero exactly for Theorem 1's pair placed across a diameter, with the
    others at ``x`` (or all at ``x'``).

    Args:
        pl: The placement.
        diameter: The ball's diameter (the sensitivity).

    Returns:
        The distance (0 for Theorem 1's pair).
    """
    if pl.n == 1:
        return max(0.0, diameter - pl.distance)
    to_x = float(np.max(np.linalg.norm(pl.others - pl.x, axis=1)))
    to_xp = float(np.max(np.linalg.norm(pl.others - pl.x_prime, axis=1)))
    return max(0.0, diameter - pl.distance) + min(to_x, to_xp)


__all__ = [
    "ESTIMATORS",
    "MEASURES",
    "ORIENTATIONS",
    "Estimate",
    "Noise",
    "Placement",
    "distance_from_theorem1",
    "draw_noise",
    "gaussian_delta",
    "hockey_stick_excess_mc",
    "hockey_stick_mc",
    "hockey_stick_terms",
    "log_likelihood_ratio",
    "placement",
    "sample_losses",
    "theorem1_placement",
    "tilt_for",
]
