"""`epp stack --example llmkube`: a ModelRouter runs in the local stack; `epp explain` shows the matched rule, the
backend and the endpoint; the budget state shows on the metrics port (the dashboard's config view and /metrics)."""

from __future__ import annotations

import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import orjson
import pytest

from epp.stack.localstack import MODEL
from epp.stack.ports import free_port

ROOT = Path(__file__).resolve().parents[3]
pytestmark = pytest.mark.envoy
BODY = orjson.dumps({"model": MODEL, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 3}).decode()


def explain(grpc_port: int, *headers: str) -> str:
    args = [sys.executable, "-m", "epp.cmd.cli", "explain", "--addr", f"127.0.0.1:{grpc_port}", "--body", BODY]
    for h in headers:
        args += ["-H", h]
    out = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout


def get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=10) as r:
        return r.read()


def test_llmkube_example_in_the_local_stack():
    listen, metrics, admin, grpc_port, health = (free_port() for _ in range(5))
    proc = subprocess.Popen(
        [sys.executable, "-m", "epp.cmd.cli", "stack", "--example", "llmkube", "--servers", "2", "--sim-base-port", "0",
         "--listen-port", str(listen), "--grpc-port", str(grpc_port), "--grpc-health-port", str(health),
         "--metrics-port", str(metrics), "--admin-port", str(admin), "--time-scale", "0.05", "--duration", "60",
         "--quiet"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    lines: list[str] = []
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line)
            if line.startswith("Dashboard:"):
                break
        assert any(line.startswith("Ready.") for line in lines), "".join(lines)
        sims = next(x for x in lines if "simulated vLLM servers on ports" in x)
        qwen, llama = (int(p) for p in sims.split("on ports", 1)[1].split("(", 1)[0].replace(",", " ").split())
        text = explain(grpc_port)
        assert "route     ModelRouter default/coding-router   rule 'defaultRoute'" in text, text
        assert "backend   qwen (local)" in text and f"endpoint  127.0.0.1:{qwen}" in text, text
        assert "budget    default/coding-router/stack-hourly: 0/200000 tokens" in text, text
        text = explain(grpc_port, "x-llmkube-task-complexity: complex", "x-llmkube-team: red")
        assert "rule 'complex' (#1)" in text and "backend   llama (local)" in text, text
        assert f"endpoint  127.0.0.1:{llama}" in text and "fallbacks qwen (local)" in text, text
        assert "budget    default/coding-router/per-team [red]" in text, text
        text = explain(grpc_port, "x-llmkube-classification: PII", "x-llmkube-task-complexity: complex")
        assert "rule 'pii-stays-local' (#0)" in text and "class     pii" in text, text
        for _ in range(3):  # real requests through Envoy, charged to the budgets
            req = urllib.request.Request(f"http://127.0.0.1:{listen}/v1/chat/completions", data=BODY.encode(),
                                         headers={"content-type": "application/json", "x-llmkube-team": "red",
                                                  "x-llmkube-task-complexity": "complex"})
            with urllib.request.urlopen(req, timeout=30) as r:
                assert int(r.headers["x-inference-port"]) == llama
                r.read()
        config = orjson.loads(get(f"http://127.0.0.1:{metrics}/api/config"))
        budgets = {(b["name"], b["scope"]): b for b in config["budgets"]}
        hourly = budgets[("default/coding-router/stack-hourly", "")]
        assert hourly["tokens_used"] > 0 and hourly["max_tokens"] == 200000 and hourly["window_s"] == 3600
        assert budgets[("default/coding-router/per-team", "red")]["tokens_used"] == hourly["tokens_used"]
        prom = get(f"http://127.0.0.1:{metrics}/metrics").decode()
        line = next(x for x in prom.splitlines()
                    if x.startswith('pointsman_budget_utilization{budget="default/coding-router/stack-hourly"}'))
        assert float(line.rsplit(" ", 1)[1]) > 0
        assert "budget    default/coding-router/stack-hourly" in explain(grpc_port)
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
