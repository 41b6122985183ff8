"""The import graph of shuffle_opacus: no circles, and docs/architecture.md tells it as it is.

The graph is read from the source by ``tests/import_graph.py`` (``ast``, nothing imported);
``python tests/import_graph.py --markdown`` prints the doc's floors, table and list of lazy
imports after a change.
"""

import re
import textwrap
from pathlib import Path

import pytest

from .import_graph import (
    FLOORS_MARKER,
    LAZY_MARKER,
    TABLE_HEADER,
    circle_path,
    circles,
    describe_circles,
    figures,
    markdown_floors,
    markdown_lazy,
    markdown_table,
    private_crossings,
)

DOC_PATH = Path(__file__).resolve().parents[1] / "docs" / "architecture.md"
REGENERATE = "print it again with `python tests/import_graph.py --markdown`"


@pytest.fixture(scope="module")
def found():
    return figures()


@pytest.fixture(scope="module")
def doc():
    return DOC_PATH.read_text(encoding="utf-8")


def _lines_after(text, first):
    """The lines after the line ``first`` up to the next blank line."""
    lines = text.splitlines()
    assert first in lines, f"docs/architecture.md lacks the line {first!r}"
    start = lines.index(first) + 1
    end = next((i for i in range(start, len(lines)) if not lines[i].strip()), len(lines))
    return lines[start:end]


def _ticked(cell):
    return re.findall(r"`([^`]+)`", cell)


def _parse_table(text):
    """Part -> (imports at run time, imports for type checkers only), from the table's rows."""
    table = {}
    for row in _lines_after(text, TABLE_HEADER):
        cells = [cell.strip() for cell in row.strip().strip("|").split("|")]
        if set(cells[0]) <= set("-: "):
            continue  # the separator row
        assert len(cells) == 3, f"a row of the import table needs three cells: {row!r}"
        for label in _ticked(cells[0]):
            part = label.removesuffix(".py").removesuffix("/")
            assert part not in table, f"{label} has two rows in the import table"
            table[part] = (set(_ticked(cells[1])), set(_ticked(cells[2])))
    return table


def _parse_lazy(text):
    """The (source, target, direction, floors) of each line of the list of lazy imports."""
    pattern = re.compile(r"- `(\S+)` → `(\S+)`, (up|down|level) \(floor (\d+) → (\d+)\), in (.+?):")
    listed = set()
    for line in _lines_after(text, f"<!-- {LAZY_MARKER} -->"):
        if line.startswith("- "):
            match = pattern.match(line)
            assert match, f"a line of the list of lazy imports reads otherwise: {line!r}"
            source, target, direction, low, high, where = match.groups()
            listed.add((source, target, direction, (int(low), int(high)), tuple(_ticked(where))))
    return listed


def _generated_lazy(found):
    return {(i.source, i.target, i.direction, i.floors, i.where) for i in found.lazy}


def test_no_import_circle_among_modules(found):
    # Module-level imports, TYPE_CHECKING ones included: a circle there is an import order that
    # works by luck, or a type checker's. Imports inside functions are left out.
    assert found.module_circles == [], "import circles:\n" + describe_circles(found.graph)


def test_no_import_circle_even_through_imports_inside_functions(found):
    # A circle closed by an import inside a function still ties its modules together: none.
    everything = {module: set() for module in found.modules}
    for edge in found.imports:
        everything[edge.source].add(edge.target)
    assert circles(everything) == [], "import circles:\n" + describe_circles(everything)


def test_no_import_circle_among_parts(found):
    # The doc's floors need it: a part imports only parts on lower floors.
    assert circles(found.parts) == [], "parts in a circle:\n" + describe_circles(found.parts)


def test_no_import_inside_a_function_points_up(found):
    # A lazy import up a floor would be a circle waiting for someone to move it to the top.
    up = [f"{i.source} -> {i.target} in {i.where}" for i in found.lazy if i.direction == "up"]
    assert up == [], "imports inside functions that point up:\n" + "\n".join(up)


def test_no_private_name_crosses_a_folder():
    # A name that starts with an underscore is its folder's own business.
    assert private_crossings() == []


def test_the_house_stays_small(found):
    # The layers as folders (docs/architecture.md): at most 15 parts on at most 8 floors.
    assert len(found.parts) <= 15, sorted(found.parts)
    assert max(found.floors.values()) + 1 <= 8, found.floors


