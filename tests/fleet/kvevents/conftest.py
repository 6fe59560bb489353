from __future__ import annotations

import sys
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[3]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from epp.stack.ports import free_port_block  # noqa: E402  (below the ephemeral range: no TIME_WAIT clashes)
from modelsim.config import EngineConfig, FleetConfig  # noqa: E402
from modelsim.fleet import Fleet  # noqa: E402
from tests.support.nats_server import NatsServer  # noqa: E402


@pytest.fixture
def nats_server() -> Iterator[NatsServer]:
    """A real nats-server with JetStream on a free port."""
    server = NatsServer().start()
    yield server
    server.stop()


@pytest.fixture
async def make_fleet() -> AsyncIterator[Callable[..., Any]]:
    """modelsim fleets publishing KV events (and serving replay) on OS-chosen free ports."""
    fleets: list[Fleet] = []

    async def factory(servers: int = 1, replay: bool = True, engine: EngineConfig | None = None,
                      **kw: Any) -> Fleet:
        cfg = FleetConfig(servers=servers, base_port=free_port_block(servers), engine=engine or EngineConfig(),
                          kv_events_port=free_port_block(servers),
                          kv_events_replay_port=free_port_block(servers) if replay else None,
                          time_scale=kw.pop("time_scale", 0.05), **kw)
        fleet = Fleet(cfg)
        await fleet.start()
        fleets.append(fleet)
        return fleet

    yield factory
    for f in fleets:
        await f.stop()
