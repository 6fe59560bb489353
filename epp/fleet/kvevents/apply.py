"""Apply decoded KV events to the precise index, and classify batch sequence numbers. Pure: no I/O.

Event → index:
- BlockStored → `PreciseIndex.store` with the LoRA identity (`lora_name`, else ``lora-id:<id>``, else the base
  model) and the medium (GPU / CPU; other tiers such as DISK are ignored). A parent the index does not know
  makes the event an orphan: dropped and counted (its blocks cannot be keyed).
- BlockRemoved → `PreciseIndex.remove`.
- AllBlocksCleared → `PreciseIndex.clear` (the slot is empty and live).
- Events of KV-cache groups other than the first (``group_idx`` > 0, e.g. a hybrid model's sliding-window group)
  and unknown event types are ignored and counted.

Sequence numbers (`SequenceTracker`, one per endpoint and data-parallel rank):
- the first batch seen with seq 0, or a restart (the seq goes back, or the publisher's stream id changes) seen at
  seq 0 → `FRESH`: the publisher started afresh; the slot is cleared and live;
- the next expected seq → `APPLY`;
- a jump forward → `GAP` from the expected seq (from 0 for the first batch seen, or after a restart seen past 0,
  with `from_zero` set): the missing batches are asked from the replay socket before applying this one;
- a seq already applied through a catch-up replay (`caught_up`) → `DUPLICATE` (dropped).

Public API: `apply_events`, `ApplyStats`, `lora_identity`, `SequenceTracker`, `SeqAction`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

from epp.fleet.kvevents.decode import AllBlocksCleared, BlockRemoved, BlockStored, KVEvent
from scheduling.prefix.precise import MEDIA, ORPHAN, PreciseIndex


def lora_identity(lora_name: str | None, lora_id: int | None) -> str | None:
    """The LoRA part of a block key: the adapter name (what requests carry), else its numeric id."""
    if lora_name:
        return lora_name
    if lora_id is not None:
        return f"lora-id:{lora_id}"
    return None


@dataclass(slots=True)
class ApplyStats:
    stored: int = 0  # engine blocks newly indexed
    removed: int = 0  # engine blocks dropped
    orphaned: int = 0  # blocks of BlockStored events whose parent is unknown
    malformed: int = 0  # BlockStored events whose tokens do not fit their hashes
    ignored: int = 0  # events of other KV groups / tiers, unknown event types
    cleared: int = 0  # AllBlocksCleared events
    stored_events: int = 0
    removed_events: int = 0

    def add(self, other: ApplyStats) -> None:
        for name in self.__slots__:
            setattr(self, name, getattr(self, name) + getattr(other, name))


def apply_events(index: PreciseIndex, endpoint: str, rank: int, events: Sequence[KVEvent],
                 stats: ApplyStats | None = None) -> ApplyStats:
    """Apply one batch's events in order."""
    st = ApplyStats() if stats is None else stats
    for ev in events:
        if type(ev) is BlockStored:
            medium = MEDIA.get(ev.medium)
            if medium is None or (ev.group_idx or 0) != 0:
                st.ignored += 1
                continue
            st.stored_events += 1
            n = index.store(endpoint, rank, ev.block_hashes, ev.parent_block_hash, ev.token_ids,
                            ev.block_size, lora_identity(ev.lora_name, ev.lora_id), medium)
            if n >= 0:
                st.stored += n
            elif n == ORPHAN:
                st.orphaned += len(ev.block_hashes)
            else:
                st.malformed += 1
        elif type(ev) is BlockRemoved:
            medium = MEDIA.get(ev.medium)
            if medium is None or (ev.group_idx or 0) != 0:
                st.ignored += 1
                continue
            st.removed_events += 1
            st.removed += index.remove(endpoint, rank, ev.block_hashes, medium)
        elif type(ev) is AllBlocksCleared:
            st.cleared += 1
            index.clear(endpoint, rank)
        else:
            st.ignored += 1
    return st


class SeqAction(Enum):
    APPLY = "apply"
    FRESH = "fresh"
    GAP = "gap"
    DUPLICATE = "duplicate"


@dataclass(frozen=True, slots=True)
class SeqDecision:
    action: SeqAction
    start: int = 0  # GAP: the first missing seq (the batch at hand is the end, exclusive)
    from_zero: bool = False  # GAP: the whole history is missing (first batch seen, or a restart)
    restart: bool = False  # the publisher restarted


class SequenceTracker:
    """Where a batch's seq stands relative to what was seen before (one publisher stream)."""

    __slots__ = ("expected", "stream", "dup_upto")

    def __init__(self) -> None:
        self.expected: int | None = None
        self.stream: bytes | None = None
        self.dup_upto: int | None = None  # batches up to here came through a catch-up replay

    def caught_up(self, last: int | None) -> None:
        """A catch-up replay applied everything up to `last` (None: the publisher had published nothing)."""
        self.expected = 0 if last is None else last + 1
        self.dup_upto = last

    def classify(self, seq: int, stream_id: bytes = b"") -> SeqDecision:
        restarted = False
        if self.dup_upto is not None:
            if seq <= self.dup_upto and not (stream_id and self.stream and stream_id != self.stream):
                return SeqDecision(SeqAction.DUPLICATE)
            self.dup_upto = None
        if self.expected is not None:
            if stream_id and self.stream and stream_id != self.stream:
                restarted = True
            elif seq < self.expected:
                restarted = True  # one PUB stream over TCP neither reorders nor repeats: the publisher restarted
        if self.expected is None or restarted:
            if seq == 0:
                return SeqDecision(SeqAction.FRESH, restart=restarted)
            return SeqDecision(SeqAction.GAP, 0, True, restarted)
        if seq == self.expected:
            return SeqDecision(SeqAction.APPLY)
        return SeqDecision(SeqAction.GAP, self.expected)

    def advance(self, seq: int, stream_id: bytes = b"") -> None:
        self.expected = seq + 1
        if stream_id:
            self.stream = stream_id
