"""Flow control: queue structures, the controller through the real director, and the grpc layer."""

from __future__ import annotations

import asyncio
import math

import grpc
import orjson

from epp.api.metrics import EppMetrics, RequestMetrics
from epp.extproc.server import build_server
from epp.fleet.datastore import Datastore, PoolSpec
from epp.fleet.saturation import ConcurrencyDetector, SaturationDetector
from epp.flowcontrol import DROPPED_REASON, FlowController, PoolPressure
from epp.flowcontrol.queues import Item, PoolQueues
from epp.protocol import BodyMode, Outcome
from epp.request.director import Director
from scheduling.api import GLOBAL_STRICT, FlowControl, PriorityBand
from scheduling.types import ApiKind, Endpoint, LLMRequest, Metrics, endpoint_key
from tests.request.test_director import LeastLoaded
from tests.support.extproc import body_msg, headers_msg, kinds
from tests.support.wait import until

POOL = "pool"


def item(seq: int, fid: str = "a", priority: int = 0, size: int = 10) -> Item:
    return Item(seq, POOL, fid, priority, size, float(seq), math.inf)


# ---- the pure queues ------------------------------------------------------------------------------------------------
def drain(pq: PoolQueues) -> list[int]:
    out = []
    while (it := pq.pop()) is not None:
        out.append(it.seq)
    return out


def test_strict_priority_then_round_robin_between_flows_then_fcfs():
    pq = PoolQueues(POOL)
    band = PriorityBand()
    for seq, fid in enumerate(["a", "a", "a", "a", "b", "b", "c"], start=1):
        pq.add(item(seq, fid), band)
    pq.add(item(8, "z", priority=5), PriorityBand(5))
    pq.add(item(9, "z", priority=-1), PriorityBand(-1))
    assert (pq.count, pq.bytes) == (9, 90)
    # priority 5 first, then a/b/c take turns (each flow FCFS), then the sheddable band
    assert drain(pq) == [8, 1, 5, 7, 2, 6, 3, 4, 9]
    assert (pq.count, pq.bytes, pq.bands, pq.order) == (0, 0, {}, [])


def test_global_strict_ignores_flows():
    pq = PoolQueues(POOL)
    band = PriorityBand(fairness=GLOBAL_STRICT)
    for seq, fid in enumerate(["a", "a", "a", "b", "a", "b"], start=1):
        pq.add(item(seq, fid), band)
    assert drain(pq) == [1, 2, 3, 4, 5, 6]


def test_any_item_leaves_at_once_with_exact_counts():
    pq = PoolQueues(POOL)
    items = [item(s, fid) for s, fid in enumerate(["a", "b", "a", "b"], start=1)]
    for it in items:
        pq.add(it, PriorityBand())
    pq.remove(items[1])  # b's only head
    pq.remove(items[3])  # b is empty now: its flow and turn are gone
    assert (pq.count, pq.bytes, list(pq.bands[0].flows), list(pq.bands[0].turns)) == (2, 20, ["a"], ["a"])
    assert not items[1].queued and items[0].queued
    assert drain(pq) == [1, 3]


def test_capacity_of_the_pool_and_of_a_band():
    pq = PoolQueues(POOL)
    cfg = FlowControl(max_requests=3, max_bytes=1000, bands=(PriorityBand(0, max_bytes=25, max_requests=2),))
    band0 = cfg.band(0)
    assert pq.rejection(cfg, band0, 10) is None
    pq.add(item(1), band0)
    pq.add(item(2), band0)
    assert pq.rejection(cfg, band0, 1) == "2 requests queued at priority 0, maxRequests 2"
    assert pq.rejection(cfg, cfg.band(1), 990) == "20 bytes queued in the pool, maxBytes 1000"
    pq.add(item(3, priority=1), cfg.band(1))
    assert pq.rejection(cfg, cfg.band(1), 1) == "3 requests queued in the pool, maxRequests 3"
    small = FlowControl(bands=(PriorityBand(0, max_bytes=25),))
    assert PoolQueues(POOL).rejection(small, small.band(0), 30) == "0 bytes queued at priority 0, maxBytes 25"


