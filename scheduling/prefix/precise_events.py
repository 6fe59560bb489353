"""The precise index's engine blocks (scheduling.prefix.precise, whose docstring gives the layout): each slot's
per-medium map from engine block hash to key, kept within a capacity (the least recently stored blocks go first).
Applies BlockStored (`store`: a block run aligned with the index's block size, the general case of other engine
block sizes or a partial parent tail, and a store without tokens that re-homes known blocks on another medium) and
BlockRemoved (`remove`, counting duplicate stores), setting and clearing the slots' bits in the holders table.
Pure: no I/O, no clock."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence

import xxhash

from scheduling.prefix.precise_holders import Holders
from scheduling.prefix.precise_layout import CPU, GPU, MALFORMED, ORPHAN, Slot, unset
from scheduling.prefix.token_keys import ROOT, TOKEN_BYTES, extend_chain, pack_tokens, root_key

_h = xxhash.xxh3_64_intdigest


class EngineBlocks:
    def __init__(self, holders: Holders, block_size: int, capacity: int) -> None:
        self.holders = holders
        self.block_size = block_size
        self.capacity = capacity  # engine blocks per slot and medium, unless set per endpoint
        self._caps: dict[str, int] = {}
        self._roots: dict[str | None, int] = {None: ROOT}
        self.counters = {"stored": 0, "removed": 0, "orphaned": 0, "evicted": 0, "duplicates": 0,
                         "unknown_removals": 0, "malformed": 0}

    def set_capacity(self, endpoint: str, capacity: int) -> None:
        """Bound each of the endpoint's slots to `capacity` engine blocks per medium (drops the oldest now)."""
        self._caps[endpoint] = capacity
        for slot in self.holders.of(endpoint):
            for medium in (GPU, CPU):
                self.trim(slot, medium, capacity)

    def forget(self, endpoint: str) -> None:
        self._caps.pop(endpoint, None)

    def _root(self, lora: str | None) -> int:
        r = self._roots.get(lora)
        if r is None:
            if len(self._roots) > 4096:
                self._roots.clear()
                self._roots[None] = ROOT
            r = self._roots[lora] = root_key(lora)
        return r

    def store(
        self,
        endpoint: str,
        rank: int,
        block_hashes: Sequence[int],
        parent: int | None,
        token_ids: Sequence[int],
        block_size: int,
        lora: str | None = None,
        medium: int = GPU,
    ) -> int:
        """Apply one BlockStored. Returns the engine blocks newly indexed, or ORPHAN (parent unknown: dropped)
        or MALFORMED. An event without tokens re-homes already known blocks on `medium` (offloading)."""
        slot = self.holders.slot(endpoint, rank)
        n = len(block_hashes)
        if n == 0:
            return 0
        if not token_ids:
            return self._store_known(slot, block_hashes, medium)
        emap = slot.maps[medium]
        if parent is None:
            pkey, ptail = self._root(lora), b""
        else:
            e = emap.get(parent)
            if e is None:
                e = slot.maps[1 - medium].get(parent)
            if e is None:
                self.counters["orphaned"] += n
                return ORPHAN
            pkey, ptail = (e, b"") if isinstance(e, int) else (e[0], e[1])
        ntok = len(token_ids)
        if ntok == n * block_size:
            eb = block_size
        elif n == 1 or ntok % n == 0:
            eb = ntok // n
        else:
            self.counters["malformed"] += 1
            return MALFORMED
        data = pack_tokens(token_ids)
        if not ptail and eb == self.block_size:
            new = self._store_aligned(slot, medium, block_hashes, pkey, data)
        else:
            new = self._store_general(slot, medium, block_hashes, pkey, ptail, data, eb)
        cap = self._caps.get(endpoint, self.capacity)
        if len(emap) > cap:
            self.trim(slot, medium, cap)
        order = slot.orders[medium]
        if len(order) > 2 * len(emap) + 64:
            slot.orders[medium] = deque(emap)
        return new

    def _store_aligned(self, slot: Slot, medium: int, hashes: Sequence[int], prev: int, data: bytes) -> int:
        emap = slot.maps[medium]
        order = slot.orders[medium]
        bit = slot.bits[medium]
        m = self.holders.map
        get = m.get
        h = _h
        step = self.block_size * TOKEN_BYTES
        spec = self.holders.spec.get(slot.endpoint)
        new = 0
        pos = 0
        for eh in hashes:
            prev = h(prev.to_bytes(8, "little") + data[pos : pos + step])
            pos += step
            if eh in emap:
                dups = slot.dups[medium]
                dups[eh] = dups.get(eh, 0) + 1
                self.counters["duplicates"] += 1
                continue
            emap[eh] = prev
            order.append(eh)
            v = get(prev)
            m[prev] = bit if v is None else v | bit
            new += 1
            if spec and prev in spec:
                self.holders.confirm(slot.endpoint, prev)
        self.counters["stored"] += new
        return new

    def _store_general(
        self, slot: Slot, medium: int, hashes: Sequence[int], pkey: int, tail: bytes, data: bytes, eb: int
    ) -> int:
        emap = slot.maps[medium]
        order = slot.orders[medium]
        bit = slot.bits[medium]
        m = self.holders.map
        spec = self.holders.spec.get(slot.endpoint)
        step = eb * TOKEN_BYTES
        new = 0
        for i, eh in enumerate(hashes):
            keys, pkey, tail = extend_chain(pkey, tail, data[i * step : (i + 1) * step], self.block_size)
            if eh in emap:
                dups = slot.dups[medium]
                dups[eh] = dups.get(eh, 0) + 1
                self.counters["duplicates"] += 1
                continue
            emap[eh] = keys[0] if (len(keys) == 1 and not tail) else (pkey, tail, tuple(keys))
            order.append(eh)
            for k in keys:
                v = m.get(k)
                m[k] = bit if v is None else v | bit
                if spec and k in spec:
                    self.holders.confirm(slot.endpoint, k)
            new += 1
        self.counters["stored"] += new
        return new

    def _store_known(self, slot: Slot, hashes: Sequence[int], medium: int) -> int:
        """BlockStored without tokens (a tier update): copy known blocks' entries to `medium`."""
        emap, other = slot.maps[medium], slot.maps[1 - medium]
        bit = slot.bits[medium]
        m = self.holders.map
        new = 0
        for eh in hashes:
            e = other.get(eh)
            if e is None or eh in emap:
                continue
            emap[eh] = e
            slot.orders[medium].append(eh)
            for k in (e,) if isinstance(e, int) else e[2]:
                m[k] = m.get(k, 0) | bit
            new += 1
        self.counters["stored"] += new
        return new

    def remove(self, endpoint: str, rank: int, block_hashes: Iterable[int], medium: int = GPU) -> int:
        """Apply one BlockRemoved. Returns the engine blocks dropped."""
        slot = self.holders.find(endpoint, rank)
        if slot is None:
            return 0
        emap = slot.maps[medium]
        dups = slot.dups[medium]
        bit = slot.bits[medium]
        removed = 0
        unknown = 0
        for eh in block_hashes:
            if dups and eh in dups:
                c = dups[eh] - 1
                if c:
                    dups[eh] = c
                else:
                    del dups[eh]
                continue
            e = emap.pop(eh, None)
            if e is None:
                unknown += 1
                continue
            unset(self.holders.map, e, bit)
            removed += 1
        self.counters["removed"] += removed
        self.counters["unknown_removals"] += unknown
        return removed

    def trim(self, slot: Slot, medium: int, cap: int) -> None:
        emap = slot.maps[medium]
        order = slot.orders[medium]
        dups = slot.dups[medium]
        bit = slot.bits[medium]
        evicted = 0
        while len(emap) > cap and order:
            eh = order.popleft()
            e = emap.pop(eh, None)
            if e is None:
                continue
            dups.pop(eh, None)
            unset(self.holders.map, e, bit)
            evicted += 1
        self.counters["evicted"] += evicted
