"""LLMKube's ModelRouter document: what it compiles to, its defaults, and errors that name the document, the field
and what was expected. Operator fields are accepted and ignored; a bad document never takes the others down."""

from __future__ import annotations

import pytest
from llmkube_helpers import cloud, local, router_doc

from epp.routing.dialects.llmkube.model import go_glob
from epp.routing.documents import DocumentSet, read_yaml

SEED_EXAMPLE = router_doc({
    "backends": [
        {"name": "local-qwen", "tier": "local", "inferenceServiceRef": {"name": "qwen3-coder"}},
        {"name": "cloud-opus", "tier": "cloud", "external": {
            "provider": "anthropic", "model": "claude-opus-4-7", "url": "https://api.anthropic.com",
            "credentialsSecretRef": {"name": "anthropic-key"}}},
    ],
    "rules": [
        {"name": "pii-stays-local", "match": {"dataClassification": ["pii", "phi"]},
         "route": {"backends": ["local-qwen"]}, "failClosed": True},
        {"name": "complex-to-cloud", "match": {"taskComplexity": "complex"},
         "route": {"backends": ["cloud-opus", "local-qwen"], "strategy": "primary-fallback"}},
    ],
    "defaultRoute": "local-qwen",
}, name="coding-router")


def load(text: str) -> DocumentSet:
    docs = DocumentSet()
    docs.replace("file:routes.yaml", read_yaml(text, "routes.yaml"))
    return docs


def error(spec: dict, **meta) -> str:
    docs = load(router_doc(spec, **meta))
    assert docs.errors, "the document was accepted"
    [(_, msg)] = docs.errors.items()
    assert msg.startswith("ModelRouter default/r (routes.yaml, document 1): "), msg
    return msg


def test_the_documented_example_compiles_to_a_router_a_pool_and_a_provider():
    docs = load(SEED_EXAMPLE)
    assert not docs.errors
    t = docs.table()
    [spec] = t.objects("llmkube")
    assert spec.key == "default/coding-router" and spec.default_route == "local-qwen"
    assert [r.name for r in spec.rules] == ["pii-stays-local", "complex-to-cloud"]
    assert spec.sensitive == {"pii", "phi"} and spec.classification_header == "x-llmkube-classification"
    assert (spec.quarantine_s, spec.stream_idle_s, spec.response_header_timeout_s) == (15.0, 300.0, 120.0)
    pool = t.pools["InferenceService/default/qwen3-coder"]
    assert pool.selector == {"inference.llmkube.dev/service": "qwen3-coder"} and pool.port == 8080
    assert pool.pool == "inferenceservice:default/qwen3-coder"
    p = t.providers["default/coding-router.cloud-opus"]
    assert (p.provider_type, p.host, p.port, p.tls, p.model) == ("Anthropic", "api.anthropic.com", 443, True,
                                                                 "claude-opus-4-7")
    assert p.auth is not None and (p.auth.scheme, p.auth.secret_name, p.auth.secret_key) == (
        "APIKey", "anthropic-key", "ANTHROPIC_API_KEY")
    assert ("anthropic-version", "2023-06-01") in p.headers
    assert "/v1/chat/completions" in p.paths  # LLMKube forwards OpenAI chat completions to every provider


def test_backend_defaults_tier_weight_published_name_and_provider_urls():
    docs = load(router_doc({"backends": [
        local("a"), cloud("b", provider="openai", model="gpt-5", displayName="gpt-5-2025"),
        cloud("c", provider="litellm", model="x", external={"url": "http://litellm.gw:4000",
                                                            "credentialsSecretRef": {"name": "lk"}})]}))
    assert not docs.errors
    [spec] = docs.table().objects("llmkube")
    a, b, c = spec.backends["a"], spec.backends["b"], spec.backends["c"]
    assert c.tier == "cloud" and c.kind == "provider"
    assert (a.tier, a.weight, a.published) == ("local", 1, "a")
    assert (b.tier, b.published) == ("cloud", "gpt-5-2025")
    providers = docs.table().providers
    assert providers["default/r.b"].base_url == "https://api.openai.com"
    lite = providers["default/r.c"]
    assert (lite.tls, lite.port, lite.auth.secret_key, lite.auth.scheme) == (False, 4000, "LITELLM_MASTER_KEY",
                                                                            "Bearer")


