"""The shape of the house, measured from the source of a checkout: import circles between files, private names
imported across files, the real size of the classes issue 29 named, the largest classes, `Any` parameters and
`type: ignore` comments in epp/.

    .venv/bin/python bench/house.py [--root DIR]

`--root` measures another checkout (say an older commit: `git worktree add /tmp/before <commit>`) with this
checkout's rules, for a before/after table: circles and private imports as tests/test_imports.py finds them (every
import that runs, lazy ones included, an import through a face followed to the file that defines the name), sizes
as scripts/check_sizes.py counts them (a class's own lines, the functions bound into it from elsewhere, the bases
that serve only it). Files per request: bench/files_per_request.py.
"""

from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "scripts")]

import check_sizes  # noqa: E402

from tests.test_imports import Files, show  # noqa: E402

NAMED = ("RequestExchange", "PreciseIndex", "EstimatedLatencyScorer", "KVEventSubscriber", "Limiter", "ReplicaBus",
         "Connection")


def any_counts(root: Path) -> tuple[int, int]:
    params = ignores = 0
    for p in (root / "epp").rglob("*.py"):
        if "/pb/" in p.as_posix():
            continue
        src = p.read_text()
        ignores += src.count("type: ignore")
        for n in ast.walk(ast.parse(src)):
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)):
                a = n.args
                for arg in [*a.posonlyargs, *a.args, *a.kwonlyargs, *filter(None, (a.vararg, a.kwarg))]:
                    if arg.annotation is not None and ast.unparse(arg.annotation) in ("Any", "Any | None"):
                        params += 1
    return params, ignores


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--root", type=Path, default=ROOT, help="the checkout to measure (default: this one)")
    root = ap.parse_args().root.resolve()
    files = Files(root)
    groups = sorted(files.circles(), key=len, reverse=True)
    print(f"import circles (groups of files): {len(groups)}, files in them: {sum(map(len, groups))}")
    for g in groups:
        print(f"  {len(g)} files: {show(g)}")
    print(f"private names imported across files: {len(files.private_imports())}")
    tree = check_sizes.Tree([root / "epp", root / "scheduling"], root)
    classes = [s for s in tree.sizes() if s.kind == "class"]
    print("named classes (lines owned):")
    for name in NAMED:
        for s in classes:
            if s.key.endswith(f"::{name}"):
                print(f"  {s.key}: {s.lines}")
    over = sorted((s for s in tree.sizes() if s.lines > (check_sizes.CLASS_LIMIT if s.kind == "class"
                                                            else check_sizes.FUNCTION_LIMIT)),
                  key=lambda s: -s.lines)
    print(f"over the limits ({check_sizes.CLASS_LIMIT} per class, {check_sizes.FUNCTION_LIMIT} per function): "
          f"{len(over)}")
    for s in over:
        print(f"  {s.kind} {s.key}: {s.lines}")
    params, ignores = any_counts(root)
    print(f"epp/: parameters typed Any: {params}, type: ignore: {ignores}")


if __name__ == "__main__":
    main()
