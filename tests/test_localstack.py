"""The README's main command: `epp stack` brings up modelsim + Pointsman + Envoy, routes, and cleans up."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import orjson
import pytest
import yaml

from epp.ports import free_port, free_port_block
from tests.support.envoy import cluster_hosts

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


class LiveStack:
    """`epp stack` as a subprocess with a piped stdin (fleet commands) and a thread collecting its output."""

    def __init__(self, servers: int) -> None:
        self.listen, self.metrics, self.admin = free_port(), free_port(), free_port()
        # sim .. sim+servers-1 for the fleet, then room for the servers `+` adds.
        self.grpc, self.sim = free_port_block(2), free_port_block(servers + 2)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "epp.cli", "stack", "--servers", str(servers), "--sim-base-port", str(self.sim),
             "--listen-port", str(self.listen), "--grpc-port", str(self.grpc), "--metrics-port", str(self.metrics),
             "--admin-port", str(self.admin), "--time-scale", "0.02", "--duration", "90"],
            cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )
        self.lines: list[str] = []
        threading.Thread(target=self._collect, daemon=True).start()

    def _collect(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)

    def wait_line(self, prefix: str, timeout: float = 60) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for line in list(self.lines):
                if line.strip().startswith(prefix):
                    return line
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        raise AssertionError(f"no line starting with {prefix!r}:\n{''.join(self.lines)}")

    def command(self, cmd: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(cmd + "\n")
        self.proc.stdin.flush()

    def pool_ports(self) -> set[int]:
        return set(cluster_hosts(self.admin))

    def request(self, i: int) -> int:
        body = orjson.dumps({"model": "meta-llama/Llama-3.1-8B", "max_tokens": 2,
                             "messages": [{"role": "user", "content": f"question {i} {os.urandom(6).hex()}"}]})
        req = urllib.request.Request(f"http://127.0.0.1:{self.listen}/v1/chat/completions", data=body,
                                     headers={"content-type": "application/json"})
        with urllib.request.urlopen(req, timeout=20) as r:
            return int(r.headers["x-inference-port"])

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return -9


def wait_for(cond, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def test_stack_adds_and_removes_servers_live():
    stack = LiveStack(servers=2)
    try:
        stack.wait_line("Ready.")
        sim = stack.sim
        assert "+ adds a simulated server" in "".join(stack.lines)
        wait_for(lambda: stack.pool_ports() == {sim, sim + 1}, 10, "Envoy's pool from EDS")

        stack.command("+")
        assert f":{sim + 2}" in stack.wait_line("fleet  added")
        wait_for(lambda: stack.pool_ports() == {sim, sim + 1, sim + 2}, 5, "the added server in Envoy's pool")
        served = {stack.request(i) for i in range(30)}
        assert sim + 2 in served, f"the new server never got a request: {served}"

        stack.command("-")
        assert f":{sim + 2}" in stack.wait_line("fleet  removed")
        wait_for(lambda: stack.pool_ports() == {sim, sim + 1}, 5, "the removed server gone from Envoy's pool")
        served = {stack.request(100 + i) for i in range(20)}
        assert served <= {sim, sim + 1}, served
        eps = yaml.safe_load((Path(stack.wait_line("Pointsman metrics:").split("Files:")[1].strip())
                              / "endpoints.yaml").read_text())
        assert [e["port"] for e in eps["pools"][0]["endpoints"]] == [sim, sim + 1]
    finally:
        code = stack.stop()
    assert code == 0, "".join(stack.lines)
