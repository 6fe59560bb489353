"""Loopback port helpers shared by the local stack, the tests and the benchmarks."""

from __future__ import annotations

import random
import socket
import subprocess
import time
from collections import deque
from typing import Any


def wait_port(port: int, timeout: float = 30.0, proc: subprocess.Popen[Any] | None = None, what: str = "") -> None:
    """Block until something accepts connections on 127.0.0.1:port.

    Raises RuntimeError as soon as `proc` (the process expected to listen) exits, TimeoutError after `timeout`."""
    name = what or f"127.0.0.1:{port}"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{name} exited with code {proc.returncode} while starting")
        with socket.socket() as s:
            s.settimeout(0.2)
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise TimeoutError(f"{name} did not listen on 127.0.0.1:{port} within {timeout:.0f}s")


# Blocks of ports are picked below the kernel's ephemeral range (32768+): client sockets in TIME_WAIT after a busy
# run occupy ports there, and a bind to one of them fails.
_BLOCK_LO, _BLOCK_HI = 20000, 32000
_rng = random.Random()
_issued: deque[int] = deque(maxlen=512)  # handed out lately (4% of the range: blocks of 50 still fit)


def _bindable(port: int) -> bool:
    """Free for any listener: no SO_REUSEADDR, so a port with connections lingering in TIME_WAIT is not taken."""
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port() -> int:
    """A port that was free on 127.0.0.1 a moment ago, below the kernel's ephemeral range: a port the kernel hands
    out for bind(0) lies inside it, and any client socket opened before the caller binds may take it."""
    return free_port_block(1)


def free_port_block(n: int, attempts: int = 200) -> int:
    """A base port such that base .. base+n-1 were all free on 127.0.0.1 a moment ago (below the ephemeral range),
    and none of them was handed out by this process recently."""
    for _ in range(attempts):
        base = _rng.randrange(_BLOCK_LO, _BLOCK_HI - n)
        ports = range(base, base + n)
        if any(p in _issued for p in ports):
            continue
        if all(_bindable(p) for p in ports):
            _issued.extend(ports)
            return base
    raise RuntimeError(f"no block of {n} free ports found in {_BLOCK_LO}-{_BLOCK_HI}")
