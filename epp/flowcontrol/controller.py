"""The flow controller: holds requests while their pool is saturated and dispatches them as capacity frees.

GIE semantics (v1.5 flow control):
- a request's flow is (fairness id, priority): the `x-llm-d-inference-fairness-id` header, else the older
  `x-gateway-inference-fairness-id` (`default-flow` when absent) and its InferenceObjective priority;
- dispatch order: strict priority between bands, the band's fairness policy between flows, FCFS within a flow;
- a request is dispatched while the pool's saturation is below the usage limit of its priority (1.0; with the
  priority-usage-limit-policy lower for sheddable priorities); while the highest queued band may not go, nothing
  is dispatched (head-of-line blocking, so lower priorities never make it worse for higher ones);
- a request that does not fit the queue's limits is refused at once: 429 `ResourceExhausted`; a queued request
  whose TTL runs out: 503 `ServiceUnavailable`; both carry `x-llm-d-request-dropped-reason`;
- a request whose client goes away while queued leaves the queue at once (outcome `EvictedContextCancelled`).
  Refused and evicted requests are reported as request errors by the exchange (epp/request/exchange.py), like
  every request that never reaches an engine.

Pointsman specifics: with nothing queued at its priority or above and the pool below its limit, `admit` returns
None and the request is routed synchronously (no future, no task). A queued request holds no scheduling state: its `dispatch` callback schedules
and commits it, synchronously inside the dispatch cycle, so every dispatch is counted in flight before the next
saturation check. Dispatch cycles run when something may have changed: a request is queued, a request ends
(`kick` from the director), metrics arrive (`kick` from the datastore), and every `tick` (50 ms) while anything is
queued; TTLs are checked on the same cycles and at each deadline.

Each Pointsman replica queues for itself (see docs/flowcontrol.md): fairness and priority hold per replica.
"""

from __future__ import annotations

import asyncio
import heapq
import logging
import math
import time
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Protocol

from epp.flowcontrol.queues import Item, PoolQueues
from epp.protocol import Outcome
from scheduling.api import FlowControl
from scheduling.types import ErrorCode, LLMRequest

log = logging.getLogger(__name__)

# llm-d's current name first, then GIE's (both accepted)
FAIRNESS_HEADERS = ("x-llm-d-inference-fairness-id", "x-gateway-inference-fairness-id")
FAIRNESS_HEADER = FAIRNESS_HEADERS[1]


def fairness_id(headers: Mapping[str, str]) -> str:
    """The request's fairness id: the first of FAIRNESS_HEADERS it carries non-empty, else "" (the default flow)."""
    for name in FAIRNESS_HEADERS:
        value = headers.get(name)
        if value:
            return value
    return ""
DEFAULT_FLOW = "default-flow"
DROPPED_REASON = "x-llm-d-request-dropped-reason"

# GIE's QueueOutcome names, the `outcome` label of the flow-control metrics.
DISPATCHED = "Dispatched"
REJECTED_CAPACITY = "RejectedCapacity"
EVICTED_TTL = "EvictedTTL"
EVICTED_CANCELLED = "EvictedContextCancelled"
EVICTED_OTHER = "EvictedOther"


class FlowMetrics(Protocol):
    """What the controller reports (epp.api.metrics.EppMetrics implements it)."""

    def flow_queue(self, fairness_id: str, priority: int, pool: str, model: str, target: str, count: int,
                   size: int) -> None: ...
    def flow_outcome(self, fairness_id: str, priority: int, outcome: str, pool: str, model: str, target: str,
                     seconds: float) -> None: ...
    def flow_enqueue(self, fairness_id: str, priority: int, outcome: str, seconds: float) -> None: ...
    def flow_saturation(self, pool: str, saturation: float) -> None: ...
    def flow_cycle(self, seconds: float) -> None: ...


class _NoMetrics:
    """Flow control without metrics (tests, and tools that run it alone)."""

    def flow_queue(self, fairness_id: str, priority: int, pool: str, model: str, target: str, count: int,
                   size: int) -> None: ...
    def flow_outcome(self, fairness_id: str, priority: int, outcome: str, pool: str, model: str, target: str,
                     seconds: float) -> None: ...
    def flow_enqueue(self, fairness_id: str, priority: int, outcome: str, seconds: float) -> None: ...
    def flow_saturation(self, pool: str, saturation: float) -> None: ...
    def flow_cycle(self, seconds: float) -> None: ...


def _below(saturation: float, limit: Callable[[int], float]) -> Callable[[int], bool]:
    """May a request of this priority go at this saturation?"""
    return lambda priority: saturation < limit(priority)


def rejection(code: ErrorCode, message: str, reason: str) -> Outcome:
    return Outcome(reject_status=code.http_status, reject_body=f"inference error: {code.value} - {message}",
                   reject_headers=[(DROPPED_REASON, reason)])


