"""Pointsman's own gRPC API: Explain (a dry-run decision with per-plugin detail) and ListEndpoints.

Explain is a true dry run: it parses and schedules like a real request, with the scheduler's random source copied
rather than advanced, and it records nothing (no in-flight count, no metrics, no decision counters, no plugin
state), so it shows what the next real request would get without changing it."""

from __future__ import annotations

import grpc

from epp.datastore import Datastore
from epp.director import Director, error_outcome
from epp.passive import PassiveHealth
from proto import pointsman_pb2 as api
from proto import pointsman_pb2_grpc
from scheduling.types import SchedulingError


class PointsmanService(pointsman_pb2_grpc.PointsmanServicer):
    def __init__(self, director: Director) -> None:
        self.director = director

    def explain(self, request: api.ExplainRequest) -> api.ExplainResponse:
        d = self.director
        headers = {k.lower(): v for k, v in request.headers.items()}
        headers.setdefault(":path", request.path or "/v1/chat/completions")
        headers.setdefault(":method", "POST")
        metadata = {"pointsman": {"pool": request.pool}} if request.pool else {}
        out = api.ExplainResponse()
        try:
            ctx, parsed = d.build(headers, request.body, metadata)
            out.model, out.target_model = ctx.request.model, ctx.request.target_model
            out.candidates.extend(e.key for e in ctx.candidates)
            ctx.explain = True
            result = d.schedule(ctx, dry_run=True)
        except SchedulingError as err:
            rej = error_outcome(err)
            out.status, out.error = rej.reject_status, rej.reject_body
            return out
        out.status = 200
        out.endpoint = result.primary.key
        out.fallbacks.extend(e.key for e in result.targets[1:])
        if result.prefill is not None:
            out.prefill = result.prefill.key
        out.profile, out.decision = result.profile, result.decision
        for name, pr in result.profile_results.items():
            run = out.profiles.add(profile=name, targets=[e.key for e in pr.targets])
            run.totals.update(pr.totals)
            for det in pr.details:
                pl = run.plugins.add(
                    name=det.name, type=det.type, kind=det.kind, duration_seconds=det.duration_s
                )
                if det.weight is not None:
                    pl.weight = det.weight
                if det.kept is not None:
                    pl.kept.extend(det.kept)
                if det.scores is not None:
                    pl.scores.update(det.scores)
        outcome = d.mutations(ctx, result, parsed)
        out.headers.update(dict(outcome.set_headers))
        return out

    async def Explain(  # noqa: N802
        self, request: api.ExplainRequest, context: grpc.aio.ServicerContext
    ) -> api.ExplainResponse:
        return self.explain(request)

    def list_endpoints(self, request: api.ListEndpointsRequest) -> api.ListEndpointsResponse:
        ds = self.director.datastore
        now = self.director.clock()
        passive = self.director.passive
        out = api.ListEndpointsResponse(pools=ds.pool_names(), default_pool=ds.default_pool or "")
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
        return out

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
