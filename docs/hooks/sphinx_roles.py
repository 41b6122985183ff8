"""Griffe extension: the reStructuredText habits of the docstrings, made Markdown.

The docstrings name other objects with Sphinx roles (``:func:`make_private```,
``:mod:`.shuffler```), which Markdown would print literally: for the API reference each role
becomes inline code of its target (``~`` and a leading ``.`` dropped). A paragraph that
introduces a literal block ends in ``::``; it ends in ``:`` here (the indented block below it
is a code block in Markdown as well).
"""

from __future__ import annotations

import re
from typing import Any

from griffe import Extension, Object

_ROLE = re.compile(r":(?:py:)?(?:func|class|meth|mod|data|attr|exc|obj|const):`~?\.?([^`]+)`")
_LITERAL = re.compile(r"(?<=\S)::$", re.M)


class SphinxRolesAsCode(Extension):
    """Show roles as inline code and end literal-block introductions in one colon."""

    def on_instance(self, *, obj: Object, **kwargs: Any) -> None:
        """Rewrite the docstring of ``obj``, if it has one.

        Args:
            obj: The object Griffe has just loaded.
            **kwargs: The other arguments Griffe passes (unused).
        """
        if obj.docstring is not None:
            text = _ROLE.sub(r"`\1`", obj.docstring.value)
            obj.docstring.value = _LITERAL.sub(":", text)
