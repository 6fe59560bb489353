"""Kthena's ModelServer and ExternalModelProvider documents compiled onto PoolBackend / ProviderBackend.

ModelServer:
- `model` overwrites the request's model for the engine (the client sees its own name back);
- `inferenceEngine` vLLM | SGLang chooses the metrics mapping (the endpoint label llm-d.ai/engine-type);
- exactly one of `workloadSelector.matchLabels` (pods, with `workloadPort.port`) and `endpoints` (static
  instances; `workloadPort.port` is the default port, and may be omitted when every endpoint has one);
- `workloadSelector.pdGroup` gives prefill/decode roles by labels and pairs them by the `groupKey` label's value;
- `trafficPolicy.sessionSticky` (sources Header | Query | Cookie | JWTClaim, first non-empty wins;
  `sessionAffinitySeconds` idle TTL, default 300) and `trafficPolicy.retry.attempts` (fallback endpoints).
ExternalModelProvider: `providerType` OpenAI | Anthropic, `baseURL` (https only), `model`, `insecureSkipVerify`,
`auth` (scheme Bearer | APIKey, a Secret key), static `headers` (never credentials or hop-by-hop headers).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from urllib.parse import urlsplit

from epp.routing.model import (
    AUTH_SCHEMES,
    PROVIDER_TYPES,
    AuthScheme,
    PDPairing,
    PoolBackend,
    ProviderAuth,
    ProviderBackend,
    StaticEndpoint,
    Sticky,
)
from epp.routing.validate import DNS_SUBDOMAIN, HEADER_NAME, Doc, join

ENGINES = {"vLLM": "vllm", "SGLang": "sglang"}
STICKY_TYPES = {"Header": "header", "Query": "query", "Cookie": "cookie", "JWTClaim": "jwtClaim"}
DEFAULT_STICKY_TTL = 300
# Headers a static provider header may never set: credentials, routing and hop-by-hop (as Kthena's webhook).
RESERVED_HEADERS = frozenset(h.lower() for h in (
    "Authorization", "Proxy-Authorization", "Cookie", "X-API-Key", "Host", "Content-Length", "Connection",
    "Keep-Alive", "Proxy-Connection", "Transfer-Encoding", "Upgrade", "Trailer", "TE",
))
CLUSTER_ANNOTATION = "pointsman.io/envoy-cluster"
_DURATION = re.compile(r"^([0-9]+(\.[0-9]+)?(ns|us|µs|ms|s|m|h))+$")


def _duration(doc: Doc, value: object, path: str) -> None:
    if value is not None and (not isinstance(value, str) or not _DURATION.match(value)):
        raise doc.fail(path, f"a duration like 100ms or 10s, got {value!r}")


# ---- ModelServer ---------------------------------------------------------------------------------------------
def parse_model_server(doc: Doc, raw: object, key: str, namespace: str) -> PoolBackend:
    spec = doc.mapping(raw, "spec", ("model", "inferenceEngine", "workloadSelector", "endpoints", "workloadPort",
                                     "trafficPolicy", "kvConnector"), required=True)
    model = doc.string(spec.get("model"), "spec.model", max_len=256)
    engine = doc.enum(spec.get("inferenceEngine"), "spec.inferenceEngine", ENGINES)
    if engine is None:
        raise doc.fail("spec.inferenceEngine", f"one of {', '.join(ENGINES)} (it is required)")
    sel = doc.mapping(spec.get("workloadSelector"), "spec.workloadSelector", ("matchLabels", "pdGroup"))
    match_labels = doc.labels(sel.get("matchLabels"), "spec.workloadSelector.matchLabels")
    pd = _pd_group(doc, sel.get("pdGroup")) if sel.get("pdGroup") is not None else None
    endpoints = _endpoints(doc, spec.get("endpoints"))
    if bool(match_labels) == bool(endpoints):
        raise doc.fail("spec", "exactly one of workloadSelector.matchLabels and endpoints "
                               f"({'both are' if endpoints else 'neither is'} set)")
    port_raw = spec.get("workloadPort")
    wp = doc.mapping(port_raw, "spec.workloadPort", ("port", "protocol"))
    port = doc.integer(wp.get("port"), "spec.workloadPort.port", lo=1, hi=65535)
    protocol = doc.enum(wp.get("protocol"), "spec.workloadPort.protocol", ("http", "https"), default="http")
    if port is None:
        if match_labels:
            raise doc.fail("spec.workloadPort.port", "the pods' port 1-65535 (required with workloadSelector)")
        missing = [i for i, e in enumerate(endpoints) if e.port == 0]
        if missing:
            raise doc.fail(f"spec.endpoints[{missing[0]}].port",
                           "a port 1-65535, or spec.workloadPort.port as the default")
    if port is not None:
        endpoints = tuple(e if e.port else StaticEndpoint(e.name, e.address, port, e.labels) for e in endpoints)
    sticky, retries = _traffic_policy(doc, spec.get("trafficPolicy"))
    kv = doc.mapping(spec.get("kvConnector"), "spec.kvConnector", ("type",))
    doc.enum(kv.get("type"), "spec.kvConnector.type", ("http", "lmcache", "nixl", "mooncake"))
    return PoolBackend(
        key=key, kind="ModelServer", namespace=namespace, model=model, engine=ENGINES[engine],
        selector=match_labels or None, port=port, protocol=protocol or "http", endpoints=endpoints, pd=pd,
        sticky=sticky, retries=retries,
    )


def _pd_group(doc: Doc, raw: object) -> PDPairing:
    path = "spec.workloadSelector.pdGroup"
    g = doc.mapping(raw, path, ("groupKey", "prefillLabels", "decodeLabels"))
    group_key = doc.string(g.get("groupKey"), join(path, "groupKey"), required=True, what="a label key")
    assert group_key is not None
    prefill = doc.labels(g.get("prefillLabels"), join(path, "prefillLabels"), non_empty=True)
    decode = doc.labels(g.get("decodeLabels"), join(path, "decodeLabels"), non_empty=True)
    return PDPairing(group_key, prefill, decode)


def _endpoints(doc: Doc, raw: object) -> tuple[StaticEndpoint, ...]:
    out: list[StaticEndpoint] = []
    seen: set[str] = set()
    for i, e in enumerate(doc.list(raw, "spec.endpoints", max_items=1024)):
        path = f"spec.endpoints[{i}]"
        m = doc.mapping(e, path, ("name", "address", "port", "labels"), required=True)
        name = doc.string(m.get("name"), join(path, "name"), required=True, max_len=253, pattern=DNS_SUBDOMAIN,
                          what="a DNS-1123 name")
        assert name is not None
        if name in seen:
            raise doc.fail(join(path, "name"), f"a name unique within the ModelServer ({name!r} repeats)")
        seen.add(name)
        address = doc.string(m.get("address"), join(path, "address"), required=True, max_len=253,
                             what="an IP address or DNS name")
        assert address is not None
        port = doc.integer(m.get("port"), join(path, "port"), lo=1, hi=65535) or 0
        labels = doc.labels(m.get("labels"), join(path, "labels"))
        out.append(StaticEndpoint(name, address.strip("[]"), port, labels))
    return tuple(out)


def _traffic_policy(doc: Doc, raw: object) -> tuple[Sticky | None, int]:
    path = "spec.trafficPolicy"
    tp = doc.mapping(raw, path, ("retry", "connectionPool", "sessionSticky", "timeout"))
    _duration(doc, tp.get("timeout"), join(path, "timeout"))
    retry = doc.mapping(tp.get("retry"), join(path, "retry"), ("attempts", "retryInterval"))
    attempts = doc.integer(retry.get("attempts"), join(path, "retry.attempts"), lo=0, default=0) or 0
    _duration(doc, retry.get("retryInterval"), join(path, "retry.retryInterval"))
    cp = doc.mapping(tp.get("connectionPool"), join(path, "connectionPool"),
                     ("maxIdleConnections", "maxIdleConnectionsPerHost", "maxConnectionsPerHost"))
    for k, v in cp.items():
        doc.integer(v, join(path, f"connectionPool.{k}"), lo=0)
    sticky = None
    if tp.get("sessionSticky") is not None:
        spath = join(path, "sessionSticky")
        s = doc.mapping(tp.get("sessionSticky"), spath, ("sessionAffinitySeconds", "sources"))
        ttl = doc.integer(s.get("sessionAffinitySeconds"), join(spath, "sessionAffinitySeconds"), lo=1,
                          default=DEFAULT_STICKY_TTL)
        sources = []
        for i, src in enumerate(doc.list(s.get("sources"), join(spath, "sources"), min_items=1, max_items=16)):
            p = f"{spath}.sources[{i}]"
            m = doc.mapping(src, p, ("type", "name"), required=True)
            kind = doc.enum(m.get("type"), join(p, "type"), STICKY_TYPES)
            if kind is None:
                raise doc.fail(join(p, "type"), f"one of {', '.join(STICKY_TYPES)} (it is required)")
            name = doc.string(m.get("name"), join(p, "name"), required=True,
                              what="a header, query, cookie or claim name")
            assert name is not None
            sources.append((STICKY_TYPES[kind], name.lower() if kind == "Header" else name))
        sticky = Sticky(tuple(sources), float(ttl or DEFAULT_STICKY_TTL))
    return sticky, attempts


# ---- ExternalModelProvider -----------------------------------------------------------------------------------
def parse_provider(doc: Doc, raw: object, key: str, namespace: str, name: str,
                   annotations: Mapping[str, object]) -> ProviderBackend:
    spec = doc.mapping(raw, "spec", ("providerType", "model", "baseURL", "insecureSkipVerify", "auth", "headers"),
                       required=True)
    ptype = doc.enum(spec.get("providerType"), "spec.providerType", PROVIDER_TYPES, default="OpenAI")
    model = doc.string(spec.get("model"), "spec.model", max_len=256)
    base = doc.string(spec.get("baseURL"), "spec.baseURL", required=True, what="an https:// URL")
    assert base is not None
    u = urlsplit(base)
    try:
        port = u.port or 443
    except ValueError:
        raise doc.fail("spec.baseURL", f"an https:// URL with a valid port, got {base!r}") from None
    if u.scheme != "https" or not u.hostname:
        raise doc.fail("spec.baseURL", f"an https:// URL with a host (external providers must use HTTPS), "
                                       f"got {base!r}")
    if u.username or u.password or u.query or u.fragment or base.endswith("?") or "#" in base:
        raise doc.fail("spec.baseURL", "an https:// URL without userinfo, query or fragment")
    insecure = doc.boolean(spec.get("insecureSkipVerify"), "spec.insecureSkipVerify")
    auth = _auth(doc, spec.get("auth"), ptype or "OpenAI") if spec.get("auth") is not None else None
    headers = []
    for hname, value in doc.mapping(spec.get("headers"), "spec.headers").items():
        hpath = join("spec.headers", str(hname))
        if not isinstance(hname, str) or not HEADER_NAME.match(hname):
            raise doc.fail(hpath, f"a valid header name, got {hname!r}")
        if hname.lower() in RESERVED_HEADERS or hname.lower().startswith(":"):
            raise doc.fail(hpath, "a non-reserved header (credentials, Host and hop-by-hop headers cannot be "
                                  "static headers)")
        if not isinstance(value, str) or "\r" in value or "\n" in value or "\x00" in value:
            raise doc.fail(hpath, "a string value without CR, LF or NUL")
        headers.append((hname.lower(), value))
    cluster = annotations.get(CLUSTER_ANNOTATION)
    if cluster is not None and (not isinstance(cluster, str) or not re.match(r"^[A-Za-z0-9_.\-]+$", cluster)):
        raise doc.fail(f"metadata.annotations[{CLUSTER_ANNOTATION}]", f"an Envoy cluster name, got {cluster!r}")
    return ProviderBackend(
        key=key, kind="ExternalModelProvider", namespace=namespace, provider_type=ptype,
        base_url=base, host=u.hostname, port=port, base_path=u.path.rstrip("/"), model=model,
        insecure_skip_verify=insecure, headers=tuple(sorted(headers)), auth=auth,
        cluster=cluster or f"provider.{namespace}.{name}",
    )


def _auth(doc: Doc, raw: object, ptype: str) -> ProviderAuth:
    a = doc.mapping(raw, "spec.auth", ("scheme", "secretRef"))
    default: AuthScheme = "Bearer" if ptype == "OpenAI" else "APIKey"
    scheme = doc.enum(a.get("scheme"), "spec.auth.scheme", AUTH_SCHEMES, default=default) or default
    ref = doc.mapping(a.get("secretRef"), "spec.auth.secretRef", ("name", "key", "optional"), required=True)
    sname = doc.string(ref.get("name"), "spec.auth.secretRef.name", required=True, pattern=DNS_SUBDOMAIN,
                       what="a Secret name")
    skey = doc.string(ref.get("key"), "spec.auth.secretRef.key", required=True, what="a key of the Secret")
    if doc.boolean(ref.get("optional"), "spec.auth.secretRef.optional"):
        raise doc.fail("spec.auth.secretRef.optional", "false or unset (a provider credential is not optional)")
    assert sname is not None and skey is not None
    return ProviderAuth(scheme, sname, skey)
