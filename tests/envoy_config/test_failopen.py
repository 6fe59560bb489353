"""Fail-open with a real Envoy: Pointsman (a real `epp serve` process) is killed under traffic and restarted.

GIE's EppUnAvailableFailOpen, done the hard way: requests carry `test-epp-endpoint-selection` naming server 0, so
while Pointsman routes they all land there; while it is down the open config serves every request on the fallback
policy (any server), the closed one fails them; once it is back routing resumes with no Envoy restart.
"""

from __future__ import annotations

import asyncio
import collections
import signal
import time

import aiohttp
import pytest

from tests.support.simstack import MODEL, SimStack

pytestmark = pytest.mark.envoy

BODY = {"model": MODEL, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4}


async def drive(s: SimStack, kill: int) -> dict[str, list[tuple[float, object, str | None]]]:
    """Four clients in a loop; Pointsman killed (signal `kill`) after 1.5 s, restarted 2 s later. Results by phase:
    (time since the phase began, status or error, the port that served)."""
    phases: dict[str, list[tuple[float, object, str | None]]] = collections.defaultdict(list)
    phase = {"name": "up", "t0": time.monotonic()}
    stop = asyncio.Event()

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

        clients = [asyncio.ensure_future(client()) for _ in range(4)]
        await asyncio.sleep(1.5)
        enter("stopping")
        await asyncio.to_thread(s.kill_epp, kill)
        enter("down")
        await asyncio.sleep(2.0)
        enter("restarting")
        await asyncio.to_thread(s.start_epp)
        enter("back")
        await asyncio.sleep(4.0)
        stop.set()
        await asyncio.gather(*clients)
    return phases


@pytest.mark.parametrize("mode", ["open", "closed"])
async def test_pointsman_killed_under_traffic(mode):
    s = SimStack(3, failure_mode=mode)
    await s.start()
    try:
        phases = await drive(s, signal.SIGKILL)
    finally:
        await s.stop()
    target = str(s.ports[0])
    up, down, back = phases["up"], phases["down"], phases["back"]
    assert len(up) > 20 and len(down) > 20 and len(back) > 20
    settled = [x for x in up if x[0] < 1.3]  # the last ones may still be in flight when Pointsman dies
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
    # Back without an Envoy restart: after Envoy's health check and EDS reconnect, all routed again.
    late = [(st, port) for t, st, port in back if t > 2.5]
    assert late and all(st == 200 and port == target for st, port in late), collections.Counter(late)
