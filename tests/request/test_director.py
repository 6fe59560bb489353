"""The director: candidates, mutations, errors and exact in-flight accounting."""

from __future__ import annotations

import orjson
import pytest

from epp.fleet.datastore import Datastore, PoolSpec
from epp.request.admit import SheddableAdmitter
from epp.request.director import DESTINATION, Director, DirectorConfig
from scheduling.api import SchedulingContext, SchedulingResult
from scheduling.types import Endpoint, ErrorCode, SchedulingError, endpoint_key


class LeastLoaded:
    """Orders candidates by the director's own in-flight count, then by key (deterministic)."""

    def __init__(self) -> None:
        self.pre: list[str] = []
        self.done: list[str] = []
        self.fail = False

    def schedule(self, ctx: SchedulingContext, *, dry_run: bool = False) -> SchedulingResult:
        if self.fail:
            raise RuntimeError("boom")
        eps = sorted(ctx.candidates, key=lambda e: (ctx.load(e).requests, e.key))
        return SchedulingResult(targets=eps, profile="test")

    def pre_request(self, ctx, result):
        self.pre.append(result.primary.key)

    def response_complete(self, ctx, result):
        self.done.append(result.primary.key)

    def endpoint_removed(self, key):
        pass


def ep(ip: str, port: int = 8000, **labels) -> Endpoint:
    return Endpoint(key=endpoint_key(ip, port), address=ip, port=port, labels=labels)


@pytest.fixture
def ds() -> Datastore:
    d = Datastore()
    d.set_pool(PoolSpec("pool"), [ep("10.0.0.1"), ep("10.0.0.2"), ep("10.0.0.3"), ep("fd00::1")])
    d.adapters = {"sql-lora": "llama"}
    return d


def chat(model="llama") -> bytes:
    return orjson.dumps({"model": model, "messages": [{"role": "user", "content": "hi"}]})


HDRS = {":path": "/v1/chat/completions", ":method": "POST"}


def decide(director, body=None, headers=None, metadata=None):
    ex = director.exchange()
    out = ex.decide({**HDRS, **(headers or {})}, chat() if body is None else body, metadata or {})
    return ex, out


def test_inflight_counts_are_exact_and_spread_load(ds):
    sched = LeastLoaded()
    d = Director(ds, sched)
    exchanges = [decide(d)[0] for _ in range(8)]
    counts = {k: v.requests for k, v in ds.inflight.view().items()}
    assert counts == {"10.0.0.1:8000": 2, "10.0.0.2:8000": 2, "10.0.0.3:8000": 2, "[fd00::1]:8000": 2}
    for ex in exchanges:
        ex.close()
        ex.close()  # a second close must not double-decrement
    assert ds.inflight.view() == {}
    assert sorted(sched.pre) == sorted(sched.done)


def test_mutations_headers_and_metadata(ds):
    d = Director(ds, LeastLoaded(), DirectorConfig(fallbacks=2))
    _, out = decide(d, body=chat("sql-lora"), headers={"x-request-id": "r1"})
    hdrs = dict(out.set_headers)
    assert hdrs[DESTINATION] == "10.0.0.1:8000"
    assert hdrs["X-Gateway-Model-Name"] == "sql-lora"
    assert hdrs["X-Gateway-Base-Model-Name"] == "llama"
    assert hdrs["x-ai-eg-model"] == "sql-lora"
    assert "x-request-id" not in hdrs
    assert out.metadata == {"envoy.lb": {DESTINATION: "10.0.0.1:8000,10.0.0.2:8000,10.0.0.3:8000"}}
    assert {"x-gateway-destination-endpoint-served", "x-prefiller-host-port"} <= set(out.remove_headers)
    assert out.clear_route_cache


def test_single_address_by_default_and_request_id_generated(ds):
    d = Director(ds, LeastLoaded(), DirectorConfig(ai_gateway_model_header=None))
    _, out = decide(d)
    hdrs = dict(out.set_headers)
    assert out.metadata == {"envoy.lb": {DESTINATION: hdrs[DESTINATION]}}
    assert "," not in hdrs[DESTINATION]
    assert "x-ai-eg-model" not in hdrs and len(hdrs["x-request-id"]) == 36


def test_subset_hint_list_or_string_restricts_on_ip(ds):
    d = Director(ds, LeastLoaded())
    ns = "envoy.lb.subset_hint"
    _, out = decide(d, metadata={ns: {"x-gateway-destination-endpoint-subset": ["10.0.0.3:9999"]}})
    assert dict(out.set_headers)[DESTINATION] == "10.0.0.3:8000"
    _, out = decide(d, metadata={ns: {"x-gateway-destination-endpoint-subset": "10.0.0.9:1, [fd00::1]:8000"}})
    assert dict(out.set_headers)[DESTINATION] == "[fd00::1]:8000"
    _, out = decide(d, metadata={ns: {"x-gateway-destination-endpoint-subset": []}})
    assert out.reject_status == 503 and "subset" in out.reject_body


