"""Flow control's queues, pure: no asyncio, no clock. One `PoolQueues` per inference pool.

    PoolQueues ── Band (one per priority, strict order: highest first)
                    └─ Flow (one per fairness id with queued requests) ── Items in arrival order (FCFS)

A band picks its next flow by its fairness policy: `round-robin` (flows with queued requests take turns) or
`global-strict` (the band's oldest request, whatever its flow). Any item can leave at any time (dispatched,
expired, cancelled) in O(1) except for the round-robin turn list (O(flows)); counts and bytes are exact at every
step. A flow without queued requests is dropped at once, so memory is bounded by what is queued.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from scheduling.api import GLOBAL_STRICT, FlowControl, PriorityBand


@dataclass(eq=False, slots=True)
class Item:
    """One queued request. `dispatch` routes it (schedules and commits) when its turn comes."""

    seq: int
    pool: str
    fairness_id: str
    priority: int
    size: int
    enqueued: float
    deadline: float  # monotonic seconds; inf without a TTL
    model: str = ""
    target: str = ""
    dispatch: Callable[[], Any] | None = None
    waiter: Any = None  # the controller's future
    queued: bool = True


@dataclass(slots=True)
class Flow:
    fairness_id: str
    items: dict[int, Item] = field(default_factory=dict)  # by seq, in arrival order

    def head(self) -> Item:
        return next(iter(self.items.values()))


class Band:
    def __init__(self, config: PriorityBand) -> None:
        self.config = config
        self.flows: dict[str, Flow] = {}
        self.turns: deque[str] = deque()  # round robin: flows with queued requests, next first
        self.count = 0
        self.bytes = 0

    def add(self, item: Item) -> None:
        flow = self.flows.get(item.fairness_id)
        if flow is None:
            flow = self.flows[item.fairness_id] = Flow(item.fairness_id)
            self.turns.append(item.fairness_id)
        flow.items[item.seq] = item
        self.count += 1
        self.bytes += item.size

    def remove(self, item: Item) -> None:
        flow = self.flows[item.fairness_id]
        del flow.items[item.seq]
        self.count -= 1
        self.bytes -= item.size
        if not flow.items:
            del self.flows[item.fairness_id]
            self.turns.remove(item.fairness_id)

    def next(self) -> Item | None:
        """The item the fairness policy serves next (not removed)."""
        if not self.flows:
            return None
        if self.config.fairness == GLOBAL_STRICT:
            return min((f.head() for f in self.flows.values()), key=lambda it: it.seq)
        return self.flows[self.turns[0]].head()

    def served(self, item: Item) -> None:
        """`item` (from `next`) is leaving: its flow's turn is over."""
        if self.config.fairness != GLOBAL_STRICT and self.turns and self.turns[0] == item.fairness_id:
            self.turns.rotate(-1)
        self.remove(item)


class PoolQueues:
    """Every queued request of one pool, by priority band."""

    def __init__(self, pool: str) -> None:
        self.pool = pool
        self.bands: dict[int, Band] = {}
        self.order: list[int] = []  # priorities with a band, highest first
        self.count = 0
        self.bytes = 0

    def __len__(self) -> int:
        return self.count

    def __iter__(self) -> Iterator[Item]:
        for p in self.order:
            for flow in self.bands[p].flows.values():
                yield from flow.items.values()

    def rejection(self, config: FlowControl, band: PriorityBand, size: int) -> str | None:
        """Why a request of `size` bytes cannot be queued in `band` now, or None if it can."""
        if config.max_requests and self.count + 1 > config.max_requests:
            return f"{self.count} requests queued in the pool, maxRequests {config.max_requests}"
        if config.max_bytes and self.bytes + size > config.max_bytes:
            return f"{self.bytes} bytes queued in the pool, maxBytes {config.max_bytes}"
        cur = self.bands.get(band.priority)
        count, used = (cur.count, cur.bytes) if cur else (0, 0)
        if band.max_requests and count + 1 > band.max_requests:
            return f"{count} requests queued at priority {band.priority}, maxRequests {band.max_requests}"
        if band.max_bytes and used + size > band.max_bytes:
            return f"{used} bytes queued at priority {band.priority}, maxBytes {band.max_bytes}"
        return None

    def add(self, item: Item, band_config: PriorityBand) -> None:
        band = self.bands.get(item.priority)
        if band is None:
            band = self.bands[item.priority] = Band(band_config)
            self.order = sorted(self.bands, reverse=True)
        band.config = band_config  # a reloaded config applies to the band from the next arrival on
        band.add(item)
        self.count += 1
        self.bytes += item.size

    def remove(self, item: Item) -> None:
        """Take out an item that is not being served (expired, cancelled)."""
        band = self.bands[item.priority]
        band.remove(item)
        self._account(item, band)

    def pop(self, allowed: Callable[[int], bool] | None = None) -> Item | None:
        """The next item by strict priority, then the band's fairness policy, then FCFS; removed. With `allowed`,
        the highest band with queued requests must be allowed to dispatch, else nothing is (head-of-line
        blocking: a lower band never goes ahead of a blocked higher one)."""
        for p in self.order:
            band = self.bands[p]
            item = band.next()
            if item is not None:
                if allowed is not None and not allowed(p):
                    return None
                band.served(item)
                self._account(item, band)
                return item
        return None

    def _account(self, item: Item, band: Band) -> None:
        self.count -= 1
        self.bytes -= item.size
        item.queued = False
        if not band.count:
            del self.bands[item.priority]
            self.order = sorted(self.bands, reverse=True)
