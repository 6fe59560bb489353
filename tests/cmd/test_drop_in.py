"""`epp serve` started with the exact args of GIE's, llm-d's and KServe's deployments (tests/cmd/deployer_argv.py):
each starts against the wire-level fake API server, serves TLS on the ext_proc port unless told not to, and answers
every gRPC health name its probes ask, on the health port and (ext_proc's own name) on the ext_proc port. Flags no
EPP defines still fail with exit 2 naming the flag."""

from __future__ import annotations

import asyncio
import ssl
import subprocess
import sys

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from epp.cmd.app import App
from epp.cmd.settings import ServeSettings
from tests.cmd.deployer_argv import DEPLOYERS, fill, mounted, mounts
from tests.fleet.k8s.fakeapi import FakeKubeAPI, pod, pool
from tests.support.envoy import free_port
from tests.support.wait import until

SERVING = health_pb2.HealthCheckResponse.SERVING
EXT_PROC = "envoy.service.ext_proc.v3.ExternalProcessor"



def server_cert(port: int) -> bytes:
    """The certificate the ext_proc port presents (fetched without verifying it, as gateways connect)."""
    return ssl.get_server_certificate(("127.0.0.1", port)).encode()


async def channel(port: int, secure: bool) -> grpc.aio.Channel:
    if not secure:
        return grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    # off the loop: the server under test may run on this same loop
    creds = grpc.ssl_channel_credentials(root_certificates=await asyncio.to_thread(server_cert, port))
    return grpc.aio.secure_channel(f"127.0.0.1:{port}", creds, options=[("grpc.ssl_target_name_override",
                                                                        "localhost")])


async def health(port: int, service: str, secure: bool = False) -> int:
    async with await channel(port, secure) as ch:
        stub = health_pb2_grpc.HealthStub(ch)
        return (await stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)).status


@pytest.fixture
def kube(monkeypatch):
    api = FakeKubeAPI().start()
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.delenv("NAMESPACE", raising=False)
    yield api
    api.stop()


@pytest.mark.parametrize("name", sorted(DEPLOYERS))
async def test_the_deployers_args_start_pointsman_and_it_serves(kube, tmp_path, name):
    args, probed = DEPLOYERS[name]
    grpc_port, health_port = free_port(), free_port()
    # The deployer's args exactly; then (last wins, as pflag) loopback ports of this test instead of 9002/9003/9090,
    # and the fake API server's kubeconfig (in a pod: the in-cluster config).
    argv = [*mounted(args, mounts(tmp_path)), f"--grpc-port={grpc_port}", f"--grpc-health-port={health_port}",
            "--grpc-host=127.0.0.1", "--metrics-port=0",
            f"--kubeconfig={kube.kubeconfig(tmp_path / 'kubeconfig', 'pointsman-sa-token')}"]
    settings = ServeSettings.from_argv(argv)
    fill(kube, settings)
    app = App(settings)
    await app.start()
    try:
        await until(lambda: app.datastore.synced, 15, "the pool to sync from the fake API server")
        for service in probed:
            assert await health(health_port, service) == SERVING, service
        # Envoy/Istio sidecars health-check the ext_proc service on the ext_proc port itself, in TLS when served.
        secure = settings.server.secure
        assert secure == (name != "llm-d-v0.10-standalone-agentgateway")
        assert await health(grpc_port, EXT_PROC, secure=secure) == SERVING
        if secure:
            with pytest.raises(grpc.aio.AioRpcError):  # a plaintext client gets nothing from the TLS port
                await health(grpc_port, EXT_PROC, secure=False)
    finally:
        await app.stop(0)


def test_what_the_foreign_flags_set():
    def settings(name: str) -> ServeSettings:
        return ServeSettings.from_argv(mounted(DEPLOYERS[name][0], {}))

    conf = settings("gie-v1.5-conformance")
    assert (conf.runtime.verbosity, conf.observe.logs.format, conf.server.secure) == (4, "json", True)
    assert conf.metrics_auth.enabled  # GIE's default where Kubernetes can check a token
    assert settings("gie-v1.5-chart-sglang").compat.default_engine == "sglang"
    assert settings("gie-v1.5-chart-triton-tensorrt-llm").compat.default_engine == "triton"
    trt = settings("gie-v1.5-chart-trtllm-serve").compat
    assert (trt.default_engine, trt.scrape_path) == ("trtllm-serve", "/prometheus/metrics")  # quotes gone
    flags_map = settings("gie-v1.5-chart-flags-map")
    assert flags_map.scrape.interval == pytest.approx(0.1)
    assert any("--enable-pprof=true" in n for n in flags_map.compat.notices)  # pflag: the stray "false" is ignored
    assert any("stray arguments ['false']" in n for n in flags_map.compat.notices)
    assert settings("gie-v1.5-chart-replicas-3").compat.leader_election
    assert not settings("llm-d-v0.10-gateway-replicas-2").compat.leader_election  # the last one wins
    assert settings("llm-d-v0.10-gateway-replicas-2").runtime.verbosity == 2
    assert not settings("gie-v1.5-chart-monitoring-no-auth-tracing").metrics_auth.enabled
    assert settings("gie-v1.5-chart-monitoring-no-auth-tracing").observe.tracing.enabled
    assert not settings("llm-d-v0.10-standalone-agentgateway").server.secure
    assert settings("gie-v1.5-standalone-chart").sources.selector == {"app": "m"}
    kserve = settings("kserve-config-llm-scheduler")
    assert (kserve.sources.pool_name, kserve.server.grpc_port, kserve.server.health_port) == ("rel", 9002, 9003)
    assert (kserve.compat.scrape_scheme, kserve.compat.scrape_insecure_skip_verify) == ("https", True)
    assert kserve.server.cert_path == "/etc/ssl/certs" and kserve.server.secure
    assert settings("llm-d-deployer-preset").runtime.verbosity == 4
    assert settings("llm-d-v0.4-values-on-gie-chart").compat.default_engine == "vllm"


