"""The scheduling core is pure and layered, asserted from its source (docs/scheduling.md).

Pure: no sockets, no asyncio, no threads or processes, no clock, no global random (time comes from
SchedulingContext.now, randomness from the injected random.Random), and nothing of the shell. Reading a config file is
the loader's one I/O, at load time.

Layered, each layer importing only the ones before it:
    types -> api -> framework -> prefix -> latency -> plugins -> config
so the framework imports no plugin, the latency model no plugin and the value types import nothing of the scheduler.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CORE = ROOT / "scheduling"
MODULES = sorted(CORE.rglob("*.py"))

FORBIDDEN = {
    "asyncio", "socket", "ssl", "select", "selectors", "threading", "multiprocessing", "subprocess", "concurrent",
    "http", "urllib.request", "aiohttp", "grpc", "requests", "redis", "zmq", "kubernetes", "time", "datetime",
    "epp", "modelsim", "proto",
}
FILE_ACCESS = {"os", "pathlib", "io", "shutil", "tempfile"}
FILE_READERS = {"scheduling/config/loader.py"}  # reads the config documents it is given a path to
LAYERS = ["types", "api", "framework", "prefix", "latency", "plugins", "config"]
GLOBAL_RANDOM = {"random", "choice", "choices", "shuffle", "randrange", "randint", "uniform", "sample", "seed",
                 "getrandbits", "gauss", "expovariate", "paretovariate"}


def _imports(tree: ast.AST) -> set[str]:
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            out.add(node.module)
    return out


def _layer(module: str) -> int | None:
    parts = module.split(".")
    if parts[0] != "scheduling" or len(parts) < 2:
        return None
    return LAYERS.index(parts[1]) if parts[1] in LAYERS else None


def _rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


@pytest.mark.parametrize("path", MODULES, ids=_rel)
def test_the_core_does_no_io_and_reads_no_clock(path: Path) -> None:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    imported = _imports(tree)
    bad = {m for m in imported if m in FORBIDDEN or m.split(".")[0] in FORBIDDEN}
    assert not bad, f"{_rel(path)} imports {sorted(bad)}"
    if _rel(path) not in FILE_READERS:
        files = {m for m in imported if m.split(".")[0] in FILE_ACCESS}
        assert not files, f"{_rel(path)} imports {sorted(files)}"
    calls = [
        n.func.attr for n in ast.walk(tree)
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and isinstance(n.func.value, ast.Name)
        and n.func.value.id == "random" and n.func.attr in GLOBAL_RANDOM
    ]
    assert not calls, f"{_rel(path)} uses the global random source: {calls}"


@pytest.mark.parametrize("path", MODULES, ids=_rel)
def test_each_layer_imports_only_the_layers_before_it(path: Path) -> None:
    rel = path.relative_to(CORE).with_suffix("")
    own = _layer("scheduling." + ".".join(rel.parts))
    if own is None:
        return  # scheduling/__init__.py
    tree = ast.parse(path.read_text(encoding="utf-8"))
    later = sorted(m for m in _imports(tree) if (lay := _layer(m)) is not None and lay > own)
    assert not later, f"{_rel(path)} ({LAYERS[own]}) imports a later layer: {later}"


def test_the_checks_see_what_they_should() -> None:
    """The walkers find imports where the core has them (guards against a test that passes by seeing nothing)."""
    assert len(MODULES) > 50
    loader = _imports(ast.parse((CORE / "config" / "loader.py").read_text(encoding="utf-8")))
    assert {"os", "pathlib", "scheduling.framework.model_scheduler"} <= loader
    assert _layer("scheduling.plugins.filters.served_model") > _layer("scheduling.framework.model_scheduler")
    tree = ast.parse("import random\nrandom.shuffle(x)\nrandom.Random(3).shuffle(x)\n")
    assert [n.func.attr for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
            and isinstance(n.func.value, ast.Name) and n.func.value.id == "random"] == ["shuffle", "Random"]
