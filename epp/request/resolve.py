"""The resolve stage: from Envoy's request headers, body and metadata to the scheduling context.

In order: the API kind and the body (model, prompt); the routing layer (route -> rule -> target: a pool, or an
external provider); the model rewrite (a routed engine model, `x-gateway-model-name-rewrite`, or an
InferenceModelRewrite; llm-d's `x-llm-d-model-name-rewrite` first); the objective's priority
(`x-llm-d-inference-objective`, else `x-gateway-inference-objective`); the pool (epp/request/pool_select.py) and its candidates (in
rotation, the subset hint, the conformance header, the route's P/D pairing and sticky session). Bad input or no
candidate raises `SchedulingError`, which the exchange answers.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from epp.request.context import (
    CONFORMANCE_REQ,
    MODEL_REWRITE_HEADERS,
    OBJECTIVE_HEADERS,
    SUBSET,
    SUBSET_NS,
    ShellContext,
    first_header,
)
from epp.request.parsing import ParsedBody, api_kind, parse_body
from epp.request.pool_select import choose_pool
from epp.request.streaming import StreamingBody
from scheduling.types import ApiKind, Endpoint, ErrorCode, LLMRequest, SchedulingError

if TYPE_CHECKING:
    from epp.request.director import Director
    from epp.routing import RouteDecision

Metadata = Mapping[str, Mapping[str, object]]


def _parse(kind: ApiKind, body: bytes | memoryview | StreamingBody) -> ParsedBody:
    return body.finish() if isinstance(body, StreamingBody) else parse_body(kind, body)


def read_body(kind: ApiKind, headers: Mapping[str, str], body: bytes | memoryview | StreamingBody | None,
              early: str | None) -> tuple[dict[str, Any] | None, str, str, bool]:
    """(the parsed body, its model, its prompt, whether it holds media) as far as the decision sees them (see
    `resolve`); SchedulingError for a body that does not parse or a POST of a known API without one."""
    parsed_body: dict[str, Any] | None = None
    model, prompt, media = "", "", False
    if early is not None and isinstance(body, StreamingBody):
        parsed_body, model, (prompt, media) = body.partial(), early, body.head()
    elif body:
        if kind is ApiKind.OTHER:
            try:
                p = _parse(kind, body)
                parsed_body, model = p.body, p.model
            except SchedulingError:
                pass  # an unknown API with a non-JSON or model-less body is routed on load alone
        else:
            p = _parse(kind, body)
            parsed_body, model, prompt, media = p.body, p.model, p.prompt, p.media
    elif body is not None and kind is not ApiKind.OTHER and headers.get(":method", "POST").upper() == "POST":
        raise SchedulingError(ErrorCode.BAD_REQUEST, f"{kind.value} request has no body")
    return parsed_body, model, prompt, media


def resolve(d: Director, headers: Mapping[str, str], body: bytes | memoryview | StreamingBody | None,
            metadata: Metadata, *, dry_run: bool = False, early: str | None = None,
            expected_chars: int = 0) -> tuple[ShellContext, dict[str, Any] | None]:
    """Parse and resolve; raise SchedulingError for bad input or no candidates.

    `body` None means a body exists but is not visible before the pick: route on headers and load alone. A
    `StreamingBody` was read as it arrived; with `early` (the model to use, epp/request/early.py) it has not ended:
    the decision sees the members that have arrived and the prompt's head, and estimates the prompt's length as
    `expected_chars`."""
    kind = api_kind(headers)
    parsed_body, model, prompt, media = read_body(kind, headers, body, early)
    target = model
    # ---- routing layer: route -> rule -> target (a pool to schedule in, or an external provider) ----------
    router = d.router
    route = router.decide(headers, model, now=d.clock(), dry_run=dry_run, metadata=metadata,
                          body=parsed_body) if router is not None else None
    forced = first_header(headers, MODEL_REWRITE_HEADERS)
    if route is not None:
        target = route.engine_model or model
    elif forced:
        target = forced
    elif model and d.rewrite is not None:
        target = d.rewrite(model) or model
    objective = first_header(headers, OBJECTIVE_HEADERS)
    ds = d.datastore
    priority = ds.objectives.get(objective, 0) if objective else 0
    base = route.base_model if route is not None and route.base_model else ds.adapters.get(target)
    req = LLMRequest(
        request_id=headers.get("x-request-id") or str(uuid.uuid4()),
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
        expected_prompt_chars=expected_chars if early is not None else 0,
        media=media,
    )
    if d.sessions is not None:  # agent sessions: known before any hashing (epp/request/sessions.py)
        d.sessions.identify(req, route, count=not dry_run)
    pool = ""
    if route is not None and route.provider is not None:
        candidates: list[Endpoint] = []  # an external provider: no endpoint to schedule
    else:
        pool = resolve_pool(d, metadata, route=route, model=target) or ""
        candidates = find_candidates(d, headers, metadata, route=route, pool=pool)
    ctx = ShellContext(req, candidates, ds.inflight.view(), d.clock(), route=route, pool=pool)
    return ctx, parsed_body


def refresh(d: Director, ctx: ShellContext, headers: Mapping[str, str], metadata: Metadata) -> ShellContext:
    """A queued request's context when its turn comes: its candidates on the pool as it is now, the in-flight view
    and the clock taken afresh; SchedulingError when no candidate is left."""
    cands = find_candidates(d, headers, metadata, route=ctx.route, pool=ctx.pool)
    return ShellContext(ctx.request, cands, d.datastore.inflight.view(), d.clock(), route=ctx.route, pool=ctx.pool)


def resolve_pool(d: Director, metadata: Metadata, *, route: RouteDecision | None = None,
                 model: str = "") -> str | None:
    """The pool a request schedules in: its route's, else Envoy's route metadata, else the pool chooser's."""
    if route is not None:
        pool: str | None = route.pool_name
        return pool
    ns, key = d.config.pool_metadata_key
    named = metadata.get(ns, {}).get(key)
    if isinstance(named, str) and named:
        return named
    hint = metadata.get(SUBSET_NS)
    ds = d.datastore  # several pools may share this Pointsman: see epp/request/pool_select.py
    return choose_pool(ds, default=d.config.default_pool or ds.default_pool, model=model,
                       hint=split_list(hint[SUBSET]) if hint is not None and SUBSET in hint else None,
                       exclude=d.router.materializer.names if d.router is not None else ())


