"""A local backend's `balancing`: RoundRobin, LoadAware (least work), prefix affinity over the bytes of tools,
system prompt and messages (whole blocks, an LRU per pod), and session affinity that moves a session only when its
pod is queuing and clearly busier, then keeps it where it moved."""

from __future__ import annotations

import orjson
from llmkube_helpers import Rig, finish, local, router_doc, served

from epp.request.director import DESTINATION, LB_NS
from scheduling.api import SchedulingContext, SchedulingResult
from scheduling.plugins.scorers.byte_prefix_affinity import BytePrefixAffinityScorer, Params, prompt_bytes
from scheduling.types import Endpoint, LLMRequest, Metrics

PODS = ["10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.3:8000"]


def rig(balancing: dict | None, pods: list[str] = PODS) -> Rig:
    b = local("a", "svc", resolution="endpoint", **({"balancing": balancing} if balancing else {}))
    r = Rig(router_doc({"backends": [b], "defaultRoute": "a"}), {"svc": pods})
    assert not r.errors, r.errors
    return r


def load(r: Rig, **by_pod: tuple[int, int]) -> None:
    """Engine metrics per pod: (waiting, running)."""
    r.ds.update_metrics({f"10.0.0.{i}:8000": Metrics(waiting=w, running=n, updated_at=r.clock(), stale=False)
                         for i, (w, n) in ((int(k[1:]), v) for k, v in by_pod.items())})


def test_round_robin_takes_turns_and_explain_does_not_move_the_turn():
    r = rig(None)
    picks = []
    for _ in range(6):
        assert r.explain().endpoint == PODS[len(picks) % 3]  # the dry run shows the next one, and keeps it
        ex, out = r.decide()
        picks.append(served(out))
        ex.close()
    assert picks == PODS * 2


def test_round_robin_with_affinity_set_ignores_it():
    r = rig({"mode": "RoundRobin", "sessionAffinity": {"headers": ["x-session"]}})
    picks = []
    for _ in range(3):
        ex, out = r.decide(headers={"x-session": "same"})
        picks.append(served(out))
        ex.close()
    assert picks == PODS
    assert any("SessionAffinityIgnored" in w for w in r.runtime.spec.warnings)


def test_load_aware_sends_to_the_pod_with_the_least_work():
    r = rig({"mode": "LoadAware"})
    load(r, p1=(3, 4), p2=(0, 2), p3=(1, 4))
    ex, out = r.decide()
    assert served(out) == PODS[1]
    # work = max(waiting + running, in flight): p2 stays the least loaded while its in-flight requests are
    # already part of what the engine reports
    ex2, out2 = r.decide()
    ex3, out3 = r.decide()
    assert served(out2) == PODS[1] and served(out3) == PODS[1]  # max(2, 1) = 2, max(2, 2) = 2 < 5 < 7
    ex5, out5 = r.decide()
    ex6, out6 = r.decide()
    ex7, out7 = r.decide()  # in flight 3, 4, 5 on p2 outgrow the scrape: max(2, 5) = 5 ties p3
    assert [served(o) for o in (out5, out6)] == [PODS[1], PODS[1]] and served(out7) in (PODS[1], PODS[2])
    for e in (ex5, ex6, ex7):
        e.close()
    r.ds.update_metrics({PODS[1]: Metrics(waiting=5, running=5, updated_at=r.clock(), stale=False)})
    _, out4 = r.decide()
    assert served(out4) == PODS[2]  # p3: 5 < p1: 7 < p2: 10
    for e in (ex, ex2, ex3):
        e.close()


def test_load_aware_without_engine_metrics_counts_in_flight_requests():
    r = rig({"mode": "LoadAware"})
    held = []
    for _ in range(3):
        ex, out = r.decide()
        held.append((ex, served(out)))
    assert sorted(p for _, p in held) == PODS  # one each: the least in flight every time
    for ex, _ in held:
        ex.close()