# ---- the controller through the real director ---------------------------------------------------------------------
def ep(n: int) -> Endpoint:
    ip = f"10.0.0.{n}"
    return Endpoint(key=endpoint_key(ip, 8000), address=ip, port=8000)


def chat(n: int = 0) -> bytes:
    return orjson.dumps({"model": "llama", "messages": [{"role": "user", "content": f"hi {n}"}]})


class Rig:
    """A director over two endpoints whose capacity is one request each (concurrency-detector)."""

    def __init__(self, config: FlowControl, per_endpoint: int = 1, metrics: EppMetrics | None = None) -> None:
        self.ds = Datastore()
        self.ds.set_pool(PoolSpec(POOL), [ep(1), ep(2)])
        self.ds.objectives = {"critical": 10, "sheddable": -1}
        self.metrics = metrics or EppMetrics(self.ds)
        detector = ConcurrencyDetector(self.ds.inflight, max_concurrency=per_endpoint)
        self.flow = FlowController(config, PoolPressure(self.ds, self.ds.routable, detector),
                                   metrics=self.metrics)
        self.director = Director(self.ds, LeastLoaded(), observers=[RequestMetrics(self.metrics)], flow=self.flow)

    def send(self, n: int = 0, objective: str = "", fairness: str = ""):
        headers = {":path": "/v1/chat/completions", ":method": "POST"}
        # llm-d's current header names for even n, GIE's older ones for odd n: both are read
        if objective:
            headers["x-llm-d-inference-objective" if n % 2 == 0 else "x-gateway-inference-objective"] = objective
        if fairness:
            headers["x-llm-d-inference-fairness-id" if n % 2 == 0 else "x-gateway-inference-fairness-id"] = fairness
        ex = self.director.exchange()
        return ex, ex.decide(headers, chat(n), {})

    def inflight(self) -> int:
        return sum(v.requests for v in self.ds.inflight.view().values())


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_fast_path_is_synchronous_and_queued_requests_hold_nothing():
    rig = Rig(FlowControl())
    (ex1, out1), (ex2, out2) = rig.send(1), rig.send(2)
    assert isinstance(out1, Outcome) and isinstance(out2, Outcome) and not out1.reject_status
    assert rig.inflight() == 2
    ex3, out3 = rig.send(3)
    assert isinstance(out3, asyncio.Future) and not out3.done()
    assert rig.flow.queued() == 1 and rig.inflight() == 2 and ex3.result is None  # nothing committed
    ex1.close()  # capacity frees: the queued request is routed, in the slot just freed
    routed = await asyncio.wait_for(out3, 1)
    assert not routed.reject_status and dict(routed.set_headers)["x-gateway-destination-endpoint"] == ex1.result.primary.key
    assert rig.inflight() == 2 and rig.flow.queued() == 0 and ex3.result is not None
    for ex in (ex2, ex3):
        ex.close()
    assert rig.ds.inflight.view() == {}
    assert rig.flow.outcomes == {"Dispatched": 3}
    await rig.flow.close()


async def test_strict_priority_and_fairness_decide_the_dispatch_order():
    rig = Rig(FlowControl())
    running = [rig.send(i)[0] for i in range(2)]
    order: list[str] = []
    waiting = []
    plan = [("", "tenant-a"), ("", "tenant-a"), ("", "tenant-a"), ("", "tenant-b"), ("sheddable", "tenant-c"),
            ("critical", "tenant-b"), ("", "tenant-b")]
    for i, (objective, fairness) in enumerate(plan):
        ex, fut = rig.send(10 + i, objective, fairness)
        fut.add_done_callback(lambda f, tag=f"{objective or 'std'}/{fairness}#{i}": order.append(tag))
        waiting.append((ex, fut))
    assert rig.flow.queued() == 7
    seen = set(map(id, running))
    for _ in plan:  # free one slot at a time: exactly one queued request goes per freed slot
        running.pop(0).close()
        await settle()
        for ex, fut in waiting:
            if fut.done() and id(ex) not in seen:
                seen.add(id(ex))
                running.append(ex)
        assert rig.inflight() == 2 or not rig.flow.queued()
    assert order == ["critical/tenant-b#5", "std/tenant-a#0", "std/tenant-b#3", "std/tenant-a#1", "std/tenant-b#6",
                     "std/tenant-a#2", "sheddable/tenant-c#4"]
    for ex in running:
        ex.close()
    assert rig.ds.inflight.view() == {}
    await rig.flow.close()


