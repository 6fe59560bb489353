"""The dashboard's decision recorder and views, fed by the real director and the real scheduler (GIE default)."""

from __future__ import annotations

import random
import time
from pathlib import Path

import orjson
import pytest

from epp.api.dashboard import views
from epp.api.dashboard.recorder import DecisionRecorder, RecorderObserver
from epp.api.dashboard.series import Sampler
from epp.fleet.datastore import Datastore, PoolSpec
from epp.request.director import Director
from scheduling.config import load_scheduler
from scheduling.types import Endpoint, Metrics, endpoint_key

HDRS = {":path": "/v1/chat/completions", ":method": "POST"}
PROMPT = "You are a careful assistant. " * 20  # long enough for several prefix blocks


def ep(ip: str, waiting: int = 0, kv: float = 0.0) -> Endpoint:
    return Endpoint(key=endpoint_key(ip, 8000), address=ip, port=8000, models=frozenset({"llama"}),
                    metrics=Metrics(waiting=waiting, kv_usage=kv, updated_at=time.monotonic(), stale=False))


def chat(content: str = PROMPT, model: str = "llama") -> bytes:
    return orjson.dumps({"model": model, "messages": [{"role": "user", "content": content}]})


GIE_DEFAULT = Path(__file__).resolve().parents[2] / "deploy" / "profiles" / "gie-default.yaml"


@pytest.fixture
def director() -> Director:
    ds = Datastore()
    ds.set_pool(PoolSpec("pool"), [ep("10.0.0.1", waiting=4, kv=0.5), ep("10.0.0.2"), ep("10.0.0.3", kv=0.9)])
    sched = load_scheduler(GIE_DEFAULT, rng=random.Random(1), timer=time.perf_counter)  # three weighted scorers
    return Recorded(ds, sched, observers=[RecorderObserver(DecisionRecorder(capacity=4))])


class Recorded(Director):
    """A director whose observers include the dashboard's recorder (the tests read it back)."""

    @property
    def recorder(self) -> DecisionRecorder:
        return next(o.recorder for o in self.observers if isinstance(o, RecorderObserver))


def to_wall(t: float) -> float:
    return t


def run(d: Director, body: bytes, *, sse: bool = True, status: str = "200", request_id: str = ""):
    ex = d.exchange()
    headers = {**HDRS, **({"x-request-id": request_id} if request_id else {})}
    out = ex.decide(headers, body, {})
    if out.reject_status:
        ex.close()
        return ex, out
    ex.response_headers({":status": status, "content-type": "text/event-stream" if sse else "application/json"}, {})
    if sse:
        ex.response_body(b'data: {"choices":[{"delta":{"content":"x"}}]}\n\n', False)
        ex.response_body(b'data: {"choices":[],"usage":{"prompt_tokens":120,"completion_tokens":2,'
                         b'"prompt_tokens_details":{"cached_tokens":96}}}\n\ndata: [DONE]\n\n', True)
    else:
        ex.response_body(b'{"usage":{"prompt_tokens":5,"completion_tokens":1}}', True)
    ex.close()
    return ex, out


def test_a_decision_keeps_its_per_plugin_scores_runner_up_and_margin(director):
    rec = director.recorder
    run(director, chat(), request_id="req-1")
    assert rec.seq == 1 and rec.decisions == 1
    r = rec.get(1)
    assert r is not None and r.request_id == "req-1"
    s = views.summary(r, to_wall)
    # Queue ×2, KV ×2, prefix ×3 (nothing cached yet): 10.0.0.2 (idle, empty KV) wins.
    assert s["endpoint"] == "10.0.0.2:8000"
    assert s["runner_up"] in ("10.0.0.1:8000", "10.0.0.3:8000")
    assert s["total"] == pytest.approx(4.0) and 0 < s["margin"] <= 4.0
    assert s["status"] == "200" and s["done"] and s["ttft_ms"] is not None and s["ttft_ms"] >= 0
    assert s["tokens"] == [120, 2, 96]
    d = views.detail(r, to_wall)
    assert d["scores_recorded"]
    (only,) = d["runs"]
    scorers = {p["type"]: p for p in only["plugins"] if p["kind"] == "scorer"}
    assert set(scorers) == {"queue-scorer", "kv-cache-utilization-scorer", "prefix-cache-scorer"}
    assert scorers["queue-scorer"]["scores"]["10.0.0.1:8000"] == 0.0  # the most waiting requests
    assert scorers["queue-scorer"]["scores"]["10.0.0.2:8000"] == 1.0
    assert scorers["kv-cache-utilization-scorer"]["scores"]["10.0.0.3:8000"] == pytest.approx(0.1)
    assert only["totals"]["10.0.0.2:8000"] == pytest.approx(4.0)
    # The totals are the weighted sums of the recorded scores.
    for key, total in only["totals"].items():
        assert total == pytest.approx(sum(p["weight"] * p["scores"][key] for p in scorers.values()))


def test_prefix_blocks_matched_follow_the_prefix_index(director):
    rec = director.recorder
    run(director, chat())
    run(director, chat())
    first, second = rec.get(1), rec.get(2)
    assert first.prefix_matched == 0 and first.prefix_total > 3
    assert second.endpoint == first.endpoint, "the prefix scorer sends the repeat where the prefix is cached"
    assert second.prefix_matched == second.prefix_total == first.prefix_total
    assert rec.prefix_matched == second.prefix_total and rec.prefix_total == 2 * first.prefix_total
    assert views.summary(second, to_wall)["prefix"] == [first.prefix_total, first.prefix_total]


