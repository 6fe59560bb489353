"""A ModelRouter behind a real Envoy (the config `epp envoy-config --routes-file` writes) and a modelsim fleet, with
modelsim's failure injection: quarantine after two failures in a row and recovery through the half-open probe,
quarantine at once for a stream that goes silent, failClosed from the response path, and shadow copies."""

from __future__ import annotations

import asyncio
import time

import aiohttp
import orjson
import pytest
import yaml
from aiohttp import web

from epp.cmd.app import App
from epp.envoy_config import EnvoyConfigSpec, render_yaml
from epp.envoy_config.providers import fragments_from_files
from epp.stack.ports import free_port_block
from modelsim.config import FleetConfig
from modelsim.fleet import Fleet
from tests.support.envoy import Envoy, free_port
from tests.support.stack import serve_args
from tests.support.wait import until

pytestmark = pytest.mark.envoy
MODEL = FleetConfig().model


def router(rules: list, **spec) -> str:
    return yaml.safe_dump({
        "apiVersion": "inference.llmkube.dev/v1alpha1", "kind": "ModelRouter", "metadata": {"name": "r"},
        "spec": {"backends": [{"name": "a", "inferenceServiceRef": {"name": "svc-a"}},
                              {"name": "b", "inferenceServiceRef": {"name": "svc-b"}}],
                 "rules": rules, "defaultRoute": "a", **spec}})


