"""EDS with a real Envoy: the pool cluster follows the endpoints file live, survives Pointsman restarts, and a
rejected update is neither looped nor blocking."""

from __future__ import annotations

import asyncio
import logging
import time

import aiohttp
import orjson
import pytest
import yaml

from epp.xds import ResourceTable, version_of
from tests.support.envoy import cluster_hosts, stats
from tests.support.stack import Stack
from tests.support.wait import seconds_until

pytestmark = pytest.mark.envoy

CHAT = orjson.dumps({"model": "llama", "messages": [{"role": "user", "content": "hello"}]})


async def served_by(stack: Stack, force: int | None = None) -> int:
    headers = {"content-type": "application/json"}
    if force is not None:
        headers["test-epp-endpoint-selection"] = f"127.0.0.1:{force}"
    async with aiohttp.ClientSession() as s, s.post(stack.url + "/v1/chat/completions", data=CHAT,
                                                    headers=headers) as r:
        body = await r.read()
        assert r.status == 200, body[:300]
        return orjson.loads(body)["served_by"]


def hosts(stack: Stack) -> dict[int, str]:
    return cluster_hosts(stack.admin_port)


def connect_failures(stack: Stack) -> int:
    """Failed connections to Pointsman (the `epp` cluster): with no traffic, Envoy's EDS stream dialling it."""
    return stats(stack.admin_port, "cluster.epp.").get("cluster.epp.upstream_cx_connect_fail", 0)


def connected(stack: Stack) -> int | None:
    return stats(stack.admin_port, "cluster.pool.").get("cluster.pool.control_plane.connected_state")


@pytest.fixture
async def stack(tmp_path):
    """Three echo backends running; only the first two in the endpoints file, so Envoy starts with two."""
    s = Stack(tmp_path, backends=3, eds=True, epp_flags=("--enable-conformance-header",))
    s.active = s.ports[:2]
    await s.start()
    try:
        await seconds_until(lambda: set(hosts(s)) == set(s.ports[:2]), 10, "Envoy's first EDS update", blocking=True)
        yield s
    finally:
        await s.stop()


async def test_endpoints_file_edits_reach_envoy_without_a_restart(stack):
    a, b, c = stack.ports
    pid = stack.envoy.proc.pid
    stack.endpoints_file([a, b, c])
    added = await seconds_until(lambda: c in hosts(stack), 3, "the added endpoint in Envoy's /clusters", blocking=True)
    # override_host finds the pick only among the cluster's hosts (otherwise it falls back to round robin over a
    # and b): a request pinned to c and served by c proves Envoy's own cluster has it.
    for _ in range(3):
        assert await served_by(stack, force=c) == c
    assert {await served_by(stack) for _ in range(12)} <= {a, b, c}

    stack.endpoints_file([b, c])
    removed = await seconds_until(lambda: a not in hosts(stack), 3, "the removed endpoint gone from /clusters", blocking=True)
    assert set(hosts(stack)) == {b, c}
    assert a not in {await served_by(stack) for _ in range(20)}

    assert stack.envoy.proc.poll() is None and stack.envoy.proc.pid == pid, "Envoy must not restart"
    s = stats(stack.admin_port, "cluster.pool.")
    assert s["cluster.pool.update_rejected"] == 0
    assert s["cluster.pool.membership_total"] == 2
    assert added < 1.5 and removed < 1.5, (added, removed)  # file poll 0.5 s + push; loose for a busy machine


async def test_a_dead_endpoint_stays_listed_as_unhealthy(stack):
    a, b, _ = stack.ports
    runner = stack.fleet.runners[0]
    await runner.cleanup()  # backend a dies: three failed scrapes take it out of rotation
    await seconds_until(lambda: hosts(stack).get(a) == "UNHEALTHY", 5, "a marked UNHEALTHY", blocking=True)
    assert hosts(stack).get(b) in ("HEALTHY", "UNKNOWN"), "the live endpoint keeps its status"
    assert {await served_by(stack) for _ in range(10)} == {b}


