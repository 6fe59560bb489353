"""Pointsman installs next to proto-plus: its generated gRPC code is `epp.api.pb`, so the top-level `proto` import
name stays proto-plus's.

A real virtual environment (not --system-site-packages, which would see this checkout's own environment), this
checkout installed with no extras, plus proto-plus from the package index (pip's cache makes it quick)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

CHECK = """
import importlib.metadata as md
import sys

import proto
assert proto.Message.__module__ == "proto.message", proto.Message
assert "site-packages" in proto.__file__, proto.__file__

import epp.api.client
from epp.api.pb import pointsman_pb2, pointsman_pb2_grpc
assert "site-packages" in epp.api.client.__file__, epp.api.client.__file__
assert pointsman_pb2_grpc.PointsmanStub and pointsman_pb2.ExplainRequest().DESCRIPTOR.full_name
assert proto.Message.__module__ == "proto.message"  # still proto-plus after Pointsman's API was imported

files = [str(f) for f in md.files("pointsman") or []]
assert not [f for f in files if f.startswith("proto/")], "pointsman installs a top-level proto package"
assert [f for f in files if f.startswith("epp/api/pb/pointsman_pb2")], files
print("ok")
"""


def test_pointsman_and_proto_plus_share_one_environment(tmp_path):
    src = tmp_path / "src"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", "build")
    for name in ("epp", "scheduling", "modelsim", "proto"):
        shutil.copytree(ROOT / name, src / name, ignore=ignore)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True, system_site_packages=False).create(env_dir)
    py = env_dir / "bin" / "python"
    pip = subprocess.run([str(py), "-m", "pip", "install", "-q", str(src), "proto-plus"], cwd=tmp_path,
                         capture_output=True, text=True)
    assert pip.returncode == 0, pip.stderr[-3000:]
    # Run from an empty directory, so that nothing imports from this checkout instead of the environment.
    run = tmp_path / "run"
    run.mkdir()
    out = subprocess.run([str(py), "-c", CHECK], cwd=run, capture_output=True, text=True,
                         env={"PATH": f"{env_dir / 'bin'}:/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip() == "ok"
    assert sys.prefix != str(env_dir)
