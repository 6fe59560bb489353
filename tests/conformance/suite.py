"""What GIE's conformance suite deploys, on this machine: its namespace, pools and model-server pods in the
wire-level fake API server; pods as loopback addresses (127.0.0.2, .3, ...) serving HTTP on the pool's target ports;
Pointsman started as `epp serve` with the suite's exact arguments (v1.5's, with the suite's config file, or lwepp's,
with none); and a real Envoy as the gateway, speaking TLS to Pointsman when its ext_proc port serves TLS.

The only values changed from the suite's manifests are port numbers (free ports instead of 9002, 9003 and the
metrics port 9090, which parallel test runs share) and the model servers' addresses."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import ssl
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import grpc
import h2.config
import h2.connection
import h2.events
import orjson
import yaml
from aiohttp import web
from grpc_health.v1 import health_pb2, health_pb2_grpc

from epp.envoy_config import EnvoyConfigSpec, render_yaml
from tests.fleet.k8s.fakeapi import FakeKubeAPI, objective, pod, pool
from tests.support.envoy import Envoy, free_port
from tests.support.wait import until

NS = "inference-conformance-app-backend"
POOLS, CORE, X = "inference.networking.k8s.io", "", "inference.networking.x-k8s.io"
SELECTION = "test-epp-endpoint-selection"
SERVED = "x-conformance-test-served-endpoint"
HEALTH_SERVICE = "inference-extension"  # the suite's liveness and readiness probes
# conformance/resources/base.yaml's ConfigMap `plugins-config`, key conformance-plugins.yaml (v1.1 .. v1.5)
CONFORMANCE_PLUGINS = """\
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: header-based-testing-filter
- type: destination-endpoint-served-verifier
schedulingProfiles:
- name: conformance-profile
  plugins:
  - pluginRef: header-based-testing-filter
"""
# The request body of the suite's routing tests (a completions prompt, on a path the HTTPRoute matches).
PATH = "/primary-gateway-test"
BODY = orjson.dumps({"model": "conformance-fake-model",
                     "prompt": "Answer with no disclaimers: What are the advantages and disadvantages of "
                               "genetically modified food?"})


def v15_args(pool_name: str, grpc_port: int, health_port: int, config_file: Path) -> list[str]:
    """GIE v1.5's conformance EPP Deployment args, verbatim but for the port numbers."""
    return ["--pool-name", pool_name, "--pool-namespace", NS, "--v", "4", "--zap-encoder", "json",
            "--grpc-port", str(grpc_port), "--grpc-health-port", str(health_port),
            "--config-file", str(config_file)]


def lwepp_args(pool_name: str, grpc_port: int, health_port: int) -> list[str]:
    """GIE v1.6's (lwepp) conformance EPP Deployment args, verbatim but for the port numbers."""
    return ["--pool-name", pool_name, "--pool-namespace", NS, "--zap-encoder", "json",
            "--grpc-port", str(grpc_port), "--grpc-health-port", str(health_port)]


# ---- model servers -------------------------------------------------------------------------------------------
def model_server(ip: str, port: int, name: str, waiting: list[int]) -> web.Application:
    """A model server pod's port: answers every POST with who served it and what arrived; /metrics reports
    `waiting[0]` queued requests (vLLM's names)."""

    async def handle(request: web.Request) -> web.Response:
        body = await request.read()
        info = {"pod": name, "endpoint": f"{ip}:{port}", "path": request.path, "body_len": len(body),
                "headers": {k.lower(): v for k, v in request.headers.items()},
                "usage": {"prompt_tokens": 11, "completion_tokens": 4, "total_tokens": 15}}
        return web.json_response(info, dumps=lambda o: orjson.dumps(o).decode())

    async def metrics(_: web.Request) -> web.Response:
        text = ("# TYPE vllm:num_requests_waiting gauge\n"
                f'vllm:num_requests_waiting{{model_name="conformance-fake-model"}} {waiting[0]}\n'
                "# TYPE vllm:num_requests_running gauge\n"
                'vllm:num_requests_running{model_name="conformance-fake-model"} 1\n'
                "# TYPE vllm:kv_cache_usage_perc gauge\n"
                'vllm:kv_cache_usage_perc{model_name="conformance-fake-model"} 0.25\n')
        return web.Response(text=text, content_type="text/plain")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    app.router.add_route("*", "/{tail:.*}", handle)
    return app


