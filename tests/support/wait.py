"""Waiting for a condition instead of sleeping a fixed time: poll until it holds, fail clearly at the deadline.

`await until(cond, timeout, what)` polls `cond()` (plain or async: a coroutine it returns is awaited) every
`interval` seconds until it returns something truthy, and returns that value; past `timeout` seconds it raises
AssertionError naming `what` (a string, or a callable giving one, so the message can show the state at the
deadline). `wait_until` is the same for synchronous tests (a browser, a subprocess).
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Callable
from typing import Any


def _message(what: str | Callable[[], str], timeout: float) -> str:
    text = what() if callable(what) else what
    return f"timed out after {timeout:g} s waiting for {text}"


async def until(cond: Callable[[], Any], timeout: float, what: str | Callable[[], str],
                interval: float = 0.02) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        got = cond()
        if inspect.isawaitable(got):
            got = await got
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(_message(what, timeout))
        await asyncio.sleep(interval)


def wait_until(cond: Callable[[], Any], timeout: float, what: str | Callable[[], str],
               interval: float = 0.02) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        got = cond()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(_message(what, timeout))
        time.sleep(interval)
