"""The EDS server: the xDS state machine on a real datastore, and the gRPC service through a raw xDS client."""

from __future__ import annotations

import asyncio
import logging
import time

import grpc
import pytest
import yaml
from envoy.config.endpoint.v3 import endpoint_pb2
from envoy.service.discovery.v3 import discovery_pb2
from envoy.service.endpoint.v3 import eds_pb2_grpc
from google.rpc import status_pb2

from epp.cmd.app import App
from epp.fleet.datastore import Datastore, PoolSpec
from epp.stack.ports import free_port
from epp.xds import EDS_TYPE_URL, EdsStream, ResourceTable
from epp.xds.resources import DEGRADED, HEALTHY, UNHEALTHY, UNKNOWN
from scheduling.types import Endpoint, Metrics, endpoint_key
from tests.support.stack import serve_args
from tests.support.wait import until


def ep(port: int, address: str = "10.0.0.1", **metrics) -> Endpoint:
    e = Endpoint(key=endpoint_key(address, port), address=address, port=port, name=f"pod-{port}")
    return e.with_metrics(Metrics(**metrics)) if metrics else e


def request(names=("pool",), version="", nonce="", error: str | None = None) -> discovery_pb2.DiscoveryRequest:
    req = discovery_pb2.DiscoveryRequest(type_url=EDS_TYPE_URL, resource_names=list(names), version_info=version,
                                         response_nonce=nonce)
    req.node.id = "test-node"
    if error is not None:
        req.error_detail.CopyFrom(status_pb2.Status(code=3, message=error))
    return req


def unpack(resp: discovery_pb2.DiscoveryResponse) -> dict[str, list[tuple[str, int, int]]]:
    out = {}
    for any_ in resp.resources:
        cla = endpoint_pb2.ClusterLoadAssignment()
        assert any_.Unpack(cla)
        out[cla.cluster_name] = [(lb.endpoint.address.socket_address.address, lb.endpoint.address.socket_address.port_value,
                                  lb.health_status) for loc in cla.endpoints for lb in loc.lb_endpoints]
    return out


@pytest.fixture
def ds() -> Datastore:
    d = Datastore()
    d.set_pool(PoolSpec("pool"), [ep(8000, updated_at=1.0, stale=False), ep(8001, updated_at=1.0, stale=False)])
    d.synced = True
    return d


def stream_for(ds: Datastore) -> tuple[EdsStream, ResourceTable]:
    table = ResourceTable(ds)
    table.refresh()
    return EdsStream(table, "test"), table


# ---- the sans-IO stream -------------------------------------------------------------------------------------
def test_first_request_gets_the_pool_with_a_version_and_a_nonce(ds):
    s, _ = stream_for(ds)
    resp = s.on_request(request())
    assert resp is not None and resp.type_url == EDS_TYPE_URL
    assert resp.version_info and resp.nonce
    assert unpack(resp) == {"pool": [("10.0.0.1", 8000, HEALTHY), ("10.0.0.1", 8001, HEALTHY)]}


def test_ack_sends_nothing_and_a_change_pushes_a_new_version(ds):
    s, table = stream_for(ds)
    first = s.on_request(request())
    assert s.on_request(request(version=first.version_info, nonce=first.nonce)) is None
    assert s.acked_version == first.version_info and s.acks == 1
    assert s.on_change() is None, "nothing changed: nothing to push"
    ds.set_endpoints("pool", [ep(8000), ep(8001), ep(8002)])
    assert table.refresh() == {"pool"}
    second = s.on_change()
    assert second is not None and second.version_info != first.version_info and second.nonce != first.nonce
    assert [p for _, p, _ in unpack(second)["pool"]] == [8000, 8001, 8002]