class Pods:
    """`n` pods named `<prefix>-<i>` at 127.0.0.(2+i) (`first` moves them up), each serving every target port."""

    def __init__(self, prefix: str, n: int, ports: list[int], first: int = 2) -> None:
        self.names = [f"{prefix}-{i}" for i in range(n)]
        self.ips = [f"127.0.0.{first + i}" for i in range(n)]
        self.ports = ports
        self.waiting = [0]
        self.runners: list[web.AppRunner] = []

    @property
    def endpoints(self) -> list[str]:
        return [f"{ip}:{p}" for ip in self.ips for p in self.ports]

    async def start(self) -> Pods:
        for name, ip in zip(self.names, self.ips, strict=True):
            for port in self.ports:
                runner = web.AppRunner(model_server(ip, port, name, self.waiting), access_log=None)
                await runner.setup()
                await web.TCPSite(runner, ip, port).start()
                self.runners.append(runner)
        return self

    async def stop(self) -> None:
        for r in self.runners:
            await r.cleanup()


def free_ports(n: int, hosts: list[str]) -> list[int]:
    """`n` ports free on every one of `hosts`."""
    out: list[int] = []
    while len(out) < n:
        port = free_port()
        if port in out:
            continue
        try:
            for host in hosts:
                with socket.socket() as s:
                    s.bind((host, port))
        except OSError:
            continue
        out.append(port)
    return out


# ---- the cluster ---------------------------------------------------------------------------------------------
class Cluster:
    """The fake API server with a kubeconfig pointing at it (Pointsman reads $KUBECONFIG, as out of a cluster)."""

    def __init__(self, tmp: Path) -> None:
        self.kube = FakeKubeAPI().start()
        self.kubeconfig = tmp / "kubeconfig"
        self.kubeconfig.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "fake",
            "clusters": [{"name": "fake", "cluster": {"server": self.kube.host}}],
            "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "u", "namespace": NS}}],
            "users": [{"name": "u", "user": {"token": "t"}}],
        }))

    def add_pool(self, name: str, pods: Pods, failure_mode: str | None = None,
                 app_protocol: str | None = None) -> None:
        label = pods.names[0].rsplit("-", 1)[0]
        obj = pool(name, {"app": label}, pods.ports, namespace=NS, epp=f"{name}-epp")
        ref = obj["spec"]["endpointPickerRef"]
        if failure_mode is None:
            ref.pop("failureMode")  # omitted, as the suite's primary pool: the CRD default FailClose
        else:
            ref["failureMode"] = failure_mode
        if app_protocol is not None:
            obj["spec"]["appProtocol"] = app_protocol
        self.kube.apply(POOLS, "inferencepools", obj)
        for name_, ip in zip(pods.names, pods.ips, strict=True):
            self.kube.apply(CORE, "pods", pod(name_, ip, {"app": label}, namespace=NS))

    def add_objective(self, name: str, pool_name: str, priority: int) -> None:
        self.kube.apply(X, "inferenceobjectives", objective(name, pool_name, priority, namespace=NS))

    def stop(self) -> None:
        self.kube.stop()


# ---- the picker ----------------------------------------------------------------------------------------------
class Picker:
    """`epp serve ARGS` as a process, as the suite's Deployment runs it (`env`: the image's environment)."""

    def __init__(self, tmp: Path, args: list[str], cluster: Cluster, env: dict[str, str] | None = None) -> None:
        self.args = args
        self.grpc_port = int(args[args.index("--grpc-port") + 1])
        self.health_port = int(args[args.index("--grpc-health-port") + 1])
        self.metrics_port = free_port()
        self.log = tmp / f"epp-{self.grpc_port}.log"
        base = {k: v for k, v in os.environ.items() if k != "POINTSMAN_CONFORMANCE"}
        self.env = {**base, "KUBECONFIG": str(cluster.kubeconfig), **(env or {})}
        self.proc: subprocess.Popen[bytes] | None = None

    async def start(self) -> Picker:
        epp = Path(sys.executable).with_name("epp")
        # --metrics-port: the suite leaves it at 9090, which parallel runs on this machine share.
        cmd = [str(epp), "serve", *self.args, "--metrics-port", str(self.metrics_port)]
        self.proc = subprocess.Popen(cmd, env=self.env, stdout=self.log.open("wb"), stderr=subprocess.STDOUT,
                                     start_new_session=True)
        await until(self.serving, 30, lambda: f"{HEALTH_SERVICE} SERVING on the health port; log:\n"
                    + self.log.read_text()[-3000:])
        return self

    async def serving(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise AssertionError(f"epp serve exited {self.proc.returncode}:\n{self.log.read_text()[-3000:]}")
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{self.health_port}") as ch:
                resp = await health_pb2_grpc.HealthStub(ch).Check(
                    health_pb2.HealthCheckRequest(service=HEALTH_SERVICE), timeout=1)
        except grpc.aio.AioRpcError:
            return False
        return resp.status == health_pb2.HealthCheckResponse.SERVING

    def speaks_tls(self) -> bool:
        """Whether the ext_proc port completes a TLS handshake (GIE's default: --secure-serving=true)."""
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        ctx.set_alpn_protocols(["h2"])
        try:
            with socket.create_connection(("127.0.0.1", self.grpc_port), timeout=2) as raw, \
                    ctx.wrap_socket(raw) as tls:
                return tls.selected_alpn_protocol() == "h2"
        except (OSError, ssl.SSLError):
            return False

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)