async def test_envoy_keeps_its_endpoints_while_pointsman_restarts_and_then_reconnects(stack):
    a, b, c = stack.ports
    failed_dials = connect_failures(stack)
    await stack.stop_epp()
    await seconds_until(lambda: connected(stack) == 0, 5, "Envoy to notice the EDS stream is gone", blocking=True)
    await seconds_until(lambda: connect_failures(stack) > failed_dials, 5, "Envoy to try Pointsman again and fail", blocking=True)
    assert set(hosts(stack)) == {a, b}, "Envoy must keep its last endpoints while Pointsman is away"

    stack.active = [a, b, c]  # the pool changed while Pointsman was down
    await stack.start_epp()
    took = await seconds_until(lambda: set(hosts(stack)) == {a, b, c}, 10, "Envoy to reconnect and take the update", blocking=True)
    assert connected(stack) == 1
    assert await served_by(stack, force=c) == c
    assert {await served_by(stack) for _ in range(6)} <= {a, b, c}
    assert took < 5, f"reconnecting took {took:.1f} s (retry backoff 0.25 s up to 2 s)"


async def test_a_rejected_update_is_logged_not_looped_and_the_fix_goes_through(stack, caplog):
    a, b, c = stack.ports
    bad = {"pools": [{"name": "pool", "endpoints": [
        {"address": "127.0.0.1", "port": a}, {"address": "127.0.0.1", "port": b},
        {"address": "not-an-ip", "port": 8000}]}]}
    path = stack.tmp / "endpoints.yaml"
    caplog.set_level(logging.WARNING, logger="epp.xds")
    path.write_text(yaml.safe_dump(bad))

    def rejected() -> int:
        return stats(stack.admin_port, "cluster.pool.").get("cluster.pool.update_rejected", 0)

    await seconds_until(lambda: rejected() >= 1, 5, "Envoy to reject the bad address", blocking=True)
    # The bad endpoint's health changes once (never scraped -> three failed scrapes -> UNHEALTHY), which is one
    # more version, rejected too. Wait for that, and for Envoy to have answered every push; then nothing more
    # may be sent.
    await seconds_until(lambda: "not-an-ip:8000" in stack.app.datastore.unhealthy, 15, "the bad endpoint to fail", blocking=True)
    stream = next(iter(stack.app.eds.streams))

    def current_version() -> str:  # what the datastore holds now, computed apart from the server's own table
        table = ResourceTable(stack.app.datastore)
        table.refresh()
        return version_of(table.resolve(stream.names)[0])

    deadline = time.monotonic() + 5
    while not (stream.sent_version == current_version() == stream.rejected_version
               and await asyncio.to_thread(rejected) == stream.nacks):
        assert time.monotonic() < deadline, "Envoy never rejected the last version sent"
        await asyncio.sleep(0.05)
    settled = rejected()
    # A window in which nothing may happen: nothing more is sent. Three of the EDS service's refresh polls (the
    # loop that would resend) pass in it; a resend on every poll or on every NACK would show.
    await asyncio.sleep(3 * stack.app.eds.poll_s)
    assert rejected() == settled <= 3, "a rejected version must not be sent again and again"
    assert stream.nacks == settled and stream.sent_version == stream.rejected_version
    assert set(hosts(stack)) == {a, b}, "Envoy keeps the last good endpoints"
    nacks = [r.message for r in caplog.records if "rejected version" in r.message]
    assert nacks and "not-an-ip" in nacks[0], nacks

    stack.endpoints_file([a, b, c])
    await seconds_until(lambda: set(hosts(stack)) == {a, b, c}, 3, "the fixed file to reach Envoy", blocking=True)
    assert rejected() == settled
    assert await served_by(stack, force=c) == c


async def test_eds_rides_the_tls_ext_proc_port(tmp_path):
    """With --secure-serving the EDS stream uses the same TLS `epp` cluster as ext_proc; nothing else to set."""
    s = Stack(tmp_path, backends=2, eds=True, epp_flags=("--secure-serving", "true"),
              envoy_overrides={"epp_tls": True})
    await s.start()
    try:
        await seconds_until(lambda: set(hosts(s)) == set(s.ports), 10, "endpoints over TLS EDS", blocking=True)
        assert await served_by(s) in s.ports
    finally:
        await s.stop()
