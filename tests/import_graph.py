"""The imports between the modules of ``shuffle_opacus``, read from the source with ``ast``.

Nothing is imported: every ``shuffle_opacus/**/*.py`` is parsed, its ``import`` and
``from ... import`` statements are resolved (relative ones against the module's package) and
those that name a module of the package become edges. Two kinds:

* **module level**: run when the module is imported, including those under
  ``if TYPE_CHECKING:`` (``Import.typing``), and those in class bodies, ``try`` or ``if``;
* **lazy**: inside a function, run when the function is first called.

``from . import x`` goes to the submodule ``x`` when there is one, else to the package's
``__init__.py``; ``import a.b.c`` goes to ``a.b.c`` (the parent packages it also runs are not
edges). The string names of ``_lazy.lazy_exports`` are not edges: each package that uses them
imports the same names under ``if TYPE_CHECKING:``.

The *parts* are those of docs/architecture.md's import table: each top-level module
(``protocols.py``; the package's own ``__init__.py`` is ``__init__``) and each top-level
subpackage (``analysis/``, ``clipping/``, ...) as one part. A part's *floor* is the length of the
longest chain of module-level imports below it: 0 for a part that imports no other part.

``python tests/import_graph.py --markdown`` prints the doc's three blocks (the floors, the table
and the list of lazy imports between parts, to which the doc adds a reason after each colon);
without ``--markdown`` it prints the figures.
"""

from __future__ import annotations

import ast
import sys
import textwrap
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

PACKAGE = "shuffle_opacus"
ROOT = Path(__file__).resolve().parents[1] / PACKAGE
#: The header row of the doc's table (the table runs from it to the next blank line).
TABLE_HEADER = "| module | imports | only for type checkers |"
#: The comments before the doc's drawing of the floors and its list of lazy imports.
FLOORS_MARKER = "import-floors"
LAZY_MARKER = "lazy-imports"

Graph = dict[str, set[str]]


@dataclass(frozen=True)
class Import:
    """One import of a package module by another (full dotted names)."""

    source: str
    target: str
    line: int
    lazy: bool  # inside a function
    typing: bool  # under ``if TYPE_CHECKING:``


