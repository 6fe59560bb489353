"""ModelScheduler: routes each request to the scheduling config bound to its model.

Lookup order: the first binding whose model equals `request.model`, then one equal to
`request.target_model`, then the `default` binding, then the fallback (the EndpointPickerConfig if one was
loaded, else the built-in default). Candidates are narrowed to endpoints serving the model first
(`Endpoint.models` empty means "serves anything").
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from typing import Any

from scheduling.api import SchedulingContext, SchedulingResult, ShellConfig
from scheduling.framework.plugin import Plugin
from scheduling.framework.scheduler import ProfileScheduler
from scheduling.types import Endpoint, ErrorCode, LLMRequest, SchedulingError, serves

_ROUTE = "model_scheduler.route"


class ModelScheduler:
    """Implements the Scheduler protocol over several ProfileSchedulers.

    `decision_counts[(model, decision)]` counts P/D decisions ("decode-only" | "prefill-decode") by the
    request's model, for `disagg_decision_total`.
    """

    def __init__(
        self,
        schedulers: Mapping[str, ProfileScheduler],
        bindings: Sequence[tuple[str, str]],
        fallback: ProfileScheduler,
        *,
        filter_served_models: bool = True,
        shell: ShellConfig | None = None,
    ) -> None:
        self.shell = shell or ShellConfig()  # the EndpointPickerConfig sections the shell applies
        self.schedulers = dict(schedulers)
        self.bindings = list(bindings)
        self.fallback = fallback
        self.filter_served_models = filter_served_models
        self.decision_counts: dict[tuple[str, str], int] = {}
        self._by_model: dict[str, ProfileScheduler] = {}
        default = None
        for model, profile in self.bindings:
            sched = self.schedulers[profile]
            if model == "default":
                default = default or sched
            else:
                self._by_model.setdefault(model, sched)
        self.default = default or fallback
        self._engine_observers: list[Plugin[Any]] | None = None

    def scheduler_for(self, model: str, target_model: str = "") -> ProfileScheduler:
        by = self._by_model
        return by.get(model) or (by.get(target_model) if target_model else None) or self.default

    def producer(self, request: LLMRequest, name: str) -> Plugin[Any] | None:
        """The producer of the data named `name` read by the config deciding for `request`, if any."""
        return self.scheduler_for(request.model, request.target_model).producer(name)

    def reads(self, name: str) -> bool:
        """Whether the config deciding for any model reads the data named `name` (what the shell must prepare for
        a request before it knows which config decides)."""
        return any(s.producer(name) is not None for s in [*self.schedulers.values(), self.fallback])

    def schedule(self, ctx: SchedulingContext, *, dry_run: bool = False) -> SchedulingResult:
        """Decide. Scheduling changes no state (the lifecycle hooks do); with `dry_run` it does not even advance
        the random source: it decides with a copy, so it shows exactly what the next real decision would do."""
        req = ctx.request
        sched = self.scheduler_for(req.model, req.target_model)
        cands = ctx.candidates
        if self.filter_served_models:
            target = req.target_model or req.model
            lora = req.lora_adapter
            if lora is None:
                cands = [e for e in cands if not e.models or target in e.models]
            else:
                cands = [e for e in cands if serves(e, target, lora)]
            if not cands:
                raise SchedulingError(
                    ErrorCode.NOT_FOUND,
                    f"model {target!r} is not served by any endpoint in the pool ({len(ctx.candidates)} endpoints)",
                )
        rng = None
        if dry_run:
            rng = random.Random()
            rng.setstate(sched.rng.getstate())
        result = sched.schedule(ctx, cands, rng=rng)
        result.state[_ROUTE] = sched
        return result

    def _sched(self, ctx: SchedulingContext, result: SchedulingResult) -> ProfileScheduler:
        sched = result.state.get(_ROUTE)
        if sched is None:
            sched = self.scheduler_for(ctx.request.model, ctx.request.target_model)
        return sched

    def pre_request(self, ctx: SchedulingContext, result: SchedulingResult) -> None:
        if result.decision:
            key = (ctx.request.model, result.decision)
            self.decision_counts[key] = self.decision_counts.get(key, 0) + 1
        self._sched(ctx, result).pre_request(ctx, result)

    def response_complete(self, ctx: SchedulingContext, result: SchedulingResult) -> None:
        self._sched(ctx, result).response_complete(ctx, result)

    def engine_metrics(self, endpoints: Sequence[Endpoint], now: float) -> None:
        """A scrape batch arrived: the plugins that learn from the engines' own metrics see it."""
        observers = self._engine_observers
        if observers is None:
            observers = self._engine_observers = [p for p in self.plugins() if p.observes_engines]
        for plugin in observers:
            plugin.engine_metrics(endpoints, now)

    def endpoint_removed(self, key: str) -> None:
        """The endpoint left every pool: every plugin (and producer) drops what it kept for it."""
        for plugin in self.plugins():
            plugin.endpoint_removed(key)

    def tracked_endpoints(self) -> set[str]:
        """Every endpoint key some plugin keeps state for."""
        out: set[str] = set()
        for plugin in self.plugins():
            out.update(plugin.tracked_endpoints())
        return out

    def plugins(self) -> list[Plugin[Any]]:
        seen: dict[int, Plugin[Any]] = {}
        for sched in [*self.schedulers.values(), self.fallback]:
            for p in sched.plugins():
                seen.setdefault(id(p), p)
        return list(seen.values())
