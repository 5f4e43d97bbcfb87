"""Functions longer than a reader can hold at once (80 lines by default).

    python tools/long_functions.py [--max 80] [--all] [PATH ...]

Lists every function or method (nested ones too) whose ``def`` line through its
last line spans more than ``--max`` lines, longest first, as ``path:line
name lines``.  One whose reason for its length is written beside it (a comment
``# long: <why>`` just above it, or on a line of its own) is listed as
explained, apart, and does not count.  Paths default to
softnic/ (without core/, wire/ and accel/, whose functions have their own
owner) and verbs_api/; ``--all`` counts those too.  Exit status 1 if any
unexplained function is over the limit.
"""

from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT = ("softnic", "verbs_api")
OWNED_ELSEWHERE = ("softnic/core", "softnic/wire", "softnic/accel")
MARK = "# long:"


def files(paths, every: bool = False) -> list[Path]:
    out = []
    for p in paths:
        p = Path(p)
        found = [p] if p.suffix == ".py" else sorted(p.rglob("*.py"))
        for f in found:
            rel = f.resolve().relative_to(ROOT).as_posix() if f.resolve().is_relative_to(ROOT) \
                else f.as_posix()
            if not every and any(rel == o or rel.startswith(o + "/") for o in OWNED_ELSEWHERE):
                continue
            out.append(f)
    return out


def _explained(lines: list[str], node) -> bool:
    """A ``# long:`` comment on the line above the function (its decorators aside), or
    on a line of its own (its def line or any line of its body)."""
    first = min([node.lineno] + [d.lineno for d in node.decorator_list])
    near = lines[node.lineno - 1:node.end_lineno] + ([lines[first - 2]] if first >= 2 else [])
    return any(MARK in line.partition("#")[1] + line.partition("#")[2] for line in near)


def long_functions(path: Path, limit: int) -> list[tuple[int, str, int, bool]]:
    """(line, qualified name, length, explained) of each function over ``limit`` lines."""
    text = path.read_text()
    lines = text.splitlines()
    tree = ast.parse(text, str(path))
    found = []

    def visit(node, prefix):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                name = prefix + child.name
                length = child.end_lineno - child.lineno + 1
                if length > limit:
                    found.append((child.lineno, name, length, _explained(lines, child)))
                visit(child, name + ".")
            elif isinstance(child, ast.ClassDef):
                visit(child, prefix + child.name + ".")
            else:
                visit(child, prefix)

    visit(tree, "")
    return found


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("paths", nargs="*", default=[str(ROOT / p) for p in DEFAULT])
    ap.add_argument("--max", type=int, default=80, help="longest allowed (lines)")
    ap.add_argument("--all", action="store_true", help="count core/, wire/ and accel/ too")
    args = ap.parse_args(argv)
    rows = []
    for f in files(args.paths, args.all):
        rel = f.resolve().relative_to(ROOT) if f.resolve().is_relative_to(ROOT) else f
        rows += [(length, f"{rel}:{line}", name, ok)
                 for line, name, length, ok in long_functions(f, args.max)]
    rows.sort(key=lambda r: (-r[0], r[1]))
    bad = [r for r in rows if not r[3]]
    for length, where, name, ok in bad:
        print(f"{where}  {name}  {length} lines")
    explained = [r for r in rows if r[3]]
    if explained:
        print(f"explained ({MARK} beside them):")
        for length, where, name, ok in explained:
            print(f"  {where}  {name}  {length} lines")
    print(f"{len(bad)} functions over {args.max} lines, {len(explained)} explained")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
