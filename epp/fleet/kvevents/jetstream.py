"""The KV-event subscriber over NATS JetStream (`epp serve --kv-events-url nats://...`): the pools' streams, written
by `epp kv-relay` beside each engine, instead of one ZMQ subscription per engine (docs/kv-events.md, "The NATS
relay").

Per pool a `StreamFollower` reads the pool's stream through its own ephemeral consumer (push, no acks, flow
control and idle heartbeats, in memory on the server), from the stream's first message on its first start: a
replica that starts late learns every engine's cache from the stream, never from the engines. The follower keeps
the stream order itself, as an ordered consumer does but counting only what it has handled: a consumer sequence
that skips (messages the client dropped for a slow consumer) or a stall while the stream holds more than it
delivered (a server restart took the consumer with it) recreates the consumer from the stream sequence after the
last message handled. So nothing is lost to NATS, and nothing is applied twice.

Each batch is unwrapped (epp.fleet.kvevents.natswire) into the ZMQ frames the engine sent and handed to the
endpoint rank's `RankStream`, the sequence tracker the ZMQ subscriber uses: gaps, restarts, resets and malformed
batches keep their rules. A gap the relay could not fill is a hole in the stream, and there is no engine to ask
(the replay is "unavailable"): the rank turns unknown, as with a failed replay.

Routing never waits on NATS: the followers write the index from their own tasks; connecting, subscribing and
recreating consumers happen there too, retried every second while NATS is away.

Public API (as `KVEventSubscriber` where the service uses it): `JetStreamKVSubscriber(index, target, metrics=None)`
with `follow(pools)`, `remove_endpoint(key)`, `sources()`, `status()`, `followers`, and `await close()`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterable
from typing import Any

import zmq.asyncio

from epp.aio import cancel_and_wait
from epp.fleet.kvevents import natswire
from epp.fleet.kvevents.applier import EventApplier, RankStatus
from epp.fleet.kvevents.decode import EventBatch
from epp.fleet.kvevents.metrics import KVEventMetrics
from epp.fleet.kvevents.replay import ReplayRequester
from epp.fleet.kvevents.sources import KVEventsSource
from epp.fleet.kvevents.stream import RankStream
from epp.natsconn import NatsTarget, connect
from scheduling.prefix.precise import PENDING, PreciseIndex

log = logging.getLogger("epp.fleet.kvevents.subscriber")

Sink = Callable[[Any], Any]  # an awaitable handler of one NATS message


class StreamFollower:
    """One pool's stream, in order, from its first message (or from where this follower stopped)."""

    def __init__(self, js: Any, pool: str, sink: Sink, *, pending_msgs_limit: int = 65_536, stall: float = 2.0,
                 heartbeat: float = 1.0) -> None:
        self.js = js
        self.pool = pool
        self.stream = natswire.stream_name(pool)
        self.filter = natswire.pool_subjects(pool)
        self.sink = sink
        self.pending_msgs_limit = pending_msgs_limit
        self.stall = stall
        self.heartbeat = heartbeat
        self.last_sseq = 0  # the stream sequence of the last message handled
        self.next_dseq = 1  # the consumer sequence expected next
        self.handled = 0
        self.resets = 0  # consumers recreated (skips, stalls, server restarts)
        self.sub: Any = None

    async def run(self) -> None:
        while True:
            try:
                await self._subscribe()
            except asyncio.CancelledError:
                raise
            except Exception as e:  # no stream yet (no relay has started), or NATS away
                log.debug("KV events: stream %s: %s; retrying", self.stream, e)
                await asyncio.sleep(1.0)
                continue
            await self._consume()
            self.resets += 1

    async def close(self) -> None:
        if self.sub is not None:
            with contextlib.suppress(Exception):
                await self.sub.unsubscribe()
            self.sub = None

    async def _subscribe(self) -> None:
        from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

        await self.close()
        start = self.last_sseq + 1
        cfg = ConsumerConfig(deliver_policy=DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=start,
                             ack_policy=AckPolicy.NONE, flow_control=True, idle_heartbeat=self.heartbeat,
                             inactive_threshold=max(30.0, 10 * self.stall), mem_storage=True)
        self.sub = await self.js.subscribe(self.filter, stream=self.stream, config=cfg, manual_ack=True,
                                           pending_msgs_limit=self.pending_msgs_limit)
        self.next_dseq = 1

    async def _consume(self) -> None:
        """Hand messages to the sink until the consumer must be recreated."""
        import nats.errors

        while True:
            try:
                msg = await self.sub.next_msg(timeout=self.stall)
            except nats.errors.TimeoutError:
                if await self._behind():
                    return
                continue
            except asyncio.CancelledError:
                raise
            except Exception:  # the subscription or the connection closed
                await asyncio.sleep(0.5)
                return
            seqs = msg.metadata.sequence
            if seqs.consumer != self.next_dseq:  # the client dropped messages (slow consumer)
                log.info("KV events: stream %s skipped from consumer seq %d to %d; resuming at stream seq %d",
                         self.stream, self.next_dseq, seqs.consumer, self.last_sseq + 1)
                return
            self.next_dseq += 1
            self.last_sseq = seqs.stream
            self.handled += 1
            await self.sink(msg)

    async def _behind(self) -> bool:
        """Nothing came for a while: is there more in the stream than this follower handled?"""
        try:
            info = await self.js.stream_info(self.stream)
        except asyncio.CancelledError:
            raise
        except Exception:
            return False  # NATS away: keep waiting
        last = int(info.state.last_seq)
        if last < self.last_sseq:  # the stream was deleted and created again: read the new one from its start
            log.warning("KV events: stream %s starts over (its last seq %d < %d handled)", self.stream, last,
                        self.last_sseq)
            self.last_sseq = 0
            return True
        return last > self.last_sseq


