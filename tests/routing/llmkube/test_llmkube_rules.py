"""A ModelRouter routes as the seed says, one test per behaviour: rules in order, each match condition, the
strategies' fallbacks, failClosed, defaultRoute and BackendNameMatch, timeouts and the gateway headers."""

from __future__ import annotations

import orjson
from llmkube_helpers import Rig, cloud, finish, hdrs, local, router_doc, served

from epp.request.director import DESTINATION, LB_NS

A = ["10.0.1.1:8000", "10.0.1.2:8000"]
B = ["10.0.2.1:8000"]
C = ["10.0.3.1:8000"]
POOLS = {"svc-a": A, "svc-b": B, "svc-c": C}
BACKENDS = [local("a", "svc-a"), local("b", "svc-b"), local("c", "svc-c")]


def rig(rules: list, **spec) -> Rig:
    r = Rig(router_doc({"backends": spec.pop("backends", BACKENDS), "rules": rules, **spec}), POOLS)
    assert not r.errors, r.errors
    return r


def rule(name: str, backends: list[str], match: dict | None = None, **extra) -> dict:
    out: dict = {"name": name, "route": {"backends": backends, **extra.pop("route", {})}, **extra}
    if match is not None:
        out["match"] = match
    return out


def route_of(r: Rig, **kw) -> tuple[str, str]:
    """(rule, backend) of the next decision, from explain (a dry run) and then a real request agreeing with it."""
    info = r.explain(**kw)
    assert info.status == 200, info.error
    ex, out = r.decide(**{k: v for k, v in kw.items() if k in ("model", "headers", "body")})
    assert not out.reject_status, out.reject_body
    ex.close()
    return info.route.rule, info.route.backend.split(" ")[0]


def test_rules_are_tried_in_order_and_the_first_match_wins():
    r = rig([rule("first", ["a"], {"headers": {"x-team": "blue"}}),
             rule("second", ["b"], {"headers": {"x-team": "blue"}}),
             rule("catch-all", ["c"])])
    assert route_of(r, headers={"x-team": "blue"}) == ("first", "a")
    assert route_of(r, headers={"x-team": "red"}) == ("catch-all", "c")


def test_match_models_globs():
    r = rig([rule("qwen", ["a"], {"models": ["qwen3-*", "llama-?"]}), rule("rest", ["b"])])
    assert route_of(r, model="qwen3-coder")[1] == "a"
    assert route_of(r, model="llama-3")[1] == "a"
    assert route_of(r, model="qwen2-coder")[1] == "b"
    assert route_of(r, model="llama-31")[1] == "b"


def test_match_headers_exact_with_case_insensitive_names():
    r = rig([rule("h", ["a"], {"headers": {"X-Tenant": "Acme"}}), rule("rest", ["b"])])
    assert route_of(r, headers={"x-tenant": "Acme"})[1] == "a"
    assert route_of(r, headers={"x-tenant": "acme"})[1] == "b"  # values are exact
    assert route_of(r, headers={"x-tenant": "Acme "})[1] == "b"
    assert route_of(r)[1] == "b"  # missing fails the match


def test_match_data_classification_from_the_configured_header():
    r = rig([rule("secret", ["a"], {"dataClassification": ["confidential"]}), rule("rest", ["b"])],
            policy={"classification": {"headerKey": "X-Data-Class"}})
    assert route_of(r, headers={"x-data-class": "Confidential"})[1] == "a"
    assert route_of(r, headers={"x-llmkube-classification": "confidential"})[1] == "b"  # not the header in use
    assert route_of(r)[1] == "b"  # no header: no classification rule matches


def test_match_task_complexity():
    r = rig([rule("hard", ["a"], {"taskComplexity": "complex"}), rule("rest", ["b"])])
    assert route_of(r, headers={"x-llmkube-task-complexity": "complex"})[1] == "a"
    assert route_of(r, headers={"x-llmkube-task-complexity": "COMPLEX"})[1] == "a"
    assert route_of(r, headers={"x-llmkube-task-complexity": "simple"})[1] == "b"


