"""The README's main command: `epp stack` brings up modelsim + Pointsman + Envoy, routes, and cleans up."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import orjson
import pytest
import yaml

from epp.stack.ports import free_port
from tests.support.envoy import cluster_hosts
from tests.support.wait import wait_until

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.envoy


def sim_ports(lines: list[str]) -> list[int]:
    """The simulated servers' ports, from the stack's progress line."""
    line = next(x for x in lines if "simulated vLLM servers on ports" in x)
    return [int(p) for p in line.split("on ports", 1)[1].split("(", 1)[0].replace(",", " ").split()]


@pytest.mark.parametrize(("workers", "bus"), [(1, "mesh"), (2, "mesh"), (2, "nats")])
def test_local_stack_routes_and_stops_cleanly(workers, bus):
    # Every port is picked by the OS on its own; --sim-base-port 0 lets the stack do the same for each server.
    listen, metrics, admin, grpc_port, health = (free_port() for _ in range(5))
    proc = subprocess.Popen(
        [sys.executable, "-m", "epp.cmd.cli", "stack", "--servers", "2", "--sim-base-port", "0",
         "--listen-port", str(listen), "--grpc-port", str(grpc_port), "--grpc-health-port", str(health),
         "--metrics-port", str(metrics), "--admin-port", str(admin), "--time-scale", "0.05", "--duration", "12",
         "--workers", str(workers), "--bus", bus, "--nats-port", str(free_port())],
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
        assert any("KV events: each server publishes" in line for line in lines), "".join(lines)
        body = orjson.dumps({"model": "meta-llama/Llama-3.1-8B", "max_tokens": 4, "ignore_eos": True,
                            "messages": [{"role": "user", "content": "hello, tell me about caches " * 20}]})
        req = urllib.request.Request(f"http://127.0.0.1:{listen}/v1/chat/completions", data=body,
                                     headers={"content-type": "application/json"})
        with urllib.request.urlopen(req, timeout=20) as r:
            reply = orjson.loads(r.read())
            pod_port = int(r.headers["x-inference-port"])
        assert reply["usage"]["completion_tokens"] == 4
        assert pod_port in sim_ports(lines)
        # The engine published what it cached; Pointsman's explain shows the match and that it came from events.
        held = {}
        for _ in range(50):
            explained = subprocess.run([sys.executable, "-m", "epp.cmd.cli", "explain", "--addr", f"127.0.0.1:{grpc_port}",
                                        "--json", "--body", body.decode()], cwd=ROOT, capture_output=True, text=True,
                                       timeout=30)
            assert explained.returncode == 0, explained.stdout + explained.stderr
            doc = orjson.loads(explained.stdout)
            held = {m["endpoint"]: m for m in doc.get("prefix", []) if m.get("source") == "events"
                    and m.get("gpu_blocks", 0) > 0}
            if held:
                break
            time.sleep(0.1)
        assert list(held) == [f"127.0.0.1:{pod_port}"], doc
        assert doc["endpoint"] == f"127.0.0.1:{pod_port}" and doc["token_source"] == "engine"
        if workers > 1:  # the supervisor's view of its workers, on the metrics port
            with urllib.request.urlopen(f"http://127.0.0.1:{metrics}/-/workers", timeout=10) as r:
                group = orjson.loads(r.read())
            assert group["workers"] == 2 and all(p["alive"] for p in group["processes"])
            pids = [p["pid"] for p in group["processes"]]
            # the workers share over the bus (over NATS with --bus nats: the stack started nats-server)
            wait_until(lambda: all(p["status"]["bus"]["live_peers"] == 1 for p in _group(metrics)["processes"]),
                       10.0, "the workers hear each other")
            assert all(p["status"]["bus"]["transport"].startswith("NATS" if bus == "nats" else "mesh")
                       for p in _group(metrics)["processes"])
        out, _ = proc.communicate(timeout=60)
        lines.append(out)
    finally:
        if proc.poll() is None:
            proc.kill()
    text = "".join(lines)
    assert proc.returncode == 0, text
    assert "route " in text and f"-> 127.0.0.1:{pod_port}" in text, text
    assert "fleet " in text
    if bus == "nats":
        assert "nats-server on :" in text, text
    if workers > 1:
        assert "(2 workers)" in text
        for pid in pids:  # the stack stopped every worker with the supervisor
            assert not os.path.exists(f"/proc/{pid}") or open(f"/proc/{pid}/stat").read().split()[2] == "Z"


def _group(metrics: int) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics}/-/workers", timeout=10) as r:
        return orjson.loads(r.read())


class LiveStack:
    """`epp stack` as a subprocess with a piped stdin (fleet commands) and a thread collecting its output."""

    def __init__(self, servers: int) -> None:
        self.listen, self.metrics, self.admin, self.grpc, self.health = (free_port() for _ in range(5))
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "epp.cmd.cli", "stack", "--servers", str(servers), "--sim-base-port", "0",
             "--listen-port", str(self.listen), "--grpc-port", str(self.grpc), "--grpc-health-port",
             str(self.health), "--metrics-port", str(self.metrics), "--admin-port", str(self.admin),
             "--time-scale", "0.02", "--duration", "90"],
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


def test_stack_adds_and_removes_servers_live():
    stack = LiveStack(servers=2)
    try:
        stack.wait_line("Ready.")
        first = sim_ports(stack.lines)
        assert len(first) == 2
        assert "+ adds a simulated server" in "".join(stack.lines)
        wait_until(lambda: stack.pool_ports() == set(first), 10, "Envoy's pool from EDS")

        stack.command("+")
        added = int(stack.wait_line("fleet  added").split(" on :", 1)[1].split()[0])
        assert added not in first
        wait_until(lambda: stack.pool_ports() == {*first, added}, 5, "the added server in Envoy's pool")
        served = {stack.request(i) for i in range(30)}
        assert added in served, f"the new server never got a request: {served}"

        stack.command("-")
        assert f":{added}" in stack.wait_line("fleet  removed")
        wait_until(lambda: stack.pool_ports() == set(first), 5, "the removed server gone from Envoy's pool")
        served = {stack.request(100 + i) for i in range(20)}
        assert served <= set(first), served
        eps = yaml.safe_load((Path(stack.wait_line("Pointsman metrics:").split("Files:")[1].strip())
                              / "endpoints.yaml").read_text())
        assert [e["port"] for e in eps["pools"][0]["endpoints"]] == first
    finally:
        code = stack.stop()
    assert code == 0, "".join(stack.lines)


def test_a_killed_stack_takes_its_processes_with_it():
    """SIGKILL on `epp stack` (a test timeout, an OOM kill) must not leave modelsim, Pointsman or Envoy running:
    the children get SIGTERM from the kernel when their parent dies (PR_SET_PDEATHSIG)."""
    listen, metrics, admin, grpc_port, health = (free_port() for _ in range(5))
    proc = subprocess.Popen(
        [sys.executable, "-m", "epp.cmd.cli", "stack", "--servers", "1", "--sim-base-port", "0",
         "--listen-port", str(listen), "--grpc-port", str(grpc_port), "--grpc-health-port", str(health),
         "--metrics-port", str(metrics), "--admin-port", str(admin), "--time-scale", "0.05", "--quiet"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    lines: list[str] = []
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not any(x.startswith("Ready.") for x in lines):
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line)
        assert any(x.startswith("Ready.") for x in lines), "".join(lines)
        sims = sim_ports(lines)
    finally:
        proc.kill()
        proc.wait(10)

    ports = [listen, grpc_port, admin, *sims]
    wait_until(lambda: not any(_listening(p) for p in ports), 30,
               lambda: f"the killed stack's processes to stop listening: {[p for p in ports if _listening(p)]}", 0.2)


def _listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex(("127.0.0.1", port)) == 0


def _stack_with_metrics_port_held(host: str) -> tuple[subprocess.CompletedProcess[str], list[int]]:
    listen, admin, grpc_port, health = (free_port() for _ in range(4))
    taken = socket.socket()
    taken.bind((host, 0))
    taken.listen(1)
    metrics = taken.getsockname()[1]
    try:
        done = subprocess.run(
            [sys.executable, "-m", "epp.cmd.cli", "stack", "--servers", "1", "--sim-base-port", "0",
             "--listen-port", str(listen), "--grpc-port", str(grpc_port), "--grpc-health-port", str(health),
             "--metrics-port", str(metrics), "--admin-port", str(admin), "--time-scale", "0.05", "--duration", "20"],
            cwd=ROOT, capture_output=True, text=True, timeout=90)
    finally:
        taken.close()
    return done, [listen, grpc_port, admin]


def test_a_port_in_use_is_named_before_anything_starts():
    done, _ = _stack_with_metrics_port_held("127.0.0.1")
    out = done.stdout + done.stderr
    assert done.returncode != 0 and "Ready." not in out, out
    assert "(Pointsman metrics) is in use; pick another" in out, out


def test_a_port_pointsman_cannot_bind_stops_the_stack_before_ready():
    """The stack checks its ports on 127.0.0.1; a port held on another address of the host passes that check, and
    Pointsman, which binds its metrics on every address after its gRPC port, cannot bind it and exits. The stack
    must say so and stop, never print "Ready." with Pointsman gone, nor leave its other processes behind."""
    done, ports = _stack_with_metrics_port_held("127.0.0.2")
    out = done.stdout + done.stderr
    assert done.returncode != 0 and "Ready." not in out, out
    assert "Pointsman exited" in out, out
    wait_until(lambda: not any(_listening(p) for p in ports), 30,
               lambda: "the failed stack's processes to stop listening", 0.2)
