"""Pointsman's own gRPC API: Explain (a dry-run decision with per-plugin detail) and ListEndpoints.

Explain is a mode of the request's own exchange (epp/request/exchange.py, `dry_run=True`): the same stage table
as a real request (resolve, admit, prepare, queue, schedule, commit), so it answers what the next real request
would get, rate limits, budgets, flow control, SLO shedding and passive-health probes included, with every effect
switched off: nothing is charged, queued, counted in flight, reported to metrics or observers, bound to a session
or taken as a probe, and the scheduler's random source is copied rather than advanced."""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Collection, Sequence
from typing import TYPE_CHECKING, Any

import grpc

from epp.api.pb import pointsman_pb2 as api
from epp.api.pb import pointsman_pb2_grpc
from epp.fleet import Datastore, PassiveHealth
from epp.protocol import Outcome
from epp.request import Director, RequestExchange, ShellContext, why_held
from epp.routing import CREDENTIAL_HEADERS
from scheduling.api import SchedulingResult
from scheduling.latency import decision_slo, predictions
from scheduling.plugins.scorers.agent_session import decision as session_decision
from scheduling.plugins.scorers.agent_session import session_view
from scheduling.prefix.cycle import decision_matches
from scheduling.prefix.precise_data import APPROXIMATE, decision_prefix_hits
from scheduling.types import Endpoint

if TYPE_CHECKING:
    from epp.api.dashboard import DecisionRecorder
    from epp.request import Admitter
    from epp.routing import RouteDecision
    from scheduling.latency import EndpointModel

REDACTED = "<redacted>"


def redacted(headers: list[tuple[str, str]], sensitive: Collection[str]) -> dict[str, str]:
    """Headers as explain shows them: a credential's value never leaves the process."""
    return {k: REDACTED if k in sensitive or k in CREDENTIAL_HEADERS else v for k, v in headers}


def describe_route(route: RouteDecision, info: api.RouteInfo) -> None:
    r = route.route
    info.route, info.rule, info.rule_index = f"{r.kind} {r.key}", route.rule.name, route.rule.index
    for t in route.rule.targets:
        info.split.add(target=t.backend, kind=t.kind, weight=t.weight, chosen=t is route.target)
    info.target, info.kind = route.target.backend, route.target.kind
    info.pool = route.pool_name or ""
    info.provider_cluster = route.provider.cluster if route.provider is not None else ""
    info.engine_model = route.engine_model or ""
    plan = getattr(route, "plan", None)
    if plan is not None:  # an LLMKube ModelRouter decision
        describe_model_router(route, info)
    rl = r.rate_limit
    if rl is not None:
        info.rate_limit = (f"input {rl.input_tokens_per_unit or '-'}/{rl.unit}, "
                           f"output {rl.output_tokens_per_unit or '-'}/{rl.unit}, "
                           f"{'global (redis)' if rl.redis_address else 'local'}")


def describe_model_router(route: Any, info: api.RouteInfo) -> None:
    plan = route.plan
    info.strategy = plan.strategy
    info.backend = f"{plan.backend.name} ({plan.backend.tier})"
    info.fallbacks.extend(f"{b.name} ({b.tier})" for b in plan.fallbacks)
    info.mirrors.extend(f"{name} {key}" for name, key in route.mirror_endpoints)
    info.classification = ", ".join(sorted(route.classifications))
    if route.timeout_s is not None:
        info.timeout = f"{route.timeout_s:g}s"
    info.notes.extend(plan.notes)
    for t in info.split:
        t.chosen = t.target == route.target.backend
    if plan.rule.synthetic:
        del info.split[:]
        info.split.add(target=route.target.backend, kind=route.target.kind, weight=1, chosen=True)


def describe_budgets(admitters: Sequence[Admitter], ctx: ShellContext, info: api.RouteInfo) -> None:
    for gate in admitters:
        describe = getattr(gate, "describe", None)
        if describe is None:
            continue
        for row in describe(ctx):
            info.budgets.add(name=row["name"], scope=row["scope"], window_seconds=row["window_s"],
                             tokens_used=int(row["tokens_used"]), usd_used=row["usd_used"],
                             max_tokens=row["max_tokens"] or 0.0, max_usd=row["max_usd"] or 0.0,
                             utilization=row["utilization"])


