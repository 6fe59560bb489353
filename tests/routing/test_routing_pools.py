"""ModelServer pools: P/D group pairing, sticky sessions (four sources, precedence, idle TTL, only a hash kept),
retries as fallback endpoints, the engine label."""

from __future__ import annotations

import base64

import orjson
from routing_helpers import chat, decide, hdrs, routed

from epp.request.director import LB_NS

HEAD = "apiVersion: networking.serving.volcano.sh/v1alpha1\n"


def server(name: str, body: str) -> str:
    return f"{HEAD}kind: ModelServer\nmetadata: {{name: {name}}}\nspec:\n{body}---\n"


def route_to(name: str, model: str = "m") -> str:
    return (f"{HEAD}kind: ModelRoute\nmetadata: {{name: r-{name}}}\nspec:\n  modelName: {model}\n"
            f"  rules: [{{name: all, targetModels: [{{modelServerName: {name}}}]}}]\n")


PD = server("pd", """  model: big-model
  inferenceEngine: vLLM
  workloadPort: {port: 8000}
  workloadSelector:
    pdGroup:
      groupKey: group
      prefillLabels: {role: p}
      decodeLabels: {role: d}
  endpoints:
  - {name: d1, address: 10.1.0.1, labels: {role: d, group: g1}}
  - {name: p1, address: 10.1.0.2, labels: {role: p, group: g1}}
  - {name: d2, address: 10.1.0.3, labels: {role: d, group: g2}}
  - {name: p2, address: 10.1.0.4, labels: {role: p, group: g2}}
  - {name: d3, address: 10.1.0.5, labels: {role: d, group: g3}}
  - {name: x9, address: 10.1.0.9, labels: {role: other, group: g1}}
""") + route_to("pd")
GROUP = {"10.1.0.1:8000": "g1", "10.1.0.2:8000": "g1", "10.1.0.3:8000": "g2", "10.1.0.4:8000": "g2"}


def test_pd_group_pairing_decode_pick_gets_a_prefill_of_its_own_group():
    d, svc = routed(PD)
    assert not svc.documents.errors
    snap = d.datastore.snapshot("modelserver:default/pd")
    roles = {e.key: e.labels.get("llm-d.ai/role") for e in snap.endpoints}
    assert "10.1.0.9:8000" not in roles  # neither prefill nor decode: not in the pool
    pairs = set()
    exchanges = []
    for i in range(40):
        body = chat("m", messages=[{"role": "user", "content": f"question {i} " * 30}])
        ex, out = decide(d, "m", body=body)
        h = hdrs(out)
        decode, prefill = h["x-gateway-destination-endpoint"], h["x-prefiller-host-port"]
        assert roles[decode] == "decode" and roles[prefill] == "prefill"
        assert GROUP[decode] == GROUP[prefill], (decode, prefill)
        assert decode != "10.1.0.5:8000"  # its group has no prefill endpoint: it never serves
        assert orjson.loads(out.body)["model"] == "big-model"
        pairs.add((decode, prefill))
        exchanges.append(ex)
    assert pairs == {("10.1.0.1:8000", "10.1.0.2:8000"), ("10.1.0.3:8000", "10.1.0.4:8000")}
    for ex in exchanges:
        ex.close()
    assert d.datastore.inflight.view() == {}


def test_pd_pool_without_any_pair_is_503():
    text = PD.replace("{role: p, group: g1}", "{role: p, group: g7}").replace("{role: p, group: g2}",
                                                                          "{role: p, group: g8}")
    d, _ = routed(text)
    _, out = decide(d, "m")
    assert out.reject_status == 503 and "prefill endpoint in its 'group' group" in out.reject_body


STICKY = server("s", """  inferenceEngine: vLLM
  workloadPort: {port: 8000}
  endpoints:
  - {name: e1, address: 10.2.0.1}
  - {name: e2, address: 10.2.0.2}
  - {name: e3, address: 10.2.0.3}
  trafficPolicy:
    sessionSticky:
      sessionAffinitySeconds: 30
      sources:
      - {type: Header, name: X-Session-ID}
      - {type: Query, name: session}
      - {type: Cookie, name: sid}
      - {type: JWTClaim, name: sub}
""") + route_to("s")


def jwt(claims: dict) -> str:
    enc = lambda b: base64.urlsafe_b64encode(b).rstrip(b"=").decode()  # noqa: E731
    return f"Bearer {enc(b'{}')}.{enc(orjson.dumps(claims))}.sig"


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def pick(d, headers=None, path=None):
    ex, out = decide(d, "m", headers=headers, path=path)
    assert out.reject_status == 0, out.reject_body
    return ex, hdrs(out)["x-gateway-destination-endpoint"]


def test_sticky_each_source_pins_the_session_to_its_endpoint():
    sources = [
        {"x-session-id": "abc"},
        {"cookie": "theme=dark; sid=abc"},
        {"authorization": jwt({"sub": "user-1"})},
    ]
    for headers in [*sources, None]:
        d, svc = routed(STICKY, clock=Clock())
        path = "/v1/chat/completions?session=abc" if headers is None else None
        _, first = pick(d, headers, path)
        # Other requests load the endpoints (least-loaded scheduler, streams left open): the session stays.
        for _ in range(5):
            pick(d)
            _, again = pick(d, headers, path)
            assert again == first, headers
        table = svc.router._sticky["default/s"]
        assert len(table) == 1 and "abc" not in repr(table.stored()) and "user-1" not in repr(table.stored())


