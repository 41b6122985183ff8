"""docs/extending.md's worked examples run as printed, so that the page cannot rot.

The page is cut into its ``## `` sections; each section's blocks whose info string is exactly
``python`` run in page order, in one namespace, in a fresh temporary directory. A block marked
``{ .python .notest }`` is shown only; any other Python-looking block is an error (it would
silently stop running). Each example asserts what it shows (two rounds and an ε for the
dataset, the same ε and half the step for the Flower strategy), so a broken example fails here
with the page's own line numbers in the traceback. The registries the examples add to are
restored after each section.
"""

from __future__ import annotations

import importlib.util
import os
import re
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from shuffle_experiments.datasets import DATASETS
from shuffle_experiments.models import MODELS

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "extending.md"
PAGE_NAME = "docs/extending.md"

#: A fenced block, possibly indented (in a list or an admonition): its indent, info string, body.
FENCE = re.compile(
    r"^(?P<indent> *)```(?P<info>[^\n`]*)\n(?P<body>.*?)^(?P=indent)```[ \t]*$", re.M | re.S
)
HEADING = re.compile(r"^## +(?P<title>.+?) *$", re.M)
#: An info string that looks like Python (and so must be exactly ``python`` or marked notest).
PYTHONISH = re.compile(r"\b(py|python\d*|pycon|ipython)\b", re.I)
#: What a section that needs Flower imports.
USES_FLOWER = re.compile(r"^\s*(from|import)\s+(flwr|shuffle_opacus\.flower)\b", re.M)
#: The switch with which tests/flower skips on purpose when flwr is missing (tests/flower/__init__).
SKIP_FLOWER_ENV = "SHUFFLE_OPACUS_SKIP_FLOWER"
#: The sections that must exist, and those that must hold a runnable example.
SECTIONS = (
    "Add a mechanism",
    "Add a sampler",
    "Add a dataset",
    "Add a model",
    "Add a Flower strategy",
)
RUNNABLE = SECTIONS  # every section holds an example that runs


@dataclass
class Block:
    """One fenced block: the page line its code starts on, its info string and its code."""

    line: int
    info: str
    code: str

    @property
    def runs(self) -> bool:
        """Whether the test runs it (info string exactly ``python``)."""
        return self.info == "python"

    @property
    def marked_notest(self) -> bool:
        """Whether it is marked as shown only."""
        return ".notest" in self.info.split()


@dataclass
class Section:
    """A ``## `` section of the page and its fenced blocks."""

    title: str
    blocks: list[Block] = field(default_factory=list)

    @property
    def runnable(self) -> list[Block]:
        """The blocks the test runs, in page order."""
        return [b for b in self.blocks if b.runs]


def parse(text: str) -> list[Section]:
    """Return the sections of ``text`` (blocks before the first ``## `` go to one untitled).

    Args:
        text: A Markdown page.

    Returns:
        The sections in page order.
    """
    headings = [(m.start(), m.group("title")) for m in HEADING.finditer(text)]
    sections = [Section("(before the first section)")] + [Section(t) for _, t in headings]
    starts = [h for h, _ in headings]
    for match in FENCE.finditer(text):
        index = sum(1 for s in starts if s < match.start())
        line = text.count("\n", 0, match.start("body")) + 1
        body = textwrap.dedent(match.group("body"))
        sections[index].blocks.append(Block(line, match.group("info").strip(), body))
    return [s for s in sections if s.blocks or s.title != sections[0].title]


def run_section(section: Section, filename: str = PAGE_NAME) -> dict[str, Any]:
    """Run ``section``'s runnable blocks in order in one namespace; return the namespace.

    Each block is compiled with the page's name and line numbers, so that a traceback points
    at the page.

    Args:
        section: The section.
        filename: The name tracebacks give.

    Returns:
        The namespace after the last block.

    Raises:
        Exception: whatever a block raises (an ``AssertionError`` of an example's checks).
    """
    namespace: dict[str, Any] = {"__name__": f"extending_docs_{section.title}"}
    for block in section.runnable:
        source = "\n" * (block.line - 1) + block.code
        exec(compile(source, filename, "exec"), namespace)  # noqa: S102 - the page's own examples
    return namespace


def _sections() -> list[Section]:
    return parse(PAGE.read_text(encoding="utf-8"))


@pytest.fixture
def registries() -> Iterator[None]:
    """Restore the registries the examples add to (the dataset and model registries)."""
    datasets, models = dict(DATASETS), dict(MODELS)
    try:
        yield
    finally:
        DATASETS.clear()
        DATASETS.update(datasets)
        MODELS.clear()
        MODELS.update(models)


def test_the_page_has_its_sections_and_examples():
    sections = {s.title: s for s in _sections()}
    missing = [title for title in SECTIONS if title not in sections]
    assert not missing, f"{PAGE_NAME} lacks the sections {missing}"
    empty = [title for title in RUNNABLE if not sections[title].runnable]
    assert not empty, f"{PAGE_NAME}: no runnable ```python block in {empty}"


def test_every_python_block_runs_or_is_marked_notest():
    unmarked = [
        f"{PAGE_NAME}:{block.line}: ```{block.info}"
        for section in _sections()
        for block in section.blocks
        if not block.runs and not block.marked_notest and PYTHONISH.search(block.info)
    ]
    assert not unmarked, "neither ```python (run) nor { .python .notest }: " + "; ".join(unmarked)


@pytest.mark.parametrize(
    "title", [s.title for s in _sections() if s.runnable], ids=lambda t: t.lower().replace(" ", "-")
)
def test_the_example_runs(title, tmp_path, monkeypatch, registries):
    (section,) = [s for s in _sections() if s.title == title]
    code = "\n".join(b.code for b in section.runnable)
    if USES_FLOWER.search(code) and importlib.util.find_spec("flwr") is None:
        if os.environ.get(SKIP_FLOWER_ENV) == "1":
            pytest.skip(f"flwr is not installed and {SKIP_FLOWER_ENV}=1")
        pytest.fail(
            f"{PAGE_NAME} '{title}' needs flwr: install the flower extra (pip install -e "
            f"'.[flower]'), or set {SKIP_FLOWER_ENV}=1 to skip the Flower examples on purpose."
        )
    monkeypatch.chdir(tmp_path)
    run_section(section)


PAGE_WITH_A_BROKEN_EXAMPLE = """\
# A page

## Works

```python
x = 2
```

Text between the blocks.

``` { .python .notest }
raise SystemExit("a block marked notest must not run")
```

```python
assert x == 2  # the second block sees the first block's names
y = x + 1
```

## Broken

```python
assert 1 + 1 == 3, "the example is wrong"
```
"""


def test_a_broken_example_fails_at_its_page_line():
    sections = {s.title: s for s in parse(PAGE_WITH_A_BROKEN_EXAMPLE)}
    assert [len(s.runnable) for s in sections.values()] == [2, 1]
    assert run_section(sections["Works"])["y"] == 3
    with pytest.raises(AssertionError, match="the example is wrong") as caught:
        run_section(sections["Broken"], filename="page.md")
    frame = caught.traceback[-1]
    assert (str(frame.path), frame.lineno + 1) == ("page.md", 23)


def test_an_unmarked_python_block_is_found():
    page = "## S\n\n```py\nx = 1\n```\n\n  ```python\n  y = 1\n  ```\n"
    (section,) = parse(page)
    assert [(b.line, b.info, b.runs) for b in section.blocks] == [
        (4, "py", False),
        (8, "python", True),
    ]
    assert section.blocks[1].code == "y = 1\n"
    assert not section.blocks[0].marked_notest and PYTHONISH.search(section.blocks[0].info)
