"""The KV-event subscriber: one ZMQ SUB subscription per endpoint (one socket per data-parallel rank), feeding
the precise index. asyncio + pyzmq.

Per endpoint rank, a task reads ``[topic, seq, payload]`` messages, decodes them (epp.fleet.kvevents.decode) and
applies them in order (epp.fleet.kvevents.apply). Sequence numbers are tracked per rank:

- a **gap** (a batch arrives past the expected seq, or the first batch seen is past 0) is filled from the
  publisher's replay socket with vLLM's protocol: a DEALER sends ``[b"", start seq as 8 bytes big-endian]`` and
  reads replies ``[b"", seq, payload]`` (or ``[b"", topic, seq, payload]``, newer vLLM) until the end marker
  with seq -1, within `replay_timeout` seconds. If the replay cannot supply every missing batch (no replay socket,
  timeout, a buffer that no longer holds them, a malformed reply) the rank is marked **unknown** in the index
  (emptied; whatever arrives next is still applied) until an AllBlocksCleared arrives or the publisher starts
  afresh;
- a publisher **restart** (the seq goes back, or the stream id that a snapshot-enabled vLLM appends to the seq
  changes) clears the rank: from seq 0 it is live at once, past 0 the missing history is asked from the replay;
- a **malformed** message is counted and dropped; when its seq is readable, the batch it carried is lost, so the
  rank is marked unknown as for a failed replay. The task keeps reading.

A rank that has received nothing `catch_up_after` seconds after subscribing asks its replay socket for the whole
retained history (from seq 0): an idle engine's cache is learnt without waiting for its next batch, and a fresh
idle engine (nothing published yet) becomes live. Live batches already applied through that replay are dropped
as duplicates.

Nothing here blocks the caller: ZMQ connects in the background, so an unreachable publisher is just a socket
that never delivers; `add_endpoint` / `remove_endpoint` are synchronous and never await. Only the rank's own
task waits on its replay.

The subscriber owns the subscriptions (one `RankStream` per endpoint rank, epp.fleet.kvevents.stream, which tracks
the rank's sequence numbers) and each rank's reading task; the replay requester (epp.fleet.kvevents.replay) fetches
history; the applier (epp.fleet.kvevents.applier) writes to the index and counts.

Public API: `KVEventSubscriber(index, metrics=None, replay_timeout=1.0, catch_up_after=0.5)` with
`add_endpoint(key, source)`, `remove_endpoint(key)` (also drops the endpoint from the index), `sync(sources)`
(add/remove to match a membership snapshot), `sources()`, `status()`, and `await close()`. Call them from the event
loop's thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping

import zmq
import zmq.asyncio

from epp.fleet.kvevents.applier import EventApplier, RankStatus
from epp.fleet.kvevents.decode import EventBatch
from epp.fleet.kvevents.metrics import KVEventMetrics
from epp.fleet.kvevents.replay import ReplayRequester
from epp.fleet.kvevents.sources import KVEventsSource
from epp.fleet.kvevents.stream import RankStream
from scheduling.prefix.precise import PENDING, PreciseIndex

__all__ = ["KVEventSubscriber", "RankStatus"]

log = logging.getLogger(__name__)

MAX_DRAIN = 512  # messages handled per wake-up before yielding to the loop


class KVEventSubscriber:
    def __init__(
        self,
        index: PreciseIndex,
        metrics: KVEventMetrics | None = None,
        *,
        replay_timeout: float = 1.0,
        catch_up_after: float | None = 0.5,
        context: zmq.asyncio.Context | None = None,
        rcvhwm: int = 100_000,
        on_batch: Callable[[str, int, EventBatch], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.index = index
        self.metrics = metrics if metrics is not None else KVEventMetrics()
        self._subs: dict[str, tuple[KVEventsSource, list[RankStream]]] = {}
        self.metrics.watch(index, lambda: len(self._subs))
        self.catch_up_after = catch_up_after
        self._ctx = context if context is not None else zmq.asyncio.Context.instance()
        self._rcvhwm = rcvhwm
        self.applier = EventApplier(index, self.metrics, clock, on_batch)
        self.replays = ReplayRequester(self._ctx, self.applier, replay_timeout)

    # ---- membership -----------------------------------------------------------------------------------
    def add_endpoint(self, key: str, source: KVEventsSource) -> None:
        """Subscribe to `key`'s events (idempotent; a changed source re-subscribes and starts the endpoint over)."""
        cur = self._subs.get(key)
        if cur is not None:
            if cur[0] == source:
                return
            self.remove_endpoint(key)
        loop = asyncio.get_running_loop()
        ranks: list[RankStream] = []
        try:
            for r in range(source.data_parallel_size):
                sock = self._ctx.socket(zmq.SUB)
                sock.setsockopt(zmq.LINGER, 0)
                sock.setsockopt(zmq.RCVHWM, self._rcvhwm)
                sock.setsockopt(zmq.SUBSCRIBE, source.topic.encode())
                rk = RankStream(key, r, source, sock, self.applier)
                ranks.append(rk)
                sock.connect(source.rank_endpoint(r))  # asynchronous: never blocks, even if nothing listens
        except zmq.ZMQError as e:
            for rk in ranks:
                rk.close()
            raise ValueError(f"cannot subscribe to {key}'s KV events at {source.endpoint}: {e}") from None
        for rk in ranks:
            self.index.set_state(key, rk.rank, PENDING)
            rk.task = loop.create_task(self._run(rk), name=f"kv-events {key} rank {rk.rank}")
        self._subs[key] = (source, ranks)

    def remove_endpoint(self, key: str) -> None:
        """Unsubscribe and forget everything the index holds for `key`."""
        cur = self._subs.pop(key, None)
        if cur is not None:
            for rk in cur[1]:
                rk.close()
        self.index.forget(key)

    def sync(self, sources: Mapping[str, KVEventsSource]) -> None:
        """Make the subscriptions match `sources` (endpoint key → source)."""
        for key in [k for k in self._subs if k not in sources]:
            self.remove_endpoint(key)
        for key, source in sources.items():
            self.add_endpoint(key, source)

    def sources(self) -> dict[str, KVEventsSource]:
        return {k: v[0] for k, v in self._subs.items()}

    def status(self) -> dict[str, list[RankStatus]]:
        out = {}
        for key, (_, ranks) in self._subs.items():
            states = self.index.slot_states(key)
            for rk in ranks:
                rk.status.state = states.get(rk.rank, PENDING)
            out[key] = [rk.status for rk in ranks]
        return out

    async def close(self) -> None:
        tasks = [rk.task for _, ranks in self._subs.values() for rk in ranks if rk.task is not None]
        for key in list(self._subs):
            self.remove_endpoint(key)
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t

    # ---- the per-rank loop ----------------------------------------------------------------------------
    async def _run(self, rk: RankStream) -> None:
        sock, shadow = rk.sock, rk.shadow
        assert sock is not None and shadow is not None
        first: list[bytes] | None = None
        if self.catch_up_after is not None and rk.replay_address is not None:
            try:
                first = await asyncio.wait_for(sock.recv_multipart(), self.catch_up_after)
            except asyncio.TimeoutError:
                await self.replays.catch_up(rk)
            except zmq.ZMQError:
                return
        while True:
            if first is not None:
                frames, first = first, None
            else:
                try:
                    frames = await sock.recv_multipart()
                except zmq.ZMQError:
                    return  # the socket was closed
            handled = 0
            while True:
                await self.replays.receive(rk, frames)
                handled += 1
                if handled >= MAX_DRAIN:
                    await asyncio.sleep(0)
                    handled = 0
                try:
                    frames = shadow.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    break
                except zmq.ZMQError:
                    return
