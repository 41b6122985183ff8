"""User-level shuffle-model DP: clients with many examples train locally, vectorised over clients.

In the example-level layer (:func:`shuffle_opacus.make_private`) one dataset example is one
client. Here a client is a **user holding many examples**, and the unit of privacy is the user.
A round of the protocol:

1. the protocol's sampler picks the round's clients among the ``n`` clients of a
   :class:`ClientPartition` (check-in with probability ``rate``, ``m`` of ``n``, or all ``n``;
   the samplers of :mod:`shuffle_opacus.sampling`, round ``t`` a function of ``(seed, t)``);
2. every participant starts from the current global weights ``w`` and trains locally on its own
   examples with plain SGD (``local_steps`` or ``local_epochs`` mini-batches of
   ``local_batch_size``, learning rate ``client_lr``), reaching ``w_i``;
3. its report is the update ``u_i = w - w_i`` (the negated model change, a pseudo-gradient),
   clipped as **one vector over all trainable parameters** to norm ``C = max_update_norm`` with
   Opacus's factor ``min(1, C / (||u_i|| + 1e-6))``, plus its own ``N(0, sigma^2 C^2 I)``
   (``sigma = noise_multiplier``); a non-finite update is replaced by zero, which lies in the
   clipping ball;
4. the shuffler forwards the reports anonymously; the server sums them, divides by the expected
   number of reports (``average="expected"``, as the example-level path does) or by the actual
   number (``average="reports"``, FedAvg's mean; the count is public in the shuffle model), and
   writes the result into ``.grad`` of the global parameters. The user's own optimizer then
   steps: SGD with learning rate 1 is FedAvg (McMahan, Moore, Ramage, Hampson & Agüera y Arcas,
   *Communication-Efficient Learning of Deep Networks from Decentralized Data*,
   arXiv:1602.05629), Adam gives FedAdam (Reddi et al., *Adaptive Federated Optimization*,
   arXiv:2003.00295).

FedSGD is ``local_steps=1, local_batch_size=None`` (one step on the whole client); with one
example per client, ``client_lr=1`` and ``max_update_norm = max_grad_norm`` a round is the
example-level round of :func:`shuffle_opacus.make_private` (same sampler seed, same noise
generator: same weights; tested).

Privacy statement. Neighbouring datasets differ in **all the examples of one client**
(replace-one at the level of clients); the population ``n`` of the accountant is the number of
clients. Any two datasets of a client give clipped updates at most ``2C`` apart, so under the
default ``sensitivity="replace-one"`` the analysis sigma is ``noise_multiplier / 2``
(:func:`shuffle_opacus.analysis_sigma`); ``"paper"`` assumes ``C``. The accountant of the
engine (``shuffle``, ``subsampled_shuffle`` or ``shuffled_checkin``) records one round for every
round the sampler released, empty ones included, at the moment its aggregate is written. The
guarantee covers everything computed from the aggregates (the weights, the optimizer's state).
It assumes a trusted shuffler (or secure aggregation) and check-in coins independent of the
data; :attr:`RoundResult.local_loss` is a statistic of the clients' data that the protocol does
not release, for monitoring simulations only.

Speed. All participants of a round (in chunks of ``client_chunk``) train together: the local
SGD step is one :func:`torch.func.vmap` over clients of :func:`torch.func.grad` of
:func:`torch.func.functional_call`, on mini-batches padded to a common size and masked by
per-example weights (``1 / batch size`` for real examples, ``0`` for padding), so clients of
unequal sizes and step counts share one kernel call. Only the drawing of each client's
mini-batch order loops over clients (it needs a generator per client, see
:func:`local_batches`); clients whose batches hold all their examples draw nothing.
"""

from __future__ import annotations

from .local import LocalTraining, local_batches
from .setup import make_private_clients
from .trainer import AVERAGES, DEFAULT_CLIENT_CHUNK, FederatedTrainer, RoundResult

__all__ = [
    "AVERAGES",
    "DEFAULT_CLIENT_CHUNK",
    "FederatedTrainer",
    "LocalTraining",
    "RoundResult",
    "local_batches",
    "make_private_clients",
]
