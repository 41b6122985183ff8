"""Epsilon after each round of the experiment, one curve per accountant.

:class:`EpsilonCurves` computes every curve of the run plan (``privacy.curves``,
:func:`curve_list`, :func:`curve_label`) by the library, from the run's history, with the call
the Opacus accountant makes: after ``t`` rounds, :func:`shuffle_opacus.history_epsilon` of
``[(noise_multiplier, sample_rate, t)]``, the analysis sigma being the local noise multiplier
over ``privacy.sensitivity``. A curve depends only on the config, never on which clients
checked in, so a resumed run reproduces it exactly. The curves are ``pld`` (the default and the
run's tight guarantee, :meth:`EpsilonCurves.guarantee`, falling back to ``exact`` beyond the work
limits), ``proven`` (the proven bound beside it, always under replace-one adjacency: it rests on
published theorems only, no assumption on where the other clients' updates lie; at evaluation
rounds and the last round, see :data:`SPARSE_CURVES`), the protocol's other methods (``exact``,
``sum``, ``theorem3``, ``corollary1``), the reference curves ``no-shuffle`` and ``central``,
``replace-one`` (added when the sensitivity is below replace-one's) and the approximate-DP
baseline ``clones`` (a comparison curve, not a certified bound; check-in and ``full`` only, at
evaluation rounds and the last round).

What each curve is: experiments/README.md (``curves.py``) and docs/experiment.md.
"""

from __future__ import annotations

import functools
import math
import warnings

from shuffle_opacus.accounting.ledger import RoundLedger
from shuffle_opacus.accounting.protocols import SENSITIVITIES
from shuffle_opacus.analysis import OrderCapWarning
from shuffle_opacus.analysis.approximate.baselines import (
    RoundProfile,
    composed_epsilon,
    round_profile,
)
from shuffle_opacus.analysis.rdp.conversion import EpsilonResult
from shuffle_opacus.analysis.registry import curve_labels

from .config import BASELINES, ExperimentConfig, curve_names
from .plan import REPLACE_ONE, RunPlan, as_plan

__all__ = [
    "CURVE_LABELS",
    "SPARSE_CURVES",
    "REPLACE_ONE",
    "PROVEN",
    "EpsilonCurves",
    "curve_list",
    "curve_label",
]

#: Legend labels of the curves (a method without a label is shown by its name): each method's
#: and reference's own, from the mechanism records, and the experiment's two curves that are not
#: methods of the table.
CURVE_LABELS: dict[str, str] = {
    **curve_labels(),
    "clones": "clones + check-in + optimal composition (approx. DP)",
    "replace-one": "replace-one: the guarantee (this package, pld)",
}

#: The proven bound (method ``proven``): published theorems only, no assumption on where the
#: other clients' updates lie; computed under replace-one adjacency whatever the sensitivity.
PROVEN = "proven"


def curve_list(plan: RunPlan | ExperimentConfig) -> tuple[str, ...]:
    """Return the curves of a run: ``privacy.curves``, then ``replace-one`` if needed.

    A run whose ``privacy.sensitivity`` is below replace-one's 2 C (the paper's convention)
    also reports its guarantee under replace-one adjacency, so that its headline is one.

    Args:
        plan: The run plan (:func:`~.plan.build_plan`); a config is still accepted.

    Returns:
        The plan's :attr:`~.plan.RunPlan.curves`.
    """
    return as_plan(plan).curves


def curve_label(name: str, plan: RunPlan | ExperimentConfig) -> str:
    """Return the legend label of curve ``name``; below replace-one it names the convention.

    Args:
        name: A curve of the run.
        plan: The run plan; a config is still accepted.

    Returns:
        :data:`CURVE_LABELS`'s label (the name if it has none), with the sensitivity convention
        where the plan's is below replace-one.
    """
    label = CURVE_LABELS.get(name, name)
    plan = as_plan(plan)
    sens = plan.sensitivity
    if name in _CONVENTION_DEPENDENT and plan.below_replace_one:
        paper = sens == SENSITIVITIES["paper"]
        label += ", paper's convention (sensitivity C)" if paper else f", sensitivity {sens:g} C"
    elif name == PROVEN and plan.below_replace_one:
        label += ", replace-one (2C)"  # beside curves of the convention, say which it is not
    return label


#: Curves whose value depends on ``privacy.sensitivity`` (all but the clones baseline and
#: ``proven``, which are replace-one whatever it says).
_CONVENTION_DEPENDENT = frozenset(
    {"exact", "sum", "theorem3", "corollary1", "pld", "no-shuffle", "central"}
)

#: Curves too slow to evaluate every round (see :meth:`EpsilonCurves.row`): the baselines, and
#: ``proven`` (on one core, 0.05 s to a second an evaluation at quick.yaml's setting and
#: several seconds at paper.yaml's, against 0.2 s of training a round).
SPARSE_CURVES: frozenset[str] = frozenset({*BASELINES, PROVEN})


