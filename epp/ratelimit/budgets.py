"""LLMKube's budgets (`ModelRouter.spec.policy.budgets`) as an admission gate on the rate-limit machinery.

Each budget is one or two rolling-window limits (epp/ratelimit/limits.py `Limit.rolling`) named
`<namespace>/<router>/<budget>`: `maxTokens` counts total tokens (prompt + completion), `maxUSD` the cost priced by
the serving backend's `costPerMillionTokens` (a backend without a price costs nothing, as in LLMKube); both over
`windowSeconds`. Which requests a budget counts:
- scope `router`: every request the ModelRouter routes;
- scope `rule`: the requests that rule (`ruleName`) routes;
- scope `team`: per value of the team header (`headerKey`, x-llmkube-team by default): each team has its own
  budget; requests without the header share one budget of their own, so leaving the header out does not escape
  the cap. A team value is hashed for keys and never becomes a metric label.
All budgets that apply are checked, all or nothing (LLMKube enforces every matching budget). Over budget: a 429
`inference error: ResourceExhausted - budget "<name>" exhausted: ... used in the last <window> s; retry after
<n> s`, with `retry-after` and `x-ratelimit-*`. Budgets are shared by every replica through Redis when one is
configured (`--redis-url`); without it each replica enforces them alone. Admission charges the prompt tokens and
the declared output bound (`max_tokens`, or `--ratelimit-default-output-tokens`); the response's usage replaces
the estimate when the response phases carry it (docs/rate-limits.md).

Utilization: `pointsman_budget_utilization{budget}` (RateLimitMetrics), `Limiter.budgets()` (LLMKube's
`status.budgetUtilization`: tokensUsed, usdUsed, utilization) and the dashboard's config view.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
from collections.abc import Awaitable, Iterable, Mapping, Sequence
from typing import Any, Protocol

from epp.ratelimit.gate import AdmissionContext, Answer, RateLimitGate
from epp.ratelimit.limiter import Limiter
from epp.ratelimit.limits import Kind, Limit, Metric
from epp.ratelimit.planning import Applied

log = logging.getLogger(__name__)


class BudgetSpec(Protocol):
    """One budget as the gate reads it (epp.routing.dialects.llmkube.model.Budget)."""

    @property
    def name(self) -> str: ...
    @property
    def scope(self) -> str: ...  # router | rule | team
    @property
    def window_s(self) -> int: ...
    @property
    def max_tokens(self) -> int | None: ...
    @property
    def max_usd(self) -> float | None: ...
    @property
    def rule(self) -> str | None: ...
    @property
    def header(self) -> str: ...


class RouterBudgets(Protocol):
    """A router and its budgets (LLMKube's ModelRouterSpec); its budgets are hashable, as a cache key."""

    @property
    def key(self) -> str: ...
    @property
    def budgets(self) -> Sequence[BudgetSpec]: ...


def budget_limits(router_key: str, budget: BudgetSpec) -> list[Limit]:
    """The limits of one budget (epp.routing.dialects.llmkube.model.Budget)."""
    name = f"{router_key}/{budget.name}"
    out = []
    if budget.max_tokens is not None:
        out.append(Limit.rolling(name, Metric.TOTAL_TOKENS, budget.max_tokens, budget.window_s, shared=True))
    if budget.max_usd is not None:
        out.append(Limit.rolling(name, Metric.USD, budget.max_usd, budget.window_s, shared=True))
    return out


class BudgetGate:
    """The admitter for budgets (epp/request/admit.py), on the rate-limit gate's limiter."""

    name = "budgets"

    def __init__(self, rate: RateLimitGate) -> None:
        self.rate = rate
        self._limits: dict[tuple[str, Sequence[BudgetSpec]], list[tuple[BudgetSpec, list[Limit]]]] = {}

    @property
    def limiter(self) -> Limiter:
        return self.rate.limiter

    def limits_of(self, spec: RouterBudgets) -> list[tuple[BudgetSpec, list[Limit]]]:
        key = (spec.key, spec.budgets)
        got = self._limits.get(key)
        if got is None:
            if len(self._limits) > 1000:
                self._limits.clear()
            got = self._limits[key] = [(b, budget_limits(spec.key, b)) for b in spec.budgets]
        return got

    def sync(self, routers: Iterable[RouterBudgets]) -> None:
        """Name the budgets in force (the metrics page shows them before any traffic); others are forgotten."""
        budgets = [lim for spec in routers for _, lims in self.limits_of(spec) for lim in lims]
        others = [lim for lim in self.limiter.limits if lim.kind is not Kind.BUDGET]
        self.limiter.configure([*others, *budgets])

    def applied(self, ctx: AdmissionContext) -> list[Applied]:
        d: Any = getattr(ctx, "route", None)
        spec = getattr(d, "spec", None)
        if spec is None or not getattr(spec, "budgets", ()):
            return []
        rule = d.plan.rule.name
        headers = ctx.request.headers
        out: list[Applied] = []
        for budget, limits in self.limits_of(spec):
            if budget.scope == "rule" and budget.rule != rule:
                continue
            scope = headers.get(budget.header, "") if budget.scope == "team" else ""
            out.extend((lim, scope) for lim in limits)
        return out

    def admit(self, ctx: AdmissionContext, parsed: Mapping[str, object] | None, *, dry_run: bool = False
              ) -> Answer | Awaitable[Answer]:
        applied = self.applied(ctx)
        if not applied:
            return None
        d: Any = ctx.route  # LLMKube's decision (its budgets applied): read by attribute, as applied() does
        price = getattr(d.backend, "price", None)
        adm = self.rate.charge(ctx, ctx.request.estimated_tokens, parsed, extra=applied, price=price,
                               dry_run=dry_run)
        if inspect.isawaitable(adm):
            return self.rate._answer_later(adm)
        return self.rate._answer(adm)

    def describe(self, ctx: AdmissionContext) -> list[dict[str, Any]]:
        """The state of the budgets a request counts against (explain): one row per budget and scope."""
        applied = self.applied(ctx)
        if not applied:
            return []
        from epp.ratelimit.limits import scope_label

        d: Any = ctx.route  # LLMKube's decision (its budgets applied)
        team = {f"{d.spec.key}/{b.name}" for b in d.spec.budgets if b.scope == "team"}
        wanted = {(lim.name, scope_label(scope)): scope for lim, scope in applied}
        rows = {(b.name, b.scope): b for b in self.limiter.budgets()}
        out = []
        for (name, label), scope in wanted.items():
            lims = [lim for lim, s in applied if lim.name == name and s == scope]
            row = rows.get((name, label))
            out.append({
                "name": name, "scope": label or ("(no team)" if name in team else ""), "window_s": lims[0].period_s,
                "tokens_used": row.tokens_used if row else 0, "usd_used": row.usd_used if row else 0.0,
                "max_tokens": next((lim.amount for lim in lims if lim.metric is Metric.TOTAL_TOKENS), None),
                "max_usd": next((lim.amount for lim in lims if lim.metric is Metric.USD), None),
                "utilization": row.utilization if row else 0.0,
            })
        return out

    def states(self) -> list[dict[str, Any]]:
        """Every budget's usage (the metrics page): LLMKube's status.budgetUtilization, per scope."""
        periods = {lim.name: lim.period_s for lim in self.limiter.limits if lim.kind is Kind.BUDGET}
        out = []
        for b in self.limiter.budgets():
            d = b.to_dict()
            d["window_s"] = periods.get(b.name)
            out.append(d)
        return out

    async def refresh_loop(self, interval_s: float = 2.0) -> None:
        """Re-read shared budget states from Redis, so the metrics page shows every replica's usage."""
        while True:
            with contextlib.suppress(Exception):
                await self.limiter.refresh()
            await asyncio.sleep(interval_s)


def budget_gate_for(admitters: Sequence[object]) -> BudgetGate | None:
    return next((g for g in admitters if isinstance(g, BudgetGate)), None)