def describe_prefix(state: dict[Any, Any], candidates: Sequence[Endpoint], out: api.ExplainResponse) -> None:
    """Per candidate, the prefix it holds and where that came from: the engines' KV events (GPU, CPU, Pointsman's
    speculative picks) or the approximate index, as the decision's prefix-aware plugins saw it."""
    hits = decision_prefix_hits(state)
    if hits is not None:
        for e in candidates:
            h = hits.get(e.key)
            if h is not None:
                out.prefix.add(endpoint=e.key, source=h.source, blocks=h.blocks, total_blocks=h.total,
                               block_tokens=h.block_tokens, gpu_blocks=h.gpu, cpu_blocks=h.cpu,
                               speculative_blocks=h.speculative, index_state=h.state or "", weighted=h.weighted)
        return
    approx = decision_matches(state)
    if approx is not None:
        matches, total = approx
        for e in candidates:
            m = matches.get(e.key, 0)
            out.prefix.add(endpoint=e.key, source=APPROXIMATE, blocks=m, total_blocks=total, weighted=float(m))


def describe_session(result: SchedulingResult, now: float, out: api.ExplainResponse) -> None:
    """The request's agent session: its turn, where its context is, and whether the pick stays there."""
    v = session_view(result.state)
    if v is None:
        return
    info = out.session
    info.id, info.source, info.turn, info.parallel = v.ref.label, v.ref.source, v.turn, v.parallel
    info.bound = v.bound or ""
    info.decision = session_decision(v, result)
    info.expected_gap_seconds = -1.0 if v.expected_gap is None else v.expected_gap
    info.warm_seconds = max(0.0, v.warm_until - now) if v.warm_until is not None else 0.0


def latency_model(director: Director) -> Any:
    """The current config's estimated-latency scorer (anything with `endpoint_model`), if it has one."""
    plugins = getattr(director.scheduler, "plugins", None)
    if plugins is None:
        return None
    return next((p for p in plugins() if callable(getattr(p, "endpoint_model", None))), None)


def fill_model(out: api.EndpointModel, key: str, m: EndpointModel) -> None:
    """An EndpointModel message from the scorer's view (scheduling.latency's EndpointModel)."""
    t = m.trust

    def opt(v: float | None) -> float:
        return -1.0 if v is None else v

    out.endpoint, out.timings = key, m.timings
    out.overhead_seconds, out.prefill_seconds_per_token = m.overhead_s, m.prefill_per_token_s
    out.inter_token_seconds, out.backlog_weight, out.calibration = m.inter_token_s, m.backlog_weight, m.calibration
    out.fitted_age_seconds = opt(m.fitted_age_s)
    out.prefill_points, out.decode_tokens = m.prefill_points, m.decode_tokens
    out.engine_ttft_mean_seconds, out.engine_ttft_p90_seconds = opt(m.engine_ttft_mean_s), opt(m.engine_ttft_p90_s)
    out.trust, out.hit_belief, out.trust_reason = t.state, t.belief, t.reason
    out.agreement, out.engine_hit_ratio = opt(t.agreement), opt(t.engine_hit_ratio)
    out.predicted_hit_ratio, out.outside_share = opt(t.predicted_hit_ratio), opt(t.outside_share)
    out.predicted_ttft_seconds = out.predicted_tpot_seconds = -1.0


