"""An on-disk cache of per-round privacy loss distributions (numpy arrays and a few scalars).

Building one round's PMF (its dominating pair, the connect-the-dots PMF, its Chernoff moments)
takes most of an everyday ``shuffle-opacus account`` query; the same settings come back again
and again while a user explores. Entries are kept in the user's cache directory:

* ``$SHUFFLE_OPACUS_CACHE_DIR`` if set (the value ``off`` switches the cache off), else
  ``$XDG_CACHE_HOME/shuffle_opacus``, else ``~/.cache/shuffle_opacus``;
* one file per entry, named by the SHA-256 of its full key: the caller's parameters, the
  caller's code version (bumped whenever the construction changes), this module's format, the
  package's version, the versions of numpy, scipy and dp_accounting, and a digest of the source
  files that build the entry (so an edited construction never reads an old entry);
* written to a temporary file in the same directory and moved into place with ``os.replace``,
  so concurrent writers of one key leave one whole file;
* checked on every read (magic, SHA-256 of header and payload, the full key, each array's
  bounds): a corrupt, truncated or foreign file is ignored, rebuilt and overwritten, never read
  as a number;
* bounded: after each write the least recently used entries beyond the cap (1 GiB, or
  ``$SHUFFLE_OPACUS_CACHE_MAX_BYTES``) are removed.

The cache stores what a deterministic computation returned and hands back the same bits, so a
result never depends on whether it was cached. Only files named like an entry (``*.npcache``,
or this module's temporary files) are ever removed, so the variable may point at any directory.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import struct
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeAlias

import numpy as np

__all__ = [
    "ENV_DIR",
    "ENV_MAX_BYTES",
    "FORMAT_VERSION",
    "MAX_BYTES",
    "Entry",
    "cache_directory",
    "max_bytes",
    "load",
    "store",
    "cached",
    "clear",
]

ENV_DIR = "SHUFFLE_OPACUS_CACHE_DIR"
"""Environment variable: the cache directory, or ``off`` to switch the cache off."""

ENV_MAX_BYTES = "SHUFFLE_OPACUS_CACHE_MAX_BYTES"
"""Environment variable: the cache's size cap in bytes (integer >= 0; 0 keeps nothing)."""

MAX_BYTES = 1 << 30
"""Default size cap of the cache directory's entries (1 GiB)."""

FORMAT_VERSION = 1
"""Layout of an entry file; part of every key."""

SUFFIX = ".npcache"
_MAGIC = b"SOCACHE1"
_HEAD = struct.Struct("<8s32sQ")  # magic, SHA-256 of the rest, header length
_ALIGN = 64
_DTYPES = frozenset({"<f8", "<i8", "<c16", "|b1"})
_KIND = re.compile(r"[a-z0-9][a-z0-9-]{0,63}")
_STALE_TEMP_SECONDS = 3600.0
_PACKAGE = Path(__file__).resolve().parents[2]  # the shuffle_opacus package directory

KeyValue: TypeAlias = None | bool | int | float | str | Sequence["KeyValue"]
"""A key's value: JSON-like (sequences of them too); floats are keyed bit for bit."""
Scalar: TypeAlias = None | bool | int | float | str
"""A cached scalar."""


@dataclass(frozen=True)
class Entry:
    """One cached value: named arrays (read-only) and named scalars.

    Attributes:
        arrays: Arrays by name (float64, int64, complex128 or bool).
        scalars: ``None``, booleans, integers, floats (bit-exact) or strings, by name.
    """

    arrays: Mapping[str, np.ndarray]
    scalars: Mapping[str, Scalar]


def cache_directory() -> Path | None:
    """Return the cache directory, or ``None`` when the cache is switched off.

    ``$SHUFFLE_OPACUS_CACHE_DIR`` (``off``, in any case, switches it off; an empty value is as
    if unset), else ``$XDG_CACHE_HOME/shuffle_opacus`` (an absolute path), else
    ``~/.cache/shuffle_opacus``. The directory is created on the first write.

    Returns:
        The directory, or ``None`` (also when there is no home directory to put it in).
    """
    chosen = os.environ.get(ENV_DIR, "").strip()
    if chosen.lower() == "off":
        return None
    if chosen:
        return Path(chosen).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME", "").strip()
    if xdg and os.path.isabs(xdg):
        return Path(xdg) / "shuffle_opacus"
    try:
        home = Path.home()
    except (RuntimeError, KeyError):  # no home directory to be found: no cache
        return None
    return home / ".cache" / "shuffle_opacus"


def max_bytes() -> int:
    """Return the cache's size cap in bytes (:data:`MAX_BYTES` unless the variable is set).

    Raises:
        ValueError: if ``$SHUFFLE_OPACUS_CACHE_MAX_BYTES`` is not an integer >= 0.
    """
    text = os.environ.get(ENV_MAX_BYTES, "").strip()
    if not text:
        return MAX_BYTES
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise ValueError(f"{ENV_MAX_BYTES} must be an integer >= 0. Found {text!r}.")
    return value


