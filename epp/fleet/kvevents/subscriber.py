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
from dataclasses import dataclass

import zmq
import zmq.asyncio

from epp.fleet.kvevents import replay
from epp.fleet.kvevents.apply import ApplyStats, SeqAction, SequenceTracker, apply_events
from epp.fleet.kvevents.decode import DecodeError, EventBatch, decode_message, decode_seq
from epp.fleet.kvevents.metrics import KVEventMetrics
from epp.fleet.kvevents.sources import KVEventsSource
from scheduling.prefix.precise import LIVE, PENDING, PreciseIndex

log = logging.getLogger(__name__)

MAX_DRAIN = 512  # messages handled per wake-up before yielding to the loop


@dataclass(slots=True)
class RankStatus:
    endpoint: str
    rank: int
    address: str
    replay: str | None
    state: str
    batches: int = 0
    last_seq: int | None = None
    gaps: int = 0
    replays_ok: int = 0
    replays_failed: int = 0
    malformed: int = 0


class _Rank:
    __slots__ = ("key", "rank", "source", "sock", "shadow", "task", "tracker", "status")

    def __init__(self, key: str, rank: int, source: KVEventsSource, sock: zmq.asyncio.Socket) -> None:
        self.key = key
        self.rank = rank
        self.source = source
        self.sock = sock
        self.shadow: zmq.Socket[bytes] = zmq.Socket.shadow(sock.underlying)
        self.task: asyncio.Task[None] | None = None
        self.tracker = SequenceTracker()
        self.status = RankStatus(key, rank, source.rank_endpoint(rank), source.rank_replay(rank), PENDING)


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
        self.clock = clock  # when a gap, replay or restart happened (the index keeps the last per endpoint)
        self.metrics = metrics if metrics is not None else KVEventMetrics()
        self._subs: dict[str, tuple[KVEventsSource, list[_Rank]]] = {}
        self.metrics.watch(index, lambda: len(self._subs))
        self.replay_timeout = replay_timeout
        self.catch_up_after = catch_up_after
        self._ctx = context if context is not None else zmq.asyncio.Context.instance()
        self._rcvhwm = rcvhwm
        self._on_batch = on_batch
        m = self.metrics
        self._c_live = m.batches.labels("live")
        self._c_replay = m.batches.labels("replay")
        self._c_ev = {t: m.events.labels(t) for t in ("BlockStored", "BlockRemoved", "AllBlocksCleared", "ignored")}
        self._c_blocks = {op: m.blocks.labels(op) for op in ("stored", "removed", "orphaned")}

    # ---- membership -----------------------------------------------------------------------------------
    def add_endpoint(self, key: str, source: KVEventsSource) -> None:
        """Subscribe to `key`'s events (idempotent; a changed source re-subscribes and starts the endpoint over)."""
        cur = self._subs.get(key)
        if cur is not None:
            if cur[0] == source:
                return
            self.remove_endpoint(key)
        loop = asyncio.get_running_loop()
        ranks: list[_Rank] = []
        try:
            for r in range(source.data_parallel_size):
                sock = self._ctx.socket(zmq.SUB)
                sock.setsockopt(zmq.LINGER, 0)
                sock.setsockopt(zmq.RCVHWM, self._rcvhwm)
                sock.setsockopt(zmq.SUBSCRIBE, source.topic.encode())
                rk = _Rank(key, r, source, sock)
                ranks.append(rk)
                sock.connect(source.rank_endpoint(r))  # asynchronous: never blocks, even if nothing listens
        except zmq.ZMQError as e:
            for rk in ranks:
                rk.sock.close(0)
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
                if rk.task is not None:
                    rk.task.cancel()
                rk.sock.close(0)
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
    async def _run(self, rk: _Rank) -> None:
        sock, shadow = rk.sock, rk.shadow
        first: list[bytes] | None = None
        if self.catch_up_after is not None and rk.source.rank_replay(rk.rank) is not None:
            try:
                first = await asyncio.wait_for(sock.recv_multipart(), self.catch_up_after)
            except asyncio.TimeoutError:
                await self._catch_up(rk)
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
                try:
                    gap = self._handle(rk, frames)
                    if gap is not None:
                        await self._fill_gap(rk, *gap)
                except asyncio.CancelledError:
                    raise
                except Exception:  # never let one message kill the subscription
                    self.metrics.errors.inc()
                    log.exception("KV events from %s rank %d: unexpected error", rk.key, rk.rank)
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

    def _malformed(self, rk: _Rank, reason: str, err: Exception) -> None:
        self.metrics.malformed.labels(reason).inc()
        rk.status.malformed += 1
        log.warning("KV events from %s rank %d: dropped a malformed message: %s", rk.key, rk.rank, err)

    def _handle(self, rk: _Rank, frames: list[bytes]) -> tuple[EventBatch, int, bool, bool] | None:
        """Apply one live message; returns (batch, gap start, from zero, restart) when a gap must be filled."""
        if len(frames) != 3:
            self._malformed(rk, "frames", DecodeError(f"{len(frames)} frame(s); expected 3"))
            return None
        try:
            seq, stream = decode_seq(frames[1])
        except DecodeError as e:
            self._malformed(rk, "seq", e)
            return None
        try:
            batch = decode_message(frames)
        except DecodeError as e:
            # The batch with this seq is lost: the index can no longer be complete.
            self._malformed(rk, "payload", e)
            decision = rk.tracker.classify(seq, stream)
            if decision.action is SeqAction.FRESH:
                self._restarted(rk, decision.restart)
            rk.tracker.advance(seq, stream)
            self._lost(rk)
            return None
        decision = rk.tracker.classify(seq, stream)
        if decision.action is SeqAction.APPLY:
            rk.tracker.advance(seq, stream)
            self._apply(rk, batch, self._c_live)
            return None
        if decision.action is SeqAction.DUPLICATE:
            self.metrics.batches.labels("duplicate").inc()
            return None
        if decision.action is SeqAction.FRESH:
            self._restarted(rk, decision.restart)
            self.index.clear(rk.key, rk.rank, LIVE)
            rk.tracker.advance(seq, stream)
            self._apply(rk, batch, self._c_live)
            return None
        self.metrics.gaps.inc()
        rk.status.gaps += 1
        self.index.note_disruption(rk.key, self.clock(), "gap")
        if decision.restart:
            self._restarted(rk, True)
        return batch, decision.start, decision.from_zero, decision.restart

    def _restarted(self, rk: _Rank, restart: bool) -> None:
        if restart:
            self.metrics.restarts.inc()
            self.index.note_disruption(rk.key, self.clock(), "publisher restarted")
            log.info("KV events from %s rank %d: the publisher restarted", rk.key, rk.rank)

    def _lost(self, rk: _Rank) -> None:
        self.index.mark_unknown(rk.key, rk.rank)
        self.index.note_disruption(rk.key, self.clock(), "batches lost")
        self.metrics.unknown.inc()

    def _apply(self, rk: _Rank, batch: EventBatch, counter: object) -> None:
        st = apply_events(self.index, rk.key, rk.rank, batch.events, ApplyStats())
        counter.inc()  # type: ignore[attr-defined]
        rk.status.batches += 1
        rk.status.last_seq = batch.seq
        c = self._c_ev
        if st.stored_events:
            c["BlockStored"].inc(st.stored_events)
        if st.removed_events:
            c["BlockRemoved"].inc(st.removed_events)
        if st.cleared:
            c["AllBlocksCleared"].inc(st.cleared)
        if st.ignored:
            c["ignored"].inc(st.ignored)
        b = self._c_blocks
        if st.stored:
            b["stored"].inc(st.stored)
        if st.removed:
            b["removed"].inc(st.removed)
        if st.orphaned:
            b["orphaned"].inc(st.orphaned)
        if st.malformed:
            self.metrics.malformed.labels("tokens").inc(st.malformed)
        if self._on_batch is not None:
            self._on_batch(rk.key, rk.rank, batch)

    # ---- replay (epp/fleet/kvevents/replay.py: plain functions bound as methods) -------------------------
    _catch_up = replay.catch_up
    _fill_gap = replay.fill_gap
    _replay = replay.replay
    _exchange = replay.exchange
