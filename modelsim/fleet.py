"""Start and stop N simulated servers in one asyncio process."""

from __future__ import annotations

from aiohttp import web

from modelsim.config import FleetConfig
from modelsim.oracle import OracleRouter
from modelsim.server import SimServer


class Fleet:
    def __init__(self, config: FleetConfig) -> None:
        self.config = config
        self.servers = [SimServer(config, i) for i in range(config.servers)]
        for s in self.servers:
            s.peers = self.servers  # for /admin/fleet/probe
        self._oracle: web.AppRunner | None = None

    @property
    def urls(self) -> list[str]:
        return [f"http://{s.host}:{s.port}" for s in self.servers]

    async def start(self) -> None:
        started: list[SimServer] = []
        try:
            for s in self.servers:
                await s.start()
                started.append(s)
            if self.config.oracle_port is not None:
                self._oracle = web.AppRunner(OracleRouter(self.servers).app(), access_log=None,
                                             handle_signals=False)
                await self._oracle.setup()
                await web.TCPSite(self._oracle, self.config.host, self.config.oracle_port,
                                  reuse_address=True).start()
        except BaseException:
            for s in started:
                await s.stop()
            raise

    @property
    def oracle_url(self) -> str | None:
        port = self.config.oracle_port
        return None if port is None else f"http://{self.config.host}:{port}"

    async def stop(self) -> None:
        if self._oracle is not None:
            await self._oracle.cleanup()
        for s in self.servers:
            await s.stop()

    async def __aenter__(self) -> Fleet:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()
