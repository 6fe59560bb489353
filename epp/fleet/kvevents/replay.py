"""Replay: the history a KV-event publisher retains, fetched from its replay (ROUTER) socket to catch up after a
subscription starts or to fill a sequence gap (docs/kv-events.md). The replay requester of
epp.fleet.kvevents.subscriber: it asks, then hands what it got to the applier."""

from __future__ import annotations

import asyncio
import logging

import zmq
import zmq.asyncio

from epp.fleet.kvevents.applier import EventApplier
from epp.fleet.kvevents.decode import (
    END_SEQ,
    DecodeError,
    EventBatch,
    decode_payload,
    decode_seq,
    reply_frames,
)
from epp.fleet.kvevents.stream import Gap, RankStream
from scheduling.prefix.precise import LIVE, PENDING

log = logging.getLogger("epp.fleet.kvevents.subscriber")

class ReplayRequester:
    def __init__(self, ctx: zmq.asyncio.Context, applier: EventApplier, timeout: float) -> None:
        self.ctx = ctx
        self.applier = applier
        self.timeout = timeout

    async def receive(self, rk: RankStream, frames: list[bytes]) -> None:
        """One message of `rk`'s through its sequence rules, a gap filled from the replay. An unexpected error is
        counted and logged, never raised: one message never ends a subscription (ZMQ's or the NATS stream's)."""
        try:
            gap = rk.handle(frames)
            if gap is not None:
                await self.fill_gap(rk, gap)
        except asyncio.CancelledError:
            raise
        except Exception:
            self.applier.metrics.errors.inc()
            log.exception("KV events from %s rank %d: unexpected error", rk.key, rk.rank)

    async def catch_up(self, rk: RankStream) -> None:
        """Nothing arrived yet: learn the retained history from the replay socket."""
        ap, rs = self.applier, rk.status
        replayed, outcome = await self.replay(rk, 0, None)
        ap.metrics.replays.labels(outcome).inc()
        if outcome != "ok":
            rs.replays_failed += 1
            return  # stay pending; the first live batch decides
        rs.replays_ok += 1
        if replayed and replayed[0].seq != 0:  # the buffer no longer reaches back to seq 0
            ap.lost(rs)
        else:
            ap.clear(rs, LIVE)
        for b in replayed:
            ap.apply(rs, b, replayed=True)
        rk.caught_up(replayed)

    async def fill_gap(self, rk: RankStream, gap: Gap) -> None:
        """Fetch [start, batch.seq) from the replay socket, then apply the batch. A history from seq 0 rebuilds the
        slot from empty (live on success); any batch that cannot be had marks the slot unknown."""
        ap, rs, batch, start = self.applier, rk.status, gap.batch, gap.start
        replayed, outcome = await self.replay(rk, start, batch.seq)
        ap.metrics.replays.labels(outcome).inc()
        complete = outcome == "ok"
        if complete:
            rs.replays_ok += 1
            ap.gap_filled(rs, batch.seq - start)
        else:
            rs.replays_failed += 1
            log.warning("KV events from %s rank %d: seq %d..%d missing, replay %s; endpoint marked unknown",
                        rk.key, rk.rank, start, batch.seq - 1, outcome)
        if gap.from_zero:
            ap.clear(rs, LIVE if complete else PENDING)
        if not complete:
            ap.lost(rs)
        for b in replayed:
            ap.apply(rs, b, replayed=True)
        rk.advance(batch)
        ap.apply(rs, batch)

    async def replay(self, rk: RankStream, start: int, stop: int | None) -> tuple[list[EventBatch], str]:
        """Batches [start, stop) (stop None: all) from the rank's replay socket, and an outcome: ok, incomplete,
        timeout, unavailable or error. With stop None, "ok" means the retained batches are contiguous."""
        address = rk.replay_address
        if address is None:
            return [], "unavailable"
        sock = self.ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        got: dict[int, EventBatch] = {}
        outcome = "ok"
        try:
            sock.connect(address)
            await asyncio.wait_for(self._exchange(sock, rk, start, stop, got), self.timeout)
        except asyncio.TimeoutError:
            outcome = "timeout"
        except zmq.ZMQError as e:
            log.warning("KV events replay from %s: %s", address, e)
            outcome = "error"
        finally:
            sock.close(0)
        batches = [got[s] for s in sorted(got)]
        if outcome == "ok":
            seqs = [b.seq for b in batches]
            want = list(range(start, stop)) if stop is not None else list(range(seqs[0], seqs[0] + len(seqs))) \
                if seqs else []
            if seqs != want:
                outcome = "incomplete"
        return batches, outcome

    async def _exchange(self, sock: zmq.asyncio.Socket, rk: RankStream, start: int, stop: int | None,
                        got: dict[int, EventBatch]) -> None:
        await sock.send_multipart([b"", start.to_bytes(8, "big")])
        ap, rs = self.applier, rk.status
        while True:
            frames = await sock.recv_multipart()
            reply = reply_frames(frames)
            if reply is None:
                ap.malformed(rs, "frames", DecodeError(f"replay reply with {len(frames)} frame(s)"))
                continue
            topic, seq_frame, payload = reply
            try:
                seq, stream = decode_seq(seq_frame)
            except DecodeError as e:
                ap.malformed(rs, "seq", e)
                continue
            if seq == END_SEQ:
                return
            if seq < start or (stop is not None and seq >= stop):
                continue
            try:
                ts, events, dp = decode_payload(payload)
            except DecodeError as e:
                ap.malformed(rs, "payload", e)
                continue
            got[seq] = EventBatch(seq, ts, events, dp, bytes(topic), stream)
