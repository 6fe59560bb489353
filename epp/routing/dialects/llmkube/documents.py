"""LLMKube's ModelRouter (`inference.llmkube.dev/v1alpha1`) compiled onto the routing layer.

One document becomes a `ModelRouterSpec` (model.py), a PoolBackend per InferenceService and a
ProviderBackend per external backend (backends.py). Validation follows the CRD schema and LLMKube's
webhook; every error names the document, the field and what was expected:
- backends: unique names, exactly one of inferenceServiceRef / external, tier (a cloud InferenceService is
  refused), weight >= 0, timeout 100ms..30m, balancing (see backends.py);
- rules: unique names, backends that exist, strategy primary-fallback | weighted | shadow (weighted needs a
  positive weight, shadow two backends, and only dataPlane Proxy can mirror), taskComplexity, models (Go globs),
  latencySLOMs, timeout;
- the classification policy: mode header-only (detector and hybrid are refused, as LLMKube does:
  ClassifierNotImplemented); a rule that matches a sensitive classification (sensitiveClassifications, default
  pii and phi, compared normalized) must be failClosed and route to local backends only;
- budgets: scope router | rule (ruleName must name a rule) | team (headerKey, default x-llmkube-team), maxTokens
  and/or maxUSD, windowSeconds;
- proxy: quarantineDuration (15s), streamIdleTimeout (300s, "0s" turns it off), responseHeaderTimeout (120s);
  the other proxy fields configure LLMKube's router-proxy Deployment and are accepted and ignored, as are
  endpoint, gatewayRef, agentGatewayRef, mcpServer, policy.auditLog and policy.auth (docs/coming-from-llmkube.md).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from datetime import datetime

from epp.routing.dialects.llmkube.backends import NAME, duration, parse_backend, service_ports
from epp.routing.dialects.llmkube.model import (
    API_VERSION,
    BUDGET_SCOPES,
    DEFAULT_CLASSIFICATION_HEADER,
    DEFAULT_QUARANTINE_S,
    DEFAULT_RESPONSE_HEADER_TIMEOUT_S,
    DEFAULT_SENSITIVE,
    DEFAULT_STRATEGIES,
    DEFAULT_STREAM_IDLE_S,
    DEFAULT_TEAM_HEADER,
    GROUP,
    KIND,
    PRIMARY_FALLBACK,
    SHADOW,
    STRATEGIES,
    WEIGHTED,
    Budget,
    ModelRouterSpec,
    RouterBackend,
    RouterRule,
    Strategy,
    go_glob,
    normalize_label,
)
from epp.routing.model import Match, PoolBackend, ProviderBackend, Route, Rule, Target
from epp.routing.validate import HEADER_NAME, Doc, document_name, join

__all__ = ["API_VERSION", "GROUP", "compile_document"]

Compiled = ModelRouterSpec | PoolBackend | ProviderBackend
SPEC_FIELDS = ("backends", "rules", "defaultRoute", "defaultRouteStrategy", "dataPlane", "policy", "proxy",
               "endpoint", "gatewayRef", "agentGatewayRef", "mcpServer")
IGNORED_SPEC = ("endpoint", "gatewayRef", "agentGatewayRef", "mcpServer")  # checked to be mappings only
PROXY_USED = ("quarantineDuration", "streamIdleTimeout", "responseHeaderTimeout")
PROXY_IGNORED = ("affinity", "drainTimeout", "image", "imagePullSecrets", "nodeSelector", "podAnnotations",
                 "podLabels", "replicas", "resources", "revisionHistoryLimit", "runtimeClassName", "serviceName",
                 "tolerations", "topologySpreadConstraints")
COMPLEXITIES = ("simple", "moderate", "complex")


def _created(meta: Mapping[str, object]) -> float | None:
    ts = meta.get("creationTimestamp")
    try:
        return datetime.fromisoformat(str(ts).replace("Z", "+00:00")).timestamp() if ts else None
    except ValueError:
        return None


def compile_document(obj: object, where: str, position: float = 0.0) -> Sequence[Compiled]:
    """One ModelRouter -> [its spec, its pool backends..., its provider backends...]. Raises RouteConfigError."""
    doc = Doc(document_name(obj, where))
    top = doc.mapping(obj, "", ("apiVersion", "kind", "metadata", "spec", "status"), required=True)
    if top.get("apiVersion") != API_VERSION:
        raise doc.fail("apiVersion", f"{API_VERSION!r}, got {top.get('apiVersion')!r}")
    if top.get("kind") != KIND:
        raise doc.fail("kind", f"{KIND} (the kind of {GROUP}/v1alpha1 that routes), got {top.get('kind')!r}")
    meta = doc.mapping(top.get("metadata"), "metadata", required=True)
    namespace, name = doc.object_ref(meta)
    key = f"{namespace}/{name}"
    ann = meta.get("annotations")
    annotations: Mapping[str, object] = ann if isinstance(ann, Mapping) else {}
    spec = doc.mapping(top.get("spec"), "spec", SPEC_FIELDS, required=True)
    warnings: list[str] = []
    ports = service_ports(doc, annotations)
    backends: dict[str, RouterBackend] = {}
    compiled: dict[str, PoolBackend | ProviderBackend] = {}
    for i, raw in enumerate(doc.list(spec.get("backends"), "spec.backends", min_items=1)):
        b, c = parse_backend(doc, raw, i, namespace, name, ports, warnings)
        if b.name in backends:
            raise doc.fail(f"spec.backends[{i}].name", f"a unique backend name ({b.name!r} repeats)")
        backends[b.name] = b
        compiled[c.key] = c
    if len({b.published for b in backends.values()}) < len(backends):
        raise doc.fail("spec.backends", "unique displayName/name values (two backends publish the same model id)")
    plane = doc.enum(spec.get("dataPlane"), "spec.dataPlane", ("Proxy", "Gateway", "AgentGateway"), default="Proxy")
    header, sensitive = _classification(doc, spec.get("policy"))
    rules = _rules(doc, spec.get("rules"), backends, sensitive, plane or "Proxy")
    default = doc.string(spec.get("defaultRoute"), "spec.defaultRoute")
    if default is not None and default not in backends:
        raise doc.fail("spec.defaultRoute", f"the name of a backend ({', '.join(backends)}), got {default!r}")
    strategy = doc.enum(spec.get("defaultRouteStrategy"), "spec.defaultRouteStrategy", DEFAULT_STRATEGIES,
                        default="Static")
    budgets = _budgets(doc, spec.get("policy"), {r.name for r in rules})
    quarantine, idle, header_timeout = _proxy(doc, spec.get("proxy"))
    for f in IGNORED_SPEC:
        doc.mapping(spec.get(f), f"spec.{f}")
    created = _created(meta)
    order = (created if created is not None else position, key)
    route = Route(key=key, kind=KIND, source=where, rules=tuple(_route_rule(r, backends) for r in rules),
                  order=order)
    router = ModelRouterSpec(
        key=key, source=where, backends=backends, rules=rules, route=route, order=order, data_plane=plane or "Proxy",
        default_route=default, default_strategy=strategy or "Static",
        classification_header=header, sensitive=sensitive, budgets=budgets, quarantine_s=quarantine,
        stream_idle_s=idle, response_header_timeout_s=header_timeout, warnings=tuple(warnings),
    )
    return [router, *compiled.values()]


def _route_rule(r: RouterRule, backends: Mapping[str, RouterBackend]) -> Rule:
    """A rule as the routing layer shows it: its backends, in order, with their weights."""
    targets = tuple(Target(backends[n].target.kind, backends[n].target.backend, backends[n].weight) for n in r.backends)
    return Rule(name=r.name, index=r.index, match=Match(), targets=targets)


# ---- policy ----------------------------------------------------------------------------------------------------
def _classification(doc: Doc, raw: object) -> tuple[str, frozenset[str]]:
    policy = doc.mapping(raw, "spec.policy", ("budgets", "classification", "auditLog", "auth"))
    doc.mapping(policy.get("auditLog"), "spec.policy.auditLog")
    doc.mapping(policy.get("auth"), "spec.policy.auth")
    path = "spec.policy.classification"
    c = doc.mapping(policy.get("classification"), path, ("headerKey", "mode", "sensitiveClassifications"))
    header = doc.string(c.get("headerKey"), join(path, "headerKey"), pattern=HEADER_NAME, what="a header name")
    mode = doc.enum(c.get("mode"), join(path, "mode"), ("header-only", "detector", "hybrid"), default="header-only")
    if mode != "header-only":
        raise doc.fail(join(path, "mode"), f"header-only (ClassifierNotImplemented: mode {mode!r} is reserved for a "
                                           "content classifier that neither LLMKube nor Pointsman implements)")
    values = doc.list(c.get("sensitiveClassifications"), join(path, "sensitiveClassifications"))
    sensitive = set()
    for i, v in enumerate(values):
        text = doc.string(v, f"{path}.sensitiveClassifications[{i}]", required=True, what="a classification")
        norm = normalize_label(text or "")
        if not norm:
            raise doc.fail(f"{path}.sensitiveClassifications[{i}]", f"a non-blank classification, got {v!r}")
        sensitive.add(norm)
    return (header or DEFAULT_CLASSIFICATION_HEADER).lower(), frozenset(sensitive) or DEFAULT_SENSITIVE


def _budgets(doc: Doc, raw: object, rule_names: set[str]) -> tuple[Budget, ...]:
    policy = doc.mapping(raw, "spec.policy")
    out: list[Budget] = []
    seen: set[str] = set()
    for i, b in enumerate(doc.list(policy.get("budgets"), "spec.policy.budgets")):
        path = f"spec.policy.budgets[{i}]"
        m = doc.mapping(b, path, ("name", "scope", "ruleName", "headerKey", "maxTokens", "maxUSD", "windowSeconds"),
                        required=True)
        name = doc.string(m.get("name"), join(path, "name"), required=True, pattern=NAME, what="a budget name")
        assert name is not None
        if name in seen:
            raise doc.fail(join(path, "name"), f"a unique budget name ({name!r} repeats)")
        seen.add(name)
        scope = doc.enum(m.get("scope"), join(path, "scope"), BUDGET_SCOPES)
        if scope is None:
            raise doc.fail(join(path, "scope"), "one of router, rule, team (it is required)")
        rule = doc.string(m.get("ruleName"), join(path, "ruleName"))
        if scope == "rule":
            if rule is None:
                raise doc.fail(join(path, "ruleName"), "the name of a rule (required when scope=rule)")
            if rule not in rule_names:
                raise doc.fail(join(path, "ruleName"), f"the name of a rule ({', '.join(sorted(rule_names)) or 'none'})"
                                                       f", got {rule!r}")
        header = doc.string(m.get("headerKey"), join(path, "headerKey"), pattern=HEADER_NAME, what="a header name")
        tokens = doc.integer(m.get("maxTokens"), join(path, "maxTokens"), lo=1)
        usd = None
        if m.get("maxUSD") not in (None, ""):
            usd = _usd(doc, m.get("maxUSD"), join(path, "maxUSD"))
        if tokens is None and usd is None:
            raise doc.fail(path, "maxTokens or maxUSD (or both): a budget needs a cap")
        window = doc.integer(m.get("windowSeconds"), join(path, "windowSeconds"), lo=1)
        if window is None:
            raise doc.fail(join(path, "windowSeconds"), "the rolling window in seconds, at least 1 (a budget "
                                                        "without a window caps nothing)")
        out.append(Budget(name, scope, window, tokens, usd, rule if scope == "rule" else None,
                          (header or DEFAULT_TEAM_HEADER).lower()))
    return tuple(out)


def _usd(doc: Doc, value: object, path: str) -> float | None:
    from epp.ratelimit import parse_usd

    try:
        usd = parse_usd(value if isinstance(value, str) else str(value), "maxUSD")
    except ValueError:
        raise doc.fail(path, f"a decimal number of USD like \"25.00\", got {value!r}") from None
    if usd <= 0:
        raise doc.fail(path, f"an amount above 0, got {value!r}")
    return usd


def _proxy(doc: Doc, raw: object) -> tuple[float, float, float]:
    p = doc.mapping(raw, "spec.proxy", PROXY_USED + PROXY_IGNORED)
    quarantine = duration(doc, p.get("quarantineDuration"), "spec.proxy.quarantineDuration", lo=0.001, hi=86400.0)
    idle = duration(doc, p.get("streamIdleTimeout"), "spec.proxy.streamIdleTimeout", lo=0.001, zero=True)
    header = duration(doc, p.get("responseHeaderTimeout"), "spec.proxy.responseHeaderTimeout", lo=0.001)
    doc.integer(p.get("replicas"), "spec.proxy.replicas", lo=1, hi=10)
    return (DEFAULT_QUARANTINE_S if quarantine is None else quarantine,
            DEFAULT_STREAM_IDLE_S if idle is None else idle,
            DEFAULT_RESPONSE_HEADER_TIMEOUT_S if header is None else header)


# ---- rules -----------------------------------------------------------------------------------------------------
def _rules(doc: Doc, raw: object, backends: Mapping[str, RouterBackend], sensitive: frozenset[str],
           plane: str) -> tuple[RouterRule, ...]:
    out: list[RouterRule] = []
    seen: set[str] = set()
    for i, r in enumerate(doc.list(raw, "spec.rules")):
        rule = _rule(doc, r, i, backends, sensitive, plane)
        if rule.name in seen:
            raise doc.fail(f"spec.rules[{i}].name", f"a unique rule name ({rule.name!r} repeats)")
        seen.add(rule.name)
        out.append(rule)
    return tuple(out)


def _rule(doc: Doc, raw: object, i: int, backends: Mapping[str, RouterBackend], sensitive: frozenset[str],
          plane: str) -> RouterRule:
    path = f"spec.rules[{i}]"
    r = doc.mapping(raw, path, ("name", "match", "route", "failClosed"), required=True)
    name = doc.string(r.get("name"), join(path, "name"), required=True, pattern=NAME, what="a rule name")
    assert name is not None
    fail_closed = doc.boolean(r.get("failClosed"), join(path, "failClosed"))
    models, headers, classes, required, complexity, slo = _match(doc, r.get("match"), join(path, "match"))
    names, strategy, timeout = _route(doc, r.get("route"), join(path, "route"), backends, plane)
    rule = RouterRule(name=name, index=i, backends=names,
                      strategy=strategy or PRIMARY_FALLBACK,
                      models=models, headers=headers, classifications=classes,
                      required=required, complexity=complexity, latency_slo_ms=slo, timeout_s=timeout,
                      fail_closed=fail_closed)
    _sensitive_rule(doc, rule, path, backends, sensitive)
    return rule


def _match(doc: Doc, raw: object, mpath: str) -> tuple[tuple[tuple[str, re.Pattern[str]], ...],
                                                    tuple[tuple[str, str], ...], frozenset[str], frozenset[str],
                                                    str | None, int | None]:
    """A rule's `match`: (models with their compiled globs, headers, classifications, required capabilities,
    task complexity, latency SLO)."""
    m = doc.mapping(raw, mpath, ("models", "headers", "dataClassification", "requiredCapabilities",
                                 "taskComplexity", "latencySLOMs"))
    models = []
    for j, g in enumerate(doc.list(m.get("models"), join(mpath, "models"))):
        glob = doc.string(g, f"{mpath}.models[{j}]", required=True, what="a model name or glob")
        assert glob is not None
        try:
            models.append((glob, go_glob(glob)))
        except ValueError as e:
            raise doc.fail(f"{mpath}.models[{j}]", f"a glob as Go's path.Match reads it ({e}), got {glob!r}") from None
    headers = []
    for hname, value in doc.mapping(m.get("headers"), join(mpath, "headers")).items():
        if not isinstance(hname, str) or not HEADER_NAME.match(hname):
            raise doc.fail(join(mpath, "headers"), f"header names, got {hname!r}")
        if not isinstance(value, str):
            raise doc.fail(join(join(mpath, "headers"), hname), f"a string value, got {value!r}")
        headers.append((hname.lower(), value))
    classes = set()
    for j, c in enumerate(doc.list(m.get("dataClassification"), join(mpath, "dataClassification"))):
        text = doc.string(c, f"{mpath}.dataClassification[{j}]", required=True, what="a classification")
        classes.add(normalize_label(text or ""))
    classes.discard("")
    required = frozenset(doc.string(c, f"{mpath}.requiredCapabilities[{j}]", required=True) or ""
                         for j, c in enumerate(doc.list(m.get("requiredCapabilities"),
                                                        join(mpath, "requiredCapabilities"))))
    complexity = doc.enum(m.get("taskComplexity"), join(mpath, "taskComplexity"), COMPLEXITIES)
    slo = doc.integer(m.get("latencySLOMs"), join(mpath, "latencySLOMs"), lo=1, hi=2**31 - 1)
    return tuple(models), tuple(sorted(headers)), frozenset(classes), required, complexity, slo


def _route(doc: Doc, raw: object, rpath: str, backends: Mapping[str, RouterBackend],
           plane: str) -> tuple[tuple[str, ...], Strategy | None, float | None]:
    """A rule's `route`: (its backends, in order; the strategy; the timeout)."""
    route = doc.mapping(raw, rpath, ("backends", "strategy", "timeout", "poolActivation"), required=True)
    names: list[str] = []
    for j, n in enumerate(doc.list(route.get("backends"), join(rpath, "backends"), min_items=1)):
        bname = doc.string(n, f"{rpath}.backends[{j}]", required=True, what="a backend name") or ""
        if bname not in backends:
            raise doc.fail(f"{rpath}.backends[{j}]", f"the name of a backend ({', '.join(backends)}), got {bname!r}")
        if bname in names:
            raise doc.fail(f"{rpath}.backends[{j}]", f"each backend once ({bname!r} repeats)")
        names.append(bname)
    strategy = doc.enum(route.get("strategy"), join(rpath, "strategy"), STRATEGIES, default=PRIMARY_FALLBACK)
    if strategy == WEIGHTED and not any(backends[n].weight > 0 for n in names):
        raise doc.fail(join(rpath, "backends"), "at least one backend with a positive weight (a weighted rule "
                                                "drains every backend of weight 0)")
    if strategy == SHADOW:
        if len(names) < 2:
            raise doc.fail(join(rpath, "backends"), "at least two backends for strategy shadow (one serves, the "
                                                    "others receive copies)")
        if plane != "Proxy":
            raise doc.fail(join(rpath, "strategy"), f"primary-fallback or weighted on dataPlane {plane}: shadow is "
                                                    "Envoy request mirroring from `epp envoy-config --routes-file`, "
                                                    f"and the {plane} data plane's routes are not generated by "
                                                    "Pointsman (LLMKube refuses shadow there too)")
        external = [n for n in names if backends[n].kind != "pool"]
        if external:
            raise doc.fail(join(rpath, "backends"), "InferenceService backends only for strategy shadow: Envoy's "
                                                    "mirrored copies carry no provider credential, so "
                                                    f"{', '.join(external)} (external) can be neither served with "
                                                    "mirroring nor mirrored to")
    timeout = duration(doc, route.get("timeout"), join(rpath, "timeout"), lo=0.1, hi=1800.0)
    doc.enum(route.get("poolActivation"), join(rpath, "poolActivation"), ("Wait", "IfIdle"))
    return tuple(names), strategy, timeout


def _sensitive_rule(doc: Doc, rule: RouterRule, path: str, backends: Mapping[str, RouterBackend],
                    sensitive: frozenset[str]) -> None:
    """The static half of the classification guard (LLMKube's webhook)."""
    matched = sorted(rule.classifications & sensitive)
    if not matched:
        return
    if not rule.fail_closed:
        raise doc.fail(join(path, "failClosed"), f"true: the rule matches sensitive classifications "
                                                 f"{', '.join(matched)} and must be fail-closed")
    cloud = [n for n in rule.backends if not backends[n].local]
    if cloud:
        raise doc.fail(join(path, "route.backends"), f"local-tier backends only: the rule matches sensitive "
                                                     f"classifications {', '.join(matched)} and cannot route to "
                                                     f"cloud-tier backend(s) {', '.join(cloud)}")
