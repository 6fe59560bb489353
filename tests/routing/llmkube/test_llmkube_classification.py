"""The classification guard under hostile input: a request classified sensitive (pii, phi) is never sent to a cloud
backend, whatever the header looks like, whatever model it names, whichever rule it matches; it is served locally
or refused with a 503."""

from __future__ import annotations

import itertools

import pytest
from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from llmkube_helpers import Rig, cloud, finish, hdrs, local, router_doc

from epp.protocol.messages import read_headers
from epp.request.director import DESTINATION, LB_NS
from epp.routing.dialects.llmkube.classification import classifications

LOCAL = ["10.0.1.1:8000", "10.0.1.2:8000"]
CLOUD_POOL = ["10.9.9.9:8000"]  # an InferenceService can never be cloud; this pool backs "b-local"


def hostile_router(order: str = "pii-first") -> Rig:
    pii = {"name": "pii-stays-local", "match": {"dataClassification": ["pii", "phi"]},
           "route": {"backends": ["qwen"]}, "failClosed": True}
    complex_ = {"name": "complex-to-cloud", "match": {"taskComplexity": "complex"},
                "route": {"backends": ["opus", "qwen"]}}
    public = {"name": "public-cloud", "match": {"dataClassification": ["public"]},
              "route": {"backends": ["gpt", "opus"], "strategy": "weighted"}}
    rules = [pii, complex_, public] if order == "pii-first" else [complex_, public, pii]
    text = router_doc({
        "backends": [local("qwen", "svc-qwen"),
                     cloud("opus", provider="anthropic", model="claude-opus-4-7"),
                     cloud("gpt", provider="openai", model="gpt-5")],
        "rules": rules, "defaultRoute": "gpt", "defaultRouteStrategy": "BackendNameMatch",
        "proxy": {"quarantineDuration": "1h"}})
    r = Rig(text, {"svc-qwen": LOCAL})
    assert not r.errors, r.errors
    return r


def went_to_cloud(out) -> bool:
    h = hdrs(out)
    return bool(h.get("x-pointsman-provider"))


def outcome_is_safe(out) -> bool:
    """Served by the local pool, or refused (503; 400 for a body without a model); never a provider."""
    if out.reject_status:
        return out.reject_status in (400, 503)
    dest = out.metadata[LB_NS][DESTINATION].split(",")
    return not went_to_cloud(out) and all(d in LOCAL for d in dest)


HOSTILE_VALUES = [
    "pii", "PII", "Pii", " pii ", "pii\t", '"pii"', "'PHI'", "ｐｉｉ", "ＰＨＩ", "public, pii", "public,PHI",
    "pii,public", ",,pii,,", "public ,  pii", "pii;source=crm", "pii data", "internal|phi",
    ",".join(["public"] * 100 + ["pii"]),  # a long header cannot push the sensitive value out
]
MODELS = ["", "m", "gpt", "opus", "gpt-5", "claude-opus-4-7", "qwen", "*"]
COMPLEXITY = [None, "complex", "COMPLEX", "simple"]


@pytest.mark.parametrize("order", ["pii-first", "pii-last"])
def test_sensitive_requests_never_reach_a_cloud_backend(order):
    r = hostile_router(order)
    for value, model, complexity in itertools.product(HOSTILE_VALUES, MODELS, COMPLEXITY):
        headers = {"x-llmkube-classification": value}
        if complexity:
            headers["x-llmkube-task-complexity"] = complexity
        ex, out = r.decide(model=model, headers=headers)
        assert outcome_is_safe(out), (value, model, complexity, hdrs(out), out.reject_body)
        ex.close()


def test_the_same_requests_without_the_label_may_go_to_the_cloud():
    r = hostile_router()
    _, out = r.decide(model="gpt")
    assert went_to_cloud(out)  # BackendNameMatch: the guard is what keeps the labelled ones home
    _, out = r.decide(headers={"x-llmkube-classification": "public"})
    assert went_to_cloud(out)
    _, out = r.decide(headers={"x-llmkube-classification": "pi i"})
    assert went_to_cloud(out)  # not a sensitive value


def test_duplicate_and_mixed_case_headers_from_envoy_are_all_read():
    hs = pb.HttpHeaders(headers=base_pb2.HeaderMap(headers=[
        base_pb2.HeaderValue(key=":path", raw_value=b"/v1/chat/completions"),
        base_pb2.HeaderValue(key="X-LLMKube-Classification", raw_value=b"public"),
        base_pb2.HeaderValue(key="x-llmkube-classification", raw_value=b"PII"),
    ]))
    headers = read_headers(hs)
    assert classifications(headers, "x-llmkube-classification", {"pii"}) == {"public", "pii"}
    r = hostile_router("pii-last")  # public-cloud comes before the pii rule
    _, out = r.decide(headers={k: v for k, v in headers.items() if not k.startswith(":")})
    assert outcome_is_safe(out) and not out.reject_status  # the public rule's cloud backends were skipped
    info = r.explain(headers={"x-llmkube-classification": "public,PII"})
    assert info.route.rule == "pii-stays-local" or "skipped" in " ".join(info.route.notes)
    assert info.route.classification == "pii, public"


def test_a_sensitive_request_with_its_local_backend_down_is_refused_not_rerouted():
    r = hostile_router()
    for _ in range(4):  # both local pods fail twice in a row
        ex, out = r.decide(headers={"x-llmkube-classification": "pii"})
        assert out.metadata[LB_NS][DESTINATION].split(",")[0] in LOCAL
        finish(ex, status=503)
    for value in ("pii", "PHI", "public, pii"):
        _, out = r.decide(model="gpt", headers={"x-llmkube-classification": value,
                                                "x-llmkube-task-complexity": "complex"})
        assert out.reject_status == 503, hdrs(out)
        assert "fail-closed" in out.reject_body or "local backends only" in out.reject_body


def test_sensitive_requests_that_match_no_sensitive_rule_still_stay_local():
    """A sensitive rule narrowed by model lets other pii requests through to BackendNameMatch and the default
    route: the guard refuses the cloud ones there too."""
    text = router_doc({
        "backends": [local("qwen", "svc-qwen"), cloud("gpt", model="gpt-5")],
        "rules": [{"name": "pii-qwen", "match": {"dataClassification": ["pii"], "models": ["qwen*"]},
                   "route": {"backends": ["qwen"]}, "failClosed": True}],
        "defaultRoute": "gpt", "defaultRouteStrategy": "BackendNameMatch"})
    r = Rig(text, {"svc-qwen": LOCAL})
    _, out = r.decide(model="qwen3", headers={"x-llmkube-classification": "pii"})
    assert outcome_is_safe(out) and not out.reject_status
    for model in ("gpt", "anything"):
        _, out = r.decide(model=model, headers={"x-llmkube-classification": "PII"})
        assert out.reject_status == 503 and "local backends only" in out.reject_body, out.reject_body
        assert not went_to_cloud(out)
    _, out = r.decide(model="qwen", headers={"x-llmkube-classification": "pii"})  # BackendNameMatch -> qwen
    assert outcome_is_safe(out) and not out.reject_status


def test_explain_shows_the_guard_and_never_leaks():
    r = hostile_router("pii-last")
    info = r.explain(headers={"x-llmkube-classification": "public,pii", "x-llmkube-task-complexity": "complex"})
    assert info.status == 200
    assert info.route.backend == "qwen (local)"
    assert any("classified pii" in n for n in info.route.notes)