def chat(system: str, user: str, tools: list | None = None) -> dict:
    body = {"model": "m", "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}]}
    if tools:
        body["tools"] = tools
    return body


def test_prefix_affinity_sends_a_shared_prefix_to_the_pod_that_was_sent_it():
    r = rig({"mode": "LoadAware", "prefixAffinity": {"blockBytes": 256}})
    sys_a, sys_b = "A" * 2000, "B" * 2000
    ex, out = r.decide(body=chat(sys_a, "first question"))
    home_a = served(out)
    finish(ex)
    ex, out = r.decide(body=chat(sys_b, "first question"))
    home_b = served(out)
    finish(ex)
    assert home_b != home_a  # no shared block: the least-loaded pod (in-flight ties broken at random)
    for i in range(5):
        ex, out = r.decide(body=chat(sys_a, f"follow-up {i}"))
        assert served(out) == home_a
        finish(ex)
        ex, out = r.decide(body=chat(sys_b, f"follow-up {i}"))
        assert served(out) == home_b
        finish(ex)
    info = r.explain(body=chat(sys_a, "again"))
    [run] = info.profiles
    scores = {p.name: dict(p.scores) for p in run.plugins if p.kind == "scorer"}
    assert scores["byte-prefix-affinity-scorer"][home_a] > 0.8
    assert scores["byte-prefix-affinity-scorer"][home_b] == 0.0


def test_prefix_affinity_is_traded_against_load():
    r = rig({"mode": "LoadAware", "prefixAffinity": {"blockBytes": 256}})
    ex, out = r.decide(body=chat("S" * 3000, "q"))
    home = served(out)
    finish(ex)
    # a tiny shared prefix (one block in ~13) does not outweigh a much busier pod
    busy = {p: (0, 0) for p in ("p1", "p2", "p3")}
    busy[f"p{PODS.index(home) + 1}"] = (20, 20)
    load(r, **busy)
    _, out = r.decide(body=chat("S" * 300 + "T" * 2700, "q"))
    assert served(out) != home
    # the full prefix does (2 × 1.0 prefix beats the 1.0 load range)
    _, out = r.decide(body=chat("S" * 3000, "q"))
    assert served(out) == home


def test_prefix_bytes_are_tools_system_and_messages_in_whole_blocks():
    tools = [{"type": "function", "function": {"name": "f"}}]
    body = {"model": "m", "system": "sys", "tools": tools, "messages": [{"role": "user", "content": "hi"}]}
    assert prompt_bytes(body, "ignored") == orjson.dumps(tools) + b"sys" + orjson.dumps(body["messages"])
    assert prompt_bytes({"prompt": "x"}, "the prompt") == b"the prompt"
    scorer = BytePrefixAffinityScorer(params=Params(blockBytes=64, maxBlocksPerEndpoint=3))
    eps = [Endpoint("e1", "10.0.0.1", 1, "e1", "ns", {}), Endpoint("e2", "10.0.0.2", 1, "e2", "ns", {})]

    def ctx(prompt: str) -> SchedulingContext:
        return SchedulingContext(LLMRequest("r", "m", "m", prompt=prompt), eps)

    def send(prompt: str, ep: Endpoint) -> None:
        c, state = ctx(prompt), {}
        scorer.score(c, eps, state)
        scorer.pre_request(c, SchedulingResult(targets=[ep]), state)

    assert scorer.score(ctx("x" * 63), eps, {}) == [0.0, 0.0]  # no whole block: no affinity
    send("a" * 64 * 2, eps[0])
    assert scorer.score(ctx("a" * 64 * 2), eps, {}) == [1.0, 0.0]
    assert scorer.score(ctx("a" * 64 + "b" * 64), eps, {}) == [0.5, 0.0]
    send("c" * 64 * 2, eps[0])  # 4 blocks sent, cap 3: the least recently sent goes (the tail of the first)
    assert len(scorer.sent["e1"]) == 3
    assert scorer.score(ctx("a" * 64 * 2), eps, {}) == [0.5, 0.0]
    assert scorer.score(ctx("c" * 64 * 2), eps, {}) == [1.0, 0.0]
    scorer.endpoint_removed("e1")
    assert scorer.score(ctx("c" * 64 * 2), eps, {}) == [0.0, 0.0] and "e1" not in scorer.tracked_endpoints()


def session_rig() -> Rig:
    return rig({"mode": "LoadAware", "sessionAffinity": {"headers": ["X-Session-Id", "x-user"],
                                                        "idleTimeout": "1m"}})


def test_a_new_session_goes_to_the_least_loaded_pod_and_stays():
    r = session_rig()
    load(r, p1=(0, 5), p2=(0, 1), p3=(0, 3))
    ex, out = r.decide(headers={"x-session-id": "s1"})
    assert served(out) == PODS[1]
    finish(ex)
    load(r, p1=(0, 1), p2=(0, 4), p3=(0, 2))  # busier now, but not queuing: the session stays
    ex, out = r.decide(headers={"x-session-id": "s1"})
    assert served(out) == PODS[1]
    finish(ex)
    ex, out = r.decide(headers={"x-user": "s1"})  # the second header names the same session (same value)
    assert served(out) == PODS[1]
    finish(ex)


def test_a_session_moves_only_when_its_pod_is_queuing_and_clearly_busier_then_stays_where_it_moved():
    r = session_rig()
    load(r, p1=(0, 3), p2=(0, 0), p3=(0, 3))
    ex, out = r.decide(headers={"x-session-id": "s1"})
    assert served(out) == PODS[1]
    finish(ex)
    load(r, p1=(0, 1), p2=(2, 2), p3=(0, 3))  # queuing, but only 3 busier than p1 (< 4): stays
    ex, out = r.decide(headers={"x-session-id": "s1"})
    assert served(out) == PODS[1]
    finish(ex)
    load(r, p1=(0, 0), p2=(2, 2), p3=(0, 3))  # queuing and 4 busier: moves to the least loaded (p1)
    ex, out = r.decide(headers={"x-session-id": "s1"})
    assert served(out) == PODS[0]
    finish(ex)
    load(r, p1=(0, 3), p2=(0, 0), p3=(0, 3))  # p2 is idle again, p1 not queuing: it stays where it moved
    ex, out = r.decide(headers={"x-session-id": "s1"})
    assert served(out) == PODS[0]
    finish(ex)


def test_an_idle_session_is_forgotten_and_only_its_hash_is_kept():
    r = session_rig()
    load(r, p1=(0, 3), p2=(0, 0), p3=(0, 3))
    ex, out = r.decide(headers={"x-session-id": "secret-session-value"})
    finish(ex)
    sched = r.runtime.schedulers["a"]
    [scorer] = [p for p in sched.plugins() if p.type_name == "session-affinity-scorer"]
    assert len(scorer.sessions) == 1
    assert "secret-session-value" not in repr(dict(scorer.sessions))  # an int hash -> (pod, last use)
    load(r, p1=(0, 0), p2=(0, 3), p3=(0, 3))
    r.clock.t += 30  # within the idle timeout: stays
    ex, out = r.decide(headers={"x-session-id": "secret-session-value"})
    assert served(out) == PODS[1]
    finish(ex)
    r.clock.t += 61  # idle past it: placed again by load
    ex, out = r.decide(headers={"x-session-id": "secret-session-value"})
    assert served(out) == PODS[0]
    finish(ex)


def test_explain_shows_the_balancing_plugins():
    r = rig({"mode": "LoadAware", "prefixAffinity": {}, "sessionAffinity": {"headers": ["x-s"]}})
    info = r.explain()
    [run] = info.profiles
    assert [p.type for p in run.plugins if p.kind == "scorer"] == [
        "least-work-scorer", "byte-prefix-affinity-scorer", "session-affinity-scorer"]
    assert info.endpoint in PODS
    assert info.route.pool == "svc"
    _, out = r.decide()
    assert out.metadata[LB_NS][DESTINATION] in PODS
