"""The honest size check: classes and functions over the size limits, counting what a class really owns.

    .venv/bin/python scripts/check_sizes.py [--classes 250] [--functions 60] [paths...]   (default: epp scheduling)

A function's size is its lines from `def` (or its first decorator) to the last line of its body. A class's size is
what it really owns, wherever the lines stand:
- its own body;
- every function bound into it from outside its body: `name = function`, `name = module.function`,
  `name = staticmethod(function)` in the class body, the function defined at module level in the same file or
  imported from another file of the tree;
- the body of every base class from the tree that serves only it: a base whose one subclass in the tree is this
  class and that is never instantiated on its own (a mixin, or a link of a mixin chain), with what that base owns
  (generated gRPC code aside).

Exits 1 when something is over a limit and not in ALLOWED, or when an ALLOWED entry is no longer over (so the list
is emptied as the splits land), listing the largest first. tests/test_sizes.py runs it in the test suite; the
limits and why are in docs/architecture.md ("Size limits").
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CLASS_LIMIT = 250
FUNCTION_LIMIT = 60

# What may be over, by "path::qualified name": the most lines it may have, and why. An entry that is no longer over
# fails the check, so the list only shrinks.
ALLOWED: dict[str, tuple[int, str]] = {}


@dataclass
class Module:
    """One file: its top-level definitions and what its import statements bind."""

    name: str
    path: Path
    tree: ast.Module
    defs: dict[str, ast.AST] = field(default_factory=dict)  # top-level functions and classes
    imports: dict[str, str] = field(default_factory=dict)  # local name -> dotted target ("pkg.mod" or "pkg.mod.name")


@dataclass(frozen=True)
class Size:
    kind: str  # "class" or "function"
    key: str  # "path::qualified name"
    line: int
    lines: int
    parts: tuple[str, ...] = ()  # for a class: what it owns beyond its body ("bound name <- where (n)")


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def span(node: ast.AST) -> int:
    assert isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno
    start = min([node.lineno, *(d.lineno for d in node.decorator_list)])
    return node.end_lineno - start + 1


def load(paths: Iterable[Path], root: Path) -> dict[str, Module]:
    modules: dict[str, Module] = {}
    for path in paths:
        name = module_name(path, root)
        mod = Module(name, path, ast.parse(path.read_text(), str(path)))
        is_package = path.name == "__init__.py"
        for stmt in mod.tree.body:
            if isinstance(stmt, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                mod.defs[stmt.name] = stmt
        for node in ast.walk(mod.tree):
            if isinstance(node, ast.Import):
                for a in node.names:
                    if a.asname:
                        mod.imports[a.asname] = a.name
                    else:
                        top = a.name.split(".")[0]
                        mod.imports[top] = top
            elif isinstance(node, ast.ImportFrom):
                base = absolute(name, is_package, node.module, node.level)
                for a in node.names:
                    mod.imports[a.asname or a.name] = f"{base}.{a.name}" if base else a.name
        modules[name] = mod
    return modules


def absolute(here: str, is_package: bool, module: str | None, level: int) -> str:
    if level == 0:
        return module or ""
    parts = here.split(".")
    if not is_package:
        parts = parts[:-1]
    if level > 1:
        parts = parts[: len(parts) - (level - 1)]
    return ".".join([*parts, *([module] if module else [])])


def resolve(modules: dict[str, Module], dotted: str, depth: int = 0) -> tuple[Module, ast.AST] | None:
    """The definition a dotted name ("pkg.mod.func", "pkg.mod.Class.method") stands for in the tree, if any."""
    if depth > 10:
        return None
    parts = dotted.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        mod = modules.get(".".join(parts[:cut]))
        if mod is not None:
            return lookup(modules, mod, parts[cut:], depth)
    return None


def lookup(modules: dict[str, Module], mod: Module, names: list[str], depth: int) -> tuple[Module, ast.AST] | None:
    first, rest = names[0], names[1:]
    node = mod.defs.get(first)
    if node is None:
        target = mod.imports.get(first)
        if target is None:
            return None
        if target in modules:  # a module: look further inside it
            return lookup(modules, modules[target], rest, depth + 1) if rest else None
        return resolve(modules, ".".join([target, *rest]), depth + 1)
    for name in rest:
        if not isinstance(node, ast.ClassDef):
            return None
        found = [n for n in node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                 and n.name == name]
        if not found:
            return None
        node = found[0]
    return mod, node


def dotted_of(expr: ast.expr) -> str | None:
    if isinstance(expr, ast.Call) and isinstance(expr.func, ast.Name) and len(expr.args) == 1 and \
            expr.func.id in ("staticmethod", "classmethod", "property"):
        return dotted_of(expr.args[0])
    if isinstance(expr, ast.Name):
        return expr.id
    if isinstance(expr, ast.Attribute):
        inner = dotted_of(expr.value)
        return f"{inner}.{expr.attr}" if inner else None
    return None


def bound_functions(modules: dict[str, Module], mod: Module, cls: ast.ClassDef) -> Iterator[tuple[str, Module, ast.AST]]:
    """(bound name, defining module, function) of every function bound into `cls` from outside its body."""
    own = {id(n) for n in ast.walk(cls)}
    for stmt in cls.body:
        if isinstance(stmt, ast.Assign):
            targets, value = [t for t in stmt.targets if isinstance(t, ast.Name)], stmt.value
        elif isinstance(stmt, ast.AnnAssign) and stmt.value is not None and isinstance(stmt.target, ast.Name):
            targets, value = [stmt.target], stmt.value
        else:
            continue
        dotted = dotted_of(value)
        if not targets or dotted is None:
            continue
        first, *rest = dotted.split(".")
        found = lookup(modules, mod, [first, *rest], 0)
        if found is None or not isinstance(found[1], (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        if id(found[1]) in own:
            continue  # an alias of one of its own methods: already counted
        yield targets[0].id, found[0], found[1]


class Tree:
    """Every module under the given roots, with which class of the tree inherits from which."""

    def __init__(self, roots: Iterable[Path], root: Path = ROOT) -> None:
        self.root = root
        files = sorted({f for r in roots for f in ([r] if r.is_file() else r.rglob("*.py"))})
        self.modules = load(files, root)
        self.subclasses: dict[int, list[ast.ClassDef]] = {}
        self.called: set[str] = set()  # names that are called somewhere (a class instantiated by its name)
        self.mixins: set[int] = set()  # bases that serve one class only: counted in it, not on their own
        for mod in self.modules.values():
            for node in ast.walk(mod.tree):
                if isinstance(node, ast.ClassDef):
                    for base in self.bases(mod, node):
                        self.subclasses.setdefault(id(base[1]), []).append(node)
                elif isinstance(node, ast.Call):
                    d = dotted_of(node.func)
                    if d:
                        self.called.add(d.split(".")[-1])
        for mod in self.modules.values():
            for node in ast.walk(mod.tree):
                if isinstance(node, ast.ClassDef):
                    self.mixins |= {id(b) for _, b in self.bases(mod, node) if self.serves_only(b, node)}

    def serves_only(self, base: ast.ClassDef, cls: ast.ClassDef) -> bool:
        """Whether `base` is a piece of `cls`: its one subclass in the tree, never instantiated on its own."""
        return self.subclasses.get(id(base)) == [cls] and base.name not in self.called

    def bases(self, mod: Module, cls: ast.ClassDef) -> list[tuple[Module, ast.ClassDef]]:
        out = []
        for b in cls.bases:
            d = dotted_of(b)
            found = lookup(self.modules, mod, d.split("."), 0) if d else None
            if found is not None and isinstance(found[1], ast.ClassDef) and "_pb2" not in found[0].path.name:
                out.append((found[0], found[1]))  # (a generated gRPC servicer base is the protocol's, not ours)
        return out

    def rel(self, mod: Module) -> str:
        return mod.path.relative_to(self.root).as_posix()

    def owned(self, mod: Module, cls: ast.ClassDef) -> tuple[int, tuple[str, ...]]:
        """The lines `cls` really owns, and what they are beyond its own body."""
        total, parts = span(cls), []
        for name, where, fn in bound_functions(self.modules, mod, cls):
            n = span(fn)
            total += n
            parts.append(f"{name} <- {self.rel(where)}:{fn.lineno} ({n})")  # type: ignore[attr-defined]
        for where, base in self.bases(mod, cls):
            if self.serves_only(base, cls):
                n, inner = self.owned(where, base)
                total += n
                parts.append(f"base {base.name} <- {self.rel(where)}:{base.lineno} ({n})")
                parts += [f"  {p}" for p in inner]
        return total, tuple(parts)

    def sizes(self) -> list[Size]:
        out: list[Size] = []
        for mod in self.modules.values():
            def visit(node: ast.AST, prefix: str, mod: Module = mod) -> None:
                for child in ast.iter_child_nodes(node):
                    if isinstance(child, ast.ClassDef):
                        n, parts = self.owned(mod, child)
                        if id(child) not in self.mixins:
                            out.append(Size("class", f"{self.rel(mod)}::{prefix}{child.name}", child.lineno, n, parts))
                        visit(child, f"{prefix}{child.name}.")
                    elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                        key = f"{self.rel(mod)}::{prefix}{child.name}"
                        out.append(Size("function", key, child.lineno, span(child)))
                        visit(child, f"{prefix}{child.name}.")
                    else:
                        visit(child, prefix)
            visit(mod.tree, "")
        return out


@dataclass
class Report:
    sizes: list[Size]
    over: list[Size]  # over a limit and not allowed (or over its allowance)
    allowed: list[Size]  # over a limit, in ALLOWED and within its allowance
    stale: list[str]  # ALLOWED entries no longer over their limit (or gone)


def check(roots: Iterable[Path], classes: int = CLASS_LIMIT, functions: int = FUNCTION_LIMIT,
          allowed: dict[str, tuple[int, str]] | None = None, root: Path = ROOT) -> Report:
    allowed = ALLOWED if allowed is None else allowed
    roots = list(roots)
    sizes = Tree(roots, root).sizes()
    limits = {"class": classes, "function": functions}
    over_limit = [s for s in sizes if s.lines > limits[s.kind]]
    over = sorted((s for s in over_limit if s.lines > allowed.get(s.key, (0, ""))[0]), key=lambda s: -s.lines)
    ok = sorted((s for s in over_limit if s not in over), key=lambda s: -s.lines)
    scanned = [r.relative_to(root).as_posix() for r in roots]
    stale = sorted(k for k in set(allowed) - {s.key for s in over_limit}
                   if any(k == r or k.startswith(f"{r}/") or k.startswith(f"{r}::") for r in scanned))
    return Report(sizes, over, ok, stale)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--classes", type=int, default=CLASS_LIMIT)
    p.add_argument("--functions", type=int, default=FUNCTION_LIMIT)
    p.add_argument("-v", "--verbose", action="store_true", help="show what each class over the limit owns")
    p.add_argument("paths", nargs="*", default=["epp", "scheduling"])
    args = p.parse_args(argv)
    r = check([Path(x).resolve() for x in args.paths], args.classes, args.functions)
    limits = {"class": args.classes, "function": args.functions}
    for kind in ("class", "function"):
        of_kind = [s for s in r.sizes if s.kind == kind]
        top = max(of_kind, key=lambda s: s.lines, default=None)
        print(f"{len(of_kind)} {kind}{'es' if kind == 'class' else 's'} - largest:",
              f"{top.key} ({top.lines} lines)" if top else "-", f"(limit {limits[kind]})")
    for label, group in (("over", r.over), ("allowed", r.allowed)):
        for s in group:
            why = f"; {ALLOWED[s.key][1]}" if s.key in ALLOWED else ""
            print(f"{label}: {s.kind} {s.key} (line {s.line}): {s.lines} lines (limit {limits[s.kind]}{why})")
            if args.verbose or label == "over":
                for part in s.parts:
                    print(f"    {part}")
    for key in r.stale:
        print(f"stale: {key} is in ALLOWED but no longer over its limit: take it off the list")
    return 1 if r.over or r.stale else 0


if __name__ == "__main__":
    sys.exit(main())
