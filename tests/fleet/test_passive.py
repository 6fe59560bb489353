"""Passive health through the real director's exchange hooks, on a manual clock."""

from __future__ import annotations

import orjson
import pytest

from epp.api.explain import PointsmanService
from epp.api.metrics import EppMetrics, RequestMetrics
from epp.api.pb import pointsman_pb2 as api
from epp.fleet.datastore import Datastore, PoolSpec
from epp.fleet.passive import EJECTED, HEALTHY, PROBING, PassiveHealth
from epp.fleet.scrape.scraper import bounded_timeout
from epp.request.director import Director
from scheduling.types import Endpoint, endpoint_key

A, B = endpoint_key("10.0.0.1", 8000), endpoint_key("10.0.0.2", 8000)


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


class First:
    """Always picks the first candidate by key: the test decides where requests go by what is in rotation."""

    def schedule(self, ctx, *, dry_run=False):
        from scheduling.api import SchedulingResult

        return SchedulingResult(targets=sorted(ctx.candidates, key=lambda e: e.key), profile="test")

    def pre_request(self, ctx, result): ...
    def response_complete(self, ctx, result): ...
    def endpoint_removed(self, key): ...


@pytest.fixture
def rig():
    ds = Datastore()
    ds.set_pool(PoolSpec("pool"), [Endpoint(key=k, address=k.split(":")[0], port=8000) for k in (A, B)])
    clock = Clock()
    metrics = EppMetrics(ds)
    passive = PassiveHealth(ds, failure_threshold=3, cooldown=5.0, max_cooldown=12.0, silence_timeout=2.0,
                            clock=clock, metrics=metrics)
    metrics.bind_health(passive)
    d = Director(ds, First(), clock=clock, observers=[RequestMetrics(metrics), passive])
    return d, passive, clock, metrics


def send(d, stream=False):
    ex = d.exchange()
    body = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "x"}], "stream": stream})
    out = ex.decide({":path": "/v1/chat/completions", ":method": "POST"}, body, {})
    assert not out.reject_status
    return ex


def respond(ex, status=200, chunks=1, end=True, served=None):
    meta = {"envoy.lb": {"x-gateway-destination-endpoint-served": served}} if served else {}
    ex.response_headers({":status": str(status)}, meta)
    for i in range(chunks):
        ex.response_body(b"data: x\n\n", end and i == chunks - 1)
    ex.close()


def picked(ex) -> str:
    return ex.result.primary.key


def test_consecutive_5xx_eject_and_a_success_resets_the_streak(rig):
    d, passive, _, metrics = rig
    for status in (503, 500, 200, 502, 503):  # the 200 breaks the streak: 2 in a row, not 3
        ex = send(d)
        assert picked(ex) == A
        respond(ex, status)
    assert passive.states[A].state == HEALTHY and passive.states[A].consecutive == 2
    respond(send(d), 504)
    assert passive.states[A].state == EJECTED and A in d.datastore.ejected and not d.datastore.is_routable(A)
    assert picked(send(d)) == B  # out of rotation
    assert metrics.registry.get_sample_value("pointsman_endpoint_response_failures_total",
                                             {"endpoint": A, "reason": "http_5xx"}) == 5.0
    assert metrics.registry.get_sample_value("pointsman_endpoint_ejections_total",
                                             {"endpoint": A, "source": "passive"}) == 1.0
    assert metrics.registry.get_sample_value("pointsman_endpoint_state", {"endpoint": A, "state": "ejected"}) == 1.0
    info = PointsmanService(d, passive).list_endpoints(api.ListEndpointsRequest())
    a = next(e for e in info.endpoints if e.key == A)
    assert (a.state, a.routable, a.failures, a.consecutive_failures, a.ejections) == ("ejected", False, 5, 3, 1)
    assert a.reason.startswith("HTTP 504; probe in 5.0 s")