async def test_ttl_expiry_is_a_503_and_capacity_a_429():
    cfg = FlowControl(default_ttl_s=0.05, bands=(PriorityBand(0, max_requests=1),))
    rig = Rig(cfg)
    running = [rig.send(i)[0] for i in range(2)]
    _, queued = rig.send(3)
    _, refused = rig.send(4)  # the band holds one queued request
    assert isinstance(refused, Outcome) and refused.reject_status == 429
    assert refused.reject_body.startswith("inference error: ResourceExhausted - request rejected pre-queue: queue at "
                                          "capacity (1 requests queued at priority 0, maxRequests 1)")
    assert (DROPPED_REASON, "rejected-saturated") in refused.reject_headers
    expired = await asyncio.wait_for(queued, 1)
    assert expired.reject_status == 503
    assert expired.reject_body.startswith("inference error: ServiceUnavailable - request timed out in queue: request "
                                          "TTL expired after 0.")
    assert (DROPPED_REASON, "rejected-ttl-expired") in expired.reject_headers
    assert rig.flow.queued() == 0 and rig.inflight() == 2
    assert rig.flow.outcomes == {"Dispatched": 2, "RejectedCapacity": 1, "EvictedTTL": 1}
    errors = {c: rig.metrics.registry.get_sample_value("inference_objective_request_error_total",
                                                       {"model_name": "llama", "target_model_name": "llama",
                                                        "error_code": c}) for c in ("ResourceExhausted",
                                                                                    "ServiceUnavailable")}
    assert errors == {"ResourceExhausted": 1.0, "ServiceUnavailable": 1.0}
    for ex in running:
        ex.close()
    await rig.flow.close()


async def test_preview_answers_what_admit_would_and_changes_nothing():
    cfg = FlowControl(bands=(PriorityBand(0, max_requests=1),))
    rig = Rig(cfg)
    req = LLMRequest(request_id="r", model="llama", target_model="llama", kind=ApiKind.CHAT, headers={}, prompt="")
    assert rig.flow.preview(POOL, req, 10) is None  # below the limit: it would go now
    running = [rig.send(i)[0] for i in range(2)]
    before = (rig.flow.queued(), dict(rig.flow.outcomes))
    why = rig.flow.preview(POOL, req, 10)
    assert isinstance(why, str) and "saturated" in why  # it would wait
    assert (rig.flow.queued(), dict(rig.flow.outcomes)) == before  # nothing queued or counted
    _, queued = rig.send(3)
    assert isinstance(queued, asyncio.Future)
    full = rig.flow.preview(POOL, req, 10)  # the band holds one: refused, exactly as admit refuses
    _, refused = rig.send(4)
    assert isinstance(full, Outcome) and isinstance(refused, Outcome)
    assert (full.reject_status, full.reject_body, full.reject_headers) == (
        refused.reject_status, refused.reject_body, refused.reject_headers)
    assert rig.flow.queued() == 1
    queued.cancel()
    for ex in running:
        ex.close()
    await rig.flow.close()


async def test_a_cancelled_wait_leaves_the_queue_at_once_and_is_never_routed():
    rig = Rig(FlowControl())
    running = [rig.send(i)[0] for i in range(2)]
    ex, fut = rig.send(3)
    fut.cancel()  # what the grpc layer does when the client goes away
    await settle()
    assert rig.flow.queued() == 0 and rig.flow.outcomes["EvictedContextCancelled"] == 1
    running[0].close()
    await settle()
    ex.close()
    assert ex.result is None and rig.inflight() == 1
    running[1].close()
    assert rig.ds.inflight.view() == {}
    await rig.flow.close()


