"""Kthena's routing documents (`networking.serving.volcano.sh/v1alpha1`) compiled onto the route model.

- ModelRoute -> Route: `modelName` and `loraAdapters` select it; `rules` are tried in order (first match wins;
  `modelMatch` headers exact/prefix/regex, uri, body.model; an empty match matches everything); `targetModels` split
  by `weight` (0-100, default 100) across ModelServers and ExternalModelProviders; `rateLimit` is parsed fully
  (epp/ratelimit enforces it); `parentRefs` are accepted and shown.
- ModelServer -> PoolBackend (backends.py).
- ExternalModelProvider -> ProviderBackend (backends.py).

Validation follows the CRD schema and Kthena's admission webhook; an error names the document, the field and what
was expected. Fields the schema has but Pointsman does not use are accepted (docs/coming-from-kthena.md says
which and why); unknown fields are errors (the API server prunes them, so they can only be typos in a file).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import datetime
from typing import Literal

from epp.routing.dialects.kthena.backends import parse_model_server, parse_provider
from epp.routing.model import (
    POOL,
    PROVIDER,
    UNIT_SECONDS,
    Match,
    PoolBackend,
    ProviderBackend,
    RateLimit,
    Route,
    Rule,
    StringMatch,
    Target,
    TargetKind,
)
from epp.routing.validate import Doc, document_name, join

GROUP = "networking.serving.volcano.sh"
API_VERSION = f"{GROUP}/v1alpha1"
MODEL_ROUTE, MODEL_SERVER, PROVIDER_KIND = "ModelRoute", "ModelServer", "ExternalModelProvider"
KINDS = (MODEL_ROUTE, MODEL_SERVER, PROVIDER_KIND)

Compiled = Route | PoolBackend | ProviderBackend
STRING_MATCHES: tuple[Literal["exact", "prefix", "regex"], ...] = ("exact", "prefix", "regex")


def _created(meta: Mapping[str, object]) -> float | None:
    ts = meta.get("creationTimestamp")
    if not ts:
        return None
    try:
        return datetime.fromisoformat(str(ts).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def compile_document(obj: object, where: str, position: float = 0.0) -> Compiled:
    """One Kthena document -> its compiled form. Raises RouteConfigError.

    `position` orders routes from files (earlier documents are older); in Kubernetes the creation time does."""
    doc = Doc(document_name(obj, where))
    top = doc.mapping(obj, "", ("apiVersion", "kind", "metadata", "spec", "status"), required=True)
    if top.get("apiVersion") != API_VERSION:
        raise doc.fail("apiVersion", f"{API_VERSION!r}, got {top.get('apiVersion')!r}")
    kind = doc.enum(top.get("kind"), "kind", KINDS)
    if kind is None:
        raise doc.fail("kind", f"one of {', '.join(KINDS)}")
    meta = doc.mapping(top.get("metadata"), "metadata", required=True)
    namespace, name = doc.object_ref(meta)
    key = f"{namespace}/{name}"
    spec_raw = top.get("spec")
    if kind == MODEL_ROUTE:
        created = _created(meta)
        return parse_model_route(doc, spec_raw, key, where, (created if created is not None else position, key))
    if kind == MODEL_SERVER:
        return parse_model_server(doc, spec_raw, key, namespace)
    ann = meta.get("annotations")
    annotations: Mapping[str, object] = ann if isinstance(ann, Mapping) else {}
    return parse_provider(doc, spec_raw, key, namespace, name, annotations)


# ---- ModelRoute ----------------------------------------------------------------------------------------------
def parse_model_route(doc: Doc, raw: object, key: str, where: str, order: tuple[float, str]) -> Route:
    spec = doc.mapping(raw, "spec", ("modelName", "loraAdapters", "parentRefs", "rules", "rateLimit"),
                       required=True)
    model = doc.string(spec.get("modelName"), "spec.modelName")
    adapters: list[str] = []
    for i, a in enumerate(doc.list(spec.get("loraAdapters"), "spec.loraAdapters", max_items=10)):
        adapters.append(doc.string(a, f"spec.loraAdapters[{i}]", required=True, what="an adapter name") or "")
    if not model and not adapters:
        raise doc.fail("spec", "modelName or loraAdapters (they cannot both be empty)")
    parents = tuple(_parent_ref(doc, r, f"spec.parentRefs[{i}]", key)
                    for i, r in enumerate(doc.list(spec.get("parentRefs"), "spec.parentRefs")))
    namespace = key.split("/", 1)[0]
    rules = tuple(_rule(doc, r, i, bool(adapters), namespace)
                  for i, r in enumerate(doc.list(spec.get("rules"), "spec.rules", max_items=16)))
    rate = _rate_limit(doc, spec.get("rateLimit")) if spec.get("rateLimit") is not None else None
    return Route(key=key, kind=MODEL_ROUTE, source=where, models=(model,) if model else (),
                 adapters=tuple(adapters), rules=rules, rate_limit=rate, parent_refs=parents, order=order)


def _parent_ref(doc: Doc, raw: object, path: str, route_key: str) -> str:
    ref = doc.mapping(raw, path, ("group", "kind", "namespace", "name", "sectionName", "port"))
    name = doc.string(ref.get("name"), join(path, "name"), required=True)
    ns = doc.string(ref.get("namespace"), join(path, "namespace")) or route_key.split("/", 1)[0]
    kind = doc.string(ref.get("kind"), join(path, "kind")) or "Gateway"
    doc.string(ref.get("group"), join(path, "group"))
    section = doc.string(ref.get("sectionName"), join(path, "sectionName"))
    doc.integer(ref.get("port"), join(path, "port"), lo=1, hi=65535)
    return f"{kind} {ns}/{name}" + (f" ({section})" if section else "")


def _rule(doc: Doc, raw: object, index: int, lora_route: bool, namespace: str) -> Rule:
    path = f"spec.rules[{index}]"
    r = doc.mapping(raw, path, ("name", "modelMatch", "targetModels"), required=True)
    name = doc.string(r.get("name"), join(path, "name")) or f"rule-{index}"
    match = _model_match(doc, r.get("modelMatch"), join(path, "modelMatch"))
    tpath = join(path, "targetModels")
    targets = tuple(_target(doc, t, f"{tpath}[{j}]", lora_route, namespace)
                    for j, t in enumerate(doc.list(r.get("targetModels"), tpath, min_items=1, max_items=16)))
    if sum(t.weight for t in targets) <= 0:
        raise doc.fail(tpath, "a total weight above 0 (every weight is 0)")
    return Rule(name=name, index=index, match=match, targets=targets)


def _model_match(doc: Doc, raw: object, path: str) -> Match:
    m = doc.mapping(raw, path, ("headers", "uri", "body"))
    headers = []
    hpath = join(path, "headers")
    for hname, sm in doc.mapping(m.get("headers"), hpath).items():
        if not isinstance(hname, str) or not hname:
            raise doc.fail(hpath, f"header names, got {hname!r}")
        headers.append((hname.lower(), _string_match(doc, sm, join(hpath, hname))))
    uri = _string_match(doc, m.get("uri"), join(path, "uri")) if m.get("uri") is not None else None
    body = doc.mapping(m.get("body"), join(path, "body"), ("model",))
    body_model = doc.string(body.get("model"), join(path, "body.model"))
    return Match(headers=tuple(sorted(headers)), uri=uri, body_model=body_model)


def _string_match(doc: Doc, raw: object, path: str) -> StringMatch:
    sm = doc.mapping(raw, path, ("exact", "prefix", "regex"), required=True)
    given = [k for k in STRING_MATCHES if sm.get(k) is not None]
    if len(given) > 1:
        raise doc.fail(path, f"only one of exact, prefix, regex (got {', '.join(given)})")
    if not given:
        return StringMatch("any")
    kind = given[0]
    value = sm[kind]
    if not isinstance(value, str):
        raise doc.fail(join(path, kind), f"a string, got {value!r}")
    if kind == "regex":
        try:
            pattern = re.compile(value)
        except re.error as e:
            raise doc.fail(join(path, kind), f"a valid regular expression ({e})") from None
        return StringMatch("regex", value, pattern)
    return StringMatch(kind, value)


def _target(doc: Doc, raw: object, path: str, lora_route: bool, namespace: str) -> Target:
    t = doc.mapping(raw, path, ("modelServerName", "externalModelProviderName", "weight"), required=True)
    server = doc.string(t.get("modelServerName"), join(path, "modelServerName"))
    provider = doc.string(t.get("externalModelProviderName"), join(path, "externalModelProviderName"))
    if bool(server) == bool(provider):
        raise doc.fail(path, "exactly one of modelServerName or externalModelProviderName")
    if provider and lora_route:
        raise doc.fail(join(path, "externalModelProviderName"), "modelServerName: routes with loraAdapters "
                                                                 "must target ModelServers")
    weight = doc.integer(t.get("weight"), join(path, "weight"), lo=0, hi=100, default=100)
    assert weight is not None
    kind: TargetKind = POOL if server else PROVIDER
    return Target(kind, f"{namespace}/{server or provider}", weight)


def _rate_limit(doc: Doc, raw: object) -> RateLimit:
    path = "spec.rateLimit"
    r = doc.mapping(raw, path, ("inputTokensPerUnit", "outputTokensPerUnit", "unit", "global"))
    inp = doc.integer(r.get("inputTokensPerUnit"), join(path, "inputTokensPerUnit"), lo=1)
    out = doc.integer(r.get("outputTokensPerUnit"), join(path, "outputTokensPerUnit"), lo=1)
    unit = doc.enum(r.get("unit"), join(path, "unit"), UNIT_SECONDS, default="second") or "second"
    redis = None
    if r.get("global") is not None:
        g = doc.mapping(r.get("global"), join(path, "global"), ("redis",))
        rc = doc.mapping(g.get("redis"), join(path, "global.redis"), ("address",), required=True)
        apath = join(path, "global.redis.address")
        redis = doc.string(rc.get("address"), apath, required=True, what="a Redis address host:port")
        assert redis is not None
        host, sep, port = redis.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise doc.fail(apath, f"a Redis address host:port, got {redis!r}")
    return RateLimit(inp, out, unit, UNIT_SECONDS[unit], redis)
