"""`epp stack` (modelsim + Pointsman + Envoy) as a subprocess on free loopback ports, for the dashboard's browser
tests and its screenshot script."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import orjson

from epp.stack.localstack import MODEL
from epp.stack.ports import free_port

ROOT = Path(__file__).resolve().parent.parent.parent
__all__ = ["MODEL", "LocalStack"]


class LocalStack:
    """`epp stack` as a subprocess on free ports; `dashboard` is the URL it prints."""

    def __init__(self, servers: int = 2, time_scale: float = 0.05, config_file: str | None = None,
                 shadow_config: str | None = None) -> None:
        self.listen, self.metrics, self.admin, self.grpc, self.health = (free_port() for _ in range(5))
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "epp.cmd.cli", "stack", "--servers", str(servers), "--sim-base-port", "0",
             "--listen-port", str(self.listen), "--grpc-port", str(self.grpc), "--grpc-health-port", str(self.health),
             "--metrics-port", str(self.metrics), "--admin-port", str(self.admin), "--time-scale", str(time_scale),
             "--quiet", *(["--config-file", config_file] if config_file else []),
             *(["--shadow-config", shadow_config] if shadow_config else [])],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )
        self.output: list[str] = []
        self.dashboard = ""
        deadline = time.monotonic() + 90
        assert self.proc.stdout is not None
        while time.monotonic() < deadline and not self.dashboard:
            line = self.proc.stdout.readline()
            if not line:
                break
            self.output.append(line)
            if line.startswith("Dashboard:"):
                self.dashboard = line.split()[1]
        if not self.dashboard:
            self.stop()
            raise RuntimeError("epp stack printed no dashboard URL:\n" + "".join(self.output))
        line = next(x for x in self.output if "simulated vLLM servers on ports" in x)
        self.sim_ports = [int(p) for p in line.split("on ports", 1)[1].split("(", 1)[0].replace(",", " ").split()]
        threading.Thread(target=self._drain, daemon=True).start()

    def _drain(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.output.append(line)

    def chat(self, content: str, request_id: str | None = None, stream: bool = False, max_tokens: int = 4) -> dict:
        body = orjson.dumps({"model": MODEL, "max_tokens": max_tokens, "stream": stream,
                             "messages": [{"role": "user", "content": content}]})
        headers = {"content-type": "application/json", **({"x-request-id": request_id} if request_id else {})}
        req = urllib.request.Request(f"http://127.0.0.1:{self.listen}/v1/chat/completions", data=body,
                                     headers=headers)
        with urllib.request.urlopen(req, timeout=30) as r:
            return {"port": int(r.headers["x-inference-port"]), "body": r.read()}

    def api(self, path: str) -> dict:
        with urllib.request.urlopen(self.dashboard + path, timeout=10) as r:
            return orjson.loads(r.read())

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)  # the stack stops its children on TERM
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
