"""Run the MNIST shuffle-model experiment from a validated config, with checkpoints and resume.

With a ``clients:`` section the images are split into that many clients that train locally
(user level, :func:`shuffle_opacus.clients.make_private_clients`): each round the sampler picks
clients, each trains from the global model, clips its whole update to
``privacy.clipping_norm`` and adds its noise, and the server's optimizer steps on the average.
Everything below about files, checkpoints and resuming holds for both levels.

Without it one MNIST training image is one client. Each round the protocol's sampler picks the
reporting clients; each computes the gradient of the loss on its image at the current model,
clips it to ``privacy.clipping_norm`` and adds Gaussian noise with std
``noise_multiplier * clipping_norm`` (simulated as one draw on the sum, or per client with
``privacy.noise_mode: per_client``); the server averages the reports and takes an optimizer
step. The Opacus side is :func:`shuffle_opacus.make_private` with the protocol's accountant.

Run directory (``output_dir/name/<timestamp>``, with ``output_dir/name/latest`` pointing at the
newest run):

``config.yaml``
    The resolved config (after ``--set`` overrides). ``--resume`` reads it back.
``metrics.csv``
    One row per round: ``round``, ``participants``, ``train_loss`` (mean over the round's
    clients, empty for an empty round), ``test_loss`` and ``test_accuracy`` (at evaluation
    rounds only) and ``eps_<accountant>`` for every configured accountant (see
    :mod:`shuffle_experiments.curves`). Nothing in it depends on timing, so a resumed run writes the
    same file as an uninterrupted one.
``checkpoint.pt``
    Model, optimizer, accountant, noise-generator and torch RNG state, the round number, a
    copy of the config, the digest of the epsilon columns so far and a SHA-256 checksum of it
    all, written every ``training.checkpoint_every`` rounds, at the end, and on Ctrl-C (the
    round under way finishes first; a second Ctrl-C stops at once and leaves the last
    checkpoint). Tensors and plain containers only: it is read back with
    ``torch.load(weights_only=True)`` and its checksum verified (:mod:`.checkpoint`), written
    to a temporary file and renamed into place.
``summary.json``
    Final accuracy and epsilons, rounds, wall time and seconds per round. ``--resume`` of a
    finished run, or ``shuffle-experiment plot``, writes it and the plots again from the
    checkpoint and ``metrics.csv`` without training (:func:`redraw`).
``accuracy_vs_epsilon.png/.csv``, ``epsilon_vs_rounds.png/.csv``
    The plots of :mod:`shuffle_experiments.plots` and the data they show.

Resuming rebuilds everything from the checkpoint: the sampler restarts at the saved round (its
batches are a function of the seed and the round only), the noise generator continues from its
saved state, and rows after the checkpoint are dropped from ``metrics.csv`` (rewritten through
a temporary file; they are run again). With the same number of threads the result is bit-for-bit
that of an uninterrupted run, also after SIGKILL at any moment (tested).

Check, then write. A session takes an exclusive lock on the run directory first (a second
``--resume`` of the same directory is refused in one line), and every consistency check runs
before anything is written: the checkpoint must pass its checksum, its accountant must hold
exactly the rounds that ``config.yaml`` implies (the epsilon curves are computed from the
config), and ``metrics.csv`` must describe rounds ``1 .. checkpoint round``. Rows of those
rounds that are missing, cut short or unreadable are rebuilt from the checkpoint (round,
participants and epsilon are functions of the seed and the config; the lost losses and
accuracies stay empty), and the repair is announced in one line; a file that cannot be
interpreted (another header, a round that is not an integer, a round twice) is refused in one
line. The epsilon columns of those rows are then checked against the accountant's history: the
checkpoint holds the digest of the columns as training wrote them, so an intact file costs one
recomputed row, and an edited one has every row recomputed and the values that differ replaced,
one line per column naming the rounds (:func:`_checked_epsilons`). At the end the accountant's
epsilon is compared with the curve of its method before ``summary.json`` and the plots are
written. Stale temporary files of an earlier session are removed. A file that cannot be written
(a full disk, a file-size limit) raises :class:`RunFileError`, one line naming the file and the
cause (:mod:`.files`); whole files are replaced through a temporary file, so none is left half
written and a checkpoint that cannot be written leaves the previous one intact.
"""

from __future__ import annotations

import contextlib
import copy
import csv
import functools
import hashlib
import io
import json
import math
import os
import signal
import threading
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml
from opacus import PrivacyEngine
from torch import nn
from torch.nn import functional as F  # noqa: N812
from torch.utils.data import DataLoader, TensorDataset

import shuffle_opacus
from shuffle_opacus import get_protocol
from shuffle_opacus.analysis.limits import PldRangeError
from shuffle_opacus.clients import (
    FederatedTrainer,
    dirichlet_partition,
    iid_partition,
    make_private_clients,
    shard_partition,
)
from shuffle_opacus.protocols import sensitivity_assumptions, sensitivity_label

from .checkpoint import CHECKPOINT_FORMAT, comparable, load_checkpoint, save_checkpoint
from .config import ClientsConfig, ConfigError, ExperimentConfig, load_config, validate
from .curves import REPLACE_ONE, EpsilonCurves, curve_label, curve_list
from .data import load_mnist
from .files import (
    CHECKPOINT_FILE,
    CONFIG_FILE,
    METRICS_FILE,
    PLOT_FILES,
    SUMMARY_FILE,
    AppendedFile,
    RunFileError,
    write_file,
)
from .files import cause as _cause
from .models import build_model

__all__ = [
    "RunFileError",
    "RunResult",
    "run",
    "resume",
    "redraw",
    "new_run_dir",
    "load_checkpoint",
    "CHECKPOINT_FORMAT",
    "METRICS_FILE",
    "CHECKPOINT_FILE",
]

#: Mean and standard deviation of MNIST training pixels in [0, 1], used to standardise inputs.
MNIST_MEAN, MNIST_STD = 0.1307, 0.3081

_EVAL_BATCH = 2000


