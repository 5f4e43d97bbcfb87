"""The import graph of softnic's packages, read from the source: cycles and layers.

    python tools/import_graph.py            # prints cycles and layer breaks; exit 1 if any

Every ``import`` and ``from ... import`` statement counts, at module level or
inside a function (an import deferred into a function to dodge a cycle is still
the cycle), except those under ``if TYPE_CHECKING:``.  ``from pkg import name``
is an edge to ``pkg.name`` when that is a module, else to ``pkg``.  The layers
are README.md's table ("What is here"): a module may import its own layer and
the layers before it, never a later one.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("softnic", "verbs_api", "congestion")

#: README.md's layers, first to last, each as the module prefixes it holds
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("engine", ("softnic.core", "softnic.wire", "congestion")),
    ("drivers", ("softnic.transport", "softnic.driver", "softnic.accel")),
    ("faces", ("verbs_api", "softnic.faces")),
    ("libraries", ("softnic.collectives", "softnic.experiments", "softnic.trace")),
    ("testing", ("softnic.testing",)),
    ("tools", ("softnic.cli",)),
)


def modules(root: Path = ROOT, packages=PACKAGES) -> dict[str, Path]:
    """Every module under the packages: dotted name -> file."""
    found = {}
    for pkg in packages:
        for path in sorted((root / pkg).rglob("*.py")):
            rel = path.relative_to(root).with_suffix("")
            parts = list(rel.parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(tree: ast.AST):
    """The import statements of a module, skipping ``if TYPE_CHECKING:`` blocks."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            stack.extend(node.orelse)
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        stack.extend(ast.iter_child_nodes(node))


def _base(name: str, path: Path, level: int, module: str | None) -> str:
    """The absolute module a ``from`` statement names (relative ones resolved)."""
    if level == 0:
        return module or ""
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    if level > 1:
        package = package[:len(package) - (level - 1)]
    return ".".join(package + ([module] if module else []))


def graph(mods: dict[str, Path]) -> dict[str, set[str]]:
    """module -> the modules of ``mods`` its import statements name."""
    edges: dict[str, set[str]] = {m: set() for m in mods}
    for name, path in mods.items():
        tree = ast.parse(path.read_text(), str(path))
        for node in _imports(tree):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                base = _base(name, path, node.level, node.module)
                targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in mods else base
                           for alias in node.names]
            for target in targets:
                # ``import a.b.c`` of a name that is not a module: its nearest module
                while target and target not in mods:
                    target = target.rpartition(".")[0]
                if target and target != name:
                    edges[name].add(target)
    return edges


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    counter = 0
    for start in sorted(edges):
        if start in index:
            continue
        work = [(start, iter(sorted(edges[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, it = work[-1]
            nxt = next(it, None)
            if nxt is not None:
                if nxt not in index:
                    index[nxt] = low[nxt] = counter
                    counter += 1
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(edges.get(nxt, ())))))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
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
                if len(component) > 1:
                    found.append(sorted(component))
    return sorted(found)


def layer_of(module: str, layers=LAYERS) -> int | None:
    """The position of a module's layer in ``layers`` (None: in no layer)."""
    for i, (_, prefixes) in enumerate(layers):
        if any(module == p or module.startswith(p + ".") for p in prefixes):
            return i
    return None


def layer_breaks(edges: dict[str, set[str]], layers=LAYERS) -> list[tuple[str, str]]:
    """(importer, imported) pairs where a module imports a later layer than its own."""
    breaks = []
    for src in sorted(edges):
        a = layer_of(src, layers)
        for dst in sorted(edges[src]):
            b = layer_of(dst, layers)
            if a is not None and b is not None and b > a:
                breaks.append((src, dst))
    return breaks


def unplaced(mods: dict[str, Path], layers=LAYERS, roots=PACKAGES) -> list[str]:
    """Modules in no layer (a root package such as bare ``softnic`` is in none)."""
    return [m for m in sorted(mods) if m not in roots and layer_of(m, layers) is None]


def main() -> int:
    mods = modules()
    edges = graph(mods)
    found = cycles(edges)
    breaks = layer_breaks(edges)
    loose = unplaced(mods)
    print(f"{len(mods)} modules, {sum(map(len, edges.values()))} import edges")
    for c in found:
        print("cycle:", " <-> ".join(c))
    for src, dst in breaks:
        print(f"layer break: {src} ({LAYERS[layer_of(src)][0]}) imports {dst} "
              f"({LAYERS[layer_of(dst)][0]})")
    for m in loose:
        print("in no layer:", m)
    print(f"{len(found)} cycles, {len(breaks)} layer breaks, {len(loose)} modules in no layer")
    return 1 if found or breaks or loose else 0


if __name__ == "__main__":
    sys.exit(main())