def test_conformance_header_only_behind_the_flag(ds):
    hdr = {"test-epp-endpoint-selection": "10.0.0.2"}
    _, out = decide(Director(ds, LeastLoaded()), headers=hdr)
    assert dict(out.set_headers)[DESTINATION] == "10.0.0.1:8000"
    _, out = decide(Director(ds, LeastLoaded(), DirectorConfig(conformance=True)), headers=hdr)
    assert dict(out.set_headers)[DESTINATION] == "10.0.0.2:8000"


def test_errors_are_explicit(ds):
    d = Director(ds, LeastLoaded())
    _, out = decide(d, body=b"{")
    assert out.reject_status == 400 and out.reject_body.startswith("inference error: BadRequest - ")
    _, out = decide(d, body=b"", headers={":method": "POST"})
    assert out.reject_status == 400 and "no body" in out.reject_body
    empty = Datastore()
    empty.set_pool(PoolSpec("p"), [])
    _, out = decide(Director(empty, LeastLoaded()))
    assert out.reject_status == 503 and out.reject_body.startswith("inference error: ServiceUnavailable")
    sched = LeastLoaded()
    sched.fail = True
    ex, out = decide(Director(ds, sched))
    assert out.reject_status == 500 and "boom" in out.reject_body
    ex.close()
    assert ds.inflight.view() == {}


def test_scheduler_errors_keep_their_code(ds):
    class Exhausted(LeastLoaded):
        def schedule(self, ctx, *, dry_run=False):
            raise SchedulingError(ErrorCode.RESOURCE_EXHAUSTED, "all filtered")

    _, out = decide(Director(ds, Exhausted()))
    assert out.reject_status == 429 and out.reject_body == "inference error: ResourceExhausted - all filtered"


def test_model_rewrite_header_rewrites_body_and_response(ds):
    d = Director(ds, LeastLoaded())
    ex, out = decide(d, headers={"x-gateway-model-name-rewrite": "llama-v2"})
    assert orjson.loads(out.body)["model"] == "llama-v2"
    assert dict(out.set_headers)["X-Gateway-Model-Name"] == "llama-v2"
    ex.response_headers({"content-type": "application/json"}, {})
    back = ex.response_body(b'{"model":"llama-v2","usage":{"prompt_tokens":3,"completion_tokens":1}}', True)
    assert orjson.loads(back)["model"] == "llama"
    assert ex.scanner.usage.prompt_tokens == 3


def test_llm_d_header_names_come_first_and_the_gie_names_stay(ds):
    ds.objectives = {"batch": -1, "chat": 10}
    d = Director(ds, LeastLoaded())
    ex, out = decide(d, headers={"x-llm-d-model-name-rewrite": "llama-v3", "x-gateway-model-name-rewrite": "old"})
    assert orjson.loads(out.body)["model"] == "llama-v3"
    ex, out = decide(d, headers={"x-llm-d-model-name-rewrite": "", "x-gateway-model-name-rewrite": "llama-v2"})
    assert orjson.loads(out.body)["model"] == "llama-v2", "an empty current name falls back to the old one"
    ex, _ = decide(d, headers={"x-llm-d-inference-objective": "batch", "x-gateway-inference-objective": "chat"})
    assert (ex.request.objective, ex.request.priority) == ("batch", -1)
    ex, _ = decide(d, headers={"x-gateway-inference-objective": "chat"})
    assert (ex.request.objective, ex.request.priority) == ("chat", 10)


def test_served_endpoint_read_from_metadata(ds):
    d = Director(ds, LeastLoaded(), DirectorConfig(conformance=True))
    ex, _ = decide(d)
    sets = ex.response_headers({}, {"envoy.lb": {"x-gateway-destination-endpoint-served": "10.0.0.2:8000"}})
    assert ex.reply.served == "10.0.0.2:8000"
    assert sets == [("x-conformance-test-served-endpoint", "10.0.0.2:8000")]


def test_negative_priority_is_shed_when_admission_says_so(ds):
    ds.objectives = {"batch": -1, "chat": 10}
    d = Director(ds, LeastLoaded(), admitters=[SheddableAdmitter(lambda prio, eps, now: False)])
    _, out = decide(d, headers={"x-gateway-inference-objective": "batch"})
    assert out.reject_status == 429
    _, out = decide(d, headers={"x-gateway-inference-objective": "chat"})
    assert out.reject_status == 0


def test_unhealthy_endpoints_are_skipped_but_never_all(ds):
    d = Director(ds, LeastLoaded())
    ds.unhealthy.update({"10.0.0.1:8000", "10.0.0.2:8000"})
    _, out = decide(d)
    assert dict(out.set_headers)[DESTINATION] == "10.0.0.3:8000"
    ds.unhealthy.update({"10.0.0.3:8000", "[fd00::1]:8000"})
    _, out = decide(d)
    assert out.reject_status == 0, "all out of rotation fails open rather than refusing every request"
