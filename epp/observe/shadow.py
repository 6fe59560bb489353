"""Shadow profiles (`--shadow-config FILE`): another scheduling config decides the same requests, off the reply
path, and nothing acts on its picks.

For a committed request the live scheduler picked (not a route's own P/D scheduler, not a provider), the shadow
runs after the reply is sent (two turns of the loop later: the transport's flush goes first): its own scheduler
(a separate instance: nothing it does reaches the live one) decides over the same candidates, with the in-flight
load as the live decision saw it (this request's own load taken off its pick). Its pick is compared with the live one; nothing acts on it. (Not
`dry_run=True`: that keeps a scheduler's random source for its next real decision by copying it, about 25 µs a
request, and the shadow's next decision is never real.)

Learning (`--shadow-learn`, default true). Scorers that learn from past requests (the approximate prefix index,
the estimated-latency scorer's backlog, durations and calibration) would stay empty in a scheduler that only ever
dry-runs. So the shadow scheduler learns what really happened: its `pre_request` and `response_complete` hooks
run with the live pick (never its own), on its own plugin instances. It is built without the shell's shared
services, so it writes nothing the live scheduler reads; a shadow config's precise prefix producer therefore keeps
its own index (Pointsman's picks, no engine KV events). Under sampling (below) it learns only from the requests it
sampled.

Budget: a token bucket of `--shadow-rate` decisions per second and at most `--shadow-max-cpu` of each second of
loop time spent in shadow runs (their decisions and, with learning, their `response_complete`); at most
MAX_PENDING runs wait for the loop. Past any of them a request is not shadowed (counted by reason): under load the
shadow samples instead of falling behind.

Report (`ShadowReport`, reset when the shadow config reloads), on /metrics (pointsman_shadow_*), the dashboard and
`report()`: how often the shadow agrees; for disagreements, the latency the shadow predicted for its own pick
against the latency the live pick realised (decision start to the stream's end), with the shadow's prediction for
the live pick beside it (the model's own error); per endpoint, the live and shadow picks (where traffic would
move), and the moves between pairs of endpoints. Predictions come from an estimated-latency scorer: the shadow
config's where it estimated that endpoint, else the live config's.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from epp.observe.settings import ShadowSettings
from epp.observe.shadow_report import ShadowReport
from scheduling.api import InflightLoad, SchedulingContext, SchedulingResult
from scheduling.types import Endpoint, SchedulingError

if TYPE_CHECKING:
    from epp.api.dashboard import DecisionRecorder
    from epp.request import RequestExchange, Usage
    from scheduling.api import Scheduler

log = logging.getLogger("epp.shadow")

MAX_PENDING = 256  # shadow runs waiting for the loop


class Budget:
    """A token bucket of `rate` runs per second (burst: one second's worth) and at most `max_cpu` seconds of runs
    per second of wall time."""

    __slots__ = ("rate", "max_cpu", "tokens", "last", "window", "spent")

    def __init__(self, rate: float, max_cpu: float, now: float) -> None:
        self.rate, self.max_cpu = rate, max_cpu
        self.tokens, self.last = max(1.0, rate), now
        self.window, self.spent = now, 0.0

    def take(self, now: float) -> str:
        """"" when a run may go, else why not ("cpu" or "rate")."""
        if now - self.window >= 1.0:
            self.window, self.spent = now, 0.0
        elif self.spent >= self.max_cpu:
            return "cpu"
        tokens = min(max(1.0, self.rate), self.tokens + (now - self.last) * self.rate)
        self.last = now
        if tokens < 1.0:
            self.tokens = tokens
            return "rate"
        self.tokens = tokens - 1.0
        return ""

    def charge(self, seconds: float) -> None:
        self.spent += seconds


def _predictors(scheduler: object) -> list[Any]:
    from scheduling.plugins.scorers.estimated_latency import EstimatedLatencyScorer

    plugins = getattr(scheduler, "plugins", None)
    return [p for p in plugins() if isinstance(p, EstimatedLatencyScorer)] if callable(plugins) else []


def predict(predictors: list[Any], ctx: SchedulingContext, result: SchedulingResult, key: str) -> float | None:
    for p in predictors:
        got = p.predicted(ctx, result.state, key)
        if got is not None:
            return float(got)
    return None


class Shadow:
    """The shadow runner: a request observer (epp/request/observe.py); `scheduler` is swapped on reload."""

    def __init__(self, settings: ShadowSettings, clock: Callable[[], float] = time.monotonic) -> None:
        self.settings = settings
        self.clock = clock
        self.scheduler: Scheduler | None = None
        self.predictors: list[Any] = []
        self.report = ShadowReport()
        self.budget = Budget(settings.rate, settings.max_cpu, clock())
        self.pending = 0
        self.recorder: DecisionRecorder | None = None  # receipts: each shadowed record notes the shadow's pick
        self._loop: asyncio.AbstractEventLoop | None = None
        self._live: tuple[object, list[Any]] | None = None

    def apply(self, scheduler: Scheduler, source: str = "") -> None:
        """A new shadow config: a fresh report."""
        self.scheduler = scheduler
        self.predictors = _predictors(scheduler)
        self.report = ShadowReport(source)

    def live_predictors(self, scheduler: object) -> list[Any]:
        """The live config's estimated-latency scorers (kept per scheduler: a reload makes a new one)."""
        cached = self._live
        if cached is None or cached[0] is not scheduler:
            cached = self._live = (scheduler, _predictors(scheduler))
        return cached[1]

    # ---- observer ------------------------------------------------------------------------------------------
    def decided(self, ex: RequestExchange) -> ShadowRun | None:
        sched, result = self.scheduler, ex.result
        if sched is None or result is None:
            return None
        report = self.report
        if ex.scheduler is not ex.d.scheduler:  # a route's own (P/D) scheduler decided: not comparable
            report.skip("route")
            return None
        if self.pending >= MAX_PENDING:
            report.skip("backlog")
            return None
        why = self.budget.take(self.clock())
        if why:
            report.skip(why)
            return None
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
        run = ShadowRun(self, sched, report, ex)
        self.pending += 1
        # Two turns of the loop: the replies this decision is building are sent with a flush the transport
        # schedules after this call (epp/h2grpc/outbound.py), and the shadow runs after it, off the reply's path.
        loop.call_soon(loop.call_soon, run.execute)
        return run

    def rejected(self, ex: RequestExchange, code: str) -> None:
        pass


class ShadowRun:
    """One shadowed request: the deferred shadow decision, then (as the request's follow) its realised latency."""

    __slots__ = ("shadow", "scheduler", "report", "ex", "sctx", "result", "live", "pick", "predicted_shadow",
                 "predicted_live", "ended", "executed")

    def __init__(self, shadow: Shadow, scheduler: Scheduler, report: ShadowReport, ex: RequestExchange) -> None:
        self.shadow, self.scheduler, self.report, self.ex = shadow, scheduler, report, ex
        self.sctx: SchedulingContext | None = None
        self.result: SchedulingResult | None = None
        self.live = ex.result.primary.key if ex.result is not None else ""
        self.pick = ""
        self.predicted_shadow: float | None = None
        self.predicted_live: float | None = None
        self.ended = -1.0  # the stream's end (director clock), once seen
        self.executed = False

    def execute(self) -> None:
        shadow = self.shadow
        shadow.pending -= 1
        self.executed = True
        t0 = time.perf_counter()
        try:
            self._decide()
        except Exception:  # the shadow never takes a request down
            log.exception("a shadow decision failed")
        spent = time.perf_counter() - t0
        shadow.budget.charge(spent)
        self.report.cpu_seconds += spent
        if self.ended >= 0:  # the stream ended before the shadow ran
            self._ended()

    def _decide(self) -> None:
        ex, report = self.ex, self.report
        ctx, live = ex.ctx, ex.result
        if ctx is None or live is None:
            return
        req = ctx.request
        inflight: Mapping[str, InflightLoad] = ctx.inflight
        own = inflight.get(self.live)
        if own is not None and self.ended < 0:  # the live view counts this request on its pick already
            inflight = dict(inflight)
            inflight[self.live] = InflightLoad(max(0, own.requests - 1), max(0, own.tokens - req.estimated_tokens))
        sctx = SchedulingContext(req, ctx.candidates, inflight, ctx.now)
        try:
            # Not a dry run: that would copy the shadow's random source for every request (about 25 µs) to keep
            # it for "the next real decision", and the shadow makes none. Its source is its own: the live
            # scheduler's state is not touched either way.
            result = self.scheduler.schedule(sctx)
        except SchedulingError as err:
            report.errors[err.code.value] = report.errors.get(err.code.value, 0) + 1
            return
        if not result.targets:
            report.errors["NoEndpoint"] = report.errors.get("NoEndpoint", 0) + 1
            return
        self.sctx, self.result = sctx, result
        self.pick = pick = result.primary.key
        report.decided(self.live, pick)
        rec = self._record()
        if rec is not None:
            rec.shadow = pick
        if pick != self.live:  # the shadow's model first; the live config's where the shadow's has no estimate
            ours, theirs = self.shadow.predictors, self.shadow.live_predictors(ex.scheduler)
            self.predicted_shadow = predict(ours, sctx, result, pick) or predict(theirs, ctx, live, pick)
            self.predicted_live = predict(ours, sctx, result, self.live) or predict(theirs, ctx, live, self.live)
        if self.shadow.settings.learn:  # learn what really happened: the live pick
            try:
                self.scheduler.pre_request(sctx, _as_live(result, live.targets, live.prefill))
            except Exception:
                log.exception("the shadow's pre_request hook failed")

    def _record(self) -> Any:
        recorder = self.shadow.recorder
        if recorder is None or not recorder.ring:
            return None
        last = recorder.ring[-1]
        if last.receipt == self.ex.decision:
            return last
        return recorder.find(self.ex.decision, self.shadow.clock())

    # ---- the follow --------------------------------------------------------------------------------------
    def response_headers(self, ex: RequestExchange, status: int, served: str | None) -> None:
        pass

    def response_chunk(self, ex: RequestExchange, size: int, end_of_stream: bool) -> None:
        pass

    def closed(self, ex: RequestExchange, usage: Usage | None) -> None:
        self.ended = ex.d.clock()
        if self.executed:
            self._ended()

    def _ended(self) -> None:
        if self.result is None or self.sctx is None:
            return
        seconds = self.ended - self.ex.started
        report = self.report
        report.ended += 1
        report.realised_all += seconds
        if self.pick != self.live and self.predicted_shadow is not None:
            report.timed += 1
            report.predicted_shadow += self.predicted_shadow
            report.realised_live += seconds
            if self.predicted_live is not None:
                report.timed_live += 1
                report.predicted_live += self.predicted_live
        if self.shadow.settings.learn:
            self.sctx.now = self.ended
            t0 = time.perf_counter()
            try:
                live = self.ex.result
                self.scheduler.response_complete(self.sctx, _as_live(self.result, live.targets if live else [],
                                                                     live.prefill if live else None))
            except Exception:
                log.exception("the shadow's response_complete hook failed")
            spent = time.perf_counter() - t0  # learning is shadow work too: it counts against the budget
            self.shadow.budget.charge(spent)
            report.cpu_seconds += spent


def _as_live(result: SchedulingResult, targets: list[Endpoint], prefill: Endpoint | None) -> SchedulingResult:
    """The shadow's own run (its per-request plugin state) with what really happened: the live pick."""
    return SchedulingResult(targets=targets, profile=result.profile, profile_results=result.profile_results,
                            prefill=prefill, decision=result.decision, state=result.state)