def test_out_of_rotation_endpoints_stay_listed_with_a_health_status(ds):
    ds.set_endpoints("pool", [ep(8000, updated_at=1.0, stale=False), ep(8001, updated_at=1.0, stale=True),
                              ep(8002, updated_at=1.0, stale=False), ep(8003)])
    ds.set_unhealthy("10.0.0.1:8002", True)
    s, _ = stream_for(ds)
    health = {p: h for _, p, h in unpack(s.on_request(request()))["pool"]}
    assert health == {8000: HEALTHY, 8001: DEGRADED, 8002: UNHEALTHY, 8003: UNKNOWN}


def test_health_change_alone_is_a_new_version(ds):
    s, table = stream_for(ds)
    first = s.on_request(request())
    ds.set_unhealthy("10.0.0.1:8001", True)  # no datastore notification: the refresh poll finds it
    assert table.refresh() == {"pool"}
    pushed = s.on_change()
    assert pushed is not None and pushed.version_info != first.version_info
    assert dict((p, h) for _, p, h in unpack(pushed)["pool"])[8001] == UNHEALTHY


def test_metrics_updates_alone_do_not_push(ds):
    s, table = stream_for(ds)
    s.on_request(request())
    ds.update_metrics({"10.0.0.1:8000": Metrics(waiting=5, updated_at=2.0, stale=False)})
    assert table.refresh() == set()
    assert s.on_change() is None


def test_nack_is_logged_and_the_rejected_version_is_never_resent(ds, caplog):
    s, table = stream_for(ds)
    first = s.on_request(request())
    with caplog.at_level(logging.WARNING, logger="epp.xds"):
        assert s.on_request(request(version="", nonce=first.nonce, error="malformed IP address")) is None
    assert s.nacks == 1 and s.rejected_version == first.version_info
    assert any("rejected version" in r.message and "malformed IP address" in r.message for r in caplog.records)
    for _ in range(5):  # polls and no-op notifications must not resend it
        table.refresh()
        assert s.on_change() is None
    ds.set_endpoints("pool", [ep(8000)])
    table.refresh()
    fixed = s.on_change()
    assert fixed is not None and fixed.version_info != first.version_info
    assert s.on_request(request(version=fixed.version_info, nonce=fixed.nonce)) is None
    assert s.acked_version == fixed.version_info


def test_stale_nonce_is_ignored_but_a_new_streams_first_request_is_answered(ds):
    s, table = stream_for(ds)
    first = s.on_request(request())
    ds.set_endpoints("pool", [ep(8000)])
    table.refresh()
    second = s.on_change()
    # An ACK of the first push arrives after the second went out: stale, ignored (no NACK, no resend).
    assert s.on_request(request(version=first.version_info, nonce=first.nonce)) is None
    assert s.acks == 0
    # After a Pointsman restart Envoy may quote a nonce this server never sent: the first request still gets an answer.
    fresh = EdsStream(table, "restarted")
    resp = fresh.on_request(request(version=second.version_info, nonce="from-the-old-server"))
    assert resp is not None and resp.version_info == second.version_info


def test_subscription_changes_are_answered_and_empty_means_nothing(ds):
    ds.set_pool(PoolSpec("other"), [ep(9000, address="10.0.0.9")])
    s, _ = stream_for(ds)
    first = s.on_request(request(["pool"]))
    both = s.on_request(request(["pool", "other"], version=first.version_info, nonce=first.nonce))
    assert set(unpack(both)) == {"pool", "other"}
    assert s.on_request(request([], version=both.version_info, nonce=both.nonce)) is None
    assert s.on_change() is None
    wildcard = EdsStream(s.table, "w").on_request(request(["*"]))
    assert set(unpack(wildcard)) == {"pool", "other"}


def test_unknown_pool_is_empty_once_synced_and_withheld_before(ds, caplog):
    ds.synced = False
    s, table = stream_for(ds)
    assert s.on_request(request(["nope"])) is None, "before sync a missing pool may still come: Envoy waits"
    ds.synced = True
    with caplog.at_level(logging.WARNING, logger="epp.xds"):
        resp = s.on_change()
    assert resp is not None and unpack(resp) == {"nope": []}
    assert any("'nope'" in r.message and "pool" in r.message for r in caplog.records)


