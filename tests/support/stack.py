"""An in-process Pointsman + echo fleet + a real Envoy subprocess, for end-to-end tests."""

from __future__ import annotations

import asyncio
from pathlib import Path

import yaml

from epp.cmd.app import App
from epp.cmd.settings import ServeSettings
from epp.envoy_config import EnvoyConfigSpec, render_yaml
from tests.support.backend import EchoFleet
from tests.support.envoy import Envoy, free_port


def serve_args(*extra: str) -> ServeSettings:
    """`epp serve`'s settings for a test: loopback, plaintext gRPC (`--secure-serving=true` in `extra` for TLS), no
    health or metrics port, seeded; `extra` flags on top."""
    return ServeSettings.from_argv(["--grpc-host", "127.0.0.1", "--secure-serving=false", "--grpc-health-port", "0",
                                    "--metrics-port", "0", "--seed", "7", *extra])


class Stack:
    def __init__(self, tmp: Path, variant: str = "original-dst", backends: int = 3, epp_flags: tuple[str, ...] = (),
                 models: list[str] | None = None, envoy_overrides: dict | None = None, eds: bool = False) -> None:
        self.tmp = tmp
        self.variant = variant
        self.ports = [free_port() for _ in range(backends)]
        self.fleet = EchoFleet(self.ports)
        self.epp_port = free_port()
        self.listen_port = free_port()
        self.admin_port = free_port()
        self.epp_flags = epp_flags
        self.models = models or []
        self.envoy_overrides = envoy_overrides or {}
        self.eds = eds  # override-host pool cluster fed by Pointsman's EDS (the endpoints file drives both)
        self.active = list(self.ports)  # the ports in the endpoints file
        self.app: App | None = None
        self.envoy: Envoy | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.listen_port}"

    def endpoints_file(self, ports: list[int] | None = None, address: str = "127.0.0.1") -> Path:
        """Write the endpoints file (all of `ports`, default the active ones); atomic, as an editor would save."""
        if ports is not None:
            self.active = list(ports)
        doc = {"pools": [{"name": "pool", "endpoints": [
            {"address": address, "port": p, "name": f"echo-{p}", "models": self.models}
            for p in self.active]}]}
        path = self.tmp / "endpoints.yaml"
        tmp = self.tmp / "endpoints.yaml.tmp"
        tmp.write_text(yaml.safe_dump(doc))
        tmp.replace(path)
        return path

    async def start_epp(self) -> None:
        args = serve_args("--grpc-port", str(self.epp_port), "--endpoints-file", str(self.endpoints_file()),
                          *self.epp_flags)
        self.app = App(args)
        await self.app.start()

    async def stop_epp(self) -> None:
        if self.app is not None:
            await self.app.stop(0)
            self.app = None

    async def start(self) -> None:
        await self.fleet.start()
        await self.start_epp()
        if self.eds:
            spec = EnvoyConfigSpec(variant="override-host", eds=True, pool_name="pool", listen_port=self.listen_port,
                                   admin_port=self.admin_port, epp_port=self.epp_port, **self.envoy_overrides)
        else:
            spec = EnvoyConfigSpec(variant=self.variant, listen_port=self.listen_port, admin_port=self.admin_port,
                                   epp_port=self.epp_port, endpoints=[("127.0.0.1", p) for p in self.ports],
                                   **self.envoy_overrides)
        self.envoy = Envoy(render_yaml(spec), self.listen_port, self.admin_port)
        await asyncio.to_thread(self.envoy.start)

    async def stop(self) -> None:
        if self.envoy:
            self.envoy.stop()
        await self.stop_epp()
        await self.fleet.stop()