def test_required_capabilities_match_and_only_capable_backends_serve_even_as_fallbacks():
    backends = [local("a", "svc-a", capabilities=["tools"]), local("b", "svc-b", capabilities=["tools", "vision"]),
                local("c", "svc-c")]
    r = rig([rule("vision", ["a", "b", "c"], {"requiredCapabilities": ["vision"]}),
             rule("nobody", ["a", "c"], {"requiredCapabilities": ["audio"]}),
             rule("rest", ["c"])], backends=backends)
    info = r.explain()
    assert info.route.rule == "vision" and info.route.backend.startswith("b ")
    assert list(info.route.fallbacks) == []  # a and c lack vision: never tried
    _, out = r.decide()
    assert out.metadata[LB_NS][DESTINATION] == B[0]
    # a rule whose backends cannot serve the capability does not match
    r2 = rig([rule("nobody", ["a", "c"], {"requiredCapabilities": ["audio"]}), rule("rest", ["c"])],
             backends=backends)
    assert route_of(r2) == ("rest", "c")


def test_primary_fallback_lists_the_fallbacks_in_order_for_envoy_retries():
    r = rig([rule("pf", ["a", "b", "c"])])
    ex, out = r.decide()
    lb = out.metadata[LB_NS][DESTINATION].split(",")
    assert lb[0] in A and lb[1:] == [B[0], C[0]]
    assert hdrs(out)["x-envoy-max-retries"] == "2"
    info = r.explain()
    assert list(info.route.fallbacks) == ["b (local)", "c (local)"] and info.route.strategy == "primary-fallback"


def test_a_quarantined_primary_is_skipped_in_favour_of_the_next_backend():
    r = rig([rule("pf", ["b", "a"])], proxy={"quarantineDuration": "10s"})
    for _ in range(2):  # b's only pod fails twice in a row
        ex, out = r.decide()
        assert served(out) == B[0]
        finish(ex, status=503)
    ex, out = r.decide()
    assert served(out) in A
    assert any("every endpoint is quarantined" in n for n in r.explain().route.notes)


def test_fail_closed_answers_503_and_never_falls_through():
    r = rig([rule("strict", ["b"], {"headers": {"x-strict": "1"}}, failClosed=True), rule("rest", ["a"])],
            defaultRoute="c", proxy={"quarantineDuration": "10s"})
    for _ in range(2):
        ex, out = r.decide(headers={"x-strict": "1"})
        finish(ex, status=500)
    ex, out = r.decide(headers={"x-strict": "1"})
    assert out.reject_status == 503
    assert "fail-closed" in out.reject_body and "'strict'" in out.reject_body
    # a request the rule does not match is unaffected
    _, out = r.decide()
    assert served(out) in A


def test_a_rule_without_a_healthy_backend_falls_through_when_not_fail_closed():
    r = rig([rule("soft", ["b"], {"headers": {"x-soft": "1"}}), rule("next", ["c"], {"headers": {"x-soft": "1"}})],
            defaultRoute="a", proxy={"quarantineDuration": "10s"})
    for _ in range(2):
        ex, _ = r.decide(headers={"x-soft": "1"})
        finish(ex, status=502)
    info = r.explain(headers={"x-soft": "1"})
    assert (info.route.rule, info.route.backend) == ("next", "c (local)")
    assert any("'soft' matched but has no healthy backend" in n for n in info.route.notes)


def test_latency_slo_promotes_the_fallback_when_the_primary_p95_is_above_it():
    r = rig([rule("fast", ["a", "b"], {"latencySLOMs": 200})])
    clock = r.clock
    for delay in (0.05, 0.05, 0.5):  # P95 of (50, 50, 500) ms = 500 ms > 200
        ex, out = r.decide()
        assert served(out) in A
        clock.t += delay
        finish(ex)
    info = r.explain()
    assert info.route.backend == "b (local)" and list(info.route.fallbacks) == ["a (local)"]
    assert any("promoted" in n for n in info.route.notes)


def test_default_route_static_when_no_rule_matches():
    r = rig([rule("h", ["a"], {"headers": {"x-h": "1"}})], defaultRoute="c")
    info = r.explain(model="b")  # Static ignores the model naming a backend
    assert (info.route.rule, info.route.backend) == ("defaultRoute", "c (local)")


def test_backend_name_match_then_default_route():
    backends = [local("a", "svc-a", displayName="qwen3-coder-30b"), local("b", "svc-b"), local("c", "svc-c"),
                cloud("opus", provider="anthropic", model="claude-opus-4-7")]
    r = rig([rule("h", ["a"], {"headers": {"x-h": "1"}})], backends=backends, defaultRoute="c",
            defaultRouteStrategy="BackendNameMatch", proxy={"quarantineDuration": "10s"})
    assert route_of(r, model="qwen3-coder-30b") == ("backendNameMatch", "a")  # the displayName
    assert route_of(r, model="a") == ("defaultRoute", "c")  # a's name is not published: its displayName is
    assert route_of(r, model="b") == ("backendNameMatch", "b")
    assert route_of(r, model="claude-opus-4-7") == ("defaultRoute", "c")  # never the provider's model
    assert route_of(r, model="b", headers={"x-h": "1"}) == ("h", "a")  # rules come first
    for _ in range(2):
        ex, _ = r.decide(model="b")
        finish(ex, status=500)
    _, out = r.decide(model="b")  # naming a sick backend is an honest 503, not a silent reroute
    assert out.reject_status == 503 and "named by the request's model" in out.reject_body


