"""The run's ``checkpoint.pt``: its layout, its checksum, and reading and writing it safely.

A checkpoint is one ``torch.save`` file of tensors and plain containers, read back with
``torch.load(weights_only=True)`` so that loading one from an untrusted source cannot run code.
Layout 3 (:data:`CHECKPOINT_FORMAT`, written by :func:`save_checkpoint`) adds two entries to
layout 2: ``checksum``, the SHA-256 of every other entry in a canonical encoding
(:func:`checksum`; content, not torch's serialisation, so it does not change with the torch
version), which :func:`load_checkpoint` verifies because torch's reader does not check the
bytes of the tensors; and ``epsilon_sha256``, the digest of the round and epsilon columns of
``metrics.csv``, so that a resume recognises an intact file. A layout 2 checkpoint cannot be
verified: it is refused unless the caller allows it explicitly (``allow_unsigned=True``; the
command's ``--allow-unsigned-checkpoint``), and then read with a one-line warning (its epsilon
columns are recomputed in full). :func:`comparable` gives the part of a config a checkpoint
must match.

The entries and the checks on resume: experiments/README.md (Checkpoints, "Check, then write").
"""

from __future__ import annotations

import hashlib
import io
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch

from .config import ConfigError, ExperimentConfig
from .files import CONFIG_FILE, write_file
from .renamed_keys import RENAMED

__all__ = [
    "CHECKPOINT_FORMAT",
    "checksum",
    "comparable",
    "load_checkpoint",
    "save_checkpoint",
]

#: Version of the checkpoint layout written by this version.
CHECKPOINT_FORMAT = 3
#: The previous layout: it has no checksum, so it is read only when explicitly allowed.
_UNSIGNED_FORMAT = 2
#: Config fields that may differ between a checkpoint and the run's config.yaml: where the run
#: executes, not what it computes.
PLACEMENT_FIELDS = ("device", "threads", "checkpoint_minutes")
#: ``data`` keys added with the dataset registry, and the value every earlier run had: left out
#: of the comparison while they hold it, so that a run started before them still resumes.
ADDED_DATA_KEYS: dict[str, Any] = {"name": "mnist", "path": None}
_KEYS: dict[str, type | tuple[type, ...]] = {
    "format": int,
    "config": dict,
    "round": int,
    "model": dict,
    "average": (dict, type(None)),
    "optimizer": dict,
    "accountant": dict,
    "noise_generator": torch.Tensor,
    "torch_rng": torch.Tensor,
    "cuda_rng": (list, type(None)),
    "seconds": float,
    "participants": int,
}
#: Entries that layout 3 adds.
_SIGNED_KEYS: dict[str, type | tuple[type, ...]] = {"checksum": str, "epsilon_sha256": str}


def comparable(config: ExperimentConfig) -> dict[str, Any]:
    """Return the config as plain data without the placement fields (:data:`PLACEMENT_FIELDS`).

    The ``data`` keys of :data:`ADDED_DATA_KEYS` are left out when they hold their value there.

    Args:
        config: A validated config.

    Returns:
        What a checkpoint stores as its ``config`` and is compared with ``config.yaml``.
    """
    out = config.model_dump(mode="json")
    for name in PLACEMENT_FIELDS:
        out["training"].pop(name, None)
    for key, value in ADDED_DATA_KEYS.items():
        if out["data"].get(key, value) == value:
            out["data"].pop(key, None)
    return out


def _renamed(stored: dict[str, Any]) -> dict[str, Any]:
    """Return a checkpoint's copy of the config with old key names under the new ones.

    A run checkpointed before ``privacy.accountants`` became ``privacy.curves`` stores the old
    name; the comparison with ``config.yaml`` (read under the new name) treats both alike. The
    checkpoint itself is left as it is (its checksum covers it).
    """
    out = dict(stored)
    for (section, old), new in RENAMED.items():
        body = out.get(section)
        if isinstance(body, dict) and old in body and new not in body:
            out[section] = {(new if key == old else key): value for key, value in body.items()}
    return out


def checksum(state: Mapping[str, Any]) -> str:
    """Return ``sha256:<hex>`` of every entry of ``state`` but ``checksum`` itself.

    The encoding is canonical: dict keys sorted, each value tagged with its type (``1``,
    ``1.0``, ``True`` and ``"1"`` differ), tensors by dtype, shape and raw bytes on the CPU.

    Args:
        state: A checkpoint's entries.

    Returns:
        The checksum string stored as the checkpoint's ``checksum``.

    Raises:
        TypeError: for a value that is not a tensor or plain container (never in a checkpoint
            read with ``weights_only=True``).
    """
    digest = hashlib.sha256()
    _feed(digest, {key: value for key, value in state.items() if key != "checksum"})
    return f"sha256:{digest.hexdigest()}"


def _feed(digest: Any, value: Any) -> None:
    """Add ``value`` to ``digest`` in the canonical encoding of :func:`checksum`."""
    if isinstance(value, torch.Tensor):
        tensor = value.detach().to("cpu").contiguous()
        digest.update(f"T{tensor.dtype}{tuple(tensor.shape)}:".encode())
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy())
    elif isinstance(value, Mapping):
        digest.update(f"D{len(value)}:".encode())
        for key in sorted(value, key=lambda k: (type(k).__name__, repr(k))):
            _feed(digest, key)
            _feed(digest, value[key])
    elif isinstance(value, (list, tuple)):
        digest.update(f"{type(value).__name__}{len(value)}:".encode())
        for item in value:
            _feed(digest, item)
    elif isinstance(value, (str, bytes)):
        raw = value.encode("utf-8") if isinstance(value, str) else value
        digest.update(f"{type(value).__name__}{len(raw)}:".encode() + raw)
    elif value is None or isinstance(value, (bool, int, float, torch.dtype, torch.device)):
        digest.update(f"{type(value).__name__}:{value!r};".encode())
    else:
        raise TypeError(f"a checkpoint cannot hold {type(value).__name__}")


