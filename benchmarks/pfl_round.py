"""pfl 0.6 FedAvg in the setting of ``benchmarks/users.py``, one round at a time on request.

Runs under an interpreter where ``pfl[pytorch]`` is installed (a separate virtual environment:
pfl pins its own dependencies), started by ``benchmarks/users.py`` as a round worker of
``benchmarks/timing.py``

    PYTHON benchmarks/pfl_round.py THREADS CLIENTS EXAMPLES COHORT STEPS BATCH ROUNDS DATA [POOL]

(DATA: an ``.npz`` file of images ``x`` and labels ``y``; POOL: ``nn``, the default, or ``fast``.)

The model is ``cnn_small`` of the experiment (repeated here: this interpreter does not have the
package) with ``nn.MaxPool2d``, or with POOL ``fast`` the experiment's ``FastMaxPool2d`` (same
results bit for bit, loaded from ``experiments/shuffle_experiments/pooling.py``, which needs
only torch), local SGD with learning rate 0.1, pfl's ``GaussianMechanism`` (clip each user's
update to 1 and add noise of relative std 1) as the local privacy postprocessor, a central SGD
step of learning rate 1; every round trains a cohort of exactly COHORT users (pfl draws them
uniformly at random). pfl runs its own loop; a callback holds it at every round boundary until
the parent asks for the next round (a line on stdin, ``stop`` to end), and answers with the
round's wall time (``timing.answer``), so that the parent can interleave pfl's rounds with the
other paths'. The last answer is the peak RSS.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("PFL_PYTORCH_DEVICE", "cpu")

import numpy as np  # noqa: E402
import torch  # noqa: E402
from pfl.aggregate.simulate import SimulatedBackend  # noqa: E402
from pfl.algorithm import FederatedAveraging, NNAlgorithmParams  # noqa: E402
from pfl.callback.base import TrainingProcessCallback  # noqa: E402
from pfl.data.federated_dataset import FederatedDataset  # noqa: E402
from pfl.data.sampling import get_user_sampler  # noqa: E402
from pfl.hyperparam import NNEvalHyperParams, NNTrainHyperParams  # noqa: E402
from pfl.metrics import Metrics, Weighted  # noqa: E402
from pfl.model.pytorch import PyTorchModel  # noqa: E402
from pfl.privacy import GaussianMechanism  # noqa: E402
from timing import answer, next_round, peak_rss_mib  # noqa: E402
from torch import nn  # noqa: E402


def pooling(kind: str) -> type[nn.MaxPool2d]:
    """``nn.MaxPool2d`` for ``nn``, the experiment's ``FastMaxPool2d`` for ``fast``."""
    if kind == "nn":
        return nn.MaxPool2d
    if kind != "fast":
        raise SystemExit(f"pfl_round.py: POOL must be nn or fast, got {kind!r}")
    path = Path(__file__).resolve().parents[1] / "experiments/shuffle_experiments/pooling.py"
    spec = importlib.util.spec_from_file_location("shuffle_experiments_pooling", path)
    assert spec is not None and spec.loader is not None, path
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # importable by name, should pfl copy the model
    spec.loader.exec_module(module)
    return module.FastMaxPool2d


class Net(nn.Module):
    """``cnn_small`` with the ``loss`` and ``metrics`` methods pfl requires."""

    def __init__(self, pool: type[nn.MaxPool2d] = nn.MaxPool2d) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(1, 8, 8, stride=2, padding=3),
            nn.Tanh(),
            pool(2, 1),
            nn.Conv2d(8, 16, 4, stride=2),
            nn.Tanh(),
            pool(2, 1),
            nn.Flatten(),
            nn.Linear(16 * 4 * 4, 10),
        )

    def forward(self, x):
        return self.body(x)

    def loss(self, x, y, eval=False):
        self.train(not eval)
        return nn.functional.cross_entropy(self(x), y.long())

    @torch.no_grad()
    def metrics(self, x, y, eval=False):
        loss = nn.functional.cross_entropy(self(x), y.long(), reduction="sum").item()
        return {"loss": Weighted(loss, len(y))}


def main() -> None:
    threads, clients, examples, cohort, steps, batch, rounds = map(int, sys.argv[1:8])
    pool = pooling(sys.argv[9] if len(sys.argv) > 9 else "nn")
    torch.set_num_threads(threads)
    data = np.load(sys.argv[8])
    x, y = data["x"], data["y"]
    slices = {
        u: [x[u * examples : (u + 1) * examples], y[u * examples : (u + 1) * examples]]
        for u in range(clients)
    }
    federated = FederatedDataset.from_slices(slices, get_user_sampler("random", list(slices)))
    torch.manual_seed(0)
    net = Net(pool)
    model = PyTorchModel(
        model=net,
        local_optimizer_create=torch.optim.SGD,
        central_optimizer=torch.optim.SGD(net.parameters(), lr=1.0),
    )
    started = [0.0]
    stopped = [False]

    class Gate(TrainingProcessCallback):
        """Hold pfl at each round boundary until the parent asks for the next round."""

        def on_train_begin(self, *, model):
            if next_round() is None:
                raise SystemExit(0)
            started[0] = time.perf_counter()
            return Metrics()

        def after_central_iteration(self, aggregate_metrics, model, *, central_iteration):
            answer({"seconds": time.perf_counter() - started[0], "reports": cohort})
            stopped[0] = next_round() is None
            started[0] = time.perf_counter()
            return stopped[0], Metrics()

    backend = SimulatedBackend(
        training_data=federated,
        val_data=None,
        postprocessors=[GaussianMechanism(clipping_bound=1.0, relative_noise_stddev=1.0)],
    )
    FederatedAveraging().run(
        algorithm_params=NNAlgorithmParams(
            central_num_iterations=rounds,
            evaluation_frequency=10**9,
            train_cohort_size=cohort,
            val_cohort_size=None,
        ),
        backend=backend,
        model=model,
        model_train_params=NNTrainHyperParams(
            local_learning_rate=0.1,
            local_num_epochs=None,
            local_num_steps=steps,
            local_batch_size=batch,
        ),
        model_eval_params=NNEvalHyperParams(local_batch_size=100),
        callbacks=[Gate()],
        send_metrics_to_platform=False,
    )
    if not stopped[0]:
        raise SystemExit(f"pfl_round.py: asked for more than the {rounds} rounds planned")
    answer({"peak_rss_mib": peak_rss_mib()})


if __name__ == "__main__":
    main()
