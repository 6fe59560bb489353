"""The shell's layers, asserted from the imports (as the core's purity is asserted in tests/scheduling).

Every module of `epp/` belongs to a unit: a package directly under `epp/` (or one of the few top-level modules).
A unit may import (at module level or lazily inside a function) only units of a LOWER layer, or itself; imports under
`if TYPE_CHECKING:` are typing-only and do not count. So no two units import each other, and data flows one way:
stream -> protocol machine -> request stages -> scheduler -> mutations. docs/architecture.md draws the same picture.
"""

from __future__ import annotations

from pathlib import Path

from tests.test_imports import imports_of

ROOT = Path(__file__).resolve().parents[1]
EPP = ROOT / "epp"

# Top to bottom. A unit imports only units below its own layer.
LAYERS: list[tuple[str, ...]] = [
    ("cmd",),  # the entry points: `epp serve` and its components, `epp envoy-config`, `epp explain`
    ("workers", "stack"),  # process supervision (--workers), the local dev stack
    ("api", "extproc", "xds", "envoy_config"),  # servers and outputs: operator API, ext_proc glue, EDS, Envoy config
    ("observe",),  # traces, decision receipts, the shadow profile, structured logs (request observers)
    ("request",),  # the request lifecycle: resolve, admit, prepare, queue, schedule, commit
    ("routing", "flowcontrol", "tokenize", "bus"),  # services the request path uses
    ("ratelimit", "fleet"),  # fleet state (datastore, sources, scraping, KV events, health) and limits
    ("protocol", "h2grpc"),  # the sans-IO ext_proc machine; the HTTP/2 gRPC transport
    ("aio", "argtypes", "extras", "natsconn", "__init__"),  # helpers
]
RANK = {unit: i for i, layer in enumerate(LAYERS) for unit in layer}
TOP_LEVEL_MODULES = {"aio", "argtypes", "extras", "natsconn", "__init__"}


def unit_of(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] != "epp":
        return None
    return parts[1] if len(parts) > 1 else "__init__"


def imports(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every import of the file that runs (tests/test_imports.py reads them); `from epp import x`
    counts as an import of `epp.x`."""
    out: dict[tuple[int, str], None] = {}
    for imp in imports_of(path):
        if imp.typing:
            continue
        out[(imp.line, imp.module)] = None
        if imp.module == "epp" and imp.name:
            out[(imp.line, f"epp.{imp.name}")] = None
    return list(out)


def test_every_unit_has_a_layer() -> None:
    units = {p.name for p in EPP.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    units |= {p.stem for p in EPP.glob("*.py")}
    assert units <= set(RANK), f"give these a layer: {sorted(units - set(RANK))}"
    assert {p.stem for p in EPP.glob("*.py")} <= TOP_LEVEL_MODULES, "at most five modules directly in epp/"


def test_imports_only_go_down() -> None:
    bad = []
    for path in sorted(EPP.rglob("*.py")):
        here = unit_of(".".join(path.relative_to(ROOT).with_suffix("").parts))
        assert here is not None
        for line, module in imports(path):
            there = unit_of(module)
            if there is None or there == here or there not in RANK:
                continue
            if RANK[there] <= RANK[here]:
                bad.append(f"{path.relative_to(ROOT)}:{line} imports {module} ({here} -> {there})")
    assert not bad, "imports that go up or sideways:\n" + "\n".join(bad)


def test_the_core_imports_nothing_of_the_shell() -> None:
    for path in (ROOT / "scheduling").rglob("*.py"):
        for line, module in imports(path):
            assert not module.startswith("epp"), f"{path}:{line} imports {module}"
