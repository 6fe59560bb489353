"""The schedule and commit stages' pure parts: asking the scheduler, and turning a decision into mutations.

`schedule` asks the request's scheduler (its route's P/D scheduler, else the director's), retrying once without a
sticky session's pin when the pinned endpoint was filtered out; `slo_refusal` sheds a sheddable request whose SLO
no endpoint is predicted to meet. `mutations` builds what Envoy applies: the
destination header and `envoy.lb` metadata (as the data plane reads them, epp/request/outputs.py), the model headers,
the route's headers, the retry budget and a rewritten body; `mutations_for_provider` does the same for an external
provider (no endpoint). A client never picks its own upstream: the reserved headers it sent are always removed.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from epp.protocol import Outcome
from epp.request.context import DESTINATION, LB_NS, PREFILLER, SERVED, SUBSET, ShellContext
from epp.request.parsing import set_model
from scheduling.api import Scheduler, SchedulingContext, SchedulingResult
from scheduling.latency import decision_slo
from scheduling.plugins.scorers.agent_session import session_note
from scheduling.types import ErrorCode, LLMRequest, SchedulingError

if TYPE_CHECKING:
    from epp.fleet import InflightTicket
    from epp.request.director import Director
    from epp.request.exchange import RequestExchange

log = logging.getLogger("epp.director")


def schedule(scheduler: Scheduler, ctx: SchedulingContext, *, dry_run: bool = False) -> SchedulingResult:
    """One scheduling cycle; SchedulingError when it yields no endpoint. A dry run (explain) changes nothing."""
    try:
        result = scheduler.schedule(ctx, dry_run=dry_run) if dry_run else scheduler.schedule(ctx)
    except SchedulingError as err:
        route = getattr(ctx, "route", None)
        unpinned = route.unpin() if route is not None and err.code is ErrorCode.RESOURCE_EXHAUSTED else None
        if not unpinned:
            raise
        ctx.candidates = unpinned  # the session's endpoint was filtered out: schedule as a new session
        result = scheduler.schedule(ctx, dry_run=dry_run) if dry_run else scheduler.schedule(ctx)
    if not result.targets:
        raise SchedulingError(ErrorCode.SERVICE_UNAVAILABLE, "the scheduler returned no endpoint")
    return result


def slo_refusal(req: LLMRequest, result: SchedulingResult) -> SchedulingError | None:
    """A sheddable request (priority < 0) whose objectives (x-llm-d-slo-ttft-ms / -tpot-ms) no candidate is
    predicted to meet is shed (429), as llm-d's SLO admitter does; so is a sheddable loose one that would take one of
    the last endpoints with room for the tight class (scheduling/latency/classes.py). A critical one goes to the
    best endpoint."""
    if req.priority >= 0:
        return None
    verdict = decision_slo(result.state)
    if verdict is None:
        return None
    if not verdict.attainable:
        return SchedulingError(ErrorCode.RESOURCE_EXHAUSTED,
                               f"no endpoint is predicted to meet the request's objectives ({verdict.slo.describe()}) "
                               "and it is sheddable (priority < 0)")
    if verdict.takes_scarce(result.primary.key):
        return SchedulingError(ErrorCode.RESOURCE_EXHAUSTED,
                               f"its objectives ({verdict.slo.describe()}) are looser than others' and the endpoints "
                               "with room for the tightest are nearly full; it is sheddable (priority < 0)")
    return None


def pick(d: Director, ctx: ShellContext, *, dry_run: bool = False
         ) -> tuple[SchedulingResult, SchedulingError | None]:
    """The schedule stage: the scheduler's pick, and why the request is shed (`slo_refusal`) or None. An endpoint
    waiting for its passive-health probe gets the request, whatever the scores said (`d.probe` only reads: the
    probe is taken when the request is decided). SchedulingError when no endpoint is picked."""
    if dry_run:
        ctx.explain = True  # per-plugin detail
    result = schedule(d.scheduler_for(ctx), ctx, dry_run=dry_run)
    shed = slo_refusal(ctx.request, result)
    probe = d.probe
    if shed is None and probe is not None and result.prefill is None:
        target = probe(ctx.candidates)
        if target is not None and target.key != result.primary.key:
            result = dataclasses.replace(result, targets=[target, *(e for e in result.targets if e.key != target.key)])
    return result, shed


def commit(d: Director, ctx: ShellContext, result: SchedulingResult, scheduler: Scheduler,
           fields: Callable[[], dict[str, str]]) -> InflightTicket:
    """Count the request in flight on its endpoint, run the plugins' pre_request, bind the route's session."""
    ticket = d.datastore.inflight.add(result.primary.key, ctx.request.estimated_tokens)
    try:
        scheduler.pre_request(ctx, result)
    except Exception:
        log.exception("pre_request hook failed", extra=fields())
    if ctx.route is not None:
        ctx.route.commit(result, ctx.now)  # e.g. bind the sticky session
    return ticket


def release(d: Director, ctx: ShellContext, ticket: InflightTicket | None, scheduler: Scheduler | None,
            result: SchedulingResult | None, fields: Callable[[], dict[str, str]]) -> None:
    """The stream ended: no longer in flight (queued requests may go), and the plugins hear how it ended."""
    live = ticket is not None and d.datastore.inflight.remove(ticket)
    if d.flow is not None:
        d.flow.kick()  # capacity freed: queued requests may go
    if live and d.holds is not None and ticket is not None:
        d.holds.freed(ticket.key)  # loose requests held for this endpoint may go (epp/flowcontrol/hold.py)
    ctx.now = d.clock()  # plugins see the time the request ended
    try:
        # An endpoint that left while the request ran was already forgotten by every plugin: telling them how the
        # request ended would only bring its state back.
        if live and scheduler is not None and result is not None:
            scheduler.response_complete(ctx, result)
    except Exception:
        log.exception("response_complete hook failed", extra=fields())


def merge_headers(sets: list[tuple[str, str]], extra: Sequence[tuple[str, str]]) -> None:
    """Append `extra` to `sets`; a name already in `sets` takes the value from `extra` (names are case-insensitive)."""
    if not extra:
        return
    names = {k.lower() for k, _ in extra}
    sets[:] = [(k, v) for k, v in sets if k.lower() not in names]
    sets.extend(extra)


def mutations(d: Director, ctx: SchedulingContext, result: SchedulingResult, parsed: dict[str, Any] | None
              ) -> Outcome:
    cfg = d.config
    req = ctx.request
    primary = result.primary.key
    hdrs = req.headers
    always = cfg.remove_absent  # else only what the client sent is removed (removing nothing is a no-op)
    sets: list[tuple[str, str]] = []
    remove: list[str] = []
    if cfg.destination_header:
        sets.append((DESTINATION, primary))
    elif always or DESTINATION in hdrs:
        remove.append(DESTINATION)  # a client never picks its own upstream
    if always or SERVED in hdrs:
        remove.append(SERVED)
    if always or SUBSET in hdrs:
        remove.append(SUBSET)
    if result.prefill is not None:
        sets.append((PREFILLER, result.prefill.key))
    elif always or PREFILLER in hdrs:
        remove.append(PREFILLER)
    model_headers(d, req, sets)
    lb_value = primary
    if cfg.fallbacks > 0 and len(result.targets) > 1:
        lb_value = ",".join(e.key for e in result.targets[: cfg.fallbacks + 1])
    if d.router is not None:  # routes: fallbacks per pool; Envoy retries exactly on the listed ones
        route = getattr(ctx, "route", None)
        if route is not None:
            merge_headers(sets, route.set_headers)
            remove.extend(route.remove_headers)
            keys = route.fallbacks(result, ctx.candidates, ctx.inflight)
            lb_value = ",".join(keys)
        else:
            remove.extend(d.router.reserved_headers)  # a client never chooses a provider (nor a mirror)
        sets.append(("x-envoy-max-retries", str(lb_value.count(","))))
    new_body = None
    if parsed is not None and req.target_model != req.model:
        new_body = set_model(parsed, req.target_model)
    return Outcome(
        set_headers=sets,
        remove_headers=remove,
        metadata={LB_NS: {DESTINATION: lb_value}} if cfg.destination_metadata else {},
        body=new_body,
        clear_route_cache=cfg.clear_route_cache,
    )


def model_headers(d: Director, req: LLMRequest, sets: list[tuple[str, str]]) -> None:
    cfg = d.config
    if req.target_model:
        if cfg.model_header:
            sets.append((cfg.model_header, req.target_model))
        if cfg.base_model_header:
            sets.append((cfg.base_model_header, req.base_model or req.target_model))
        if cfg.ai_gateway_model_header:
            sets.append((cfg.ai_gateway_model_header, req.target_model))
    if "x-request-id" not in req.headers:
        sets.append(("x-request-id", req.request_id))


def mutations_for_provider(d: Director, ctx: ShellContext, parsed: dict[str, Any] | None) -> Outcome:
    """An external provider: Envoy's provider route takes it (the provider header), with the credential, the
    provider's path and model and the static headers; no endpoint, so no destination header."""
    req, route = ctx.request, ctx.route
    if route is None:
        raise ValueError("mutations_for_provider needs the routing decision that chose the provider")
    sets: list[tuple[str, str]] = []
    model_headers(d, req, sets)
    merge_headers(sets, route.set_headers)
    remove = [*route.remove_headers, DESTINATION, SERVED, SUBSET, PREFILLER]
    new_body = set_model(parsed, req.target_model) if parsed is not None and req.target_model != req.model else None
    return Outcome(set_headers=sets, remove_headers=remove, body=new_body)


