"""The ``shuffle-opacus`` parser's pieces: one-line errors, typed flags and ``--version``."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from ..accounting.protocols import SENSITIVITIES, resolve_sensitivity
from ..common.suggestions import argparse_suggestion
from ..common.validation import check_target_delta

T = TypeVar("T")


class CliError(Exception):
    """A user error to be reported on one line."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise CliError(message + argparse_suggestion(self, message))


def _typed(name: str, convert: Callable[[str, str], T]) -> Callable[[str], T]:
    """Wrap ``convert(label, text)`` as an argparse ``type`` that reports one-line errors."""

    def parse(text: str) -> T:
        try:
            return convert(name, text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    parse.__name__ = name
    return parse


def _int_arg(name: str, minimum: int = 1) -> Callable[[str], int]:
    def convert(label: str, text: str) -> int:
        try:
            value = float(text)
        except ValueError:
            value = float("nan")
        if not value.is_integer() or value < minimum:
            raise ValueError(f"{label} must be an integer >= {minimum}. Found {text!r}.")
        return int(value)

    return _typed(name, convert)


def _float_arg(name: str, checker: Callable[[str, object], float]) -> Callable[[str], float]:
    def convert(label: str, text: str) -> float:
        try:
            return checker(label, float(text))
        except ValueError as exc:
            # Report what the user typed, not the parsed float.
            head = str(exc).rsplit(" Found ", 1)[0]
            raise ValueError(f"{head} Found {text!r}.") from None

    return _typed(name, convert)


def _delta_arg() -> Callable[[str], float]:
    return _float_arg("--delta", lambda label, v: check_target_delta(v, label))


def _sensitivity_arg(text: str) -> float:
    try:
        return resolve_sensitivity(text if text in SENSITIVITIES else float(text))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--sensitivity must be replace-one, paper or a number in [1, 2]. Found {text!r}."
        ) from None


def _choices(values: Sequence[str]) -> str:
    return ", ".join(values)


class _VersionAction(argparse.Action):
    """``--version``: the provenance lines (version, commit, libraries), then exit 0."""

    def __init__(self, option_strings: list[str], dest: str, help: str | None = None) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, help=help)

    def __call__(self, parser: argparse.ArgumentParser, *args: Any, **kwargs: Any) -> None:
        from ..common.provenance import provenance, provenance_lines

        print("\n".join(provenance_lines(provenance())))
        parser.exit(0)