def test_half_open_probe_restores_or_extends(rig):
    d, passive, clock, _ = rig
    for _ in range(3):
        respond(send(d), 503)
    assert passive.states[A].state == EJECTED
    clock.t += 5.1
    passive.tick()
    assert passive.states[A].state == PROBING and d.datastore.is_routable(A)
    probe = send(d)
    assert picked(probe) == A and not d.datastore.is_routable(A)  # one request at a time
    assert picked(send(d)) == B
    respond(probe, 503)  # the probe fails: out again, for twice as long
    st = passive.states[A]
    assert (st.state, st.cooldown, st.ejections) == (EJECTED, 10.0, 2)
    clock.t += 9.9
    passive.tick()
    assert st.state == EJECTED
    clock.t += 0.2
    passive.tick()
    probe = send(d)
    assert picked(probe) == A
    respond(probe, 503)
    assert st.cooldown == 12.0  # capped by max_cooldown
    clock.t += 12.1
    passive.tick()
    probe = send(d)
    respond(probe, 200)  # a good probe: back in rotation
    assert st.state == HEALTHY and d.datastore.is_routable(A) and picked(send(d)) == A


def test_a_probe_whose_client_left_lets_the_next_request_probe(rig):
    d, passive, clock, _ = rig
    for _ in range(3):
        respond(send(d), 503)
    clock.t += 6
    passive.tick()
    probe = send(d)
    probe.close()  # no response at all: no verdict
    assert passive.states[A].state == PROBING and d.datastore.is_routable(A)
    assert picked(send(d)) == A


def test_cut_short_responses_count_complete_ones_do_not(rig):
    d, passive, _, metrics = rig
    respond(send(d, stream=True), 200, chunks=3, end=True)
    ex = send(d, stream=True)
    ex.response_headers({":status": "200"}, {})
    ex.response_body(b"data: a\n\n", False)
    ex.response_end()  # trailers end the response
    ex.close()
    assert passive.states[A].failures == 0
    for _ in range(3):
        respond(send(d, stream=True), 200, chunks=2, end=False)  # headers and chunks, then the stream ended
    assert passive.states[A].state == EJECTED and passive.states[A].reason.startswith("the response was cut short")
    assert metrics.registry.get_sample_value("pointsman_endpoint_response_failures_total",
                                             {"endpoint": A, "reason": "cut_short"}) == 3.0


def test_silent_streams_fail_but_lean_and_plain_requests_are_never_taken_for_silent(rig):
    d, passive, clock, _ = rig
    lean = send(d, stream=True)  # no response headers have ever been seen: lean mode
    clock.t += 10
    passive.tick()
    assert lean.result and passive.states.get(A) is None
    lean.close()  # a lean stream ends without any response message: neither failure nor success
    assert passive.states.get(A) is None
    respond(send(d), 200)  # response headers flow: Envoy sends the response phases
    plain, streaming = send(d, stream=False), send(d, stream=True)
    midway = send(d, stream=True)
    midway.response_headers({":status": "200"}, {})
    midway.response_body(b"data: a\n\n", False)
    clock.t += 2.5
    passive.tick()
    st = passive.states[A]
    assert st.failures == 2 and st.reason.startswith("no response for 2.5 s")  # streaming and midway, not plain
    passive.tick()
    assert st.failures == 2  # one failure per request
    for ex in (plain, streaming, midway):
        ex.close()
    assert st.failures == 2  # a request already counted silent is not counted again when it is cut


def test_failures_go_to_the_host_envoy_served(rig):
    d, passive, _, _ = rig
    ex = send(d)
    assert picked(ex) == A
    respond(ex, 503, served=B)  # override_host fell back to B
    assert passive.states[B].failures == 1
    assert A not in passive.states


def test_a_departed_endpoint_is_forgotten(rig):
    d, passive, _, _ = rig
    for _ in range(3):
        respond(send(d), 503)
    d.datastore.set_endpoints("pool", [Endpoint(key=B, address="10.0.0.2", port=8000)])
    assert A not in passive.states and A not in d.datastore.ejected


def test_scrape_timeout_fits_the_staleness_threshold():
    assert bounded_timeout(2.0, 3, 0.05) == pytest.approx(0.45)
    assert 3 * (bounded_timeout(2.0, 3, 0.05) + 0.05) < 2.0
    assert bounded_timeout(60.0) == 1.0 and bounded_timeout(0.1) == 0.05