def log_decision(ex: RequestExchange) -> None:
    """The decision's log line, with `--log-decisions` (epp/observe/logs.py prints its fields)."""
    d, ctx, req, result = ex.d, ex.ctx, ex.request, ex.result
    if not d.config.log_decisions or ctx is None or req is None:
        return
    tid = ex.trace_id()
    ids = f" decision={ex.decision_id}" + (f" trace={tid}" if tid else "")
    rd = ctx.route
    if result is None:
        if rd is not None:
            log.info("decision %s model=%s -> provider %s route=%s/%s%s", req.request_id[:8],
                     req.target_model or "-", rd.backend_name, rd.route.key, rd.rule.name, ids, extra=ex.log_fields())
        return
    route = f" route={rd.route.key}/{rd.rule.name}->{rd.backend_name}" if rd is not None else ""
    note = session_note(result.state) if req.session is not None else None
    session = f" session={note.session} turn={note.turn}: {note.why}" if note is not None else ""
    # on the prompt's head: before the body ended (early), or at its end with the rest unread (BUFFERED, model last)
    head = "" if ex.early is None else " (on its head)" if ex.intake is not None and ex.intake.ended else " (early)"
    log.info("decision %s model=%s -> %s%s (profile %s)%s%s%s%s", req.request_id[:8], req.target_model or "-",
             result.primary.key, f" prefill={result.prefill.key}" if result.prefill else "", result.profile, route,
             head, session, ids, extra=ex.log_fields())
