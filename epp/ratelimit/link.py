"""The limiter's side of Redis: whether to call it, the queue of settle and refund charges, what it last said.

- Health: a call that fails or times out marks Redis down for `retry_interval_s`; until then no request calls it
  (so an outage costs one timeout, not one per request); then a single call tries again (the others keep to the
  policy meanwhile), and an answer marks it up (`on_recover` then runs, and queued charges are sent).
- Queue: settle and refund deltas are summed per (key, slot) and sent in batches of up to 256 ops by one
  background task, so closing a stream never waits for Redis. A batch is sent with an id that the script
  remembers for an hour; a batch without an answer is resent unchanged, first, so it counts exactly once even
  when the lost answer hid a call that ran. At most `max_pending` keys wait; beyond, deltas are lost and counted.
- View: the remaining amount and reset time of every shared key as last answered, for snapshots (bounded, least
  recently answered first out).
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections import OrderedDict, deque
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Protocol

from epp.ratelimit.limits import Algorithm, Limit
from epp.ratelimit.state import INF, Mode, Op, OpResult, StoreUnavailable

if TYPE_CHECKING:
    from epp.ratelimit.redis_store import RedisStore

log = logging.getLogger("epp.ratelimit")

BATCH = 256


class MetricsSink(Protocol):
    """The calls the limiter reports; `epp.ratelimit.metrics.RateLimitMetrics` implements them for real."""

    def decision(self, allowed: bool) -> None: ...
    def rejected(self, limit: Limit) -> None: ...
    def fallback(self, op: str, reason: str, policy: str) -> None: ...
    def redis_up(self, up: bool) -> None: ...
    def redis_duration(self, seconds: float) -> None: ...
    def overflow(self) -> None: ...
    def lost(self, n: int) -> None: ...


class NullRateLimitMetrics:
    """Reports nothing."""

    def decision(self, allowed: bool) -> None: ...
    def rejected(self, limit: Limit) -> None: ...
    def fallback(self, op: str, reason: str, policy: str) -> None: ...
    def redis_up(self, up: bool) -> None: ...
    def redis_duration(self, seconds: float) -> None: ...
    def overflow(self) -> None: ...
    def lost(self, n: int) -> None: ...


class RedisLink:
    def __init__(self, store: RedisStore, *, policy: str, retry_interval_s: float, clock: Callable[[], float],
                 metrics: MetricsSink, max_keys: int, max_pending: int,
                 on_recover: Callable[[], None] = lambda: None) -> None:
        self.store = store
        self.policy = policy
        self.retry_interval_s = retry_interval_s
        self.clock = clock
        self.metrics = metrics
        self.max_keys = max_keys
        self.max_pending = max_pending
        self.on_recover = on_recover
        self.healthy = True
        self._down_until = -INF
        self._view: OrderedDict[str, tuple[Limit, str, float, float, float]] = OrderedDict()
        self._pending: dict[tuple[str, int], Op] = {}
        self._retry: deque[tuple[str, list[Op]]] = deque()
        self._lock = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None
        metrics.redis_up(True)

    # ---- health -----------------------------------------------------------------------------------------------
    def usable(self) -> bool:
        """Whether Redis may be called now (no state change; see `claim`)."""
        return self.clock() >= self._down_until

    def claim(self) -> bool:
        """`usable()`, and when Redis is down, let only this caller try it: the others keep to the policy for
        another retry interval unless this call answers (half-open: one probe per interval, not a stampede)."""
        now = self.clock()
        if now < self._down_until:
            return False
        if not self.healthy:
            self._down_until = now + self.retry_interval_s
        return True

    def failed(self, exc: StoreUnavailable, op: str) -> None:
        self._down_until = self.clock() + self.retry_interval_s
        self.metrics.fallback(op, exc.reason, self.policy)
        if self.healthy:
            self.healthy = False
            self.metrics.redis_up(False)
            log.warning("rate limits: %s; shared limits use the %r policy, retrying Redis every %g s",
                        exc, self.policy, self.retry_interval_s)

    def answered(self) -> None:
        if self.healthy:
            return
        self.healthy = True
        self._down_until = -INF
        self.metrics.redis_up(True)
        log.warning("rate limits: redis at %s answers again; shared limits are global again", self.store.address)
        self.on_recover()
        self.schedule()

    async def run(self, ops: Sequence[Op], mode: Mode, op: str = "admit") -> tuple[bool, list[OpResult]]:
        """One script call; raises StoreUnavailable after recording the failure."""
        try:
            ok, res = await self.store.run(ops, mode)
        except StoreUnavailable as exc:
            self.failed(exc, op)
            raise
        self.metrics.redis_duration(self.store.last_duration_s)
        self.answered()
        self.remember(ops, res)
        return ok, res

    async def probe(self, timeout_s: float | None = None) -> bool:
        """Ping now (loading the script), even inside the retry interval."""
        self._down_until = -INF
        if await self.store.ping(timeout_s):
            self.answered()
            return True
        self.failed(StoreUnavailable("error", f"redis at {self.store.address} did not answer a ping"), "probe")
        return False

    # ---- the settle / refund queue ----------------------------------------------------------------------------
    def queue(self, op: Op) -> None:
        k = (op.key, op.slot)
        pending = self._pending.get(k)
        if pending is not None:
            pending.charge += op.charge
        elif len(self._pending) >= self.max_pending:
            self.metrics.lost(1)
            return
        else:
            self._pending[k] = op
        self.schedule()

    def schedule(self) -> None:
        if self._task is not None and not self._task.done():
            return
        if not (self._pending or self._retry) or not self.usable():
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # no loop (synchronous use): `flush()` sends them later
        self._task = loop.create_task(self._flush())

    async def _flush(self) -> None:
        async with self._lock:
            while (self._retry or self._pending) and self.claim():
                if not self._retry:
                    keys = list(self._pending)[:BATCH]
                    self._retry.append((uuid.uuid4().hex, [self._pending.pop(k) for k in keys]))
                batch_id, batch = self._retry[0]
                try:
                    _, res = await self.store.run(batch, Mode.CHARGE, batch_id=batch_id)
                except StoreUnavailable as exc:
                    self.failed(exc, "settle")
                    return
                self._retry.popleft()
                self.answered()
                self.remember(batch, res)

    async def flush(self) -> None:
        task = self._task
        if task is not None and not task.done():
            await task
        await self._flush()

    @property
    def pending(self) -> int:
        return len(self._pending) + sum(len(b) for _, b in self._retry)

    # ---- what Redis said ------------------------------------------------------------------------------------
    def remember(self, ops: Sequence[Op], results: Sequence[OpResult]) -> None:
        now = self.clock()
        view = self._view
        for op, res in zip(ops, results, strict=True):
            view[op.key] = (op.limit, op.label, res.remaining, res.reset_after, now)
            view.move_to_end(op.key)
        while len(view) > self.max_keys:
            view.popitem(last=False)

    def rows(self, now: float) -> Iterator[tuple[Limit, str, float, float, float]]:
        """(limit, scope label, remaining, reset_after, age) per key; buckets extrapolated (they keep refilling)."""
        for lim, label, remaining, reset, ts in list(self._view.values()):
            age = max(0.0, now - ts)
            if lim.algorithm is Algorithm.TOKEN_BUCKET:
                remaining = min(lim.amount, remaining + age * lim.rate)
                reset = max(0.0, reset - age)
            yield lim, label, remaining, reset, age

    async def refresh(self) -> None:
        if not self._view or not self.claim():
            return
        items = list(self._view.items())
        for i in range(0, len(items), BATCH):
            ops = [Op(key, lim, 0.0, 0.0, -1, label) for key, (lim, label, *_rest) in items[i:i + BATCH]]
            try:
                await self.run(ops, Mode.PEEK, "refresh")
            except StoreUnavailable:
                return

    async def close(self) -> None:
        try:
            if self.usable():
                await self.flush()
        finally:
            await self.store.close()
