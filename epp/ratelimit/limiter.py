"""The Limiter: admits one request against the limits that apply to it, then settles or refunds its charges.

See the package docstring (`epp.ratelimit`) for the theory of operation.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Sequence
from typing import Protocol

from epp.ratelimit.admission import (
    ADMITTED,
    Admission,
    BudgetState,
    Charged,
    LimitState,
    RedisDownPolicy,
    Ticket,
    utilization,
)
from epp.ratelimit.headers import LimitStatus
from epp.ratelimit.limits import Algorithm, Kind, Limit, Metric, Price, scope_key, scope_label, tokens
from epp.ratelimit.redis_store import RedisStore, StoreUnavailable
from epp.ratelimit.state import INF, LocalStore, Mode, Op, OpResult, StoreFull

log = logging.getLogger(__name__)

Applied = tuple[Limit, str]  # a limit and the scope value it applies to ('' when unscoped)
_FLUSH_BATCH = 256


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


def _need(limit: Limit, known: float) -> float:
    """What must remain for a request: its input part and, for limits that count output, room for one more unit
    (not when the input alone fills the whole amount: then an empty limit admits it)."""
    if limit.metric.counts_output and known <= limit.amount:
        return min(known + limit.metric.epsilon, limit.amount)
    return known


class _Plan:
    __slots__ = ("local", "shared", "input_tokens", "output_estimate", "price")

    def __init__(self, input_tokens: int, output_estimate: int, price: Price | None) -> None:
        self.local: list[Op] = []
        self.shared: list[Op] = []
        self.input_tokens = input_tokens
        self.output_estimate = output_estimate
        self.price = price


class Limiter:
    def __init__(
        self,
        *,
        redis: RedisStore | None = None,
        redis_down: RedisDownPolicy | str = RedisDownPolicy.LOCAL,
        replicas: int = 1,
        retry_interval_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
        max_keys: int = 100_000,
        max_pending: int = 10_000,
        metrics: MetricsSink | None = None,
    ) -> None:
        if replicas < 1:
            raise ValueError(f"replicas must be >= 1, got {replicas}")
        self.redis = redis
        self.policy = RedisDownPolicy.parse(redis_down)
        self.replicas = replicas
        self.retry_interval_s = retry_interval_s
        self.clock = clock
        self.metrics: MetricsSink = metrics if metrics is not None else NullRateLimitMetrics()
        self.local = LocalStore(max_keys=max_keys)
        self.fallback = LocalStore(max_keys=max_keys)  # shared limits while Redis is down (policy LOCAL)
        self.max_keys = max_keys
        self.max_pending = max_pending
        self._scaled: dict[tuple[str, float, float], Limit] = {}
        self._registered: dict[str, Limit] = {}
        self._view: OrderedDict[str, tuple[Limit, str, float, float, float]] = OrderedDict()  # Redis answers
        self._pending: dict[tuple[str, int], Op] = {}  # settle / refund deltas waiting for Redis
        self._retry: deque[tuple[str, list[Op]]] = deque()  # a batch sent without an answer, to resend as is
        self._flush_lock = asyncio.Lock()
        self._flush_task: asyncio.Task[None] | None = None
        self._down_until = -INF
        self.redis_healthy = True
        if redis is not None:
            self.metrics.redis_up(True)

    # ---- configuration --------------------------------------------------------------------------------------
    def configure(self, limits: Iterable[Limit]) -> None:
        """Name the limits in force (for snapshots and gauges; admission takes its limits per request)."""
        self._registered = {lim.id: lim for lim in limits}

    @property
    def limits(self) -> list[Limit]:
        return list(self._registered.values())

    @property
    def needs_response_usage(self) -> bool:
        """True when a configured limit counts output tokens or cost (read from response usage)."""
        return any(lim.metric.counts_output for lim in self._registered.values())

    # ---- admission ------------------------------------------------------------------------------------------
    def _plan(self, applied: Sequence[Applied], input_tokens: object, output_estimate: object,
              price: Price | None) -> _Plan:
        plan = _Plan(tokens(input_tokens), tokens(output_estimate), price)
        seen: set[str] = set()
        for limit, scope in applied:
            scope = scope if isinstance(scope, str) else ""
            key = f"{limit.id}|{scope_key(scope)}"
            if key in seen:
                continue
            seen.add(key)
            if limit.id not in self._registered:
                self._registered[limit.id] = limit
            known, later = limit.metric.parts(plan.input_tokens, plan.output_estimate, price)
            op = Op(key, limit, _need(limit, known), known + later, -1, scope_label(scope), known)
            (plan.shared if limit.shared and self.redis is not None else plan.local).append(op)
        return plan

    def admit_nowait(self, applied: Sequence[Applied], input_tokens: object = 0, output_estimate: object = 0,
                     price: Price | None = None, *, dry_run: bool = False) -> Admission | None:
        """`admit` without awaiting, when no Redis call is needed; None when the caller must `await admit(...)`."""
        if not applied:
            return ADMITTED
        plan = self._plan(applied, input_tokens, output_estimate, price)
        if plan.shared and self._redis_usable():
            return None
        return self._admit_local(plan, dry_run)

    async def admit(self, applied: Sequence[Applied], input_tokens: object = 0, output_estimate: object = 0,
                    price: Price | None = None, *, dry_run: bool = False) -> Admission:
        """Admit a request and charge it, all or nothing, against every limit in `applied`.

        Charged at once: the input tokens (and their cost), plus `output_estimate` output tokens for limits that
        count output. A limit that counts output must not be exhausted; the input part must fit. `dry_run`
        checks without charging (explain). Never raises for bad numbers: they count as 0 or are capped.
        """
        if not applied:
            return ADMITTED
        plan = self._plan(applied, input_tokens, output_estimate, price)
        if not plan.shared or not self._redis_usable():
            return self._admit_local(plan, dry_run)
        mode = Mode.PEEK if dry_run else Mode.ADMIT
        now = self.clock()
        try:
            ok, results = self.local.run(plan.local, mode, now)
        except StoreFull:
            return self._overflow()
        statuses = [self._status(op, res, "local") for op, res in zip(plan.local, results, strict=True)]
        if not ok:
            return self._refused(statuses)
        assert self.redis is not None
        try:
            gok, gres = await self.redis.run(plan.shared, mode)
            self.metrics.redis_duration(self.redis.last_duration_s)
            self._redis_ok()
        except StoreUnavailable as exc:
            self._redis_failed(exc, "admit")
            return self._after_redis_failure(plan, results, statuses, dry_run)
        self._remember(plan.shared, gres)
        statuses += [self._status(op, res, "redis") for op, res in zip(plan.shared, gres, strict=True)]
        if not gok:
            if not dry_run:
                self._undo(self.local, plan.local, results)
            return self._refused(statuses)
        return self._admitted(plan, statuses, results, gres, "redis", dry_run)

    def _admit_local(self, plan: _Plan, dry_run: bool) -> Admission:
        mode = Mode.PEEK if dry_run else Mode.ADMIT
        now = self.clock()
        try:
            ok, results = self.local.run(plan.local, mode, now)
        except StoreFull:
            return self._overflow()
        statuses = [self._status(op, res, "local") for op, res in zip(plan.local, results, strict=True)]
        if not ok:
            return self._refused(statuses)
        if plan.shared:
            self.metrics.fallback("admit", "down", self.policy.value)
            return self._after_redis_failure(plan, results, statuses, dry_run)
        return self._admitted(plan, statuses, results, [], "none", dry_run)

    def _after_redis_failure(self, plan: _Plan, results: list[OpResult], statuses: list[LimitStatus],
                             dry_run: bool) -> Admission:
        """The shared limits of an admission whose local limits are already charged, Redis being down."""
        if self.policy is RedisDownPolicy.FAIL_OPEN:
            gres = [OpResult(op.limit.amount, 0.0, 0.0) for op in plan.shared]
            statuses += [self._status(op, res, "fail-open") for op, res in zip(plan.shared, gres, strict=True)]
            return self._admitted(plan, statuses, results, gres, "none", dry_run)
        fops = [self._fallback_op(op) for op in plan.shared]
        try:
            gok, gres = self.fallback.run(fops, Mode.PEEK if dry_run else Mode.ADMIT, self.clock())
        except StoreFull:
            if not dry_run:
                self._undo(self.local, plan.local, results)
            return self._overflow()
        statuses += [self._status(op, res, "fallback") for op, res in zip(fops, gres, strict=True)]
        if not gok:
            if not dry_run:
                self._undo(self.local, plan.local, results)
            return self._refused(statuses)
        plan.shared = fops
        return self._admitted(plan, statuses, results, gres, "fallback", dry_run)

    def _admitted(self, plan: _Plan, statuses: list[LimitStatus], lres: list[OpResult],
                  gres: list[OpResult], gstore: str, dry_run: bool) -> Admission:
        if dry_run:
            return Admission(True, statuses)
        entries = [Charged(op, "local", res.slot) for op, res in zip(plan.local, lres, strict=True)]
        entries += [Charged(op, gstore, res.slot) for op, res in zip(plan.shared, gres, strict=True)]
        self.metrics.decision(True)
        ticket = Ticket(entries, plan.input_tokens, plan.output_estimate, plan.price)
        return Admission(True, statuses, ticket)

    def _refused(self, statuses: list[LimitStatus]) -> Admission:
        self.metrics.decision(False)
        for s in statuses:
            if s.refused:
                self.metrics.rejected(s.limit)
        return Admission(False, statuses)

    def _overflow(self) -> Admission:
        self.metrics.decision(False)
        self.metrics.overflow()
        return Admission(False, overflow=True)

    @staticmethod
    def _status(op: Op, res: OpResult, source: str) -> LimitStatus:
        return LimitStatus(op.limit, op.label, res.remaining, res.reset_after, res.retry_after, op.known, source)

    def _undo(self, store: LocalStore, ops: list[Op], results: list[OpResult]) -> None:
        back = [Op(op.key, op.limit, 0.0, -op.charge, res.slot, op.label)
                for op, res in zip(ops, results, strict=True) if op.charge]
        if back:
            store.run(back, Mode.CHARGE, self.clock())

    def _fallback_op(self, op: Op) -> Op:
        k = (op.limit.id, op.limit.amount, op.limit.period_s)
        lim = self._scaled.get(k)
        if lim is None:
            if len(self._scaled) > 4 * len(self._registered) + 64:
                self._scaled.clear()  # limits were reconfigured many times: forget the old ones
            lim = self._scaled[k] = op.limit.scaled(1.0 / self.replicas)
        return Op(op.key, lim, _need(lim, op.known), op.charge, op.slot, op.label, op.known)

    # ---- settling -------------------------------------------------------------------------------------------
    def settle(self, ticket: Ticket | None, *, input_tokens: object = None, output_tokens: object = None,
               price: Price | None = None) -> None:
        """Replace the admission's estimates with what the response's usage reported, exactly once.

        None keeps the estimate (a response without usage, or lean response phases: the output estimate stays
        charged). `price` re-prices USD limits (the backend that served). Shared limits are updated in the
        background (`flush`), so this never waits.
        """
        if ticket is None or ticket.closed:
            return
        ticket.closed = True
        inp = ticket.input_tokens if input_tokens is None else tokens(input_tokens)
        out = ticket.output_estimate if output_tokens is None else tokens(output_tokens)
        p = price if price is not None else ticket.price
        for e in ticket.entries:
            delta = e.op.limit.metric.amount(inp, out, p) - e.op.charge
            if delta:
                self._apply_delta(e, delta)

    def refund(self, ticket: Ticket | None) -> None:
        """Undo an admission whose request never reached an engine (exactly once; settle after it does nothing)."""
        if ticket is None or ticket.closed:
            return
        ticket.closed = True
        for e in ticket.entries:
            if e.op.charge:
                self._apply_delta(e, -e.op.charge)

    def _apply_delta(self, e: Charged, delta: float) -> None:
        op = Op(e.op.key, e.op.limit, 0.0, delta, e.slot if delta < 0 else -1, e.op.label)
        if e.store == "local" or e.store == "fallback":
            store = self.local if e.store == "local" else self.fallback
            before = store.dropped
            store.run([op], Mode.CHARGE, self.clock())
            if store.dropped > before:
                self.metrics.lost(store.dropped - before)
        elif e.store == "redis":
            k = (op.key, op.slot)
            pending = self._pending.get(k)
            if pending is not None:
                pending.charge += delta
            elif len(self._pending) >= self.max_pending:
                self.metrics.lost(1)
            else:
                self._pending[k] = op
            self._schedule_flush()

    def _schedule_flush(self) -> None:
        if self._flush_task is not None and not self._flush_task.done():
            return
        if not (self._pending or self._retry) or not self._redis_usable():
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        self._flush_task = loop.create_task(self._flush())

    async def _flush(self) -> None:
        """Send pending deltas in batches. A batch that fails is resent, unchanged and with the same id, before
        anything else: Redis applies a batch id once, so a batch that timed out but ran is never counted twice."""
        async with self._flush_lock:
            while self.redis is not None and self._redis_usable() and (self._retry or self._pending):
                if not self._retry:
                    keys = list(self._pending)[:_FLUSH_BATCH]
                    self._retry.append((uuid.uuid4().hex, [self._pending.pop(k) for k in keys]))
                batch_id, batch = self._retry[0]
                try:
                    _, res = await self.redis.run(batch, Mode.CHARGE, batch_id=batch_id)
                except StoreUnavailable as exc:
                    self._redis_failed(exc, "settle")
                    return
                self._retry.popleft()
                self._redis_ok()
                self._remember(batch, res)

    async def flush(self) -> None:
        """Send pending settle/refund charges to Redis now (tests, shutdown)."""
        task = self._flush_task
        if task is not None and not task.done():
            await task
        await self._flush()

    @property
    def pending(self) -> int:
        """Deltas not yet in Redis."""
        return len(self._pending) + sum(len(b) for _, b in self._retry)

    # ---- Redis health ---------------------------------------------------------------------------------------
    def _redis_usable(self) -> bool:
        return self.redis is not None and self.clock() >= self._down_until

    def _redis_failed(self, exc: StoreUnavailable, op: str) -> None:
        self._down_until = self.clock() + self.retry_interval_s
        self.metrics.fallback(op, exc.reason, self.policy.value)
        if self.redis_healthy:
            self.redis_healthy = False
            self.metrics.redis_up(False)
            log.warning("rate limits: %s; shared limits use the %r policy, retrying Redis every %g s",
                        exc, self.policy.value, self.retry_interval_s)

    def _redis_ok(self) -> None:
        if not self.redis_healthy:
            self.redis_healthy = True
            self.metrics.redis_up(True)
            self.fallback.clear()
            log.warning("rate limits: redis at %s answers again; shared limits are global again",
                        self.redis.address if self.redis else "?")
            self._schedule_flush()

    async def probe(self) -> bool:
        """Try Redis now (even inside the retry interval); True when it answered. For health checks and tests."""
        if self.redis is None:
            return False
        self._down_until = -INF
        if await self.redis.ping():
            self._redis_ok()
            return True
        self._redis_failed(StoreUnavailable("error", f"redis at {self.redis.address} did not answer a ping"),
                           "probe")
        return False

    # ---- state ----------------------------------------------------------------------------------------------
    def _remember(self, ops: Sequence[Op], results: Sequence[OpResult]) -> None:
        now = self.clock()
        view = self._view
        for op, res in zip(ops, results, strict=True):
            view[op.key] = (op.limit, op.label, res.remaining, res.reset_after, now)
            view.move_to_end(op.key)
        while len(view) > self.max_keys:
            view.popitem(last=False)

    async def refresh(self) -> None:
        """Re-read from Redis the shared states this process has seen (for the metrics page)."""
        if self.redis is None or not self._view or not self._redis_usable():
            return
        items = list(self._view.items())
        for i in range(0, len(items), _FLUSH_BATCH):
            chunk = items[i:i + _FLUSH_BATCH]
            ops = [Op(key, lim, 0.0, 0.0, -1, label) for key, (lim, label, *_rest) in chunk]
            try:
                _, res = await self.redis.run(ops, Mode.PEEK)
                self._redis_ok()
            except StoreUnavailable as exc:
                self._redis_failed(exc, "refresh")
                return
            self._remember(ops, res)

    def snapshot(self) -> list[LimitState]:
        """Every stored state: local limits, shared limits as last answered by Redis, the fallback's; plus one
        zero row for each configured limit without any state."""
        now = self.clock()
        rows: list[LimitState] = []
        seen: set[str] = set()

        def add(lim: Limit, label: str, remaining: float, reset: float, source: str, age: float = 0.0) -> None:
            seen.add(lim.id)
            used = lim.amount - remaining
            rows.append(LimitState(lim.name, lim.kind.value, lim.metric.value, lim.algorithm.value, label,
                                   lim.shared, lim.amount, lim.period_s, remaining, used,
                                   utilization(used, lim.amount), reset, source, age))

        for lim, label, remaining, reset in self.local.states(now):
            add(lim, label, remaining, reset, "local")
        for lim, label, remaining, reset, ts in list(self._view.values()):
            age = max(0.0, now - ts)
            if lim.algorithm is Algorithm.TOKEN_BUCKET:  # a bucket keeps refilling since Redis answered
                remaining = min(lim.amount, remaining + age * lim.rate)
                reset = max(0.0, reset - age)
            add(lim, label, remaining, reset, "redis", age)
        for lim, label, remaining, reset in self.fallback.states(now):
            add(lim, label, remaining, reset, "fallback")
        for lim in self._registered.values():
            if lim.id not in seen:
                add(lim, "", lim.amount, 0.0, "local")
        return rows

    def budgets(self) -> list[BudgetState]:
        """Budget usage per (budget, scope), as LLMKube's `status.budgetUtilization` reports it."""
        groups: dict[tuple[str, str], dict[Metric, LimitState]] = {}
        for row in self.snapshot():
            if row.kind != Kind.BUDGET.value:
                continue
            groups.setdefault((row.name, row.scope), {})[Metric(row.metric)] = row
        out: list[BudgetState] = []
        for (name, scope), by_metric in sorted(groups.items()):
            tok = by_metric.get(Metric.TOTAL_TOKENS)
            usd = by_metric.get(Metric.USD)
            util = max((r.utilization for r in by_metric.values()), default=0.0)
            out.append(BudgetState(name, scope, int(max(0.0, tok.used)) if tok else 0,
                                   max(0.0, usd.used) if usd else 0.0, tok.amount if tok else None,
                                   usd.amount if usd else None, util))
        return out

    async def close(self) -> None:
        """Flush what is pending (bounded by the Redis timeout) and close the Redis connections."""
        if self.redis is None:
            return
        try:
            await self.flush()
        finally:
            await self.redis.close()