def test_nothing_resolves_is_a_503():
    r = rig([rule("h", ["a"], {"headers": {"x-h": "1"}})])
    _, out = r.decide()
    assert out.reject_status == 503 and "no defaultRoute" in out.reject_body


def test_timeouts_rule_then_backend_then_proxy_default_and_never_above_it():
    backends = [local("a", "svc-a", timeout="20s"), local("b", "svc-b"), local("c", "svc-c", timeout="10m")]
    r = rig([rule("r", ["a"], {"headers": {"x-r": "1"}}, route={"timeout": "5s"}),
             rule("b", ["a"], {"headers": {"x-r": "2"}}), rule("p", ["b"], {"headers": {"x-r": "3"}}),
             rule("cap", ["c"])], backends=backends, proxy={"responseHeaderTimeout": "60s"})
    got = {}
    for v in "1234":
        _, out = r.decide(headers={"x-r": v})
        got[v] = hdrs(out).get("x-envoy-upstream-rq-timeout-ms")
    assert got == {"1": "5000", "2": "20000", "3": "60000", "4": "60000"}
    _, out = r.decide(headers={"x-r": "1"}, stream=True)  # a streamed response is bounded by its idle timeout
    assert "x-envoy-upstream-rq-timeout-ms" not in hdrs(out)


def test_gateway_routing_headers_carry_the_serving_backends_published_name():
    backends = [local("a", "svc-a", displayName="qwen3-coder"), local("b", "svc-b")]
    r = rig([rule("h", ["b"], {"headers": {"x-h": "1"}})], backends=backends, defaultRoute="a")
    _, out = r.decide(model="whatever")
    h = hdrs(out)
    assert h["x-gateway-base-model-name"] == "qwen3-coder" and h["x-ai-eg-model"] == "qwen3-coder"
    assert h["x-gateway-model-name"] == "whatever"  # the engine's model is untouched
    names = [k.lower() for k, _ in out.set_headers]
    assert names.count("x-gateway-base-model-name") == 1  # one value, the routing one
    _, out = r.decide(headers={"x-h": "1"})
    assert hdrs(out)["x-gateway-base-model-name"] == "b"


def test_an_external_backend_gets_its_cluster_credential_and_model(tmp_path):
    (tmp_path / "openai-key").mkdir()
    (tmp_path / "openai-key" / "OPENAI_API_KEY").write_text("sk-test-123\n")
    text = router_doc({"backends": [local("a", "svc-a"), cloud("gpt", model="gpt-5", external={
        "url": "https://llm.example.com/v1", "credentialsSecretRef": {"name": "openai-key"}})],
        "rules": [rule("cloud", ["gpt"], {"taskComplexity": "complex"})], "defaultRoute": "a"})
    r = Rig(text, POOLS, secrets_dir=str(tmp_path))
    assert not r.errors
    ex, out = r.decide(model="mine", headers={"x-llmkube-task-complexity": "complex", "authorization": "Bearer u"})
    h = hdrs(out)
    assert h["x-pointsman-provider"] == "provider.default.r.gpt"
    assert h["authorization"] == "Bearer sk-test-123"
    assert h[":path"] == "/v1/chat/completions"
    assert orjson.loads(out.body)["model"] == "gpt-5"
    assert "x-gateway-destination-endpoint" in out.remove_headers
    info = r.explain(headers={"x-llmkube-task-complexity": "complex"})
    assert info.headers["authorization"] == "<redacted>"
    assert "sk-test" not in str(info)


def test_a_client_never_sets_the_mirror_or_provider_headers():
    r = rig([rule("pf", ["a"])])
    _, out = r.decide(headers={"x-pointsman-mirrors": "1", "x-pointsman-mirror-1": "6.6.6.6:80",
                               "x-pointsman-provider": "evil"})
    assert {"x-pointsman-mirrors", "x-pointsman-mirror-1", "x-pointsman-provider"} <= set(out.remove_headers)
    assert "x-pointsman-mirrors" not in hdrs(out)