def describe_models(director: Director, state: dict[Any, Any], candidates: Sequence[Endpoint], now: float,
                    out: api.ExplainResponse) -> None:
    """Per candidate: what the latency model uses for it and what it predicted for this request; the SLO verdict."""
    scorer = latency_model(director)
    if scorer is None:
        return
    predicted = predictions(state)
    verdict = decision_slo(state)
    for e in candidates:
        if predicted is not None and e.key not in predicted:
            continue  # not scored (it does not serve the model)
        m = out.models.add()
        fill_model(m, e.key, scorer.endpoint_model(e.key, now))
        if predicted is not None:
            m.predicted_ttft_seconds, m.predicted_tpot_seconds = predicted[e.key]
        if verdict is not None:
            m.meets_slo = verdict.meets(e.key)
            ttft_room, tpot_room = verdict.headroom_of(e.key)
            if ttft_room is not None:
                m.ttft_headroom_seconds = ttft_room
            if tpot_room is not None:
                m.tpot_headroom_seconds = tpot_room
    if verdict is not None:
        out.slo, out.slo_attainable, out.slo_class = verdict.slo.describe(), verdict.attainable, verdict.klass


def describe_result(d: Director, ctx: ShellContext, result: SchedulingResult, out: api.ExplainResponse) -> None:
    """The pick and how it was made: the profiles' plugins and scores, prefixes, the session, the latency model."""
    out.endpoint = result.primary.key
    out.fallbacks.extend(e.key for e in result.targets[1:])
    if result.prefill is not None:
        out.prefill = result.prefill.key
    out.profile, out.decision = result.profile, result.decision
    for name, pr in result.profile_results.items():
        run = out.profiles.add(profile=name, targets=[e.key for e in pr.targets])
        run.totals.update(pr.totals)
        for det in pr.details:
            pl = run.plugins.add(name=det.name, type=det.type, kind=det.kind, duration_seconds=det.duration_s)
            if det.weight is not None:
                pl.weight = det.weight
            if det.kept is not None:
                pl.kept.extend(det.kept)
            if det.scores is not None:
                pl.scores.update(det.scores)
    describe_prefix(result.state, ctx.candidates, out)
    describe_session(result, ctx.now, out)
    describe_models(d, result.state, ctx.candidates, ctx.now, out)
    if ctx.route is not None and ctx.route.sticky is not None:
        out.route.session = f"pinned {ctx.route.pinned}" if ctx.route.pinned else (
            "new" if ctx.route.session is not None else "")