@dataclass
class RunResult:
    """What a finished (or interrupted) run produced.

    Attributes:
        run_dir: The run directory.
        rounds_done: Rounds completed (and checkpointed).
        rounds: Rounds the config asks for.
        test_accuracy: Accuracy at the last evaluation (``None`` if there was none).
        epsilon: ``{accountant: epsilon}`` after ``rounds_done`` rounds.
        delta: The delta of those epsilons.
        seconds: Wall time spent training, summed over resumed sessions.
        mean_participants: Mean number of reports per round.
        plots: Files written by the plots.
        guarantee: What the run may claim (:func:`guarantee_record`): the accountant's epsilon
            and method, its optimistic estimate, the neighbouring relation, the sensitivity
            convention, the assumptions and how the seed was chosen.
        labels: The label of each curve of ``epsilon`` (:func:`~.curves.curve_label`).
    """

    run_dir: Path
    rounds_done: int
    rounds: int
    test_accuracy: float | None
    epsilon: dict[str, float]
    delta: float
    seconds: float
    mean_participants: float
    plots: list[Path] = field(default_factory=list)
    guarantee: dict[str, Any] = field(default_factory=dict)
    labels: dict[str, str] = field(default_factory=dict)

    @property
    def seconds_per_round(self) -> float:
        """Wall time per completed round (0 when nothing ran)."""
        return self.seconds / self.rounds_done if self.rounds_done else 0.0

    def to_dict(self) -> dict[str, Any]:
        """Return a JSON-serialisable dictionary."""
        out = asdict(self)
        out["run_dir"] = str(self.run_dir)
        out["plots"] = [str(p) for p in self.plots]
        out["seconds_per_round"] = self.seconds_per_round
        return out


class RunInterrupted(KeyboardInterrupt):
    """Ctrl-C honoured between rounds: the run stopped with a checkpoint at its last round.

    Attributes:
        result: What the run had produced by then (its plots drawn, no summary.json written).
    """

    def __init__(self, result: RunResult) -> None:
        super().__init__(f"interrupted after round {result.rounds_done} of {result.rounds}")
        self.result = result


def new_run_dir(config: ExperimentConfig) -> Path:
    """Create a fresh ``output_dir/name/<timestamp>[-k]`` directory.

    The name is claimed with an exclusive ``mkdir``, so two runs started in the same second get
    different directories. ``latest`` is pointed at the directory by :func:`run` once its
    ``config.yaml`` is written (see :func:`_point_latest_at`).

    Returns:
        The new, empty directory.
    """
    parent = Path(config.output_dir) / config.name
    _make_dir(parent, "output_dir")
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    suffix = 1
    while True:
        run_dir = parent / (stamp if suffix == 1 else f"{stamp}-{suffix}")
        try:
            run_dir.mkdir()
            return run_dir
        except FileExistsError:
            suffix += 1
        except OSError as exc:
            raise ConfigError(
                f"output_dir: cannot create the run directory {run_dir} ({_cause(exc)})"
            ) from None


def _make_dir(path: Path, what: str) -> None:
    """Create a directory (and its parents); a failure is one ConfigError line naming ``what``."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"{what}: cannot create the directory {path} ({_cause(exc)})") from None


@contextlib.contextmanager
def _run_lock(run_dir: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``run_dir`` (``flock`` on the directory itself) while training.

    Two sessions in one run directory would each rewrite ``metrics.csv`` (one's rows would
    vanish) and write the same temporary checkpoint; the second is refused instead. The lock
    needs no file and is released when the process ends, however it ends.

    Raises:
        ConfigError: if another process holds the lock, or the directory cannot be opened.
    """
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not a POSIX system: no lock
        yield
        return
    try:
        fd = os.open(run_dir, os.O_RDONLY)
    except OSError as exc:
        raise ConfigError(f"run directory {run_dir} cannot be opened ({_cause(exc)})") from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ConfigError(
                f"run directory {run_dir} is in use by another training session; wait for it to "
                f"finish (two sessions would overwrite each other's metrics and checkpoint)"
            ) from None
        yield
    finally:
        os.close(fd)


def _remove_stale_temporaries(run_dir: Path) -> None:
    """Remove the temporary files a killed session may have left (the lock is held)."""
    for name in (CHECKPOINT_FILE, METRICS_FILE, CONFIG_FILE, SUMMARY_FILE, *PLOT_FILES):
        with contextlib.suppress(FileNotFoundError):
            (run_dir / f"{name}.tmp").unlink()


def _point_latest_at(run_dir: Path) -> None:
    """Atomically point ``run_dir/../latest`` at ``run_dir`` (a relative symlink).

    The link is created under a name unique to this process and renamed over ``latest``, so a
    reader always finds either the previous run or this one, never a missing or partial link;
    it is called once the run directory holds its config. A ``latest`` that is not a symlink
    (a user's own file or directory) is left alone.

    Raises:
        RunFileError: one line naming ``latest``, if the link cannot be made.
    """
    latest = run_dir.parent / "latest"
    if latest.exists() and not latest.is_symlink():
        return
    tmp = run_dir.parent / f".latest-{os.getpid()}-{threading.get_ident()}"
    try:
        if tmp.is_symlink():
            tmp.unlink()
        tmp.symlink_to(run_dir.name)
        os.replace(tmp, latest)
    except OSError as exc:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise RunFileError(f"cannot point {latest} at {run_dir.name} ({_cause(exc)})") from None


def _metric_columns(config: ExperimentConfig) -> list[str]:
    base = ["round", "participants", "train_loss", "test_loss", "test_accuracy"]
    return base + [f"eps_{name}" for name in curve_list(config)]


def _tensors(config: ExperimentConfig) -> tuple[torch.Tensor, ...]:
    d = config.data
    mnist = load_mnist(d.source, d.root, d.pickle_path)
    train_x, train_y, test_x, test_y = mnist.normalized()
    if d.train_subset is not None:
        if d.train_subset > train_x.shape[0]:
            raise ConfigError(
                f"data.train_subset must be <= {train_x.shape[0]} (the training set), got "
                f"{d.train_subset}"
            )
        train_x, train_y = train_x[: d.train_subset], train_y[: d.train_subset]
    if d.test_subset is not None:
        test_x, test_y = test_x[: d.test_subset], test_y[: d.test_subset]

    def images(x: np.ndarray) -> torch.Tensor:
        pixels = torch.from_numpy(x)
        if d.normalize == "standard":
            pixels = (pixels - MNIST_MEAN) / MNIST_STD
        return pixels.unsqueeze(1).contiguous()

    return (
        images(train_x),
        torch.from_numpy(train_y).long(),
        images(test_x),
        torch.from_numpy(test_y).long(),
    )


def _optimizer(config: ExperimentConfig, model: nn.Module) -> torch.optim.Optimizer:
    o = config.optimizer
    if o.name == "sgd":
        return torch.optim.SGD(model.parameters(), lr=o.lr, momentum=o.momentum)
    return torch.optim.Adam(model.parameters(), lr=o.lr)


