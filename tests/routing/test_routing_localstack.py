"""`epp stack --example kthena`: a Kthena ModelRoute over two ModelServers runs in the local stack, and
`epp explain` shows the rule, the split and the pick."""

from __future__ import annotations

import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import orjson
import pytest

from epp.stack.ports import free_port, free_port_block

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.envoy
BODY = '{"model": "deepseek-r1", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 3}'


def explain(grpc_port: int, *headers: str) -> subprocess.CompletedProcess[str]:
    args = [sys.executable, "-m", "epp.cmd.cli", "explain", "--addr", f"127.0.0.1:{grpc_port}", "--body", BODY]
    for h in headers:
        args += ["-H", h]
    return subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=30)


def test_kthena_example_in_the_local_stack():
    listen, metrics, admin = free_port(), free_port(), free_port()
    grpc_port, sim = free_port_block(2), free_port_block(2)
    proc = subprocess.Popen(
        [sys.executable, "-m", "epp.cmd.cli", "stack", "--example", "kthena", "--servers", "2", "--sim-base-port",
         str(sim), "--listen-port", str(listen), "--grpc-port", str(grpc_port), "--metrics-port", str(metrics),
         "--admin-port", str(admin), "--time-scale", "0.05", "--duration", "30", "--quiet"],
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
        out = explain(grpc_port)
        assert out.returncode == 0, out.stdout + out.stderr
        text = out.stdout
        assert "route     ModelRoute default/deepseek   rule 'canary' (#1)" in text, text
        assert "default/llama-v1 70 (70%)" in text and "default/llama-v2 30 (30%)" in text, text
        picked_v1 = "default/llama-v1 70 (70%) <- picked" in text
        assert picked_v1 or "default/llama-v2 30 (30%) <- picked" in text, text
        assert f"endpoint  127.0.0.1:{sim if picked_v1 else sim + 1}" in text, text  # v1: the first server
        assert "engine model 'meta-llama/Llama-3.1-8B'" in text, text
        premium = explain(grpc_port, "x-user-tier: premium")
        assert "rule 'premium' (#0)" in premium.stdout and f"endpoint  127.0.0.1:{sim + 1}" in premium.stdout, \
            premium.stdout
        req = urllib.request.Request(f"http://127.0.0.1:{listen}/v1/chat/completions", data=BODY.encode(),
                                     headers={"content-type": "application/json", "x-user-tier": "premium"})
        with urllib.request.urlopen(req, timeout=20) as r:
            reply = orjson.loads(r.read())
            assert int(r.headers["x-inference-port"]) == sim + 1
        assert reply["model"] == "deepseek-r1"  # the engine ran Llama; the client sees the name it asked for
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