def epp(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "epp.cmd.cli", *args], capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("argv, named", [
    (["serve", "--pool-name", "p", "--no-such-flag", "1"], "--no-such-flag"),
    (["--pool-name", "p", "--zap-encoder", "json", "--leader-elect"], "--leader-elect"),  # GIE's binary form
    (["serve", "--pool-name", "p", "-x"], "'x'"),  # pflag knows one shorthand, -v
    (["serve", "--pool-name", "p", "--kubeApiQps", "5"], "--kubeApiQps"),  # camelCase only where GIE had it
])
def test_a_flag_nobody_defines_exits_2_naming_it(argv, named):
    run = epp(*argv)
    assert run.returncode == 2, run.stderr
    assert named in run.stderr and "Traceback" not in run.stderr


@pytest.mark.parametrize("argv, says", [
    (["serve", "--pool-name", "p", "--zap-encoder", "xml"], '"--zap-encoder"'),
    (["serve", "--pool-name", "p", "--secure-serving=maybe"], '"--secure-serving"'),
    (["serve", "--pool-name", "p", "--total-queued-requests-metric", "my_queue"], "--total-queued-requests-metric"),
    (["serve", "--pool-name", "p", "--kv-cache-usage-percentage-metric", "vllm:kv_cache_usage_perc",
      "--cache-info-metric", "sglang:cache_config_info"], "different engines"),
    (["serve", "--pool-name", "p", "--grpc-max-recv-msg-size", "lots"], "--grpc-max-recv-msg-size"),
    (["serve", "--pool-name", "p", "--grpc-port"], "flag needs an argument: --grpc-port"),
])
def test_bad_values_of_foreign_flags_are_clear_errors(argv, says):
    run = epp(*argv)
    assert run.returncode == 2, run.stderr
    assert says in run.stderr and "Traceback" not in run.stderr


def test_help_anywhere_prints_the_help_as_pflag_does():
    run = epp("serve", "--pool-name", "p", "--zap-encoder", "json", "--help")
    assert run.returncode == 0, run.stderr
    assert "--model-server-metrics-port" in run.stdout and "--secure-serving" in run.stdout


@pytest.mark.envoy
async def test_gie_conformance_deployment_behind_real_envoy_over_tls(kube, tmp_path):
    """GIE v1.5's conformance Deployment args start `epp serve` (a real process): health answers
    inference-extension, the ext_proc port serves TLS with a self-signed certificate, real Envoy with an
    UpstreamTlsContext (no verification, as GIE's gateways) routes requests through it, and the foreign flags'
    notices are logged once."""
    import aiohttp
    import orjson

    from epp.envoy_config import EnvoyConfigSpec, render_yaml
    from tests.support.backend import EchoFleet
    from tests.support.envoy import Envoy

    backend = free_port()
    fleet = EchoFleet([backend])
    await fleet.start()
    kube.apply("inference.networking.k8s.io", "inferencepools",
               pool("primary-inference-pool", {"app": "m"}, [backend], namespace="inference-conformance-app-backend"))
    kube.apply("", "pods", pod("m-0", "127.0.0.1", {"app": "m"}, namespace="inference-conformance-app-backend"))
    grpc_port, health_port, lp, ap = free_port(), free_port(), free_port(), free_port()
    args, probed = DEPLOYERS["gie-v1.5-conformance"]
    log = tmp_path / "epp.log"
    argv = [sys.executable, "-m", "epp.cmd.cli", *mounted(args, mounts(tmp_path)), "--enable-pprof", "false",
            f"--grpc-port={grpc_port}", f"--grpc-health-port={health_port}", "--grpc-host=127.0.0.1",
            "--metrics-port=0", f"--kubeconfig={kube.kubeconfig(tmp_path / 'kc', 'pointsman-sa-token')}"]
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
    envoy = None
    try:
        async def serving() -> bool:
            if proc.poll() is not None:
                raise AssertionError(f"epp serve exited {proc.returncode}: {log.read_text()[-3000:]}")
            try:
                return await health(health_port, probed[0]) == SERVING
            except grpc.aio.AioRpcError:
                return False
        await until(serving, 30, "inference-extension SERVING on the health port")
        assert await health(grpc_port, EXT_PROC, secure=True) == SERVING
        envoy = Envoy(render_yaml(EnvoyConfigSpec(listen_port=lp, admin_port=ap, epp_port=grpc_port, epp_tls=True)),
                      lp, ap)
        await asyncio.to_thread(envoy.start)
        chat = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]})
        async with aiohttp.ClientSession() as c:
            async with c.post(f"http://127.0.0.1:{lp}/v1/chat/completions", data=chat) as r:
                assert r.status == 200, await r.text()
                assert (await r.json())["served_by"] == backend
    finally:
        if envoy is not None:
            envoy.stop()
        proc.terminate()
        proc.wait(timeout=30)
        await fleet.stop()
    text = log.read_text()
    assert text.count("--enable-pprof=true: accepted") == 1, text[-3000:]
    assert text.count("stray arguments ['false']") == 1