async def test_queue_metrics_have_gie_names_and_return_to_zero():
    rig = Rig(FlowControl())
    running = [rig.send(i)[0] for i in range(2)]
    _, fut = rig.send(3, fairness="tenant-a")
    labels = {"fairness_id": "tenant-a", "priority": "0", "inference_pool": POOL, "model_name": "llama",
              "target_model_name": "llama"}
    get = rig.metrics.registry.get_sample_value
    assert get("inference_extension_flow_control_queue_size", labels) == 1.0
    assert get("inference_extension_flow_control_queue_bytes", labels) == len(chat(3))
    running[0].close()
    await asyncio.wait_for(fut, 1)
    assert get("inference_extension_flow_control_queue_size", labels) is None  # the idle flow's series is dropped
    assert get("inference_extension_flow_control_request_queue_duration_seconds_count",
               {**labels, "outcome": "Dispatched"}) == 1.0
    assert get("inference_extension_flow_control_pool_saturation", {"inference_pool": POOL}) == 1.0
    text = rig.metrics.exposition().decode()
    for name in ("request_queue_duration_seconds", "request_enqueue_duration_seconds",
                 "dispatch_cycle_duration_seconds", "pool_saturation"):
        assert f"inference_extension_flow_control_{name}" in text
    running[1].close()
    await rig.flow.close()


async def test_shutdown_answers_every_queued_request():
    rig = Rig(FlowControl())
    running = [rig.send(i)[0] for i in range(2)]
    futs = [rig.send(i)[1] for i in range(3, 6)]
    await rig.flow.close()
    answers = [f.result() for f in futs]
    assert {a.reject_status for a in answers} == {503}
    assert "shutting down" in answers[0].reject_body
    for ex in running:
        ex.close()
    assert rig.ds.inflight.view() == {}


async def test_utilization_detector_counts_unscraped_dispatches_as_waiting():
    """Between two scrapes the queue depth does not move; dispatches since the last scrape count as waiting."""
    ds = Datastore()
    ds.set_pool(PoolSpec(POOL), [ep(1)])
    clock = [100.0]
    ds.update_metrics({ep(1).key: Metrics(waiting=0, updated_at=100.0, stale=False)})
    pressure = PoolPressure(ds, ds.routable, SaturationDetector(queue_depth_threshold=2),
                            clock=lambda: clock[0])
    pressure.metrics_updated([ep(1).key])
    flow = FlowController(FlowControl(), pressure, clock=lambda: clock[0])
    director = Director(ds, LeastLoaded(), flow=flow)
    headers = {":path": "/v1/chat/completions", ":method": "POST"}
    outs = [director.exchange().decide(headers, chat(i), {}) for i in range(3)]
    assert [isinstance(o, Outcome) for o in outs] == [True, True, False]  # the third would make waiting 2/2
    ds.update_metrics({ep(1).key: Metrics(waiting=0, running=2, updated_at=100.0, stale=False)})
    pressure.metrics_updated([ep(1).key])  # the scrape now shows the two as running, not waiting
    flow.kick()
    await asyncio.wait_for(outs[2], 1)
    await flow.close()


