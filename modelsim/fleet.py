"""Start and stop N simulated servers in one asyncio process."""

from __future__ import annotations

from modelsim.config import FleetConfig
from modelsim.server import SimServer


class Fleet:
    def __init__(self, config: FleetConfig) -> None:
        self.config = config
        self.servers = [SimServer(config, i) for i in range(config.servers)]
        for s in self.servers:
            s.peers = self.servers  # for /admin/fleet/probe

    @property
    def urls(self) -> list[str]:
        return [f"http://{s.host}:{s.port}" for s in self.servers]

    async def start(self) -> None:
        started: list[SimServer] = []
        try:
            for s in self.servers:
                await s.start()
                started.append(s)
        except BaseException:
            for s in started:
                await s.stop()
            raise

    async def stop(self) -> None:
        for s in self.servers:
            await s.stop()

    async def __aenter__(self) -> Fleet:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()
