"""Building blocks of the precise prefix index (scheduling.prefix.precise): constants, the per-slot record, the
matching walk over the shared key → slot bit set, and the speculative entries. Pure."""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

GPU, CPU = 0, 1
MEDIA = {"GPU": GPU, "CPU": CPU}
PENDING, LIVE, UNKNOWN = "pending", "live", "unknown"
DEFAULT_CAPACITY = 65_536  # engine blocks per slot and medium
ORPHAN = -1  # store(): the parent block is unknown, the event was dropped
MALFORMED = -2  # store(): token count does not fit the hashes and block size
STATE_RANK = {LIVE: 0, PENDING: 1, UNKNOWN: 2}


@dataclass(frozen=True, slots=True)
class EndpointMatch:
    """One endpoint's match: `blocks` consecutive blocks from the start, by source, and their weighted score."""

    blocks: int
    score: float
    gpu: int
    cpu: int
    speculative: int
    rank: int
    state: str

    @property
    def from_events(self) -> int:
        return self.gpu + self.cpu


# An engine-map entry: the key itself (one engine block is one key block), or (last full key, partial tail as
# packed tokens, own keys).
Entry = int | tuple[int, bytes, tuple[int, ...]]


class Slot:
    __slots__ = ("endpoint", "rank", "index", "state", "maps", "orders", "dups", "bits", "sbit", "held")

    def __init__(self, endpoint: str, rank: int, index: int) -> None:
        self.endpoint = endpoint
        self.rank = rank
        self.index = index
        self.state = PENDING
        self.maps: tuple[dict[int, Entry], dict[int, Entry]] = ({}, {})
        self.orders: list[deque[int]] = [deque(), deque()]
        self.dups: tuple[dict[int, int], dict[int, int]] = ({}, {})
        base = 3 * index
        self.bits = (1 << base, 1 << (base + 1))
        self.sbit = 1 << (base + 2)
        self.held = self.bits[0] | self.bits[1]


def bit_slots(bits: int) -> Iterator[int]:
    while bits:
        low = bits & -bits
        yield (low.bit_length() - 1) // 3
        bits ^= low


def unset(m: dict[int, int], entry: Entry, bit: int) -> None:
    """Clear `bit` on the keys of an engine-map entry (a key, or a tuple whose third item holds the keys)."""
    for k in (entry,) if isinstance(entry, int) else entry[2]:
        v = m.get(k)
        if v is not None and v & bit:
            v ^= bit
            if v:
                m[k] = v
            else:
                del m[k]


def clear_bits(m: dict[int, int], key: int, bits: int) -> None:
    v = m.get(key)
    if v is not None and v & bits:
        v &= ~bits
        if v:
            m[key] = v
        else:
            del m[key]


def walk(m: dict[int, int], low: int, keys: Sequence[int]) -> tuple[dict[int, int], dict[int, list[int]]]:
    """Slot → consecutive blocks matched from the start, and slot → [CPU-only blocks, speculative-only blocks]
    among them. `low` has bit 3s set for every allocated slot s."""
    get = m.get
    alive = low
    ends: dict[int, int] = {}
    extra: dict[int, list[int]] = {}
    n = 0
    for k in keys:
        v = get(k)
        if v is None:
            break
        g = v & low
        if g == v:
            nxt = alive & g
        else:
            nxt = alive & ((g | (v >> 1) | (v >> 2)) & low)
            ng = nxt & ~g
            if ng:
                c = (v >> 1) & ng
                for s in bit_slots(c):
                    extra.setdefault(s, [0, 0])[0] += 1
                for s in bit_slots(ng & ~c):
                    extra.setdefault(s, [0, 0])[1] += 1
        if nxt != alive:
            for s in bit_slots(alive ^ nxt):
                ends[s] = n
            alive = nxt
            if not alive:
                break
        n += 1
    for s in bit_slots(alive):
        ends[s] = n
    return ends, extra


class Speculative:
    """Pointsman's own picks, held per endpoint until an event confirms them or their TTL passes (`ttl` unless a
    call gives its own; expiries are kept in a heap, so different TTLs lapse in order)."""

    def __init__(self, ttl: float) -> None:
        self.ttl = ttl
        self.entries: dict[str, dict[int, float]] = {}
        self._queue: list[tuple[float, int, str, tuple[int, ...]]] = []
        self._seq = 0

    def add(self, m: dict[int, int], endpoint: str, keys: Sequence[int], now: float, sbits: int, held: int,
            ttl: float | None = None) -> int:
        spec = self.entries.setdefault(endpoint, {})
        exp = now + (self.ttl if ttl is None else ttl)
        get = m.get
        added = []
        for k in keys:
            v = get(k)
            if v is not None and v & held:
                continue  # already held by events
            spec[k] = exp
            m[k] = sbits if v is None else v | sbits
            added.append(k)
        if added:
            self._seq += 1
            heapq.heappush(self._queue, (exp, self._seq, endpoint, tuple(added)))
        return len(added)

    def expire(self, m: dict[int, int], now: float, sbits_of: Callable[[str], int]) -> int:
        q = self._queue
        lapsed = 0
        while q and q[0][0] <= now:
            _, _, endpoint, keys = heapq.heappop(q)
            spec = self.entries.get(endpoint)
            if not spec:
                continue
            sbits = sbits_of(endpoint)
            for k in keys:
                e = spec.get(k)
                if e is not None and e <= now:  # not refreshed since
                    del spec[k]
                    clear_bits(m, k, sbits)
                    lapsed += 1
        return lapsed

    def shorten(self, endpoint: str, keys: Sequence[int], exp: float) -> int:
        """Make the endpoint's still-speculative `keys` expire by `exp` at the latest. Returns how many changed."""
        spec = self.entries.get(endpoint)
        if not spec:
            return 0
        changed = []
        for k in keys:
            e = spec.get(k)
            if e is not None and e > exp:
                spec[k] = exp
                changed.append(k)
        if changed:
            self._seq += 1
            heapq.heappush(self._queue, (exp, self._seq, endpoint, tuple(changed)))
        return len(changed)

    def confirm(self, m: dict[int, int], endpoint: str, key: int, sbits: int) -> None:
        del self.entries[endpoint][key]
        clear_bits(m, key, sbits)

    def drop(self, m: dict[int, int], endpoint: str, sbits: int) -> None:
        spec = self.entries.get(endpoint)
        if spec:
            for k in spec:
                clear_bits(m, k, sbits)
            spec.clear()
