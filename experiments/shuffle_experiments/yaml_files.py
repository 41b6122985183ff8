"""Reading the experiment's YAML: one-line errors, no duplicate keys, bounded nesting.

:class:`ConfigError` is the one-line error of every config problem; :mod:`.config` re-exports
it with the schema that uses it.
"""

from __future__ import annotations

from typing import Any

import yaml

__all__ = ["MAX_YAML_DEPTH", "ConfigError"]


class ConfigError(ValueError):
    """An invalid config; the message is one line naming the field."""


MAX_YAML_DEPTH = 32


class _UniqueKeyLoader(yaml.SafeLoader):
    """YAML's safe loader, refusing repeated keys and documents nested too deep.

    A mapping that repeats a key (YAML would keep the last) and a document nested deeper than
    :data:`MAX_YAML_DEPTH` are refused with a :class:`ConfigError`.
    """

    _depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        """Compose one node, counting the nesting (PyYAML recurses once per level)."""
        if self._depth >= MAX_YAML_DEPTH:
            line = self.peek_event().start_mark.line + 1
            raise ConfigError(
                f"nests deeper than the {MAX_YAML_DEPTH} levels allowed (line {line})"
            )
        self._depth += 1
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


def _unique_mapping(loader: _UniqueKeyLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    seen: set[Any] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node)
        if not isinstance(key, (str, int, float, bool)):
            continue  # an unhashable key is left to the schema's own error
        if key in seen:
            raise ConfigError(f"key {key!r} appears twice (line {key_node.start_mark.line + 1})")
        seen.add(key)
    return loader.construct_mapping(node)


_UniqueKeyLoader.add_constructor(
    yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG,
    _unique_mapping,  # type: ignore[arg-type]
)


def _parse_yaml(text: str, what: str) -> Any:
    """Parse YAML text with :class:`_UniqueKeyLoader`; a problem is one ConfigError line."""
    try:
        return yaml.load(text, Loader=_UniqueKeyLoader)  # a SafeLoader: no Python objects
    except ConfigError as exc:
        raise ConfigError(f"{what}: {exc}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise ConfigError(f"{what} is not valid YAML{where}") from None
