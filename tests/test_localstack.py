"""The README's main command: `epp stack` brings up modelsim + Pointsman + Envoy, routes, and cleans up."""

from __future__ import annotations

import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import orjson
import pytest

from epp.ports import free_port, free_port_block

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.envoy


def test_local_stack_routes_and_stops_cleanly():
    # The stack uses consecutive ports: sim, sim+1 for the two servers and grpc+1 for health.
    listen, metrics, admin = free_port(), free_port(), free_port()
    grpc_port, sim = free_port_block(2), free_port_block(2)
    proc = subprocess.Popen(
        [sys.executable, "-m", "epp.cli", "stack", "--servers", "2", "--sim-base-port", str(sim),
         "--listen-port", str(listen), "--grpc-port", str(grpc_port), "--metrics-port", str(metrics),
         "--admin-port", str(admin), "--time-scale", "0.05", "--duration", "6"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    lines: list[str] = []
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line)
            if line.startswith("Ready."):
                break
        assert any(line.startswith("Ready.") for line in lines), "".join(lines)
        body = orjson.dumps({"model": "meta-llama/Llama-3.1-8B", "max_tokens": 4,
                            "messages": [{"role": "user", "content": "hello"}]})
        req = urllib.request.Request(f"http://127.0.0.1:{listen}/v1/chat/completions", data=body,
                                     headers={"content-type": "application/json"})
        with urllib.request.urlopen(req, timeout=20) as r:
            reply = orjson.loads(r.read())
            pod_port = int(r.headers["x-inference-port"])
        assert reply["usage"]["completion_tokens"] == 4
        assert pod_port in (sim, sim + 1)
        out, _ = proc.communicate(timeout=60)
        lines.append(out)
    finally:
        if proc.poll() is None:
            proc.kill()
    text = "".join(lines)
    assert proc.returncode == 0, text
    assert "route " in text and f"-> 127.0.0.1:{pod_port}" in text, text
    assert "fleet " in text
