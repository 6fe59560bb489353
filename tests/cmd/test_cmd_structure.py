"""epp/cmd's files import each other one way, typing-only imports included: the start steps receive the components
(epp/cmd/components.py) and none imports the app that orders them (epp/cmd/app.py), not even for type checking.
The import graph and its circle finder are tests/test_imports.py's (which also forbids private names across files,
typing-only imports included, everywhere in epp/)."""

from __future__ import annotations

from tests.test_imports import FILES, show


def test_no_import_circle_through_epp_cmd_even_for_type_checking() -> None:
    through_cmd = [show(g) for g in FILES.circles(typing=True) if any(m.startswith("epp.cmd") for m in g)]
    assert through_cmd == []


def test_no_step_module_imports_the_app() -> None:
    """(The face, epp/cmd/__init__.py, names App for type checking; the CLI runs it.)"""
    importers = sorted(m for m, imports in FILES.imports.items()
                       if m.startswith("epp.cmd.") and m not in ("epp.cmd.app", "epp.cmd.cli")
                       and any(imp.module == "epp.cmd.app" for imp in imports))
    assert importers == []
