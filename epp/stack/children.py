"""Child processes that never outlive the process that started them (the local stack, the benchmarks).

The local stack starts modelsim, Pointsman and Envoy in sessions of their own (so Ctrl-C reaches only the stack,
which stops them in order). If the stack itself is killed (SIGKILL, a test's timeout), nothing would stop them:
on Linux the kernel sends them SIGTERM when their parent dies (PR_SET_PDEATHSIG). The child asks for it itself,
through a small Python shim that then execs the command (`with_parent`): no Python code runs between fork and exec
in the parent's image, which is not safe once the parent has threads (grpc's poller, in the stack, aborted a
child that way now and then).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import IO

# Runs in the child before it execs the command: PR_SET_PDEATHSIG (1) asks for SIGTERM when the parent dies.
_SHIM = ("import ctypes, os, signal, sys\n"
         "ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM, 0, 0, 0)\n"
         "if os.getppid() != int(sys.argv[1]):\n"  # the parent died before prctl: go too
         "    sys.exit(1)\n"
         "os.execvp(sys.argv[2], sys.argv[2:])\n")


def with_parent(cmd: list[str]) -> list[str]:
    """`cmd` run so that it gets SIGTERM when the calling process dies (Linux; elsewhere `cmd` as it is)."""
    if not sys.platform.startswith("linux"):
        return cmd
    return [sys.executable, "-c", _SHIM, str(os.getpid()), *cmd]


class Children:
    """The stack's processes, each in a session of its own with its output in `<dir>/<name>.log`; a captured one's
    output is also scanned for Pointsman's decision lines (the live view shows them)."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.procs: list[tuple[str, subprocess.Popen[bytes]]] = []
        self.decisions: list[str] = []
        self._lock = threading.Lock()

    def spawn(self, name: str, cmd: list[str], capture: bool = False) -> subprocess.Popen[bytes]:
        log = open(self.dir / f"{name}.log", "wb")  # noqa: SIM115 - lives as long as the process
        proc = subprocess.Popen(with_parent(cmd), stdout=log if not capture else subprocess.PIPE,
                                stderr=subprocess.STDOUT, start_new_session=True)
        self.procs.append((name, proc))
        if capture:
            threading.Thread(target=self._tail, args=(proc, log), daemon=True).start()
        return proc

    def _tail(self, proc: subprocess.Popen[bytes], log: IO[bytes]) -> None:
        assert proc.stdout is not None
        for raw in proc.stdout:
            log.write(raw)
            log.flush()
            line = raw.decode(errors="replace").rstrip()
            if " decision " in line:
                with self._lock:
                    self.decisions.append(line.split(" decision ", 1)[1])

    def recent_decisions(self, n: int = 8) -> list[str]:
        """The last `n` decision lines since the previous call."""
        with self._lock:
            recent, self.decisions = self.decisions[-n:], []
        return recent

    def check(self) -> None:
        """RuntimeError naming a process that exited (and its log)."""
        for name, proc in self.procs:
            if proc.poll() is not None:
                raise RuntimeError(f"{name} exited with code {proc.returncode}; see {self.dir}/{name}.log")

    def stop(self) -> None:
        """SIGTERM to each session, the last started first; then wait (10 s each) and kill what is left."""
        for _name, proc in reversed(self.procs):
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        for _name, proc in self.procs:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