class Rig:
    def __init__(self, tmp, routes: str, pools: dict[str, list[int]], *flags: str) -> None:
        self.tmp = tmp
        self.pools = pools
        (tmp / "routes.yaml").write_text(routes)
        (tmp / "eps.yaml").write_text(yaml.safe_dump({"pools": [
            {"name": name, "endpoints": [{"address": "127.0.0.1", "port": p} for p in ports]}
            for name, ports in pools.items()]}))
        self.epp_port, self.listen, self.admin = free_port(), free_port(), free_port()
        self.app = App(serve_args("--grpc-port", str(self.epp_port), "--endpoints-file", str(tmp / "eps.yaml"),
                                  "--routes-file", str(tmp / "routes.yaml"), *flags))
        fragments, _, errors = fragments_from_files([tmp / "routes.yaml"])
        assert not errors, errors
        eps = [("127.0.0.1", p) for ports in pools.values() for p in ports]
        self.envoy = Envoy(render_yaml(EnvoyConfigSpec(variant="override-host", listen_port=self.listen,
                                                       admin_port=self.admin, epp_port=self.epp_port, endpoints=eps,
                                                       route_fragments=fragments)), self.listen, self.admin)

    async def __aenter__(self) -> Rig:
        await self.app.start()
        await asyncio.to_thread(self.envoy.start)
        self.session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=20))
        return self

    async def __aexit__(self, *exc) -> None:
        await self.session.close()
        self.envoy.stop()
        await self.app.stop(0)

    @property
    def tracker(self):
        return next(iter(self.app.routing.router.runtime("llmkube").runtimes.values())).tracker

    async def ask(self, headers: dict | None = None, content: str = "hi") -> tuple[int, int | None]:
        body = orjson.dumps({"model": MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": content}]})
        async with self.session.post(f"http://127.0.0.1:{self.listen}/v1/chat/completions", data=body,
                                     headers={"content-type": "application/json", **(headers or {})}) as r:
            await r.read()
            port = r.headers.get("x-inference-port")
            return r.status, int(port) if port else None


async def sim_fleet(n: int) -> Fleet:
    fleet = Fleet(FleetConfig(servers=n, base_port=free_port_block(n), time_scale=0.02))
    await fleet.start()
    return fleet


async def refuses(port: int) -> bool:
    """Whether a connection to the port is refused (nothing listens)."""
    try:
        _, writer = await asyncio.open_connection("127.0.0.1", port)
    except OSError:
        return True
    writer.close()
    await writer.wait_closed()
    return False


async def admin(port: int, what: str) -> None:
    async with aiohttp.ClientSession() as s, s.post(f"http://127.0.0.1:{port}/admin/{what}") as r:
        assert r.status == 200, await r.text()


async def test_a_dead_pod_is_quarantined_after_two_failures_and_probed_back_in(tmp_path):
    fleet = await sim_fleet(2)
    p0, p1 = [s.port for s in fleet.servers]
    try:
        # Scrape rarely: the metrics scraper would also take a dead pod out of rotation (after 3 failed scrapes),
        # and this test is about what the response path alone sees.
        async with Rig(tmp_path, router([], proxy={"quarantineDuration": "1s"}), {"svc-a": [p0, p1]},
                       "--refresh-metrics-interval", "60s") as rig:
            assert (await rig.ask())[0] == 200
            key = f"127.0.0.1:{p0}"
            await admin(p0, "kill")  # dead until the test brings it back
            await until(lambda: refuses(p0), 5, f"modelsim {p0} to stop listening")  # 50 ms after it answers
            results = [await rig.ask() for _ in range(8)]
            failures = [s for s, _ in results if s != 200]
            assert len(failures) == 2, results  # then the pod is skipped
            assert all(port == p1 for s, port in results[-4:] if s == 200)
            assert rig.tracker.state(key, time.monotonic()) == "quarantined"
            # half-open while p0 is still down: its one probe fails, quarantined at once
            await until(lambda: rig.tracker.state(key, time.monotonic()) == "half-open", 5, "p0 to be half-open")
            results = [await rig.ask() for _ in range(4)]
            assert [s for s, _ in results].count(200) == 3, results
            await fleet.servers[0].listen()  # p0 is back ...
            await until(lambda: rig.tracker.state(key, time.monotonic()) == "half-open", 5,
                        "p0 to be half-open again")  # ... and half-open
            ports = set()
            for _ in range(8):
                status, port = await rig.ask()
                assert status == 200
                ports.add(port)
            assert ports == {p0, p1}  # the probe succeeded: p0 takes its turns again
    finally:
        await fleet.stop()


async def test_failures_injected_by_status_make_a_fail_closed_rule_refuse(tmp_path):
    fleet = await sim_fleet(2)
    pa, pb = [s.port for s in fleet.servers]
    rules = [{"name": "strict", "match": {"headers": {"x-strict": "1"}}, "route": {"backends": ["b"]},
              "failClosed": True},
             {"name": "soft", "match": {"headers": {"x-soft": "1"}}, "route": {"backends": ["b"]}}]
    try:
        async with Rig(tmp_path, router(rules, proxy={"quarantineDuration": "30s"}),
                       {"svc-a": [pa], "svc-b": [pb]}) as rig:
            for _ in range(2):  # modelsim answers 500 on request
                status, port = await rig.ask({"x-strict": "1", "x-return-error": "500"})
                assert (status, port) == (500, pb)
            status, _ = await rig.ask({"x-strict": "1"})
            assert status == 503  # fail-closed: b is quarantined and the rule never falls through
            status, port = await rig.ask({"x-soft": "1"})
            assert (status, port) == (200, pa)  # not fail-closed: falls through to the default route
    finally:
        await fleet.stop()


async def test_a_silent_stream_quarantines_its_pod_at_once(tmp_path):
    fleet = await sim_fleet(2)
    p0, p1 = [s.port for s in fleet.servers]
    try:
        spec = {"proxy": {"quarantineDuration": "30s", "streamIdleTimeout": "1s"}}
        async with Rig(tmp_path, router([], **spec), {"svc-a": [p0, p1]}) as rig:
            await admin(p1, "hang")
            results = []
            for _ in range(4):
                t0 = time.monotonic()
                results.append((*await rig.ask(), time.monotonic() - t0))
            silent = [r for r in results if r[0] != 200]
            assert len(silent) == 1, results  # one silent stream, then p1 is skipped
            assert silent[0][2] >= 0.9  # Envoy ended it after the idle timeout
            assert rig.tracker.state(f"127.0.0.1:{p1}", time.monotonic()) == "quarantined"
            assert all(port == p0 for s, port, _ in results if s == 200)
            await admin(p1, "recover")
    finally:
        await fleet.stop()


async def test_shadow_copies_go_to_the_backends_after_the_one_that_served(tmp_path):
    seen: dict[int, list[dict]] = {}

    def recorder(port: int) -> web.Application:
        async def handle(request: web.Request) -> web.Response:
            body = await request.read()
            seen.setdefault(port, []).append({"headers": {k.lower(): v for k, v in request.headers.items()},
                                              "body": orjson.loads(body)})
            return web.json_response({"served_by": port, "usage": {"prompt_tokens": 1, "completion_tokens": 1}},
                                     headers={"x-inference-port": str(port)})
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", handle)
        return app

    ports = [free_port(), free_port(), free_port()]
    runners = []
    for p in ports:
        runner = web.AppRunner(recorder(p), access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", p).start()
        runners.append(runner)
    routes = yaml.safe_dump({
        "apiVersion": "inference.llmkube.dev/v1alpha1", "kind": "ModelRouter", "metadata": {"name": "r"},
        "spec": {"backends": [{"name": n, "inferenceServiceRef": {"name": f"svc-{n}"}} for n in "abc"],
                 "rules": [{"name": "eval", "route": {"backends": ["a", "b", "c"], "strategy": "shadow"}}]}})
    try:
        async with Rig(tmp_path, routes, {"svc-a": [ports[0]], "svc-b": [ports[1]], "svc-c": [ports[2]]}) as rig:
            for i in range(3):
                status, port = await rig.ask(content=f"q{i}")
                assert (status, port) == (200, ports[0])
            await until(lambda: len(seen.get(ports[1], [])) == 3 and len(seen.get(ports[2], [])) == 3, 2.5,
                        "the mirrored copies (fire-and-forget)", 0.05)
            assert len(seen[ports[0]]) == 3
            for p in ports[1:]:
                assert len(seen[p]) == 3
                assert all(r["headers"].get("x-llmkube-shadow") == "true" for r in seen[p])
                assert all(not k.startswith("x-pointsman-mirror") for r in seen[p] for k in r["headers"])
                assert sorted(r["body"]["messages"][0]["content"] for r in seen[p]) == ["q0", "q1", "q2"]
            assert all("x-llmkube-shadow" not in r["headers"] for r in seen[ports[0]])
            assert rig.tracker.quarantined(time.monotonic()) == []
    finally:
        for r in runners:
            await r.cleanup()
