"""`epp serve --workers 2` as a real process group: the workers share the gRPC port and their in-flight load, one
metrics endpoint sums them exactly, health reflects every worker, a config reload reaches every worker, a killed
worker is restarted without the totals going backwards, and a group that cannot start fails loudly."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path

import aiohttp
import grpc
import pytest
import yaml
from grpc_health.v1 import health_pb2, health_pb2_grpc

from epp.api.pb import pointsman_pb2 as api
from epp.api.pb import pointsman_pb2_grpc
from epp.stack.ports import free_port
from tests.support.backend import EchoFleet
from tests.support.extproc_requests import chat, open_request, route, stub_for
from tests.support.wait import until

ROOT = Path(__file__).resolve().parents[2]
CONFIG = """
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: prefix-cache-scorer
- type: queue-scorer
- type: max-score-picker
schedulingProfiles:
- name: default
  plugins:
  - {pluginRef: prefix-cache-scorer, weight: 2}
  - {pluginRef: queue-scorer, weight: 1}
  - pluginRef: max-score-picker
"""


class Group:
    def __init__(self, tmp: Path, ports: list[int], *extra: str, config: str = CONFIG) -> None:
        self.grpc, self.metrics, self.health = free_port(), free_port(), free_port()
        eps = tmp / "eps.yaml"
        eps.write_text(yaml.safe_dump({"pools": [{"name": "pool", "endpoints": [
            {"address": "127.0.0.1", "port": p} for p in ports]}]}))
        self.config = tmp / "sched.yaml"
        self.config.write_text(config)
        self.log = tmp / "group.log"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "epp.cmd.cli", "serve", "--secure-serving=false", "--workers", "2", "--grpc-host", "127.0.0.1",
             "--grpc-port", str(self.grpc), "--grpc-health-port", str(self.health), "--metrics-port",
             str(self.metrics), "--endpoints-file", str(eps), "--config-file", str(self.config), *extra],
            cwd=ROOT, stdout=open(self.log, "wb"), stderr=subprocess.STDOUT)  # noqa: SIM115

    async def workers(self) -> dict:
        async with aiohttp.ClientSession() as s, s.get(f"http://127.0.0.1:{self.metrics}/-/workers") as r:
            return await r.json()

    async def metrics_text(self) -> str:
        async with aiohttp.ClientSession() as s, s.get(f"http://127.0.0.1:{self.metrics}/metrics") as r:
            return await r.text()

    async def ready(self) -> bool:
        try:
            return (await self.workers())["ready"]
        except (aiohttp.ClientError, OSError):
            return False

    async def readiness(self) -> int:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{self.health}") as ch:
            resp = await health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service="readiness"),
                                                             timeout=5)
            return resp.status

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise


def total(text: str, name: str) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(name) and not line.startswith("#"))


@pytest.fixture
async def fleet():
    ports = [free_port() for _ in range(3)]
    f = EchoFleet(ports)
    await f.start()
    yield ports
    await f.stop()


SECRET = "sekrit-bus-key-4711"


async def test_two_workers_share_the_port_the_load_and_one_metrics_endpoint(tmp_path, fleet):
    g = Group(tmp_path, fleet, "--bus-secret", SECRET)
    channels = []
    try:
        await until(g.ready, 20.0, "both workers ready")
        assert await g.readiness() == health_pb2.HealthCheckResponse.SERVING
        procs = (await g.workers())["processes"]
        pids = [p["pid"] for p in procs]
        assert len(set(pids)) == 2 and g.proc.pid not in pids
        # The workers talk over signed bus messages; the secret reached them through the environment only.
        await until(lambda: _bus_up(g), 5, "the workers hear each other")
        for pid in pids:
            assert SECRET.encode() not in Path(f"/proc/{pid}/cmdline").read_bytes()

        # Many connections (one per channel): SO_REUSEPORT hands them to both workers.
        channels = [stub_for(g.grpc) for _ in range(16)]
        n = 0
        for _ in range(3):
            for _, stub in channels:
                await route(stub, chat(f"request {n} " * 20))
                n += 1
        procs = (await g.workers())["processes"]
        await until(lambda: _served(g, n), 5, "every request counted")
        procs = (await g.workers())["processes"]
        assert all(p["status"]["requests"] > 0 for p in procs), procs  # both workers took a share
        text = await g.metrics_text()
        assert total(text, "inference_objective_request_total{") == n  # exact across workers
        assert 'inference_pool_ready_pods{name="pool"} 3.0' in text
        assert text.count("# TYPE inference_objective_request_total counter") == 1

        # In-flight load is shared: requests held open on some connections are seen by every worker.
        held = [await open_request(stub, chat(f"held {i}")) for i, (_, stub) in enumerate(channels[:6])]
        for ch, _ in channels:
            stub = pointsman_pb2_grpc.PointsmanStub(ch)

            async def seen(stub=stub):
                resp = await stub.ListEndpoints(api.ListEndpointsRequest(), timeout=5)
                return sum(e.inflight for e in resp.endpoints) == 6

            await until(seen, 2, "every worker sees all 6 in-flight requests")
        assert total(await g.metrics_text(), "inference_objective_running_requests{") == 6
        for r in held:
            await r.finish()
        n += len(held)

        # A config reload reaches every worker.
        before = {p["index"]: p["status"]["reloads"]["scheduling config"] for p in procs}
        g.config.write_text(CONFIG.replace("weight: 2", "weight: 3"))

        async def reloaded():
            ps = (await g.workers())["processes"]
            return all(p["status"]["reloads"]["scheduling config"] > before[p["index"]] for p in ps)

        await until(reloaded, 10, "both workers reloaded")

        # The dashboard is proxied from one worker and says so.
        async with aiohttp.ClientSession() as s:
            async with s.get(f"http://127.0.0.1:{g.metrics}/") as r:
                assert r.status == 200 and "Pointsman" in await r.text()
            async with s.get(f"http://127.0.0.1:{g.metrics}/api/config") as r:
                scope = (await r.json())["scope"]
        assert scope["label"] == "worker 1 of 2" and "/metrics sums all workers" in scope["note"]

        # A killed worker is restarted; the totals never go backwards; the group serves on.
        victim = procs[1]["pid"]
        os.kill(victim, signal.SIGKILL)

        async def restarted():
            ws = await g.workers()
            p = ws["processes"][1]
            return ws["ready"] and p["restarts"] == 1 and p["pid"] != victim

        await until(restarted, 20, "worker 1 restarted and ready")
        text = await g.metrics_text()
        assert total(text, "inference_objective_request_total{") == n  # the dead worker's counts are kept
        assert total(text, "inference_objective_running_requests{") == 0
        assert "pointsman_worker_restarts_total 1.0" in text
        for _, stub in channels:
            await route(stub, chat("after the restart"))
        await until(lambda: _total_is(g, n + len(channels)), 5, "counted after the restart")
        assert "worker 1 (pid" in g.log.read_text() and "restarting it" in g.log.read_text()
    finally:
        for ch, _ in channels:
            await ch.close()
        code = g.stop()
    assert code == 0, g.log.read_text()[-3000:]
    assert SECRET not in g.log.read_text()
    for pid in pids:
        assert not _alive(pid)


async def _bus_up(g: Group) -> bool:
    ps = (await g.workers())["processes"]
    return all(p["status"]["bus"]["live_peers"] == 1 and p["status"]["bus"]["dropped"] == 0 for p in ps)


async def _served(g: Group, n: int) -> bool:
    return sum(p["status"]["requests"] for p in (await g.workers())["processes"]) == n


async def _total_is(g: Group, n: int) -> bool:
    return total(await g.metrics_text(), "inference_objective_request_total{") == n


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").exists() and Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"


async def test_a_group_that_cannot_start_fails_loudly(tmp_path, fleet):
    g = Group(tmp_path, fleet, config="kind: NoSuchThing\n")  # every worker rejects the config
    code = await asyncio.to_thread(g.proc.wait, 60)
    text = g.log.read_text()
    assert code == 1, text
    assert "before it came up; stopping all workers" in text


async def test_workers_need_a_positive_count(tmp_path):
    run = subprocess.run([sys.executable, "-m", "epp.cmd.cli", "serve", "--secure-serving=false", "--workers", "0", "--endpoints-file", "x"],
                         cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert run.returncode == 2 and "--workers must be at least 1" in run.stderr
