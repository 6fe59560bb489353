"""Fail-open demonstration: kill Pointsman under traffic with Envoy's failure mode open and closed.

    .venv/bin/python bench/bench_failopen.py            # about 40 s

For each mode: modelsim (3 servers), `epp serve` as a process and a real Envoy rendered by
`epp envoy-config --eds --failure-mode <mode>`. Four clients send requests in a loop, each naming server 0 in the
conformance header `test-epp-endpoint-selection` (so a request Pointsman routes lands on server 0, one the fallback
policy serves lands anywhere). Pointsman is killed with SIGKILL after 3 s, restarted 4 s later on the same port, and
traffic runs 6 s more. The table counts each phase's requests (by the phase they started in): served by server 0
(Pointsman's pick; while Pointsman is down also a third of the fallback's), served by servers 1-2 (only the fallback
policy sends requests there), failed. Envoy is never restarted.
"""

from __future__ import annotations

import asyncio
import collections
import signal
import sys
import time
from pathlib import Path

import aiohttp

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.support.simstack import MODEL, SimStack  # noqa: E402

BODY = {"model": MODEL, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4}
PHASES = ("up", "killed", "down", "restarting", "back: first 2 s", "back: after 2 s")


async def demo(mode: str) -> dict[str, collections.Counter[str]]:
    s = SimStack(3, failure_mode=mode)
    await s.start()
    counts: dict[str, collections.Counter[str]] = {p: collections.Counter() for p in PHASES}
    state = {"phase": "up", "back_at": 0.0}
    stop = asyncio.Event()
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=20)) as c:
            async def client() -> None:
                while not stop.is_set():
                    phase = state["phase"]
                    try:
                        async with c.post(s.url + "/v1/chat/completions", json=BODY,
                                          headers={"test-epp-endpoint-selection": s.key(0)}) as r:
                            await r.read()
                            if r.status != 200:
                                kind = f"failed ({r.status})"
                            elif r.headers.get("x-inference-port") == str(s.ports[0]):
                                kind = "routed"
                            else:
                                kind = "fallback"
                    except aiohttp.ClientError as e:
                        kind = f"failed ({type(e).__name__})"
                    if phase == "back":
                        phase = "back: first 2 s" if time.monotonic() - state["back_at"] < 2 else "back: after 2 s"
                    counts[phase][kind] += 1

            clients = [asyncio.ensure_future(client()) for _ in range(4)]
            await asyncio.sleep(3)
            state["phase"] = "killed"
            await asyncio.to_thread(s.kill_epp, signal.SIGKILL)
            state["phase"] = "down"
            await asyncio.sleep(4)
            state["phase"] = "restarting"
            await asyncio.to_thread(s.start_epp)
            state.update(phase="back", back_at=time.monotonic())
            await asyncio.sleep(6)
            stop.set()
            await asyncio.gather(*clients)
    finally:
        await s.stop()
    return counts


def table(results: dict[str, dict[str, collections.Counter[str]]]) -> str:
    lines = ["| failure mode | phase | requests | served by server 0 | served by servers 1-2 | failed |",
             "|---|---|---:|---:|---:|---:|"]
    for mode, counts in results.items():
        for phase in PHASES:
            c = counts[phase]
            failed = sum(n for k, n in c.items() if k.startswith("failed"))
            kinds = ", ".join(sorted(k[8:-1] for k in c if k.startswith("failed")))
            lines.append(f"| {mode} | {phase} | {sum(c.values())} | {c['routed']} | {c['fallback']} | "
                         f"{failed}{f' ({kinds})' if kinds else ''} |")
    return "\n".join(lines)


async def main() -> None:
    results = {mode: await demo(mode) for mode in ("open", "closed")}
    print(table(results))


if __name__ == "__main__":
    asyncio.run(main())