@functools.cache
def _library_versions() -> tuple[str, str, str]:
    import importlib.metadata

    import scipy

    try:
        dp_accounting = importlib.metadata.version("dp-accounting")
    except importlib.metadata.PackageNotFoundError:  # pragma: no cover - a required dependency
        dp_accounting = "unknown"
    return np.__version__, scipy.__version__, dp_accounting


@functools.cache
def _source_digest(sources: tuple[str, ...]) -> str | None:
    """SHA-256 of the named source files (folders: their ``*.py``), or ``None`` if unreadable."""
    digest = hashlib.sha256()
    try:
        for name in sources:
            path = _PACKAGE / name
            files = sorted(path.glob("*.py")) if path.is_dir() else [path]
            if not files:
                return None
            for file in files:
                digest.update(file.relative_to(_PACKAGE).as_posix().encode())
                digest.update(b"\0" + file.read_bytes() + b"\0")
    except (OSError, ValueError):
        return None
    return digest.hexdigest()


def _plain(value: object) -> object:
    """Check a key value and return it in JSON form (sequences become lists)."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return float(value)  # json writes repr(value): every float round-trips bit for bit
    if isinstance(value, np.bool_):
        return bool(value)
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.floating):
        return float(value)  # exact: every float32 is a float64
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    raise TypeError(
        f"key values must be None, bool, int, float, str or sequences of them. Found "
        f"{type(value).__name__}."
    )


def _key_text(
    kind: str, version: int, key: Mapping[str, KeyValue], sources: Sequence[str]
) -> str | None:
    if not _KIND.fullmatch(kind):
        raise ValueError(f"kind must match {_KIND.pattern}. Found {kind!r}.")
    source = _source_digest(tuple(sources))
    if source is None:
        return None
    from ...common.version import __version__

    record = {
        "kind": kind,
        "version": int(version),
        "format": FORMAT_VERSION,
        "package": __version__,
        "libraries": list(_library_versions()),
        "sources": source,
        "key": {str(k): _plain(v) for k, v in key.items()},
    }
    return json.dumps(record, sort_keys=True, separators=(",", ":"))


def _path(directory: Path, kind: str, text: str) -> Path:
    return directory / f"{kind}-{hashlib.sha256(text.encode()).hexdigest()[:40]}{SUFFIX}"


def _encode(text: str, arrays: Mapping[str, np.ndarray], scalars: Mapping[str, Scalar]) -> bytes:
    layout: list[list[object]] = []
    chunks: list[bytes] = []
    offset = 0
    for name, array in arrays.items():
        value = np.asarray(array)
        if value.dtype.str not in _DTYPES:
            raise TypeError(f"array {name!r} has dtype {value.dtype}; cached arrays are {_DTYPES}.")
        data = np.ascontiguousarray(value).tobytes()
        layout.append([str(name), value.dtype.str, list(value.shape), offset, len(data)])
        chunks.append(data)
        pad = (-len(data)) % _ALIGN
        chunks.append(b"\0" * pad)
        offset += len(data) + pad
    for name, scalar in scalars.items():
        if scalar is not None and not isinstance(scalar, (bool, int, float, str)):
            raise TypeError(f"scalar {name!r} is a {type(scalar).__name__}; see Entry.")
    header = json.dumps(
        {"key": text, "scalars": dict(scalars), "arrays": layout}, separators=(",", ":")
    ).encode()
    header += b" " * ((-(_HEAD.size + len(header))) % _ALIGN)
    length = struct.pack("<Q", len(header))
    payload = b"".join(chunks)
    digest = hashlib.sha256(length + header + payload).digest()
    return _HEAD.pack(_MAGIC, digest, len(header)) + header + payload


def _decode(data: bytes, text: str) -> Entry | None:
    """Return the entry held by ``data`` if it is whole and has key ``text``, else ``None``."""
    if len(data) < _HEAD.size:
        return None
    magic, digest, length = _HEAD.unpack_from(data)
    if magic != _MAGIC or _HEAD.size + length > len(data):
        return None
    view = memoryview(data)
    hasher = hashlib.sha256(view[_HEAD.size - 8 : _HEAD.size])
    hasher.update(view[_HEAD.size :])
    if hasher.digest() != digest:
        return None
    header = json.loads(bytes(view[_HEAD.size : _HEAD.size + length]))
    if not isinstance(header, dict) or header.get("key") != text:
        return None
    start = _HEAD.size + length
    arrays: dict[str, np.ndarray] = {}
    for name, dtype, shape, offset, nbytes in header["arrays"]:
        if dtype not in _DTYPES or offset < 0 or start + offset + nbytes > len(data):
            return None
        kind = np.dtype(dtype)
        count = int(np.prod(shape, dtype=np.int64))
        if count * kind.itemsize != nbytes:
            return None
        array = np.frombuffer(data, dtype=kind, count=count, offset=start + offset)
        arrays[str(name)] = array.reshape(shape)
    scalars = header["scalars"]
    if not isinstance(scalars, dict):
        return None
    return Entry(arrays=arrays, scalars=scalars)


def load(
    kind: str, version: int, key: Mapping[str, KeyValue], *, sources: Sequence[str]
) -> Entry | None:
    """Return the cached entry of ``key``, or ``None`` (a miss, the cache off, a bad file).

    A hit marks the entry as recently used (its modification time), for the size cap.

    Args:
        kind: The entry's family (lowercase letters, digits and ``-``; starts the file name).
        version: The caller's code version: bump it whenever the construction changes.
        key: The full parameters the entry is a function of.
        sources: Source files and folders (relative to the ``shuffle_opacus`` package) whose
            code builds the entry; their digest is part of the key.

    Returns:
        The entry, with read-only arrays, or ``None``.

    Raises:
        ValueError: on a malformed ``kind``.
        TypeError: on a key value of another type than :data:`KeyValue`.
    """
    directory = cache_directory()
    text = _key_text(kind, version, key, sources)
    if directory is None or text is None:
        return None
    path = _path(directory, kind, text)
    try:
        data = path.read_bytes()
    except OSError:
        return None
    try:
        entry = _decode(data, text)
    except (ValueError, TypeError, KeyError, IndexError, struct.error, RecursionError):
        return None
    if entry is not None:
        try:
            os.utime(path)
        except OSError:
            pass
    return entry


def store(
    kind: str,
    version: int,
    key: Mapping[str, KeyValue],
    arrays: Mapping[str, np.ndarray],
    scalars: Mapping[str, Scalar],
    *,
    sources: Sequence[str],
) -> bool:
    """Write an entry (atomically), then trim the cache to its size cap.

    Args:
        kind: See :func:`load`.
        version: See :func:`load`.
        key: See :func:`load`.
        arrays: Arrays by name (float64, int64, complex128 or bool).
        scalars: Scalars by name (``None``, bool, int, float or str).
        sources: See :func:`load`.

    Returns:
        Whether the entry was written (not when the cache is off, the entry is larger than the
        cap, or the directory cannot be written: a cache never stops a computation).

    Raises:
        ValueError: on a malformed ``kind`` or ``$SHUFFLE_OPACUS_CACHE_MAX_BYTES``.
        TypeError: on a key, array or scalar of an unsupported type.
    """
    directory = cache_directory()
    text = _key_text(kind, version, key, sources)
    if directory is None or text is None:
        return False
    cap = max_bytes()
    data = _encode(text, arrays, scalars)
    if len(data) > cap:
        return False
    try:
        directory.mkdir(parents=True, exist_ok=True)
        handle, temporary = tempfile.mkstemp(dir=directory, prefix=".", suffix=".tmp")
    except OSError:
        return False
    try:
        with os.fdopen(handle, "wb") as out:
            out.write(data)
        os.replace(temporary, _path(directory, kind, text))
    except OSError:
        try:
            os.unlink(temporary)
        except OSError:
            pass
        return False
    _trim(directory, cap)
    return True


def cached(
    kind: str,
    version: int,
    key: Mapping[str, KeyValue],
    build: Callable[[], Entry],
    *,
    sources: Sequence[str],
) -> Entry:
    """Return the cached entry of ``key``, or build, store and return it.

    Args:
        kind: See :func:`load`.
        version: See :func:`load`.
        key: See :func:`load`.
        build: Computes the entry on a miss (exceptions propagate; nothing is stored then).
        sources: See :func:`load`.

    Returns:
        The entry (bit for bit what ``build`` returns).
    """
    entry = load(kind, version, key, sources=sources)
    if entry is None:
        entry = build()
        store(kind, version, key, entry.arrays, entry.scalars, sources=sources)
    return entry


def _is_temporary(name: str) -> bool:
    return name.startswith(".") and name.endswith(".tmp")


def _trim(directory: Path, cap: int) -> None:
    """Remove the least recently used entries while the total exceeds ``cap`` (and old temps)."""
    entries: list[tuple[float, int, str]] = []
    now = time.time()
    try:
        with os.scandir(directory) as scan:
            for item in scan:
                try:
                    if not item.is_file(follow_symlinks=False):
                        continue
                    info = item.stat(follow_symlinks=False)
                except OSError:
                    continue
                if item.name.endswith(SUFFIX):
                    entries.append((info.st_mtime, info.st_size, item.path))
                elif _is_temporary(item.name) and now - info.st_mtime > _STALE_TEMP_SECONDS:
                    _unlink(item.path)  # left by a writer that died
    except OSError:
        return
    total = sum(size for _, size, _ in entries)
    for _, size, path in sorted(entries):
        if total <= cap:
            break
        if _unlink(path):
            total -= size


def _unlink(path: str) -> bool:
    try:
        os.unlink(path)
    except FileNotFoundError:
        return True
    except OSError:
        return False
    return True


def clear() -> int:
    """Remove every entry of the cache directory (nothing else); return how many.

    Returns:
        The number of entry files removed (0 when the cache is off or empty).
    """
    directory = cache_directory()
    if directory is None:
        return 0
    removed = 0
    try:
        with os.scandir(directory) as scan:
            names = [item.path for item in scan if item.name.endswith(SUFFIX)]
    except OSError:
        return 0
    for path in names:
        if os.path.isfile(path) and _unlink(path):
            removed += 1
    return removed
