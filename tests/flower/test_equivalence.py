"""σ = 0: the Flower path and the one-process path give the same model, round after round.

The one-process path is the one ``shuffle_experiments`` trains with: one example per client,
:func:`shuffle_opacus.make_private` (accountant ``shuffled_checkin``), a sum loss over the
round's participants, the optimizer's learning rate set per round, one ``optimizer.step()``
per round (see ``shuffle_experiments.runner``).
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("flwr")

import torch  # noqa: E402
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict  # noqa: E402
from flwr.clientapp import ClientApp  # noqa: E402
from opacus import PrivacyEngine  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

import shuffle_opacus  # noqa: E402
from shuffle_opacus.flower import (  # noqa: E402
    InProcessGrid,
    LocalShuffleDPMod,
    ShuffleCheckInFedAvg,
    ShufflePrivacyConfig,
)
from shuffle_opacus.flower.testing import FIRST_NODE_ID  # noqa: E402

N_NODES, LR, CLIP, ROUNDS = 12, 0.5, 2.5, 4


def make_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(5, 4), nn.Tanh(), nn.Linear(4, 3)).double()


def dataset() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(N_NODES, 5, generator=g, dtype=torch.float64) * 3.0
    y = torch.randint(0, 3, (N_NODES,), generator=g)
    return x, y


def client_app() -> ClientApp:
    """Node i holds example i and takes one SGD step of learning rate LR on its loss."""
    x, y = dataset()
    app = ClientApp(mods=[LocalShuffleDPMod(min_noise_multiplier=0.0, allow_noiseless=True)])

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        i = int(context.node_config["partition-id"])
        model = make_model()
        model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
        optimizer = torch.optim.SGD(model.parameters(), lr=LR)
        nn.functional.cross_entropy(model(x[i : i + 1]), y[i : i + 1]).backward()
        optimizer.step()
        content = RecordDict(
            {
                "arrays": ArrayRecord(model.state_dict()),
                "metrics": MetricRecord({"num-examples": 1}),
            }
        )
        return Message(content, reply_to=msg)

    return app


def flower_path(seed: int) -> tuple[list[dict[str, np.ndarray]], list[list[int]]]:
    """Every round's model and participants (partition ids) of a Flower run."""
    privacy = ShufflePrivacyConfig(
        noise_multiplier=0.0, clip_norm=LR * CLIP, rate=0.5, delta=1e-5, allow_noiseless=True
    )
    strategy = ShuffleCheckInFedAvg(privacy=privacy, num_nodes=N_NODES, seed=seed)
    grid = InProcessGrid(client_app(), N_NODES)
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


def one_process_path(
    participants: list[list[int]], grad_sample_mode: str = "hooks"
) -> list[dict[str, np.ndarray]]:
    """The same rounds on the one-process path: ``make_private``'s optimizer without noise.

    As in ``shuffle_experiments.runner``: the participants' examples are indexed directly,
    the loss is summed (``loss_reduction="sum"``), and the learning rate of the round is set
    on the optimizer; here it is LR / B, so that the step is LR times the mean of the B
    clipped gradients, which is what FedAvg of B equally weighted reports gives.
    """
    x, y = dataset()
    model = make_model()
    module, optimizer, _ = shuffle_opacus.make_private(
        PrivacyEngine(accountant="shuffled_checkin"),
        module=model,
        optimizer=torch.optim.SGD(model.parameters(), lr=LR),
        data_loader=DataLoader(TensorDataset(x, y), batch_size=1),
        noise_multiplier=1.0,  # make_private refuses 0; set to 0 on the optimizer below
        max_grad_norm=CLIP,
        rate=0.5,
        rounds=ROUNDS,
        seed=0,
        loss_reduction="sum",
        grad_sample_mode=grad_sample_mode,
    )
    # A noiseless reference, outside any accounting: the noise std sigma * C * sqrt(B) is then
    # exactly 0. The optimizer fixes its noise multiplier once built, so the test sets it
    # underneath that guard, and detaches the accountant (it refuses sigma = 0).
    object.__setattr__(optimizer, "noise_multiplier", 0.0)
    optimizer.step_hook = None
    models = []
    for batch in participants:
        for group in optimizer.param_groups:
            group["lr"] = LR / max(len(batch), 1)
        optimizer.zero_grad(set_to_none=True)
        index = torch.tensor(batch, dtype=torch.long)
        loss = nn.functional.cross_entropy(module(x[index]), y[index], reduction="sum")
        loss.backward()
        optimizer.step()
        models.append({k: v.detach().numpy().copy() for k, v in model.state_dict().items()})
    return models


@pytest.mark.parametrize("grad_sample_mode", ["hooks", "fast"])
def test_sigma_zero_flower_equals_one_process(grad_sample_mode):
    """Compared: after each of 4 rounds, every weight of the Flower model against the model of
    the one-process path that used the same participants (rate 0.5, seeded check-in).

    Twelve nodes with one example each take one SGD step (lr 0.5), so a node's update is
    -0.5 * its gradient and clipping the update at C_user = 0.5 * 2.5 is clipping the gradient
    at 2.5 as the one-process path does. The only difference left is Opacus's clip factor
    C / (||g|| + 1e-6) against C / ||g||: relative 1e-6 / ||g||, hence rtol 1e-5.
    """
    flower, participants = flower_path(seed=11)
    sizes = [len(p) for p in participants]
    assert any(0 < s < N_NODES for s in sizes), sizes
    one = one_process_path(participants, grad_sample_mode)
    assert len(flower) == len(one) == ROUNDS
    for r in range(ROUNDS):
        for name in one[r]:
            np.testing.assert_allclose(flower[r][name], one[r][name], rtol=1e-5, atol=1e-9)
    # Clipping was active for some of the gradients (otherwise C would not matter).
    x, y = dataset()
    model = make_model()
    norms = []
    for i in range(N_NODES):
        model.zero_grad()
        nn.functional.cross_entropy(model(x[i : i + 1]), y[i : i + 1]).backward()
        norms.append(float(torch.sqrt(sum((p.grad**2).sum() for p in model.parameters()))))
    assert min(norms) < CLIP < max(norms)


def test_same_seed_same_participants_and_aggregate():
    a_models, a_participants = flower_path(seed=5)
    b_models, b_participants = flower_path(seed=5)
    assert a_participants == b_participants
    for a, b in zip(a_models, b_models, strict=True):
        for name in a:
            np.testing.assert_array_equal(a[name], b[name])


def test_the_comparison_can_fail():
    """Other participants (another seed) give another model: the test above is not vacuous."""
    flower, participants = flower_path(seed=11)
    shifted = [[(i + 1) % N_NODES for i in batch] for batch in participants]
    other = one_process_path(shifted)
    assert not all(np.allclose(flower[-1][name], other[-1][name], rtol=1e-5) for name in other[-1])
