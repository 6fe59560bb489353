"""The relay's writer to JetStream: a bounded queue of engine batches published in order, acks awaited
asynchronously (a window of publishes in flight), and a resync after any failure.

`offer(item)` never waits: it answers False when the queue is full (the relay then drops the batch without
advancing its sequence tracker, and fills the hole from the engine's replay once there is room, see
epp.fleet.kvevents.relay). The pump sends up to `window` batches ahead of the oldest unacknowledged one. When an ack
fails or does not come within `ack_timeout` (the server restarted, the connection dropped), everything in flight is
forgotten, the subject's last stored message is looked up (retrying until the server answers), the queue is cut
after it, and publishing resumes from there in order: a batch is stored once (the message id guards the rest),
and never after a later one of the same subject.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from dataclasses import asdict, dataclass
from typing import Any

from epp.fleet.kvevents import natswire

log = logging.getLogger("epp.fleet.kvevents.relay")


@dataclass(slots=True)
class RelayItem:
    topic: bytes
    seq_frame: bytes
    payload: bytes
    epoch: int = 0  # the engine's restarts the relay has seen (natswire)
    future: Any = None  # the ack's future once sent

    @property
    def seq(self) -> int:
        return int.from_bytes(self.seq_frame[:8], "big")


@dataclass(slots=True)
class RelayCounters:
    received: int = 0  # live batches read from the engine
    replayed: int = 0  # batches fetched from the engine's replay
    published: int = 0  # batches acknowledged by JetStream
    duplicates: int = 0  # acknowledged as duplicates (published before)
    overflow: int = 0  # dropped on a full queue (refilled from the engine's replay)
    holes: int = 0  # batches neither the engine's stream nor its replay could supply
    resyncs: int = 0  # publish failures recovered from
    malformed: int = 0  # engine messages without a readable seq

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


class StreamPublisher:
    def __init__(self, js: Any, pool: str, endpoint: str, rank: int, counters: RelayCounters, *,
                 max_pending: int = 10_000, window: int = 256, ack_timeout: float = 2.0) -> None:
        self.js = js
        self.stream = natswire.stream_name(pool)
        self.subject = natswire.subject(pool, endpoint, rank)
        self.endpoint = endpoint
        self.rank = rank
        self.counters = counters
        self.max_pending = max_pending
        self.window = window
        self.ack_timeout = ack_timeout
        self.queue: deque[RelayItem] = deque()  # not yet acknowledged, in seq order; the first `sent` are in flight
        self.sent = 0
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()

    def room(self) -> bool:
        return len(self.queue) < self.max_pending

    def offer(self, item: RelayItem, force: bool = False) -> bool:
        """Queue a batch; False (dropped) when full, unless `force` (replayed batches filling a hole)."""
        if not force and not self.room():
            return False
        self.queue.append(item)
        self._idle.clear()
        self._wake.set()
        return True

    async def drained(self, timeout: float | None = None) -> bool:
        """Wait until every queued batch is acknowledged."""
        try:
            await asyncio.wait_for(self._idle.wait(), timeout)
            return True
        except asyncio.TimeoutError:
            return False

    async def last_stored(self) -> tuple[bytes, str, int] | None:
        """The seq frame, message id and epoch of the subject's last stored batch, or None (raises while
        unreachable)."""
        try:
            msg = await self.js.get_last_msg(self.stream, self.subject)
        except Exception as e:  # nats.js.errors.NotFoundError: nothing stored for this subject yet
            if type(e).__name__ == "NotFoundError":
                return None
            raise
        hdrs = msg.headers or {}
        try:
            return (bytes.fromhex(hdrs.get(natswire.H_SEQ, "")), hdrs.get(natswire.H_MSG_ID, ""),
                    int(hdrs.get(natswire.H_EPOCH, "0")))
        except ValueError:
            return None

    async def run(self) -> None:
        while True:
            if not self.queue:
                self._idle.set()
                self._wake.clear()
                await self._wake.wait()
                continue
            try:
                await self._send_window()
                head = self.queue[0]
                ack = await asyncio.wait_for(asyncio.shield(head.future), self.ack_timeout)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # timeout, no responders, a closed connection, an API error
                await self._resync(e)
                continue
            self.queue.popleft()
            self.sent -= 1
            if getattr(ack, "duplicate", False):
                self.counters.duplicates += 1
            else:
                self.counters.published += 1

    async def _send_window(self) -> None:
        while self.sent < len(self.queue) and self.sent < self.window:
            item = self.queue[self.sent]
            hdrs = natswire.headers(self.endpoint, self.rank, item.topic, item.seq_frame, item.epoch)
            item.future = await self.js.publish_async(self.subject, item.payload, headers=hdrs, wait_stall=5.0)
            self.sent += 1

    async def _resync(self, err: BaseException) -> None:
        self.counters.resyncs += 1
        log.warning("KV relay %s rank %d: publishing to %s failed (%s); resyncing", self.endpoint, self.rank,
                    self.subject, type(err).__name__ or err)
        for item in list(self.queue)[: self.sent]:
            if item.future is not None and not item.future.done():
                item.future.cancel()
            item.future = None
        self.sent = 0
        while True:
            try:
                last = await self.last_stored()
                break
            except asyncio.CancelledError:
                raise
            except Exception:
                await asyncio.sleep(0.5)
        if last is None:
            return
        ids = [natswire.msg_id(self.endpoint, self.rank, it.seq_frame, it.epoch) for it in self.queue]
        with contextlib.suppress(ValueError):
            stored = ids.index(last[1])
            for _ in range(stored + 1):
                self.queue.popleft()
                self.counters.published += 1


__all__ = ["RelayCounters", "RelayItem", "StreamPublisher"]