def resolve_device(name: str) -> torch.device:
    """Return the device of ``training.device``: ``auto`` is CUDA when available, else the CPU.

    Raises:
        ConfigError: for a CUDA device that this machine does not have.
    """
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda":
        index = device.index or 0
        if not torch.cuda.is_available() or index >= torch.cuda.device_count():
            raise ConfigError(f"training.device {name} is not available here; use auto or cpu")
    return device


class _Average:
    """Exponential moving average of a model's weights (what is evaluated when ``ema`` is set).

    ``avg = decay * avg + (1 - decay) * weights`` after every round, with the usual warm-up
    ``decay_t = min(decay, (1 + t) / (10 + t))`` so that early averages are not dominated by the
    initial weights. It only reads the trained weights, so it is post-processing: it changes no
    privacy number.
    """

    def __init__(self, model: nn.Module, decay: float) -> None:
        self.decay = decay
        self.model = copy.deepcopy(model).eval()
        for p in self.model.parameters():
            p.requires_grad_(False)

    @torch.no_grad()
    def update(self, model: nn.Module, round_number: int) -> None:
        decay = min(self.decay, (1.0 + round_number) / (10.0 + round_number))
        for avg, p in zip(self.model.parameters(), model.parameters(), strict=True):
            avg.mul_(decay).add_(p.detach(), alpha=1.0 - decay)


@torch.no_grad()
def evaluate(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> tuple[float, float]:
    """Return ``(mean cross-entropy, accuracy)`` of ``model`` on ``(x, y)``."""
    was_training = model.training
    model.eval()
    loss, correct = 0.0, 0
    for start in range(0, x.shape[0], _EVAL_BATCH):
        logits = model(x[start : start + _EVAL_BATCH])
        target = y[start : start + _EVAL_BATCH]
        loss += float(F.cross_entropy(logits, target, reduction="sum"))
        correct += int((logits.argmax(dim=1) == target).sum())
    model.train(was_training)
    return loss / x.shape[0], correct / x.shape[0]


def _write_yaml(config: ExperimentConfig, path: Path) -> None:
    write_file(path, yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False))


def _fmt(value: float | None) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    return repr(float(value))


