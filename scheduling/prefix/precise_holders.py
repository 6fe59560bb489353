"""The precise index's block → holders table (scheduling.prefix.precise, whose docstring gives the layout): for
every key, the bit set of the slots holding it (three bits per slot: GPU, CPU, speculative); the slots themselves
(one per endpoint and data-parallel rank, numbered densely, numbers reused after an endpoint leaves); and
Pointsman's speculative entries, which set their endpoint's speculative bits until events confirm them or they
lapse. Pure: no I/O, no clock."""

from __future__ import annotations

from collections.abc import Sequence

from scheduling.prefix.precise_layout import CPU, GPU, Slot, Speculative, unset


class Holders:
    def __init__(self, speculative_ttl: float) -> None:
        self.map: dict[int, int] = {}  # key -> bit set over slots
        self.slots: list[Slot | None] = []  # by slot number (None: free)
        self.low = 0  # bit 3s of every allocated slot s
        self._by: dict[tuple[str, int], Slot] = {}
        self._ep: dict[str, list[Slot]] = {}
        self._free: list[int] = []
        self._specs = Speculative(speculative_ttl)
        self.spec = self._specs.entries  # endpoint -> key -> expiry
        self.counters = {"speculative": 0, "confirmed": 0, "lapsed": 0}

    # ---- slots ------------------------------------------------------------------------------------------
    def slot(self, endpoint: str, rank: int) -> Slot:
        """The slot of (endpoint, rank), created on first use."""
        slot = self._by.get((endpoint, rank))
        if slot is not None:
            return slot
        index = self._free.pop() if self._free else len(self.slots)
        slot = Slot(endpoint, rank, index)
        if index == len(self.slots):
            self.slots.append(slot)
        else:
            self.slots[index] = slot
        self._by[(endpoint, rank)] = slot
        self._ep.setdefault(endpoint, []).append(slot)
        self.low |= slot.bits[GPU]
        spec = self.spec.get(endpoint)
        if spec:  # a new rank of an endpoint with speculative entries gets them too
            m = self.map
            for k in spec:
                m[k] = m.get(k, 0) | slot.sbit
        return slot

    def find(self, endpoint: str, rank: int) -> Slot | None:
        """The slot of (endpoint, rank) if it exists."""
        return self._by.get((endpoint, rank))

    def of(self, endpoint: str) -> Sequence[Slot]:
        """The endpoint's slots (one per rank seen)."""
        return self._ep.get(endpoint, ())

    def endpoints(self) -> list[str]:
        return list(self._ep)

    def empty(self, slot: Slot) -> None:
        """Drop everything the slot holds by events."""
        for medium in (GPU, CPU):
            bit = slot.bits[medium]
            for e in slot.maps[medium].values():
                unset(self.map, e, bit)
            slot.maps[medium].clear()
            slot.orders[medium].clear()
            slot.dups[medium].clear()

    def release(self, endpoint: str) -> None:
        """The endpoint left: drop its speculative entries and its slots (their numbers are reused)."""
        self.drop_speculative(endpoint)
        self.spec.pop(endpoint, None)
        for slot in self._ep.pop(endpoint, ()):
            self.empty(slot)
            del self._by[(endpoint, slot.rank)]
            self.slots[slot.index] = None
            self.low &= ~slot.bits[GPU]
            self._free.append(slot.index)

    # ---- speculative entries ----------------------------------------------------------------------------
    def sbits(self, endpoint: str) -> int:
        bits = 0
        for s in self._ep.get(endpoint, ()):
            bits |= s.sbit
        return bits

    def confirm(self, endpoint: str, key: int) -> None:
        """An event stored a key the endpoint held speculatively."""
        self._specs.confirm(self.map, endpoint, key, self.sbits(endpoint))
        self.counters["confirmed"] += 1

    def drop_speculative(self, endpoint: str) -> None:
        if self.spec.get(endpoint):
            self._specs.drop(self.map, endpoint, self.sbits(endpoint))

    def add_speculative(self, endpoint: str, keys: Sequence[int], now: float, ttl: float) -> int:
        """Hold `keys` speculatively on `endpoint` until `now + ttl` (keys it holds by events are skipped)."""
        if endpoint not in self._ep:
            self.slot(endpoint, 0)
        sbits = held = 0
        for s in self._ep[endpoint]:
            sbits |= s.sbit
            held |= s.held
        added = self._specs.add(self.map, endpoint, keys, now, sbits, held, ttl)
        self.counters["speculative"] += added
        return added

    def shorten(self, endpoint: str, keys: Sequence[int], exp: float) -> int:
        return self._specs.shorten(endpoint, keys, exp)

    def expire(self, now: float) -> None:
        self.counters["lapsed"] += self._specs.expire(self.map, now, self.sbits)