def test_operator_fields_are_accepted_and_ignored():
    spec = {
        "backends": [local("a", resolution="endpoint", healthCheck={"path": "/health", "intervalSeconds": 5},
                           modelInfo={"contextLength": 8192, "inputModalities": ["text"]},
                           endpointPicker={"service": {"name": "epp", "port": 9002}})],
        "defaultRoute": "a",
        "proxy": {"replicas": 3, "image": "x/y:1", "nodeSelector": {"gpu": "yes"}, "resources": {"limits": {}},
                  "tolerations": [{"key": "k", "operator": "Exists"}], "affinity": {"nodeAffinity": {}},
                  "podLabels": {"a": "b"}, "podAnnotations": {}, "imagePullSecrets": [{"name": "p"}],
                  "revisionHistoryLimit": 0, "runtimeClassName": "gvisor", "serviceName": "llmkube",
                  "drainTimeout": "60s", "topologySpreadConstraints": [],
                  "quarantineDuration": "500ms", "streamIdleTimeout": "0s", "responseHeaderTimeout": "30s"},
        "endpoint": {"port": 8080, "type": "ClusterIP"}, "gatewayRef": {"name": "gw"},
        "agentGatewayRef": {"name": "agw", "endpointPicker": "pointsman"}, "mcpServer": {"enabled": False},
        "policy": {"auditLog": {"sink": "stdout"}, "auth": {"jwt": {"issuer": "i", "jwksURI": "j", "provider": "p",
                                                                     "teamClaim": "team"}}},
    }
    docs = load(router_doc(spec) + "status: {phase: Ready}\n")
    assert not docs.errors, docs.errors
    [r] = docs.table().objects("llmkube")
    assert (r.quarantine_s, r.stream_idle_s, r.response_header_timeout_s) == (0.5, 0.0, 30.0)