class _Session:
    """Everything one training session holds; built fresh for a new run or a resume."""

    def __init__(self, config: ExperimentConfig, run_dir: Path, start_round: int) -> None:
        self.config = config
        self.run_dir = run_dir
        torch.set_num_threads(config.training.threads)
        self.device = resolve_device(config.training.device)
        self.train_x, self.train_y, self.test_x, self.test_y = (
            t.to(self.device) for t in _tensors(config)
        )
        self.population = int(self.train_x.shape[0])
        torch.manual_seed(config.seed)
        model = build_model(config.model.name).to(self.device)
        optimizer = _optimizer(config, model)
        # Copied before Opacus attaches its hooks to the model's layers.
        self.average = _Average(model, config.training.ema) if config.training.ema else None
        # The noise is drawn on the device that holds the gradients.
        self.noise_generator = torch.Generator(device=self.device).manual_seed(config.seed + 1)
        with warnings.catch_warnings():
            # Opacus's reminder that its RNG is not cryptographically secure: this is a
            # simulation whose noise must be reproducible from the seed.
            warnings.filterwarnings("ignore", message="Secure RNG turned off")
            self.engine = PrivacyEngine(accountant=get_protocol(config.protocol.kind).accountant)
        p = config.protocol
        self.trainer: FederatedTrainer | None = None
        if config.clients is not None:
            self._user_level(config, config.clients, model, optimizer, start_round)
            return
        loader = DataLoader(TensorDataset(self.train_x, self.train_y), batch_size=1)
        self.model, self.optimizer, private_loader = shuffle_opacus.make_private(
            self.engine,
            module=model,
            optimizer=optimizer,
            data_loader=loader,
            noise_multiplier=config.privacy.noise_multiplier,
            max_grad_norm=config.privacy.clipping_norm,
            rounds=config.training.rounds,
            rate=p.rate,
            sample_size=p.sample_size,
            seed=config.seed,
            start_round=start_round,
            sensitivity=config.privacy.sensitivity,
            noise_mode=config.privacy.noise_mode,
            grad_sample_mode=config.training.grad_sample_mode,
            noise_generator=self.noise_generator,
        )
        # Index the tensors with the sampler's batches directly: the same rounds as the
        # private loader, without collating thousands of single examples per round.
        self.sampler = private_loader.batch_sampler
        # Evaluation uses the wrapped network itself: no per-sample machinery (Opacus's ``ew``
        # wrapper would try to compute per-sample gradients even under no_grad).
        self.plain_model: nn.Module = self.model._module
        self.server_optimizer: torch.optim.Optimizer = self.optimizer.original_optimizer
        self.curves = EpsilonCurves(config, self.population)

    def _user_level(
        self,
        config: ExperimentConfig,
        c: ClientsConfig,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        start_round: int,
    ) -> None:
        """Build the user-level trainer: ``clients.count`` clients training locally."""
        labels = self.train_y.cpu().numpy()
        if c.partition == "iid":
            partition = iid_partition(labels.size, c.count, seed=config.seed)
        elif c.partition == "dirichlet":
            partition = dirichlet_partition(labels, c.count, alpha=c.alpha, seed=config.seed)
        else:
            partition = shard_partition(
                labels, c.count, shards_per_client=c.shards_per_client, seed=config.seed
            )
        p = config.protocol
        self.trainer = make_private_clients(
            self.engine,
            module=model,
            optimizer=optimizer,
            data=(self.train_x, self.train_y),
            partition=partition,
            loss_fn=functools.partial(F.cross_entropy, reduction="none"),
            noise_multiplier=config.privacy.noise_multiplier,
            max_update_norm=config.privacy.clipping_norm,
            client_lr=c.client_lr,
            local_steps=c.local_steps,
            local_epochs=c.local_epochs,
            local_batch_size=c.local_batch_size,
            rounds=config.training.rounds,
            rate=p.rate,
            sample_size=p.sample_size,
            seed=config.seed,
            start_round=start_round,
            sensitivity=config.privacy.sensitivity,
            noise_mode=config.privacy.noise_mode,
            average=c.average,
            noise_generator=self.noise_generator,
            client_chunk=c.chunk,
        )
        self.population = partition.num_clients
        self.sampler = self.trainer.sampler
        self.model = self.plain_model = model
        self.optimizer = self.server_optimizer = optimizer
        self.curves = EpsilonCurves(config, self.population)

    @property
    def evaluated_model(self) -> nn.Module:
        """The weights that are evaluated: their moving average when ``training.ema`` is set."""
        return self.average.model if self.average is not None else self.plain_model

    def state(
        self, round_done: int, seconds: float, participants: int, epsilon_sha256: str
    ) -> dict[str, Any]:
        """Return the checkpoint: tensors and plain containers only (:func:`load_checkpoint`).

        ``epsilon_sha256`` is the digest of the epsilon columns of rows ``1 .. round_done``
        (:func:`_epsilon_record`); :func:`~.checkpoint.save_checkpoint` adds the checksum.
        """
        return {
            "format": CHECKPOINT_FORMAT,
            "config": comparable(self.config),
            "round": round_done,
            "model": self.plain_model.state_dict(),
            "average": self.average.model.state_dict() if self.average is not None else None,
            "optimizer": self.server_optimizer.state_dict(),
            "accountant": self.engine.accountant.state_dict(),
            "noise_generator": self.noise_generator.get_state(),  # a CPU tensor on any device
            "torch_rng": torch.get_rng_state(),
            "cuda_rng": torch.cuda.get_rng_state_all() if self.device.type == "cuda" else None,
            "seconds": seconds,
            "participants": participants,
            "epsilon_sha256": epsilon_sha256,
        }

    def load(self, state: dict[str, Any]) -> None:
        self.plain_model.load_state_dict(state["model"])
        if self.average is not None:
            self.average.model.load_state_dict(state["average"])
        self.server_optimizer.load_state_dict(state["optimizer"])
        self.engine.accountant.load_state_dict(state["accountant"])
        self.noise_generator.set_state(state["noise_generator"])
        torch.set_rng_state(state["torch_rng"])
        if self.device.type == "cuda" and state.get("cuda_rng") is not None:
            torch.cuda.set_rng_state_all(state["cuda_rng"])

    def learning_rate(self, round_number: int) -> float:
        """Return the learning rate of round ``round_number`` (1-based) under the schedule.

        ``optimizer.warmup`` rounds rise linearly to ``optimizer.lr``; then ``cosine`` decays to 0
        over the remaining rounds: ``lr (1 + cos(pi (t - 1 - W) / (T - W))) / 2``. It is a
        function of the round only, so a resumed run needs no extra state.
        """
        o = self.config.optimizer
        if round_number <= o.warmup:
            return o.lr * round_number / (o.warmup + 1)
        if o.schedule == "constant":
            return o.lr
        frac = (round_number - 1 - o.warmup) / (self.config.training.rounds - o.warmup)
        return o.lr * 0.5 * (1.0 + math.cos(math.pi * frac))

    def round(self, indices: Sequence[int], round_number: int) -> float:
        """One round: per-client gradients, clipping, local noise, one server step.

        With ``training.micro_batch`` the reports are processed in chunks: every chunk but the
        last only clips and accumulates (Opacus's ``signal_skip_step``), the last adds the
        noise of all the round's reports and steps, so a round is still one noisy step and one
        accountant step. Chunks keep the per-sample gradients small (faster on CPU); the result
        equals the unchunked round up to floating-point rounding.
        """
        if self.trainer is not None:
            return self._user_round(self.trainer, indices, round_number)
        idx = torch.as_tensor(indices, dtype=torch.long, device=self.device)
        x, y = self.train_x[idx], self.train_y[idx]
        size = int(idx.numel())
        chunk = self.config.training.micro_batch or max(size, 1)
        starts = list(range(0, size, chunk)) or [0]
        loss_sum = 0.0
        for group in self.optimizer.param_groups:
            group["lr"] = self.learning_rate(round_number)
        self.optimizer.zero_grad(set_to_none=True)
        for i, start in enumerate(starts):
            last = i == len(starts) - 1
            xc, yc = x[start : start + chunk], y[start : start + chunk]
            loss = F.cross_entropy(self.model(xc), yc)
            with warnings.catch_warnings():
                # The inputs are data, not parameters; Opacus's hooks still see every layer.
                warnings.filterwarnings("ignore", message="Full backward hook is firing")
                loss.backward()
            if size:
                loss_sum += loss.item() * int(yc.shape[0])
            if len(starts) > 1:
                self.optimizer.signal_skip_step(do_skip=not last)
            self.optimizer.step()
            if not last:
                self.optimizer.zero_grad(set_to_none=True)  # the clipped sum is kept
        if self.average is not None:
            self.average.update(self.plain_model, round_number)
        return loss_sum / size if size else math.nan

    def _user_round(
        self, trainer: FederatedTrainer, clients: Sequence[int], round_number: int
    ) -> float:
        """One user-level round: the trainer releases it into ``.grad``, the server steps.

        Returns the participants' mean local training loss (``nan`` for an empty round).
        """
        for group in self.server_optimizer.param_groups:
            group["lr"] = self.learning_rate(round_number)
        result = trainer.run_round(round_number - 1)
        if result.reports != len(clients):
            raise RuntimeError(f"round {round_number}: the trainer and the sampler disagree")
        self.server_optimizer.step()
        if self.average is not None:
            self.average.update(self.plain_model, round_number)
        return result.local_loss


def _progress(total: int, initial: int, enabled: bool) -> Any:
    from tqdm.auto import tqdm

    return tqdm(
        total=total,
        initial=initial,
        unit="round",
        disable=not enabled,
        dynamic_ncols=True,
        smoothing=0.05,
    )


class _StopRequest:
    """Turn Ctrl-C (SIGINT) into a request honoured between rounds.

    A round interrupted half-way could leave the model stepped but the round not recorded, and a
    checkpoint of that state would not resume exactly. So the first Ctrl-C only sets a flag: the
    current round finishes, a checkpoint is written and the run stops. A second Ctrl-C raises
    ``KeyboardInterrupt`` at once; the last periodic checkpoint is then the resume point. Only
    installed in the main thread, and not when SIGINT is ignored (background jobs).
    """

    def __init__(self) -> None:
        self.requested = False
        self._previous: Any = None
        self._installed = False

    def _handle(self, signum: int, frame: Any) -> None:
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True

    def __enter__(self) -> _StopRequest:
        if threading.current_thread() is threading.main_thread():
            previous = signal.getsignal(signal.SIGINT)
            if previous is not signal.SIG_IGN:
                self._previous = previous
                signal.signal(signal.SIGINT, self._handle)
                self._installed = True
        return self

    def __exit__(self, *exc: object) -> None:
        if self._installed:
            signal.signal(signal.SIGINT, self._previous)