# ---- the gateway ---------------------------------------------------------------------------------------------
def gateway_config(picker: Picker, pool_name: str, *, failure_mode: str = "closed",
                   authority: str | None = None, subset: list[str] | None = None,
                   h2c: bool = False) -> tuple[str, int, int]:
    """Envoy as the suite's gateway for one pool: override-host routing with the pool's endpoints from Pointsman's
    EDS (so Envoy reports the host it served in `x-gateway-destination-endpoint-served`), TLS to the picker when it
    serves TLS (no verification, ALPN h2, as the charts' DestinationRules do), and optionally: Istio's ext_proc
    authority, a subset hint set on every request (`envoy.lb.subset_hint`), h2c to the model servers."""
    lp, ap = free_port(), free_port()
    spec = EnvoyConfigSpec(variant="override-host", eds=True, pool_name=pool_name, listen_port=lp, admin_port=ap,
                           epp_port=picker.grpc_port, epp_tls=picker.speaks_tls(), failure_mode=failure_mode)
    doc = yaml.safe_load(render_yaml(spec))
    hcm = doc["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
    filters = hcm["http_filters"]
    ext = next(f for f in filters if f["name"] == "envoy.filters.http.ext_proc")
    if authority is not None:
        ext["typed_config"]["grpc_service"]["envoy_grpc"]["authority"] = authority
    if subset is not None:
        filters.insert(filters.index(ext), {
            "name": "envoy.filters.http.set_metadata",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.filters.http.set_metadata.v3.Config",
                "metadata": [{"metadata_namespace": "envoy.lb.subset_hint",
                              "value": {"x-gateway-destination-endpoint-subset": subset}}]}})
    if h2c:
        pool_cluster = next(c for c in doc["static_resources"]["clusters"] if c["name"] == "pool")
        pool_cluster["typed_extension_protocol_options"] = {
            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
                "explicit_http_config": {"http2_protocol_options": {}}}}
    return yaml.safe_dump(doc), lp, ap


async def start_gateway(config: str, lp: int, ap: int) -> Envoy:
    envoy = Envoy(config, lp, ap)
    await asyncio.to_thread(envoy.start)
    return envoy


async def post(session: Any, url: str, headers: dict[str, str] | None = None,
               body: bytes = BODY) -> tuple[int, dict[str, str], Any]:
    async with session.post(url, data=body, headers={"content-type": "application/json", **(headers or {})}) as r:
        raw = await r.read()
        try:
            data: Any = orjson.loads(raw)
        except orjson.JSONDecodeError:
            data = raw.decode(errors="replace")
        return r.status, {k.lower(): v for k, v in r.headers.items()}, data


async def raw_grpc_unary(port: int, tls: bool, authority: str, path: str, message: bytes) -> dict[str, str]:
    """One unary gRPC call over a raw HTTP/2 connection with this `:authority` (TLS without verification when
    `tls`); returns the response headers and trailers merged, plus `body` (the response message, hex)."""
    ctx = None
    if tls:
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        ctx.set_alpn_protocols(["h2"])
    reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=ctx)
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding="utf-8"))
    conn.initiate_connection()
    sid = conn.get_next_available_stream_id()
    conn.send_headers(sid, [(":method", "POST"), (":scheme", "https" if tls else "http"), (":path", path),
                            (":authority", authority), ("content-type", "application/grpc"), ("te", "trailers")])
    conn.send_data(sid, struct.pack(">BI", 0, len(message)) + message, end_stream=True)
    writer.write(conn.data_to_send())
    out: dict[str, str] = {}
    body = b""
    try:
        while True:
            chunk = await asyncio.wait_for(reader.read(65536), 5)
            if not chunk:
                break
            done = False
            for ev in conn.receive_data(chunk):
                if isinstance(ev, (h2.events.ResponseReceived, h2.events.TrailersReceived)) and ev.stream_id == sid:
                    out.update(dict(ev.headers))
                elif isinstance(ev, h2.events.DataReceived) and ev.stream_id == sid:
                    conn.acknowledge_received_data(ev.flow_controlled_length, sid)
                    body += ev.data
                elif isinstance(ev, (h2.events.StreamEnded, h2.events.StreamReset)) and ev.stream_id == sid:
                    done = True
            writer.write(conn.data_to_send())
            if done:
                break
    finally:
        writer.close()
    out["body"] = body[5:].hex()
    return out
