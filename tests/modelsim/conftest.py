from __future__ import annotations

import socket
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from modelsim.config import EngineConfig, FleetConfig  # noqa: E402
from modelsim.fleet import Fleet  # noqa: E402


def free_port_block(n: int) -> int:
    """A base port with n consecutive free ports (best effort)."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base = s.getsockname()[1]
        if base + n >= 65535:
            continue
        ok = True
        for p in range(base, base + n):
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", p))
                except OSError:
                    ok = False
                    break
        if ok:
            return base
    raise RuntimeError("no free port block")


FleetFactory = Callable[..., Any]


@pytest.fixture
async def make_fleet() -> AsyncIterator[FleetFactory]:
    fleets: list[Fleet] = []

    async def factory(servers: int = 1, kv_events: bool = False, engine: EngineConfig | None = None,
                      **kw: Any) -> Fleet:
        base = free_port_block(servers)
        cfg = FleetConfig(servers=servers, base_port=base, engine=engine or EngineConfig(),
                          kv_events_port=free_port_block(servers) if kv_events else None, **kw)
        fleet = Fleet(cfg)
        await fleet.start()
        fleets.append(fleet)
        return fleet

    yield factory
    for f in fleets:
        await f.stop()