class JetStreamKVSubscriber:
    def __init__(self, index: PreciseIndex, target: NatsTarget, metrics: KVEventMetrics | None = None, *,
                 on_batch: Callable[[str, int, EventBatch], None] | None = None,
                 clock: Callable[[], float] = time.monotonic, pending_msgs_limit: int = 65_536,
                 stall: float = 2.0) -> None:
        self.index = index
        self.target = target
        self.metrics = metrics if metrics is not None else KVEventMetrics()
        self._ranks: dict[str, dict[int, RankStream]] = {}
        self.metrics.watch(index, lambda: len(self._ranks))
        self.applier = EventApplier(index, self.metrics, clock, on_batch)
        self.replays = ReplayRequester(zmq.asyncio.Context.instance(), self.applier, 0.0)  # no engine to ask
        self.followers: dict[str, StreamFollower] = {}
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._pools: set[str] = set()
        self._opts = {"pending_msgs_limit": pending_msgs_limit, "stall": stall}
        self._nc: Any = None
        self._connecting: asyncio.Task[None] | None = None
        self.slow_consumer = 0
        self._warned = -1e9  # when a NATS error was last logged

    # ---- membership -----------------------------------------------------------------------------------
    def follow(self, pools: Iterable[str]) -> None:
        """Read the streams of exactly these pools (connecting in the background)."""
        self._pools = set(pools)
        if self._nc is None:
            if self._connecting is None and self._pools:
                self._connecting = asyncio.get_running_loop().create_task(self._connect(), name="kv-events nats")
            return
        self._reconcile()

    def remove_endpoint(self, key: str) -> None:
        """Forget `key` (it left the pools); a batch that arrives later for it starts it over."""
        self._ranks.pop(key, None)
        self.index.forget(key)

    def sources(self) -> dict[str, KVEventsSource]:
        return {}

    def status(self) -> dict[str, list[RankStatus]]:
        out = {}
        for key, ranks in self._ranks.items():
            states = self.index.slot_states(key)
            for rk in ranks.values():
                rk.status.state = states.get(rk.rank, PENDING)
            out[key] = [ranks[r].status for r in sorted(ranks)]
        return out

    async def close(self) -> None:
        await cancel_and_wait(self._connecting)
        for pool in list(self._tasks):
            await self._stop(pool)
        if self._nc is not None:
            with contextlib.suppress(Exception):
                await self._nc.close()
            self._nc = None

    # ---- the streams ----------------------------------------------------------------------------------
    async def _connect(self) -> None:
        while self._nc is None:
            try:
                self._nc = await connect(self.target, name="pointsman-kv-events", error_cb=self._error)
            except asyncio.CancelledError:
                raise
            except Exception as e:
                log.warning("KV events: NATS at %s: %s; retrying", self.target.redacted(), e)
                await asyncio.sleep(1.0)
        self._reconcile()

    def _reconcile(self) -> None:
        loop = asyncio.get_running_loop()
        js = self._nc.jetstream()
        for pool in [p for p in self._tasks if p not in self._pools]:
            loop.create_task(self._stop(pool))
        for pool in self._pools - set(self._tasks):
            try:
                f = StreamFollower(js, pool, self._handle, **self._opts)  # type: ignore[arg-type]
            except ValueError as e:  # a pool name no subject can carry
                log.error("KV events: pool %s: %s", pool, e)
                continue
            self.followers[pool] = f
            self._tasks[pool] = loop.create_task(f.run(), name=f"kv-events stream {f.stream}")

    async def _stop(self, pool: str) -> None:
        await cancel_and_wait(self._tasks.pop(pool, None))
        f = self.followers.pop(pool, None)
        if f is not None:
            await f.close()

    async def _error(self, e: Exception) -> None:
        if type(e).__name__ == "SlowConsumerError":
            self.slow_consumer += 1  # the follower sees the skip and resumes from the stream
            return
        now = time.monotonic()
        if now - self._warned >= 30.0:  # nats-py calls this on every failed (re)connect attempt
            self._warned = now
            log.warning("KV events: NATS at %s: %s (retrying; the index keeps what it has)", self.target.redacted(),
                        e or type(e).__name__)

    async def _handle(self, msg: Any) -> None:
        try:
            env = natswire.unwrap(msg.headers, msg.data)
        except natswire.EnvelopeError as e:
            self.metrics.malformed.labels("frames").inc()
            log.warning("KV events: dropped a NATS message on %s: %s", msg.subject, e)
            return
        rk = self._rank(env.endpoint, env.rank, msg.subject)
        await self.replays.receive(rk, env.frames)

    def _rank(self, key: str, rank: int, subject: str) -> RankStream:
        ranks = self._ranks.setdefault(key, {})
        rk = ranks.get(rank)
        if rk is None:
            rk = RankStream(key, rank, KVEventsSource(f"nats://{key}"), None, self.applier, address=subject)
            ranks[rank] = rk
            self.index.set_state(key, rank, PENDING)
        return rk


__all__ = ["JetStreamKVSubscriber", "StreamFollower"]