def test_the_ring_is_bounded_and_rejections_are_recorded(director):
    rec = director.recorder
    for i in range(5):
        run(director, chat(f"q{i}"))
    _, out = run(director, b"{not json")
    assert out.reject_status == 400
    _, out = run(director, chat(model="unknown"))
    assert out.reject_status == 404
    assert rec.seq == 7 and len(rec.ring) == 4  # capacity 4: the oldest fell out
    assert rec.get(1) is None and rec.get(3) is None and rec.get(4) is not None
    assert [r.seq for r in rec.since(5)] == [6, 7]
    assert rec.get(6).error == "BadRequest" and rec.get(7).error == "NotFound"
    assert rec.errors == {"BadRequest": 1, "NotFound": 1}
    assert views.summary(rec.get(7), to_wall)["model"] == "unknown"


def test_ttft_only_for_event_streams_and_upstream_errors_count(director):
    rec = director.recorder
    run(director, chat("a"), sse=False)
    assert rec.get(1).ttft is None and rec.ttft == {}
    run(director, chat("b"), sse=True, status="503")
    assert rec.get(2).ttft is not None
    assert rec.errors == {"HTTP 503": 1}
    taken = rec.take_ttft()
    assert list(taken) == [rec.get(2).endpoint] and rec.ttft == {}


def test_inflight_decisions_show_as_pending_until_their_stream_ends(director):
    rec = director.recorder
    ex = director.exchange()
    ex.decide(HDRS, chat(), {})
    s = views.summary(rec.get(1), to_wall)
    assert not s["done"] and s["status"] == "" and s["duration_ms"] is None
    ex.close()
    assert views.summary(rec.get(1), to_wall)["done"]


def test_sampler_turns_counters_into_rates_and_the_fleet_table(director):
    t = [100.0]
    sampler = Sampler(director.recorder, director.datastore, clock=lambda: t[0], wall=lambda: 1e9 + t[0])
    sampler.sample()
    for i in range(3):
        run(director, chat(f"x{i}"))
    run(director, b"{")
    t[0] += 2.0
    ex = director.exchange()
    ex.decide(HDRS, chat("held"), {})  # one request in flight at the sample
    p = sampler.sample()
    assert p["rate"] == pytest.approx(5 / 2.0)
    assert p["errors"] == {"BadRequest": pytest.approx(0.5)}
    assert p["inflight"] == 1 and p["queue"]["10.0.0.1:8000"] == 4
    assert set(p["ttft"]) <= {"10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.3:8000"} and p["ttft"]
    assert p["hit"] == pytest.approx(0.0) and p["engine_hit"] == pytest.approx(0.8)
    rows = {r["key"]: r for r in sampler.fleet}
    assert rows["10.0.0.1:8000"]["waiting"] == 4 and rows["10.0.0.1:8000"]["health"] == "ok"
    assert sum(r["inflight"] for r in rows.values()) == 1
    assert rows["10.0.0.1:8000"]["spark"] == [4.0, 4.0]
    series = sampler.series()
    assert series["t"] == [1e9 + 100.0, 1e9 + 102.0] and series["rate"][1] == pytest.approx(2.5)
    assert series["errors"]["BadRequest"] == [0.0, pytest.approx(0.5)]
    ex.close()


def test_config_view_lists_profiles_scorers_and_weights(director):
    cfg = views.config_view(director.scheduler, "gie-default.yaml", {}, 0.0)
    assert cfg["default"] == "gie-default" and cfg["bindings"] == []
    (sched,) = cfg["schedulers"]
    (prof,) = sched["profiles"]
    assert [(s["type"], s["weight"]) for s in prof["scorers"]] == [
        ("queue-scorer", 2.0), ("kv-cache-utilization-scorer", 2.0), ("prefix-cache-scorer", 3.0)]
    assert prof["picker"]["type"] == "max-score-picker"
    assert orjson.loads(orjson.dumps(cfg)) == cfg  # plain JSON


def test_header_lines_parse_like_the_cli():
    assert views.parse_header_lines("X-A: 1\n\n x-b : two words \n") == {"x-a": "1", "x-b": "two words"}
    with pytest.raises(ValueError, match="not 'name: value'"):
        views.parse_header_lines("no colon here")


def test_a_director_without_recorder_records_nothing(director):
    kept = director.recorder
    ex, out = run(director.replace(observers=()), chat())
    assert not out.reject_status and not kept.ring


def test_the_decision_stream_shows_the_session_its_turn_and_why():
    from epp.request.sessions import SessionIdentity
    from epp.request.settings import SessionSettings

    ds = Datastore(default_pool="pool")
    ds.set_pool(PoolSpec("pool"), [ep("10.0.0.1"), ep("10.0.0.2")])
    sessions = SessionIdentity(SessionSettings())
    d = Recorded(ds, load_scheduler(None, rng=random.Random(1), timer=time.perf_counter),
                 observers=[RecorderObserver(DecisionRecorder(capacity=8)), sessions], sessions=sessions)
    body = orjson.dumps({"model": "llama", "messages": [{"role": "user", "content": "plan " * 300}],
                         "user": "agent-1"})
    run(d, body)
    run(d, body)
    first, second = (views.summary(d.recorder.get(i), to_wall) for i in (1, 2))
    assert first["session"]["turn"] == 1 and first["session"]["why"] == "new session"
    assert second["session"] == {"id": first["session"]["id"], "source": "user", "turn": 2, "parallel": False,
                                 "why": "stayed"}
    assert "agent-1" not in orjson.dumps(second).decode()  # the value itself is never shown
    plain = run(d, chat())[0]
    assert "session" not in views.summary(d.recorder.get(3), to_wall) and plain.request.session is None