class PointsmanService(pointsman_pb2_grpc.PointsmanServicer):
    """`director` is the current bundle (the app swaps it on reload); `passive` reports endpoint health."""

    def __init__(self, director: Director, passive: PassiveHealth | None = None) -> None:
        self.director = director
        self.passive = passive
        self.recorder: DecisionRecorder | None = None  # the receipts (epp/observe/receipts.py), when kept

    def explain(self, request: api.ExplainRequest) -> api.ExplainResponse:
        """The dry run, synchronously: nothing that would make the decision wait is asked (a shared rate limit's
        Redis, the engine's /tokenize; see `explain_async`, which the gRPC API uses)."""
        ex, outcome = self._dry_run(request, wait=False)
        assert isinstance(outcome, Outcome), "a dry run that may not wait decides synchronously"
        return self._describe(ex, outcome)

    async def explain_async(self, request: api.ExplainRequest) -> api.ExplainResponse:
        """The dry run exactly as a request would be decided, tokenization and shared limits included."""
        ex, outcome = self._dry_run(request, wait=True)
        if inspect.isawaitable(outcome):
            outcome = await outcome
        return self._describe(ex, outcome)

    def _dry_run(self, request: api.ExplainRequest, *, wait: bool
                 ) -> tuple[RequestExchange, Outcome | Awaitable[Outcome]]:
        """The request's exchange in dry-run mode: the real request's stages with their effects switched off."""
        headers = {k.lower(): v for k, v in request.headers.items()}
        headers.setdefault(":path", request.path or "/v1/chat/completions")
        headers.setdefault(":method", "POST")
        metadata = {"pointsman": {"pool": request.pool}} if request.pool else {}
        ex = RequestExchange(self.director, dry_run=True, wait=wait)
        return ex, ex.decide(headers, request.body, metadata)

    def _describe(self, ex: RequestExchange, outcome: Outcome) -> api.ExplainResponse:
        """The response: what the dry run decided (`outcome`) and what it saw on the way (the exchange)."""
        d, ctx, out = self.director, ex.pending, api.ExplainResponse()
        if ctx is not None:
            req = ctx.request
            out.model, out.target_model = req.model, req.target_model
            out.candidates.extend(e.key for e in ctx.candidates)
            if ctx.route is not None:
                describe_route(ctx.route, out.route)
                describe_budgets(d.admitters, ctx, out.route)
            if ctx.route is None or ctx.route.provider is None:
                out.token_source, out.prompt_tokens = req.token_source, req.estimated_tokens
        if ex.queue is not None and ex.queue.why:  # it would wait; the rest shows what it would get if it went now
            out.queued, out.queue = True, ex.queue.why
        elif held := why_held(ex):  # held for tight work (epp/flowcontrol/hold.py)
            out.queued, out.queue = True, held
        if outcome.reject_status or ctx is None:
            out.status, out.error = outcome.reject_status, outcome.reject_body
            return out
        out.status = 200
        out.headers.update(redacted(outcome.set_headers, ctx.route.sensitive if ctx.route is not None else ()))
        result = ex.result
        if result is not None:  # (None: an external provider, no endpoint scheduling)
            describe_result(d, ctx, result, out)
        return out

    async def Explain(  # noqa: N802
        self, request: api.ExplainRequest, context: grpc.aio.ServicerContext
    ) -> api.ExplainResponse:
        return await self.explain_async(request)

    def list_endpoints(self, request: api.ListEndpointsRequest) -> api.ListEndpointsResponse:
        ds = self.director.datastore
        now = self.director.clock()
        passive = self.passive
        out = api.ListEndpointsResponse(pools=ds.pool_names(), default_pool=ds.default_pool or "")
        scorer = latency_model(self.director)
        for pool in [request.pool] if request.pool else ds.pool_names():
            snap = ds.snapshot(pool)
            if snap is None:
                continue
            for ep in snap.endpoints:
                m = ep.metrics
                info = out.endpoints.add(
                    pool=pool,
                    key=ep.key,
                    name=ep.name,
                    labels=dict(ep.labels),
                    models=sorted(ep.models),
                    role=ep.role or "",
                    waiting=m.waiting,
                    running=m.running,
                    kv_usage=m.kv_usage,
                    active_loras=sorted(m.active_loras),
                    stale=m.stale,
                    metrics_age_seconds=(now - m.updated_at) if m.updated_at is not None else -1.0,
                    inflight=ds.inflight.get(ep.key).requests,
                    routable=ds.is_routable(ep.key),
                )
                _health(info, ep.key, ds, passive)
                if scorer is not None:
                    fill_model(info.model, ep.key, scorer.endpoint_model(ep.key, now))
        return out

    def receipt(self, decision_id: str) -> api.Receipt:
        """A past decision by its id, as it was made (epp/observe/receipts.py)."""
        from epp.api.receipts import get_receipt

        d = self.director
        return get_receipt(self.recorder, d.ids, decision_id, d.clock)

    async def GetReceipt(  # noqa: N802
        self, request: api.ReceiptRequest, context: grpc.aio.ServicerContext
    ) -> api.Receipt:
        return self.receipt(request.decision_id)

    async def ListEndpoints(  # noqa: N802
        self, request: api.ListEndpointsRequest, context: grpc.aio.ServicerContext
    ) -> api.ListEndpointsResponse:
        return self.list_endpoints(request)


def _health(info: api.EndpointInfo, key: str, ds: Datastore, passive: PassiveHealth | None) -> None:
    """Fill the endpoint's health fields: passive health's view (which includes the scraper's), or the scraper's
    mark alone when passive health is off."""
    if passive is None:
        info.state = "out" if key in ds.unhealthy else "healthy"
        return
    state, reason, st = passive.view(key)
    info.state, info.reason = state, reason
    if st is not None:
        info.failures, info.consecutive_failures, info.ejections = st.failures, st.consecutive, st.ejections
    if passive.scraper is not None:
        info.scrape_failures = passive.scraper.failures(key)
