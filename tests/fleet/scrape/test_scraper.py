import asyncio
import time
from collections import Counter
from dataclasses import replace

import pytest
from aiohttp import web
from expositions import sglang_exposition, vllm_exposition

from epp.fleet.datastore import Datastore, PoolSpec
from epp.fleet.scrape.scraper import MetricsScraper
from scheduling.types import Endpoint, endpoint_key
from tests.support.wait import until


class FakeModelServer:
    """A real HTTP server on 127.0.0.1 serving /metrics with a body, status and delay the test controls."""

    def __init__(self, body: bytes, status: int = 200, delay: float = 0.0) -> None:
        self.body, self.status, self.delay = body, status, delay
        self.hits = 0
        self.times: list[float] = []  # when each scrape arrived (monotonic)
        self.peers: set[tuple[str, int]] = set()
        self.port = 0
        self._runner: web.AppRunner | None = None

    async def _metrics(self, request: web.Request) -> web.Response:
        self.hits += 1
        self.times.append(time.monotonic())
        self.peers.add(request.transport.get_extra_info("peername")[:2])
        if self.delay:
            await asyncio.sleep(self.delay)
        return web.Response(body=self.body, status=self.status, content_type="text/plain")

    async def start(self) -> "FakeModelServer":
        app = web.Application()
        app.router.add_get("/metrics", self._metrics)
        self._runner = web.AppRunner(app, shutdown_timeout=0.1)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]
        return self

    async def stop(self) -> None:
        if self._runner:
            await self._runner.cleanup()

    def endpoint(self, engine: str = "vllm") -> Endpoint:
        return Endpoint(
            key=endpoint_key("127.0.0.1", self.port), address="127.0.0.1", port=self.port,
            name=f"pod-{self.port}", labels={"llm-d.ai/engine-type": engine},
        )


@pytest.fixture
async def servers():
    made: list[FakeModelServer] = []

    async def make(body: bytes, **kw) -> FakeModelServer:
        s = await FakeModelServer(body, **kw).start()
        made.append(s)
        return s

    yield make
    for s in made:
        await s.stop()


def _ds(*eps: Endpoint) -> Datastore:
    ds = Datastore()
    ds.set_pool(PoolSpec("pool"), list(eps))
    return ds


def _m(ds: Datastore, srv: FakeModelServer):
    return ds.snapshot().by_key[endpoint_key("127.0.0.1", srv.port)].metrics


async def test_scrapes_vllm_and_sglang_into_one_batch(servers):
    v = await servers(vllm_exposition(waiting=3, running=7, kv=0.5, lora=[(1.7e9, "sql-lora", "")]))
    s = await servers(sglang_exposition(waiting=1, running=2, usage=0.25, page_size=16, num_pages=99))
    ds = _ds(v.endpoint("vllm"), s.endpoint("sglang"))
    writes = []
    orig = ds.update_metrics
    ds.update_metrics = lambda u: (writes.append(dict(u)), orig(u))  # count batches, keep behaviour
    scraper = MetricsScraper(ds, timeout=1.0)
    try:
        t0 = time.monotonic()
        assert await scraper.scrape_round(wait=2.0) == 2
    finally:
        await scraper.stop()
    assert len(writes) == 1 and len(writes[0]) == 2
    mv, ms = _m(ds, v), _m(ds, s)
    assert (mv.waiting, mv.running, mv.kv_usage, mv.active_loras) == (3, 7, 0.5, {"sql-lora"})
    assert (mv.block_size, mv.num_gpu_blocks) == (16, 27495)
    assert (ms.waiting, ms.running, ms.kv_usage, ms.block_size, ms.num_gpu_blocks) == (1, 2, 0.25, 16, 99)
    assert not mv.stale and mv.updated_at is not None and mv.updated_at >= t0


