"""Replay: the history a KV-event publisher retains, fetched from its replay (ROUTER) socket to catch up after a
subscription starts or to fill a sequence gap (docs/kv-events.md). Methods of
`epp.fleet.kvevents.subscriber.KVEventSubscriber` (bound there)."""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

import zmq
import zmq.asyncio

from epp.fleet.kvevents.decode import DecodeError, EventBatch, decode_payload, decode_seq
from scheduling.prefix.precise import LIVE, PENDING

if TYPE_CHECKING:
    from epp.fleet.kvevents.subscriber import KVEventSubscriber, _Rank

log = logging.getLogger("epp.fleet.kvevents.subscriber")

END_SEQ = (1 << 64) - 1  # -1 as an unsigned 64-bit seq: the end of a replay


async def catch_up(sub: KVEventSubscriber, rk: _Rank) -> None:
    """Nothing arrived yet: learn the retained history from the replay socket."""
    replayed, outcome = await replay(sub, rk, 0, None)
    sub.metrics.replays.labels(outcome).inc()
    if outcome != "ok":
        rk.status.replays_failed += 1
        return  # stay pending; the first live batch decides
    rk.status.replays_ok += 1
    if replayed and replayed[0].seq != 0:  # the buffer no longer reaches back to seq 0
        sub._lost(rk)
    else:
        sub.index.clear(rk.key, rk.rank, LIVE)
    for b in replayed:
        sub._apply(rk, b, sub._c_replay)
    rk.tracker.caught_up(replayed[-1].seq if replayed else None)
    if replayed:
        rk.tracker.stream = replayed[-1].stream_id or None


async def fill_gap(sub: KVEventSubscriber, rk: _Rank, batch: EventBatch, start: int, from_zero: bool, restart: bool) -> None:
    """Fetch [start, batch.seq) from the replay socket, then apply `batch`. A history from seq 0 rebuilds the
    slot from empty (live on success); any batch that cannot be had marks the slot unknown."""
    replayed, outcome = await replay(sub, rk, start, batch.seq)
    sub.metrics.replays.labels(outcome).inc()
    complete = outcome == "ok"
    if complete:
        rk.status.replays_ok += 1
        sub.index.note_disruption(rk.key, sub.clock(), f"gap of {batch.seq - start} batches replayed", True)
    else:
        rk.status.replays_failed += 1
        log.warning("KV events from %s rank %d: seq %d..%d missing, replay %s; endpoint marked unknown",
                    rk.key, rk.rank, start, batch.seq - 1, outcome)
    if from_zero:
        sub.index.clear(rk.key, rk.rank, LIVE if complete else PENDING)
    if not complete:
        sub._lost(rk)
    for b in replayed:
        sub._apply(rk, b, sub._c_replay)
    rk.tracker.advance(batch.seq, batch.stream_id)
    sub._apply(rk, batch, sub._c_live)


async def replay(sub: KVEventSubscriber, rk: _Rank, start: int, stop: int | None) -> tuple[list[EventBatch], str]:
    """Batches [start, stop) (stop None: all) from the rank's replay socket, and an outcome: ok, incomplete,
    timeout, unavailable or error. With stop None, "ok" means the retained batches are contiguous."""
    address = rk.source.rank_replay(rk.rank)
    if address is None:
        return [], "unavailable"
    sock = sub._ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    got: dict[int, EventBatch] = {}
    outcome = "ok"
    try:
        sock.connect(address)
        await asyncio.wait_for(exchange(sub, sock, rk, start, stop, got), sub.replay_timeout)
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


async def exchange(sub: KVEventSubscriber, sock: zmq.asyncio.Socket, rk: _Rank, start: int, stop: int | None,
                    got: dict[int, EventBatch]) -> None:
    await sock.send_multipart([b"", start.to_bytes(8, "big")])
    while True:
        frames = await sock.recv_multipart()
        f = frames[1:] if frames and frames[0] == b"" else frames
        if len(f) == 2:
            topic, seq_frame, payload = b"", f[0], f[1]
        elif len(f) == 3:
            topic, seq_frame, payload = f
        else:
            sub._malformed(rk, "frames", DecodeError(f"replay reply with {len(frames)} frame(s)"))
            continue
        try:
            seq, stream = decode_seq(seq_frame)
        except DecodeError as e:
            sub._malformed(rk, "seq", e)
            continue
        if seq == END_SEQ:
            return
        if seq < start or (stop is not None and seq >= stop):
            continue
        try:
            ts, events, dp = decode_payload(payload)
        except DecodeError as e:
            sub._malformed(rk, "payload", e)
            continue
        got[seq] = EventBatch(seq, ts, events, dp, bytes(topic), stream)
