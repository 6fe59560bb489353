"""`--log-format json`: one object per line; request lines carry the decision id and the trace id."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import orjson

from tests.observe.test_tracing_otlp import endpoints, request
from tests.support.envoy import free_port, wait_port
from tests.support.wait import wait_until

ROOT = Path(__file__).resolve().parents[2]
TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"


async def test_json_lines_with_decision_and_trace_ids(tmp_path):
    port = free_port()
    log = tmp_path / "epp.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "epp.cmd.cli", "serve", "--secure-serving=false", "--grpc-host", "127.0.0.1",
                                 "--grpc-port", str(port), "--grpc-health-port", "0", "--metrics-port", "0",
                                 "--endpoints-file", str(endpoints(tmp_path)), "--log-decisions",
                                 "--log-format", "json"], cwd=ROOT, stderr=out, stdout=out,
                                env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        wait_port(port)
        await request(port, traceparent=f"00-{TRACE}-00f067aa0ba902b7-01", **{"x-request-id": "req-7"})
        wait_until(lambda: b"req-7" in log.read_bytes(), 10, lambda: f"req-7 in the log: {log.read_text()}", 0.05)
    finally:
        proc.terminate()
        proc.wait(10)
    lines = [orjson.loads(line) for line in log.read_bytes().splitlines() if line.strip()]
    assert all({"ts", "level", "logger", "msg"} <= set(x) for x in lines)
    decision = next(x for x in lines if x["msg"].startswith("decision "))
    assert decision["request_id"] == "req-7" and decision["trace_id"] == TRACE
    assert decision["decision_id"].endswith("-1") and f"decision={decision['decision_id']}" in decision["msg"]
