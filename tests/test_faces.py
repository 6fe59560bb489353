"""Every package of `epp/` has a face, and the code outside a package goes through it.

A package's face is its `__init__.py` with `__all__`: what the rest of the shell may use. Faces load their names on
first use (PEP 562 `__getattr__`) where loading them eagerly would make the CLI heavy (tests/cmd/test_cli_imports.py
asserts what the commands load). Outside a package, code imports the face (`from epp.routing import Router`), never
a module inside it (`from epp.routing.router import Router`), lazily or for type checking alike, with one sanctioned
second door: a package's `settings` module (flags and frozen settings, which `epp serve`'s CLI builds without loading
the subsystem). A module may import modules of its own package, or of a package that contains it, directly.
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EPP = ROOT / "epp"

PACKAGES = sorted(".".join(p.parent.relative_to(ROOT).parts) for p in EPP.rglob("__init__.py"))
MODULES = {".".join(p.relative_to(ROOT).with_suffix("").parts) for p in EPP.rglob("*.py") if p.name != "__init__.py"}

# (importing file, module it reaches into) -> why it cannot go through the face yet
ALLOWED: dict[tuple[str, str], str] = {}  # (file, module it reaches into) -> why it cannot go through the face


def face_names(package: str) -> list[str] | None:
    tree = ast.parse((ROOT / package.replace(".", "/") / "__init__.py").read_text())
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
            node, ast.AnnAssign) else []
        if any(isinstance(t, ast.Name) and t.id == "__all__" for t in targets):
            assert node.value is not None
            return list(ast.literal_eval(node.value))
    return None


def package_of(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1])


def reaching_in(path: Path, source: str, faces: dict[str, list[str]]) -> list[tuple[int, str]]:
    """The imports of `source` (the file at `path`) that name a module inside a package the file is not in."""
    here = package_of(path)
    out: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source, str(path))):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module in faces:  # `from epp.x import name`: a module only if the face does not list it
                targets = [f"{node.module}.{a.name}" for a in node.names if a.name not in faces[node.module]]
            else:
                targets = [node.module]
        for target in targets:
            if target not in MODULES:
                continue
            parent, _, name = target.rpartition(".")
            if here == parent or here.startswith(parent + ".") or name == "settings":
                continue
            out.append((node.lineno, target))
    return out


def test_every_package_of_epp_has_a_face() -> None:
    missing = [p for p in PACKAGES if p != "epp" and face_names(p) is None]
    assert missing == [], f"give these packages an __all__ in their __init__.py: {missing}"


def test_every_name_a_face_lists_is_there() -> None:
    unresolved = []
    for package in PACKAGES:
        module = importlib.import_module(package)
        for name in face_names(package) or []:
            if hasattr(module, name):
                continue
            try:  # a face may list a module of its own (epp.api.pb's generated code, epp.h2grpc.tls)
                importlib.import_module(f"{package}.{name}")
            except ImportError:
                unresolved.append(f"{package}.{name}")
    assert unresolved == []


def test_code_outside_a_package_goes_through_its_face() -> None:
    faces = {p: face_names(p) or [] for p in PACKAGES}
    found = {}
    for path in sorted(EPP.rglob("*.py")):
        rel = str(path.relative_to(ROOT))
        for line, target in reaching_in(path, path.read_text(), faces):
            found[(rel, target)] = line
    unexpected = sorted(f"{rel}:{line} imports {target}" for (rel, target), line in found.items()
                        if (rel, target) not in ALLOWED)
    assert unexpected == [], "import these through the package's face:\n" + "\n".join(unexpected)
    stale = sorted(set(ALLOWED) - set(found))
    assert stale == [], f"these no longer reach in: take them off ALLOWED: {stale}"


def test_reaching_in_is_seen() -> None:
    """The control: a module inside another package, a name a face does not list, and the sanctioned doors."""
    faces = {p: face_names(p) or [] for p in PACKAGES}
    source = ("from epp.routing.router import Router\n"
              "from epp.routing import Router as R, settings\n"
              "from epp.fleet import static_source\n"
              "def f():\n    from epp.request.director import Director\n")
    found = reaching_in(EPP / "cmd" / "example.py", source, faces)
    assert found == [(1, "epp.routing.router"), (3, "epp.fleet.static_source"), (5, "epp.request.director")]
    inside = reaching_in(EPP / "routing" / "example.py", source, faces)
    assert inside == [(3, "epp.fleet.static_source"), (5, "epp.request.director")]  # its own modules are its own
