"""Fixtures shared by the bus tests."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from epp.stack.ports import free_port
from tests.support.backend import EchoFleet


@pytest.fixture
async def fleet() -> AsyncIterator[list[int]]:
    """Three echo model servers on free ports (their ports)."""
    ports = [free_port() for _ in range(3)]
    f = EchoFleet(ports)
    await f.start()
    yield ports
    await f.stop()
