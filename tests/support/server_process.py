"""A server binary that a test runs itself: on a loopback port, in a temp dir, never daemonized.

A subclass says how to start it (`command`) and, if the open port is not enough, how to tell it is ready
(`ready`). The server can be paused (SIGSTOP: connections stay open, nothing is answered), resumed, killed and
restarted on the same port (a broker or store restart), and stopped (its directory goes).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time

from epp.stack.ports import free_port, wait_port


class ServerProcess:
    what = "server"  # the binary's name, in errors

    def __init__(self) -> None:
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self.dir = tempfile.mkdtemp(prefix=f"pointsman-{self.what}-")
        self.log_path = os.path.join(self.dir, f"{self.what}.log")

    def command(self, port: int) -> list[str]:
        raise NotImplementedError

    def ready(self) -> None:
        """Called once the port answers; waits for whatever else the server must do before it serves."""

    def start(self, port: int | None = None) -> ServerProcess:
        for attempt in range(5):
            self.port = port or free_port()
            self.proc = subprocess.Popen(self.command(self.port), stdout=subprocess.DEVNULL,
                                         stderr=subprocess.DEVNULL)
            try:
                wait_port(self.port, timeout=10, proc=self.proc, what=self.what)
                self.ready()
                return self
            except RuntimeError:
                tail = self.log_tail()
                self.kill()
                if port is not None or attempt == 4:  # a fixed port that is taken, or out of attempts
                    raise RuntimeError(f"{self.what} failed to start: {tail}") from None
        return self

    def log_tail(self, n: int = 2000) -> str:
        try:
            with open(self.log_path) as f:
                return f.read()[-n:]
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
        if os.path.exists(self.log_path):
            os.replace(self.log_path, self.log_path + ".old")  # the next start's readiness is read from a fresh log

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
        shutil.rmtree(self.dir, ignore_errors=True)