def save_checkpoint(state: Mapping[str, Any], path: Path) -> None:
    """Write ``state`` with its checksum to ``path`` through a temporary file and a rename.

    The state is serialised in memory first, so that a failing write (a full disk) is an
    ``OSError`` with its cause rather than an error of torch's zip writer.

    Args:
        state: The checkpoint's entries (without ``checksum``; it is added here).
        path: The ``checkpoint.pt`` file.

    Raises:
        RunFileError: naming ``path`` and the cause; the temporary file is removed and the
            previous ``path`` is left as it was.
    """
    sealed = {**state, "checksum": checksum(state)}
    buffer = io.BytesIO()
    torch.save(sealed, buffer)
    write_file(path, buffer.getvalue(), note="; the previous checkpoint is unchanged")


def load_checkpoint(
    path: Path,
    config: ExperimentConfig,
    *,
    echo: Callable[[str], None] = print,
    allow_unsigned: bool = False,
) -> dict[str, Any]:
    """Read a checkpoint safely, verify its checksum and check that it belongs to ``config``.

    The file is read with ``torch.load(weights_only=True)`` (no code can run), its checksum
    verified (layout 2 has none: refused unless ``allow_unsigned``, then loaded with a warning),
    its layout, its round and its copy of the config (all fields but the placement fields
    :data:`PLACEMENT_FIELDS`) checked against ``config``, the run's ``config.yaml``.

    Args:
        path: The ``checkpoint.pt`` file.
        config: The run's config.
        echo: Where the warning about a checkpoint without checksum goes.
        allow_unsigned: Read a layout 2 checkpoint (no checksum: an edited weight, round or
            accountant state would go unnoticed) instead of refusing it.

    Returns:
        The checkpoint's entries.

    Raises:
        ConfigError: one line naming the file, for a file that is truncated, corrupted (fails
            its checksum), unsigned (layout 2) without ``allow_unsigned``, holds other objects,
            has another layout or belongs to another config.
    """
    try:
        with warnings.catch_warnings():  # e.g. a foreign pickle protocol, refused just below
            warnings.simplefilter("ignore")
            state = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise ConfigError(f"checkpoint {path} does not exist") from None
    except Exception as exc:  # noqa: BLE001 - every failure of the reader becomes one line
        if "GLOBAL" in str(exc):  # the weights-only unpickler met a class or function
            raise ConfigError(
                f"checkpoint {path} holds objects other than tensors and plain containers; "
                "refusing to load it (unpickling it could run code)"
            ) from None
        raise ConfigError(
            f"checkpoint {path} is truncated, corrupted or not a checkpoint "
            f"({type(exc).__name__}); resume from an intact copy or start the run again"
        ) from None
    if not isinstance(state, dict):
        raise ConfigError(f"checkpoint {path} is not a checkpoint of this experiment")
    layout = state.get("format")
    if layout not in (CHECKPOINT_FORMAT, _UNSIGNED_FORMAT):
        raise ConfigError(
            f"checkpoint {path} has layout {layout!r}, this version reads layout "
            f"{CHECKPOINT_FORMAT} (and {_UNSIGNED_FORMAT}); start the run again"
        )
    _verify(state, path, echo, allow_unsigned)
    keys = {**_KEYS, **(_SIGNED_KEYS if layout == CHECKPOINT_FORMAT else {})}
    for key, kind in keys.items():
        if key not in state or not isinstance(state[key], kind):
            raise ConfigError(f"checkpoint {path} is not a checkpoint of this experiment ({key})")
    if _renamed(state["config"]) != comparable(config):
        raise ConfigError(
            f"checkpoint {path} was written for a different config than "
            f"{path.with_name(CONFIG_FILE)}; restore that config or start a new run"
        )
    if not 0 < state["round"] <= config.training.rounds:
        raise ConfigError(
            f"checkpoint {path} is at round {state['round']}, outside 1..{config.training.rounds}"
        )
    return state


def _verify(
    state: dict[str, Any], path: Path, echo: Callable[[str], None], allow_unsigned: bool
) -> None:
    """Check the checksum of a checkpoint's entries (see :func:`load_checkpoint`).

    Raises:
        ConfigError: one line naming the file, if the checksum is missing (layout 3, or layout
            2 without ``allow_unsigned``) or wrong.
    """
    stored = state.get("checksum")
    if stored is None and state["format"] == _UNSIGNED_FORMAT:
        if allow_unsigned is not True:
            raise ConfigError(
                f"checkpoint {path} has no checksum (layout {_UNSIGNED_FORMAT}, written by an "
                f"earlier version), so an edit to it cannot be detected; refusing to resume "
                f"from it unless you pass --allow-unsigned-checkpoint (allow_unsigned=True)"
            )
        echo(
            f"checkpoint {path} has no checksum (layout {_UNSIGNED_FORMAT}, written by an "
            f"earlier version): loaded without verifying it; the next checkpoint carries one"
        )
        return
    try:
        actual = checksum(state)
    except TypeError:
        actual = None
    if stored is None or actual != stored:
        raise ConfigError(
            f"checkpoint {path} fails its checksum (SHA-256 of its contents): it is corrupted or "
            f"was edited; resume from an intact copy or start the run again"
        )
