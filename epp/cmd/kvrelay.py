"""`epp kv-relay`: run beside an engine and carry its KV events into its pool's NATS JetStream stream
(epp.fleet.kvevents.relay; docs/kv-events.md, "The NATS relay"). Loads ZMQ, nats-py and the relay, nothing of the
server.

    epp kv-relay --engine-events tcp://127.0.0.1:5557 --engine-replay tcp://127.0.0.1:5558 \\
        --endpoint 10.0.0.5:8000 --pool llama --nats-url nats://nats:4222
"""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from epp.fleet.kvevents.settings import RelaySettings

log = logging.getLogger("epp.fleet.kvevents.relay")

REPORT_EVERY = 30.0


async def relay(settings: RelaySettings, stop: asyncio.Event) -> int:
    """Connect (nats-py retries until NATS answers), relay until `stop` is set, then drain for up to 5 s."""
    from epp.fleet.kvevents import KVRelay
    from epp.natsconn import NatsTarget, connect

    target = NatsTarget.parse(settings.nats_url)
    errors = _nats_errors(target.redacted())
    connecting = asyncio.ensure_future(connect(
        target, name=f"pointsman-kv-relay {settings.endpoint}/{settings.rank}", error_cb=errors,
        disconnected_cb=_disconnected, reconnected_cb=_reconnected))
    stopping = asyncio.ensure_future(stop.wait())
    await asyncio.wait({connecting, stopping}, return_when=asyncio.FIRST_COMPLETED)
    stopping.cancel()
    if not connecting.done():
        connecting.cancel()
        return 0
    try:
        nc = connecting.result()
    except Exception as e:  # e.g. a credentials or TLS file that cannot be read
        log.error("KV relay: cannot connect to NATS at %s: %s", target.redacted(), e)
        return 1
    r = KVRelay(settings, nc.jetstream())
    try:
        while not await _started(r, target.redacted()):
            if stop.is_set():
                return 0
            await asyncio.sleep(1.0)
        reporter = asyncio.get_running_loop().create_task(r.report(REPORT_EVERY))
        await stop.wait()
        reporter.cancel()
        await r.publisher.drained(5.0)
    finally:
        await r.close()
        log.info("KV relay: stopped: %s", r.counters.as_dict())
        await nc.close()
    return 0


async def _started(r: Any, where: str) -> bool:
    """Start the relay; False (logged) while JetStream does not answer (NATS restarting, JetStream off)."""
    try:
        await r.start()
        return True
    except Exception as e:
        log.warning("KV relay: JetStream at %s: %s; retrying", where, e or type(e).__name__)
        return False


def _nats_errors(where: str) -> Callable[[Exception], Awaitable[None]]:
    """nats-py's error callback: logged as a warning at most every 30 s (it fires on every connect attempt)."""
    last = [-1e9]

    async def error(e: Exception) -> None:
        now = time.monotonic()
        if now - last[0] >= 30.0:
            last[0] = now
            log.warning("KV relay: NATS at %s: %s; retrying", where, e or type(e).__name__)

    return error


async def _disconnected() -> None:
    log.warning("KV relay: NATS disconnected; batches are queued (--max-pending) until it is back")


async def _reconnected() -> None:
    log.info("KV relay: NATS reconnected")


def kv_relay_command(settings: RelaySettings) -> int:
    logging.basicConfig(level=logging.DEBUG if settings.verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)

    async def main() -> int:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        return await relay(settings, stop)

    return asyncio.run(main())


__all__ = ["kv_relay_command", "relay"]
