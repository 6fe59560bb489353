"""A modelsim fleet (in-process) + Pointsman (`epp serve` as a real process, stoppable and restartable on the same
port) + a real Envoy, for failure drills: Pointsman killed under traffic, model servers killed or hung."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from epp.envoy_config import EnvoyConfigSpec, render_yaml
from epp.stack.ports import wait_port
from modelsim.config import EngineConfig, FleetConfig
from modelsim.fleet import Fleet
from tests.support.envoy import Envoy, cluster_hosts, free_port
from tests.support.wait import until

MODEL = "meta-llama/Llama-3.1-8B"


class SimStack:
    def __init__(self, servers: int = 3, *, epp_flags: tuple[str, ...] = (), failure_mode: str = "closed",
                 response_phases: str = "full", time_scale: float = 0.05, config_text: str | None = None,
                 engine: EngineConfig | None = None, envoy_overrides: dict | None = None) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="pointsman-simstack-"))
        self.ports = [free_port() for _ in range(servers)]
        self.fleet = Fleet(FleetConfig(servers=servers, ports=tuple(self.ports), time_scale=time_scale,
                                       engine=engine or EngineConfig()))
        self.epp_port = free_port()
        self.metrics_port = free_port()
        self.listen_port = free_port()
        self.admin_port = free_port()
        self.epp_flags = epp_flags
        self.failure_mode = failure_mode
        self.response_phases = response_phases
        self.config_text = config_text
        self.envoy_overrides = envoy_overrides or {}
        self.epp: subprocess.Popen[bytes] | None = None
        self.envoy: Envoy | None = None
        self.epp_log = self.dir / "epp.log"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.listen_port}"

    def server_url(self, i: int) -> str:
        return f"http://127.0.0.1:{self.ports[i]}"

    def key(self, i: int) -> str:
        return f"127.0.0.1:{self.ports[i]}"

    def endpoints_file(self) -> Path:
        path = self.dir / "endpoints.yaml"
        doc = {"pools": [{"name": "pool", "endpoints": [
            {"address": "127.0.0.1", "port": p, "name": f"modelsim-{i}", "models": [MODEL]}
            for i, p in enumerate(self.ports)]}]}
        path.write_text(yaml.safe_dump(doc))
        return path

    def start_epp(self) -> None:
        """Start `epp serve` (a real process) and wait until its gRPC port listens."""
        argv = [sys.executable, "-m", "epp.cmd.cli", "serve", "--secure-serving=false", "--grpc-host", "127.0.0.1",
                "--grpc-port", str(self.epp_port), "--grpc-health-port", "0",
                "--metrics-port", str(self.metrics_port), "--endpoints-file", str(self.endpoints_file()),
                "--enable-conformance-header", "--seed", "7", *self.epp_flags]
        if self.config_text:
            cfg = self.dir / "config.yaml"
            cfg.write_text(self.config_text)
            argv += ["--config-file", str(cfg)]
        log = open(self.epp_log, "ab")  # noqa: SIM115 - handed to the child
        self.epp = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                    env={**os.environ, "PYTHONUNBUFFERED": "1"})
        log.close()
        try:
            wait_port(self.epp_port, timeout=30)
        except TimeoutError:
            raise RuntimeError(f"epp did not start:\n{self.epp_log.read_text()}") from None

    def kill_epp(self, sig: int = signal.SIGKILL) -> None:
        if self.epp is not None and self.epp.poll() is None:
            self.epp.send_signal(sig)
            try:
                self.epp.wait(15)
            except subprocess.TimeoutExpired:
                self.epp.kill()
                self.epp.wait(5)
        self.epp = None

    async def start(self) -> None:
        await self.fleet.start()
        await asyncio.to_thread(self.start_epp)
        spec = EnvoyConfigSpec(variant="override-host", eds=True, pool_name="pool", listen_port=self.listen_port,
                               admin_port=self.admin_port, epp_port=self.epp_port, failure_mode=self.failure_mode,
                               response_phases=self.response_phases, **self.envoy_overrides)
        self.envoy = Envoy(render_yaml(spec), self.listen_port, self.admin_port)
        await asyncio.to_thread(self.envoy.start)
        await self.wait_for_pool()
        await self.wait_routed()

    async def wait_for_pool(self, timeout: float = 15.0) -> None:
        """Until Envoy has every server in its pool cluster (EDS delivered) and Pointsman has scraped them all."""
        want = set(self.ports)
        hosts: dict[int, str] = {}

        def complete() -> bool:
            hosts.clear()
            hosts.update(cluster_hosts(self.admin_port))
            return set(hosts) == want and all(v in ("HEALTHY", "") for v in hosts.values())

        await until(complete, timeout, lambda: f"Envoy's pool to hold {sorted(want)}: {hosts}", 0.1, blocking=True)

    async def wait_routed(self, timeout: float = 15.0) -> None:
        """Until requests are routed by Pointsman (Envoy's health check of it passed, its scrapes are in): five in a
        row land on the server the conformance header names."""
        import aiohttp

        body = {"model": MODEL, "messages": [{"role": "user", "content": "warm-up"}], "max_tokens": 1}
        deadline = time.monotonic() + timeout
        streak = 0
        async with aiohttp.ClientSession() as c:
            while streak < 5:
                if time.monotonic() > deadline:
                    raise RuntimeError("requests never got routed by Pointsman")
                async with c.post(self.url + "/v1/chat/completions", json=body,
                                  headers={"test-epp-endpoint-selection": self.key(0)}) as r:
                    await r.read()
                    ok = r.status == 200 and r.headers.get("x-inference-port") == str(self.ports[0])
                streak = streak + 1 if ok else 0
                if not ok:
                    await asyncio.sleep(0.1)

    async def stop(self) -> None:
        if self.envoy is not None:
            self.envoy.stop()
        await asyncio.to_thread(self.kill_epp, signal.SIGTERM)
        await self.fleet.stop()
