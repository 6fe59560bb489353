"""The Limiter: admits one request against the limits that apply to it, then settles or refunds its charges.

See the package docstring (`epp.ratelimit`) for the theory of operation. Its collaborators: the `Planner`
(planning.py: the charges of a request, the limits in force), the `Settler` (settling.py: settle and refund), the
`Report` (report.py: state rows and budgets), the stores (state.py) and the link to Redis (link.py); the Limiter
itself runs an admission through them.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING

from epp.ratelimit.admission import (
    ADMITTED,
    Admission,
    BudgetState,
    Charged,
    LimitState,
    RedisDownPolicy,
    Ticket,
)
from epp.ratelimit.headers import LimitStatus
from epp.ratelimit.limits import Limit, Price
from epp.ratelimit.link import MetricsSink, NullRateLimitMetrics, RedisLink
from epp.ratelimit.planning import Applied, Plan, Planner
from epp.ratelimit.report import Report
from epp.ratelimit.settling import Settler
from epp.ratelimit.state import LocalStore, Mode, Op, OpResult, StoreFull, StoreUnavailable

if TYPE_CHECKING:  # redis is imported only when a Redis is configured
    from epp.ratelimit.redis_store import RedisStore

class Limiter:
    """Admission against token rate limits and budgets; one per process.

    - `redis`: where shared limits live (None: shared limits are enforced in the process, at their full amount);
    - `redis_down`: `local` (default) or `fail-open`, with `replicas` the expected replica count that `local`
      divides a shared amount by; `retry_interval_s` between two tries of a Redis that failed;
    - `clock`: monotonic seconds (injected in tests); `max_keys`: states kept per store; `max_pending`: settle
      charges that may wait for Redis; `metrics`: a `RateLimitMetrics` (or anything with its methods).
    """

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
        self.clock = clock
        self.metrics: MetricsSink = metrics if metrics is not None else NullRateLimitMetrics()
        self.local = LocalStore(max_keys=max_keys)
        self.fallback = LocalStore(max_keys=max_keys)  # shared limits while Redis is down (policy LOCAL)
        self.link = None if redis is None else RedisLink(
            redis, policy=self.policy.value, retry_interval_s=retry_interval_s, clock=clock, metrics=self.metrics,
            max_keys=max_keys, max_pending=max_pending, on_recover=self.fallback.clear)
        self.planner = Planner(redis is not None, replicas)
        self.settler = Settler(self.local, self.fallback, self.link, clock, self.metrics)
        self.report = Report(self.local, self.fallback, self.link, clock, lambda: self.planner.registered)

    # ---- configuration --------------------------------------------------------------------------------------
    def configure(self, limits: Iterable[Limit]) -> None:
        """Name the limits in force (for snapshots and gauges; admission takes its limits per request)."""
        self.planner.configure(limits)

    @property
    def limits(self) -> list[Limit]:
        return list(self.planner.registered.values())

    @property
    def needs_response_usage(self) -> bool:
        """True when a configured limit counts output tokens or cost (read from response usage)."""
        return any(lim.metric.counts_output for lim in self.planner.registered.values())

    # ---- admission ------------------------------------------------------------------------------------------
    def admit_nowait(self, applied: Sequence[Applied], input_tokens: object = 0, output_estimate: object = 0,
                     price: Price | None = None, *, dry_run: bool = False) -> Admission | None:
        """`admit` without awaiting, when no Redis call is needed; None when the caller must `await admit(...)`."""
        if not applied:
            return ADMITTED
        plan = self.planner.plan(applied, input_tokens, output_estimate, price)
        if plan.shared and self.link is not None and self.link.usable():
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
        plan = self.planner.plan(applied, input_tokens, output_estimate, price)
        link = self.link
        if not plan.shared or link is None or not link.claim():
            return self._admit_local(plan, dry_run)
        mode = Mode.PEEK if dry_run else Mode.ADMIT
        now = self.clock()
        try:
            ok, results = self.local.run(plan.local, mode, now)
        except StoreFull:
            return self._overflow()
        statuses = [self._status(op, res, "local") for op, res in zip(plan.local, results, strict=True)]
        if not ok:
            return self._refused(statuses, dry_run)
        try:
            gok, gres = await link.run(plan.shared, mode)
        except StoreUnavailable:
            return self._after_redis_failure(plan, results, statuses, dry_run)
        except BaseException:  # cancelled (the stream went away) while waiting: no ticket, so nothing stays charged
            if not dry_run:
                self._undo(self.local, plan.local, results)
            raise
        statuses += [self._status(op, res, "redis") for op, res in zip(plan.shared, gres, strict=True)]
        if not gok:
            if not dry_run:
                self._undo(self.local, plan.local, results)
            return self._refused(statuses, dry_run)
        return self._admitted(plan, statuses, results, gres, "redis", dry_run)

    def _admit_local(self, plan: Plan, dry_run: bool) -> Admission:
        mode = Mode.PEEK if dry_run else Mode.ADMIT
        now = self.clock()
        try:
            ok, results = self.local.run(plan.local, mode, now)
        except StoreFull:
            return self._overflow()
        statuses = [self._status(op, res, "local") for op, res in zip(plan.local, results, strict=True)]
        if not ok:
            return self._refused(statuses, dry_run)
        if plan.shared:
            if not dry_run:
                self.metrics.fallback("admit", "down", self.policy.value)
            return self._after_redis_failure(plan, results, statuses, dry_run)
        return self._admitted(plan, statuses, results, [], "none", dry_run)

    def _after_redis_failure(self, plan: Plan, results: list[OpResult], statuses: list[LimitStatus],
                             dry_run: bool) -> Admission:
        """The shared limits of an admission whose local limits are already charged, Redis being down."""
        if self.policy is RedisDownPolicy.FAIL_OPEN:
            gres = [OpResult(op.limit.amount, 0.0, 0.0) for op in plan.shared]
            statuses += [self._status(op, res, "fail-open") for op, res in zip(plan.shared, gres, strict=True)]
            return self._admitted(plan, statuses, results, gres, "none", dry_run)
        fops = [self.planner.fallback_op(op) for op in plan.shared]
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
            return self._refused(statuses, dry_run)
        plan.shared = fops
        return self._admitted(plan, statuses, results, gres, "fallback", dry_run)

    def _admitted(self, plan: Plan, statuses: list[LimitStatus], lres: list[OpResult],
                  gres: list[OpResult], gstore: str, dry_run: bool) -> Admission:
        if dry_run:
            return Admission(True, statuses)
        entries = [Charged(op, "local", res.slot) for op, res in zip(plan.local, lres, strict=True)]
        entries += [Charged(op, gstore, res.slot) for op, res in zip(plan.shared, gres, strict=True)]
        self.metrics.decision(True)
        ticket = Ticket(entries, plan.input_tokens, plan.output_estimate, plan.price)
        return Admission(True, statuses, ticket)

    def _refused(self, statuses: list[LimitStatus], dry_run: bool) -> Admission:
        if dry_run:
            return Admission(False, statuses)
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

    # ---- settling -------------------------------------------------------------------------------------------
    def settle(self, ticket: Ticket | None, *, input_tokens: object = None, output_tokens: object = None,
               price: Price | None = None) -> None:
        """Replace the admission's estimates with what the response's usage reported, exactly once (None keeps an
        estimate; `price` re-prices USD limits). Shared limits are updated in the background (`flush`), so this
        never waits."""
        if ticket is not None:  # None: nothing was charged (no limit applied)
            self.settler.settle(ticket, input_tokens=input_tokens, output_tokens=output_tokens, price=price)

    def refund(self, ticket: Ticket | None) -> None:
        """Undo an admission whose request never reached an engine (exactly once; settle after it does nothing)."""
        if ticket is not None:
            self.settler.refund(ticket)

    async def flush(self) -> None:
        """Send pending settle/refund charges to Redis now (tests, shutdown)."""
        if self.link is not None:
            await self.link.flush()

    @property
    def pending(self) -> int:
        """Settle/refund charges not yet in Redis."""
        return 0 if self.link is None else self.link.pending

    @property
    def redis_healthy(self) -> bool:
        return self.link is None or self.link.healthy

    async def probe(self, timeout_s: float | None = None) -> bool:
        """Try Redis now (even inside the retry interval), loading the script; True when it answered. Call it at
        start-up (with a longer timeout) so the first requests find a connection and the script ready."""
        return self.link is not None and await self.link.probe(timeout_s)

    # ---- state ----------------------------------------------------------------------------------------------
    async def refresh(self) -> None:
        """Re-read from Redis the shared states this process has seen (for the metrics page)."""
        if self.link is not None:
            await self.link.refresh()

    def snapshot(self) -> list[LimitState]:
        """Every stored state, and a zero row for each configured limit without any (report.py)."""
        return self.report.snapshot()

    def budgets(self) -> list[BudgetState]:
        """Budget usage per (budget, scope), as LLMKube's `status.budgetUtilization` reports it."""
        return self.report.budgets()

    async def close(self) -> None:
        """Flush what is pending (bounded by the Redis timeout) and close the Redis connections."""
        if self.link is not None:
            await self.link.close()
