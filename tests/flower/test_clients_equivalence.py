"""σ = 0: nodes with many examples training locally give one model on Flower and in one process.

The Flower path: :class:`~shuffle_opacus.flower.ShuffleCheckInFedAvg` with
:class:`~shuffle_opacus.flower.LocalShuffleDPMod` on :class:`~shuffle_opacus.flower.InProcessGrid`;
node ``i`` holds client ``i``'s examples of a :class:`~shuffle_opacus.federated.ClientPartition`
(unequal sizes) and runs plain torch SGD over the batches of
:func:`~shuffle_opacus.federated.local_batches` for the round. The one-process path:
:func:`~shuffle_opacus.federated.make_private_clients` with the same local training, FedAvg's mean
over the round's reports (``average="reports"``) and a server SGD step of learning rate 1, fed
the participants the Flower run checked in.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest

pytest.importorskip("flwr")

import torch  # noqa: E402
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict  # noqa: E402
from flwr.clientapp import ClientApp  # noqa: E402
from opacus import PrivacyEngine  # noqa: E402
from torch import nn  # noqa: E402
from torch.nn import functional as F  # noqa: E402, N812

from shuffle_opacus import get_protocol  # noqa: E402
from shuffle_opacus.federated import (  # noqa: E402
    ClientPartition,
    LocalTraining,
    local_batches,
    make_private_clients,
)
from shuffle_opacus.flower import (  # noqa: E402
    InProcessGrid,
    LocalShuffleDPMod,
    ShuffleCheckInFedAvg,
    ShufflePrivacyConfig,
)
from shuffle_opacus.flower.testing import FIRST_NODE_ID  # noqa: E402

SIZES = [6, 2, 9, 4, 11, 3, 7, 5]
TRAINING = LocalTraining(client_lr=0.3, local_steps=3, local_batch_size=4)
CLIP, ROUNDS, SEED = 0.8, 4, 7


def make_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(5, 4), nn.Tanh(), nn.Linear(4, 3)).double()


def dataset() -> tuple[torch.Tensor, torch.Tensor, ClientPartition]:
    g = torch.Generator().manual_seed(1)
    n = sum(SIZES)
    x = torch.randn(n, 5, generator=g, dtype=torch.float64) * 3.0
    y = torch.randint(0, 3, (n,), generator=g)
    ids = np.repeat(np.arange(len(SIZES)), SIZES)
    return x, y, ClientPartition.from_client_ids(np.random.default_rng(2).permutation(ids))


def client_app() -> ClientApp:
    """Node i trains client i's examples: SGD over the round's local batches."""
    x, y, part = dataset()
    app = ClientApp(mods=[LocalShuffleDPMod(min_noise_multiplier=0.0, allow_noiseless=True)])

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        i = int(context.node_config["partition-id"])
        t = int(msg.content["config"]["server-round"]) - 1
        model = make_model()
        model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
        optimizer = torch.optim.SGD(model.parameters(), lr=TRAINING.client_lr)
        for batch in local_batches(part, i, TRAINING, seed=SEED, round_index=t):
            index = torch.as_tensor(batch)
            optimizer.zero_grad()
            F.cross_entropy(model(x[index]), y[index]).backward()
            optimizer.step()
        content = RecordDict(
            {
                "arrays": ArrayRecord(model.state_dict()),
                "metrics": MetricRecord({"num-examples": len(batch)}),
            }
        )
        return Message(content, reply_to=msg)

    return app


def flower_path(seed: int) -> tuple[list[dict[str, np.ndarray]], list[list[int]]]:
    """Every round's model and participants (partition ids) of a Flower run."""
    privacy = ShufflePrivacyConfig(
        noise_multiplier=0.0, clip_norm=CLIP, rate=0.5, delta=1e-5, allow_noiseless=True
    )
    strategy = ShuffleCheckInFedAvg(privacy=privacy, num_nodes=len(SIZES), seed=seed)
    grid = InProcessGrid(client_app(), len(SIZES))
    models = []

    def keep(server_round: int, arrays: ArrayRecord) -> None:
        models.append({k: v.numpy().copy() for k, v in arrays.items()})

    strategy.start(
        grid, ArrayRecord(make_model().state_dict()), num_rounds=ROUNDS, evaluate_fn=keep
    )
    rounds = iter(grid.deliveries[1:])  # deliveries[0] is the start-up check
    participants = [
        [node - FIRST_NODE_ID for node in next(rounds)] if m["num-reports"] else []
        for _, m in sorted(strategy.round_metrics.items())
    ]
    return models[1:], participants


