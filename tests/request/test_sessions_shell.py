"""Agent sessions through the shell's request path (real director, datastore, scheduler and flow control): turns
stay where their context is, a session whose endpoint leaves mid-session goes on elsewhere, hostile session values
cost bounded memory and never fail a request, Responses API chains are learnt from response bodies, and flow
control's fairness can be keyed by session."""

from __future__ import annotations

import asyncio
import random
import tracemalloc
from typing import Any

import orjson

from epp.fleet.datastore import Datastore, PoolSpec
from epp.fleet.saturation import ConcurrencyDetector
from epp.flowcontrol import FlowController, PoolPressure
from epp.protocol import Outcome
from epp.request.director import Director, DirectorConfig
from epp.request.sessions import SessionIdentity
from epp.request.settings import SessionSettings
from scheduling.api import FlowControl
from scheduling.config import load_scheduler
from scheduling.types import Endpoint, Metrics, endpoint_key

DEST = "x-gateway-destination-endpoint"
SYSTEM = "You are a coding agent with these tools: " + "tool spec " * 400
BOUNDED = """
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: estimated-latency-scorer
- type: agent-session-scorer
  parameters: {maxSessions: 200}
- type: max-score-picker
schedulingProfiles:
- name: default
  plugins: [{pluginRef: estimated-latency-scorer}, {pluginRef: agent-session-scorer}, {pluginRef: max-score-picker}]
"""


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def _ep(i: int) -> Endpoint:
    ip = f"10.9.0.{i + 1}"
    return Endpoint(endpoint_key(ip, 8000), ip, 8000, f"pod-{i}", metrics=Metrics(stale=False))


class Rig:
    def __init__(self, n: int = 4, config: Any = None, settings: SessionSettings | None = None,
                 flow: Any = None) -> None:
        from scheduling.config import parse_yaml

        self.clock = Clock()
        self.ds = Datastore(default_pool="pool")
        self.ds.set_pool(PoolSpec("pool"), [_ep(i) for i in range(n)])
        docs = [d.data for d in parse_yaml(config, "test")] if config else None
        self.sched = load_scheduler(docs, rng=random.Random(1))
        self.ds.on_endpoint_removed(self.sched.endpoint_removed)
        self.sessions = SessionIdentity(settings or SessionSettings())
        self.director = Director(self.ds, self.sched, DirectorConfig(), clock=self.clock,
                                 observers=(self.sessions,), sessions=self.sessions,
                                 flow=flow(self.ds) if flow is not None else None)

    def send(self, body: dict[str, Any], headers: dict[str, str] | None = None,
             path: str = "/v1/chat/completions") -> tuple[Any, Any]:
        h = {":path": path, ":method": "POST", **(headers or {})}
        ex = self.director.exchange()
        return ex, ex.decide(h, orjson.dumps(body), {})

    def finish(self, ex: Any, body: bytes = b'{"usage":{"prompt_tokens":10,"completion_tokens":2}}') -> None:
        self.clock.t += 0.5
        ex.response_headers({":status": "200", "content-type": "application/json"}, {})
        ex.response_body(body, True)
        ex.close()


def _turn_body(sid: str, turn: int) -> dict[str, Any]:
    msgs = [{"role": "system", "content": SYSTEM}]
    for i in range(turn):
        msgs += [{"role": "user" if i == 0 else "tool", "content": f"{sid} step {i} " + "output " * 150},
                 {"role": "assistant", "content": "call a tool"}]
    return {"model": "m", "messages": msgs, "user": sid}


def _dest(out: Outcome) -> str:
    assert isinstance(out, Outcome) and not out.reject_status, out
    return dict(out.set_headers)[DEST]


