"""Helpers shared by the KV-event tests."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable


async def wait_for(cond: Callable[[], bool], timeout: float = 3.0, interval: float = 0.002) -> float:
    """Poll `cond` until true; returns the seconds it took. Fails the test on timeout."""
    t0 = time.monotonic()
    while not cond():
        if time.monotonic() - t0 > timeout:
            raise AssertionError(f"condition not met within {timeout}s")
        await asyncio.sleep(interval)
    return time.monotonic() - t0