def find_candidates(d: Director, headers: Mapping[str, str], metadata: Metadata, *,
                    route: RouteDecision | None = None, pool: str | None = None) -> list[Endpoint]:
    """The endpoints of `pool` (see resolve_pool) this request may go to; SchedulingError when none."""
    ds = d.datastore
    snap = ds.snapshot(pool)
    if snap is None:
        if route is not None and route.pool is not None:
            raise SchedulingError(ErrorCode.SERVICE_UNAVAILABLE,
                                  f"{route.pool.kind} {route.pool.key} has no endpoints")
        ns, key = d.config.pool_metadata_key
        known = ", ".join(ds.pool_names())
        raise SchedulingError(
            ErrorCode.SERVICE_UNAVAILABLE,
            f"no inference pool {pool or ''!r} known" if pool or not known else
            f"cannot tell which inference pool serves this request (pools: {known}); name it with Envoy "
            f"route metadata {ns}.{key}",
        )
    # Scrape failures and passive health take endpoints out of rotation (all of them stay when all are out).
    eps = ds.in_rotation(snap.endpoints)
    hint = metadata.get(SUBSET_NS)
    if hint is not None and SUBSET in hint:
        eps = restrict(eps, split_list(hint[SUBSET]), ip_only=True)
        if not eps:
            raise SchedulingError(ErrorCode.SERVICE_UNAVAILABLE, "no endpoint in the subset hint")
    if d.config.conformance and headers.get(CONFORMANCE_REQ):
        eps = restrict(eps, split_list(headers[CONFORMANCE_REQ]), ip_only=False)
    if not eps:
        raise SchedulingError(ErrorCode.SERVICE_UNAVAILABLE, "no candidate endpoints in the inference pool")
    if route is not None:
        eps = route.narrow(eps, d.clock())  # P/D pairing, sticky sessions
    return eps


def split_list(value: object) -> list[str]:
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
