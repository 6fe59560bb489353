"""The shipped ModelRouter example loads, and `epp envoy-config --routes-file` turns it into a config Envoy accepts."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from epp.routing.documents import DocumentSet, read_yaml
from tests.support.envoy import validate

ROOT = Path(__file__).resolve().parents[3]
EXAMPLE = ROOT / "deploy" / "examples" / "llmkube" / "modelrouter.yaml"


def test_the_example_loads():
    docs = DocumentSet()
    docs.replace("file", read_yaml(EXAMPLE.read_text(), "modelrouter.yaml"))
    assert not docs.errors, docs.errors
    t = docs.table()
    [spec] = t.objects("llmkube")
    assert [r.name for r in spec.rules] == ["pii-stays-local", "complex-to-cloud", "canary"]
    assert t.pools["InferenceService/default/qwen3-coder"].port == 8080
    assert t.providers["default/coding-router.cloud-opus"].auth.secret_key == "ANTHROPIC_API_KEY"


def test_envoy_config_from_the_example_validates(tmp_path):
    out = subprocess.run([sys.executable, "-m", "epp.cmd.cli", "envoy-config", "--variant", "original-dst",
                          "--routes-file", str(EXAMPLE), "-o", str(tmp_path / "envoy.yaml")],
                         cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    text = (tmp_path / "envoy.yaml").read_text()
    assert "provider.default.coding-router.cloud-opus" in text and "idle_timeout: 300s" in text
    assert "num_retries: 1" in text  # the longest fallback list: one backend after the first
    assert validate(tmp_path / "envoy.yaml").returncode == 0


def test_envoy_config_with_routes_lists_every_pool_of_the_endpoints_file(tmp_path):
    eps = tmp_path / "eps.yaml"
    eps.write_text("pools:\n- {name: qwen3-coder, endpoints: [{address: 10.0.0.1, port: 8000}]}\n"
                   "- {name: llama, endpoints: [{address: 10.0.0.2, port: 8000}]}\n")
    out = subprocess.run([sys.executable, "-m", "epp.cmd.cli", "envoy-config", "--variant", "override-host",
                          "--routes-file", str(EXAMPLE), "--endpoints-file", str(eps), "-o", str(tmp_path / "e.yaml")],
                         cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    text = (tmp_path / "e.yaml").read_text()
    assert "address: 10.0.0.1" in text and "address: 10.0.0.2" in text
