"""Waiting for a condition instead of sleeping a fixed time: poll until it holds, fail clearly at the deadline.

`await until(cond, timeout, what)` polls `cond()` (plain or async: a coroutine it returns is awaited) every
`interval` seconds until it returns something truthy, and returns that value; past `timeout` seconds it raises
AssertionError naming `what` (a string, or a callable giving one, so the message can show the state at the
deadline; without it, the condition's source line). `blocking=True` runs a `cond` that blocks (an HTTP call to
Envoy's admin) in a worker thread. `seconds_until` is `until` answering how long the condition took to hold (for a
test that measures it). `wait_until` is the same for synchronous tests (a browser, a subprocess). Every test waits
through these; no test file keeps a polling loop of its own.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Callable
from typing import Any


def _message(what: str | Callable[[], str] | None, cond: Callable[[], Any], timeout: float) -> str:
    if what is None:
        try:
            text = " ".join(inspect.getsource(cond).split())
        except (OSError, TypeError):
            text = repr(cond)
    else:
        text = what() if callable(what) else what
    return f"timed out after {timeout:g} s waiting for {text}"


async def until(cond: Callable[[], Any], timeout: float, what: str | Callable[[], str] | None = None,
                interval: float = 0.02, *, blocking: bool = False) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        got = await asyncio.to_thread(cond) if blocking else cond()
        if inspect.isawaitable(got):
            got = await got
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(_message(what, cond, timeout))
        await asyncio.sleep(interval)


async def seconds_until(cond: Callable[[], Any], timeout: float, what: str | Callable[[], str] | None = None,
                        interval: float = 0.02, *, blocking: bool = False) -> float:
    start = time.monotonic()
    await until(cond, timeout, what, interval, blocking=blocking)
    return time.monotonic() - start


def wait_until(cond: Callable[[], Any], timeout: float, what: str | Callable[[], str] | None = None,
               interval: float = 0.02) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        got = cond()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(_message(what, cond, timeout))
        time.sleep(interval)