@pytest.mark.parametrize("spec,field,expected", [
    ({"backends": []}, "spec.backends", "at least 1 item"),
    ({"backends": [{"name": "a"}]}, "spec.backends[0]", "exactly one of inferenceServiceRef or external"),
    ({"backends": [{**local("a"), **cloud("a")}]}, "spec.backends[0]", "exactly one of"),
    ({"backends": [local("a", tier="cloud")]}, "spec.backends[0].tier", "tier=cloud is invalid"),
    ({"backends": [local("a"), local("a", "b")]}, "spec.backends[1].name", "unique backend name"),
    ({"backends": [local("A")]}, "spec.backends[0].name", "a backend name matching"),
    ({"backends": [local("a", weight=-1)]}, "spec.backends[0].weight", "an integer in 0.."),
    ({"backends": [local("a", timeout="50ms")]}, "spec.backends[0].timeout", "between 100ms and 30m"),
    ({"backends": [local("a", timeout="ten")]}, "spec.backends[0].timeout", "a duration like"),
    ({"backends": [local("a", costPerMillionTokens={"promptUSD": "1,5"})]},
     "spec.backends[0].costPerMillionTokens.promptUSD", "a decimal number"),
    ({"backends": [cloud("a", provider="azure")]}, "spec.backends[0].external.provider", "one of anthropic"),
    ({"backends": [cloud("a", provider="litellm")]}, "spec.backends[0].external.url", "has no default URL"),
    ({"backends": [cloud("a", external={"url": "ftp://x"})]}, "spec.backends[0].external.url", "http:// or"),
    ({"backends": [local("a", balancing={"mode": "LoadAware"})]}, "spec.backends[0].balancing",
     "resolution: endpoint"),
    ({"backends": [local("a", resolution="endpoint", balancing={"mode": "Fast"})]},
     "spec.backends[0].balancing.mode", "one of RoundRobin, LoadAware"),
    ({"backends": [local("a", resolution="endpoint", balancing={"mode": "LoadAware",
                                                                "prefixAffinity": {"blockBytes": 100}})]},
     "spec.backends[0].balancing.prefixAffinity.blockBytes", "an integer in 256..16384"),
    ({"backends": [local("a", resolution="endpoint", balancing={"mode": "LoadAware",
                                                                "sessionAffinity": {"headers": []}})]},
     "spec.backends[0].balancing.sessionAffinity.headers", "at least 1"),
    ({"backends": [local("a", resolution="endpoint", balancing={
        "mode": "LoadAware", "sessionAffinity": {"headers": ["x-s"], "idleTimeout": "30s"}})]},
     "spec.backends[0].balancing.sessionAffinity.idleTimeout", "between 1m and 24h"),
    ({"backends": [local("a")], "defaultRoute": "b"}, "spec.defaultRoute", "the name of a backend"),
    ({"backends": [local("a")], "defaultRouteStrategy": "Fuzzy"}, "spec.defaultRouteStrategy", "Static"),
    ({"backends": [local("a")], "rules": [{"name": "r", "route": {"backends": ["b"]}}]},
     "spec.rules[0].route.backends[0]", "the name of a backend"),
    ({"backends": [local("a")], "rules": [{"name": "r", "route": {"backends": []}}]},
     "spec.rules[0].route.backends", "at least 1"),
    ({"backends": [local("a")], "rules": [{"name": "r", "route": {"backends": ["a"]}},
                                          {"name": "r", "route": {"backends": ["a"]}}]},
     "spec.rules[1].name", "unique rule name"),
    ({"backends": [local("a", weight=0)], "rules": [{"name": "r", "route": {"backends": ["a"],
                                                                             "strategy": "weighted"}}]},
     "spec.rules[0].route.backends", "positive weight"),
    ({"backends": [local("a")], "rules": [{"name": "r", "route": {"backends": ["a"], "strategy": "shadow"}}]},
     "spec.rules[0].route.backends", "at least two backends"),
    ({"backends": [local("a"), cloud("b")], "rules": [{"name": "r", "route": {"backends": ["a", "b"],
                                                                               "strategy": "shadow"}}]},
     "spec.rules[0].route.backends", "InferenceService backends only for strategy shadow"),
    ({"backends": [local("a"), local("b")], "dataPlane": "Gateway",
      "rules": [{"name": "r", "route": {"backends": ["a", "b"], "strategy": "shadow"}}]},
     "spec.rules[0].route.strategy", "on dataPlane Gateway"),
    ({"backends": [local("a")], "rules": [{"name": "r", "match": {"taskComplexity": "hard"},
                                           "route": {"backends": ["a"]}}]},
     "spec.rules[0].match.taskComplexity", "one of simple, moderate, complex"),
    ({"backends": [local("a")], "rules": [{"name": "r", "match": {"models": ["qwen[-"]},
                                           "route": {"backends": ["a"]}}]},
     "spec.rules[0].match.models[0]", "Go's path.Match"),
    ({"backends": [local("a")], "rules": [{"name": "r", "match": {"latencySLOMs": 0},
                                           "route": {"backends": ["a"]}}]},
     "spec.rules[0].match.latencySLOMs", "an integer in 1.."),
    ({"backends": [local("a")], "rules": [{"name": "r", "route": {"backends": ["a"], "timeout": "1h"}}]},
     "spec.rules[0].route.timeout", "between 100ms and 30m"),
    ({"backends": [local("a")], "policy": {"classification": {"mode": "detector"}}},
     "spec.policy.classification.mode", "ClassifierNotImplemented"),
    ({"backends": [local("a")], "policy": {"budgets": [{"name": "b", "scope": "router", "windowSeconds": 60}]}},
     "spec.policy.budgets[0]", "maxTokens or maxUSD"),
    ({"backends": [local("a")], "policy": {"budgets": [{"name": "b", "scope": "rule", "maxTokens": 5,
                                                        "windowSeconds": 60}]}},
     "spec.policy.budgets[0].ruleName", "required when scope=rule"),
    ({"backends": [local("a")], "policy": {"budgets": [{"name": "b", "scope": "rule", "ruleName": "nope",
                                                        "maxTokens": 5, "windowSeconds": 60}]}},
     "spec.policy.budgets[0].ruleName", "the name of a rule"),
    ({"backends": [local("a")], "policy": {"budgets": [{"name": "b", "scope": "router", "maxTokens": 5}]}},
     "spec.policy.budgets[0].windowSeconds", "rolling window"),
    ({"backends": [local("a")], "policy": {"budgets": [{"name": "b", "scope": "org", "maxTokens": 5,
                                                        "windowSeconds": 1}]}},
     "spec.policy.budgets[0].scope", "one of router, rule, team"),
    ({"backends": [local("a")], "policy": {"budgets": [{"name": "b", "scope": "router", "maxUSD": "ten",
                                                        "windowSeconds": 1}]}},
     "spec.policy.budgets[0].maxUSD", "a decimal number of USD"),
    ({"backends": [local("a")], "proxy": {"quarantineDuration": "soon"}}, "spec.proxy.quarantineDuration",
     "a duration like"),
    ({"backends": [local("a")], "proxy": {"replicaz": 2}}, "spec.proxy.replicaz", "unknown field"),
    ({"backends": [local("a")], "rulez": []}, "spec.rulez", "unknown field"),
])
def test_a_bad_document_names_the_field_and_what_was_expected(spec, field, expected):
    msg = error(spec)
    assert f": {field}: expected " in msg, msg
    assert expected in msg, msg


