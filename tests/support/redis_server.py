"""A real Debian redis-server for tests: on an OS-chosen loopback port, in a temp dir, never daemonized.

`scripts/test.sh` installs redis-server when it is missing (`scripts/bootstrap.sh --test-deps`, which calls
scripts/debian-packages.sh).
The server can be paused (SIGSTOP: it stops answering, connections hang), resumed, killed and restarted on the
same port, which is how the tests make Redis hang, die and come back.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time

from epp.stack.ports import free_port, wait_port


def redis_binary() -> str:
    path = shutil.which("redis-server") or ("/usr/bin/redis-server" if os.path.exists("/usr/bin/redis-server")
                                            else None)
    if path is None:
        raise RuntimeError("redis-server is not installed: run `bash scripts/bootstrap.sh --test-deps` (it installs "
                           "Debian's redis-server) or `apt-get install -y redis-server`")
    return path


class RedisServer:
    def __init__(self) -> None:
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self._dir = tempfile.mkdtemp(prefix="pointsman-redis-")
        self._log = os.path.join(self._dir, "redis.log")

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, port: int | None = None) -> RedisServer:
        binary = redis_binary()
        for attempt in range(5):
            self.port = port or free_port()
            self.proc = subprocess.Popen(
                [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                 "--dir", self._dir, "--daemonize", "no", "--logfile", self._log, "--protected-mode", "yes"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )
            try:
                wait_port(self.port, timeout=10, proc=self.proc, what="redis-server")
                return self
            except RuntimeError:
                if port is not None or attempt == 4:  # a fixed port that is taken, or out of attempts
                    raise RuntimeError(f"redis-server failed to start: {self.log_tail()}") from None
        return self

    def log_tail(self) -> str:
        try:
            with open(self._log) as f:
                return f.read()[-2000:]
        except OSError:
            return "(no log)"

    def pause(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGCONT)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGCONT)  # a paused process must run to die cleanly
            self.proc.kill()
            self.proc.wait(timeout=10)

    def restart(self) -> None:
        """Start again on the same port (after kill)."""
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
        shutil.rmtree(self._dir, ignore_errors=True)
