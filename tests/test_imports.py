"""Imports between files of `epp/` and `scheduling/`: no circles, and no file takes another file's private names.

Every import counts, at module level or lazily inside a function; one under `if TYPE_CHECKING:` is typing-only and
does not. An import through a package's face (`from epp.fleet import Datastore`, re-exported by its `__init__`)
counts as an import of the file that defines the name, so a face is no way around a circle, and a package's
`__init__` importing its own files to re-export them is no circle. `from x import _y`, with `x` another file of
ours, is a private import, typing-only or not (a private submodule taken by a file of its own package is not).
docs/architecture.md ("Imports between files") says the same; what still breaks a rule today is listed below with
the reason.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("epp", "scheduling")

# What may break a rule, each with the reason; both are empty (an entry that no longer holds fails the test).
ALLOWED_CIRCLES: dict[frozenset[str], str] = {}  # a circle that cannot be broken yet -> why
ALLOWED_PRIVATE: dict[str, str] = {}  # "importer -> module._name" -> why


@dataclass(frozen=True)
class Import:
    line: int
    module: str  # the module the statement names (absolute)
    name: str | None  # the name taken from it (`from module import name`), or None (`import module`)
    typing: bool = False  # under `if TYPE_CHECKING:`


def module_of(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def typing_only(tree: ast.AST) -> set[int]:
    out: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            out.update(id(n) for n in ast.walk(node))
            out.difference_update(id(n) for e in node.orelse for n in ast.walk(e))
    return out


def imports_of(path: Path, root: Path = ROOT) -> list[Import]:
    """Every import of one file (module level, lazy or typing-only), with relative ones made absolute."""
    tree = ast.parse(path.read_text(), str(path))
    skip = typing_only(tree)
    here = module_of(path, root).split(".")
    package = here if path.name == "__init__.py" else here[:-1]
    out: list[Import] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [Import(node.lineno, a.name, None, id(node) in skip) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join([*base, *([node.module] if node.module else [])])
            out += [Import(node.lineno, module, a.name, id(node) in skip) for a in node.names]
    return out


class Files:
    """The files of the tree, what each imports, and which file defines a name a package's face re-exports."""

    def __init__(self, root: Path = ROOT, packages: tuple[str, ...] = PACKAGES) -> None:
        self.paths = {module_of(p, root): p for pkg in packages for p in sorted((root / pkg).rglob("*.py"))}
        self.imports = {m: imports_of(p, root) for m, p in self.paths.items()}

    def is_package(self, module: str) -> bool:
        return self.paths[module].name == "__init__.py"

    def definer(self, module: str, name: str, depth: int = 0) -> str:
        """The file that defines `name` as `module` exposes it: through a face's re-exports to the file itself. A
        lazy face (PEP 562 `__getattr__`) declares what it loads under `if TYPE_CHECKING:`, and loads that very module
        on first use, so a face's typing-only import is followed too."""
        if f"{module}.{name}" in self.paths:
            return f"{module}.{name}"
        if depth < 10 and self.is_package(module):
            for imp in self.imports[module]:
                if imp.name == name and imp.module in self.paths and imp.module != module:
                    return self.definer(imp.module, name, depth + 1)
        return module

    def targets(self, module: str, typing: bool = False) -> list[tuple[Import, str]]:
        """(import, the file of ours it reaches) for each import of `module` that runs (and, with `typing`, each
        typing-only one) and reaches another file."""
        out = []
        for imp in self.imports[module]:
            if imp.module not in self.paths or (imp.typing and not typing):
                continue
            target = imp.module if imp.name is None or imp.name == "*" else self.definer(imp.module, imp.name)
            if target != module:
                out.append((imp, target))
        return out

    def circles(self, typing: bool = False) -> list[frozenset[str]]:
        """The strongly connected groups of files (two or more that import each other, around a circle); with
        `typing`, typing-only imports count as edges too."""
        graph = {m: sorted({t for _, t in self.targets(m, typing)}) for m in self.paths}
        index: dict[str, int] = {}
        low: dict[str, int] = {}
        stack: list[str] = []
        on: set[str] = set()
        out: list[frozenset[str]] = []

        def connect(v: str) -> None:  # Tarjan's, iterative over each node's edges
            work = [(v, iter(graph[v]))]
            index[v] = low[v] = len(index)
            stack.append(v)
            on.add(v)
            while work:
                node, edges = work[-1]
                for w in edges:
                    if w not in index:
                        index[w] = low[w] = len(index)
                        stack.append(w)
                        on.add(w)
                        work.append((w, iter(graph[w])))
                        break
                    if w in on:
                        low[node] = min(low[node], index[w])
                else:
                    work.pop()
                    if work:
                        low[work[-1][0]] = min(low[work[-1][0]], low[node])
                    if low[node] == index[node]:
                        group = set()
                        while True:
                            w = stack.pop()
                            on.discard(w)
                            group.add(w)
                            if w == node:
                                break
                        if len(group) > 1:
                            out.append(frozenset(group))

        for m in graph:
            if m not in index:
                connect(m)
        return out

    def private_imports(self) -> list[tuple[str, int, str]]:
        """(importer, line, "module._name") for every private name one file takes from another."""
        out = []
        for module in self.paths:
            for imp in self.imports[module]:  # typing-only ones too: a private type is private as well
                if imp.module not in self.paths or not imp.name or not imp.name.startswith("_"):
                    continue
                taken = f"{imp.module}.{imp.name}"
                if taken in self.paths and module.startswith(f"{imp.module}."):
                    continue  # a private submodule, taken by a file of its own package
                if self.definer(imp.module, imp.name) != module:
                    out.append((module, imp.line, taken))
        return out