def test_a_sensitive_rule_must_be_fail_closed_and_local_only():
    base = {"backends": [local("a"), cloud("c")]}
    msg = error({**base, "rules": [{"name": "r", "match": {"dataClassification": ["PII"]},
                                    "route": {"backends": ["a"]}}]})
    assert "spec.rules[0].failClosed: expected true" in msg and "pii" in msg
    msg = error({**base, "rules": [{"name": "r", "match": {"dataClassification": ["public", "phi"]},
                                    "route": {"backends": ["a", "c"]}, "failClosed": True}]})
    assert "spec.rules[0].route.backends: expected local-tier backends only" in msg and "c" in msg
    # configured sensitive values, compared normalized
    msg = error({**base, "policy": {"classification": {"sensitiveClassifications": ["Secret"]}},
                 "rules": [{"name": "r", "match": {"dataClassification": [" SECRET "]},
                            "route": {"backends": ["c"]}, "failClosed": True}]})
    assert "cloud-tier backend(s) c" in msg
    # a non-sensitive classification may route anywhere
    ok = load(router_doc({**base, "rules": [{"name": "r", "match": {"dataClassification": ["public"]},
                                             "route": {"backends": ["c"]}}]}))
    assert not ok.errors


def test_affinity_with_round_robin_is_ignored_with_a_warning(caplog):
    docs = load(router_doc({"backends": [local("a", resolution="endpoint", balancing={
        "mode": "RoundRobin", "prefixAffinity": {}, "sessionAffinity": {"headers": ["X-Session"]}})]}))
    assert not docs.errors
    [spec] = docs.table().objects("llmkube")
    b = spec.backends["a"].balancing
    assert (b.mode, b.prefix, b.session) == ("RoundRobin", None, None)
    assert any("PrefixAffinityIgnored" in w for w in spec.warnings)
    assert any("SessionAffinityIgnored" in w for w in spec.warnings)


def test_load_aware_defaults():
    docs = load(router_doc({"backends": [local("a", resolution="endpoint", balancing={
        "mode": "LoadAware", "prefixAffinity": {}, "sessionAffinity": {"headers": ["X-Session", "x-user"],
                                                                        "maxLoadPercent": 150}})]}))
    assert not docs.errors
    b = docs.table().objects("llmkube")[0].backends["a"].balancing
    assert (b.prefix.block_bytes, b.prefix.max_blocks) == (1024, 16384)
    assert b.session.headers == ("x-session", "x-user") and b.session.idle_s == 1800.0


def test_a_bad_router_keeps_its_last_good_version_and_never_takes_the_others_down():
    good_a = router_doc({"backends": [local("a")], "defaultRoute": "a"}, name="one")
    good_b = router_doc({"backends": [local("b")], "defaultRoute": "b"}, name="two")
    docs = DocumentSet()
    docs.replace("file:x", read_yaml(good_a + "---\n" + good_b, "x"))
    bad_a = router_doc({"backends": [local("a")], "defaultRoute": "zzz"}, name="one")
    docs.replace("file:x", read_yaml(bad_a + "---\n" + good_b, "x"))
    assert len(docs.errors) == 1
    routers = {r.key: r for r in docs.table().objects("llmkube")}
    assert routers["default/one"].default_route == "a" and routers["default/two"].default_route == "b"


def test_service_ports_annotation():
    docs = load(router_doc({"backends": [local("a", "svc-a"), local("b", "svc-b")]},
                           annotations={"pointsman.io/service-ports": "svc-a=8000"}))
    pools = docs.table().pools
    assert pools["InferenceService/default/svc-a"].port == 8000
    assert pools["InferenceService/default/svc-b"].port == 8080


@pytest.mark.parametrize("pattern,name,matches", [
    ("qwen3-*", "qwen3-coder", True),
    ("qwen3-*", "qwen2-coder", False),
    ("*", "meta-llama/Llama-3.1-8B", False),  # Go's path.Match: * never crosses /
    ("meta-llama/*", "meta-llama/Llama-3.1-8B", True),
    ("gpt-?", "gpt-5", True),
    ("gpt-?", "gpt-55", False),
    ("[a-c]at", "bat", True),
    ("[^a-c]at", "bat", False),
    ("\\*star", "*star", True),
    ("\\*star", "xstar", False),
])
def test_model_globs_follow_go_path_match(pattern, name, matches):
    assert (go_glob(pattern).fullmatch(name) is not None) is matches


@pytest.mark.parametrize("bad", ["[", "[]a]", "a\\", "[z-a]", "[a-]"])
def test_malformed_globs_are_refused(bad):
    with pytest.raises(ValueError):
        go_glob(bad)
