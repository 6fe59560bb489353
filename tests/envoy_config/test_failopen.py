"""Fail-open with a real Envoy: Pointsman (a real `epp serve` process) is killed under traffic and restarted.

GIE's EppUnAvailableFailOpen, done the hard way: requests carry `test-epp-endpoint-selection` naming server 0, so
while Pointsman routes they all land there; while it is down the open config serves every request on the fallback
policy (any server), also once Envoy's health check has taken Pointsman out, the closed one fails them; once it is
back routing resumes with no Envoy restart.
"""

from __future__ import annotations

import asyncio
import collections
import signal
import time

import aiohttp
import pytest

from tests.support.envoy import stats
from tests.support.simstack import MODEL, SimStack
from tests.support.wait import until

pytestmark = pytest.mark.envoy

BODY = {"model": MODEL, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4}


IN_FLIGHT_S = 0.2  # requests started this long before Pointsman dies may still be in flight when it does
STREAK = 20  # requests that make a phase: enough to show its behaviour holds, not a one-off


def unrouted(results: list[tuple[float, object, str | None]], target: str) -> list[float]:
    """The start times of the requests that were not answered by the server Pointsman picked."""
    return [t for t, st, port in results if (st, port) != (200, target)]


async def drive(s: SimStack, kill: int) -> tuple[dict[str, list[tuple[float, object, str | None]]], float]:
    """Four clients in a loop; Pointsman killed (signal `kill`) once requests are routed, restarted once the outage
    has shown itself, and traffic goes on until it is routed again. Results by phase: (time since the phase began,
    status or error, the port that served); and how long the "up" phase lasted."""
    phases: dict[str, list[tuple[float, object, str | None]]] = collections.defaultdict(list)
    phase = {"name": "up", "t0": time.monotonic()}
    stop = asyncio.Event()
    target = str(s.ports[0])

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=20)) as c:
        async def client() -> None:
            while not stop.is_set():
                name, t = phase["name"], time.monotonic() - phase["t0"]
                try:
                    async with c.post(s.url + "/v1/chat/completions", json=BODY,
                                      headers={"test-epp-endpoint-selection": s.key(0)}) as r:
                        await r.read()
                        result: object = r.status
                        port = r.headers.get("x-inference-port")
                except aiohttp.ClientError as e:
                    result, port = type(e).__name__, None
                phases[name].append((t, result, port))

        def enter(name: str) -> None:
            phase.update(name=name, t0=time.monotonic())

        def settled_up() -> int:
            cut = time.monotonic() - phase["t0"] - IN_FLIGHT_S
            return sum(1 for t, _, _ in phases["up"] if t < cut)

        def epp_healthy() -> int | None:
            return stats(s.admin_port, "cluster.epp.").get("cluster.epp.membership_healthy")

        def routed_again() -> bool:
            back = phases["back"]
            since = max(unrouted(back, target), default=-1.0)
            return sum(1 for t, _, _ in back if t > since) >= STREAK

        clients = [asyncio.ensure_future(client()) for _ in range(4)]
        try:
            await until(lambda: settled_up() > STREAK, 20, "requests routed before the kill")
            up_seconds = time.monotonic() - phase["t0"]
            enter("stopping")
            await asyncio.to_thread(s.kill_epp, kill)
            enter("down")
            if s.failure_mode == "open":
                # Both halves of the outage: Envoy still dialling Pointsman (the connection fails at once), then
                # its health check taking Pointsman out (two failed checks, one a second).
                await until(lambda: asyncio.to_thread(lambda: epp_healthy() == 0), 20,
                            "Envoy's health check to take Pointsman out", interval=0.05)
            seen = len(phases["down"])
            await until(lambda: len(phases["down"]) > max(STREAK, seen + STREAK // 2), 20, "requests while down")
            enter("restarting")
            await asyncio.to_thread(s.start_epp)
            enter("back")
            await until(routed_again, 20, lambda: f"requests routed again: {phases['back'][-5:]}")
        finally:
            stop.set()
            await asyncio.gather(*clients)
    return phases, up_seconds


@pytest.mark.parametrize("mode", ["open", "closed"])
async def test_pointsman_killed_under_traffic(mode):
    s = SimStack(3, failure_mode=mode)
    await s.start()
    try:
        phases, up_seconds = await drive(s, signal.SIGKILL)
    finally:
        await s.stop()
    target = str(s.ports[0])
    up, down, back = phases["up"], phases["down"], phases["back"]
    assert len(up) > 20 and len(down) > 20 and len(back) > 20
    settled = [x for x in up if x[0] < up_seconds - IN_FLIGHT_S]  # the last ones may still be in flight
    assert all(st == 200 and port == target for _, st, port in settled), [x for x in settled if x[1:] != (200, target)]
    if mode == "open":
        # Every request is served while Pointsman is away, also the ones in flight when it died ...
        everything_while_down = phases["stopping"] + down + phases["restarting"]
        assert [st for _, st, _ in everything_while_down if st != 200] == []
        # ... by the fallback policy over the pool, not by Pointsman's pick.
        assert len({port for _, _, port in down}) == 3
    else:
        assert [st for _, st, _ in down if st == 200] == [], "fail-closed: no pick, no upstream"
        assert {st for _, st, _ in down} == {500}
        # ... nor while it restarts (a second or two): no request reaches a server Pointsman did not pick
        assert all(port in (None, target) for _, _, port in phases["restarting"])
    # Back without an Envoy restart: after Envoy's health check and EDS reconnect, all routed again: every request
    # that started later than 2.5 s after the restart, and every one after the last that was not.
    routed_again_at = max(unrouted(back, target), default=0.0)
    assert routed_again_at <= 2.5, collections.Counter((st, port) for _, st, port in back)
    late = [(st, port) for t, st, port in back if t > routed_again_at]
    assert late and all(st == 200 and port == target for st, port in late), collections.Counter(late)