class Last:
    """Always picks the last candidate by key: B, whatever happens to A (a profile that never prefers A)."""

    def schedule(self, ctx, *, dry_run=False):
        from scheduling.api import SchedulingResult

        return SchedulingResult(targets=sorted(ctx.candidates, key=lambda e: e.key, reverse=True), profile="test")

    def pre_request(self, ctx, result): ...
    def response_complete(self, ctx, result): ...
    def endpoint_removed(self, key): ...


def test_the_probe_goes_to_the_probing_endpoint_even_if_the_scheduler_never_picks_it(rig):
    d, passive, clock, _ = rig
    for _ in range(3):
        respond(send(d), 503)
    d = d.replace(scheduler=Last(), probe=passive.probe_for)
    assert picked(send(d)) == B
    clock.t += 5.1
    passive.tick()
    assert passive.probe_for(d.datastore.routable("pool")) is not None
    probe = send(d)
    assert picked(probe) == A, "the next request after the cool-down is the probe"
    assert [e.key for e in probe.result.targets] == [A, B]
    assert passive.probe_for(d.datastore.routable("pool")) is None
    assert picked(send(d)) == B, "one probe at a time; the others go where the scheduler says"
    probe.close()  # its client left before any answer: the next request probes
    again = send(d)
    assert picked(again) == A
    respond(again, 200)
    assert passive.states[A].state == HEALTHY
    assert picked(send(d)) == B and passive.probe_for(d.datastore.routable("pool")) is None


def test_silence_is_measured_from_each_requests_last_sign_of_life(rig):
    """The tick fails the requests silent for longer than the timeout, each by its own last sign of life: one that
    speaks again waits its full timeout anew, behind a younger one that went quiet (the tick looks at the due
    requests only: bench/bench_streams.py holds thousands in flight)."""
    d, passive, clock, _ = rig
    respond(send(d), 200)  # response headers flow: the pre-headers rule is armed
    t0 = clock.t
    chatty, quiet = send(d, stream=True), send(d, stream=True)
    chatty.response_headers({":status": "200"}, {})
    chatty.response_body(b"data: a\n\n", False)  # body under way since t0
    clock.t = t0 + 0.2
    later = send(d, stream=True)
    later.response_headers({":status": "200"}, {})
    later.response_body(b"data: a\n\n", False)  # body under way since t0 + 0.2
    waiting = send(d, stream=True)  # no headers yet since t0 + 0.2
    clock.t = t0 + 1.0
    chatty.response_body(b"data: b\n\n", False)  # speaks again
    clock.t = t0 + 2.1
    passive.tick()
    st = passive.states[A]
    assert st.failures == 1 and st.reason == "no response for 2.1 s"  # `quiet`, routed at t0 and never answered
    clock.t = t0 + 2.3
    passive.tick()
    assert st.failures == 3  # `later` and `waiting`, silent since t0 + 0.2; not `chatty`
    clock.t = t0 + 3.2
    passive.tick()
    assert st.failures == 4 and st.reason == "no response for 2.2 s"  # `chatty`, and nothing twice
    for ex in (chatty, quiet, later, waiting):
        ex.close()
    assert st.failures == 4
    clock.t += 10
    passive.tick()
    assert st.failures == 4  # closed requests are no longer watched


def test_a_complete_response_or_one_with_headers_and_no_body_yet_is_never_silent(rig):
    d, passive, clock, _ = rig
    respond(send(d), 200)
    done, headers_only = send(d, stream=True), send(d, stream=True)
    done.response_headers({":status": "200"}, {})
    done.response_body(b"data: a\n\n", True)  # complete; its stream is still open
    headers_only.response_headers({":status": "200"}, {})  # the body has not begun
    clock.t += 30
    passive.tick()
    assert passive.states[A].failures == 0
    headers_only.response_body(b"data: a\n\n", False)  # begun now: armed from here on
    clock.t += 2.5
    passive.tick()
    assert passive.states[A].failures == 1
    done.close()
    headers_only.close()
