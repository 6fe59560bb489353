"""Kthena's ModelRoute / ModelServer documents: they load and route as the seed describes, one test per behaviour."""

from __future__ import annotations

import random

import orjson
import pytest
from routing_helpers import EXAMPLE, decide, hdrs, routed

from epp.request.resolve import resolve
from epp.routing.documents import DocumentSet, read_yaml
from epp.routing.matcher import select

ROUTE = """
apiVersion: networking.serving.volcano.sh/v1alpha1
kind: ModelServer
metadata: {name: a}
spec:
  inferenceEngine: vLLM
  workloadPort: {port: 8000}
  endpoints: [{name: a0, address: 10.0.0.1}]
---
apiVersion: networking.serving.volcano.sh/v1alpha1
kind: ModelServer
metadata: {name: b}
spec:
  inferenceEngine: vLLM
  workloadPort: {port: 8000}
  endpoints: [{name: b0, address: 10.0.0.2}]
---
apiVersion: networking.serving.volcano.sh/v1alpha1
kind: ModelServer
metadata: {name: c}
spec:
  inferenceEngine: vLLM
  workloadPort: {port: 8000}
  endpoints: [{name: c0, address: 10.0.0.3}]
"""


def route(rules: str, extra: str = "") -> str:
    return ROUTE + f"""---
apiVersion: networking.serving.volcano.sh/v1alpha1
kind: ModelRoute
metadata: {{name: r}}
spec:
  modelName: m
{extra}  rules:
{rules}"""


def test_the_example_loads_and_routes_as_documented():
    d, svc = routed(EXAMPLE.read_text())
    assert not svc.documents.errors
    assert svc.documents.counts() == {"ModelServer": 2, "ModelRoute": 1}
    # premium users: v2 (an SGLang ModelServer, ports from workloadPort and the endpoint's own)
    _, out = decide(d, headers={"user-type": "premium"})
    assert hdrs(out)["x-gateway-destination-endpoint"] in ("10.0.2.1:30000", "10.0.2.2:30001")
    snap = d.datastore.snapshot("modelserver:default/deepseek-v2")
    assert {e.key for e in snap.endpoints} == {"10.0.2.1:30000", "10.0.2.2:30001"}
    assert all(e.labels["llm-d.ai/engine-type"] == "sglang" for e in snap.endpoints)
    # everyone else: the 70/30 canary
    seen = {decide(d)[1].set_headers[0][1].rsplit(".", 1)[0] for _ in range(60)}
    assert seen == {"10.0.1", "10.0.2"}


def test_rules_are_tried_in_order_and_the_first_match_wins():
    text = route("""  - name: first
    modelMatch: {headers: {x-tier: {prefix: gold}}}
    targetModels: [{modelServerName: a}]
  - name: second
    modelMatch: {headers: {x-tier: {regex: "gold|silver"}}}
    targetModels: [{modelServerName: b}]
  - name: catch-all
    targetModels: [{modelServerName: c}]
""")
    d, _ = routed(text)
    dest = lambda **h: hdrs(decide(d, "m", headers=h)[1])["x-gateway-destination-endpoint"]  # noqa: E731
    assert dest(**{"x-tier": "gold-plus"}) == "10.0.0.1:8000"  # matches first and second: first wins
    assert dest(**{"x-tier": "silver"}) == "10.0.0.2:8000"
    assert dest(**{"x-tier": "bronze"}) == "10.0.0.3:8000"
    assert dest() == "10.0.0.3:8000"  # an empty match matches everything


def test_uri_and_body_model_matches():
    text = route("""  - name: completions
    modelMatch: {uri: {exact: /v1/completions}, body: {model: m}}
    targetModels: [{modelServerName: a}]
  - name: rest
    targetModels: [{modelServerName: b}]
""")
    d, _ = routed(text)
    body = orjson.dumps({"model": "m", "prompt": "hi"})
    _, out = decide(d, "m", body=body, path="/v1/completions?x=1")
    assert hdrs(out)["x-gateway-destination-endpoint"] == "10.0.0.1:8000"
    _, out = decide(d, "m")
    assert hdrs(out)["x-gateway-destination-endpoint"] == "10.0.0.2:8000"