def test_removed_pool_empties_its_assignment(ds):
    s, table = stream_for(ds)
    s.on_request(request())
    ds.remove_pool("pool")
    assert table.refresh() == {"pool"}
    assert unpack(s.on_change()) == {"pool": []}


def test_wrong_type_url_is_an_error(ds):
    s, _ = stream_for(ds)
    bad = request()
    bad.type_url = "type.googleapis.com/envoy.config.cluster.v3.Cluster"
    with pytest.raises(ValueError, match="ClusterLoadAssignment"):
        s.on_request(bad)


def test_version_is_a_content_hash_shared_across_servers(ds):
    a, _ = stream_for(ds)
    b, _ = stream_for(ds)
    assert a.on_request(request()).version_info == b.on_request(request()).version_info


# ---- the gRPC service, through a raw xDS client --------------------------------------------------------------
class RawClient:
    def __init__(self, port: int) -> None:
        self.channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
        self.stub = eds_pb2_grpc.EndpointDiscoveryServiceStub(self.channel)
        self.queue: asyncio.Queue = asyncio.Queue()
        self.received: asyncio.Queue = asyncio.Queue()
        self.call = self.stub.StreamEndpoints(self._requests())
        # One reader for the whole call: cancelling a pending read() would cancel the RPC itself.
        self.reader = asyncio.ensure_future(self._read())

    async def _requests(self):
        while (req := await self.queue.get()) is not None:
            yield req

    async def _read(self) -> None:
        async for resp in self.call:
            self.received.put_nowait(resp)

    def send(self, req: discovery_pb2.DiscoveryRequest) -> None:
        self.queue.put_nowait(req)

    async def recv(self, timeout: float) -> discovery_pb2.DiscoveryResponse | None:
        try:
            return await asyncio.wait_for(self.received.get(), timeout)
        except asyncio.TimeoutError:
            return None

    async def close(self) -> None:
        self.queue.put_nowait(None)
        self.call.cancel()
        self.reader.cancel()
        await asyncio.gather(self.reader, return_exceptions=True)
        await self.channel.close()


def write_endpoints(path, ports: list[int], address: str = "127.0.0.1") -> None:
    doc = {"pools": [{"name": "pool", "endpoints": [{"address": address, "port": p} for p in ports]}]}
    tmp = path.with_suffix(".tmp")
    tmp.write_text(yaml.safe_dump(doc))
    tmp.replace(path)


@pytest.fixture
async def app(tmp_path):
    path = tmp_path / "endpoints.yaml"
    write_endpoints(path, [free_port(), free_port()])
    a = App(serve_args("--grpc-port", str(free_port()), "--endpoints-file", str(path)))
    await a.start()
    a.endpoints_path = path
    try:
        yield a
    finally:
        await a.stop(0)


async def test_file_change_reaches_a_subscriber_within_a_second(app):
    client = RawClient(app.port)
    try:
        client.send(request())
        first = await client.recv(5)
        assert first is not None and len(unpack(first)["pool"]) == 2
        client.send(request(version=first.version_info, nonce=first.nonce))
        new_port = free_port()
        ports = [p for _, p, _ in unpack(first)["pool"]] + [new_port]
        started = time.monotonic()
        write_endpoints(app.endpoints_path, ports)
        while True:  # health pushes (the endpoints are not running) may come first; ACK them and read on
            pushed = await client.recv(max(0.0, started + 3 - time.monotonic()))
            assert pushed is not None, "the new endpoint never reached the EDS subscriber"
            client.send(request(version=pushed.version_info, nonce=pushed.nonce))
            if new_port in [p for _, p, _ in unpack(pushed)["pool"]]:
                break
        elapsed = time.monotonic() - started
        assert elapsed < 1.0, f"the change took {elapsed:.2f} s to reach the EDS subscriber"
    finally:
        await client.close()


