"""What the limiter reports: every stored state (the metrics page, explain) and the budgets' usage (LLMKube's
`status.budgetUtilization`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from epp.ratelimit.admission import BudgetState, LimitState, utilization
from epp.ratelimit.limits import Kind, Limit, Metric
from epp.ratelimit.link import RedisLink
from epp.ratelimit.state import LocalStore


class Report:
    """Reads the limiter's stores (and the link's view of Redis); `registered` is the limits in force, read when
    reporting (the planner keeps it up to date)."""

    __slots__ = ("local", "fallback", "link", "clock", "registered")

    def __init__(self, local: LocalStore, fallback: LocalStore, link: RedisLink | None, clock: Callable[[], float],
                 registered: Callable[[], Mapping[str, Limit]]) -> None:
        self.local = local
        self.fallback = fallback
        self.link = link
        self.clock = clock
        self.registered = registered

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
        if self.link is not None:
            for lim, label, remaining, reset, age in self.link.rows(now):
                add(lim, label, remaining, reset, "redis", age)
        for lim, label, remaining, reset in self.fallback.states(now):
            add(lim, label, remaining, reset, "fallback")
        for lim in self.registered().values():
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
