"""`epp serve`'s request path: the director bundle (epp/request/director.py) with its observers, built once from
what the earlier steps started and then made current with the initial scheduler."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from epp.api import RequestMetrics
from epp.cmd.scheduler import apply_scheduler
from epp.fleet import choose_rewrite
from epp.request import Director, DirectorConfig
from scheduling.plugins.filters.header_based_testing import FILTER_TYPE
from scheduling.plugins.system.destination_endpoint_served_verifier import VERIFIER_TYPE

if TYPE_CHECKING:
    from epp.cmd.components import Components
    from epp.request import RequestObserver

log = logging.getLogger(__name__)


def director_config(app: Components) -> DirectorConfig:
    r = app.settings.request
    conformance = r.conformance or conformance_config(app)
    if conformance:
        log.warning("conformance mode: clients choose their endpoint with test-epp-endpoint-selection and responses "
                    "carry x-conformance-test-served-endpoint; for the conformance suite only")
    return DirectorConfig(**r.outputs.fields(), fallbacks=r.fallbacks, conformance=conformance,
                          default_pool=app.settings.sources.pool_name, log_decisions=r.log_decisions)


def conformance_config(app: Components) -> bool:
    """The initial scheduling config declares the conformance suite's plugins (its conformance-plugins.yaml)."""
    if app.scheduler is None:
        return False
    return any(getattr(p, "type_name", "") in (FILTER_TYPE, VERIFIER_TYPE) for p in app.scheduler.plugins())


def dashboard_on(app: Components) -> bool:
    """The dashboard has a page to show: a metrics port, or a worker's control socket."""
    return app.settings.dashboard.enabled and bool(app.settings.server.metrics_port or app.settings.worker)


def observers(app: Components) -> list[RequestObserver]:
    """Who observes each request, in order: metrics (and SLO attainment), the routing dialects' runtimes (e.g. LLMKube's quarantine and
    first-byte latency), passive health, the decision recorder (the dashboard's page and the decision receipts
    share it), then tracing and the shadow profile (epp/observe)."""
    assert app.metrics is not None
    from epp.api import SloMetrics  # predicted and measured SLO attainment (x-llm-d-slo-*)
    from epp.flowcontrol import SloHolds  # loose requests held for tight work (x-llm-d-slo-*)

    slo = SloMetrics(app.metrics.registry)
    inflight = app.datastore.inflight
    app.holds = SloHolds(lambda key: inflight.get(key).requests, slo)
    out: list[RequestObserver] = [RequestMetrics(app.metrics), slo, app.holds]
    if app.routing is not None:
        out.extend(app.routing.router.runtimes)
    if app.passive is not None:
        out.append(app.passive)
    if app.sessions is not None:  # agent sessions: Responses API chains learnt from the responses
        out.append(app.sessions)
    d, obs = app.settings.dashboard, app.observe
    receipts = obs.settings.receipts if obs is not None else None
    dashboard = dashboard_on(app)
    count = (d.decisions if dashboard else 0) if receipts is None or receipts.count is None else receipts.count
    if dashboard or count:  # the dashboard's record of decisions is also the receipts'
        from epp.api.dashboard import DecisionRecorder, RecorderObserver

        app.recorder = DecisionRecorder(max(count, d.decisions if dashboard else 1),
                                        receipts.max_age if receipts is not None and count else 0.0)
        out.append(RecorderObserver(app.recorder))
        if obs is not None:
            obs.attach_recorder(app.recorder)
    if obs is not None:
        out.extend(obs.observers)
    return out


async def build_director(app: Components) -> None:
    assert app.scheduler is not None, "the scheduling step runs first"
    from epp.request import SessionIdentity

    app.sessions = SessionIdentity(app.settings.request.sessions)  # agent session identity (epp/request/sessions.py)
    ds, rng = app.datastore, app.rng
    app.director = Director(
        ds, app.scheduler, director_config(app),
        rewrite=lambda model: choose_rewrite(ds.rewrites, model, rng) if ds.rewrites else None,
        router=app.routing.router if app.routing is not None else None,
        tokens=app.tokens,  # precise prefix routing: tokenize for configs that read tokens
        observers=tuple(observers(app)),
        holds=app.holds,  # (built with the observers: it is one)
        early=app.settings.request.early,  # reading the body as it streams in (epp/request/early.py)
        sessions=app.sessions,
        probe=app.passive.probe_for if app.passive is not None else None,  # a probe goes out whatever the scores
        **(app.observe.director_fields() if app.observe is not None else {}),  # decision ids, tracing
    )
    apply_scheduler(app, app.scheduler)
    holds = app.holds

    async def release_held() -> None:  # at shutdown, held requests go now
        if holds is not None:
            holds.close()

    app.runner.add("slo holds", release_held)
    from epp.api import (
        ModelCollector,  # the latency model: timings and prefix trust per endpoint
    )

    assert app.metrics is not None
    app.metrics.registry.register(ModelCollector(app.current, ds))


__all__ = ["build_director", "director_config", "observers"]
