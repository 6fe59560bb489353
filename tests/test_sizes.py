"""The honest size check (scripts/check_sizes.py) in the test suite: nothing in `epp/` or `scheduling/` over the
limits but what its ALLOWED list names, and a class counts what it really owns (docs/architecture.md, "Size limits").
"""

from __future__ import annotations

import importlib.util
import sys
import textwrap
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("check_sizes", ROOT / "scripts" / "check_sizes.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["check_sizes"] = module  # dataclasses look their module up while the class is made
    spec.loader.exec_module(module)
    return module


sizes = _load()


def _write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))


def _body(n: int, name: str = "f", indent: str = "") -> str:
    lines = [f"{indent}def {name}(self):"] + [f"{indent}    x{i} = {i}" for i in range(n - 2)] + [f"{indent}    return 0"]
    return "\n".join(lines) + "\n"


def _owned(root: Path, key: str) -> int:
    found = [s for s in sizes.Tree([root / "pkg"], root).sizes() if s.key == key]
    assert found, key
    return int(found[0].lines)


def test_nothing_is_over_but_what_the_allow_list_names() -> None:
    report = sizes.check([ROOT / "epp", ROOT / "scheduling"])
    over = [f"{s.kind} {s.key}: {s.lines} lines" + "".join(f"\n    {p}" for p in s.parts) for s in report.over]
    assert not over, "over the size limits (docs/architecture.md, Size limits):\n" + "\n".join(over)
    assert not report.stale, f"no longer over: take these off scripts/check_sizes.py's ALLOWED: {report.stale}"


def test_every_allowance_says_why() -> None:
    for key, (lines, why) in sizes.ALLOWED.items():
        assert "issue" in why and lines > 0, key


def test_a_function_bound_from_another_file_counts_in_the_class(tmp_path: Path) -> None:
    _write(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/helpers.py": _body(40, "grow") + _body(30, "shrink"),
        "pkg/thing.py": "from pkg import helpers\nfrom pkg.helpers import shrink\n\n"
                        "class Thing:\n    grow = helpers.grow\n    small = staticmethod(shrink)\n    alias = grow\n"
                        + _body(10, "own", "    "),
    })
    # its body (1 + 3 bindings + 10) and the two bound functions (40 + 30); the alias is not counted twice
    assert _owned(tmp_path, "pkg/thing.py::Thing") == 14 + 40 + 30
    report = sizes.check([tmp_path / "pkg"], classes=80, root=tmp_path, allowed={})
    assert [s.key for s in report.over] == ["pkg/thing.py::Thing"]


def test_a_mixin_chain_counts_in_the_one_class_it_serves(tmp_path: Path) -> None:
    _write(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/a.py": "class A:\n" + _body(20, "a", "    "),
        "pkg/b.py": "from pkg.a import A\n\nclass B(A):\n" + _body(20, "b", "    "),
        "pkg/c.py": "from pkg.b import B\n\nclass C(B):\n" + _body(20, "c", "    "),
        "pkg/base.py": "class Shared:\n" + _body(20, "s", "    "),
        "pkg/users.py": "from pkg.base import Shared\n\nclass One(Shared):\n    pass\n\nclass Two(Shared):\n    pass\n",
    })
    found = {s.key: s.lines for s in sizes.Tree([tmp_path / "pkg"], tmp_path).sizes() if s.kind == "class"}
    assert found["pkg/c.py::C"] == 63  # C's 21 lines with B's and A's
    assert "pkg/a.py::A" not in found and "pkg/b.py::B" not in found  # counted in C only
    assert found["pkg/users.py::One"] == 2  # a base shared by two classes is a class of its own
    assert found["pkg/base.py::Shared"] == 21


def test_an_allowance_that_is_no_longer_needed_fails(tmp_path: Path) -> None:
    _write(tmp_path, {"pkg/__init__.py": "", "pkg/small.py": "class Small:\n" + _body(10, "f", "    ")})
    allowed = {"pkg/small.py::Small": (300, "being split (issue 29)")}
    report = sizes.check([tmp_path / "pkg"], root=tmp_path, allowed=allowed)
    assert report.stale == ["pkg/small.py::Small"] and not report.over
    grown = sizes.check([tmp_path / "pkg"], classes=5, root=tmp_path, allowed={"pkg/small.py::Small": (6, "x")})
    assert [s.key for s in grown.over] == ["pkg/small.py::Small"]  # grown past its allowance
