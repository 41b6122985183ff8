"""Monte Carlo estimate of the hockey-stick divergence of the shuffled Gaussian (a check).

Koskela, Heikkilä & Honkela, *Numerical Accounting in the Shuffle Model of Differential
Privacy* (arXiv:2106.00477), §5 and Appendix C.3: for the neighbouring pair of
Theorem 1 of the shuffle-Gaussian paper (all ``n`` inputs equal, ``X = (0, ..., 0)``, against
``X'`` with one input moved by the distance 1, noise ``N(0, sigma^2)`` per coordinate and the
reports shuffled) the two outputs are

    Q = M(X)  ~ N(0, sigma^2 I_n),
    P = M(X') ~ (1/n) sum_i N(e_i, sigma^2 I_n),

with likelihood ratio ``L(y) = P(y)/Q(y) = (1/n) sum_i exp((2 y_i - 1) / (2 sigma^2))``. The
divergence cannot be reduced to one dimension, so it is estimated by plain Monte Carlo:

    H_{e^eps}(P || Q) = E_P[(1 - e^eps / L(Y))_+],   H_{e^eps}(Q || P) = E_Q[(1 - e^eps L(Y))_+].

Samples of ``P`` put the shifted coordinate first (``L`` is symmetric, so which one does not
matter). The estimate comes with its standard error (sample standard deviation over
``sqrt(samples)``). It is an estimate, not a bound: it is used to test that bounds stay above
it, never to account for a mechanism. The pair is the one Theorem 1 is stated for; a one-dimensional
projection of higher-dimensional reports is enough for it (the noise is isotropic).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy.special import logsumexp

from .._validation import check_int, check_nonnegative, check_sigma

__all__ = ["MonteCarloEstimate", "shuffled_gaussian_delta_mc"]

_DIRECTIONS = ("remove", "add")


@dataclass(frozen=True)
class MonteCarloEstimate:
    """A Monte Carlo estimate of delta(eps).

    Attributes:
        delta: The estimate.
        stderr: Its standard error.
        samples: Number of samples used.
    """

    delta: float
    stderr: float
    samples: int


def shuffled_gaussian_delta_mc(
    eps: float,
    *,
    n: int,
    sigma: float,
    samples: int = 1_000_000,
    seed: int = 0,
    direction: str = "remove",
    chunk: int = 200_000,
) -> MonteCarloEstimate:
    """Estimate ``delta(eps)`` of ``n`` shuffled Gaussian reports by Monte Carlo.

    Args:
        eps: Epsilon (finite, >= 0).
        n: Number of users (integer >= 1).
        sigma: Noise std over the distance between the differing user's two inputs (> 0).
        samples: Number of samples (integer >= 1000).
        seed: Seed of numpy's generator; the same seed gives the same estimate.
        direction: ``"remove"`` for ``H(P || Q)`` (``P`` the output with the moved input) or
            ``"add"`` for ``H(Q || P)``.
        chunk: Samples drawn at a time (memory: ``chunk * n`` floats).

    Returns:
        :class:`MonteCarloEstimate`.

    Raises:
        ValueError: on an out-of-range argument.
    """
    eps = check_nonnegative("eps", eps)
    n = check_int("n", n, minimum=1)
    sigma = check_sigma(sigma)
    samples = check_int("samples", samples, minimum=1000)
    chunk = check_int("chunk", chunk, minimum=1)
    if direction not in _DIRECTIONS:
        raise ValueError(f"direction must be one of remove, add. Found {direction!r}.")
    rng = np.random.default_rng(seed)
    total = 0.0
    total_sq = 0.0
    done = 0
    while done < samples:
        size = min(chunk, samples - done)
        y = rng.normal(0.0, sigma, size=(size, n))
        if direction == "remove":
            y[:, 0] += 1.0
        log_l = logsumexp((2.0 * y - 1.0) / (2.0 * sigma**2), axis=1) - math.log(n)
        if direction == "remove":
            values = -np.expm1(np.minimum(0.0, eps - log_l))  # (1 - e^eps / L)_+
        else:
            values = -np.expm1(np.minimum(0.0, eps + log_l))  # (1 - e^eps L)_+
        total += float(values.sum())
        total_sq += float(np.square(values).sum())
        done += size
    mean = total / samples
    var = max(0.0, total_sq / samples - mean**2) * samples / (samples - 1)
    return MonteCarloEstimate(delta=mean, stderr=math.sqrt(var / samples), samples=samples)
