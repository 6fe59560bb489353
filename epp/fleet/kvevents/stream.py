"""One endpoint rank's KV-event stream: its SUB socket, its sequence tracker and what it has seen (`RankStatus`).
`handle` takes one live message and decides from its sequence number: apply it, drop it as a duplicate, start the
slot over (a publisher that started afresh), or report a gap for the replay to fill (see
epp.fleet.kvevents.subscriber's docstring)."""

from __future__ import annotations

import asyncio
from typing import NamedTuple

import zmq
import zmq.asyncio

from epp.fleet.kvevents.applier import EventApplier, RankStatus
from epp.fleet.kvevents.apply import SeqAction, SequenceTracker
from epp.fleet.kvevents.decode import DecodeError, EventBatch, decode_message, decode_seq
from epp.fleet.kvevents.sources import KVEventsSource
from scheduling.prefix.precise import LIVE, PENDING


class Gap(NamedTuple):
    """A live batch that arrived past the expected seq: [start, batch.seq) is missing."""

    batch: EventBatch
    start: int
    from_zero: bool  # the whole history is missing (the slot is rebuilt from empty)
    restart: bool  # the publisher restarted


class RankStream:
    __slots__ = ("key", "rank", "source", "sock", "shadow", "task", "tracker", "status", "applier")

    def __init__(self, key: str, rank: int, source: KVEventsSource, sock: zmq.asyncio.Socket | None,
                 applier: EventApplier, address: str | None = None) -> None:
        """`sock` None: the batches come from elsewhere (NATS, epp.fleet.kvevents.jetstream), named `address`."""
        self.key = key
        self.rank = rank
        self.source = source
        self.sock = sock
        # for non-blocking reads
        self.shadow: zmq.Socket[bytes] | None = zmq.Socket.shadow(sock.underlying) if sock is not None else None
        self.task: asyncio.Task[None] | None = None
        self.tracker = SequenceTracker()
        self.status = RankStatus(key, rank, address or source.rank_endpoint(rank), source.rank_replay(rank), PENDING)
        self.applier = applier

    @property
    def replay_address(self) -> str | None:
        return self.source.rank_replay(self.rank)

    def close(self) -> None:
        if self.task is not None:
            self.task.cancel()
        if self.sock is not None:
            self.sock.close(0)

    def handle(self, frames: list[bytes]) -> Gap | None:
        """Apply one live message; returns the gap to fill before its batch can be applied."""
        ap, rs = self.applier, self.status
        if len(frames) != 3:
            ap.malformed(rs, "frames", DecodeError(f"{len(frames)} frame(s); expected 3"))
            return None
        try:
            seq, stream = decode_seq(frames[1])
        except DecodeError as e:
            ap.malformed(rs, "seq", e)
            return None
        try:
            batch = decode_message(frames)
        except DecodeError as e:
            # The batch with this seq is lost: the index can no longer be complete.
            ap.malformed(rs, "payload", e)
            decision = self.tracker.classify(seq, stream)
            if decision.action is SeqAction.FRESH:
                ap.restarted(rs, decision.restart)
            self.tracker.advance(seq, stream)
            ap.lost(rs)
            return None
        decision = self.tracker.classify(seq, stream)
        if decision.action is SeqAction.APPLY:
            self.tracker.advance(seq, stream)
            ap.apply(rs, batch)
            return None
        if decision.action is SeqAction.DUPLICATE:
            ap.duplicate()
            return None
        if decision.action is SeqAction.FRESH:
            ap.restarted(rs, decision.restart)
            ap.clear(rs, LIVE)
            self.tracker.advance(seq, stream)
            ap.apply(rs, batch)
            return None
        ap.gap(rs)
        if decision.restart:
            ap.restarted(rs, True)
        return Gap(batch, decision.start, decision.from_zero, decision.restart)

    def caught_up(self, batches: list[EventBatch]) -> None:
        """A catch-up replay applied `batches` (the retained history): live batches up to the last are duplicates."""
        self.tracker.caught_up(batches[-1].seq if batches else None)
        if batches:
            self.tracker.stream = batches[-1].stream_id or None

    def advance(self, batch: EventBatch) -> None:
        self.tracker.advance(batch.seq, batch.stream_id)
