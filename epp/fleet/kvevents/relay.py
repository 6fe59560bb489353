"""`epp kv-relay`: one engine rank's KV events, read from its ZMQ publisher, into its pool's JetStream stream
(docs/kv-events.md, "The NATS relay"). Replicas then read the stream instead of subscribing to every engine.

The relay runs beside its engine and keeps the stream a faithful copy of the engine's batches, in seq order:

- on start it looks up the last batch the stream holds for this engine rank and asks the engine's replay for
  everything after it (from seq 0 when the stream holds nothing): an idle engine's cache, and what happened while
  the relay was down, reach the stream without waiting for the next batch;
- it tracks the engine's seq as a replica does (`SequenceTracker`): a gap is filled from the engine's replay
  before the batch that revealed it is published; a publisher that restarted past seq 0 has its history replayed
  from 0. What the replay cannot supply is a hole in the stream's seq, and every replica applies its usual rule
  (the rank turns unknown until a reset or a restart);
- a full publish queue (NATS down or slow) drops batches without advancing the tracker: once there is room again
  (the next batch, or within half a second on an idle engine) the dropped range is asked from the engine's replay;
- after each burst (half a second without a batch) it asks the replay once for anything after the last batch
  relayed: the tail of a burst lost to the engine's PUB, or published before the relay's SUB had joined, would
  otherwise wait for the engine's next batch to reveal the gap.

The payload is never decoded here: vLLM's msgpack goes to the stream as it came (epp.fleet.kvevents.natswire).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import zmq
import zmq.asyncio

from epp.fleet.kvevents import natswire
from epp.fleet.kvevents.apply import SeqAction, SequenceTracker
from epp.fleet.kvevents.decode import END_SEQ, reply_frames
from epp.fleet.kvevents.relay_publish import RelayCounters, RelayItem, StreamPublisher
from epp.fleet.kvevents.settings import RelaySettings

log = logging.getLogger("epp.fleet.kvevents.relay")

Raw = tuple[bytes, bytes, bytes]  # topic, seq frame, payload


async def fetch_replay(ctx: zmq.asyncio.Context, address: str | None, start: int, stop: int | None,
                       timeout: float) -> tuple[list[Raw], str]:
    """The engine's retained batches in [start, stop) (stop None: all from start), raw, in seq order, and an
    outcome: ok, timeout, unavailable (no replay socket) or error."""
    if address is None:
        return [], "unavailable"
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    got: dict[int, Raw] = {}
    outcome = "ok"
    try:
        sock.connect(address)
        await asyncio.wait_for(_exchange(sock, start, stop, got), timeout)
    except asyncio.TimeoutError:
        outcome = "timeout"
    except zmq.ZMQError as e:
        log.warning("KV relay: replay from %s: %s", address, e)
        outcome = "error"
    finally:
        sock.close(0)
    return [got[s] for s in sorted(got)], outcome


async def _exchange(sock: zmq.asyncio.Socket, start: int, stop: int | None, got: dict[int, Raw]) -> None:
    await sock.send_multipart([b"", start.to_bytes(8, "big")])
    while True:
        reply = reply_frames(await sock.recv_multipart())
        if reply is None:
            continue
        topic, seq_frame, payload = reply
        if len(seq_frame) < 8:
            continue
        seq = int.from_bytes(seq_frame[:8], "big")
        if seq == END_SEQ:
            return
        if seq >= start and (stop is None or seq < stop):
            got[seq] = (bytes(topic), bytes(seq_frame), bytes(payload))


class KVRelay:
    def __init__(self, settings: RelaySettings, js: Any, *, context: zmq.asyncio.Context | None = None) -> None:
        self.settings = settings
        self.js = js
        self.ctx = context if context is not None else zmq.asyncio.Context.instance()
        self.counters = RelayCounters()
        s = settings
        self.publisher = StreamPublisher(js, s.pool, s.endpoint, s.rank, self.counters, max_pending=s.max_pending,
                                         ack_timeout=s.ack_timeout)
        self.tracker = SequenceTracker()
        self.topic = s.engine_topic.encode()
        self.overflowed = False
        self.unchecked = True  # batches may have come since the last replay: ask it once things are quiet
        self.epoch = 0  # the engine's restarts seen (natswire's Pointsman-Epoch)
        self.sock: zmq.asyncio.Socket | None = None
        self.tasks: list[asyncio.Task[None]] = []

    async def ensure_stream(self) -> None:
        """Create the pool's stream, or bring its limits to the settings'."""
        from nats.js.api import DiscardPolicy, StorageType, StreamConfig
        from nats.js.errors import BadRequestError

        s = self.settings
        cfg = StreamConfig(name=natswire.stream_name(s.pool), subjects=[natswire.pool_subjects(s.pool)],
                           max_age=s.stream_max_age, max_bytes=s.stream_max_bytes, storage=StorageType.FILE,
                           discard=DiscardPolicy.OLD, duplicate_window=s.duplicate_window)
        try:
            await self.js.add_stream(cfg)
        except BadRequestError:  # it exists with other limits: the relay's flags win
            await self.js.update_stream(cfg)

    async def start(self) -> None:
        """Subscribe to the engine, resume after the stream's last batch, and start publishing."""
        await self.ensure_stream()
        last = await self.publisher.last_stored()
        if last is not None:
            seq, stream = int.from_bytes(last[0][:8], "big"), last[0][8:]
            self.tracker.advance(seq, stream)
            self.epoch = last[2]
        sock = self.ctx.socket(zmq.SUB)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.RCVHWM, 100_000)
        sock.setsockopt(zmq.SUBSCRIBE, self.topic)
        sock.connect(self.settings.engine_events)
        self.sock = sock
        loop = asyncio.get_running_loop()
        self.tasks.append(loop.create_task(self.publisher.run(), name="kv-relay publish"))
        await self._resume()
        self.tasks.append(loop.create_task(self._read(sock), name="kv-relay read"))
        log.info("KV relay: %s rank %d from %s into %s (resuming at seq %d)", self.settings.endpoint,
                 self.settings.rank, self.settings.engine_events, self.publisher.subject, self.tracker.expected or 0)

    async def close(self) -> None:
        for t in self.tasks:
            t.cancel()
        for t in self.tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        self.tasks.clear()
        if self.sock is not None:
            self.sock.close(0)
            self.sock = None

    async def _read(self, sock: zmq.asyncio.Socket) -> None:
        while True:
            try:
                frames = await asyncio.wait_for(sock.recv_multipart(), 0.5)
            except asyncio.TimeoutError:
                # Quiet for half a second: after an overflow, or once after each burst (the last batches of a
                # burst may have been lost to the engine's PUB, or published before this SUB had joined), ask
                # the replay for whatever came after the last batch relayed.
                if (self.overflowed or self.unchecked) and self.publisher.room():
                    self.overflowed = self.unchecked = False
                    await self._replay_from(self.tracker.expected or 0)
                continue
            except zmq.ZMQError:
                return
            self.unchecked = True
            try:
                await self._live(frames)
            except asyncio.CancelledError:
                raise
            except Exception:  # never let one message end the relay
                log.exception("KV relay: unexpected error on an engine batch")

    async def _live(self, frames: list[bytes]) -> None:
        c = self.counters
        c.received += 1
        if len(frames) != 3 or len(frames[1]) < 8:
            c.malformed += 1  # its seq stays missing: the next batch's gap asks the replay for it
            return
        if not self.publisher.room():
            c.overflow += 1
            self.overflowed = True
            return
        self.overflowed = False
        seq, stream = int.from_bytes(frames[1][:8], "big"), bytes(frames[1][8:])
        decision = self.tracker.classify(seq, stream)
        if decision.action is SeqAction.DUPLICATE:
            return
        self.epoch += decision.restart
        if decision.action is SeqAction.GAP:
            await self._fill(decision.start, seq)
        self.tracker.advance(seq, stream)
        self.publisher.offer(RelayItem(bytes(frames[0]), bytes(frames[1]), bytes(frames[2]), self.epoch), force=True)

    async def _fill(self, start: int, stop: int) -> None:
        got, outcome = await fetch_replay(self.ctx, self.settings.engine_replay, start, stop,
                                          self.settings.replay_timeout)
        for topic, seq_frame, payload in got:
            self.publisher.offer(RelayItem(topic or self.topic, seq_frame, payload, self.epoch), force=True)
        self.counters.replayed += len(got)
        missing = stop - start - len(got)
        if missing:
            self.counters.holes += missing
            log.warning("KV relay %s rank %d: seq %d..%d missing, replay %s: the stream has a hole",
                        self.settings.endpoint, self.settings.rank, start, stop - 1, outcome)

    async def _resume(self) -> None:
        """Start-up: publish what the engine retained after the stream's last batch. An engine whose newest batch
        is older than that restarted while the relay was down: its whole retained history goes out (the replicas
        see the seq go back, a restart)."""
        expected = self.tracker.expected
        if expected is None:
            await self._replay_from(0)
            return
        got, _ = await fetch_replay(self.ctx, self.settings.engine_replay, 0, None, self.settings.replay_timeout)
        if got and int.from_bytes(got[-1][1][:8], "big") < expected - 1:
            self._publish_replayed(got)
        else:
            self._publish_replayed([g for g in got if int.from_bytes(g[1][:8], "big") >= expected])

    async def _replay_from(self, start: int) -> None:
        """Publish the engine's retained batches from `start` on (start-up, after an overflow or a burst)."""
        got, _ = await fetch_replay(self.ctx, self.settings.engine_replay, start, None, self.settings.replay_timeout)
        self._publish_replayed(got)

    def _publish_replayed(self, got: list[Raw]) -> None:
        for topic, seq_frame, payload in got:
            seq, stream = int.from_bytes(seq_frame[:8], "big"), seq_frame[8:]
            decision = self.tracker.classify(seq, stream)
            if decision.action is SeqAction.DUPLICATE:
                continue
            self.epoch += decision.restart
            if decision.action is SeqAction.GAP:  # the engine's buffer no longer reaches back that far
                self.counters.holes += seq - decision.start
            self.tracker.advance(seq, stream)
            self.tracker.caught_up(seq)
            self.publisher.offer(RelayItem(topic or self.topic, seq_frame, payload, self.epoch), force=True)
            self.counters.replayed += 1

    async def report(self, every: float) -> None:
        """Log the counters every `every` seconds."""
        while True:
            await asyncio.sleep(every)
            log.info("KV relay %s rank %d: %s (queue %d)", self.settings.endpoint, self.settings.rank,
                     self.counters.as_dict(), len(self.publisher.queue))


__all__ = ["KVRelay", "fetch_replay"]
