from __future__ import annotations

import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from epp.stack.ports import free_port_block  # noqa: E402
from modelsim.config import EngineConfig, FleetConfig  # noqa: E402
from modelsim.fleet import Fleet  # noqa: E402

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
