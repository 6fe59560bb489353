"""The weighted strategy: per request in proportion to weight among the healthy capable backends (chi-square on
2,000 real decisions), weight 0 drains, and fallbacks are drawn the same way, never the same backend twice."""

from __future__ import annotations

import random
from collections import Counter

from llmkube_helpers import Rig, finish, local, router_doc

from epp.request.director import DESTINATION, LB_NS
from epp.routing.dialects.llmkube.match import weighted_order
from epp.routing.dialects.llmkube.model import RouterBackend
from epp.routing.model import Target

POOLS = {"svc-a": ["10.0.1.1:8000"], "svc-b": ["10.0.2.1:8000"], "svc-c": ["10.0.3.1:8000"],
         "svc-d": ["10.0.4.1:8000"]}
WHERE = {"10.0.1.1:8000": "a", "10.0.2.1:8000": "b", "10.0.3.1:8000": "c", "10.0.4.1:8000": "d"}


def rig(weights: dict[str, int], **extra) -> Rig:
    backends = [local(n, f"svc-{n}", weight=w, **extra.pop(n, {})) for n, w in weights.items()]
    r = Rig(router_doc({"backends": backends, "rules": [
        {"name": "split", "route": {"backends": list(weights), "strategy": "weighted"}, **extra}],
        "proxy": {"quarantineDuration": "1h"}}), POOLS, seed=11)
    assert not r.errors, r.errors
    return r


def chi2(counts: Counter, weights: dict[str, int], n: int) -> float:
    total = sum(w for w in weights.values() if w > 0)
    return sum((counts[k] - n * w / total) ** 2 / (n * w / total) for k, w in weights.items() if w > 0)


def test_weighted_split_is_proportional_chi_square_on_2000_decisions():
    weights = {"a": 5, "b": 3, "c": 2, "d": 0}
    r = rig(weights)
    counts: Counter = Counter()
    for _ in range(2000):
        ex, out = r.decide()
        counts[WHERE[out.metadata[LB_NS][DESTINATION].split(",")[0]]] += 1
        ex.close()
    assert counts["d"] == 0  # weight 0 drains
    assert chi2(counts, weights, 2000) < 13.8, counts  # p = 0.001 for 2 degrees of freedom


def test_weight_zero_drains_even_when_every_other_backend_is_down():
    r = rig({"a": 1, "d": 0})
    for _ in range(2):
        ex, out = r.decide()
        assert WHERE[out.metadata[LB_NS][DESTINATION].split(",")[0]] == "a"
        finish(ex, status=503)
    _, out = r.decide()
    assert out.reject_status == 503  # d (weight 0) never serves, and there is no defaultRoute
    assert "d drained (weight 0)" in out.reject_body and "no healthy backend" in out.reject_body


def test_only_healthy_backends_share_the_traffic():
    weights = {"a": 1, "b": 1, "c": 1}
    r = rig(weights)
    while True:  # quarantine c: its pod fails twice in a row
        ex, out = r.decide()
        lb = out.metadata[LB_NS][DESTINATION].split(",")
        if WHERE[lb[0]] == "c":
            finish(ex, status=500)
            if r.runtime.tracker.state("10.0.3.1:8000", r.clock()) == "quarantined":
                break
        else:
            finish(ex)
    counts: Counter = Counter()
    for _ in range(600):
        ex, out = r.decide()
        lb = out.metadata[LB_NS][DESTINATION].split(",")
        counts[WHERE[lb[0]]] += 1
        assert "10.0.3.1:8000" not in lb  # nor as a fallback
        ex.close()
    assert counts["c"] == 0 and chi2(counts, {"a": 1, "b": 1}, 600) < 10.8  # p = 0.001, 1 degree of freedom


def test_fallbacks_are_drawn_by_weight_and_never_repeat():
    r = rig({"a": 1, "b": 1, "c": 1})
    second: Counter = Counter()
    for _ in range(600):
        ex, out = r.decide()
        lb = [WHERE[k] for k in out.metadata[LB_NS][DESTINATION].split(",")]
        assert sorted(lb) == ["a", "b", "c"]  # each backend once
        second[(lb[0], lb[1])] += 1
        ex.close()
    assert len(second) == 6 and min(second.values()) > 50  # every order appears


def test_weighted_order_draws_without_replacement_in_proportion():
    bs = [RouterBackend(n, Target("pool", n, w), "local", n, weight=w) for n, w in (("x", 9), ("y", 1), ("z", 0))]
    rng = random.Random(3)
    firsts = Counter(weighted_order(bs, rng)[0].name for _ in range(2000))
    assert firsts["z"] == 0 and 1700 < firsts["x"] < 1900
    assert all(len(weighted_order(bs, rng)) == 2 for _ in range(50))