def test_no_rule_matches_is_404():
    text = route("""  - name: only-gold
    modelMatch: {headers: {x-tier: {exact: gold}}}
    targetModels: [{modelServerName: a}]
""")
    d, _ = routed(text)
    _, out = decide(d, "m", headers={"x-tier": "silver"})
    assert out.reject_status == 404
    assert out.reject_body.startswith("inference error: NotFound - no rule of route(s) default/r")
    _, out = decide(d, "unrouted-model")
    assert out.reject_status == 404 and "no route for model 'unrouted-model'" in out.reject_body


def test_weights_split_traffic_chi_square_on_2000_picks():
    text = route("""  - name: split
    targetModels:
    - {modelServerName: a, weight: 50}
    - {modelServerName: b, weight: 30}
    - {modelServerName: c, weight: 20}
    - {modelServerName: c, weight: 0}
""")
    docs = DocumentSet()
    docs.replace("t", read_yaml(text, "t"))
    table = docs.table()
    rng = random.Random(42)
    counts = {"default/a": 0, "default/b": 0, "default/c": 0}
    for _ in range(2000):
        sel = select(table, "m", "/v1/chat/completions", {}, rng)
        counts[sel.target.backend] += 1
    expected = {"default/a": 1000, "default/b": 600, "default/c": 400}
    chi2 = sum((counts[k] - e) ** 2 / e for k, e in expected.items())
    assert chi2 < 13.8, (counts, chi2)  # p = 0.001 for 2 degrees of freedom
    # the same seed gives the same picks (the RNG is injected)
    again = [select(table, "m", "/", {}, random.Random(7)).target.backend for _ in range(5)]
    assert again == [select(table, "m", "/", {}, random.Random(7)).target.backend for _ in range(5)]


def test_model_overwrite_engine_sees_the_servers_model_and_the_client_its_own():
    text = ROUTE.replace("inferenceEngine: vLLM\n  workloadPort: {port: 8000}\n  endpoints: [{name: a0",
                         "model: real/model-7b\n  inferenceEngine: vLLM\n  workloadPort: {port: 8000}\n"
                         "  endpoints: [{name: a0", 1) + """---
apiVersion: networking.serving.volcano.sh/v1alpha1
kind: ModelRoute
metadata: {name: r}
spec:
  modelName: virtual
  rules: [{name: all, targetModels: [{modelServerName: a}]}]
"""
    d, _ = routed(text)
    ex, out = decide(d, "virtual")
    assert orjson.loads(out.body)["model"] == "real/model-7b"  # the engine sees the ModelServer's model
    assert hdrs(out)["X-Gateway-Model-Name"] == "real/model-7b"
    chunk = ex.response_body(b'{"id":"x","model":"real/model-7b","choices":[]}', True)
    assert b'"model":"virtual"' in chunk and b"real/model-7b" not in chunk  # the client sees its own name
    ex.close()


def test_lora_adapter_routes_keep_the_adapter_and_report_the_base_model():
    text = ROUTE.replace("inferenceEngine: vLLM", "model: base-7b\n  inferenceEngine: vLLM", 1) + """---
apiVersion: networking.serving.volcano.sh/v1alpha1
kind: ModelRoute
metadata: {name: loras}
spec:
  loraAdapters: [sql-lora, chat-lora]
  rules: [{name: all, targetModels: [{modelServerName: a}]}]
"""
    d, _ = routed(text)
    _, out = decide(d, "sql-lora")
    assert out.body is None  # an adapter is not overwritten (Kthena: only a modelName match overwrites)
    h = hdrs(out)
    assert h["X-Gateway-Model-Name"] == "sql-lora" and h["X-Gateway-Base-Model-Name"] == "base-7b"
    assert h["x-gateway-destination-endpoint"] == "10.0.0.1:8000"


