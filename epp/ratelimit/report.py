"""What the limiter reports: every stored state (the metrics page, explain) and the budgets' usage (LLMKube's
`status.budgetUtilization`). Methods of `epp.ratelimit.limiter.Limiter` (bound there)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from epp.ratelimit.admission import BudgetState, LimitState, utilization
from epp.ratelimit.limits import Kind, Limit, Metric

if TYPE_CHECKING:
    from epp.ratelimit.limiter import Limiter


def snapshot(limiter: Limiter) -> list[LimitState]:
    """Every stored state: local limits, shared limits as last answered by Redis, the fallback's; plus one
    zero row for each configured limit without any state."""
    now = limiter.clock()
    rows: list[LimitState] = []
    seen: set[str] = set()

    def add(lim: Limit, label: str, remaining: float, reset: float, source: str, age: float = 0.0) -> None:
        seen.add(lim.id)
        used = lim.amount - remaining
        rows.append(LimitState(lim.name, lim.kind.value, lim.metric.value, lim.algorithm.value, label,
                               lim.shared, lim.amount, lim.period_s, remaining, used,
                               utilization(used, lim.amount), reset, source, age))

    for lim, label, remaining, reset in limiter.local.states(now):
        add(lim, label, remaining, reset, "local")
    if limiter.link is not None:
        for lim, label, remaining, reset, age in limiter.link.rows(now):
            add(lim, label, remaining, reset, "redis", age)
    for lim, label, remaining, reset in limiter.fallback.states(now):
        add(lim, label, remaining, reset, "fallback")
    for lim in limiter._registered.values():
        if lim.id not in seen:
            add(lim, "", lim.amount, 0.0, "local")
    return rows


def budgets(limiter: Limiter) -> list[BudgetState]:
    """Budget usage per (budget, scope), as LLMKube's `status.budgetUtilization` reports it."""
    groups: dict[tuple[str, str], dict[Metric, LimitState]] = {}
    for row in snapshot(limiter):
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
