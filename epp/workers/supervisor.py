"""The supervisor of `epp serve --workers N` (see epp/workers/__init__.py for what it promises).

Failure policy, chosen so that nothing fails quietly:
- a worker that exits before it ever answered on its control socket could not start (a bad flag or config, a port
  it cannot bind): the whole group stops and exits 1, naming the worker and its exit status;
- a worker that dies later is restarted after a backoff (0.5 s, doubling to 10 s with the recent deaths); the
  others keep serving meanwhile (the kernel stops handing the dead worker's socket new connections, and its shared
  load expires on the siblings within the bus ttl);
- more than MAX_RESTARTS deaths within RESTART_WINDOW_S is a crash loop: the group stops and exits 1, so the
  orchestrator sees a failed pod instead of a pod that limps.
Readiness is withdrawn while any worker is down, and liveness ends only when the supervisor stops.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import signal
import socket
import sys
import tempfile
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import aiohttp

from epp.aio import cancel_all
from epp.workers.control import control_socket

if TYPE_CHECKING:
    from epp.cmd.settings import ServeSettings
    from epp.workers.front import Front

log = logging.getLogger("epp.workers")

MAX_RESTARTS = 5
RESTART_WINDOW_S = 60.0
STATUS_POLL_S = 0.25
STATUS_FRESH_S = 2.0
STOP_GRACE_S = 15.0
SECRET_FLAGS = {"--bus-secret": "POINTSMAN_BUS_SECRET", "--dashboard-token": "POINTSMAN_DASHBOARD_TOKEN"}


@dataclass
class Worker:
    index: int
    proc: asyncio.subprocess.Process | None = None
    started_at: float = 0.0
    status: dict[str, Any] | None = None
    status_at: float = 0.0
    answered: bool = False  # its control socket answered at least once (it came up)
    restarts: int = 0
    session: aiohttp.ClientSession | None = None

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.returncode is None

    def ready(self, now: float) -> bool:
        st = self.status
        return self.alive and st is not None and bool(st.get("ready")) and now - self.status_at < STATUS_FRESH_S


@dataclass
class Supervisor:
    settings: ServeSettings
    dir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="pointsman-workers-")))
    workers: list[Worker] = field(default_factory=list)
    port: int = 0
    exit_code: int = 0
    stopping: bool = False
    deaths: deque[float] = field(default_factory=deque)
    _reservation: socket.socket | None = None
    _stop: asyncio.Event = field(default_factory=asyncio.Event)
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)

    @property
    def metrics_dir(self) -> Path:
        return self.dir / "metrics"

    # ---- setup -------------------------------------------------------------------------------------------
    def reserve_port(self) -> None:
        """Hold the gRPC port with SO_REUSEPORT (bound, never listening): port 0 becomes a real port the workers
        can share, and no other program takes the port while workers restart."""
        host, port = self.settings.server.grpc_host, self.settings.server.grpc_port
        info = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
        sock = socket.socket(info[0], socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        try:
            sock.bind(info[4])
        except OSError as e:
            sock.close()
            raise RuntimeError(f"cannot bind the gRPC port {host}:{port}: {e}") from None
        self._reservation = sock
        self.port = sock.getsockname()[1]

    def prepare_tls(self) -> list[str]:
        """With --secure-serving and no --cert-path, one self-signed certificate for every worker."""
        if not self.settings.server.secure or self.settings.server.cert_path:
            return []
        from epp.h2grpc import CERT_FILE, KEY_FILE, self_signed_cert

        key, crt = self_signed_cert()
        tls = self.dir / "tls"
        tls.mkdir(mode=0o700)
        (tls / KEY_FILE).write_bytes(key)
        (tls / CERT_FILE).write_bytes(crt)
        return ["--cert-path", str(tls)]

    def worker_argv(self, index: int, extra: list[str]) -> list[str]:
        out: list[str] = []
        skip = False
        for tok in self.settings.argv:
            if skip:
                skip = False
                continue
            flag = tok.split("=", 1)[0]
            if flag in SECRET_FLAGS:  # secrets go through the environment, never a command line
                skip = "=" not in tok
                continue
            out.append(tok)
        return [sys.executable, "-m", "epp.cmd.cli", *out, *extra,
                "--grpc-port", str(self.port), "--grpc-health-port", "0", "--metrics-port", "0",
                "--workers", str(self.settings.replicas.workers), "--worker-index", str(index), "--worker-dir", str(self.dir)]

    def worker_env(self) -> dict[str, str]:
        env = dict(os.environ)
        env["PROMETHEUS_MULTIPROC_DIR"] = str(self.metrics_dir)
        if self.settings.replicas.secret:
            env["POINTSMAN_BUS_SECRET"] = self.settings.replicas.secret
        if self.settings.dashboard.token:
            env["POINTSMAN_DASHBOARD_TOKEN"] = self.settings.dashboard.token
        return env

    # ---- workers -----------------------------------------------------------------------------------------
    async def spawn(self, w: Worker, extra: list[str]) -> None:
        w.status, w.answered = None, False
        w.proc = await asyncio.create_subprocess_exec(*self.worker_argv(w.index, extra), env=self.worker_env())
        w.started_at = time.monotonic()
        log.info("worker %d started (pid %d)", w.index, w.proc.pid)

    async def monitor(self, w: Worker, extra: list[str]) -> None:
        while not self.stopping:
            assert w.proc is not None
            code = await w.proc.wait()
            self._mark_dead(w.proc.pid)
            if self.stopping:
                return
            how = f"was killed by {signal.Signals(-code).name}" if code < 0 else f"exited with code {code}"
            if not w.answered:
                log.error("worker %d (pid %d) %s before it came up; stopping all workers", w.index, w.proc.pid, how)
                self.fail()
                return
            now = time.monotonic()
            self.deaths.append(now)
            while self.deaths and now - self.deaths[0] > RESTART_WINDOW_S:
                self.deaths.popleft()
            if len(self.deaths) > MAX_RESTARTS:
                log.error("worker %d (pid %d) %s: %d worker deaths within %.0f s is a crash loop; stopping all "
                          "workers", w.index, w.proc.pid, how, len(self.deaths), RESTART_WINDOW_S)
                self.fail()
                return
            delay = min(10.0, 0.5 * 2 ** (len(self.deaths) - 1))
            log.error("worker %d (pid %d) %s; restarting it in %.1f s", w.index, w.proc.pid, how, delay)
            await asyncio.sleep(delay)
            if self.stopping:
                return
            w.restarts += 1
            await self.spawn(w, extra)

    def _mark_dead(self, pid: int) -> None:
        from prometheus_client import multiprocess

        with contextlib.suppress(Exception):
            multiprocess.mark_process_dead(pid, str(self.metrics_dir))  # its live gauges go; its counters stay

    def fail(self) -> None:
        self.exit_code = 1
        self._stop.set()

    async def poll_status(self) -> None:
        while True:
            await asyncio.gather(*(self._poll(w) for w in self.workers))
            await asyncio.sleep(STATUS_POLL_S)

    async def _poll(self, w: Worker) -> None:
        if not w.alive:
            return
        try:
            async with self.session(w).get("http://worker/-/status", timeout=aiohttp.ClientTimeout(total=1)) as r:
                w.status = await r.json()
                w.status_at = time.monotonic()
                w.answered = True
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError, ValueError):
            pass

    def session(self, w: Worker) -> aiohttp.ClientSession:
        if w.session is None or w.session.closed:
            w.session = aiohttp.ClientSession(connector=aiohttp.UnixConnector(path=control_socket(str(self.dir),
                                                                                                  w.index)),
                                              auto_decompress=False)
        return w.session

    def ready(self) -> bool:
        now = time.monotonic()
        return not self.stopping and all(w.ready(now) for w in self.workers)

    def live(self) -> list[Worker]:
        now = time.monotonic()
        return [w for w in self.workers if w.alive and w.status is not None and now - w.status_at < STATUS_FRESH_S]

    def describe(self) -> dict[str, Any]:
        now = time.monotonic()
        return {"workers": self.settings.replicas.workers, "port": self.port, "ready": self.ready(), "processes": [
            {"index": w.index, "pid": w.proc.pid if w.proc else None, "alive": w.alive, "ready": w.ready(now),
             "restarts": w.restarts, "status": w.status} for w in self.workers]}

    # ---- lifecycle ---------------------------------------------------------------------------------------
    async def run(self) -> int:
        from epp.workers.front import start_front

        self.metrics_dir.mkdir()
        self.reserve_port()
        extra = self.prepare_tls()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, self._stop.set)
        front = await start_front(self)
        try:
            self.workers = [Worker(i) for i in range(self.settings.replicas.workers)]
            for w in self.workers:
                await self.spawn(w, extra)
            self._tasks = [loop.create_task(self.monitor(w, extra), name=f"worker-{w.index}") for w in self.workers]
            self._tasks.append(loop.create_task(self.poll_status(), name="worker-status"))
            log.info("Pointsman serving ext_proc on %s:%d with %d workers (SO_REUSEPORT)",
                     self.settings.server.grpc_host, self.port, self.settings.replicas.workers)
            await self._stop.wait()
        finally:
            await self.shutdown(front)
        return self.exit_code

    async def shutdown(self, front: Front) -> None:
        self.stopping = True
        front.health.enter_graceful_shutdown()
        for w in self.workers:
            if w.alive:
                assert w.proc is not None
                with contextlib.suppress(ProcessLookupError):
                    w.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE_S
        for w in self.workers:
            if w.proc is None:
                continue
            try:
                await asyncio.wait_for(w.proc.wait(), max(0.1, deadline - time.monotonic()))
            except asyncio.TimeoutError:
                log.error("worker %d (pid %d) did not stop within %.0f s; killing it", w.index, w.proc.pid,
                          STOP_GRACE_S)
                with contextlib.suppress(ProcessLookupError):
                    w.proc.kill()
                await w.proc.wait()
        await cancel_all(self._tasks)
        for w in self.workers:
            if w.session is not None:
                await w.session.close()
        await front.stop()
        if self._reservation is not None:
            self._reservation.close()
        shutil.rmtree(self.dir, ignore_errors=True)


def run_supervisor(settings: ServeSettings) -> int:
    """Run the workers of `settings` (its `argv` is each worker's command line) until stopped."""
    v = settings.runtime.verbosity
    level = logging.DEBUG if v >= 3 else logging.INFO if v >= 1 else logging.WARNING
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    async def main() -> int:
        sup = Supervisor(settings)
        try:
            return await sup.run()
        except (RuntimeError, OSError, ValueError) as e:
            log.error("cannot start: %s", e)
            shutil.rmtree(sup.dir, ignore_errors=True)
            return 1

    try:
        return asyncio.run(main())
    except KeyboardInterrupt:
        return 0
