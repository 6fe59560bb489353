"""The grpc layer with a raw ext_proc client, on both transports (h2 and grpc.aio): hostile streams, awaitable
decisions, cancellation, exact in-flight."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import aiohttp
import grpc
import pytest
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc

from epp.api.metrics import EppMetrics
from epp.cmd.app import App
from epp.extproc.server import build_server
from epp.protocol import BodyMode, Outcome
from epp.request.director import Director
from epp.request.exchange import RequestExchange
from tests.support.envoy import free_port
from tests.support.extproc import (
    CHAT,
    body_msg,
    headers_msg,
    inflight,
    kinds,
    real_director,
    response_body_msg,
    response_headers_msg,
    trailers_msg,
)
from tests.support.stack import serve_args
from tests.support.wait import until

FD = BodyMode.FULL_DUPLEX_STREAMED


class Gate:
    """Holds decisions until opened; counts what happened to them."""

    def __init__(self) -> None:
        self.event = asyncio.Event()
        self.started = 0
        self.cancelled = 0
        self.closes = 0
        self.fail = False


class SlowExchange(RequestExchange):
    """The real exchange, whose decision is an awaitable that completes when the gate opens."""

    __slots__ = ("gate",)

    def decide(self, headers, body, metadata):
        return self._decide(headers, body, metadata)

    async def _decide(self, headers, body, metadata) -> Outcome:
        self.gate.started += 1
        try:
            await self.gate.event.wait()
        except asyncio.CancelledError:
            self.gate.cancelled += 1
            raise
        if self.gate.fail:
            raise RuntimeError("the rate limiter is down")
        outcome = RequestExchange.decide(self, headers, body, metadata)
        assert isinstance(outcome, Outcome)
        return outcome

    def close(self) -> None:
        self.gate.closes += 1
        super().close()


@dataclass(frozen=True)
class SlowDirector(Director):
    gate: Gate = field(default_factory=lambda: Gate())

    def exchange(self) -> RequestExchange:
        ex = SlowExchange(self)
        ex.gate = self.gate
        return ex


def slow_director() -> SlowDirector:
    base = real_director()
    return SlowDirector(base.datastore, base.scheduler)


@pytest.fixture(params=["h2", "grpcio"])
async def serve(request):
    """A server on each transport: the default h2 one, and grpc.aio (`--grpc-transport grpcio`)."""
    servers = []

    async def start(director: Director) -> tuple[pb_grpc.ExternalProcessorStub, EppMetrics]:
        metrics = EppMetrics()
        server, _ = build_server(director, metrics=metrics, transport=request.param)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
        servers.append((server, channel))
        return pb_grpc.ExternalProcessorStub(channel), metrics

    yield start
    for server, channel in servers:
        await channel.close()
        await server.stop(0)


async def read_all(call) -> list[pb.ProcessingResponse]:
    out = []
    while (msg := await call.read()) is not grpc.aio.EOF:
        out.append(msg)
    return out


def violations(metrics: EppMetrics, kind: str) -> float:
    return metrics.registry.get_sample_value("pointsman_protocol_violations_total", {"kind": kind}) or 0.0


# ---- hostile streams through the real server ----------------------------------------------------------------------
async def test_duplicated_end_of_stream_headers_leave_no_phantom_inflight(serve):
    director = real_director()
    stub, metrics = await serve(director)

    async def hostile() -> list[str]:
        call = stub.Process()
        get = headers_msg(eos=True, method="GET", path="/v1/models", mode=FD)
        await call.write(get)
        await call.write(headers_msg(eos=True, method="GET", path="/v1/models"))
        await call.done_writing()
        return kinds(await read_all(call))

    results = await asyncio.gather(*(hostile() for _ in range(20)))
    assert all(r == ["request_headers", "immediate_response"] for r in results), results
    await until(lambda: inflight(director) == 0, 5.0)
    assert director.datastore.inflight.view() == {}
    assert violations(metrics, "request_headers_repeated") == 20
    # The endpoints carry no phantom load: a later well-formed request is still routed.
    call = stub.Process()
    await call.write(headers_msg(mode=FD))
    await call.write(body_msg(CHAT, True))
    assert kinds([await call.read(), await call.read()]) == ["request_headers", "request_body"]
    assert inflight(director) == 1
    await call.done_writing()
    assert await read_all(call) == []
    await until(lambda: inflight(director) == 0, 5.0)


async def test_violation_reply_on_the_wire(serve):
    director = real_director()
    stub, metrics = await serve(director)
    call = stub.Process()
    await call.write(body_msg(CHAT, True))
    replies = await read_all(call)
    assert kinds(replies) == ["immediate_response"]
    ir = replies[0].immediate_response
    assert ir.status.code == 500
    assert ir.body.startswith(b"inference error: Internal - ext_proc protocol violation: request_body before")
    assert violations(metrics, "request_before_headers") == 1
    assert inflight(director) == 0


# ---- awaitable decisions -------------------------------------------------------------------------------------------
async def test_an_awaitable_decision_that_completes_later(serve):
    director = slow_director()
    gate = director.gate
    stub, _ = await serve(director)
    call = stub.Process()
    await call.write(headers_msg(mode=FD))
    await call.write(body_msg(CHAT, True))
    await until(lambda: gate.started == 1, 5.0)
    await asyncio.sleep(0.05)
    assert inflight(director) == 0, "nothing is committed before the decision completes"
    gate.event.set()
    replies = [await call.read(), await call.read()]
    assert kinds(replies) == ["request_headers", "request_body"]
    assert replies[1].request_body.response.body_mutation.streamed_response.body == CHAT
    assert inflight(director) == 1
    await call.write(response_headers_msg())
    await call.write(response_body_msg(b"{}", True))
    assert kinds([await call.read(), await call.read()]) == ["response_headers", "response_body"]
    await call.done_writing()
    assert await read_all(call) == []
    await until(lambda: gate.closes == 1 and inflight(director) == 0, 5.0)
    assert gate.cancelled == 0


async def test_messages_that_arrive_while_the_decision_is_pending_keep_their_order(serve):
    director = slow_director()
    gate = director.gate
    stub, _ = await serve(director)
    call = stub.Process()
    await call.write(headers_msg(mode=FD))
    await call.write(body_msg(CHAT, True))
    await until(lambda: gate.started == 1, 5.0)
    await call.write(trailers_msg())  # read by the server while the decision is pending, answered after it
    await asyncio.sleep(0.05)
    gate.event.set()
    replies = [await call.read() for _ in range(3)]
    assert kinds(replies) == ["request_headers", "request_body", "request_trailers"]
    await call.done_writing()
    assert await read_all(call) == []
    await until(lambda: gate.closes == 1 and inflight(director) == 0, 5.0)


async def test_a_stream_cancelled_while_the_decision_is_pending(serve):
    director = slow_director()
    gate = director.gate
    stub, _ = await serve(director)
    call = stub.Process()
    await call.write(headers_msg(mode=FD))
    await call.write(body_msg(CHAT, True))
    await until(lambda: gate.started == 1, 5.0)
    call.cancel()
    await until(lambda: gate.cancelled == 1 and gate.closes == 1, 5.0)
    gate.event.set()  # too late: the decision is gone
    await asyncio.sleep(0.05)
    assert gate.closes == 1 and inflight(director) == 0
    assert director.datastore.inflight.view() == {}


async def test_a_client_that_half_closes_while_the_decision_is_pending_still_gets_its_reply(serve):
    """gRPC lets the server answer after the client's half-close: the pending decision is kept, its replies are
    sent, then the call ends OK; the exchange closes once and releases what the decision committed."""
    director = slow_director()
    gate = director.gate
    stub, _ = await serve(director)
    call = stub.Process()
    await call.write(headers_msg(mode=FD))
    await call.write(body_msg(CHAT, True))
    await until(lambda: gate.started == 1, 5.0)
    await call.done_writing()
    await asyncio.sleep(0.05)
    assert gate.cancelled == 0 and gate.closes == 0, "the half-close does not drop the pending decision"
    gate.event.set()
    replies = await read_all(call)
    assert kinds(replies) == ["request_headers", "request_body"]
    assert replies[1].request_body.response.body_mutation.streamed_response.body == CHAT
    assert await call.code() == grpc.StatusCode.OK
    await until(lambda: gate.closes == 1 and inflight(director) == 0, 5.0)
    assert gate.cancelled == 0 and director.datastore.inflight.view() == {}


async def test_a_violation_while_the_decision_is_pending_cancels_it(serve):
    director = slow_director()
    gate = director.gate
    stub, metrics = await serve(director)
    call = stub.Process()
    await call.write(headers_msg(mode=FD))
    await call.write(body_msg(CHAT, True))
    await until(lambda: gate.started == 1, 5.0)
    await call.write(headers_msg())
    replies = await read_all(call)
    assert kinds(replies) == ["immediate_response"] and replies[0].immediate_response.status.code == 400
    await until(lambda: gate.cancelled == 1 and gate.closes == 1, 5.0)
    assert inflight(director) == 0 and violations(metrics, "request_headers_repeated") == 1


async def test_a_local_reply_while_the_decision_is_pending_abandons_it(serve):
    director = slow_director()
    gate = director.gate
    stub, metrics = await serve(director)
    call = stub.Process()
    await call.write(headers_msg(mode=FD))
    await call.write(body_msg(CHAT[:10], False))
    await call.write(body_msg(CHAT[10:], True))
    await until(lambda: gate.started == 1, 5.0)
    await call.write(response_headers_msg())
    assert kinds([await call.read()]) == ["response_headers"]
    await until(lambda: gate.cancelled == 1, 5.0)
    await call.write(response_body_msg(b"local reply", True))
    assert kinds([await call.read()]) == ["response_body"]
    await call.done_writing()
    assert await read_all(call) == []
    await until(lambda: gate.closes == 1, 5.0)
    assert inflight(director) == 0 and metrics.registry.get_sample_value(
        "pointsman_protocol_violations_total", {"kind": "request_after_response"}) is None


async def test_a_failing_awaitable_decision_is_a_500_and_closes_once(serve):
    director = slow_director()
    gate = director.gate
    gate.fail = True
    stub, _ = await serve(director)
    call = stub.Process()
    await call.write(headers_msg(mode=FD))
    await call.write(body_msg(CHAT, True))
    await until(lambda: gate.started == 1, 5.0)
    gate.event.set()
    replies = await read_all(call)
    assert kinds(replies) == ["immediate_response"]
    assert replies[0].immediate_response.status.code == 500
    assert b"the rate limiter is down" in replies[0].immediate_response.body
    await until(lambda: gate.closes == 1, 5.0)
    assert inflight(director) == 0


async def test_epp_serve_counts_violations_on_its_metrics_endpoint(tmp_path):
    eps = tmp_path / "eps.yaml"
    eps.write_text("pools:\n- name: p\n  endpoints: [{address: 127.0.0.1, port: 1}]\n")
    mport = free_port()
    app = App(serve_args("--grpc-port", str(free_port()), "--endpoints-file", str(eps), "--metrics-port", str(mport)))
    await app.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{app.port}") as channel:
            call = pb_grpc.ExternalProcessorStub(channel).Process()
            await call.write(pb.ProcessingRequest())
            replies = await read_all(call)
        assert kinds(replies) == ["immediate_response"]
        assert replies[0].immediate_response.body == (
            b"inference error: BadRequest - ext_proc protocol violation: a ProcessingRequest with no message set")
        async with aiohttp.ClientSession() as c, c.get(f"http://127.0.0.1:{mport}/metrics") as r:
            text = await r.text()
        assert 'pointsman_protocol_violations_total{kind="empty_message"} 1.0' in text
    finally:
        await app.stop(0)