async def test_nack_over_grpc_does_not_loop_and_the_next_change_is_served(app, caplog):
    client = RawClient(app.port)
    try:
        client.send(request())
        first = await client.recv(5)
        assert first is not None
        with caplog.at_level(logging.WARNING, logger="epp.xds"):
            client.send(request(version="", nonce=first.nonce, error="endpoint rejected by the test"))
            # The scrapes of the (dead) endpoints and the 0.25 s refresh poll run meanwhile: nothing may come back
            # except a genuinely new version (health turns UNHEALTHY after three failed scrapes: a new version).
            again = await client.recv(1.5)
            while again is not None:
                assert again.version_info != first.version_info, "the rejected version was sent again"
                client.send(request(version=again.version_info, nonce=again.nonce))
                again = await client.recv(1.0)
        assert any("rejected version" in r.message and "endpoint rejected by the test" in r.message
                   for r in caplog.records)
        write_endpoints(app.endpoints_path, [free_port()])
        served = await client.recv(3)
        assert served is not None and served.version_info != first.version_info
        assert len(unpack(served)["pool"]) == 1
        assert app.eds.streams and next(iter(app.eds.streams)).nacks == 1
    finally:
        await client.close()


async def test_fetch_endpoints_and_delta_is_refused(app):
    async with grpc.aio.insecure_channel(f"127.0.0.1:{app.port}") as ch:
        stub = eds_pb2_grpc.EndpointDiscoveryServiceStub(ch)
        resp = await stub.FetchEndpoints(request(), timeout=5)
        assert len(unpack(resp)["pool"]) == 2 and resp.version_info
        delta = stub.DeltaEndpoints()
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await delta.read()
        assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED


async def test_stop_ends_streams_at_once(app):
    client = RawClient(app.port)
    try:
        client.send(request())
        assert await client.recv(5) is not None
        started = time.monotonic()
        await app.stop(grace=10)
        assert time.monotonic() - started < 3, "an open EDS stream must not hold up shutdown"
    finally:
        await client.close()


async def test_eds_can_be_turned_off(tmp_path):
    path = tmp_path / "endpoints.yaml"
    write_endpoints(path, [free_port()])
    a = App(serve_args("--grpc-port", str(free_port()), "--endpoints-file", str(path), "--eds", "false"))
    await a.start()
    try:
        assert a.eds is None
        async with grpc.aio.insecure_channel(f"127.0.0.1:{a.port}") as ch:
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await eds_pb2_grpc.EndpointDiscoveryServiceStub(ch).FetchEndpoints(request(), timeout=5)
        assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED
    finally:
        await a.stop(0)


async def test_a_change_found_while_answering_one_stream_reaches_the_others(ds):
    """Health changes are found by refreshing the table, by the poll or by any stream's request; whoever finds
    the change, every stream must hear of it (here the poll is off, so only stream A's request can find it)."""
    from epp.xds import EdsService, add_eds_service

    service = EdsService(ds, poll_s=3600)
    server = grpc.aio.server()
    add_eds_service(server, service)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    service.start()
    a, b = RawClient(port), RawClient(port)
    try:
        a.send(request())
        b.send(request())
        first_a, first_b = await a.recv(5), await b.recv(5)
        assert first_a is not None and first_b is not None
        a.send(request(version=first_a.version_info, nonce=first_a.nonce))
        b.send(request(version=first_b.version_info, nonce=first_b.nonce))
        await until(lambda: len(service.streams) == 2 and all(st.acks == 1 for st in service.streams), 5,
                    lambda: f"both ACKs handled: {[(st.acks, st.nacks) for st in service.streams]}")
        ds.set_unhealthy("10.0.0.1:8001", True)  # no notification
        a.send(request(["pool", "other"], version=first_a.version_info, nonce=first_a.nonce))
        assert await a.recv(3) is not None
        pushed = await b.recv(3)
        assert pushed is not None, "stream B never heard of the change stream A's request found"
        assert dict((p, h) for _, p, h in unpack(pushed)["pool"])[8001] == UNHEALTHY
    finally:
        await a.close()
        await b.close()
        await service.stop()
        await server.stop(0)