def test_sticky_without_a_key_is_plain_scheduling():
    d, svc = routed(STICKY, clock=Clock())
    picks = {pick(d)[1] for _ in range(3)}
    assert len(picks) == 3 and len(svc.router._sticky["default/s"]) == 0


def test_sticky_first_non_empty_source_wins():
    d, _ = routed(STICKY, clock=Clock())
    _, by_header = pick(d, {"x-session-id": "h1"})
    _, by_query = pick(d, None, "/v1/chat/completions?session=q1")
    assert by_header != by_query
    # Both present: the header (first in the list) decides.
    _, both = pick(d, {"x-session-id": "h1"}, "/v1/chat/completions?session=q1")
    assert both == by_header
    # An empty header does not count: the query decides.
    _, empty_header = pick(d, {"x-session-id": ""}, "/v1/chat/completions?session=q1")
    assert empty_header == by_query


def test_sticky_idle_ttl_default_and_expiry():
    clock = Clock()
    d, svc = routed(STICKY, clock=clock)
    _, first = pick(d, {"x-session-id": "k"})
    busy = [pick(d) for _ in range(2)]  # load the others too
    clock.t += 29  # used within the TTL: still pinned (and refreshed)
    assert pick(d, {"x-session-id": "k"})[1] == first
    clock.t += 29
    assert pick(d, {"x-session-id": "k"})[1] == first
    for _ in range(6):
        pick(d)
    clock.t += 31  # idle past sessionAffinitySeconds: a new binding, to the least loaded endpoint
    loads = d.datastore.inflight.view()
    least = min(("10.2.0.1:8000", "10.2.0.2:8000", "10.2.0.3:8000"),
                key=lambda k: (loads[k].requests if k in loads else 0, k))
    assert pick(d, {"x-session-id": "k"})[1] == least
    del busy
    default = STICKY.replace("      sessionAffinitySeconds: 30\n", "")
    _, svc2 = routed(default)
    assert svc2.router.table.pools["default/s"].sticky.ttl_s == 300


def test_sticky_binding_to_a_departed_endpoint_is_dropped():
    d, svc = routed(STICKY, clock=Clock())
    _, first = pick(d, {"x-session-id": "k"})
    svc.load_text(STICKY.replace(f"  - {{name: e{first[-6]}, address: {first[:-5]}}}\n", ""), "routes.yaml")
    assert first not in {e.key for e in d.datastore.snapshot("modelserver:default/s").endpoints}
    assert len(svc.router._sticky["default/s"]) == 0
    assert pick(d, {"x-session-id": "k"})[1] != first


def test_retry_attempts_become_fallback_endpoints_in_envoy_lb_metadata():
    text = server("r", """  inferenceEngine: vLLM
  workloadPort: {port: 8000}
  endpoints: [{name: e1, address: 10.3.0.1}, {name: e2, address: 10.3.0.2}, {name: e3, address: 10.3.0.3}]
  trafficPolicy: {retry: {attempts: 2}}
""") + route_to("r")
    d, _ = routed(text)
    _, out = decide(d, "m")
    lb = out.metadata[LB_NS]["x-gateway-destination-endpoint"].split(",")
    assert len(lb) == 3 and len(set(lb)) == 3 and lb[0] == hdrs(out)["x-gateway-destination-endpoint"]
    assert hdrs(out)["x-envoy-max-retries"] == "2"
    no_retry, _ = routed(text.replace("trafficPolicy: {retry: {attempts: 2}}", "trafficPolicy: {}"))
    _, out = decide(no_retry, "m")
    assert "," not in out.metadata[LB_NS]["x-gateway-destination-endpoint"]
    assert hdrs(out)["x-envoy-max-retries"] == "0"


def test_pd_fallbacks_stay_in_the_decode_picks_group():
    text = PD.replace("  workloadPort: {port: 8000}\n", "  workloadPort: {port: 8000}\n  trafficPolicy: {retry: "
                      "{attempts: 3}}\n").replace("  - {name: d3, address: 10.1.0.5, labels: {role: d, group: g3}}\n",
                                                  "  - {name: d4, address: 10.1.0.6, labels: {role: d, group: g1}}\n")
    d, _ = routed(text)
    for _ in range(10):
        _, out = decide(d, "m")
        lb = out.metadata[LB_NS]["x-gateway-destination-endpoint"].split(",")
        groups = {"10.1.0.1:8000": "g1", "10.1.0.6:8000": "g1", "10.1.0.3:8000": "g2"}
        assert all(groups[k] == groups[lb[0]] for k in lb), lb  # never a decode of another group, never prefill
        assert hdrs(out)["x-envoy-max-retries"] == str(len(lb) - 1)


def test_sticky_pin_does_not_narrow_the_fallbacks():
    text = STICKY.replace("      sessionAffinitySeconds: 30\n", "      sessionAffinitySeconds: 30\n").replace(
        "  trafficPolicy:\n", "  trafficPolicy:\n    retry: {attempts: 2}\n")
    d, _ = routed(text, clock=Clock())
    pick(d, {"x-session-id": "k"})
    _, out = decide(d, "m", headers={"x-session-id": "k"})
    assert len(out.metadata[LB_NS]["x-gateway-destination-endpoint"].split(",")) == 3
