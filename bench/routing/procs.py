"""Subprocess and port helpers for the benchmark (loopback only; every wait is bounded)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

import aiohttp

from epp.stack.children import with_parent
from epp.stack.ports import free_port_block

ROOT = Path(__file__).resolve().parents[2]


def free_ports(n: int) -> list[int]:
    """n distinct free ports (not necessarily consecutive)."""
    out: list[int] = []
    while len(out) < n:
        p = free_port_block(1)
        if p not in out:
            out.append(p)
    return out


class Proc:
    """A child process in its own process group, logging to a file."""

    def __init__(self, name: str, argv: Sequence[str], log_dir: Path, env: dict[str, str] | None = None) -> None:
        self.name = name
        self.argv = list(argv)
        log_dir.mkdir(parents=True, exist_ok=True)
        self.log_path = log_dir / f"{name}.log"
        self._log = open(self.log_path, "wb")  # noqa: SIM115 - closed in stop()
        full_env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
        full_env.update(env or {})
        self.popen = subprocess.Popen(with_parent(self.argv), stdout=self._log, stderr=subprocess.STDOUT,
                                      env=full_env, cwd=str(log_dir), start_new_session=True)

    def alive(self) -> bool:
        return self.popen.poll() is None

    def tail(self, n: int = 2000) -> str:
        try:
            return self.log_path.read_bytes()[-n:].decode(errors="replace")
        except OSError:
            return ""

    def stop(self, timeout: float = 5.0) -> None:
        if self.alive():
            try:
                os.killpg(self.popen.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            deadline = time.monotonic() + timeout
            while self.alive() and time.monotonic() < deadline:
                time.sleep(0.05)
            if self.alive():
                try:
                    os.killpg(self.popen.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                self.popen.wait(timeout=5)
        self._log.close()


async def wait_http(url: str, proc: Proc | None = None, timeout: float = 30.0, ok_below: int = 500) -> None:
    """Poll `url` until it answers with a status < ok_below; raise with the process log otherwise."""
    deadline = time.monotonic() + timeout
    last = ""
    async with aiohttp.ClientSession() as s:
        while time.monotonic() < deadline:
            if proc is not None and not proc.alive():
                raise RuntimeError(f"{proc.name} exited (rc={proc.popen.returncode}):\n{proc.tail()}")
            try:
                async with s.get(url, timeout=aiohttp.ClientTimeout(total=2)) as r:
                    if r.status < ok_below:
                        return
                    last = f"status {r.status}"
            except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
                last = str(exc)
            await asyncio.sleep(0.1)
    tail = proc.tail() if proc is not None else ""
    raise RuntimeError(f"{url} not ready after {timeout}s ({last})\n{tail}")


async def wait_tcp(port: int, proc: Proc | None = None, timeout: float = 30.0) -> None:
    """Wait until something accepts TCP connections on 127.0.0.1:port."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and not proc.alive():
            raise RuntimeError(f"{proc.name} exited (rc={proc.popen.returncode}):\n{proc.tail()}")
        try:
            _, w = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), 1.0)
            w.close()
            return
        except (OSError, asyncio.TimeoutError):
            await asyncio.sleep(0.1)
    raise RuntimeError(f"127.0.0.1:{port} not accepting after {timeout}s\n{proc.tail() if proc else ''}")
