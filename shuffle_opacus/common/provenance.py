"""Where a result came from: the package's version and commit, the libraries' versions, the config.

A reviewer who holds a run's ``summary.json`` can rebuild the environment that produced it from
:func:`provenance`'s record. Nothing here imports torch, Opacus or flwr: versions are read from
the installed distributions' metadata.
"""

from __future__ import annotations

import hashlib
import platform
import subprocess
from importlib import metadata
from pathlib import Path
from typing import Any

__all__ = ["LIBRARIES", "config_hash", "git_state", "provenance", "provenance_lines"]

#: Distributions whose versions every record carries (``None`` where not installed).
LIBRARIES: tuple[str, ...] = ("torch", "opacus", "dp-accounting", "numpy", "scipy", "flwr")

_ROOT = Path(__file__).resolve().parents[2]  # the checkout: common/ -> shuffle_opacus/ -> root


def _version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def git_state(root: Path = _ROOT) -> dict[str, Any] | None:
    """Return the commit and dirtiness of the checkout the package runs from, if any.

    Args:
        root: The directory holding the package (the repository root in a checkout).

    Returns:
        ``{"commit": sha, "dirty": bool}`` when ``root`` is a git work tree and git answers
        within 10 s, else ``None`` (an installed copy, or no git).
    """
    if not (root / ".git").exists():
        return None
    try:
        commit = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
        status = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return {"commit": commit, "dirty": bool(status.strip())}


def config_hash(text: str | bytes) -> str:
    """Return ``sha256:<hex>`` of a configuration's text (its bytes as written).

    Args:
        text: The configuration as text or bytes.

    Returns:
        The hash, prefixed with its algorithm.
    """
    data = text.encode() if isinstance(text, str) else bytes(text)
    return "sha256:" + hashlib.sha256(data).hexdigest()


def provenance(
    *, config_text: str | bytes | None = None, seed: int | None = None, seed_given: bool = False
) -> dict[str, Any]:
    """Return the record of where a result came from.

    Args:
        config_text: The run's configuration (hashed), or ``None``.
        seed: The seed the run used, or ``None``.
        seed_given: Whether the user gave the seed (else it was drawn).

    Returns:
        ``{"shuffle_opacus": version, "git": {...} or None, "python": version,
        "versions": {library: version or None}, "config_hash": ... or None, "seed": ...,
        "seed_given": ...}``.
    """
    from .version import __version__

    return {
        "shuffle_opacus": __version__,
        "git": git_state(),
        "python": platform.python_version(),
        "versions": {name: _version(name) for name in LIBRARIES},
        "config_hash": None if config_text is None else config_hash(config_text),
        "seed": seed,
        "seed_given": seed_given,
    }


def provenance_lines(record: dict[str, Any]) -> list[str]:
    """Return the record as the lines a header or ``--version`` prints.

    Args:
        record: A :func:`provenance` record.

    Returns:
        Two to four lines: the package with its commit, the libraries, then the config hash
        and the seed where the record has them.
    """
    git = record.get("git")
    where = "not a git checkout"
    if git:
        where = f"commit {git['commit'][:12]}{' (dirty tree)' if git['dirty'] else ''}"
    libs = ", ".join(f"{k} {v or 'absent'}" for k, v in record["versions"].items())
    lines = [
        f"shuffle-opacus {record['shuffle_opacus']} ({where}), Python {record['python']}",
        f"libraries: {libs}",
    ]
    if record.get("config_hash"):
        lines.append(f"config {record['config_hash']}")
    if record.get("seed") is not None:
        given = "given" if record.get("seed_given") else "drawn"
        lines.append(f"seed {record['seed']} ({given})")
    return lines
