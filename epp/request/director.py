"""The director: turns a complete request into a scheduling decision and the decision into mutations.

It parses the body once, resolves model, rewrite, objective and candidates, asks the scheduler, commits the pick
(in-flight counts, stateful plugins) and releases it exactly once when the stream ends.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from epp.fleet.datastore import Datastore
from epp.protocol import Outcome
from epp.request.gates import Gate
from epp.request.parsing import api_kind, parse_body, set_model
from epp.request.pool_select import choose_pool
from epp.request.watch import Watcher
from scheduling.api import Scheduler, SchedulingContext, SchedulingResult
from scheduling.types import ApiKind, Endpoint, ErrorCode, LLMRequest, SchedulingError

if TYPE_CHECKING:
    from epp.api.dashboard.recorder import DecisionRecorder
    from epp.fleet.passive import PassiveHealth
    from epp.flowcontrol.controller import FlowController
    from epp.request.exchange import RequestExchange
    from epp.routing.router import RouteDecision, Router
    from epp.tokenize.shell import RequestTokens

log = logging.getLogger(__name__)

DESTINATION = "x-gateway-destination-endpoint"
SERVED = "x-gateway-destination-endpoint-served"
SUBSET = "x-gateway-destination-endpoint-subset"
PREFILLER = "x-prefiller-host-port"
LB_NS = "envoy.lb"
SUBSET_NS = "envoy.lb.subset_hint"
CONFORMANCE_REQ = "test-epp-endpoint-selection"
CONFORMANCE_RESP = "x-conformance-test-served-endpoint"
OBJECTIVE = "x-gateway-inference-objective"
MODEL_REWRITE = "x-gateway-model-name-rewrite"
PLUGIN_SAMPLE_EVERY = 8  # report per-plugin durations for one request in this many


@dataclass(slots=True)
class DirectorConfig:
    model_header: str | None = "X-Gateway-Model-Name"  # None or "": not set
    base_model_header: str | None = "X-Gateway-Base-Model-Name"  # None or "": not set
    ai_gateway_model_header: str | None = "x-ai-eg-model"  # None or "": not set
    fallbacks: int = 0  # extra endpoints listed (comma list) in envoy.lb metadata for override_host retries
    conformance: bool = False  # honour test-epp-endpoint-selection / report x-conformance-test-served-endpoint
    default_pool: str | None = None
    pool_metadata_key: tuple[str, str] = ("pointsman", "pool")  # route metadata naming the pool (set by Envoy)
    log_decisions: bool = False
    # What the replies carry (epp/request/outputs.py: `--data-plane` and its per-output flags); the defaults are `full`.
    destination_header: bool = True  # x-gateway-destination-endpoint: ORIGINAL_DST and agentgateway read it
    destination_metadata: bool = True  # envoy.lb metadata: override_host reads it
    clear_route_cache: bool = True  # gateways that route on the model headers need the route recomputed
    remove_absent: bool = True  # remove the reserved client headers even when the request has none of them


class DirectorMetrics(Protocol):
    """What the director reports; epp.api.metrics.EppMetrics implements it, NullMetrics ignores it."""

    def request_started(self, model: str, target: str, priority: int) -> None: ...
    def request_error(self, model: str, target: str, code: str) -> None: ...
    def request_finished(
        self, model: str, target: str, duration_s: float, input_tokens: int, output_tokens: int
    ) -> None: ...
    def scheduler_duration(self, seconds: float) -> None: ...
    def plugin_duration(self, ext_point: str, plugin_type: str, name: str, seconds: float) -> None: ...
    def disagg_decision(self, model: str, decision: str) -> None: ...


@dataclass(slots=True)
class ShellContext(SchedulingContext):
    """The scheduler's context plus what only the shell reads: the routing layer's decision (epp/routing), if any,
    and the pool the candidates came from (flow control queues per pool)."""

    route: RouteDecision | None = None
    pool: str = ""


class NullMetrics:
    """Metrics that go nowhere (the director's default)."""

    def request_started(self, model: str, target: str, priority: int) -> None: ...
    def request_error(self, model: str, target: str, code: str) -> None: ...
    def request_finished(
        self, model: str, target: str, duration_s: float, input_tokens: int, output_tokens: int
    ) -> None: ...
    def scheduler_duration(self, seconds: float) -> None: ...
    def plugin_duration(self, ext_point: str, plugin_type: str, name: str, seconds: float) -> None: ...
    def disagg_decision(self, model: str, decision: str) -> None: ...


def merge_headers(sets: list[tuple[str, str]], extra: Sequence[tuple[str, str]]) -> None:
    """Append `extra` to `sets`; a name already in `sets` takes the value from `extra` (names are case-insensitive)."""
    if not extra:
        return
    names = {k.lower() for k, _ in extra}
    sets[:] = [(k, v) for k, v in sets if k.lower() not in names]
    sets.extend(extra)


def error_outcome(err: SchedulingError) -> Outcome:
    return Outcome(reject_status=err.code.http_status, reject_body=str(err))


def _split_list(value: object) -> list[str]:
    if isinstance(value, str):
        return [v.strip() for v in value.split(",") if v.strip()]
    if isinstance(value, list):
        return [str(v).strip() for v in value if str(v).strip()]
    return []


def _split_host(entry: str) -> tuple[str, str | None]:
    """'ip', 'ip:port', 'v6', '[v6]' or '[v6]:port' -> (ip, port or None)."""
    if entry.startswith("["):
        close = entry.find("]")
        ip, rest = entry[1:close], entry[close + 1 :]
        return ip, rest[1:] if rest.startswith(":") and rest[1:] else None
    if entry.count(":") == 1:
        ip, port = entry.split(":", 1)
        return ip, port or None
    return entry, None  # a bare IPv4 or IPv6 address


def restrict(candidates: Sequence[Endpoint], entries: list[str], *, ip_only: bool) -> list[Endpoint]:
    """Keep endpoints named by the entries: on IP alone, or on ip:port where an entry carries a port."""
    ips: set[str] = set()
    keys: set[tuple[str, int]] = set()
    for entry in entries:
        ip, port = _split_host(entry)
        if ip_only or port is None or not port.isdigit():
            ips.add(ip)
        else:
            keys.add((ip, int(port)))
    return [ep for ep in candidates if ep.address in ips or (ep.address, ep.port) in keys]


class Director:
    def __init__(
        self,
        datastore: Datastore,
        scheduler: Scheduler,
        config: DirectorConfig | None = None,
        *,
        metrics: DirectorMetrics | None = None,
        clock: Callable[[], float] = time.monotonic,
        admission: Callable[[int, Sequence[Endpoint], float], bool] | None = None,
        rewrite: Callable[[str], str | None] | None = None,
        router: Router | None = None,
        gates: Sequence[Gate] = (),
        watchers: Sequence[Watcher] = (),
    ) -> None:
        self.datastore = datastore
        self.scheduler = scheduler
        self.config = config or DirectorConfig()
        self.metrics: DirectorMetrics = metrics or NullMetrics()
        self.clock = clock
        self.admission = admission
        self.rewrite = rewrite
        self.router = router  # epp.routing.Router: routes, rules and weighted targets (None: pools only)
        self.gates: list[Gate] = list(gates)  # admission after parsing and routing, in order (epp/request/gates.py)
        self.watchers: list[Watcher] = list(watchers)  # see the response path of committed requests (epp/request/watch.py)
        self.tokens: RequestTokens | None = None  # tokens for configs that read them (set by the app)
        self.flow: FlowController | None = None  # while the config turns flow control on
        self.passive: PassiveHealth | None = None  # also one of the watchers; kept for reporting
        self._decisions = 0
        self.recorder: DecisionRecorder | None = None  # set by the app when the dashboard is on

    def exchange(self) -> RequestExchange:
        """The director's side of a new stream (epp/request/exchange.py)."""
        from epp.request.exchange import RequestExchange

        return RequestExchange(self)

    # ---- building the scheduling request --------------------------------------------------------------------------
    def build(
        self, headers: Mapping[str, str], body: bytes | None, metadata: Mapping[str, Mapping[str, object]],
        *, dry_run: bool = False,
    ) -> tuple[ShellContext, dict[str, Any] | None]:
        """Parse and resolve; raise SchedulingError for bad input or no candidates.

        `body` None means a body exists but is not visible before the pick: route on headers and load alone."""
        kind = api_kind(headers)
        parsed_body: dict[str, Any] | None = None
        model, prompt = "", ""
        if body:
            if kind is ApiKind.OTHER:
                try:
                    p = parse_body(kind, body)
                    parsed_body, model = p.body, p.model
                except SchedulingError:
                    pass  # an unknown API with a non-JSON or model-less body is routed on load alone
            else:
                p = parse_body(kind, body)
                parsed_body, model, prompt = p.body, p.model, p.prompt
        elif body is not None and kind is not ApiKind.OTHER and headers.get(":method", "POST").upper() == "POST":
            raise SchedulingError(ErrorCode.BAD_REQUEST, f"{kind.value} request has no body")
        target = model
        # ---- routing layer: route -> rule -> target (a pool to schedule in, or an external provider) ----------
        route = self.router.decide(headers, model, now=self.clock(), dry_run=dry_run, metadata=metadata,
                                   body=parsed_body) if self.router else None
        forced = headers.get(MODEL_REWRITE)
        if route is not None:
            target = route.engine_model or model
        elif forced:
            target = forced
        elif model and self.rewrite is not None:
            target = self.rewrite(model) or model
        objective = headers.get(OBJECTIVE, "")
        priority = self.datastore.objectives.get(objective, 0) if objective else 0
        base = route.base_model if route is not None and route.base_model else self.datastore.adapters.get(target)
        request_id = headers.get("x-request-id") or str(uuid.uuid4())
        req = LLMRequest(
            request_id=request_id,
            model=model,
            target_model=target,
            kind=kind,
            headers=headers,
            prompt=prompt,
            priority=priority,
            objective=objective,
            cache_salt=str(parsed_body.get("cache_salt", "")) if parsed_body else "",
            lora_adapter=target if base else None,
            base_model=base,
            body=parsed_body,
        )
        pool = ""
        if route is not None and route.provider is not None:
            candidates: list[Endpoint] = []  # an external provider: no endpoint to schedule
        else:
            pool = self.resolve_pool(metadata, route=route, model=target) or ""
            candidates = self.candidates(headers, metadata, route=route, pool=pool)
        ctx = ShellContext(req, candidates, self.datastore.inflight.view(), self.clock(), route=route, pool=pool)
        return ctx, parsed_body

    def pool_of(self, metadata: Mapping[str, Mapping[str, object]]) -> str | None:
        """The pool a request is for: route metadata set by Envoy, else the default pool."""
        ns, key = self.config.pool_metadata_key
        if ns in metadata:
            pool = metadata[ns].get(key)
            if isinstance(pool, str) and pool:
                return pool
        return self.config.default_pool or self.datastore.default_pool

    def routable(self, pool: str | None) -> list[Endpoint]:
        """The pool's endpoints in rotation (all of them when none is); [] for an unknown pool."""
        snap = self.datastore.snapshot(pool)
        return [] if snap is None else self._in_rotation(snap.endpoints)

    def _in_rotation(self, endpoints: Sequence[Endpoint]) -> list[Endpoint]:
        eps: list[Endpoint] = list(endpoints)
        ds = self.datastore
        unhealthy, ejected = ds.unhealthy, ds.ejected
        if unhealthy or ejected:
            healthy = [e for e in eps if e.key not in unhealthy and e.key not in ejected]
            # Every endpoint out of rotation is more likely a problem with the evidence than a dead pool: all go.
            eps = healthy or eps
        return eps

    def resolve_pool(
        self, metadata: Mapping[str, Mapping[str, object]], *, route: RouteDecision | None = None, model: str = ""
    ) -> str | None:
        """The pool a request schedules in: its route's, else Envoy's route metadata, else the pool chooser's."""
        if route is not None:
            pool: str | None = route.pool_name
            return pool
        ns, key = self.config.pool_metadata_key
        named = metadata.get(ns, {}).get(key)
        if isinstance(named, str) and named:
            return named
        hint = metadata.get(SUBSET_NS)
        ds = self.datastore  # several pools may share this Pointsman: see epp/request/pool_select.py
        return choose_pool(ds, default=self.config.default_pool or ds.default_pool, model=model,
                           hint=_split_list(hint[SUBSET]) if hint is not None and SUBSET in hint else None,
                           exclude=self.router.materializer.names if self.router is not None else ())

    def candidates(
        self, headers: Mapping[str, str], metadata: Mapping[str, Mapping[str, object]], *,
        route: RouteDecision | None = None, pool: str | None = None,
    ) -> list[Endpoint]:
        """The endpoints of `pool` (see resolve_pool) this request may go to; SchedulingError when none."""
        snap = self.datastore.snapshot(pool)
        if snap is None:
            if route is not None and route.pool is not None:
                raise SchedulingError(ErrorCode.SERVICE_UNAVAILABLE,
                                      f"{route.pool.kind} {route.pool.key} has no endpoints")
            ns, key = self.config.pool_metadata_key
            known = ", ".join(self.datastore.pool_names())
            raise SchedulingError(
                ErrorCode.SERVICE_UNAVAILABLE,
                f"no inference pool {pool or ''!r} known" if pool or not known else
                f"cannot tell which inference pool serves this request (pools: {known}); name it with Envoy "
                f"route metadata {ns}.{key}",
            )
        # Scrape failures and passive health take endpoints out of rotation (all of them stay when all are out).
        eps = self._in_rotation(snap.endpoints)
        hint = metadata.get(SUBSET_NS)
        if hint is not None and SUBSET in hint:
            eps = restrict(eps, _split_list(hint[SUBSET]), ip_only=True)
            if not eps:
                raise SchedulingError(ErrorCode.SERVICE_UNAVAILABLE, "no endpoint in the subset hint")
        if self.config.conformance and headers.get(CONFORMANCE_REQ):
            eps = restrict(eps, _split_list(headers[CONFORMANCE_REQ]), ip_only=False)
        if not eps:
            raise SchedulingError(ErrorCode.SERVICE_UNAVAILABLE, "no candidate endpoints in the inference pool")
        if route is not None:
            eps = route.narrow(eps, self.clock())  # P/D pairing, sticky sessions
        return eps

    def schedule(self, ctx: SchedulingContext, *, dry_run: bool = False) -> SchedulingResult:
        """Admission, then the scheduler. A dry run (explain) reports nothing to metrics and changes no state."""
        req = ctx.request
        if self.admission is not None and req.priority < 0 and not self.admission(
            req.priority, ctx.candidates, ctx.now
        ):
            raise SchedulingError(
                ErrorCode.RESOURCE_EXHAUSTED, "the pool is saturated and the request is sheddable (priority < 0)"
            )
        scheduler = self.scheduler_for(ctx)
        if dry_run:
            result = self._schedule(scheduler, ctx, True)
        else:
            t0 = time.perf_counter()
            result = self._schedule(scheduler, ctx, False)
            metrics = self.metrics
            metrics.scheduler_duration(time.perf_counter() - t0)
            self._decisions += 1
            if self._decisions % PLUGIN_SAMPLE_EVERY == 0:
                # Per-plugin latency is sampled: a histogram per plugin per request costs more than the plugins.
                for pr in result.profile_results.values():
                    for det in pr.details:
                        metrics.plugin_duration(det.kind, det.type, det.name, det.duration_s)
        if not result.targets:
            raise SchedulingError(ErrorCode.SERVICE_UNAVAILABLE, "the scheduler returned no endpoint")
        return result

    def scheduler_for(self, ctx: SchedulingContext) -> Scheduler:
        """The scheduler deciding for this request: its route's pool's own (P/D pairing), else the director's."""
        route = getattr(ctx, "route", None)
        return route.scheduler if route is not None and route.scheduler is not None else self.scheduler

    @staticmethod
    def _schedule(scheduler: Scheduler, ctx: SchedulingContext, dry_run: bool) -> SchedulingResult:
        try:
            return scheduler.schedule(ctx, dry_run=dry_run) if dry_run else scheduler.schedule(ctx)
        except SchedulingError as err:
            route = getattr(ctx, "route", None)
            unpinned = route.unpin() if route is not None and err.code is ErrorCode.RESOURCE_EXHAUSTED else None
            if not unpinned:
                raise
            ctx.candidates = unpinned  # the session's endpoint was filtered out: schedule as a new session
            return scheduler.schedule(ctx, dry_run=dry_run) if dry_run else scheduler.schedule(ctx)

    # ---- turning a decision into mutations ------------------------------------------------------------------------
    def mutations(self, ctx: SchedulingContext, result: SchedulingResult, parsed: dict[str, Any] | None) -> Outcome:
        cfg = self.config
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
        self._model_headers(req, sets)
        lb_value = primary
        if cfg.fallbacks > 0 and len(result.targets) > 1:
            lb_value = ",".join(e.key for e in result.targets[: cfg.fallbacks + 1])
        if self.router is not None:  # routes: fallbacks per pool; Envoy retries exactly on the listed ones
            route = getattr(ctx, "route", None)
            if route is not None:
                merge_headers(sets, route.set_headers)
                remove.extend(route.remove_headers)
                keys = route.fallbacks(result, ctx.candidates, ctx.inflight)
                lb_value = ",".join(keys)
            else:
                remove.extend(self.router.reserved_headers)  # a client never chooses a provider (nor a mirror)
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

    def _model_headers(self, req: LLMRequest, sets: list[tuple[str, str]]) -> None:
        cfg = self.config
        if req.target_model:
            if cfg.model_header:
                sets.append((cfg.model_header, req.target_model))
            if cfg.base_model_header:
                sets.append((cfg.base_model_header, req.base_model or req.target_model))
            if cfg.ai_gateway_model_header:
                sets.append((cfg.ai_gateway_model_header, req.target_model))
        if "x-request-id" not in req.headers:
            sets.append(("x-request-id", req.request_id))

    def mutations_for_provider(self, ctx: ShellContext, parsed: dict[str, Any] | None) -> Outcome:
        """An external provider: Envoy's provider route takes it (the provider header), with the credential, the
        provider's path and model and the static headers; no endpoint, so no destination header."""
        req, route = ctx.request, ctx.route
        if route is None:
            raise ValueError("mutations_for_provider needs the routing decision that chose the provider")
        sets: list[tuple[str, str]] = []
        self._model_headers(req, sets)
        merge_headers(sets, route.set_headers)
        remove = [*route.remove_headers, DESTINATION, SERVED, SUBSET, PREFILLER]
        new_body = set_model(parsed, req.target_model) if parsed is not None and req.target_model != req.model else None
        return Outcome(set_headers=sets, remove_headers=remove, body=new_body)
