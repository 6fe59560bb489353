"""A ModelRouter's `spec.backends[]`, compiled onto the routing layer's backends.

- `inferenceServiceRef` -> a PoolBackend (kind InferenceService): the InferenceService's pods, which LLMKube labels
  `inference.llmkube.dev/service: <name>`, on port 8080 (LLMKube's default; annotation
  `pointsman.io/service-ports: "<service>=<port>,..."` for a service with `spec.endpoint.port`). Standalone,
  the pool of the same name in `--endpoints-file` holds its endpoints.
- `external` -> a ProviderBackend: `provider` openai | litellm | bedrock | vertex_ai speak OpenAI's API,
  anthropic takes LLMKube's OpenAI-shaped chat completions and its native /v1/messages, with `x-api-key` and
  `anthropic-version`; `url` (default https://api.anthropic.com / https://api.openai.com; required for the
  others), `model` overwrites the request's model, `credentialsSecretRef` names the Secret whose conventional key
  (ANTHROPIC_API_KEY, OPENAI_API_KEY, LITELLM_MASTER_KEY, AWS_ACCESS_KEY_ID, GOOGLE_APPLICATION_CREDENTIALS) is
  the credential.
- `tier` (local for inferenceServiceRef, cloud for external by default; a cloud InferenceService is refused),
  `capabilities`, `weight` (default 1), `timeout`, `costPerMillionTokens`, `displayName`, `balancing`.
- Accepted and not used: `endpointPicker`, `healthCheck`, `modelInfo`, `resolution` (Pointsman always picks the
  pod; see docs/coming-from-llmkube.md).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from urllib.parse import urlsplit

from epp.ratelimit import Price, parse_usd
from epp.routing.dialects.llmkube.model import (
    DEFAULT_SERVICE_PORT,
    SERVICE_LABEL,
    TIERS,
    Balancing,
    PrefixAffinity,
    RouterBackend,
    SessionAffinity,
    Tier,
)
from epp.routing.model import POOL, PROVIDER, PoolBackend, ProviderAuth, ProviderBackend, Target
from epp.routing.validate import DNS_SUBDOMAIN, HEADER_NAME, Doc, join

NAME = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}$")
PORTS_ANNOTATION = "pointsman.io/service-ports"
PROVIDERS = ("anthropic", "openai", "bedrock", "vertex_ai", "litellm")
DEFAULT_URLS = {"anthropic": "https://api.anthropic.com", "openai": "https://api.openai.com"}
CREDENTIAL_KEYS = {"anthropic": "ANTHROPIC_API_KEY", "openai": "OPENAI_API_KEY", "litellm": "LITELLM_MASTER_KEY",
                   "bedrock": "AWS_ACCESS_KEY_ID", "vertex_ai": "GOOGLE_APPLICATION_CREDENTIALS"}
ANTHROPIC_VERSION = "2023-06-01"
ANTHROPIC_PATHS = ("/v1/chat/completions", "/v1/messages")
_DURATION_PART = re.compile(r"([0-9]+(?:\.[0-9]*)?|\.[0-9]+)(ns|us|µs|ms|s|m|h)")
_UNIT_S = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
BACKEND_FIELDS = ("name", "tier", "inferenceServiceRef", "external", "capabilities", "weight", "timeout",
                  "costPerMillionTokens", "displayName", "balancing", "endpointPicker", "healthCheck", "modelInfo",
                  "resolution")


def duration(doc: Doc, value: object, path: str, *, lo: float | None = None, hi: float | None = None,
             zero: bool = False) -> float | None:
    """A Go duration ("15s", "1m30s", "500ms") in seconds, within [lo, hi] (a zero duration passes when `zero`)."""
    if value is None or value == "":
        return None
    text = value if isinstance(value, str) else ""
    pos, total = 0, 0.0
    for m in _DURATION_PART.finditer(text):
        if m.start() != pos:
            break
        total += float(m.group(1)) * _UNIT_S[m.group(2)]
        pos = m.end()
    if not text or pos != len(text):
        if text in ("0",):
            total, pos = 0.0, 1
        else:
            raise doc.fail(path, f"a duration like 500ms, 15s or 1m30s, got {value!r}")
    if total == 0 and zero:
        return 0.0
    if (lo is not None and total < lo) or (hi is not None and total > hi):
        raise doc.fail(path, f"a duration between {_show_s(lo)} and {_show_s(hi)}, got {value!r}")
    return total


def _show_s(x: float | None) -> str:
    if x is None:
        return "-"
    if x >= 3600 and x % 3600 == 0:
        return f"{x / 3600:g}h"
    if x >= 60 and x % 60 == 0:
        return f"{x / 60:g}m"
    return f"{x * 1000:g}ms" if x < 1 else f"{x:g}s"


def service_ports(doc: Doc, annotations: Mapping[str, object]) -> dict[str, int]:
    raw = annotations.get(PORTS_ANNOTATION)
    if raw is None:
        return {}
    path = f"metadata.annotations[{PORTS_ANNOTATION}]"
    out: dict[str, int] = {}
    for part in str(raw).split(","):
        name, sep, port = part.strip().partition("=")
        if not sep or not name.strip() or not port.strip().isdigit() or not 0 < int(port) < 65536:
            raise doc.fail(path, f"a comma list of <InferenceService>=<port>, got {raw!r}")
        out[name.strip()] = int(port)
    return out


def parse_backend(doc: Doc, raw: object, i: int, namespace: str, router: str, ports: Mapping[str, int],
                  warnings: list[str]) -> tuple[RouterBackend, PoolBackend | ProviderBackend]:
    path = f"spec.backends[{i}]"
    b = doc.mapping(raw, path, BACKEND_FIELDS, required=True)
    name = doc.string(b.get("name"), join(path, "name"), required=True, pattern=NAME, what="a backend name")
    assert name is not None
    local_ref = b.get("inferenceServiceRef")
    external = b.get("external")
    if (local_ref is None) == (external is None):
        raise doc.fail(path, "exactly one of inferenceServiceRef or external "
                             f"({'both are' if local_ref is not None else 'neither is'} set)")
    default_tier: Tier = "local" if local_ref is not None else "cloud"
    tier = doc.enum(b.get("tier"), join(path, "tier"), TIERS, default=default_tier)
    if local_ref is not None and tier == "cloud":
        raise doc.fail(join(path, "tier"), "local for a backend with inferenceServiceRef (tier=cloud is invalid "
                                           "for an in-cluster InferenceService)")
    caps = frozenset(doc.string(c, f"{path}.capabilities[{j}]", required=True, what="a capability") or ""
                     for j, c in enumerate(doc.list(b.get("capabilities"), join(path, "capabilities"))))
    weight = doc.integer(b.get("weight"), join(path, "weight"), lo=0, hi=2**31 - 1, default=1)
    timeout = duration(doc, b.get("timeout"), join(path, "timeout"), lo=0.1, hi=1800.0)
    price = _price(doc, b.get("costPerMillionTokens"), join(path, "costPerMillionTokens"))
    display = doc.string(b.get("displayName"), join(path, "displayName"), max_len=253)
    resolution = doc.enum(b.get("resolution"), join(path, "resolution"), ("service", "endpoint"), default="service")
    _accepted(doc, b, path)
    compiled: PoolBackend | ProviderBackend
    if local_ref is not None:
        ref = doc.mapping(local_ref, join(path, "inferenceServiceRef"), ("name",), required=True)
        svc = doc.string(ref.get("name"), join(path, "inferenceServiceRef.name"), required=True,
                         pattern=DNS_SUBDOMAIN, what="an InferenceService name")
        assert svc is not None
        compiled = PoolBackend(key=f"InferenceService/{namespace}/{svc}", kind="InferenceService",
                               namespace=namespace, selector={SERVICE_LABEL: svc},
                               port=ports.get(svc, DEFAULT_SERVICE_PORT),
                               pool_name=f"inferenceservice:{namespace}/{svc}")
        target = Target(POOL, compiled.key, weight or 0)
    else:
        svc = None
        compiled = _external(doc, external, join(path, "external"), namespace, router, name)
        target = Target(PROVIDER, compiled.key, weight or 0)
    balancing = _balancing(doc, b.get("balancing"), join(path, "balancing"), local_ref is not None, resolution,
                           name, warnings)
    backend = RouterBackend(name=name, target=target, tier=tier, published=display or name,
                            capabilities=caps, weight=weight or 0, timeout_s=timeout, price=price, service=svc,
                            balancing=balancing)
    return backend, compiled


def _price(doc: Doc, raw: object, path: str) -> Price | None:
    if raw is None:
        return None
    c = doc.mapping(raw, path, ("promptUSD", "completionUSD"))
    values = []
    for k in ("promptUSD", "completionUSD"):
        v = c.get(k)
        if v is None:
            values.append(0.0)
            continue
        try:
            values.append(parse_usd(v if isinstance(v, str) else str(v), k))
        except ValueError:
            raise doc.fail(join(path, k), f"a decimal number of USD like \"3.00\", got {v!r}") from None
    return Price(values[0], values[1])


def _accepted(doc: Doc, b: Mapping[str, object], path: str) -> None:
    """Fields Pointsman accepts and does not use: their shape is still checked, so a typo shows."""
    ep = doc.mapping(b.get("endpointPicker"), join(path, "endpointPicker"), ("service",))
    if ep.get("service") is not None:
        svc = doc.mapping(ep.get("service"), join(path, "endpointPicker.service"), ("name", "port"), required=True)
        doc.string(svc.get("name"), join(path, "endpointPicker.service.name"), required=True)
        doc.integer(svc.get("port"), join(path, "endpointPicker.service.port"), lo=1, hi=65535)
    hc = doc.mapping(b.get("healthCheck"), join(path, "healthCheck"), ("intervalSeconds", "path", "timeoutSeconds"))
    doc.integer(hc.get("intervalSeconds"), join(path, "healthCheck.intervalSeconds"), lo=1)
    doc.integer(hc.get("timeoutSeconds"), join(path, "healthCheck.timeoutSeconds"), lo=1)
    doc.string(hc.get("path"), join(path, "healthCheck.path"))
    mi = doc.mapping(b.get("modelInfo"), join(path, "modelInfo"),
                     ("contextLength", "inputModalities", "outputModalities"))
    doc.integer(mi.get("contextLength"), join(path, "modelInfo.contextLength"), lo=1)
    doc.list(mi.get("inputModalities"), join(path, "modelInfo.inputModalities"), max_items=5)
    doc.list(mi.get("outputModalities"), join(path, "modelInfo.outputModalities"), max_items=5)


def _external(doc: Doc, raw: object, path: str, namespace: str, router: str, name: str) -> ProviderBackend:
    e = doc.mapping(raw, path, ("provider", "model", "url", "credentialsSecretRef"), required=True)
    provider = doc.enum(e.get("provider"), join(path, "provider"), PROVIDERS)
    if provider is None:
        raise doc.fail(join(path, "provider"), f"one of {', '.join(PROVIDERS)} (it is required)")
    model = doc.string(e.get("model"), join(path, "model"), required=True, max_len=256, what="the upstream model")
    url = doc.string(e.get("url"), join(path, "url")) or DEFAULT_URLS.get(provider)
    if url is None:
        raise doc.fail(join(path, "url"), f"the provider's base URL (provider {provider} has no default URL; "
                                          "LLMKube requires url for it)")
    u = urlsplit(url)
    try:
        port = u.port or (443 if u.scheme == "https" else 80)
    except ValueError:
        raise doc.fail(join(path, "url"), f"an http(s):// URL with a valid port, got {url!r}") from None
    if u.scheme not in ("http", "https") or not u.hostname or u.username or u.password or u.query or u.fragment:
        raise doc.fail(join(path, "url"), f"an http:// or https:// URL with a host and without userinfo, query "
                                          f"or fragment, got {url!r}")
    auth = None
    if e.get("credentialsSecretRef") is not None:
        ref = doc.mapping(e.get("credentialsSecretRef"), join(path, "credentialsSecretRef"), ("name",))
        secret = doc.string(ref.get("name"), join(path, "credentialsSecretRef.name"), required=True,
                            pattern=DNS_SUBDOMAIN, what="a Secret name")
        assert secret is not None
        auth = ProviderAuth("APIKey" if provider == "anthropic" else "Bearer", secret, CREDENTIAL_KEYS[provider])
    anthropic = provider == "anthropic"
    return ProviderBackend(
        key=f"{namespace}/{router}.{name}", kind="ModelRouter backend", namespace=namespace,
        provider_type="Anthropic" if anthropic else "OpenAI", base_url=url, host=u.hostname, port=port,
        base_path=u.path.rstrip("/"), model=model, headers=(("anthropic-version", ANTHROPIC_VERSION),) if anthropic
        else (), auth=auth, cluster=f"provider.{namespace}.{router}.{name}", tls=u.scheme == "https",
        paths=ANTHROPIC_PATHS if anthropic else (),
    )


def _balancing(doc: Doc, raw: object, path: str, local: bool, resolution: str | None, backend: str,
               warnings: list[str]) -> Balancing:
    if raw is None:
        return Balancing()
    bal = doc.mapping(raw, path, ("mode", "prefixAffinity", "sessionAffinity"))
    if not local:
        raise doc.fail(path, "no balancing on an external backend (it balances the pods of an InferenceService)")
    if resolution != "endpoint":
        raise doc.fail(path, "resolution: endpoint on the backend (balancing requires it)")
    mode = doc.enum(bal.get("mode"), join(path, "mode"), ("RoundRobin", "LoadAware"), default="RoundRobin")
    prefix = session = None
    if bal.get("prefixAffinity") is not None:
        pa = doc.mapping(bal.get("prefixAffinity"), join(path, "prefixAffinity"), ("blockBytes", "maxBlocksPerEndpoint"))
        block = doc.integer(pa.get("blockBytes"), join(path, "prefixAffinity.blockBytes"), lo=256, hi=16384,
                            default=1024)
        cap = doc.integer(pa.get("maxBlocksPerEndpoint"), join(path, "prefixAffinity.maxBlocksPerEndpoint"), lo=1024,
                          hi=262144, default=16384)
        prefix = PrefixAffinity(block or 1024, cap or 16384)
    if bal.get("sessionAffinity") is not None:
        sp = join(path, "sessionAffinity")
        sa = doc.mapping(bal.get("sessionAffinity"), sp, ("headers", "idleTimeout", "maxLoadPercent"))
        headers = []
        for j, h in enumerate(doc.list(sa.get("headers"), join(sp, "headers"), min_items=1, max_items=8)):
            hn = doc.string(h, f"{sp}.headers[{j}]", required=True, pattern=HEADER_NAME, what="an RFC 7230 header name")
            assert hn is not None
            headers.append(hn.lower())
        if not headers:
            raise doc.fail(join(sp, "headers"), "at least 1 header name (it is required)")
        idle = duration(doc, sa.get("idleTimeout"), join(sp, "idleTimeout"), lo=60.0, hi=86400.0)
        doc.integer(sa.get("maxLoadPercent"), join(sp, "maxLoadPercent"), lo=101, hi=1000)  # deprecated, no effect
        session = SessionAffinity(tuple(headers), idle if idle is not None else 1800.0)
    if mode == "RoundRobin":
        for what, given in (("PrefixAffinityIgnored", prefix), ("SessionAffinityIgnored", session)):
            if given is not None:
                warnings.append(f"{what}: backend {backend!r} sets {what[:-7].replace('Affinity', ' affinity')} "
                                f"with mode RoundRobin; it needs mode LoadAware and is ignored")
        return Balancing("RoundRobin")
    return Balancing("LoadAware", prefix, session)
