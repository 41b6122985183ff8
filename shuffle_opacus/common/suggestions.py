"""Did-you-mean suggestions for mistyped flags, choices and keys (difflib)."""

from __future__ import annotations

import argparse
import difflib
import re
from collections.abc import Iterable

__all__ = ["argparse_suggestion", "did_you_mean"]


def did_you_mean(word: str, options: Iterable[str]) -> str:
    """Return ``" (did you mean X?)"`` for the closest of ``options``, or ``""`` if none is close.

    Args:
        word: What the user typed.
        options: The names it may have meant.

    Returns:
        The suffix to append to an error message.
    """
    close = difflib.get_close_matches(word, sorted(set(options)), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _option_strings(parser: argparse.ArgumentParser) -> list[str]:
    """Every option string of ``parser`` and of its subcommands."""
    found: list[str] = []
    for action in parser._actions:
        found.extend(action.option_strings)
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                found.extend(_option_strings(sub))
    return found


def argparse_suggestion(parser: argparse.ArgumentParser, message: str) -> str:
    """Return a did-you-mean suffix for an argparse error message, or ``""``.

    Handles ``unrecognized arguments: ...`` (each mistyped flag against every flag of the parser
    and its subcommands) and ``invalid choice: 'x' (choose from ...)``.

    Args:
        parser: The parser that raised the error.
        message: Its message.

    Returns:
        The suffix to append to the message.
    """
    if message.startswith("unrecognized arguments:"):
        known = sorted(set(_option_strings(parser)))
        hints = []
        for word in message.split(":", 1)[1].split():
            flag = word.split("=", 1)[0]
            if flag.startswith("-"):
                close = difflib.get_close_matches(flag, known, n=1, cutoff=0.6)
                if close:
                    hints.append(f"{close[0]} for {flag}")
        return f" (did you mean {', '.join(hints)}?)" if hints else ""
    choice = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)", message)
    if choice:
        options = [c.strip(" '") for c in choice.group(2).split(",")]
        return did_you_mean(choice.group(1), options)
    return ""