def _evaluated(config: ExperimentConfig, round_number: int) -> bool:
    """Whether round ``round_number`` (1-based) evaluates the model."""
    t = config.training
    return round_number % t.eval_every == 0 or round_number == t.rounds


def _row_is_sound(config: ExperimentConfig, row: dict[str, str], round_number: int) -> bool:
    """Whether a ``metrics.csv`` row of a round holds every measured value that round must have.

    The epsilon columns are not judged here: :func:`_checked_epsilons` recomputes them.
    """
    try:
        if int(row["participants"]) < 0:
            return False
        for key in ("train_loss", "test_loss", "test_accuracy"):
            if row[key]:
                float(row[key])
    except ValueError:
        return False
    return bool(row["test_accuracy"]) == _evaluated(config, round_number)


def _rebuilt_row(session: _Session, round_number: int) -> dict[str, str]:
    """Return a round's row as far as the checkpoint determines it (no losses, no accuracy)."""
    evaluated = _evaluated(session.config, round_number)
    row = {
        "round": str(round_number),
        "participants": str(len(session.sampler.batch(round_number - 1))),
        "train_loss": "",
        "test_loss": "",
        "test_accuracy": "",
    }
    eps = session.curves.row(round_number, sparse=evaluated)
    row.update({f"eps_{k}": _fmt(v) for k, v in eps.items()})
    return row


def _epsilon_record(row: dict[str, str], names: Sequence[str]) -> bytes:
    """Return what the digest of the epsilon columns takes from a row: its round and epsilons."""
    return ",".join([row["round"], *(row[f"eps_{name}"] for name in names)]).encode() + b"\n"


def _checked_epsilons(
    session: _Session,
    path: Path,
    rows: list[dict[str, str]],
    expected: str | None,
    echo: Callable[[str], None],
) -> Any:
    """Check the epsilon columns of rows ``1 .. len(rows)`` against the accountant's history.

    Epsilon after round ``t`` is a function of the history, which :func:`_check_history` has
    found to be the config's, so it is what the curves compute for ``t``, exactly as training
    writes it. When the digest of the rows' epsilon columns is ``expected`` (the one the
    checkpoint stores) and the last row recomputes to what it holds (so the accounting has not
    changed since), nothing else is recomputed. Otherwise (an edited file, or a layout 2
    checkpoint without a digest) every row's epsilons are recomputed and those that differ are
    replaced in ``rows``, with one line per column naming the file and the rounds. Nothing is
    written here.

    Returns:
        The SHA-256 object of the rows' :func:`_epsilon_record`, for the rounds that follow.
    """
    names = session.curves.names

    def computed(t: int) -> dict[str, str]:
        values = session.curves.row(t, sparse=_evaluated(session.config, t))
        return {f"eps_{name}": _fmt(value) for name, value in values.items()}

    def digest_of(table: list[dict[str, str]]) -> Any:
        digest = hashlib.sha256()
        for row in table:
            digest.update(_epsilon_record(row, names))
        return digest

    digest = digest_of(rows)
    if digest.hexdigest() == expected and rows:
        last = computed(len(rows))
        if all(rows[-1][column] == text for column, text in last.items()):
            return digest
    wrong: dict[str, list[int]] = {}
    for t, row in enumerate(rows, start=1):
        for column, text in computed(t).items():
            if row[column] != text:
                row[column] = text
                wrong.setdefault(column, []).append(t)
    for column, numbers in wrong.items():
        echo(
            f"{path}: {column} of rounds {_ranges(numbers)} did not match the accountant's "
            f"history; recomputed"
        )
    return digest_of(rows)


def _ranges(numbers: Sequence[int]) -> str:
    """``[1, 2, 3, 7]`` -> ``"1-3, 7"``."""
    parts: list[str] = []
    for n in numbers:
        if parts and parts[-1].split("-")[-1] == str(n - 1):
            parts[-1] = f"{parts[-1].split('-')[0]}-{n}"
        else:
            parts.append(str(n))
    return ", ".join(parts)


def _metrics_rows(
    session: _Session, path: Path, up_to: int, participants: int, echo: Callable[[str], None]
) -> list[dict[str, str]]:
    """Return the rows of rounds ``1 .. up_to`` of ``metrics.csv``, repaired where possible.

    Rows after ``up_to`` are dropped (those rounds run again), with a message. Rows of earlier
    rounds that are missing (the whole file included), cut short or unreadable are rebuilt from
    the checkpoint by :func:`_rebuilt_row`, with a message naming them. Nothing is written here.

    Raises:
        ConfigError: one line naming the file (and line) for what cannot be interpreted: another
            header, a round that is not an integer or is out of range, a round listed twice, or
            participants that do not add up to the checkpoint's.
    """
    config = session.config
    columns = _metric_columns(config)
    fix = f"restore it, or delete it to rebuild rounds 1-{up_to} from the checkpoint"
    try:
        text: str | None = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        text = None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path} cannot be read ({_cause(exc)}); {fix}") from None
    rows: dict[int, dict[str, str]] = {}
    seen: dict[int, int] = {}
    after = 0
    cut_short = False
    lines = [] if text is None else text.splitlines(keepends=True)
    if lines:
        header = next(csv.reader([lines[0]]), [])
        if header != columns:
            raise ConfigError(f"{path} has the columns {header}, this run writes {columns}; {fix}")
    for number, line in enumerate(lines[1:], start=2):
        if not line.endswith(("\n", "\r")):
            cut_short = True  # only the last line can be: a write that was cut off
            continue
        fields = next(csv.reader([line]), [])
        if not fields:
            continue
        try:
            round_number = int(fields[0])
        except ValueError:
            raise ConfigError(
                f"{path} line {number}: the round {fields[0]!r} is not an integer; {fix}"
            ) from None
        if round_number > up_to:
            after += 1
            continue
        if round_number < 1:
            raise ConfigError(f"{path} line {number}: round {round_number} is not >= 1; {fix}")
        if round_number in seen:
            raise ConfigError(
                f"{path} lists round {round_number} twice (lines {seen[round_number]} and "
                f"{number}); {fix}"
            )
        seen[round_number] = number
        row = dict(zip(columns, fields, strict=False))
        if len(fields) == len(columns) and _row_is_sound(config, row, round_number):
            rows[round_number] = row
    missing = [r for r in range(1, up_to + 1) if r not in rows]
    if cut_short and not missing:
        after += 1  # the rows up to the checkpoint are whole: the cut row came after them
    if missing:
        for r in missing:
            rows[r] = _rebuilt_row(session, r)
        why = "the file was missing" if text is None else "missing, cut short or unreadable rows"
        echo(
            f"{path}: rounds {_ranges(missing)} rebuilt from the checkpoint ({why}): round, "
            f"participants and epsilon; their losses and accuracy are lost and left empty"
        )
    if after:
        echo(f"{path}: {after} rows after the checkpoint (round {up_to}) dropped; they run again")
    ordered = [rows[r] for r in range(1, up_to + 1)]
    listed = sum(int(row["participants"]) for row in ordered)
    if listed != participants:
        raise ConfigError(
            f"{path} lists {listed} participants in rounds 1-{up_to}, the checkpoint "
            f"{participants}; the file belongs to another run or was edited; {fix}"
        )
    return ordered


