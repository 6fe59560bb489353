"""The director: turns a complete request into a scheduling decision and the decision into mutations.

It parses the body once, resolves model, rewrite, objective and candidates, asks the scheduler, commits the pick
(in-flight counts, stateful plugins) and releases it exactly once when the stream ends.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from epp.datastore import Datastore, InflightTicket
from epp.parsing import api_kind, parse_body, set_model
from epp.protocol import Outcome
from epp.usage import UsageScanner
from scheduling.api import Scheduler, SchedulingContext, SchedulingResult
from scheduling.types import ApiKind, Endpoint, ErrorCode, LLMRequest, SchedulingError

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
    # What the replies carry (epp/outputs.py: `--data-plane` and its per-output flags); the defaults are `full`.
    destination_header: bool = True  # x-gateway-destination-endpoint: ORIGINAL_DST and agentgateway read it
    destination_metadata: bool = True  # envoy.lb metadata: override_host reads it
    clear_route_cache: bool = True  # gateways that route on the model headers need the route recomputed
    remove_absent: bool = True  # remove the reserved client headers even when the request has none of them
    # Run the scheduler's pre_request hooks (prefix recording) after the reply is handed to the transport, and
    # before the next decision or this request's close: routing sees every earlier pick exactly as before.
    defer_commit_hooks: bool = True


class NullMetrics:
    """The metrics interface the director reports to; epp.metrics.EppMetrics implements it for real."""

    def request_started(self, model: str, target: str, priority: int) -> None: ...
    def request_error(self, model: str, target: str, code: str) -> None: ...
    def request_finished(
        self, model: str, target: str, duration_s: float, input_tokens: int, output_tokens: int
    ) -> None: ...
    def scheduler_duration(self, seconds: float) -> None: ...
    def plugin_duration(self, ext_point: str, plugin_type: str, name: str, seconds: float) -> None: ...
    def disagg_decision(self, model: str, decision: str) -> None: ...


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
        metrics: Any = None,
        clock: Callable[[], float] = time.monotonic,
        admission: Callable[[int, Sequence[Endpoint], float], bool] | None = None,
        rewrite: Callable[[str], str | None] | None = None,
    ) -> None:
        self.datastore = datastore
        self.scheduler = scheduler
        self.config = config or DirectorConfig()
        self.metrics = metrics or NullMetrics()
        self.clock = clock
        self.admission = admission
        self.rewrite = rewrite
        self._decisions = 0
        self._deferred: list[Callable[[], None]] = []
        self._drain_scheduled = False

    # ---- commit hooks after the reply -----------------------------------------------------------------------------
    def defer(self, hook: Callable[[], None]) -> None:
        """Run `hook` once the current reply is on its way: at the end of this event-loop iteration (after the h2
        transport has written what this read produced), or earlier when a decision or a close needs it."""
        self._deferred.append(hook)
        if self._drain_scheduled:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no loop (a synchronous caller): nothing to wait for
            self.run_deferred()
            return
        self._drain_scheduled = True
        loop.call_soon(self.run_deferred)

    def endpoint_removed(self, key: str) -> None:
        """The datastore lost an endpoint: pending commit hooks first (they may name it), then the scheduler
        forgets it."""
        self.run_deferred()
        self.scheduler.endpoint_removed(key)

    def run_deferred(self) -> None:
        self._drain_scheduled = False
        while self._deferred:
            hooks, self._deferred = self._deferred, []
            for hook in hooks:
                hook()

    def exchange(self) -> RequestExchange:
        return RequestExchange(self)

    # ---- building the scheduling request --------------------------------------------------------------------------
    def build(
        self, headers: Mapping[str, str], body: bytes | None, metadata: Mapping[str, Mapping[str, object]]
    ) -> tuple[SchedulingContext, dict[str, Any] | None]:
        """Parse and resolve; raise SchedulingError for bad input or no candidates.

        `body` None means a body exists but is not visible before the pick: route on headers and load alone."""
        if self._deferred:  # earlier picks' commit hooks first: this decision sees them, as if they had run at once
            self.run_deferred()
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
        forced = headers.get(MODEL_REWRITE)
        if forced:
            target = forced
        elif model and self.rewrite is not None:
            target = self.rewrite(model) or model
        objective = headers.get(OBJECTIVE, "")
        priority = self.datastore.objectives.get(objective, 0) if objective else 0
        base = self.datastore.adapters.get(target)
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
        candidates = self.candidates(headers, metadata)
        ctx = SchedulingContext(req, candidates, self.datastore.inflight.view(), self.clock())
        return ctx, parsed_body

    def candidates(
        self, headers: Mapping[str, str], metadata: Mapping[str, Mapping[str, object]]
    ) -> list[Endpoint]:
        pool = None
        ns, key = self.config.pool_metadata_key
        if ns in metadata and isinstance(metadata[ns].get(key), str):
            pool = metadata[ns][key]
        snap = self.datastore.snapshot(pool or self.config.default_pool)
        if snap is None:
            raise SchedulingError(
                ErrorCode.SERVICE_UNAVAILABLE, f"no inference pool {pool or self.config.default_pool or ''!r} known"
            )
        eps: list[Endpoint] = list(snap.endpoints)
        unhealthy = self.datastore.unhealthy
        if unhealthy:
            healthy = [e for e in eps if e.key not in unhealthy]
            # Every endpoint failing its scrapes is more likely a metrics problem than a dead pool: fail open.
            eps = healthy or eps
        hint = metadata.get(SUBSET_NS)
        if hint is not None and SUBSET in hint:
            eps = restrict(eps, _split_list(hint[SUBSET]), ip_only=True)
            if not eps:
                raise SchedulingError(ErrorCode.SERVICE_UNAVAILABLE, "no endpoint in the subset hint")
        if self.config.conformance and headers.get(CONFORMANCE_REQ):
            eps = restrict(eps, _split_list(headers[CONFORMANCE_REQ]), ip_only=False)
        if not eps:
            raise SchedulingError(ErrorCode.SERVICE_UNAVAILABLE, "no candidate endpoints in the inference pool")
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
        if dry_run:
            result = self.scheduler.schedule(ctx, dry_run=True)
        else:
            t0 = time.perf_counter()
            result = self.scheduler.schedule(ctx)
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
        if req.target_model:
            if cfg.model_header:
                sets.append((cfg.model_header, req.target_model))
            if cfg.base_model_header:
                sets.append((cfg.base_model_header, req.base_model or req.target_model))
            if cfg.ai_gateway_model_header:
                sets.append((cfg.ai_gateway_model_header, req.target_model))
        if "x-request-id" not in hdrs:  # Envoy sends one (generate_request_id): only other proxies get it set
            sets.append(("x-request-id", req.request_id))
        lb_value = primary
        if cfg.fallbacks > 0 and len(result.targets) > 1:
            lb_value = ",".join(e.key for e in result.targets[: cfg.fallbacks + 1])
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


class RequestExchange:
    """The director's side of one stream (implements epp.protocol.Exchange)."""

    __slots__ = ("d", "scheduler", "ctx", "result", "started", "scanner", "served", "_closed", "_rewrite_from", "_rewrite_to",
                 "_ticket")

    def __init__(self, director: Director) -> None:
        self.d = director
        self.scheduler: Scheduler | None = None  # the one that picked (a config reload may swap the director's)
        self.ctx: SchedulingContext | None = None
        self.result: SchedulingResult | None = None
        self.started = 0.0
        self.scanner: UsageScanner | None = None
        self.served: str | None = None
        self._closed = False
        self._rewrite_from: bytes | None = None
        self._rewrite_to: bytes | None = None
        self._ticket: InflightTicket | None = None

    def decide(
        self, headers: Mapping[str, str], body: bytes | None, metadata: Mapping[str, Mapping[str, object]]
    ) -> Outcome | Awaitable[Outcome]:
        # Synchronous today (the grpc layer's fast path); an awaitable outcome is also accepted by the driver.
        d = self.d
        self.started = d.clock()
        ctx = None
        try:
            ctx, parsed = d.build(headers, body, metadata)
            result = d.schedule(ctx)
        except SchedulingError as err:
            model = ctx.request.model if ctx else ""
            target = ctx.request.target_model if ctx else ""
            d.metrics.request_error(model, target, err.code.value)
            return error_outcome(err)
        except Exception as exc:  # never crash a stream: a bug becomes a clear 500
            log.exception("scheduling failed")
            d.metrics.request_error("", "", ErrorCode.INTERNAL.value)
            return error_outcome(SchedulingError(ErrorCode.INTERNAL, f"scheduling failed: {exc}"))
        req = ctx.request
        # Commit: from here on, close() must release what this adds.
        self.ctx, self.result, self.scheduler = ctx, result, d.scheduler
        self._ticket = d.datastore.inflight.add(result.primary.key, req.estimated_tokens)  # seen at once
        if d.config.defer_commit_hooks:
            d.defer(self._pre_request)
        else:
            self._pre_request()
        d.metrics.request_started(req.model, req.target_model, req.priority)
        if result.decision:
            d.metrics.disagg_decision(req.target_model, result.decision)
        if d.config.log_decisions:
            log.info("decision %s model=%s -> %s%s (profile %s)", req.request_id[:8], req.target_model or "-",
                     result.primary.key, f" prefill={result.prefill.key}" if result.prefill else "", result.profile)
        if req.model and req.target_model != req.model:
            self._rewrite_from = f'"model":"{req.target_model}"'.encode()
            self._rewrite_to = f'"model":"{req.model}"'.encode()
        return d.mutations(ctx, result, parsed)

    def _pre_request(self) -> None:
        if self.scheduler is None or self.ctx is None or self.result is None:
            return
        try:
            self.scheduler.pre_request(self.ctx, self.result)
        except Exception:
            log.exception("pre_request hook failed")

    def response_headers(
        self, headers: Mapping[str, str], metadata: Mapping[str, Mapping[str, object]]
    ) -> list[tuple[str, str]]:
        self.scanner = UsageScanner(headers.get("content-type", ""))
        lb = metadata.get(LB_NS)
        if lb is not None and isinstance(lb.get(SERVED), str):
            self.served = lb[SERVED]
        out: list[tuple[str, str]] = []
        if self.result is not None and self.result.response_headers:
            out.extend(self.result.response_headers.items())  # e.g. a session token set by a stateful plugin
        if self.d.config.conformance:
            served = self.served or (self.result.primary.key if self.result else "")
            if served:
                out.append((CONFORMANCE_RESP, served))
        return out

    def response_body(self, chunk: bytes, end_of_stream: bool) -> bytes:
        if self.scanner is None:
            self.scanner = UsageScanner()
        self.scanner.feed(chunk, end_of_stream)
        if self._rewrite_from is not None and self._rewrite_to is not None:
            chunk = chunk.replace(self._rewrite_from, self._rewrite_to).replace(
                self._rewrite_from.replace(b":", b": ", 1), self._rewrite_to.replace(b":", b": ", 1)
            )
        return chunk

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self.ctx is None or self.result is None:
            return
        d = self.d
        if d._deferred:  # this request's pre_request runs before its response_complete
            d.run_deferred()
        live = self._ticket is not None and d.datastore.inflight.remove(self._ticket)
        self.ctx.now = d.clock()  # plugins see the time the request ended
        try:
            # An endpoint that left while the request ran was already forgotten by every plugin: telling them how
            # the request ended would only bring its state back.
            if live and self.scheduler is not None:
                self.scheduler.response_complete(self.ctx, self.result)
        except Exception:
            log.exception("response_complete hook failed")
        usage = self.scanner.usage if self.scanner else None
        req = self.ctx.request
        d.metrics.request_finished(
            req.model,
            req.target_model,
            d.clock() - self.started,
            usage.prompt_tokens if usage else 0,
            usage.completion_tokens if usage else 0,
        )
