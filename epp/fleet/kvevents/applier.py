"""The KV-event subscriber's writer to the precise index: applies decoded batches (epp.fleet.kvevents.apply), marks
a rank unknown when batches are lost, notes disruptions for the index's readers, and counts all of it in the
subscriber's metrics and in each rank's `RankStatus`."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from epp.fleet.kvevents.apply import ApplyStats, apply_events
from epp.fleet.kvevents.decode import EventBatch
from epp.fleet.kvevents.metrics import KVEventMetrics
from scheduling.prefix.precise import PreciseIndex

log = logging.getLogger("epp.fleet.kvevents.subscriber")

BatchHook = Callable[[str, int, EventBatch], None]  # (endpoint, rank, batch), after it was applied


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


class EventApplier:
    def __init__(self, index: PreciseIndex, metrics: KVEventMetrics, clock: Callable[[], float],
                 on_batch: BatchHook | None = None) -> None:
        self.index = index
        self.metrics = metrics
        self.clock = clock  # when a gap, replay or restart happened (the index keeps the last per endpoint)
        self.on_batch = on_batch
        m = metrics
        self._c_live = m.batches.labels("live")
        self._c_replay = m.batches.labels("replay")
        self._c_ev = {t: m.events.labels(t) for t in ("BlockStored", "BlockRemoved", "AllBlocksCleared", "ignored")}
        self._c_blocks = {op: m.blocks.labels(op) for op in ("stored", "removed", "orphaned")}

    def apply(self, rs: RankStatus, batch: EventBatch, replayed: bool = False) -> None:
        """Apply one batch (live, or from a replay) to the rank's slot."""
        st = apply_events(self.index, rs.endpoint, rs.rank, batch.events, ApplyStats())
        (self._c_replay if replayed else self._c_live).inc()
        rs.batches += 1
        rs.last_seq = batch.seq
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
        if self.on_batch is not None:
            self.on_batch(rs.endpoint, rs.rank, batch)

    def clear(self, rs: RankStatus, state: str) -> None:
        """The rank's slot starts over empty, in `state`."""
        self.index.clear(rs.endpoint, rs.rank, state)

    def malformed(self, rs: RankStatus, reason: str, err: Exception) -> None:
        self.metrics.malformed.labels(reason).inc()
        rs.malformed += 1
        log.warning("KV events from %s rank %d: dropped a malformed message: %s", rs.endpoint, rs.rank, err)

    def duplicate(self) -> None:
        self.metrics.batches.labels("duplicate").inc()

    def gap(self, rs: RankStatus) -> None:
        self.metrics.gaps.inc()
        rs.gaps += 1
        self.index.note_disruption(rs.endpoint, self.clock(), "gap")

    def gap_filled(self, rs: RankStatus, batches: int) -> None:
        self.index.note_disruption(rs.endpoint, self.clock(), f"gap of {batches} batches replayed", True)

    def restarted(self, rs: RankStatus, restart: bool) -> None:
        if restart:
            self.metrics.restarts.inc()
            self.index.note_disruption(rs.endpoint, self.clock(), "publisher restarted")
            log.info("KV events from %s rank %d: the publisher restarted", rs.endpoint, rs.rank)

    def lost(self, rs: RankStatus) -> None:
        """Batches were lost: the slot is unknown until a reset or a restart."""
        self.index.mark_unknown(rs.endpoint, rs.rank)
        self.index.note_disruption(rs.endpoint, self.clock(), "batches lost")
        self.metrics.unknown.inc()