class _NotAccounted:
    """Stands in for the accountant: sigma = 0 is not a private setting, nothing to account."""

    sample_size = None

    def spec(self):
        return get_protocol("checkin")

    def step(self, **kwargs) -> None:
        pass

    def check_unreleased(self, *args, **kwargs) -> None:
        pass

    def release(self, *args, **kwargs) -> None:
        pass


def one_process_path(participants: list[list[int]]) -> list[dict[str, np.ndarray]]:
    x, y, part = dataset()
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)  # FedAvg
    trainer = make_private_clients(
        PrivacyEngine(accountant="shuffled_checkin"),
        module=model,
        optimizer=optimizer,
        data=(x, y),
        partition=part,
        loss_fn=functools.partial(F.cross_entropy, reduction="none"),
        noise_multiplier=1.0,  # refused at 0; set to 0 below
        max_update_norm=CLIP,
        client_lr=TRAINING.client_lr,
        local_steps=TRAINING.local_steps,
        local_batch_size=TRAINING.local_batch_size,
        rate=0.5,
        rounds=ROUNDS,
        seed=SEED,
        average="reports",
        client_chunk=3,
    )
    # A built trainer is read-only; this white-box comparison swaps its parts on purpose.
    object.__setattr__(trainer, "noise_multiplier", 0.0)  # the noise std is then exactly 0
    object.__setattr__(trainer, "accountant", _NotAccounted())
    trainer.sampler.batch = lambda t: participants[t]  # Flower's check-ins
    models = []
    for _ in trainer:
        optimizer.step()
        models.append({k: v.detach().numpy().copy() for k, v in model.state_dict().items()})
    return models


@pytest.fixture(scope="module")
def flower_run() -> tuple[list[dict[str, np.ndarray]], list[list[int]]]:
    return flower_path(seed=3)


def test_sigma_zero_flower_equals_one_process_with_local_training(flower_run):
    """Compared: every weight after each of 4 rounds. Both clip the whole update; the only
    difference is the clip factor, C / (||u|| + 1e-6) here against C / ||u|| in the mod, which
    moves a clipped report by C 1e-6 / (||u|| + 1e-6) < 1e-6 in norm: rtol 1e-5, atol 1e-7."""
    flower, participants = flower_run
    assert any(0 < len(p) < len(SIZES) for p in participants), participants
    ours = one_process_path(participants)
    assert len(flower) == len(ours) == ROUNDS
    for r in range(ROUNDS):
        for name in ours[r]:
            np.testing.assert_allclose(flower[r][name], ours[r][name], rtol=1e-5, atol=1e-7)
    # Clipping was active for some nodes and not for others in the first round.
    x, y, part = dataset()
    norms = []
    for i in range(len(SIZES)):
        model = make_model()
        start = torch.cat([p.detach().flatten() for p in model.parameters()])
        optimizer = torch.optim.SGD(model.parameters(), lr=TRAINING.client_lr)
        for batch in local_batches(part, i, TRAINING, seed=SEED, round_index=0):
            optimizer.zero_grad()
            F.cross_entropy(model(x[batch]), y[batch]).backward()
            optimizer.step()
        end = torch.cat([p.detach().flatten() for p in model.parameters()])
        norms.append(float((end - start).norm()))
    assert min(norms) < CLIP < max(norms), norms


def test_the_comparison_can_fail(flower_run):
    """Shifted participants give another model: the comparison above is not vacuous."""
    flower, participants = flower_run
    shifted = [[(i + 1) % len(SIZES) for i in batch] for batch in participants]
    other = one_process_path(shifted)
    assert not all(np.allclose(flower[-1][k], other[-1][k], rtol=1e-5) for k in other[-1])