def _capacity(why: str) -> Outcome:
    return rejection(ErrorCode.RESOURCE_EXHAUSTED, f"request rejected pre-queue: queue at capacity ({why})",
                     "rejected-saturated")


class FlowController:
    def __init__(
        self,
        config: FlowControl,
        saturation: Callable[[str], float],
        *,
        metrics: FlowMetrics | None = None,
        clock: Callable[[], float] = time.monotonic,
        tick: float = 0.05,
    ) -> None:
        self.config = config
        self.saturation = saturation  # pool name -> the pool's saturation now
        self.metrics: FlowMetrics = metrics or _NoMetrics()
        self.clock = clock
        self.tick = tick
        self.outcomes: Counter[str] = Counter()  # outcome -> requests (exact; what the metrics also count)
        self._pools: dict[str, PoolQueues] = {}
        self._deadlines: list[tuple[float, int, Item]] = []
        self._seq = 0
        self._task: asyncio.Task[None] | None = None
        self._wake: asyncio.Event | None = None
        self._closed = False

    # ---- the director's side -----------------------------------------------------------------------------------
    def admit(
        self, pool: str, fairness_id: str, req: LLMRequest, size: int, dispatch: Callable[[], Outcome]
    ) -> Outcome | asyncio.Future[Outcome] | None:
        """None: route now. An Outcome: refused now (429). A future: queued; it resolves to the dispatched
        request's outcome (or a 503 when its TTL runs out). Cancelling the future takes the request out."""
        t0 = time.perf_counter()
        fid, prio = fairness_id or DEFAULT_FLOW, req.priority
        judged = self._judge(pool, prio, size)
        if judged is None:
            self.outcomes[DISPATCHED] += 1
            self.metrics.flow_outcome(fid, prio, DISPATCHED, pool, req.model, req.target_model, 0.0)
            return None
        full, why = judged
        if full:
            self.outcomes[REJECTED_CAPACITY] += 1
            self.metrics.flow_outcome(fid, prio, REJECTED_CAPACITY, pool, req.model, req.target_model, 0.0)
            self.metrics.flow_enqueue(fid, prio, REJECTED_CAPACITY, time.perf_counter() - t0)
            return _capacity(why)
        pq = self._pools.get(pool)
        if pq is None:
            pq = self._pools[pool] = PoolQueues(pool)
        now = self.clock()
        ttl = self.config.default_ttl_s
        self._seq += 1
        item = Item(self._seq, pool, fid, prio, size, now, now + ttl if ttl > 0 else math.inf,
                    req.model, req.target_model, dispatch)
        waiter: asyncio.Future[Outcome] = asyncio.get_running_loop().create_future()
        item.waiter = waiter
        waiter.add_done_callback(lambda fut: self._settled(item, fut))
        pq.add(item, self.config.band(prio))
        if ttl > 0:
            heapq.heappush(self._deadlines, (item.deadline, item.seq, item))
        self.metrics.flow_queue(fid, prio, pool, item.model, item.target, 1, size)
        self.metrics.flow_enqueue(fid, prio, "Queued", time.perf_counter() - t0)
        self._ensure_running()
        self.kick()
        return waiter

    def preview(self, pool: str, req: LLMRequest, size: int) -> Outcome | str | None:
        """What `admit` would answer now, changing nothing (explain's dry run): None (route now), the refusal
        (the queue is at capacity), or why the request would wait in the queue."""
        why = self._judge(pool, req.priority, size)
        if why is None:
            return None
        return _capacity(why[1]) if why[0] else why[1]

    def _judge(self, pool: str, prio: int, size: int) -> tuple[bool, str] | None:
        """None: a request of this priority and size may go now; else (the queue is at capacity, why not)."""
        if self._closed:
            return None
        cfg = self.config
        pq = self._pools.get(pool)
        # Nothing queued at this priority or above: the request would be next in line, so it may go now.
        if pq is None or not pq.order or prio > pq.order[0]:
            sat = self.saturation(pool)
            limit = cfg.limit(prio)
            if sat < limit:
                return None
            wait = f"pool {pool} is saturated ({sat:.2f}, the limit at priority {prio} is {limit:g})"
        else:
            wait = f"requests are queued at priority {pq.order[0]} in pool {pool}"
        full = (pq or PoolQueues(pool)).rejection(cfg, cfg.band(prio), size)
        return (True, full) if full is not None else (False, wait)

    def kick(self) -> None:
        """Capacity may have freed (a request ended, metrics arrived): run a dispatch cycle soon."""
        if self._wake is not None and self._pools:
            self._wake.set()

    def configure(self, config: FlowControl) -> None:
        """A reloaded config: new limits and TTL apply to new arrivals; queued requests keep their place."""
        self.config = config
        self.kick()

    def queued(self, pool: str | None = None) -> int:
        if pool is not None:
            pq = self._pools.get(pool)
            return pq.count if pq else 0
        return sum(pq.count for pq in self._pools.values())

    async def close(self, release: bool = False) -> None:
        """Stop. Queued requests are dispatched (`release`: flow control was turned off) or refused with 503."""
        self._closed = True
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        now = self.clock()
        for pq in list(self._pools.values()):
            while pq.count:
                item = pq.pop()
                assert item is not None
                if release:
                    self._dispatch(item, now)
                else:
                    self._evict(item, now, EVICTED_OTHER, rejection(
                        ErrorCode.SERVICE_UNAVAILABLE, "request evicted from queue: Pointsman is shutting down",
                        "rejected-shutdown"))
        self._pools.clear()
        self._deadlines.clear()

    # ---- the dispatch loop --------------------------------------------------------------------------------------
    def _ensure_running(self) -> None:
        if self._task is None or self._task.done():
            self._wake = asyncio.Event()
            self._task = asyncio.get_running_loop().create_task(self._run(), name="flow-control")

    async def _run(self) -> None:
        wake = self._wake
        assert wake is not None
        try:
            while self._pools:
                timeout = self.tick
                if self._deadlines:
                    timeout = min(timeout, max(0.0, self._deadlines[0][0] - self.clock()))
                if not wake.is_set():
                    try:
                        await asyncio.wait_for(wake.wait(), timeout)
                    except TimeoutError:
                        pass
                wake.clear()
                self.cycle()
        except Exception:  # the loop must never die with requests queued
            log.exception("flow control dispatch loop failed")
            raise

    def cycle(self) -> int:
        """Expire, then dispatch while each pool has capacity. Returns the requests dispatched."""
        t0 = time.perf_counter()
        now = self.clock()
        self._expire(now)
        limit = self.config.limit
        sent = 0
        for pool, pq in list(self._pools.items()):
            while pq.count:
                sat = self.saturation(pool)
                # Head-of-line blocking: nothing of this pool goes while its highest queued band may not.
                item = pq.pop(_below(sat, limit))
                if item is None:
                    break
                if self._dispatch(item, now):
                    sent += 1
            else:
                sat = self.saturation(pool)
            self.metrics.flow_saturation(pool, sat)
            if not pq.count:
                del self._pools[pool]
        self.metrics.flow_cycle(time.perf_counter() - t0)
        return sent

    def _expire(self, now: float) -> None:
        dl = self._deadlines
        while dl and dl[0][0] <= now:
            _, _, item = heapq.heappop(dl)
            if not item.queued:
                continue
            self._pools[item.pool].remove(item)
            ttl = self.config.default_ttl_s
            self._evict(item, now, EVICTED_TTL, rejection(
                ErrorCode.SERVICE_UNAVAILABLE,
                f"request timed out in queue: request TTL expired after {now - item.enqueued:.2f} s "
                f"(defaultRequestTTL {ttl:g} s)", "rejected-ttl-expired"))

    def _dispatch(self, item: Item, now: float) -> bool:
        waiter = item.waiter
        self.metrics.flow_queue(item.fairness_id, item.priority, item.pool, item.model, item.target, -1, -item.size)
        if waiter is None or waiter.done():  # the client went away; its callback has not run yet
            self._count(item, now, EVICTED_CANCELLED)
            return False
        self._count(item, now, DISPATCHED)
        assert item.dispatch is not None
        try:
            outcome = item.dispatch()
        except Exception as exc:  # never strand a queued request: a bug becomes its 500
            log.exception("dispatching a queued request failed")
            outcome = Outcome(reject_status=500, reject_body=f"inference error: Internal - dispatch failed: {exc}")
        waiter.set_result(outcome)
        return True

    def _evict(self, item: Item, now: float, outcome: str, answer: Outcome) -> None:
        self.metrics.flow_queue(item.fairness_id, item.priority, item.pool, item.model, item.target, -1, -item.size)
        self._count(item, now, outcome)
        if item.waiter is not None and not item.waiter.done():
            item.waiter.set_result(answer)

    def _settled(self, item: Item, waiter: asyncio.Future[Outcome]) -> None:
        """The waiter is done. If it was cancelled (the client went away) while still queued, take it out."""
        if not waiter.cancelled() or not item.queued:
            return
        pq = self._pools.get(item.pool)
        if pq is None:
            return
        pq.remove(item)
        if not pq.count:
            del self._pools[item.pool]
        self.metrics.flow_queue(item.fairness_id, item.priority, item.pool, item.model, item.target, -1, -item.size)
        self._count(item, self.clock(), EVICTED_CANCELLED)

    def _count(self, item: Item, now: float, outcome: str) -> None:
        self.outcomes[outcome] += 1
        self.metrics.flow_outcome(item.fairness_id, item.priority, outcome, item.pool, item.model, item.target,
                                  max(0.0, now - item.enqueued))
