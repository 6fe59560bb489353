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
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from epp.fleet.kvevents.settings import RelaySettings

log = logging.getLogger("epp.fleet.kvevents.relay")

REPORT_EVERY = 30.0


async def relay(settings: RelaySettings, stop: asyncio.Event) -> int:
    """Connect (retrying until NATS answers), relay until `stop` is set, then drain for up to 5 s."""
    from epp.fleet.kvevents import KVRelay
    from epp.natsconn import NatsTarget, connect

    target = NatsTarget.parse(settings.nats_url)
    nc = None
    while nc is None and not stop.is_set():
        try:
            nc = await connect(target, name=f"pointsman-kv-relay {settings.endpoint}/{settings.rank}",
                               error_cb=_nats_error, disconnected_cb=_disconnected, reconnected_cb=_reconnected)
        except Exception as e:  # no server answered yet
            log.warning("KV relay: NATS at %s: %s; retrying", target.redacted(), e)
            try:
                await asyncio.wait_for(stop.wait(), 1.0)
            except asyncio.TimeoutError:
                pass
    if nc is None:
        return 0
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


async def _nats_error(e: Exception) -> None:
    log.debug("KV relay: NATS: %s", e)


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
