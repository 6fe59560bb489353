import asyncio
import socket

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from epp.api.health import EXT_PROC_SERVICE, add_health_servicer, start_health_server
from epp.fleet.datastore import Datastore

S, NS = health_pb2.HealthCheckResponse.SERVING, health_pb2.HealthCheckResponse.NOT_SERVING
READY_SERVICES = ["", "readiness", EXT_PROC_SERVICE, "inference-extension"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def check(stub, service):
    return (await stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=2)).status


@pytest.fixture
async def health():
    ds = Datastore()
    port = free_port()
    server = await start_health_server(ds, port=port, host="127.0.0.1", watch_poll_s=0.02)
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    yield ds, health_pb2_grpc.HealthStub(channel)
    await channel.close()
    await server.stop(None)


async def test_not_ready_until_synced_then_serving(health):
    ds, stub = health
    assert await check(stub, "liveness") == S
    for svc in READY_SERVICES:
        assert await check(stub, svc) == NS, svc
    ds.synced = True
    for svc in READY_SERVICES + ["liveness"]:
        assert await check(stub, svc) == S, svc
    ds.synced = False  # e.g. the InferencePool was deleted
    assert await check(stub, "readiness") == NS


async def test_any_other_name_answers_as_readiness_without_leader_election(health):
    """GIE's EPP without leader election answers every service name with the pool's sync state."""
    ds, stub = health
    assert await check(stub, "no.such.Service") == NS
    ds.synced = True
    assert await check(stub, "no.such.Service") == S


async def test_leader_election_answers_as_gies_leader():
    """With --ha-enable-leader-election GIE's EPP answers liveness always, readiness/""/ext_proc when synced and
    leading (Pointsman: every replica leads), and SERVICE_UNKNOWN for any other name, inference-extension too."""
    ds = Datastore()
    port = free_port()
    server = await start_health_server(ds, port=port, host="127.0.0.1", leader_election=True)
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
            stub = health_pb2_grpc.HealthStub(ch)
            unknown = health_pb2.HealthCheckResponse.SERVICE_UNKNOWN
            assert await check(stub, "liveness") == S
            for svc in ("", "readiness", EXT_PROC_SERVICE):
                assert await check(stub, svc) == NS, svc
            ds.synced = True
            for svc in ("", "readiness", EXT_PROC_SERVICE, "liveness"):
                assert await check(stub, svc) == S, svc
            for svc in ("inference-extension", "no.such.Service"):
                assert await check(stub, svc) == unknown, svc
    finally:
        await server.stop(None)


async def test_watch_streams_the_transition(health):
    ds, stub = health
    call = stub.Watch(health_pb2.HealthCheckRequest(service="readiness"))
    first = await asyncio.wait_for(call.read(), 2)
    assert first.status == NS
    ds.synced = True
    second = await asyncio.wait_for(call.read(), 2)
    assert second.status == S
    call.cancel()


async def test_same_answers_on_an_existing_server_and_graceful_shutdown():
    ds = Datastore()
    server = grpc.aio.server()
    servicer = add_health_servicer(server, ds)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
            stub = health_pb2_grpc.HealthStub(ch)
            assert await check(stub, EXT_PROC_SERVICE) == NS
            ds.synced = True
            assert await check(stub, EXT_PROC_SERVICE) == S
            servicer.enter_graceful_shutdown()
            assert await check(stub, EXT_PROC_SERVICE) == NS
            assert await check(stub, "liveness") == NS
    finally:
        await server.stop(None)


async def test_port_in_use_is_an_error():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises((OSError, RuntimeError)):
            await start_health_server(Datastore(), port=port, host="127.0.0.1")
