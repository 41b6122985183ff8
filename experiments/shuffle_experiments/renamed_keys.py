"""Config keys renamed for what they hold, still read under their old names for one release.

``privacy.accountants`` is now ``privacy.curves``: it lists the epsilon curves a run reports
(methods such as ``pld`` and ``proven``, the references ``no-shuffle`` and ``central``, the
``clones`` baseline), not accountants. A config that still uses the old name gives the same
run with one note (:class:`ConfigDeprecationWarning`, shown by the command line as one line);
a config that gives both names is refused in one line. A ``--set`` of either name replaces the
list, whichever name the file gives it.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, MutableMapping, Sequence
from typing import Any

from .yaml_files import ConfigError

__all__ = ["RENAMED", "ConfigDeprecationWarning", "rename_old_keys", "renamed_path"]

#: ``(section, old key)`` -> new key.
RENAMED: dict[tuple[str, str], str] = {("privacy", "accountants"): "curves"}


class ConfigDeprecationWarning(FutureWarning):
    """A config uses the old name of a renamed key; the run is the same as under the new name."""


def _note(section: str, old: str, new: str) -> str:
    return (
        f"{section}.{old} is the old name of {section}.{new} (the same list, the same run); "
        f"rename it to {section}.{new}: the old name is read for one more release"
    )


def rename_old_keys(raw: Mapping[str, Any]) -> dict[str, Any]:
    """Return a copy of a parsed config with every old key under its new name.

    Args:
        raw: The parsed config (a mapping of sections).

    Returns:
        The copy (sections without an old key are shared, not copied).

    Raises:
        ConfigError: one line, when a section gives both the old and the new name.
    """
    out = dict(raw)
    for (section, old), new in RENAMED.items():
        body = out.get(section)
        if not isinstance(body, Mapping) or old not in body:
            continue
        if new in body:
            raise ConfigError(
                f"{section}.{old} and {section}.{new} are both given; keep {section}.{new} only "
                f"({section}.{old} is its old name)"
            )
        warnings.warn(_note(section, old, new), ConfigDeprecationWarning, stacklevel=2)
        out[section] = {(new if key == old else key): value for key, value in body.items()}
    return out


def renamed_path(path: Sequence[str], raw: MutableMapping[str, Any]) -> list[str]:
    """Return the key path of a ``--set`` under the new names.

    The override replaces the list whatever the file calls it: the file's old key is dropped
    from ``raw`` when the override names either key.

    Args:
        path: The override's key, split at the dots.
        raw: The config being overridden (changed in place).

    Returns:
        The path with a renamed key under its new name.
    """
    out = list(path)
    if len(out) < 2:
        return out
    for (section, old), new in RENAMED.items():
        if out[0] != section or out[1] not in (old, new):
            continue
        if out[1] == old:
            warnings.warn(_note(section, old, new), ConfigDeprecationWarning, stacklevel=2)
            out[1] = new
        body = raw.get(section)
        if isinstance(body, MutableMapping):
            body.pop(old, None)
    return out
