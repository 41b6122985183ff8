"""One entry point for every mechanism: per-step RDP and (epsilon, delta) after ``steps`` rounds.

Mechanisms (names shared with the ``shuffle-opacus account`` command):

==========================  ===============================  ============================
mechanism                   parameters                       methods (first is default)
==========================  ===============================  ============================
``shuffle``                 ``n``, ``sigma``                 ``theorem1``, ``corollary1``
``subsampled``              ``n``, ``m``, ``sigma``          ``theorem2``
``checkin``                 ``n``, ``rate``, ``sigma``       ``exact``, ``sum``, ``theorem3``
``gaussian``                ``sigma``                        ``rdp``
``subsampled-gaussian``     ``rate``, ``sigma``              ``rdp``
==========================  ===============================  ============================

For the shuffle mechanisms ``sigma`` is the paper's sigma (per-user noise std divided by the L2
distance of the differing user's two inputs); for the two central references it is the noise
on the released sum divided by the sensitivity of the sum. The neighbouring relation of the
shuffle mechanisms is replace-one with the other users at a common value (Theorem 1's pair);
the unit of privacy is one user.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass

import numpy as np

from ._validation import check_delta, check_int, check_positive, check_probability
from .central import gaussian_rdp, poisson_subsampled_gaussian_rdp
from .checkin import checkin_rdp
from .conversion import epsilon_from_rdp
from .shuffle_gaussian import no_shuffle_rdp, shuffle_gaussian_rdp
from .subsampling import subsampled_shuffle_rdp

__all__ = ["MECHANISMS", "METHODS", "AccountingResult", "per_step_rdp", "compute_epsilon"]

METHODS: dict[str, tuple[str, ...]] = {
    "shuffle": ("theorem1", "corollary1"),
    "subsampled": ("theorem2",),
    "checkin": ("exact", "sum", "theorem3"),
    "gaussian": ("rdp",),
    "subsampled-gaussian": ("rdp",),
}
MECHANISMS: tuple[str, ...] = tuple(METHODS)

_REQUIRED: dict[str, tuple[str, ...]] = {
    "shuffle": ("n", "sigma"),
    "subsampled": ("n", "m", "sigma"),
    "checkin": ("n", "rate", "sigma"),
    "gaussian": ("sigma",),
    "subsampled-gaussian": ("rate", "sigma"),
}

NEIGHBOURING = {
    "shuffle": "replace-one user, other users at a common value (Theorem 1 pair)",
    "subsampled": "replace-one user, other users at a common value (Theorem 1 pair)",
    "checkin": "replace-one user, other users at a common value (Theorem 1 pair)",
    "gaussian": "sum changes by at most the sensitivity",
    "subsampled-gaussian": "add/remove-one user (Poisson sampling)",
}


@dataclass(frozen=True)
class AccountingResult:
    """An (epsilon, delta) statement with everything needed to interpret it.

    Attributes:
        mechanism: Mechanism name (see :data:`MECHANISMS`).
        method: Bound used (see :data:`METHODS`).
        epsilon: Epsilon after ``steps`` rounds.
        delta: Delta of the guarantee.
        steps: Number of composed rounds.
        order: Rényi order that achieved ``epsilon``.
        max_order: Largest order evaluated.
        at_cap: True when ``order == max_order``.
        n: Population size (``None`` for the central references).
        sigma: The sigma passed in (unit depends on the mechanism; see module docstring).
        m: Users per round for ``subsampled``.
        rate: Check-in / Poisson rate.
        neighbouring: The neighbouring relation the guarantee is stated for.
    """

    mechanism: str
    method: str
    epsilon: float
    delta: float
    steps: int
    order: int
    max_order: int
    at_cap: bool
    n: int | None
    sigma: float
    m: int | None
    rate: float | None
    neighbouring: str

    def to_dict(self) -> dict[str, object]:
        """Return the result as a JSON-serialisable dictionary."""
        return asdict(self)


def _validated(
    mechanism: str,
    method: str | None,
    n: int | None,
    sigma: float | None,
    m: int | None,
    rate: float | None,
) -> tuple[str, dict[str, object]]:
    if mechanism not in METHODS:
        raise ValueError(f"mechanism must be one of {', '.join(MECHANISMS)}. Found {mechanism!r}.")
    allowed = METHODS[mechanism]
    method = allowed[0] if method is None else method
    if method not in allowed:
        raise ValueError(
            f"method must be one of {', '.join(allowed)} for {mechanism}. Found {method!r}."
        )
    given = {"n": n, "sigma": sigma, "m": m, "rate": rate}
    required = _REQUIRED[mechanism]
    for name in required:
        if given[name] is None:
            raise ValueError(f"{name} is required for {mechanism}.")
    for name, value in given.items():
        if value is not None and name not in required:
            raise ValueError(f"{name} is not a parameter of {mechanism}. Found {value!r}.")
    params: dict[str, object] = {"sigma": check_positive("sigma", sigma)}
    if n is not None:
        params["n"] = check_int("n", n, minimum=1)
    if m is not None:
        params["m"] = check_int("m", m, minimum=1, maximum=int(params["n"]))  # type: ignore[call-overload]
    if rate is not None:
        params["rate"] = check_probability("rate", rate)
    return method, params


def per_step_rdp(
    mechanism: str,
    *,
    sigma: float,
    n: int | None = None,
    m: int | None = None,
    rate: float | None = None,
    method: str | None = None,
) -> Callable[[np.ndarray], np.ndarray]:
    """Return a function mapping integer orders to the RDP of one round of ``mechanism``.

    Args:
        mechanism: One of :data:`MECHANISMS`.
        sigma: Noise parameter (see the module docstring for its unit).
        n: Population size (shuffle mechanisms).
        m: Users per round (``subsampled``).
        rate: Check-in rate (``checkin``) or Poisson rate (``subsampled-gaussian``).
        method: Bound to use; the first entry of ``METHODS[mechanism]`` by default.

    Returns:
        ``orders -> rdp`` (numpy arrays).

    Raises:
        ValueError: on an unknown mechanism or method, a missing or extraneous parameter, or an
            out-of-range value.
    """
    method, p = _validated(mechanism, method, n, sigma, m, rate)
    s = float(p["sigma"])  # type: ignore[arg-type]
    if mechanism == "shuffle":
        if method == "corollary1":
            return lambda orders: no_shuffle_rdp(sigma=s, orders=orders)
        return lambda orders: shuffle_gaussian_rdp(n=p["n"], sigma=s, orders=orders)  # type: ignore[arg-type]
    if mechanism == "subsampled":
        return lambda orders: subsampled_shuffle_rdp(
            n=p["n"],  # type: ignore[arg-type]
            m=p["m"],  # type: ignore[arg-type]
            sigma=s,
            orders=orders,
        )
    if mechanism == "checkin":
        return lambda orders: checkin_rdp(
            n=p["n"],  # type: ignore[arg-type]
            rate=p["rate"],  # type: ignore[arg-type]
            sigma=s,
            orders=orders,
            method=method,
        )
    if mechanism == "gaussian":
        return lambda orders: gaussian_rdp(sigma=s, orders=orders)
    return lambda orders: poisson_subsampled_gaussian_rdp(
        rate=p["rate"],  # type: ignore[arg-type]
        sigma=s,
        orders=orders,
    )


def compute_epsilon(
    mechanism: str,
    *,
    sigma: float,
    steps: int,
    delta: float,
    n: int | None = None,
    m: int | None = None,
    rate: float | None = None,
    method: str | None = None,
    max_order: int | None = None,
) -> AccountingResult:
    """Epsilon of ``steps`` rounds of ``mechanism`` at ``delta`` (RDP composition + Lemma 2).

    Args:
        mechanism: One of :data:`MECHANISMS`.
        sigma: Noise parameter (see the module docstring for its unit).
        steps: Number of rounds composed (integer >= 1).
        delta: Target delta in ``(0, 1)``.
        n: Population size (shuffle mechanisms).
        m: Users per round (``subsampled``).
        rate: Check-in rate (``checkin``) or Poisson rate (``subsampled-gaussian``).
        method: Bound to use; the first entry of ``METHODS[mechanism]`` by default.
        max_order: Cap on the Rényi order; by default the range grows until the optimum is
            interior. A warning (:class:`~shuffle_opacus.analysis.OrderCapWarning`) is issued
            when the optimum sits at the cap.

    Returns:
        An :class:`AccountingResult`.

    Raises:
        ValueError: on any invalid argument.
    """
    method, p = _validated(mechanism, method, n, sigma, m, rate)
    steps = check_int("steps", steps, minimum=1)
    delta = check_delta(delta)
    if max_order is not None:
        max_order = check_int("max_order", max_order, minimum=2)
    step_rdp = per_step_rdp(mechanism, sigma=sigma, n=n, m=m, rate=rate, method=method)
    res = epsilon_from_rdp(
        lambda orders: steps * step_rdp(orders), delta=delta, max_order=max_order
    )
    return AccountingResult(
        mechanism=mechanism,
        method=method,
        epsilon=res.epsilon,
        delta=delta,
        steps=steps,
        order=res.order,
        max_order=res.max_order,
        at_cap=res.at_cap,
        n=p.get("n"),  # type: ignore[arg-type]
        sigma=float(p["sigma"]),  # type: ignore[arg-type]
        m=p.get("m"),  # type: ignore[arg-type]
        rate=p.get("rate"),  # type: ignore[arg-type]
        neighbouring=NEIGHBOURING[mechanism],
    )