def test_older_routes_win_and_a_route_without_a_matching_rule_passes_to_the_next():
    text = ROUTE + """---
apiVersion: networking.serving.volcano.sh/v1alpha1
kind: ModelRoute
metadata: {name: old}
spec:
  modelName: m
  rules: [{name: gold, modelMatch: {headers: {x-tier: {exact: gold}}}, targetModels: [{modelServerName: a}]}]
---
apiVersion: networking.serving.volcano.sh/v1alpha1
kind: ModelRoute
metadata: {name: new}
spec:
  modelName: m
  rules: [{name: all, targetModels: [{modelServerName: b}]}]
"""
    d, _ = routed(text)
    assert hdrs(decide(d, "m", headers={"x-tier": "gold"})[1])["x-gateway-destination-endpoint"] == "10.0.0.1:8000"
    assert hdrs(decide(d, "m")[1])["x-gateway-destination-endpoint"] == "10.0.0.2:8000"


def test_a_target_that_does_not_exist_is_404_naming_it():
    d, _ = routed(route("  - {name: x, targetModels: [{modelServerName: ghost}]}\n"))
    _, out = decide(d, "m")
    assert out.reject_status == 404 and "default/ghost" in out.reject_body and "rule 'x'" in out.reject_body


@pytest.mark.parametrize("extra,field", [
    ("  parentRefs: [{name: gw, namespace: infra, kind: Gateway}]\n", None),
])
def test_parent_refs_are_accepted_and_shown(extra, field):
    d, svc = routed(route("  - {name: x, targetModels: [{modelServerName: a}]}\n", extra))
    assert not svc.documents.errors
    assert svc.router.table.routes[0].parent_refs == ("Gateway infra/gw",)
    assert hdrs(decide(d, "m")[1])["x-gateway-destination-endpoint"] == "10.0.0.1:8000"


def test_rate_limit_is_parsed_and_exposed_on_the_decision():
    text = route("  - {name: x, targetModels: [{modelServerName: a}]}\n",
                 "  rateLimit:\n    inputTokensPerUnit: 1000\n    outputTokensPerUnit: 50\n    unit: minute\n"
                 "    global: {redis: {address: 'redis.infra:6379'}}\n")
    d, _ = routed(text)
    ctx, _ = resolve(d, {":path": "/v1/chat/completions", ":method": "POST"},
                     orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]}), {})
    rl = ctx.route.rate_limit
    assert (rl.input_tokens_per_unit, rl.output_tokens_per_unit, rl.unit, rl.unit_seconds, rl.redis_address) == \
        (1000, 50, "minute", 60, "redis.infra:6379")
    assert ctx.route.rate_limit_key == "ModelRoute/default/r"
    local, _ = routed(route("  - {name: x, targetModels: [{modelServerName: a}]}\n",
                            "  rateLimit: {outputTokensPerUnit: 7}\n"))
    ctx, _ = resolve(local, {":path": "/v1/completions"}, orjson.dumps({"model": "m", "prompt": "x"}), {})
    assert ctx.route.rate_limit == type(rl)(None, 7, "second", 1, None)
    none, _ = routed(route("  - {name: x, targetModels: [{modelServerName: a}]}\n"))
    ctx, _ = resolve(none, {":path": "/v1/completions"}, orjson.dumps({"model": "m", "prompt": "x"}), {})
    assert ctx.route.rate_limit is None


def test_decisions_are_counted_by_route_rule_and_target():
    from epp.api.metrics import EppMetrics
    from epp.fleet.datastore import Datastore
    from epp.request.director import Director
    from epp.routing.service import RoutingService

    ds = Datastore()
    metrics = EppMetrics(ds)
    svc = RoutingService(ds, random.Random(3), metrics=metrics)
    svc.load_text(route("  - {name: x, targetModels: [{modelServerName: a}]}\n"), "routes.yaml")
    d = Director(ds, routed("")[0].scheduler, router=svc.router)
    for _ in range(3):
        decide(d, "m")[0].close()
    text = metrics.exposition().decode()
    assert 'pointsman_route_decisions_total{route="ModelRoute/default/r",rule="x",target="default/a"} 3.0' in text
    assert 'pointsman_route_documents{kind="ModelServer"} 3.0' in text