# ---- through the grpc layer -----------------------------------------------------------------------------------------
async def test_a_client_that_goes_away_while_queued_is_removed_at_once():
    rig = Rig(FlowControl())
    running = [rig.send(i)[0] for i in range(2)]
    server, _ = build_server(rig.director)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    try:
        from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc

        stub = pb_grpc.ExternalProcessorStub(channel)
        fd = BodyMode.FULL_DUPLEX_STREAMED
        waiting = stub.Process()
        await waiting.write(headers_msg(mode=fd))
        await waiting.write(body_msg(chat(7), True))
        await until(lambda: rig.flow.queued() == 1, 1, "the request queued", 0.005)
        waiting.cancel()  # the client goes away
        await until(lambda: rig.flow.queued() == 0, 1, "the queue left", 0.005)
        assert rig.flow.queued() == 0 and rig.flow.outcomes["EvictedContextCancelled"] == 1
        # A second client waits, and is routed over the stream when a slot frees.
        call = stub.Process()
        await call.write(headers_msg(mode=fd))
        await call.write(body_msg(chat(8), True))
        await until(lambda: rig.flow.queued() == 1, 1, "the second request queued", 0.005)
        running.pop().close()
        replies = [await asyncio.wait_for(call.read(), 2) for _ in range(2)]
        assert kinds(replies) == ["request_headers", "request_body"]
        assert rig.inflight() == 2
        await call.done_writing()
        while await call.read() is not grpc.aio.EOF:
            pass
        await until(lambda: rig.inflight() == 1, 1, "the routed request's end counted", 0.005)
        running.pop().close()
        assert rig.ds.inflight.view() == {}
    finally:
        await channel.close()
        await server.stop(0)
        await rig.flow.close()


async def test_app_turns_flow_control_on_and_off_with_the_config(tmp_path):
    import yaml

    from epp.cmd.app import App, build_scheduler
    from tests.support.stack import serve_args

    eps = tmp_path / "eps.yaml"
    eps.write_text("pools:\n- name: pool\n  endpoints:\n  - {address: 127.0.0.1, port: 1}\n")
    cfg = tmp_path / "cfg.yaml"
    doc = {"apiVersion": "llm-d.ai/v1alpha1", "kind": "EndpointPickerConfig", "featureGates": ["flowControl"],
           "flowControl": {"defaultRequestTTL": "5s"}, "plugins": [{"type": "queue-scorer"}]}
    cfg.write_text(yaml.safe_dump(doc))
    app = App(serve_args("--grpc-port", "0", "--endpoints-file", str(eps), "--config-file", str(cfg)))
    await app.start()
    try:
        flow = app.flow
        assert app.director.flow is flow and flow.config.default_ttl_s == 5.0
        doc["flowControl"] = {"defaultRequestTTL": "7s"}
        app.apply_scheduler(build_scheduler([doc], app.rng))
        assert app.flow is flow and flow.config.default_ttl_s == 7.0  # reconfigured in place
        del doc["flowControl"]
        doc["featureGates"] = []
        app.apply_scheduler(build_scheduler([doc], app.rng))
        assert app.director.flow is None and app.flow is None
    finally:
        await app.stop(0)


async def test_priority_usage_limit_keeps_room_for_the_others():
    rig = Rig(FlowControl(sheddable_usage_limit=0.5), per_endpoint=2)  # capacity 4; sheddable stop at 2
    shed = [rig.send(i, "sheddable") for i in range(3)]
    assert [isinstance(out, Outcome) for _, out in shed] == [True, True, False]  # the third would pass 0.5
    critical = [rig.send(10 + i, "critical") for i in range(3)]
    assert [isinstance(out, Outcome) for _, out in critical] == [True, True, False]  # the pool is full at 4
    critical[0][0].close()  # a slot frees: the queued critical request goes, the sheddable one still waits
    await settle()
    assert critical[2][1].done() and not shed[2][1].done()
    for ex, _ in critical[1:] + shed[:2]:
        ex.close()
    await asyncio.wait_for(shed[2][1], 1)
    shed[2][0].close()
    critical[2][0].close()
    assert rig.ds.inflight.view() == {}
    await rig.flow.close()


def test_fairness_ids_from_clients_cannot_grow_the_metrics_without_bound(monkeypatch):
    import epp.api.metrics as m

    monkeypatch.setattr(m, "FAIRNESS_LABELS", 3)
    metrics = EppMetrics()
    for i in range(10):
        metrics.flow_outcome(f"tenant-{i}", 0, "Dispatched", POOL, "llama", "llama", 0.0)
    fids = {s.labels["fairness_id"] for s in metrics.flow_duration.collect()[0].samples}
    assert fids == {"tenant-0", "tenant-1", "tenant-2", "other"}