def test_doc_table_is_the_import_graph(found, doc):
    table = _parse_table(doc)
    expected = {
        part: (targets - found.typing_only[part], found.typing_only[part])
        for part, targets in found.parts.items()
    }
    assert table.keys() == expected.keys(), (
        f"parts missing from the doc's table: {sorted(expected.keys() - table.keys())}; "
        f"parts that are no more: {sorted(table.keys() - expected.keys())}; {REGENERATE}"
    )
    wrong = {part: table[part] for part in table if table[part] != expected[part]}
    assert not wrong, "\n".join(
        [f"rows of the doc's import table that are out of date ({REGENERATE}):"]
        + [f"  {part}: the doc {wrong[part]}, the code {expected[part]}" for part in sorted(wrong)]
    )


def test_doc_floors_are_the_import_graph(found, doc):
    block = re.search(rf"<!-- {FLOORS_MARKER} -->\n```text\n(.*?)\n```", doc, re.S)
    assert block, f"docs/architecture.md lacks the floors after <!-- {FLOORS_MARKER} -->"
    assert block.group(1) == markdown_floors(found), (
        f"the doc's floors are out of date; {REGENERATE}"
    )


def test_doc_lists_the_lazy_imports_between_parts(found, doc):
    # Every import inside a function from one part to another, with its direction; the doc
    # says after each why it is inside a function.
    listed, expected = _parse_lazy(doc), _generated_lazy(found)
    assert listed == expected, (
        f"lazy imports the doc lacks: {sorted(expected - listed)}; "
        f"that are no more: {sorted(listed - expected)}; {REGENERATE}"
    )


def test_generated_markdown_passes_these_tests(found):
    # What `--markdown` prints is what the tests above accept.
    text = "\n\n".join(
        [
            f"<!-- {FLOORS_MARKER} -->\n```text\n{markdown_floors(found)}\n```",
            markdown_table(found),
            f"<!-- {LAZY_MARKER} -->\n{markdown_lazy(found)}",
        ]
    )
    table = _parse_table(text)
    assert {part: a | b for part, (a, b) in table.items()} == found.parts
    assert _parse_lazy(text) == _generated_lazy(found)


def _package(root, files):
    for name, source in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(source), encoding="utf-8")
    return figures(root)


def test_reader_resolves_imports(tmp_path):
    toy = _package(
        tmp_path / "pkg",
        {
            "__init__.py": "from . import a\n",
            "a.py": "from .sub import thing\nfrom . import b\n",
            "b.py": """
                from typing import TYPE_CHECKING

                import numpy

                if TYPE_CHECKING:
                    from .a import X
                else:
                    try:
                        from .sub import thing
                    except ImportError:
                        pass
                """,
            "c.py": """
                import pkg.sub.deep
                from pkg.sub import deep, name

                class C:
                    from . import a

                    @staticmethod
                    def f():
                        from . import VERSION
                        from .b import y
                """,
            "sub/__init__.py": "",
            "sub/deep.py": "from .. import c\nfrom ..b import y\n",
        },
    )
    assert {k: sorted(v) for k, v in toy.graph.items()} == {
        "pkg": ["pkg.a"],
        "pkg.a": ["pkg.b", "pkg.sub"],
        "pkg.b": ["pkg.a", "pkg.sub"],
        "pkg.c": ["pkg.a", "pkg.sub", "pkg.sub.deep"],
        "pkg.sub": [],
        "pkg.sub.deep": ["pkg.b", "pkg.c"],
    }
    typing = {(e.source, e.target) for e in toy.imports if e.typing}
    lazy = {(e.source, e.target) for e in toy.imports if e.lazy}
    assert typing == {("pkg.b", "pkg.a")}
    assert lazy == {("pkg.c", "pkg"), ("pkg.c", "pkg.b")}
    # a <-> b through a TYPE_CHECKING import is a circle, and so is c <-> sub.deep.
    assert toy.module_circles == [["pkg.a", "pkg.b"], ["pkg.c", "pkg.sub.deep"]]
    assert circle_path(toy.graph, ["pkg.c", "pkg.sub.deep"]) == ["pkg.c", "pkg.sub.deep", "pkg.c"]
    empty = set()
    assert toy.typing_only == {"__init__": empty, "a": empty, "b": {"a"}, "c": empty, "sub": empty}


def test_a_circle_fails_the_module_test(tmp_path):
    # An import inside a function that points up is no circle; at module level it is one.
    toy = _package(
        tmp_path / "pkg",
        {
            "__init__.py": "",
            "low.py": "def f():\n    from . import high\n",
            "high.py": "from .low import f\n",
        },
    )
    assert toy.module_circles == []
    assert [(i.source, i.target, i.direction) for i in toy.lazy] == [("low", "high", "up")]
    toy = _package(tmp_path / "pkg", {"low.py": "from . import high\n"})
    assert toy.module_circles == [["pkg.high", "pkg.low"]]
    with pytest.raises(AssertionError, match="pkg.high → pkg.low → pkg.high"):
        test_no_import_circle_among_modules(toy)