def _train(
    config: ExperimentConfig,
    run_dir: Path,
    *,
    state: dict[str, Any] | None,
    progress: bool,
    stop_after: int | None,
    echo: Callable[[str], None],
) -> RunResult:
    start = int(state["round"]) if state is not None else 0
    session = _Session(config, run_dir, start)
    if state is not None:
        try:
            session.load(state)
        except (RuntimeError, KeyError, ValueError, TypeError, IndexError) as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise ConfigError(
                f"checkpoint {run_dir / CHECKPOINT_FILE} does not fit this run: {first}"
            ) from None
        _check_history(session, start, f"checkpoint {run_dir / CHECKPOINT_FILE}")
    seconds = float(state["seconds"]) if state is not None else 0.0
    participants_total = int(state["participants"]) if state is not None else 0
    _check_curves(session)
    columns = _metric_columns(config)
    metrics_path = run_dir / METRICS_FILE
    # Every check has passed once the rows are read and their epsilons checked; only then is
    # anything written.
    rows = _metrics_rows(session, metrics_path, start, participants_total, echo)
    expected = state.get("epsilon_sha256") if state is not None else None
    epsilon_digest = _checked_epsilons(session, metrics_path, rows, expected, echo)
    last_acc: float | None = None
    for row in rows:
        if row["test_accuracy"]:
            last_acc = float(row["test_accuracy"])
    rounds = config.training.rounds
    t = config.training
    names = curve_list(config)
    first_curve = REPLACE_ONE if REPLACE_ONE in names else names[0]  # the guarantee
    done = start
    bar = _progress(rounds, start, progress)
    saved = start
    interrupted = False
    # The rows up to the checkpoint are rewritten to a temporary file and renamed into place, so
    # that a kill during the rewrite cannot lose rounds; new rounds are then appended.
    text = io.StringIO()
    writer = csv.DictWriter(text, fieldnames=columns)
    writer.writeheader()
    writer.writerows(rows)
    write_file(metrics_path, text.getvalue())
    # A finished run (resumed to rewrite its summary and plots) releases no more rounds.
    batches = session.sampler if start < rounds else ()
    with _StopRequest() as stop, AppendedFile(metrics_path) as fh:
        writer = csv.DictWriter(fh, fieldnames=columns)
        try:
            for t_index, indices in enumerate(batches, start=start + 1):
                began = time.perf_counter()
                loss = session.round(indices, t_index)
                seconds += time.perf_counter() - began
                done = t_index
                participants_total += len(indices)
                row: dict[str, str] = {
                    "round": str(done),
                    "participants": str(len(indices)),
                    "train_loss": _fmt(loss),
                    "test_loss": "",
                    "test_accuracy": "",
                }
                evaluated = done % t.eval_every == 0 or done == rounds
                if evaluated:
                    s = session
                    test_loss, last_acc = evaluate(s.evaluated_model, s.test_x, s.test_y)
                    row["test_loss"], row["test_accuracy"] = _fmt(test_loss), _fmt(last_acc)
                eps = session.curves.row(done, sparse=evaluated)
                row.update({f"eps_{k}": _fmt(v) for k, v in eps.items()})
                writer.writerow(row)
                epsilon_digest.update(_epsilon_record(row, names))
                if row["test_accuracy"]:
                    fh.flush()  # so that an evaluation can be followed in metrics.csv
                bar.update(1)
                shown = eps[first_curve]
                postfix = {f"eps[{first_curve}]": "-" if shown is None else f"{shown:.4g}"}
                if last_acc is not None:
                    postfix["acc"] = f"{last_acc:.2%}"
                bar.set_postfix(postfix, refresh=False)
                if done % t.checkpoint_every == 0 or done == rounds or stop.requested:
                    fh.flush()
                    _check_history(session, done, "this session")
                    save_checkpoint(
                        session.state(
                            done, seconds, participants_total, epsilon_digest.hexdigest()
                        ),
                        run_dir / CHECKPOINT_FILE,
                    )
                    saved = done
                if stop.requested:
                    echo(f"interrupted after round {done}; continue with --resume {run_dir}")
                    raise KeyboardInterrupt
                if stop_after is not None and done >= stop_after:
                    break
        except KeyboardInterrupt:
            fh.flush()
            if not stop.requested:
                where = f"round {saved}" if saved else "no checkpoint yet"
                echo(f"interrupted; last checkpoint: {where}; continue with --resume {run_dir}")
                raise
            interrupted = True
        finally:
            bar.close()
    if interrupted:
        # Ctrl-C honoured between rounds: the checkpoint, metrics.csv and the accountant agree
        # on round ``done`` (checked when the checkpoint was written), so the summary and the
        # plots so far describe exactly what was released.
        partial = RunResult(
            run_dir=run_dir,
            rounds_done=done,
            rounds=rounds,
            test_accuracy=last_acc,
            epsilon=session.curves.row(done) if done else {},
            delta=config.privacy.delta,
            seconds=seconds,
            mean_participants=participants_total / done if done else 0.0,
            labels={name: curve_label(name, config) for name in session.curves.names},
        )
        if done:
            from .plots import plot_run

            partial.plots = plot_run(run_dir)
            partial.guarantee = guarantee_record(config, session.curves, done)
        raise RunInterrupted(partial)
    if done != rounds and (stop_after is None or done < stop_after):
        # Only reachable if the sampler produced fewer rounds than configured.
        raise RuntimeError(f"the sampler stopped after round {done} of {rounds}")
    result = RunResult(
        run_dir=run_dir,
        rounds_done=done,
        rounds=rounds,
        test_accuracy=last_acc,
        epsilon=session.curves.row(done),
        delta=config.privacy.delta,
        seconds=seconds,
        mean_participants=participants_total / done if done else 0.0,
        labels={name: curve_label(name, config) for name in session.curves.names},
    )
    if done == rounds:
        from .plots import plot_run

        _check_accountant(session, done)  # before the summary and the plots are written
        result.guarantee = guarantee_record(config, session.curves, done)
        result.plots = plot_run(run_dir)
        write_file(run_dir / SUMMARY_FILE, json.dumps(result.to_dict(), indent=2) + "\n")
    return result