async def test_loop_refreshes_at_interval_over_one_keepalive_connection(servers):
    v = await servers(vllm_exposition(waiting=1))
    ds = _ds(v.endpoint())
    scraper = MetricsScraper(ds, interval=0.05)
    scraper.start()
    try:
        await asyncio.sleep(0.3)
        assert _m(ds, v).waiting == 1
        v.body = vllm_exposition(waiting=9)
        await asyncio.sleep(0.2)
        assert _m(ds, v).waiting == 9
    finally:
        await scraper.stop()
    assert 6 <= v.hits <= 14, v.hits  # ~every 50 ms for 0.5 s
    assert len(v.peers) == 1  # one keep-alive connection


async def test_the_loop_spreads_the_endpoints_over_the_interval_and_scrapes_each_once_per_interval(servers):
    """Five endpoints at 100 ms: the loop scrapes one of them every 20 ms instead of all five at once, so the
    event loop never parses every endpoint's metrics in one burst; each is still scraped about every 100 ms."""
    srvs = [await servers(vllm_exposition(waiting=i)) for i in range(5)]
    ds = _ds(*(s.endpoint() for s in srvs))
    scraper = MetricsScraper(ds, interval=0.1)
    assert (scraper.slots(5), scraper.slots(50), MetricsScraper(ds, interval=0.01).slots(5)) == (5, 20, 2)
    scraper.start()
    try:
        # the first tick scrapes every endpoint; then the slots take turns: measure once every slot has had one
        await until(lambda: all(s.hits >= 2 for s in srvs), 5.0, "every endpoint scraped by its own slot", 0.01)
        for s in srvs:
            s.times.clear()
        await asyncio.sleep(1.0)
    finally:
        await scraper.stop()
    assert all(7 <= len(s.times) <= 13 for s in srvs), [len(s.times) for s in srvs]
    arrivals = sorted(t for s in srvs for t in s.times)
    gaps = [b - a for a, b in zip(arrivals, arrivals[1:], strict=False)]
    # all at once, four of every five gaps would be a few milliseconds; spread, they are about 20 ms
    assert sorted(gaps)[len(gaps) // 5] > 0.01, [round(g, 3) for g in gaps]
    assert [_m(ds, s).waiting for s in srvs] == [0, 1, 2, 3, 4]


async def test_failure_streak_takes_endpoint_out_and_recovery_brings_it_back(servers):
    good = await servers(vllm_exposition(waiting=2))
    bad = await servers(vllm_exposition(waiting=5))
    ds = _ds(good.endpoint(), bad.endpoint())
    bad_key = endpoint_key("127.0.0.1", bad.port)
    scraper = MetricsScraper(ds, staleness=0.15, failure_threshold=3, backoff_max=0.0)  # every round scrapes
    try:
        await scraper.scrape_round(wait=1.0)
        assert _m(ds, bad).waiting == 5 and ds.is_routable(bad_key)
        bad.status = 500
        for i in range(3):
            assert ds.is_routable(bad_key), f"out of rotation too early, after {i} failures"
            await scraper.scrape_round(wait=1.0)
        assert not ds.is_routable(bad_key)
        assert scraper.failures(bad_key) == 3 and "HTTP 500" in scraper.last_error(bad_key)
        assert ds.is_routable(endpoint_key("127.0.0.1", good.port))
        await asyncio.sleep(0.2)  # past the staleness threshold
        await scraper.scrape_round(wait=1.0)
        assert _m(ds, bad).stale and _m(ds, bad).waiting == 5  # last values kept, flagged stale
        assert not _m(ds, good).stale
        bad.status, bad.body = 200, vllm_exposition(waiting=6)
        await scraper.scrape_round(wait=1.0)
        assert ds.is_routable(bad_key)
        assert not _m(ds, bad).stale and _m(ds, bad).waiting == 6
    finally:
        await scraper.stop()


async def test_garbage_body_and_dead_port_count_as_failures(servers):
    junk = await servers(b"<html>not metrics</html>")
    dead = await servers(b"")
    dead_ep = dead.endpoint()
    await dead.stop()  # nothing listens there any more
    ds = _ds(junk.endpoint(), dead_ep)
    scraper = MetricsScraper(ds, failure_threshold=2)
    try:
        for _ in range(2):
            await scraper.scrape_round(wait=1.0)
    finally:
        await scraper.stop()
    assert ds.unhealthy == {junk.endpoint().key, dead_ep.key}
    assert _m(ds, junk).updated_at is None


async def test_slow_endpoint_does_not_hold_up_the_round_and_times_out(servers):
    fast = await servers(vllm_exposition(waiting=4))
    slow = await servers(vllm_exposition(waiting=8), delay=3.0)
    ds = _ds(fast.endpoint(), slow.endpoint())
    scraper = MetricsScraper(ds, interval=0.05, timeout=0.3, failure_threshold=1)
    try:
        t0 = time.monotonic()
        await scraper.scrape_round()  # waits at most one interval
        assert time.monotonic() - t0 < 0.2
        assert _m(ds, fast).waiting == 4
        assert _m(ds, slow).updated_at is None
        await asyncio.sleep(0.35)  # the slow scrape hits its 0.3 s timeout
        await scraper.scrape_round()
        assert "TimeoutError" in scraper.last_error(slow.endpoint().key)
        assert not ds.is_routable(slow.endpoint().key)
    finally:
        await scraper.stop()


async def test_removed_endpoint_is_forgotten(servers):
    a = await servers(vllm_exposition())
    b = await servers(vllm_exposition(), status=503)
    ds = _ds(a.endpoint(), b.endpoint())
    scraper = MetricsScraper(ds, failure_threshold=1)
    try:
        await scraper.scrape_round(wait=1.0)
        assert b.endpoint().key in ds.unhealthy
        ds.set_endpoints("pool", [a.endpoint()])
        await scraper.scrape_round(wait=1.0)
        assert ds.unhealthy == set()
        assert scraper.failures(b.endpoint().key) == 0
    finally:
        await scraper.stop()


async def test_an_endpoint_that_is_out_is_scraped_with_a_capped_backoff(servers):
    bad = await servers(vllm_exposition(waiting=1), status=500)
    ds = _ds(bad.endpoint())
    key = bad.endpoint().key
    scraper = MetricsScraper(ds, interval=0.05, failure_threshold=3, backoff_max=0.4)
    assert [scraper.backoff(n) for n in (1, 2, 3, 4, 5, 6, 9)] == [0.0, 0.0, 0.1, 0.2, 0.4, 0.4, 0.4]
    scraper.start()
    try:
        await until(lambda: not ds.is_routable(key), 5.0, "the failing endpoint out of rotation", 0.01)
        out_at, hits_at_out = time.monotonic(), bad.hits
        await asyncio.sleep(2.0)
        during = bad.hits - hits_at_out
        # at the full rate 2 s would be ~40 scrapes; with the backoff 0.1 + 0.2 + 0.4 + 0.4 ... about 6
        assert 3 <= during <= 10, during
        bad.status = 200
        recovered = time.monotonic()
        await until(lambda: ds.is_routable(key), 5.0, "the endpoint back in rotation", 0.01)
        assert time.monotonic() - recovered < 0.4 + 0.3, "back within the cap plus a round"
        assert out_at < recovered
    finally:
        await scraper.stop()


async def test_the_loop_follows_pool_changes(servers):
    """The loop keeps its sorted roster between ticks; a pool change rebuilds it: an endpoint that joins is
    scraped within an interval or two, one that leaves is not scraped again."""
    a, b, c = [await servers(vllm_exposition(waiting=i)) for i in (1, 2, 3)]
    ds = _ds(a.endpoint(), b.endpoint())
    scraper = MetricsScraper(ds, interval=0.05)
    scraper.start()
    try:
        await until(lambda: a.hits >= 2 and b.hits >= 2, 5.0, "both first endpoints scraped", 0.01)
        assert c.hits == 0
        ds.set_endpoints("pool", [a.endpoint(), c.endpoint()])
        await until(lambda: c.hits >= 2, 5.0, "the endpoint that joined scraped by the loop", 0.01)
        await asyncio.sleep(0.1)  # a scrape of b already in flight when it left may still land
        left_at = b.hits
        await asyncio.sleep(0.3)
        assert b.hits == left_at, "the endpoint that left is still scraped"
        assert _m(ds, c).waiting == 3 and scraper.failures(b.endpoint().key) == 0
    finally:
        await scraper.stop()


async def test_a_tick_reads_its_own_slot_and_marks_staleness_once_per_interval():
    """At 400 endpoints in 50 slots, a tick looks up its slot's 8 endpoints and lists the pool only when it
    changed, so a tick's cost follows the slot, not the pool; over one interval every endpoint is looked at once,
    and one whose last scrape is older than the threshold is marked stale by the tick of its slot."""
    now = [1000.0]
    eps = [Endpoint(key=endpoint_key(f"10.1.{i // 200}.{i % 200}", 8000), address=f"10.1.{i // 200}.{i % 200}",
                    port=8000) for i in range(400)]
    ds = _ds(*eps)
    ds.update_metrics({e.key: replace(e.metrics, updated_at=now[0], stale=False) for e in eps})
    listed, looked = [0], Counter()
    members, endpoint = ds.members, ds.endpoint
    ds.members = lambda: (listed.__setitem__(0, listed[0] + 1), members())[1]  # count, keep behaviour
    ds.endpoint = lambda key: (looked.update([key]), endpoint(key))[1]
    scraper = MetricsScraper(ds, interval=1.0, staleness=2.0, clock=lambda: now[0])
    for key in scraper.roster():
        scraper._state[key].next_at = float("inf")  # nothing due: only the bookkeeping runs
    try:
        now[0] += 3.0  # every endpoint's last scrape is now past the threshold
        marked = 0
        for slot in range(50):
            before = sum(looked.values())
            marked += await scraper.scrape_round(wait=0, slot=slot, slots=50)
            assert sum(looked.values()) - before == 8
        assert listed[0] == 1 and marked == 400
        assert sorted(looked.values()) == [1] * 400
        assert all(ds.endpoint(e.key).metrics.stale for e in eps)
        ds.set_endpoints("pool", eps[:200])
        await scraper.scrape_round(wait=0, slot=0, slots=50)
        assert listed[0] == 2 and len(scraper.roster()) == 200
    finally:
        await scraper.stop()


async def test_a_pool_too_big_for_the_interval_is_named_once(caplog):
    """At 50 ms, 64 endpoints take about half a core of scraping: one warning says so and what interval keeps it near
    a quarter; a pool change that keeps it over says nothing again, one that brings it under re-arms the warning."""
    import logging

    def eps(n: int) -> list[Endpoint]:
        return [Endpoint(key=endpoint_key(f"10.2.0.{i}", 8000), address=f"10.2.0.{i}", port=8000) for i in range(n)]

    ds = _ds(*eps(8))
    scraper = MetricsScraper(ds, interval=0.05)
    with caplog.at_level(logging.WARNING, logger="epp.fleet.scrape.scraper"):
        scraper.roster()
        assert not caplog.records  # 8 endpoints: about 6% of a core
        for n in (64, 70, 8, 64):
            ds.set_endpoints("pool", eps(n))
            scraper.roster()
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 2, warnings
    assert "scraping 64 endpoints every 50 ms takes about 46% of a core" in warnings[0]
    assert "--refresh-metrics-interval 92ms" in warnings[0]
    await scraper.stop()


async def test_a_departed_endpoint_s_connection_is_closed_with_a_metrics_port_too(servers):
    """With --model-server-metrics-port the scrape goes to that port: when the endpoint leaves, the kept-alive
    connection there is closed, not left idle."""
    srv = await servers(vllm_exposition(waiting=4))
    ep = Endpoint(key=endpoint_key("127.0.0.1", 9), address="127.0.0.1", port=9, name="pod-a")
    ds = _ds(ep)
    scraper = MetricsScraper(ds)
    scraper.source.port = srv.port  # the metrics live on another port than the serving one
    try:
        assert await scraper.scrape_round(wait=2.0) == 1 and ds.snapshot().by_key[ep.key].metrics.waiting == 4
        assert sum(len(c) for c in scraper.source._client._idle.values()) == 1
        ds.set_endpoints("pool", [])
        assert sum(len(c) for c in scraper.source._client._idle.values()) == 0
    finally:
        await scraper.stop()
