"""Monte Carlo estimate of the hockey-stick divergence of the shuffled Gaussian (a check).

Koskela, Heikkilä & Honkela, *Numerical Accounting in the Shuffle Model of Differential
Privacy* (arXiv:2106.00477), §5 and Appendix C.3: for Theorem 1's neighbouring pair of the
shuffle-Gaussian paper (all ``n`` inputs equal, one moved by the distance 1, noise
``N(0, sigma^2)`` per report, reports shuffled) the divergence does not reduce to one
dimension. :func:`shuffled_gaussian_delta_mc` estimates ``delta(eps)`` in either direction by
plain Monte Carlo and returns a :class:`MonteCarloEstimate` with its standard error. It is an
estimate, not a bound: the tests use it to check that bounds stay above it, and it never
accounts for a mechanism.

The two distributions, the estimators and the evidence: docs/maths.md, "Monte Carlo check of
the shuffled Gaussian".
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy.special import logsumexp

from ..common.validation import check_int, check_nonnegative, check_sigma

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