def guarantee_record(
    config: ExperimentConfig, curves: EpsilonCurves, rounds: int
) -> dict[str, Any]:
    """Return what a run of ``rounds`` rounds may claim (for the summary and summary.json).

    Args:
        config: The run's config.
        curves: Its epsilon curves.
        rounds: Rounds released.

    Returns:
        ``epsilon`` (the accountant's default: ``pld`` where the work limits allow it, else the
        Rényi bound), ``method``, ``epsilon_lower`` (the optimistic estimate of a ``pld``
        result), ``note``, ``delta``, ``neighbouring``, ``unit``, ``sensitivity``,
        ``assumptions`` and ``seed``.
    """
    result = curves.guarantee(rounds, lower=True) if rounds else None
    protocol = curves.protocol
    record: dict[str, Any] = {
        "epsilon": result.epsilon if result is not None else 0.0,
        "method": result.method if result is not None else None,
        "epsilon_lower": result.epsilon_lower if result is not None else None,
        "note": result.note if result is not None else None,
        "delta": config.privacy.delta,
        "neighbouring": protocol.analysis.neighbouring,
        "unit": "one client" if config.clients is None else "one client (all its examples)",
        "sensitivity": sensitivity_label("replace-one"),
        "assumptions": list(protocol.analysis.assumptions),
        "seed": (
            f"{config.seed} (given): a reproducible simulation; its epsilon does not hold "
            f"against anyone who knows the seed (a deployment draws its coins from the OS)"
        ),
    }
    if REPLACE_ONE in curves.names and rounds:
        # The config's own convention, beside the guarantee and labelled with what it assumes.
        record["convention"] = {
            "sensitivity": sensitivity_label(config.privacy.sensitivity),
            "epsilon": curves.convention(rounds).epsilon,
            "assumptions": list(sensitivity_assumptions(config.privacy.sensitivity)),
        }
    return record


def _check_curves(session: _Session) -> None:
    """Check, before anything is written, that every configured curve can be evaluated.

    The per-round PMF of ``pld`` is built here (once per process), at the planned last round.

    Raises:
        ConfigError: one line naming ``privacy.accountants`` when ``pld`` cannot evaluate the
            setting.
    """
    rounds = session.config.training.rounds
    if "pld" not in session.curves.names:
        return
    try:
        session.curves.epsilon("pld", rounds)
    except PldRangeError as exc:
        raise ConfigError(
            f"privacy.accountants: pld cannot evaluate this setting ({str(exc).rstrip('.')}); "
            f"remove it (the exact curve is the Rényi bound)"
        ) from None


def _check_history(session: _Session, rounds: int, where: str) -> None:
    """Check that the accountant holds exactly the rounds the config implies.

    The epsilon curves of ``metrics.csv`` are computed from the config, ``rounds`` rounds of
    ``(noise_multiplier, sample_rate)``; the accountant must hold the same history, or the
    curves would misstate what was released.

    Raises:
        ConfigError: one line naming ``where`` the history came from.
    """
    held = [entry for entry in session.engine.accountant.history if entry[2]]
    sigma = float(session.config.privacy.noise_multiplier)
    expected = [(sigma, session.curves.sample_rate, rounds)] if rounds else []
    if held != expected:
        raise ConfigError(
            f"{where}: the accountant holds the rounds {held} (noise_multiplier, sample_rate, "
            f"rounds) but config.yaml implies {expected}; the epsilon curves would not describe "
            f"the training. Restore the config.yaml and checkpoint that belong together, or start "
            f"a new run"
        )


def _check_accountant(session: _Session, rounds: int) -> None:
    """Check that the Opacus accountant and the curve of its method give the same epsilon.

    Raises:
        ConfigError: one line, if they differ.
    """
    _check_history(session, rounds, "at the end of the run")
    delta = session.config.privacy.delta
    theirs = session.engine.accountant.epsilon_result(delta)
    curve = "pld" if theirs.method == "pld" else "exact"
    if curve not in session.curves.names:
        return
    ours = session.curves.epsilon(curve, rounds)
    if not math.isclose(ours, theirs.epsilon, rel_tol=1e-9, abs_tol=1e-12):
        raise ConfigError(
            f"the accountant's epsilon {theirs.epsilon} ({theirs.method}) differs from the "
            f"{curve} curve's {ours}; no summary or plot was written"
        )


def run(
    config: ExperimentConfig,
    *,
    run_dir: Path | None = None,
    progress: bool = True,
    stop_after: int | None = None,
    echo: Callable[[str], None] = print,
) -> RunResult:
    """Train from scratch according to ``config``.

    Args:
        config: A validated config (see :func:`shuffle_experiments.config.load_config`).
        run_dir: Directory to write into (must be empty or absent); by default a new
            ``output_dir/name/<timestamp>``.
        progress: Show a progress bar.
        stop_after: Stop (with a checkpoint) after this round, as an interruption would; for
            tests and for splitting long runs.
        echo: Where messages go.

    Returns:
        A :class:`RunResult`; plots and ``summary.json`` are written once all rounds are done.

    Raises:
        ConfigError: if ``run_dir`` is not empty or is in use, or a directory cannot be created
            (``output_dir`` a file, say).
        RunFileError: if a file of the run cannot be written (a full disk).
        shuffle_experiments.data.MnistNotFoundError: if MNIST cannot be found.
    """
    config = validate(config.model_dump(mode="json"))
    own_dir = run_dir is None
    if run_dir is None:
        run_dir = new_run_dir(config)
    else:
        run_dir = Path(run_dir)
        if run_dir.exists() and not run_dir.is_dir():
            raise ConfigError(f"run directory {run_dir} exists and is not a directory")
        _make_dir(run_dir, "run directory")
    with _run_lock(run_dir):
        if not own_dir and any(run_dir.iterdir()):
            raise ConfigError(f"run directory {run_dir} is not empty; use --resume to continue it")
        _write_yaml(config, run_dir / CONFIG_FILE)
        if own_dir:
            _point_latest_at(run_dir)
        return _train(
            config, run_dir, state=None, progress=progress, stop_after=stop_after, echo=echo
        )


