"""The import graph of softnic's packages, read from the source: cycles, layers and
private names used across modules.

    python tools/import_graph.py            # prints cycles and layer breaks; exit 1 if any
    python tools/import_graph.py --private  # also names with a leading underscore that a
                                            # module uses from another (listed, not failed)

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


# ------------------------------------------------------------------ private names

def _is_private(name: str) -> bool:
    return name.startswith("_") and name != "_" and not (name.startswith("__")
                                                         and name.endswith("__"))


_OWN = ("self", "cls")
HELD = "(held by self)"


def private_defs(tree: ast.AST) -> tuple[set[str], set[str]]:
    """The private names a module defines, as (globals, attributes): its
    module-level functions, classes and assignments; and its classes' functions,
    class-level assignments and ``__slots__`` entries, and ``self._x = ...`` (or
    ``cls._x``) anywhere."""
    found: tuple[set[str], set[str]] = (set(), set())

    def targets(node):
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
            yield from (node.targets if isinstance(node, ast.Assign) else [node.target])

    def names(t):
        if isinstance(t, ast.Name):
            yield t.id
        elif isinstance(t, (ast.Tuple, ast.List)):
            for e in t.elts:
                yield from names(e)

    def scope(body, into: set[str]):                   # a module's or a class's body
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                into.add(node.name)
                if isinstance(node, ast.ClassDef):
                    scope(node.body, found[1])
            for t in targets(node):
                into.update(names(t))
                if isinstance(t, ast.Name) and t.id == "__slots__":
                    for e in getattr(node.value, "elts", ()):
                        if isinstance(e, ast.Constant) and isinstance(e.value, str):
                            found[1].add(e.value)
            if isinstance(node, (ast.If, ast.Try)):
                scope(node.body + node.orelse + getattr(node, "finalbody", []), into)

    scope(tree.body, found[0])
    for node in ast.walk(tree):
        for t in targets(node):
            for e in (t.elts if isinstance(t, (ast.Tuple, ast.List)) else [t]):
                if isinstance(e, ast.Attribute) and isinstance(e.value, ast.Name) \
                        and e.value.id in _OWN:
                    found[1].add(e.attr)
    return ({n for n in found[0] if _is_private(n)}, {n for n in found[1] if _is_private(n)})


def module_aliases(tree: ast.AST, name: str, path: Path, mods) -> dict[str, str]:
    """The local names a module binds to modules of ``mods`` by its imports."""
    out = {}
    for node in _imports(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.asname and a.name in mods:
                    out[a.asname] = a.name
                elif not a.asname:
                    out[a.name.split(".")[0]] = a.name.split(".")[0]
        else:
            base = _base(name, path, node.level, node.module)
            for a in node.names:
                if f"{base}.{a.name}" in mods:
                    out[a.asname or a.name] = f"{base}.{a.name}"
    return out


def private_uses(tree: ast.AST, name: str, path: Path, mods=()
                 ) -> list[tuple[str, str | None, int]]:
    """Where a module reaches for a private name of some other object or module:
    ``x._name`` with ``x`` not ``self``/``cls``/``super()``,
    ``getattr``/``hasattr``/``setattr(x, "_name")``, and ``from m import _name``;
    as (name, the module it is read from where known (``m._name`` of an imported
    module, ``from m import``) else None, line)."""
    aliases = module_aliases(tree, name, path, mods)
    uses = []

    def obj(v, attr, line):
        if isinstance(v, ast.Name) and v.id in _OWN or isinstance(v, ast.Call) \
                and isinstance(v.func, ast.Name) and v.func.id == "super":
            return
        dotted = ast.unparse(v)
        source = aliases.get(dotted, dotted if dotted in mods else None)
        if source is None and isinstance(v, ast.Attribute) and isinstance(v.value, ast.Name) \
                and v.value.id in _OWN:
            source = HELD          # ``self.cq._wait``: an object self holds, another's
        uses.append((attr, source, line))

    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _is_private(node.attr):
            obj(node.value, node.attr, node.lineno)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
                and node.func.id in ("getattr", "hasattr", "setattr") and len(node.args) >= 2:
            key = node.args[1]
            if isinstance(key, ast.Constant) and isinstance(key.value, str) \
                    and _is_private(key.value):
                obj(node.args[0], key.value, node.lineno)
        elif isinstance(node, ast.ImportFrom) and node.module != "__future__":
            base = _base(name, path, node.level, node.module)
            for alias in node.names:
                if _is_private(alias.name) and f"{base}.{alias.name}" not in mods:
                    uses.append((alias.name, base, node.lineno))
    return uses


def _package(module: str) -> str:
    """A module's package below the root (``softnic.core`` for ``softnic.core.qp``,
    ``verbs_api`` for ``verbs_api.cq``)."""
    parts = module.split(".")
    return ".".join(parts[:2]) if parts[0] == "softnic" else parts[0]


def private_crossings(mods: dict[str, Path], layers=LAYERS
                      ) -> dict[tuple[str, str], dict[str, list[int]]]:
    """(user, owner) -> {private name: lines of the user}: a module using a private
    name of another module of ``mods``.  Read from a module (``m._name``, ``from m
    import _name``): that module is the owner.  Read from an object: the modules
    whose classes define the attribute are, those in the user's layer or an
    earlier one first (a layer sees only those); the use is the user's own when it
    defines such an attribute itself, or no module does (a library's, such as
    ``sys._getframe``); of several, those of its own package when there are such.
    An object ``self`` holds (``self.cq._wait``) is taken as another's when
    another module defines the attribute.  Ambiguous owners are joined with
    " or "."""
    trees = {m: ast.parse(p.read_text(), str(p)) for m, p in mods.items()}
    defs = {m: private_defs(t) for m, t in trees.items()}
    by_attr: dict[str, list[str]] = {}
    for m, (_, attrs) in defs.items():
        for n in attrs:
            by_attr.setdefault(n, []).append(m)
    out: dict[tuple[str, str], dict[str, list[int]]] = {}
    for user, tree in trees.items():
        lu = layer_of(user, layers)
        for attr, source, line in private_uses(tree, user, mods[user], mods):
            if source is not None and source is not HELD:
                owners = [source] if source in mods else []
            else:
                owners = [o for o in by_attr.get(attr, []) if o != user]
                if attr in defs[user][1] and (source is None or not owners):
                    continue                      # its own class's name (or one like it)
                seen = [o for o in owners if lu is None or layer_of(o, layers) is None
                        or layer_of(o, layers) <= lu]
                owners = seen or owners
                pkg = _package(user)
                owners = [o for o in owners if _package(o) == pkg] or owners
            owners = [o for o in owners if o != user]
            if owners:
                out.setdefault((user, " or ".join(sorted(owners))), {}) \
                    .setdefault(attr, []).append(line)
    return dict(sorted(out.items()))


def print_private(crossings) -> None:
    across = 0
    name = lambda i: "?" if i is None else LAYERS[i][0]      # noqa: E731
    for (user, owner), names_ in crossings.items():
        lu = layer_of(user)
        lo = sorted({layer_of(o) for o in owner.split(" or ")}, key=lambda i: (i is None, i))
        crosses = lo != [lu]
        across += crosses
        where = f"{name(lu)} -> {'/'.join(map(name, lo))}" if crosses else "same layer"
        items = ", ".join(f"{n} ({','.join(map(str, sorted(set(ls))))})"
                          for n, ls in sorted(names_.items()))
        print(f"private: {user} uses {owner}'s [{where}]: {items}")
    uses = sum(len(ls) for names_ in crossings.values() for ls in names_.values())
    print(f"{len(crossings)} module pairs ({across} across layers), {uses} uses of "
          f"another module's private names")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
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
    if "--private" in argv:
        print_private(private_crossings(mods))
    return 1 if found or breaks or loose else 0


if __name__ == "__main__":
    sys.exit(main())
