"""Small asyncio helpers shared by the shell's background loops."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any


async def cancel_and_wait(task: asyncio.Task[Any] | None) -> None:
    """Cancel a background task and wait until it has really stopped."""
    if task is None:
        return
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


async def cancel_all(tasks: list[asyncio.Task[Any]]) -> None:
    """Cancel background tasks together, then wait until each has stopped; what a task raised on its way out is
    dropped (it is stopping)."""
    for t in tasks:
        t.cancel()
    for t in tasks:
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await t


async def wait_set(event: asyncio.Event, timeout: float | None) -> bool:
    """Wait until `event` is set or `timeout` passes; True if it was set.

    Not asyncio.wait_for: on Python 3.11 it can swallow a cancellation that arrives as the event fires, and a loop
    that waits here would then never stop. A timer that sets a private event cannot lose it."""
    if event.is_set():
        return True
    if timeout is None:
        await event.wait()
        return True
    loop = asyncio.get_running_loop()
    woken = asyncio.Event()
    waiter = loop.create_task(event.wait())
    timer = loop.call_later(timeout, woken.set)
    waiter.add_done_callback(lambda _: woken.set())
    try:
        await woken.wait()
    finally:
        timer.cancel()
        waiter.cancel()
    return event.is_set()
