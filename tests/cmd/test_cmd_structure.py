"""epp/cmd's files import each other one way: the start steps receive the components (epp/cmd/components.py) and
none imports the app that orders them (epp/cmd/app.py), not even for type checking; and no file takes another's
private names."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CMD = ROOT / "epp" / "cmd"


def module_of(path: Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")


def imported(path: Path) -> list[tuple[str, list[str]]]:
    """Every import of the file, lazy and typing-only ones included: (module, the names taken from it)."""
    out: list[tuple[str, list[str]]] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(a.name, []) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.append((node.module, [a.name for a in node.names]))
    return out


def graph() -> dict[str, set[str]]:
    files = {module_of(p) for p in CMD.glob("*.py")}
    edges: dict[str, set[str]] = {m: set() for m in files}
    for path in CMD.glob("*.py"):
        here = module_of(path)
        for module, names in imported(path):
            submodules = {f"{module}.{n}" for n in names} & files  # `from epp.cmd import bus`: the module bus
            targets = submodules | ({module} if len(submodules) < len(names) or not names else set())
            edges[here] |= {t for t in targets if t in files and t != here}
    return edges


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one file (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_no_import_circle_between_the_files_of_epp_cmd() -> None:
    assert cycles(graph()) == []


def test_the_cycle_finder_finds_one() -> None:
    """The control: the circle this package had (app.py and the step modules, through typing-only imports)."""
    edges = {"epp.cmd.app": {"epp.cmd.fleet"}, "epp.cmd.fleet": {"epp.cmd.app"}, "epp.cmd.kube": set()}
    assert cycles(edges) == [["epp.cmd.app", "epp.cmd.fleet"]]


def test_no_step_module_imports_the_app() -> None:
    """(The face, epp/cmd/__init__.py, names App for type checking; the CLI runs it.)"""
    importers = sorted(module_of(p) for p in CMD.glob("*.py") if p.name not in ("app.py", "cli.py", "__init__.py")
                       and any(m == "epp.cmd.app" for m, _ in imported(p)))
    assert importers == []


def test_no_file_of_epp_cmd_takes_a_private_name_from_another() -> None:
    private = [f"{p.relative_to(ROOT)}: from {m} import {n}" for p in CMD.glob("*.py") for m, names in imported(p)
               for n in names if m.startswith("epp.") and n.startswith("_") and not n.startswith("__")]
    assert private == []
