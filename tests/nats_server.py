"""A real Debian nats-server with JetStream for tests: on a free loopback port, its store in a temp dir, never
daemonized.

`scripts/bootstrap.sh --test-deps` installs nats-server when it is missing (scripts/debian-packages.sh). The server
can be stopped and started again on the same port with the same store (a broker restart: streams survive, ephemeral
consumers and connections do not), which is how the tests make NATS die and come back.

    server = NatsServer().start()
    server.url            # nats://127.0.0.1:PORT
    server.restart()      # kill, start again on the same port and store
    server.stop()         # kill and remove the store
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time

import pytest

from epp.stack.ports import free_port, wait_port


def nats_binary() -> str | None:
    return shutil.which("nats-server") or ("/usr/sbin/nats-server" if os.path.exists("/usr/sbin/nats-server")
                                           else None)


class NatsServer:
    def __init__(self) -> None:
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self.dir = tempfile.mkdtemp(prefix="pointsman-nats-")
        self._log = os.path.join(self.dir, "nats.log")

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def start(self, port: int | None = None) -> NatsServer:
        binary = nats_binary()
        if binary is None:
            raise RuntimeError("nats-server is not installed: run `bash scripts/bootstrap.sh --test-deps` (it "
                               "installs Debian's nats-server) or `apt-get install -y nats-server`")
        for attempt in range(5):
            self.port = port or free_port()
            self.proc = subprocess.Popen(
                [binary, "-a", "127.0.0.1", "-p", str(self.port), "-js", "-sd", os.path.join(self.dir, "store"),
                 "-l", self._log], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            try:
                wait_port(self.port, timeout=10, proc=self.proc, what="nats-server")
                self._wait_jetstream()
                return self
            except RuntimeError:
                self.kill()
                if port is not None or attempt == 4:
                    raise RuntimeError(f"nats-server failed to start: {self.log_tail()}") from None
        return self

    def _wait_jetstream(self) -> None:
        """The port answers before JetStream has recovered its streams: wait for the log line that says it has."""
        deadline = time.monotonic() + 10
        while "Server is ready" not in self.log_tail(20_000):
            if time.monotonic() > deadline:
                raise RuntimeError("nats-server never said it was ready")
            time.sleep(0.02)

    def log_tail(self, n: int = 2000) -> str:
        try:
            with open(self._log) as f:
                return f.read()[-n:]
        except OSError:
            return "(no log)"

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)
        if os.path.exists(self._log):
            os.replace(self._log, self._log + ".old")  # the next start's readiness is read from a fresh log

    def restart(self) -> None:
        """Kill, then start again on the same port and store."""
        self.kill()
        deadline = time.monotonic() + 10
        while True:
            try:
                self.start(self.port)
                return
            except RuntimeError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    def stop(self) -> None:
        self.kill()
        shutil.rmtree(self.dir, ignore_errors=True)


def started() -> NatsServer:
    """A started NatsServer for a fixture; skips the test when nats-server is not installed."""
    if nats_binary() is None:
        pytest.skip("nats-server is not installed (bash scripts/bootstrap.sh --test-deps installs it)")
    return NatsServer().start()
