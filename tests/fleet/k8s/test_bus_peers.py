"""Replica bus peers from a headless Service's EndpointSlices, with the real Kubernetes client against the
wire-level fake API server: two real replicas (on 127.0.0.2 and 127.0.0.3, same bus port) find each other when the
Service lists them, share load, and forget a replica the Service drops."""

from __future__ import annotations

import pytest
import yaml

from epp.bus.peers import ServicePeers, expand, parse_peers, slice_hosts
from epp.cmd.app import App
from epp.fleet.k8s.discovery import make_api_client
from epp.stack.ports import free_port
from tests.fleet.k8s.fakeapi import FakeKubeAPI, endpoint_slice
from tests.support.backend import EchoFleet
from tests.support.extproc_requests import chat, open_request, stub_for
from tests.support.stack import serve_args
from tests.support.wait import until

SLICES = "discovery.k8s.io"


def test_addresses_and_expansion():
    assert parse_peers("10.0.0.1:9004, 10.0.0.2:9004,,fd00::1:9004") == ["10.0.0.1:9004", "10.0.0.2:9004",
                                                                          "[fd00::1]:9004"]
    assert expand(["10.0.0.1:9004"], 3) == ["10.0.0.1:9004", "10.0.0.1:9005", "10.0.0.1:9006"]
    assert expand(["ipc:///run/x/bus-0"], 3) == ["ipc:///run/x/bus-0"]
    for bad in ("10.0.0.1", "host:", ":9004", "h:99999"):
        with pytest.raises(ValueError):
            parse_peers(bad)
    slices = [endpoint_slice("s1", "svc", ["10.0.0.2", "10.0.0.1"]), endpoint_slice("s2", "svc", ["10.0.0.1"]),
              {"addressType": "FQDN", "endpoints": [{"addresses": ["x.example"]}]}]
    assert slice_hosts(slices) == ["10.0.0.1", "10.0.0.2"]


async def test_service_peers_follow_the_endpointslices_of_one_service():
    kube = FakeKubeAPI().start()
    seen: list[list[str]] = []
    peers = ServicePeers(make_api_client(host=kube.host), "default", "pointsman-bus", 9004, 2, seen.append,
                         backoff_initial_s=0.05)
    try:
        kube.apply(SLICES, "endpointslices", endpoint_slice("pointsman-bus-a", "pointsman-bus", ["10.0.0.1"]))
        kube.apply(SLICES, "endpointslices", endpoint_slice("other-x", "other", ["10.9.9.9"]))
        peers.start()
        await until(lambda: seen and seen[-1] == ["10.0.0.1:9004", "10.0.0.1:9005"], 5.0, "listed")
        kube.apply(SLICES, "endpointslices", endpoint_slice("pointsman-bus-b", "pointsman-bus", ["10.0.0.2"],
                                                            ready=False))  # not ready yet: still a peer
        await until(lambda: len(seen[-1]) == 4, 5.0, "a second replica")
        kube.delete(SLICES, "endpointslices", "pointsman-bus-a")
        await until(lambda: seen[-1] == ["10.0.0.2:9004", "10.0.0.2:9005"], 5.0, "the first one gone")
        assert all("10.9.9.9" not in p for ps in seen for p in ps)
        assert ("list", "endpointslices") in {(v, p) for v, p, _ in kube.requests}
        params = next(q for v, p, q in kube.requests if p == "endpointslices")
        assert params.get("labelSelector") == "kubernetes.io/service-name=pointsman-bus"
    finally:
        await peers.stop()
        kube.stop()


async def test_replicas_found_through_a_headless_service_share_load(tmp_path):
    kube = FakeKubeAPI().start()
    ports = [free_port(), free_port()]
    fleet = EchoFleet(ports)
    await fleet.start()
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "fake",
        "clusters": [{"name": "fake", "cluster": {"server": kube.host}}],
        "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "u"}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
    }))
    eps = tmp_path / "eps.yaml"
    eps.write_text(yaml.safe_dump({"pools": [{"name": "pool", "endpoints": [
        {"address": "127.0.0.1", "port": p} for p in ports]}]}))
    bus_port = free_port()
    apps = []
    for ip in ("127.0.0.2", "127.0.0.3"):  # two "pods": one bus port, two addresses, as in a cluster
        apps.append(App(serve_args("--grpc-port", str(free_port()), "--endpoints-file", str(eps),
                                   "--kubeconfig", str(kubeconfig), "--bus-service", "pointsman-bus",
                                   "--bus-address", ip, "--bus-port", str(bus_port))))
    a, b = apps
    channel = None
    try:
        kube.apply(SLICES, "endpointslices", endpoint_slice("pointsman-bus-1", "pointsman-bus", ["127.0.0.2"],
                                                            port=bus_port))
        await a.start()
        await b.start()
        assert a.bus.bus.address == f"127.0.0.2:{bus_port}"
        await until(lambda: b.bus.bus.peers == [f"127.0.0.2:{bus_port}"], 5.0, "b finds a")
        assert a.bus.bus.peers == []  # the Service does not list b yet: a does not listen to it
        kube.apply(SLICES, "endpointslices", endpoint_slice("pointsman-bus-1", "pointsman-bus",
                                                            ["127.0.0.2", "127.0.0.3"], port=bus_port))
        await until(lambda: a.bus.bus.live_peers() == [f"127.0.0.3:{bus_port}"], 5.0, "a hears b")
        channel, stub = stub_for(b.port)
        held = await open_request(stub, chat("hello"))
        await until(lambda: a.datastore.inflight.get(held.endpoint).requests == 1, 1.0, "b's load at a")
        # the Service drops b: a forgets it at once, its load included (no waiting for the ttl)
        kube.apply(SLICES, "endpointslices", endpoint_slice("pointsman-bus-1", "pointsman-bus", ["127.0.0.2"],
                                                            port=bus_port))
        await until(lambda: a.bus.bus.peers == [], 5.0, "a forgets b")
        assert a.datastore.inflight.view() == {}
        await held.finish()
    finally:
        if channel is not None:
            await channel.close()
        for app in apps:
            await app.stop(0)
        await fleet.stop()
        kube.stop()
