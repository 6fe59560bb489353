"""Report classes and functions over the size limits (lines from `def`/`class` to the last line of the body).

    .venv/bin/python scripts/check_sizes.py [--classes 250] [--functions 60] [paths...]   (default: epp)

Exits 1 when something is over a limit, listing the largest first.
"""

from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path


def sizes(path: Path) -> list[tuple[str, str, int]]:
    """(kind, qualified name, lines) of every class and function in one file."""
    out: list[tuple[str, str, int]] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                start = min([child.lineno, *(d.lineno for d in child.decorator_list)])
                assert child.end_lineno is not None
                kind = "class" if isinstance(child, ast.ClassDef) else "function"
                name = f"{prefix}{child.name}"
                out.append((kind, f"{path}:{child.lineno} {name}", child.end_lineno - start + 1))
                visit(child, f"{name}.")
            else:
                visit(child, prefix)

    visit(ast.parse(path.read_text(), str(path)), "")
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--classes", type=int, default=250)
    p.add_argument("--functions", type=int, default=60)
    p.add_argument("paths", nargs="*", default=["epp"])
    args = p.parse_args(argv)
    found = [s for root in args.paths for f in sorted(Path(root).rglob("*.py")) for s in sizes(f)]
    limits = {"class": args.classes, "function": args.functions}
    over = sorted((s for s in found if s[2] > limits[s[0]]), key=lambda s: -s[2])
    for kind in ("class", "function"):
        top = max((s for s in found if s[0] == kind), key=lambda s: s[2], default=None)
        count = sum(1 for s in found if s[0] == kind)
        print(f"{count} {kind}es" if kind == "class" else f"{count} functions", "- largest:",
              f"{top[1]} ({top[2]} lines)" if top else "-", f"(limit {limits[kind]})")
    for kind, name, n in over:
        print(f"over: {kind} {name}: {n} lines (limit {limits[kind]})")
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())
