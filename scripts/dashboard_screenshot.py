"""Screenshots of the dashboard with the local stack under load, for the docs (docs/img/dashboard*.png).

Starts `epp stack` (modelsim + Pointsman + Envoy on free loopback ports), drives a varying load through Envoy
(streamed and plain chats sharing a few system prompts, LoRA requests, a trickle of requests for an unknown
model), then photographs the page in headless chromium: the whole page, and one decision's per-plugin scores.

    .venv/bin/python scripts/dashboard_screenshot.py            # ~2 minutes of load, then the screenshots
    .venv/bin/python scripts/dashboard_screenshot.py --seconds 30 --out /tmp/shots
Needs Debian's chromium and chromium-driver (bash scripts/debian-packages.sh chromium chromium-driver).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import random
import sys
import threading
import time
from pathlib import Path

import aiohttp
import orjson

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.support.browser import start_chromium, stop_chromium  # noqa: E402
from tests.support.localstack import MODEL, LocalStack  # noqa: E402

SYSTEMS = [f"You are assistant #{i} of the support team. Follow the policy carefully. " * 12 for i in range(4)]


def full_page_png(drv) -> bytes:
    """The whole page, not just the window (Chrome DevTools' captureBeyondViewport)."""
    size = drv.execute_cdp_cmd("Page.getLayoutMetrics", {})["cssContentSize"]
    shot = drv.execute_cdp_cmd("Page.captureScreenshot", {
        "format": "png", "captureBeyondViewport": True,
        "clip": {"x": 0, "y": 0, "width": size["width"], "height": size["height"], "scale": 1}})
    return base64.b64decode(shot["data"])


async def drive(stack: LocalStack, seconds: float, peak: int, stop: threading.Event) -> None:
    """A load that rises to `peak` concurrent clients and falls back, so the charts have a shape."""
    url = f"http://127.0.0.1:{stack.listen}/v1/chat/completions"
    rng = random.Random(7)
    start = time.monotonic()

    def wanted() -> int:
        x = (time.monotonic() - start) / seconds
        return max(2, int(peak * (1 - abs(2 * x - 1) ** 2)))

    async def one(session: aiohttp.ClientSession, i: int) -> None:
        roll = rng.random()
        model = "nonexistent-model" if roll < 0.02 else "sql-lora" if roll < 0.2 else MODEL
        body = {"model": model, "stream": rng.random() < 0.6, "max_tokens": rng.randint(16, 160),
                "messages": [{"role": "system", "content": rng.choice(SYSTEMS)},
                             {"role": "user", "content": f"question {i}: " + "details " * rng.randint(5, 400)}]}
        async with session.post(url, data=orjson.dumps(body), headers={"content-type": "application/json"}) as r:
            await r.read()

    async def worker(k: int, session: aiohttp.ClientSession) -> None:
        i = 0
        while time.monotonic() - start < seconds and not stop.is_set():
            if k >= wanted():
                await asyncio.sleep(0.2)
                continue
            i += 1
            try:
                await one(session, k * 100_000 + i)
            except (aiohttp.ClientError, asyncio.TimeoutError):
                await asyncio.sleep(0.1)

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session:
        await asyncio.gather(*(worker(k, session) for k in range(peak)))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=120.0, help="how long to drive load before the shots")
    ap.add_argument("--peak", type=int, default=80, help="concurrent clients at the peak")
    ap.add_argument("--out", default=str(ROOT / "docs" / "img"))
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stack = LocalStack(servers=4, time_scale=1.0)
    print(f"local stack up; dashboard at {stack.dashboard}; driving load for {args.seconds:.0f}s", flush=True)
    stop = threading.Event()
    # The load runs on its own thread and loop, so it keeps going while selenium blocks this one.
    loader = threading.Thread(target=lambda: asyncio.run(drive(stack, args.seconds + 60, args.peak, stop)),
                              daemon=True)
    loader.start()
    drv = None
    try:
        time.sleep(args.seconds)  # shoot while the load is still on, on its way down
        drv = start_chromium(1600, 1000)
        drv.get(stack.dashboard)
        time.sleep(3)
        drv.execute_script("document.querySelector('#ex-go').click()")  # an Explain result on the page too
        time.sleep(4)  # live ticks fill the table and charts
        (out / "dashboard.png").write_bytes(full_page_png(drv))
        drv.execute_script("document.querySelector('#dec-table tbody tr:nth-child(3)').click()")
        time.sleep(1.5)
        assert drv.save_screenshot(str(out / "dashboard-decision.png"))
    except Exception:
        print("".join(stack.output), file=sys.stderr)
        raise
    finally:
        stop.set()
        if drv is not None:
            stop_chromium(drv)
        loader.join(60)
        stack.stop()
    for name in ("dashboard.png", "dashboard-decision.png"):
        print(f"wrote {out / name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