def show(group: frozenset[str]) -> str:
    return "{" + ", ".join(sorted(group)) + "}"


FILES = Files()


def test_no_import_circle_between_files() -> None:
    found = set(FILES.circles())
    new = sorted(show(g) for g in found - set(ALLOWED_CIRCLES))
    assert not new, "import circles between files (break them; typing-only imports go under TYPE_CHECKING):\n" + \
        "\n".join(new)
    gone = sorted(show(g) for g in set(ALLOWED_CIRCLES) - found)
    assert not gone, "these circles are gone: take them off ALLOWED_CIRCLES:\n" + "\n".join(gone)


def test_no_file_imports_another_files_private_names() -> None:
    found = FILES.private_imports()
    new = [f"{m}:{line} takes {taken}" for m, line, taken in found if f"{m} -> {taken}" not in ALLOWED_PRIVATE]
    assert not new, "private names imported from another file:\n" + "\n".join(new)
    gone = sorted(set(ALLOWED_PRIVATE) - {f"{m} -> {taken}" for m, _, taken in found})
    assert not gone, "no longer imported: take these off ALLOWED_PRIVATE:\n" + "\n".join(gone)


def test_the_rules_see_lazy_circles_faces_and_private_names(tmp_path: Path) -> None:
    files = {
        "pkg/__init__.py": "from pkg.a import A\nfrom pkg.b import B\n__all__ = ['A', 'B']\n",  # re-exports
        "pkg/a.py": "class A: ...\n_hidden = 1\n",
        "pkg/b.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.c import C\nclass B: ...\n",
        "pkg/c.py": "from pkg import B\ndef f():\n    from . import d\n",  # through the face; lazy, relative
        "pkg/d.py": "def g():\n    from pkg.c import f\nfrom pkg.a import _hidden\n",
        "pkg/f.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.d import _T\n",  # counts
        "pkg/_private.py": "",
        "pkg/e.py": "from pkg import _private\n",  # a private submodule of its own package: allowed
        "other/__init__.py": "from pkg import _private\n",  # ...but not from elsewhere
        # a lazy face: it declares under TYPE_CHECKING what its __getattr__ loads; lazy/x <-> lazy/y through it
        "lazy/__init__.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from lazy.x import X\n"
                            "def __getattr__(name):\n    import importlib\n    return importlib.import_module('lazy.x').X\n",
        "lazy/x.py": "from lazy.y import Y\nclass X: ...\n",
        "lazy/y.py": "def f():\n    from lazy import X\nclass Y: ...\n",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    tree = Files(tmp_path, ("pkg", "other", "lazy"))
    # c <-> d (one of them lazy); b -> c is typing-only, and the face's re-exports make no circle with a and b;
    # y reaches x through the lazy face
    assert sorted(tree.circles(), key=sorted) == [frozenset({"lazy.x", "lazy.y"}), frozenset({"pkg.c", "pkg.d"})]
    # counting typing-only imports, b -> c closes b <- c (through the face) into the c <-> d circle
    assert frozenset({"pkg.b", "pkg.c", "pkg.d"}) in tree.circles(typing=True)
    assert sorted((m, t) for m, _, t in tree.private_imports()) == [
        ("other", "pkg._private"), ("pkg.d", "pkg.a._hidden"), ("pkg.f", "pkg.d._T")]
