"""A vLLM-like paged KV cache with prefix caching. Pure: no clock, no I/O.

* `capacity` blocks of `block_size` tokens.
* Full prompt blocks are *hashed*: hash_i = xxh64(parent hash ‖ token ids of block i ‖ extra keys of block i,
  seed = xxh64(LoRA name)); a block's extra keys are the mm hashes of the media items whose placeholder tokens it
  overlaps (vLLM's multimodal extra keys; none for text), so the same tokens with different media never share.
  A hashed block stays cached after its last user releases it, and can be hit by a later request whose
  prompt starts with the same chain of blocks.
* Partial prompt blocks and decode blocks are *private*: freed when their request ends.
* A block is evictable only when no request references it; the least recently released goes first
  (the tail of a chain is released before its head, as vLLM does, so heads live longer).
* Every store and eviction is appended to `events` as ("stored", block hash, parent hash, token ids, LoRA name,
  extra keys or None)
  or ("removed", block hash), and a reset as ("cleared",); the KV-event publisher drains them.
"""

from __future__ import annotations

from array import array
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import xxhash

_MASK = (1 << 64) - 1


MMItem = tuple[int, int, str]  # a media item's placeholders: (offset, length, mm hash)


def extra_keys(n_blocks: int, block_size: int, mm: Sequence[MMItem]) -> list[tuple[str, ...] | None]:
    """Per block, the mm hashes of the items whose placeholders overlap it (None for a block without media)."""
    out: list[tuple[str, ...] | None] = [None] * n_blocks
    for offset, length, h in mm:
        for b in range(offset // block_size, min(n_blocks, -(-(offset + length) // block_size))):
            out[b] = (*(out[b] or ()), h)
    return out


def block_hashes(tokens: Sequence[int], block_size: int, lora: str | None = None,
                 mm: Sequence[MMItem] = ()) -> list[int]:
    """Chained hashes of the full blocks of `tokens` (token ids packed as unsigned 64-bit, native order)."""
    n_full = len(tokens) // block_size
    if n_full == 0:
        return []
    head = tokens[: n_full * block_size]
    try:
        buf = array("Q", head).tobytes()
    except OverflowError:
        buf = array("Q", (t & _MASK for t in head)).tobytes()
    seed = xxhash.xxh64_intdigest((lora or "").encode())
    step = 8 * block_size
    digest = xxhash.xxh64_intdigest
    extras = extra_keys(n_full, block_size, mm) if mm else None
    out: list[int] = []
    parent = 0
    for b, i in enumerate(range(0, n_full * step, step)):
        extra = b"\0".join(x.encode() for x in extras[b]) if extras and extras[b] else b""
        parent = digest(parent.to_bytes(8, "little") + buf[i : i + step] + extra, seed)
        out.append(parent)
    return out


@dataclass
class _Block:
    ref: int
    ready_at: float
    parent: int | None


class KVCache:
    """Block pool + prefix cache."""

    def __init__(self, capacity: int, block_size: int, enable_prefix_caching: bool = True) -> None:
        self.capacity = capacity
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self._blocks: dict[int, _Block] = {}  # hashed blocks in cache (referenced or not)
        self._lru: OrderedDict[int, None] = OrderedDict()  # unreferenced hashed blocks, oldest first
        self.private = 0  # private blocks in use
        self.events: list[tuple] = []
        self.evictions = 0

    # ---- accounting -------------------------------------------------------------------------------
    @property
    def fresh(self) -> int:
        """Blocks never used or freed without a hash."""
        return self.capacity - len(self._blocks) - self.private

    @property
    def free(self) -> int:
        """Blocks a new allocation may take (fresh + evictable)."""
        return self.fresh + len(self._lru)

    @property
    def used(self) -> int:
        """Blocks referenced by some request."""
        return self.capacity - self.free

    @property
    def usage(self) -> float:
        return self.used / self.capacity

    @property
    def cached_blocks(self) -> int:
        return len(self._blocks)

    def contains(self, h: int) -> bool:
        return h in self._blocks

    def lru_order(self) -> Iterator[int]:
        """The evictable blocks' hashes, the next to be evicted first (for benchmarks that study eviction)."""
        return iter(self._lru)

    # ---- lookups ----------------------------------------------------------------------------------
    def match(self, hashes: Sequence[int]) -> int:
        """Number of leading blocks of the chain `hashes` present in the cache."""
        if not self.enable_prefix_caching:
            return 0
        n = 0
        for h in hashes:
            if h not in self._blocks:
                break
            n += 1
        return n

    def ready_at(self, hashes: Sequence[int]) -> float:
        """The latest time at which any of these cached blocks finishes being computed."""
        return max((self._blocks[h].ready_at for h in hashes if h in self._blocks), default=0.0)

    # ---- mutations --------------------------------------------------------------------------------
    def _take_one(self) -> bool:
        if self.fresh > 0:
            return True
        if not self._lru:
            return False
        h, _ = self._lru.popitem(last=False)
        del self._blocks[h]
        self.evictions += 1
        self.events.append(("removed", h))
        return True

    def acquire(
        self, hashes: Sequence[int], n_hit: int, n_private: int, ready_at: float, tokens: Sequence[int],
        lora: str | None = None, extras: Sequence[tuple[str, ...] | None] = (),
    ) -> bool:
        """Reference the first `n_hit` cached blocks, store the rest of `hashes`, allocate `n_private`.
        `extras`: the blocks' extra keys (`extra_keys`), published with them.

        All or nothing: returns False (and changes nothing) when there is not enough room.
        """
        need = len(hashes) - n_hit + n_private
        hit = hashes[:n_hit]
        evictable_hits = sum(1 for h in hit if self._blocks[h].ref == 0)
        if self.free - evictable_hits < need:
            return False
        for h in hit:
            b = self._blocks[h]
            if b.ref == 0:
                self._lru.pop(h, None)
            b.ref += 1
        parent: int | None = hashes[n_hit - 1] if n_hit else None
        bs = self.block_size
        for i in range(n_hit, len(hashes)):
            h = hashes[i]
            b = self._blocks.get(h)
            if b is not None:  # still cached although an earlier block of its chain was evicted
                if b.ref == 0:
                    self._lru.pop(h, None)
                b.ref += 1
            else:
                self._take_one()
                self._blocks[h] = _Block(ref=1, ready_at=ready_at, parent=parent)
                if self.enable_prefix_caching:
                    extra = extras[i] if i < len(extras) else None
                    self.events.append(("stored", h, parent, list(tokens[i * bs : (i + 1) * bs]), lora, extra))
            parent = h
        for _ in range(n_private):
            self._take_one()
            self.private += 1
        return True

    def grow(self) -> bool:
        """Allocate one more private block; False when the cache is full."""
        if not self._take_one():
            return False
        self.private += 1
        return True

    def release(self, hashes: Sequence[int], n_private: int) -> None:
        """Drop one reference of each hashed block (tail first) and free `n_private` private blocks."""
        self.private -= n_private
        for h in reversed(hashes):
            b = self._blocks.get(h)
            if b is None:
                continue
            b.ref -= 1
            if b.ref == 0:
                if self.enable_prefix_caching:
                    self._lru[h] = None
                else:
                    del self._blocks[h]

    def clear(self) -> bool:
        """vLLM's reset_prefix_cache: drop every cached block, only when no block is in use (else False and
        nothing changes). A successful reset records ("cleared",)."""
        if self.used:
            return False
        self._blocks.clear()
        self._lru.clear()
        self.events.append(("cleared",))
        return True

    def drain_events(self) -> list[tuple]:
        ev, self.events = self.events, []
        return ev