def test_turns_stay_and_a_session_whose_endpoint_leaves_goes_on() -> None:
    rig = Rig()
    homes = {}
    for s in ("s1", "s2", "s3"):
        ex, out = rig.send(_turn_body(s, 1))
        homes[s] = _dest(out)
        rig.finish(ex)
    for turn in range(2, 5):
        rig.clock.t += 4.0
        for s in ("s1", "s2", "s3"):
            ex, out = rig.send(_turn_body(s, turn))
            assert _dest(out) == homes[s], (s, turn)
            rig.finish(ex)
    # s1's endpoint leaves while its turn 5 is in flight.
    ex, out = rig.send(_turn_body("s1", 5))
    gone = _dest(out)
    rig.ds.set_endpoints("pool", [e for e in rig.ds.snapshot("pool").endpoints if e.key != gone])
    rig.finish(ex)
    scorer = rig.sched.fallback.profiles["default"].scorers[1][0]
    assert gone not in scorer.tracked_endpoints()
    rig.clock.t += 4.0
    ex, out = rig.send(_turn_body("s1", 6))
    moved = _dest(out)
    assert moved != gone
    note = ex.result.state.get("agent-session.note")
    assert note is not None and note.turn == 6 and "left" in note.why
    rig.finish(ex)
    rig.clock.t += 4.0
    ex, out = rig.send(_turn_body("s1", 7))
    assert _dest(out) == moved  # and stays there
    rig.finish(ex)
    assert not rig.ds.inflight.view()


def test_hostile_session_values_never_fail_a_request_and_cost_bounded_memory() -> None:
    rig = Rig(config=BOUNDED)
    scorer = rig.sched.fallback.profiles["default"].scorers[1][0]
    r = random.Random(5)
    tracemalloc.start()
    try:
        base = None
        for i in range(3000):  # thousands of distinct values, a second's worth at 3,000 requests/s
            kind = i % 5
            headers: dict[str, str] = {}
            body: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": f"q{i}"}]}
            if kind == 0:
                headers["x-session-id"] = "".join(chr(r.randrange(0xDC80, 0xDD00)) for _ in range(20))  # non-UTF-8
            elif kind == 1:
                headers["x-session-id"] = "h" * 100_000  # huge: ignored
            elif kind == 2:
                body["user"] = {"not": "a string"}
            elif kind == 3:
                body["metadata"] = {"user_id": f"user-{i}-" + "x" * r.randrange(200)}
            else:
                body["previous_response_id"] = f"resp_{i}"
            ex, out = rig.send(body, headers)
            _dest(out)  # routed, whatever the value
            rig.clock.t += 0.001
            rig.finish(ex)
            if i == 999:
                base = tracemalloc.get_traced_memory()[0]
        grown = tracemalloc.get_traced_memory()[0] - (base or 0)
    finally:
        tracemalloc.stop()
    assert len(scorer.table) <= 200 and len(scorer.board) <= 200
    # The last 2,000 distinct values cost what the other state costs (about 0.2 MB here); an unbounded session table
    # would add about 0.6 MB more.
    assert grown < 500_000, grown
    assert rig.sessions.skipped["header:x-session-id"] == 600 and rig.sessions.skipped["user"] == 600
    assert not rig.ds.inflight.view()


def test_responses_chain_is_learnt_from_the_response_body() -> None:
    rig = Rig()
    ex, out = rig.send({"model": "m", "input": SYSTEM + "first task"}, path="/v1/responses")
    home = _dest(out)
    rig.finish(ex, orjson.dumps({"id": "resp_abc", "object": "response", "usage": {"input_tokens": 10}}))
    rig.clock.t += 3.0
    for i in range(3):  # whatever the load elsewhere, the continuation goes where the response is
        ex, out = rig.send({"model": "m", "input": "go on", "previous_response_id": "resp_abc" if i == 0 else
                            f"resp_next{i - 1}"}, path="/v1/responses")
        assert _dest(out) == home
        note = ex.result.state.get("agent-session.note")
        assert note is not None and note.turn == i + 2 and note.source == "previous_response_id"
        sse = (b'event: response.created\ndata: {"type":"response.created","response":{"id":"resp_next%d",'
               b'"object":"response"}}\n\n' % i)
        ex.response_headers({":status": "200", "content-type": "text/event-stream"}, {})
        ex.response_body(sse, True)
        ex.close()
        rig.clock.t += 3.0