def module_files(root: Path = ROOT) -> dict[str, Path]:
    """Every module of the package: dotted name -> file (``__init__.py`` names its package)."""
    files = {}
    for path in sorted(root.rglob("*.py")):
        parts = (root.name, *path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        files[".".join(parts)] = path
    return files


def _is_type_checking(test: ast.expr) -> bool:
    if isinstance(test, ast.Name):
        return test.id == "TYPE_CHECKING"
    return isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"


#: The fields of compound statements that hold statements (imports are statements, so the
#: reader walks statements only, never expressions: a lambda or a default cannot import).
_BLOCKS = ("body", "orelse", "finalbody", "handlers", "cases")


class _Reader:
    """Collects a module's imports, noting whether each is in a function or for types only."""

    def __init__(self, name: str, package: str, modules: set[str]) -> None:
        self.name, self.package, self.modules = name, package, modules
        self.found: list[Import] = []

    def _known(self, dotted: str) -> str | None:
        # The module itself, or the package the name is read from (``pkg.mod.attr`` -> pkg.mod).
        while dotted and dotted not in self.modules:
            dotted = dotted.rpartition(".")[0]
        return dotted or None

    def _targets(self, node: ast.Import | ast.ImportFrom) -> Iterator[str | None]:
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield self._known(alias.name)
            return
        if node.level:
            base = self.package.split(".")
            base = base[: len(base) - (node.level - 1)]
            if node.module:
                base.append(node.module)
            where = ".".join(base)
        else:
            where = node.module or ""
        for alias in node.names:
            submodule = f"{where}.{alias.name}"
            yield submodule if submodule in self.modules else self._known(where)

    def read(self, statements: Iterable[ast.AST], lazy: bool = False, typing: bool = False) -> None:
        """Walk a block of statements, inside a function (``lazy``) or ``if TYPE_CHECKING:``."""
        for node in statements:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                for target in dict.fromkeys(self._targets(node)):  # one edge per target
                    if target is not None:
                        self.found.append(Import(self.name, target, node.lineno, lazy, typing))
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                self.read(node.body, True, typing)
            elif isinstance(node, ast.If) and _is_type_checking(node.test):
                self.read(node.body, lazy, True)
                self.read(node.orelse, lazy, typing)
            else:
                for field in _BLOCKS:
                    self.read(getattr(node, field, ()), lazy, typing)


def read_imports(root: Path = ROOT) -> tuple[list[str], list[Import]]:
    """Return the package's modules (dotted names) and every import between them."""
    files = module_files(root)
    modules = set(files)
    imports = []
    for name, path in files.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        reader = _Reader(name, package, modules)
        reader.read(ast.parse(path.read_bytes(), filename=str(path)).body)
        imports.extend(reader.found)
    return list(files), imports


def private_crossings(root: Path = ROOT) -> list[str]:
    """Each private name (``_x``, not ``__x__``) imported from a module of another part.

    Returns ``"file:line: _name from module"`` lines, sorted; the names an import reads from a
    module, resolved as :class:`_Reader` resolves the module.
    """
    files = module_files(root)
    modules = set(files)
    found = []
    for name, path in files.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        reader = _Reader(name, package, modules)
        for node in ast.walk(ast.parse(path.read_bytes(), filename=str(path))):
            if not isinstance(node, ast.ImportFrom):
                continue
            for alias, target in zip(node.names, reader._targets(node), strict=True):
                private = alias.name.startswith("_") and not alias.name.endswith("__")
                if private and target is not None and part_of(target) != part_of(name):
                    where = module_label(name, root)
                    found.append(f"{where}:{node.lineno}: {alias.name} from {target}")
    return sorted(found)


def part_of(module: str) -> str:
    """The part of the doc's table a module belongs to: its top-level module or subpackage."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def module_graph(modules: Iterable[str], imports: Iterable[Import], lazy: bool = False) -> Graph:
    """Module -> the modules it imports at module level (``lazy=True``: inside functions)."""
    graph: Graph = {module: set() for module in modules}
    for edge in imports:
        if edge.lazy == lazy:
            graph[edge.source].add(edge.target)
    return graph


def part_graph(graph: Mapping[str, Iterable[str]]) -> Graph:
    """Part -> the other parts its modules import (edges inside a part dropped)."""
    parts: Graph = {}
    for source, targets in graph.items():
        mine = part_of(source)
        parts.setdefault(mine, set()).update(part_of(t) for t in targets if part_of(t) != mine)
    return parts


def strongly_connected(graph: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components, iteratively (each sorted; any order)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components = []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(graph[start]))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(graph.get(child, ()))))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    components.append(sorted(component))
    return components


def circles(graph: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """The import circles: components of more than one node, and nodes that import themselves."""
    return sorted(
        component
        for component in strongly_connected(graph)
        if len(component) > 1 or component[0] in graph.get(component[0], ())
    )


def circle_path(graph: Mapping[str, Iterable[str]], component: list[str]) -> list[str]:
    """A shortest way round one circle: from the component's first node back to it."""
    start, members = component[0], set(component)
    previous: dict[str, str] = {}
    queue = [start]
    for node in queue:  # breadth first, inside the component
        for child in sorted(graph.get(node, ())):
            if child == start:
                back = [node]
                while back[-1] != start:
                    back.append(previous[back[-1]])
                return [*reversed(back), start]
            if child in members and child not in previous:
                previous[child] = node
                queue.append(child)
    raise ValueError(f"{component} is no circle")


def describe_circles(graph: Mapping[str, Iterable[str]]) -> str:
    """One line per circle: a shortest way round it, and how many nodes its component has."""
    return "\n".join(
        " → ".join(circle_path(graph, component)) + f" ({len(component)} in all)"
        for component in circles(graph)
    )


def floors(parts: Mapping[str, Iterable[str]]) -> dict[str, int]:
    """Part -> its floor: 0 if it imports no part, else one above the highest it imports."""
    if circles(parts):
        raise ValueError(f"the parts import each other in a circle: {circles(parts)}")
    floor: dict[str, int] = {}

    def rise(part: str) -> int:
        if part not in floor:
            floor[part] = 1 + max((rise(t) for t in parts[part]), default=-1)
        return floor[part]

    for part in parts:
        rise(part)
    return floor


def longest_chain(parts: Mapping[str, Iterable[str]]) -> list[str]:
    """One longest chain of imports between parts, from the top part down to floor 0."""
    floor = floors(parts)
    part = max(floor, key=lambda p: (floor[p], p))
    chain = [part]
    while floor[part]:
        part = min(t for t in parts[part] if floor[t] == floor[part] - 1)
        chain.append(part)
    return chain


@dataclass(frozen=True)
class LazyImport:
    """Imports inside functions from one part to another, with the parts' floors."""

    source: str
    target: str
    floors: tuple[int, int]
    where: tuple[str, ...]  # the importing modules' files, relative to the package

    @property
    def direction(self) -> str:
        """``up`` to a higher floor, ``down`` to a lower one, ``level`` on the same floor."""
        low, high = self.floors
        return "up" if high > low else "down" if high < low else "level"


def module_label(module: str, root: Path = ROOT) -> str:
    """A module's file, relative to the package: ``analysis/pld/rounds.py``."""
    path = "/".join(module.split(".")[1:])
    if not path or (root / path).is_dir():
        return f"{path}/__init__.py".lstrip("/")
    return f"{path}.py"


def lazy_imports(
    parts: Mapping[str, Iterable[str]], imports: Iterable[Import], root: Path = ROOT
) -> list[LazyImport]:
    """The imports inside functions between two parts, one per pair of parts, sorted.

    One that points ``up`` would, at module level, raise its part's floor or close a circle.
    """
    floor = floors(parts)
    where: dict[tuple[str, str], set[str]] = {}
    for edge in imports:
        pair = (part_of(edge.source), part_of(edge.target))
        if edge.lazy and pair[0] != pair[1]:
            where.setdefault(pair, set()).add(module_label(edge.source, root))
    return [
        LazyImport(s, t, (floor[s], floor[t]), tuple(sorted(where[s, t]))) for s, t in sorted(where)
    ]


class Figures:
    """The package's imports, and what the doc and the test make of them (each worked out once).

    Only ``floors`` and ``lazy`` need the parts to import each other without a circle.
    """

    def __init__(self, root: Path = ROOT) -> None:
        self.root = root
        self.modules, self.imports = read_imports(root)

    @cached_property
    def graph(self) -> Graph:
        """Module -> the modules it imports at module level (TYPE_CHECKING included)."""
        return module_graph(self.modules, self.imports)

    @cached_property
    def module_circles(self) -> list[list[str]]:
        """The import circles among modules (imports inside functions left out)."""
        return circles(self.graph)

    @cached_property
    def parts(self) -> Graph:
        """Part -> the other parts it imports at module level (TYPE_CHECKING included)."""
        return part_graph(self.graph)

    @cached_property
    def typing_only(self) -> Graph:
        """Part -> the parts it imports only under ``if TYPE_CHECKING:``."""
        at_run_time = [edge for edge in self.imports if not edge.typing]
        run = part_graph(module_graph(self.modules, at_run_time))
        return {part: targets - run[part] for part, targets in self.parts.items()}

    @cached_property
    def floors(self) -> dict[str, int]:
        """Part -> its floor."""
        return floors(self.parts)

    @cached_property
    def lazy(self) -> list[LazyImport]:
        """The imports inside functions between parts."""
        return lazy_imports(self.parts, self.imports, self.root)

    def label(self, part: str) -> str:
        """How the doc names a part: ``protocols.py``, ``analysis/``."""
        return f"{part}/" if (self.root / part).is_dir() else f"{part}.py"


def figures(root: Path = ROOT) -> Figures:
    """Read the package under ``root``."""
    return Figures(root)


def _names(parts: Iterable[str]) -> str:
    return ", ".join(f"`{part}`" for part in sorted(parts))


def markdown_table(found: Figures) -> str:
    """The doc's table, lowest floor first; the parts of a row import the same parts."""
    rows: dict[tuple[frozenset[str], frozenset[str]], list[str]] = {}
    for part in sorted(found.parts, key=lambda p: (found.floors[p], p)):
        typing = found.typing_only[part]
        key = (frozenset(found.parts[part] - typing), frozenset(typing))
        rows.setdefault(key, []).append(part)
    lines = [TABLE_HEADER, "|---|---|---|"]
    for (at_run_time, typing), members in rows.items():
        left = ", ".join(f"`{found.label(part)}`" for part in members)
        lines.append(f"| {left} | {_names(at_run_time) or 'nothing'} | {_names(typing)} |")
    return "\n".join(lines)


def markdown_floors(found: Figures) -> str:
    """The parts floor by floor, top floor first."""
    top = max(found.floors.values())
    width = len(str(top))
    lines = []
    for floor in range(top, -1, -1):
        members = sorted(p for p in found.parts if found.floors[p] == floor)
        text = ", ".join(found.label(p) for p in members)
        lines += textwrap.wrap(
            text, 96, initial_indent=f"{floor:>{width}}  ", subsequent_indent=" " * (width + 2)
        )
    return "\n".join(lines)


def markdown_lazy(found: Figures) -> str:
    """The imports inside functions between parts, one line each, for the doc to explain."""
    return "\n".join(
        f"- `{lazy.source}` → `{lazy.target}`, {lazy.direction} (floor {lazy.floors[0]} → "
        f"{lazy.floors[1]}), in " + ", ".join(f"`{module}`" for module in lazy.where) + ":"
        for lazy in found.lazy
    )


def main(argv: list[str]) -> None:
    """Print the doc's three generated blocks (``--markdown``) or the figures."""
    found = figures()
    if "--markdown" in argv:
        print(f"<!-- {FLOORS_MARKER} -->\n```text\n{markdown_floors(found)}\n```\n")
        print(f"{markdown_table(found)}\n")
        print(f"<!-- {LAZY_MARKER} -->\n{markdown_lazy(found)}")
        return
    edges = sum(len(targets) for targets in found.graph.values())
    lazy_edges = {(e.source, e.target) for e in found.imports if e.lazy}
    between = sum(len(targets) for targets in found.parts.values())
    typing = sum(len(targets) for targets in found.typing_only.values())
    up = [lazy for lazy in found.lazy if lazy.direction == "up"]
    print(f"modules {len(found.modules)}, module-level edges {edges}, lazy {len(lazy_edges)}")
    print(f"parts {len(found.parts)}, edges between parts {between} ({typing} for types only)")
    print(f"circles among modules {len(found.module_circles)} {found.module_circles}")
    print(f"floors {max(found.floors.values()) + 1}: {' → '.join(longest_chain(found.parts))}")
    print(f"lazy imports between parts {len(found.lazy)}, pointing up {len(up)}")
    crossings = private_crossings()
    print(f"private names imported from another part {len(crossings)}")
    print(markdown_lazy(found))


if __name__ == "__main__":
    main(sys.argv[1:])
