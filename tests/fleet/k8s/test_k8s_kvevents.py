"""KV events in Kubernetes: a pod's `pointsman.ai/kv-events-endpoint` annotation (a bare port: the pod's IP is
filled in) makes `epp serve --pool-name` subscribe to its engine's events (real kubernetes client against the fake
API server, real modelsim publisher, real ZMQ); the pod going away takes the subscription and the index entries."""

from __future__ import annotations

import yaml
from fakeapi import FakeKubeAPI, pod, pool

from bench.routing.procs import free_port_block
from epp.cmd.app import App
from modelsim.config import FleetConfig
from modelsim.fleet import Fleet
from scheduling.prefix.precise import LIVE
from tests.support.envoy import free_port
from tests.support.stack import serve_args
from tests.support.wait import until

POOLS, CORE = "inference.networking.k8s.io", ""


async def test_pod_annotations_subscribe_and_a_departed_pod_is_forgotten(tmp_path):
    fleet = Fleet(FleetConfig(servers=1, base_port=free_port_block(1), kv_events_port=free_port_block(1),
                              kv_events_replay_port=free_port_block(1), time_scale=0.05))
    await fleet.start()
    kube = FakeKubeAPI().start()
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "fake",
        "clusters": [{"name": "fake", "cluster": {"server": kube.host}}],
        "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "u"}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
    }))
    cfg = fleet.config
    app = App(serve_args("--pool-name", "llama", "--pool-namespace", "default", "--kubeconfig", str(kubeconfig),
                         "--grpc-port", str(free_port()), "--config-text",
                         "apiVersion: inference.networking.x-k8s.io/v1alpha1\nkind: EndpointPickerConfig\n"
                         "plugins: [{type: precise-prefix-cache-scorer}, {type: max-score-picker}]\n"
                         "schedulingProfiles: [{name: default, plugins: [{pluginRef: precise-prefix-cache-scorer},"
                         " {pluginRef: max-score-picker}]}]\n"))
    key = f"127.0.0.1:{cfg.port(0)}"
    try:
        await app.start()
        assert app.precise is not None
        kube.apply(POOLS, "inferencepools", pool("llama", {"app": "vllm"}, [cfg.port(0)]))
        kube.apply(CORE, "pods", pod("vllm-0", "127.0.0.1", {"app": "vllm"}, annotations={
            "pointsman.ai/kv-events-endpoint": str(cfg.kv_events_port),
            "pointsman.ai/kv-events-replay-endpoint": str(cfg.kv_events_replay_port)}))
        await until(lambda: app.precise is not None and app.precise.index.state(key) == LIVE, 8.0)
        src = app.precise.subscriber.sources()[key]
        assert (src.endpoint, src.replay) == (f"tcp://127.0.0.1:{cfg.kv_events_port}",
                                              f"tcp://127.0.0.1:{cfg.kv_events_replay_port}")
        kube.delete(CORE, "pods", "vllm-0")
        await until(lambda: key not in app.precise.subscriber.sources(), 8.0)
        assert app.precise.index.state(key) is None and key not in app.precise.index.endpoints()
    finally:
        await app.stop(0)
        kube.stop()
        await fleet.stop()