def test_sessions_off_identifies_nothing() -> None:
    rig = Rig(settings=SessionSettings(enabled=False))
    ex, out = rig.send(_turn_body("s1", 1), {"x-session-id": "s1"})
    _dest(out)
    assert ex.request.session is None and not rig.sessions.identified


async def test_fairness_by_session_lets_single_turn_users_through() -> None:
    """One agent with many parallel calls is one flow; single-turn users are flows of their own. By tenant (no
    fairness header: one flow for all) the users wait behind every call of the agent."""
    assert await _dispatch_order("session") == ["agent#0", "user0", "user1", "user2", "agent#1", "agent#2",
                                                "agent#3", "agent#4", "agent#5"]
    assert await _dispatch_order("tenant") == [*(f"agent#{i}" for i in range(6)), "user0", "user1", "user2"]


async def _dispatch_order(fairness: str) -> list[str]:

    def flow(ds: Datastore) -> FlowController:
        detector = ConcurrencyDetector(ds.inflight, max_concurrency=1)
        return FlowController(FlowControl(), PoolPressure(ds, ds.routable, detector))

    rig = Rig(n=1, settings=SessionSettings(fairness=fairness), flow=flow)
    first, out = rig.send(_turn_body("agent", 1))
    _dest(out)
    order: list[str] = []
    queued: dict[str, Any] = {}
    for i in range(6):  # the agent fans out six tool calls
        ex, fut = rig.send(_turn_body("agent", 2))
        assert isinstance(fut, asyncio.Future)
        fut.add_done_callback(lambda f, tag=f"agent#{i}": order.append(tag))
        queued[f"agent#{i}"] = ex
    for u in range(3):  # then three users ask one question each
        ex, fut = rig.send({"model": "m", "messages": [{"role": "user", "content": "hi"}], "user": f"user{u}"})
        assert isinstance(fut, asyncio.Future)
        fut.add_done_callback(lambda f, tag=f"user{u}": order.append(tag))
        queued[f"user{u}"] = ex
    running = first
    for _ in range(9):  # one slot: each request that ends lets exactly one queued request go
        running.close()
        for _ in range(5):
            await asyncio.sleep(0)
        running = queued[order[-1]]
    running.close()
    if fairness == "session":
        assert rig.sessions.fairness_id(running.request, "tenant-a").startswith("tenant-a/session:")
    assert not rig.ds.inflight.view()
    await rig.director.flow.close()
    return order


def test_a_kthena_session_setting_names_the_session() -> None:
    """Kthena's sessionSticky sources (here a cookie) identify the agent session too, before the shell's own."""
    from pathlib import Path

    from epp.routing.service import RoutingService

    routes = Path(__file__).resolve().parents[2] / "deploy" / "examples" / "kthena" / "routes.yaml"
    clock, ds = Clock(), Datastore()
    svc = RoutingService(ds, random.Random(3))
    svc.load_text(routes.read_text(), routes.name)
    sessions = SessionIdentity(SessionSettings())
    d = Director(ds, load_scheduler(None, rng=random.Random(1)), DirectorConfig(), clock=clock, router=svc.router,
                 observers=(sessions,), sessions=sessions)
    body = orjson.dumps({"model": "deepseek-r1", "messages": [{"role": "user", "content": "hi"}], "user": "u9"})
    headers = {":path": "/v1/chat/completions", ":method": "POST", "user-type": "premium", "cookie": "session=abc"}
    ex = d.exchange()
    out = ex.decide(headers, body, {})
    assert isinstance(out, Outcome) and not out.reject_status, out
    assert ex.request.session is not None and ex.request.session.source == "route"
    ex.close()
    ex = d.exchange()  # the same cookie on the canary rule's v1 backend (no session settings): the body's user
    out = ex.decide({k: v for k, v in headers.items() if k != "user-type"}, body, {})
    assert ex.request.session is not None and ex.request.session.source in ("route", "user")
    ex.close()
    assert sessions.identified["route"] >= 1