def resume(
    run_dir: Path,
    *,
    progress: bool = True,
    stop_after: int | None = None,
    echo: Callable[[str], None] = print,
) -> RunResult:
    """Continue an interrupted run from its last checkpoint, or finish a finished one.

    A run whose checkpoint is at its last round trains no more: its ``summary.json`` and plots
    are written again from the checkpoint and ``metrics.csv`` (after the same checks and
    repairs), which is how a run whose last files could not be written (a full disk) is
    completed.

    Args:
        run_dir: A run directory written by :func:`run`.
        progress: Show a progress bar.
        stop_after: As in :func:`run`.
        echo: Where messages go.

    Returns:
        A :class:`RunResult`.

    Raises:
        ConfigError: if ``run_dir`` is in use by another session, has no config or no
            checkpoint, or its checkpoint (checksum included), config and ``metrics.csv`` do
            not fit together (one line, before anything is written).
        RunFileError: if a file of the run cannot be written (one line naming it).
    """
    return _resume(Path(run_dir), "--resume", progress=progress, stop_after=stop_after, echo=echo)


def redraw(run_dir: str | Path, *, echo: Callable[[str], None] = print) -> list[Path]:
    """Write a run's plots again and, for a finished run, its ``summary.json``; no training.

    A finished run (its checkpoint at the last round) is reopened as :func:`resume` does: the
    checkpoint verified, ``metrics.csv`` checked and repaired (missing rows, epsilon columns),
    the accountant compared with its curve, then the plots and ``summary.json`` written. The
    plots of any other run (interrupted, or training in another session) are drawn from
    ``metrics.csv`` as it stands; its epsilon columns are checked when it is resumed.

    Args:
        run_dir: A run directory written by :func:`run`.
        echo: Where messages go.

    Returns:
        The files written.

    Raises:
        ConfigError: if ``run_dir`` is not a run directory, its checkpoint is damaged, or (a
            finished run) it does not pass the checks of :func:`resume`.
        RunFileError: if a file cannot be written (one line naming it).
    """
    run_dir = Path(run_dir)
    config_path, checkpoint = run_dir / CONFIG_FILE, run_dir / CHECKPOINT_FILE
    if config_path.is_file() and checkpoint.is_file():
        config = load_config(config_path)
        state = load_checkpoint(checkpoint, config, echo=lambda _: None)  # said again below
        if int(state["round"]) >= config.training.rounds:
            result = _resume(run_dir, "plot", progress=False, stop_after=None, echo=echo)
            return [*result.plots, run_dir / SUMMARY_FILE]
    from .plots import plot_run

    return plot_run(run_dir)


def _resume(
    run_dir: Path,
    what: str,
    *,
    progress: bool,
    stop_after: int | None,
    echo: Callable[[str], None],
) -> RunResult:
    """:func:`resume`, with errors that begin with ``what`` (the command that asked)."""
    if not run_dir.is_dir():
        raise ConfigError(f"{what} {run_dir}: not a directory; is it a run directory?")
    with _run_lock(run_dir):
        config_path = run_dir / CONFIG_FILE
        if not config_path.exists():
            raise ConfigError(f"{what} {run_dir}: no {CONFIG_FILE} there; is it a run directory?")
        config = load_config(config_path)
        ckpt = run_dir / CHECKPOINT_FILE
        if not ckpt.exists():
            raise ConfigError(
                f"{what} {run_dir}: no {CHECKPOINT_FILE} yet (the run stopped before its first "
                "checkpoint); start it again"
            )
        state = load_checkpoint(ckpt, config, echo=echo)
        _remove_stale_temporaries(run_dir)
        done, rounds = int(state["round"]), config.training.rounds
        if done >= rounds:
            echo(
                f"{run_dir}: the run is complete ({done} of {rounds} rounds); writing "
                f"{SUMMARY_FILE} and the plots from the checkpoint and {METRICS_FILE}"
            )
        else:
            echo(f"resuming {run_dir} at round {done + 1} of {rounds}")
        return _train(
            config, run_dir, state=state, progress=progress, stop_after=stop_after, echo=echo
        )


def summary_table(result: RunResult) -> str:
    """Return the end-of-run summary as aligned text."""
    lines = [
        f"run directory   {result.run_dir}",
        f"rounds          {result.rounds_done} of {result.rounds} "
        f"(mean {result.mean_participants:,.1f} reports per round)",
        f"training time   {result.seconds:,.1f} s ({result.seconds_per_round:.3f} s per round)",
    ]
    if result.test_accuracy is not None:
        lines.append(f"test accuracy   {result.test_accuracy:.2%}")
    g = result.guarantee
    if g:
        lower = g.get("epsilon_lower")
        bracket = f"; optimistic estimate {lower:.6g}" if lower is not None else ""
        lines.append(
            f"epsilon         {g['epsilon']:.6g} at delta={g['delta']:g} ({g['method']}{bracket})"
        )
        lines.append(f"guarantee       {g['neighbouring']}, unit of privacy: {g['unit']}")
        lines.append(f"sensitivity     {g['sensitivity']}")
        lines.extend(f"assumes         {a}" for a in g["assumptions"])
        lines.append(f"seed            {g['seed']}")
        if g.get("note"):
            lines.append(f"note            {g['note']}")
        if g.get("convention"):
            c = g["convention"]
            lines.append(f"convention      epsilon {c['epsilon']:.6g} with {c['sensitivity']}")
    lines.append("")
    labels = {name: result.labels.get(name, name) for name in result.epsilon}
    width = max(len(label) for label in labels.values())
    lines.append(f"{'accountant'.ljust(width)}  epsilon at delta={result.delta:g}")
    for name, eps in result.epsilon.items():
        lines.append(f"{labels[name].ljust(width)}  {eps:.6g}")
    if result.plots:
        lines.append("")
        lines.extend(f"plot            {p}" for p in result.plots if p.suffix == ".png")
    return "\n".join(lines)