class EpsilonCurves:
    """Epsilon after ``t`` rounds for each curve of a run plan.

    Args:
        plan: The run plan (:func:`~.plan.build_plan`); a validated config is still accepted.
        population: Number of clients (the training set size actually used), when it is not
            the plan's.

    Raises:
        ValueError: for a curve the plan's protocol does not have.
    """

    def __init__(self, plan: RunPlan | ExperimentConfig, population: int | None = None) -> None:
        plan = as_plan(plan)
        if population is not None:
            plan = plan.for_population(population)
        self.plan = plan
        self.names: tuple[str, ...] = plan.curves
        self.delta = plan.delta
        self.protocol = plan.protocol
        self.population = plan.population
        self.noise_multiplier = plan.noise_multiplier
        self.sensitivity = plan.sensitivity_setting
        self.sample_rate = plan.sample_rate
        self._profiles: dict[str, RoundProfile] = {}
        # No round is recorded: each curve's history is the empty one extended to t rounds,
        # and the ledger keeps the last result (a row asks for each curve once).
        self._ledger = RoundLedger(cache_size=1)
        allowed = curve_names(self.protocol.name)
        for name in self.names:
            if name not in allowed and name != REPLACE_ONE:
                raise ValueError(
                    f"privacy.curves: {name} is not available for protocol {self.protocol.name}"
                )
            if name == "clones":
                self._profiles[name] = _clones_profile(plan)

    def epsilon(self, name: str, rounds: int) -> float:
        """Return epsilon of curve ``name`` after ``rounds`` rounds at the config's delta.

        Raises:
            KeyError: for a curve that is not configured.
        """
        if name not in self.names:
            raise KeyError(name)
        if rounds <= 0:
            return 0.0
        if name in self._profiles:
            return composed_epsilon(self._profiles[name], steps=rounds, delta=self.delta)
        if name == REPLACE_ONE:
            return self.guarantee(rounds).epsilon
        if name == PROVEN:
            return self.proven(rounds).epsilon
        reference = name if name in self.protocol.references else None
        method = None if reference is not None else name
        if name == "exact":
            method = self.protocol.fallback
        return self._history(rounds, method=method, reference=reference).epsilon

    def guarantee(self, rounds: int, *, lower: bool = False) -> EpsilonResult:
        """Epsilon after ``rounds`` rounds by the accountant's default method.

        ``pld`` where the work limits allow it, else the Rényi bound (the result's ``method``
        and ``note`` say which), always under replace-one adjacency: the number
        ``engine.get_epsilon`` gives when the config's sensitivity is replace-one.

        Args:
            rounds: Rounds completed.
            lower: Also compute the optimistic estimate of a ``pld`` result.
        """
        return self._history(rounds, method=None, lower=lower, replace_one=True)

    def proven(self, rounds: int) -> EpsilonResult:
        """Epsilon after ``rounds`` rounds by the proven bound (method ``proven``).

        Always under replace-one adjacency, like :meth:`guarantee`: the bound assumes nothing
        about where the clients' updates lie, so it is not computed under a smaller sensitivity
        convention (which assumes that every clipped update lies close to every other). The
        result's ``details`` give the route, its level and how delta was split.

        Args:
            rounds: Rounds completed (at least 1).
        """
        return self._history(rounds, method=PROVEN, replace_one=True)

    def convention(self, rounds: int) -> EpsilonResult:
        """Epsilon by the accountant's default method at the config's own sensitivity.

        Below replace-one (the paper's convention) this is the convention's number, which holds
        only if every clipped update lies that close to every other (see
        :func:`shuffle_opacus.accounting.protocols.sensitivity_label`); :meth:`guarantee` is the
        guarantee.

        Args:
            rounds: Rounds completed.
        """
        return self._history(rounds, method=None)

    def _history(
        self,
        rounds: int,
        *,
        method: str | None,
        reference: str | None = None,
        lower: bool = False,
        replace_one: bool = False,
    ) -> EpsilonResult:
        # The plan's sensitivity as written, or replace-one (the guarantee and ``proven``).
        sens = "replace-one" if replace_one else self.sensitivity
        history = self._ledger.extended(max(rounds, 0), self.noise_multiplier, self.sample_rate)
        with warnings.catch_warnings():
            # At the order limit the value is still a valid (looser) upper bound.
            warnings.simplefilter("ignore", OrderCapWarning)
            return self._ledger.epsilon(
                history=history,
                protocol=self.protocol,
                delta=self.delta,
                population=self.population,
                sensitivity=sens,
                method=method,
                reference=reference,
                lower=lower,
            )

    def row(self, rounds: int, *, sparse: bool = True) -> dict[str, float | None]:
        """Return ``{name: epsilon}`` after ``rounds`` rounds for every configured curve.

        Args:
            rounds: Rounds completed.
            sparse: Include the curves of :data:`SPARSE_CURVES`; when False they are ``None``.
        """
        return {
            name: self.epsilon(name, rounds) if sparse or name not in SPARSE_CURVES else None
            for name in self.names
        }


def _clones_profile(plan: RunPlan) -> RoundProfile:
    # Per-round deltas down to delta / (10 * rounds) and six decades below, for the best split.
    decades = math.log10(10.0 * max(1, plan.rounds)) + 6.0
    # The clipping ball's diameter is 2 C: the replace-one sensitivity. The rate is None unless
    # the protocol is check-in.
    return _cached_profile(plan.population, plan.replace_one_sigma, plan.delta, plan.rate, decades)


@functools.lru_cache(maxsize=8)
def _cached_profile(
    n: int, sigma: float, delta: float, rate: float | None, decades: float
) -> RoundProfile:
    """One round's profile; cached because a resumed run needs the very same one again."""
    return round_profile(n=n, sigma=sigma, delta_max=delta, rate=rate, decades=decades)
