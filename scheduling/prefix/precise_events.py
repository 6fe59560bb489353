"""Applying the engines' KV events to the precise index (scheduling.prefix.precise, whose docstring gives the
layout): BlockStored (`store`: a block run aligned with the index's block size, the general case of other engine
block sizes or a partial parent tail, and a store without tokens that re-homes known blocks on another medium),
BlockRemoved (`remove`, counting duplicate stores), and the per-medium capacity bound (`trim`: the least recently
stored blocks go first). Functions of `PreciseIndex`, bound as its methods. Pure: no I/O, no clock."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

import xxhash

from scheduling.prefix.precise_layout import GPU, MALFORMED, ORPHAN, Slot, unset
from scheduling.prefix.token_keys import TOKEN_BYTES, extend_chain, pack_tokens

if TYPE_CHECKING:
    from scheduling.prefix.precise import PreciseIndex

_h = xxhash.xxh3_64_intdigest


def store(
    ix: PreciseIndex,
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
    slot = ix._slot(endpoint, rank)
    n = len(block_hashes)
    if n == 0:
        return 0
    if not token_ids:
        return ix._store_known(slot, block_hashes, medium)
    emap = slot.maps[medium]
    if parent is None:
        pkey, ptail = ix._root(lora), b""
    else:
        e = emap.get(parent)
        if e is None:
            e = slot.maps[1 - medium].get(parent)
        if e is None:
            ix.counters["orphaned"] += n
            return ORPHAN
        pkey, ptail = (e, b"") if isinstance(e, int) else (e[0], e[1])
    ntok = len(token_ids)
    if ntok == n * block_size:
        eb = block_size
    elif n == 1 or ntok % n == 0:
        eb = ntok // n
    else:
        ix.counters["malformed"] += 1
        return MALFORMED
    data = pack_tokens(token_ids)
    if not ptail and eb == ix.block_size:
        new = ix._store_aligned(slot, medium, block_hashes, pkey, data)
    else:
        new = ix._store_general(slot, medium, block_hashes, pkey, ptail, data, eb)
    cap = ix._caps.get(endpoint, ix.capacity)
    if len(emap) > cap:
        ix._trim(slot, medium, cap)
    order = slot.orders[medium]
    if len(order) > 2 * len(emap) + 64:
        slot.orders[medium] = deque(emap)
    return new


def store_aligned(ix: PreciseIndex, slot: Slot, medium: int, hashes: Sequence[int], prev: int, data: bytes
                  ) -> int:
    emap = slot.maps[medium]
    order = slot.orders[medium]
    bit = slot.bits[medium]
    m = ix._map
    get = m.get
    h = _h
    step = ix.block_size * TOKEN_BYTES
    spec = ix._spec.get(slot.endpoint)
    new = 0
    pos = 0
    for eh in hashes:
        prev = h(prev.to_bytes(8, "little") + data[pos : pos + step])
        pos += step
        if eh in emap:
            dups = slot.dups[medium]
            dups[eh] = dups.get(eh, 0) + 1
            ix.counters["duplicates"] += 1
            continue
        emap[eh] = prev
        order.append(eh)
        v = get(prev)
        m[prev] = bit if v is None else v | bit
        new += 1
        if spec and prev in spec:
            ix._confirm(slot.endpoint, prev)
    ix.counters["stored"] += new
    return new


def store_general(
    ix: PreciseIndex, slot: Slot, medium: int, hashes: Sequence[int], pkey: int, tail: bytes, data: bytes, eb: int
) -> int:
    emap = slot.maps[medium]
    order = slot.orders[medium]
    bit = slot.bits[medium]
    m = ix._map
    spec = ix._spec.get(slot.endpoint)
    step = eb * TOKEN_BYTES
    new = 0
    for i, eh in enumerate(hashes):
        keys, pkey, tail = extend_chain(pkey, tail, data[i * step : (i + 1) * step], ix.block_size)
        if eh in emap:
            dups = slot.dups[medium]
            dups[eh] = dups.get(eh, 0) + 1
            ix.counters["duplicates"] += 1
            continue
        emap[eh] = keys[0] if (len(keys) == 1 and not tail) else (pkey, tail, tuple(keys))
        order.append(eh)
        for k in keys:
            v = m.get(k)
            m[k] = bit if v is None else v | bit
            if spec and k in spec:
                ix._confirm(slot.endpoint, k)
        new += 1
    ix.counters["stored"] += new
    return new


def store_known(ix: PreciseIndex, slot: Slot, hashes: Sequence[int], medium: int) -> int:
    """BlockStored without tokens (a tier update): copy known blocks' entries to `medium`."""
    emap, other = slot.maps[medium], slot.maps[1 - medium]
    bit = slot.bits[medium]
    m = ix._map
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
    ix.counters["stored"] += new
    return new


def remove(ix: PreciseIndex, endpoint: str, rank: int, block_hashes: Iterable[int], medium: int = GPU) -> int:
    """Apply one BlockRemoved. Returns the engine blocks dropped."""
    slot = ix._by.get((endpoint, rank))
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
        unset(ix._map, e, bit)
        removed += 1
    ix.counters["removed"] += removed
    ix.counters["unknown_removals"] += unknown
    return removed


def trim(ix: PreciseIndex, slot: Slot, medium: int, cap: int) -> None:
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
        unset(ix._map, e, bit)
        evicted += 1
    ix.counters["evicted"] += evicted
