"""GIE's conformance suite, as far as it asks anything of the picker: one test per suite test (named after it),
with Pointsman started by the suite's exact arguments (v1.5: `--v 4 --zap-encoder json --config-file
conformance-plugins.yaml`; v1.6 lwepp: no config file, the conformance image's environment) against InferencePools
and pods in the wire-level fake API server, behind a real Envoy as the gateway (tests/conformance/suite.py).

Suite tests that check only the gateway's or the controller's own behaviour (route status, HTTPRoute validation,
weighted pools across gateways) ask nothing of the picker and have no counterpart here."""

from __future__ import annotations

import asyncio
import urllib.error
import urllib.request
from collections import Counter
from pathlib import Path

import aiohttp
import pytest
from grpc_health.v1 import health_pb2
from prometheus_client.parser import text_string_to_metric_families

from epp.api.metric_twins import LLMD_DURATION_BUCKETS, LLMD_OUTPUT_TOKEN_BUCKETS, LLMD_SCHEDULER_BUCKETS
from tests.conformance.suite import (
    CONFORMANCE_PLUGINS,
    HEALTH_SERVICE,
    NS,
    PATH,
    SELECTION,
    SERVED,
    Cluster,
    Picker,
    Pods,
    free_ports,
    gateway_config,
    lwepp_args,
    post,
    raw_grpc_unary,
    start_gateway,
    v15_args,
)
from tests.support.envoy import Envoy, free_port
from tests.support.wait import until

pytestmark = [pytest.mark.envoy, pytest.mark.slow]

PRIMARY = "primary-inference-pool"
ISTIO_AUTHORITY = f"outbound|9002||{PRIMARY}-epp.{NS}.svc.cluster.local"


class Deployment:
    """The suite's objects for one pool: pods, the pool, its picker (`lwepp`: the v1.6 args and the conformance
    image's environment, else the v1.5 args with the suite's config file) and a gateway in front."""

    def __init__(self, tmp: Path, *, pods: int = 3, ports: int = 1, lwepp: bool = False,
                 failure_mode: str | None = None, app_protocol: str | None = None, pool: str = PRIMARY) -> None:
        self.tmp = tmp
        self.pool = pool
        self.cluster = Cluster(tmp)
        ips = [f"127.0.0.{2 + i}" for i in range(pods)]
        self.pods = Pods("primary-inference-model-server", pods, free_ports(ports, ips))
        self.failure_mode = failure_mode
        self.app_protocol = app_protocol
        grpc_port, health_port = free_port(), free_port()
        if lwepp:
            args, env = lwepp_args(pool, grpc_port, health_port), {"POINTSMAN_CONFORMANCE": "true"}
        else:
            config = tmp / "conformance-plugins.yaml"
            config.write_text(CONFORMANCE_PLUGINS)
            args, env = v15_args(pool, grpc_port, health_port, config), None
        self.picker = Picker(tmp, args, self.cluster, env)
        self.envoy: Envoy | None = None
        self.url = ""

    async def start(self, subset: list[int] | None = None, **gateway: object) -> Deployment:
        """`subset`: the gateway sends a subset hint naming these pods (every target port of each)."""
        await self.pods.start()
        self.cluster.add_pool(self.pool, self.pods, self.failure_mode, self.app_protocol)
        await self.picker.start()
        mode = "open" if self.failure_mode == "FailOpen" else "closed"
        routable = self.pods.endpoints
        if subset is not None:
            routable = [f"{self.pods.ips[i]}:{p}" for i in subset for p in self.pods.ports]
            gateway["subset"] = routable
        config, lp, ap = gateway_config(self.picker, self.pool, failure_mode=mode, **gateway)  # type: ignore[arg-type]
        self.envoy = await start_gateway(config, lp, ap)
        self.url = f"http://127.0.0.1:{lp}{PATH}"
        await until(lambda: self.routable(routable), 20, "every endpoint routable through the gateway")
        return self

    async def routable(self, endpoints: list[str]) -> bool:
        async with aiohttp.ClientSession() as s:
            for endpoint in endpoints:
                status, _, info = await post(s, self.url, {SELECTION: endpoint})
                if status != 200 or info.get("endpoint") != endpoint:
                    return False
        return True

    async def stop(self) -> None:
        if self.envoy is not None:
            self.envoy.stop()
        self.picker.stop()
        await self.pods.stop()
        self.cluster.stop()


@pytest.fixture
async def deploy(tmp_path):
    started: list[Deployment] = []

    async def make(subset: list[int] | None = None, gateway: dict[str, object] | None = None,
                   **kw: object) -> Deployment:
        d = Deployment(tmp_path, **kw)  # type: ignore[arg-type]
        started.append(d)
        return await d.start(subset, **(gateway or {}))

    yield make
    for d in started:
        await d.stop()


async def served_by(url: str, header: str, n: int = 30) -> Counter[str]:
    """Where `n` requests carrying `test-epp-endpoint-selection: header` went (10 at a time, as the suite sends)."""
    sem = asyncio.Semaphore(10)

    async def one(s: aiohttp.ClientSession) -> str:
        async with sem:
            status, _, info = await post(s, url, {SELECTION: header})
            assert status == 200, info
            return str(info["pod"])

    async with aiohttp.ClientSession() as s:
        return Counter(await asyncio.gather(*(one(s) for _ in range(n))))


# ---- the suite's Deployment: TLS and probes ---------------------------------------------------------------
@pytest.mark.parametrize("lwepp", [False, True], ids=["v1.5-args", "lwepp-args"])
async def test_ext_proc_port_serves_tls_with_the_suites_args(deploy, lwepp):
    """The suite passes no --secure-serving: GIE's picker then serves TLS (self-signed, ALPN h2) on the ext_proc
    port, and gateways dial it with TLS without verification. The gateway in front (start() routed every endpoint
    through it) spoke TLS to it."""
    d = await deploy(lwepp=lwepp)
    assert d.picker.speaks_tls(), "the ext_proc port does not serve TLS by default"


# ---- GatewayFollowingEPPRouting ------------------------------------------------------------------------------
@pytest.mark.parametrize("lwepp", [False, True], ids=["v1.5-args", "lwepp-args"])
async def test_gateway_following_epp_routing(deploy, lwepp):
    """Requests go only to the pods the picker returned; the picker returns the pods the test header names."""
    d = await deploy(lwepp=lwepp)
    ips, names = d.pods.ips, d.pods.names
    assert set(await served_by(d.url, ips[2])) == {names[2]}
    assert set(await served_by(d.url, f"{ips[0]},{ips[1]}")) <= {names[0], names[1]}
    assert set(await served_by(d.url, ",".join(ips), n=60)) <= set(names)
    # Without the header the picker chooses among all of them; with an address outside the pool, none: 503.
    async with aiohttp.ClientSession() as s:
        status, _, info = await post(s, d.url)
        assert status == 200 and info["pod"] in names
        status, _, _ = await post(s, d.url, {SELECTION: "10.255.0.1"})
        assert status == 503


async def test_selection_header_is_ignored_without_the_conformance_config(tmp_path):
    """Outside conformance (no conformance plugins, no conformance image) a client never chooses its endpoint:
    the header is ignored and the response does not echo the endpoint."""
    cluster = Cluster(tmp_path)
    pods = Pods("primary-inference-model-server", 3, free_ports(1, ["127.0.0.2", "127.0.0.3", "127.0.0.4"]))
    await pods.start()
    cluster.add_pool(PRIMARY, pods)
    picker = Picker(tmp_path, lwepp_args(PRIMARY, free_port(), free_port()), cluster)
    envoy = None
    try:
        await picker.start()
        envoy = await start_gateway(*gateway_config(picker, PRIMARY))
        url = f"http://127.0.0.1:{envoy.listen_port}{PATH}"
        async with aiohttp.ClientSession() as s:
            await until(lambda: _ok(s, url), 20, "the gateway routes")
            seen = set()
            for _ in range(30):
                status, headers, info = await post(s, url, {SELECTION: pods.ips[0]})
                assert status == 200 and SERVED not in headers
                seen.add(info["pod"])
            assert seen - {pods.names[0]}, "the header chose the endpoint"
    finally:
        if envoy is not None:
            envoy.stop()
        picker.stop()
        await pods.stop()
        cluster.stop()


async def _ok(s: aiohttp.ClientSession, url: str) -> bool:
    status, _, _ = await post(s, url)
    return status == 200


# ---- GatewayFollowingEPPRoutingWithDataParallelism --------------------------------------------------------------
async def test_gateway_following_epp_routing_dp(deploy):
    """A pool with three target ports (data-parallel ranks): every rank of every pod is an endpoint, and
    `ip:port` in the header picks one rank."""
    d = await deploy(ports=3)  # all 9 endpoints routed in start()
    ip, ports = d.pods.ips[1], d.pods.ports
    async with aiohttp.ClientSession() as s:
        for port in ports:
            for _ in range(3):
                status, _, info = await post(s, d.url, {SELECTION: f"{ip}:{port}"})
                assert status == 200 and info["endpoint"] == f"{ip}:{port}"
        # An address alone takes any of its ranks.
        ranks = set()
        for _ in range(30):
            status, _, info = await post(s, d.url, {SELECTION: ip})
            assert status == 200 and info["endpoint"].startswith(f"{ip}:")
            ranks.add(info["endpoint"])
        assert len(ranks) > 1


# ---- GatewayDestinationEndpointServed ----------------------------------------------------------------------------
@pytest.mark.parametrize("lwepp", [False, True], ids=["v1.5-args", "lwepp-args"])
async def test_gateway_destination_endpoint_served(deploy, lwepp):
    """The gateway reports the endpoint it served (x-gateway-destination-endpoint-served response metadata) and
    the picker returns it as x-conformance-test-served-endpoint."""
    d = await deploy(lwepp=lwepp)
    async with aiohttp.ClientSession() as s:
        for endpoint in d.pods.endpoints:
            status, headers, info = await post(s, d.url, {SELECTION: endpoint})
            assert status == 200 and info["endpoint"] == endpoint
            assert headers[SERVED] == endpoint


# ---- subset hints (GIE protocol: envoy.lb.subset_hint) --------------------------------------------------------
async def test_subset_hint_restricts_the_candidates(deploy):
    """The gateway's subset hint (`x-gateway-destination-endpoint-subset` in `envoy.lb.subset_hint`) limits the
    picker to those endpoints; the test header then picks within the subset only."""
    d = await deploy(subset=[0, 2])
    inside = {d.pods.names[0], d.pods.names[2]}
    seen = set()
    async with aiohttp.ClientSession() as s:
        for _ in range(30):
            status, _, info = await post(s, d.url)
            assert status == 200, info
            seen.add(info["pod"])
        assert seen <= inside and len(seen) == 2
        status, _, _ = await post(s, d.url, {SELECTION: d.pods.ips[1]})
        assert status == 503, "an endpoint outside the subset is never picked"


async def test_subset_hint_without_pool_endpoints_is_503(deploy):
    """A subset hint that names no endpoint of the pool: 503 (GIE: the subset is empty, nothing to pick)."""
    d = await deploy(subset=[])
    async with aiohttp.ClientSession() as s:
        for _ in range(3):
            status, _, body = await post(s, d.url)
            assert status == 503, body


# ---- InferencePoolBackendServiceNoEndpoints / no matching pods -------------------------------------------------
async def test_inferencepool_no_endpoints_is_503(deploy):
    """The pool's pods go away: the picker has no endpoint and the gateway answers 503, never hangs."""
    d = await deploy(pods=2)
    for name in d.pods.names:
        d.cluster.kube.delete("", "pods", name, namespace=NS)

    async def unavailable() -> bool:
        async with aiohttp.ClientSession() as s:
            status, _, _ = await post(s, d.url)
            return status == 503

    await until(unavailable, 15, "503 once the pool has no pods")


# ---- EppUnAvailableFailOpen (and the FailClose default) --------------------------------------------------------
async def test_epp_unavailable_fail_open(deploy):
    """A FailOpen pool (Pointsman's gateway config `--failure-mode open`): with the picker gone the gateway keeps
    serving from the pool's endpoints."""
    d = await deploy(failure_mode="FailOpen")
    d.picker.stop()

    async def served() -> bool:
        async with aiohttp.ClientSession() as s:
            results = [await post(s, d.url) for _ in range(5)]
        return all(status == 200 and info["pod"] in d.pods.names for status, _, info in results)

    await until(served, 20, "200s from the pool with the picker down")


async def test_epp_unavailable_fail_close(deploy):
    """The CRD default FailClose (the suite's primary pool omits failureMode): with the picker gone, requests fail
    instead of reaching a model server the picker did not choose."""
    d = await deploy()
    d.picker.stop()

    async def refused() -> bool:
        async with aiohttp.ClientSession() as s:
            results = [await post(s, d.url) for _ in range(3)]
        return all(status >= 500 for status, _, _ in results)

    await until(refused, 20, "5xx with the picker down")


# ---- 429: sheddable requests under saturation ---------------------------------------------------------------
async def test_sheddable_request_is_429_when_the_pool_is_saturated(deploy):
    """A sheddable request (an InferenceObjective with a negative priority) is refused with 429 while every pod
    reports a queue past the saturation threshold; a request of the default priority still goes through."""
    d = await deploy()
    d.cluster.add_objective("sheddable", PRIMARY, -1)
    objective = {"x-gateway-inference-objective": "sheddable"}
    async with aiohttp.ClientSession() as s:
        status, _, _ = await post(s, d.url, objective)
        assert status == 200, "not saturated yet"
        d.pods.waiting[0] = 50  # every pod's queue, as its next scrape reports it

        async def shed() -> bool:
            status, _, _ = await post(s, d.url, objective)
            return status == 429

        await until(shed, 15, "429 for a sheddable request once saturated")
        status, _, info = await post(s, d.url)
        assert status == 200, info


# ---- InferencePoolAppProtocol: h2c -------------------------------------------------------------------------
H2C_BACKEND = """
static_resources:
  listeners:
{listeners}
admin:
  address: {{socket_address: {{address: 127.0.0.1, port_value: {admin}}}}}
"""
H2C_LISTENER = """
  - name: pod-{i}
    address: {{socket_address: {{address: {ip}, port_value: {port}}}}}
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: pod{i}
          codec_type: AUTO
          route_config:
            virtual_hosts:
            - name: all
              domains: ["*"]
              routes:
              - match: {{path: /metrics}}
                direct_response: {{status: 200, body: {{inline_string: "vllm:num_requests_waiting 0\\n"}}}}
              - match: {{prefix: /}}
                direct_response: {{status: 200, body: {{inline_string: "{{}}"}}}}
                response_headers_to_add:
                - header: {{key: x-endpoint, value: "%DOWNSTREAM_LOCAL_ADDRESS%"}}
                - header: {{key: x-protocol, value: "%PROTOCOL%"}}
          http_filters:
          - name: envoy.filters.http.router
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
"""


async def test_inferencepool_appprotocol_h2c(tmp_path):
    """A pool with appProtocol kubernetes.io/h2c: the gateway speaks h2c to the model servers (HTTP/2 without TLS)
    and still sends each request where the picker said."""
    cluster = Cluster(tmp_path)
    ips = ["127.0.0.2", "127.0.0.3"]
    port = free_ports(1, ips)[0]
    pods = Pods("primary-inference-model-server", 2, [port])  # names and addresses; Envoy serves them
    listeners = "".join(H2C_LISTENER.format(i=i, ip=ip, port=port) for i, ip in enumerate(ips))
    backend_admin = free_port()
    # Its listeners are on 127.0.0.2/3: Envoy.start waits on the admin port (on 127.0.0.1) only.
    backend = Envoy(H2C_BACKEND.format(listeners=listeners, admin=backend_admin), backend_admin, backend_admin)
    config = tmp_path / "conformance-plugins.yaml"
    config.write_text(CONFORMANCE_PLUGINS)
    picker = Picker(tmp_path, v15_args(PRIMARY, free_port(), free_port(), config), cluster)
    gateway = None
    try:
        await asyncio.to_thread(backend.start)
        cluster.add_pool(PRIMARY, pods, app_protocol="kubernetes.io/h2c")
        await picker.start()
        gateway = await start_gateway(*gateway_config(picker, PRIMARY, h2c=True))
        url = f"http://127.0.0.1:{gateway.listen_port}{PATH}"

        async def routed(endpoint: str) -> bool:
            async with aiohttp.ClientSession() as s, s.post(url, data=b"{}", headers={SELECTION: endpoint}) as r:
                return r.status == 200 and r.headers.get("x-endpoint") == endpoint \
                    and r.headers.get("x-protocol") == "HTTP/2"

        for ip in ips:
            await until(lambda ip=ip: routed(f"{ip}:{port}"), 20, f"{ip} served over h2c")
    finally:
        if gateway is not None:
            gateway.stop()
        picker.stop()
        backend.stop()
        cluster.stop()


# ---- Istio's ext_proc authority ----------------------------------------------------------------------------
async def test_istio_ext_proc_authority_is_served(deploy):
    """Istio dials the picker with `:authority outbound|9002||<service FQDN>`: the ext_proc port serves it, from a
    raw HTTP/2 client and from Envoy with that authority on its ext_proc stream."""
    d = await deploy(gateway={"authority": ISTIO_AUTHORITY})  # start() routed every endpoint through it
    tls = d.picker.speaks_tls()
    got = await raw_grpc_unary(d.picker.grpc_port, tls, ISTIO_AUTHORITY, "/grpc.health.v1.Health/Check",
                               health_pb2.HealthCheckRequest(service=HEALTH_SERVICE).SerializeToString())
    assert got.get(":status") == "200" and got.get("grpc-status") == "0", got
    assert health_pb2.HealthCheckResponse.FromString(bytes.fromhex(got["body"])).status == \
        health_pb2.HealthCheckResponse.SERVING


# ---- metrics: GIE's names and llm-d's twins ------------------------------------------------------------------
SCRAPER_TOKEN = "prometheus-token"  # a ServiceAccount token of the scraper (TokenReview + SubjectAccessReview)


def scrape(port: int, token: str = SCRAPER_TOKEN) -> dict[str, list]:
    req = urllib.request.Request(f"http://127.0.0.1:{port}/metrics", headers={"authorization": f"Bearer {token}"})
    text = urllib.request.urlopen(req, timeout=5).read().decode()
    return {f.name: f.samples for f in text_string_to_metric_families(text)}


def total(samples: list, suffix: str, **labels: str) -> float:
    return sum(s.value for s in samples if s.name.endswith(suffix)
               and all(s.labels.get(k) == v for k, v in labels.items()))


def bounds(samples: list, **labels: str) -> list[float]:
    return sorted({float(s.labels["le"]) for s in samples if s.name.endswith("_bucket")
                   and all(s.labels.get(k) == v for k, v in labels.items())})


async def test_metrics_gie_names_and_llm_d_twins(deploy):
    """After real requests through the gateway, /metrics has GIE's families and llm-d-router's llm_d_epp_* twins,
    with their own labels and buckets, and the same counts."""
    d = await deploy()
    # The suite's args leave --metrics-endpoint-auth at GIE's default (on): a scraper needs a token the API server
    # knows and a grant for GET /metrics.
    user = "system:serviceaccount:monitoring:prometheus"
    d.cluster.kube.tokens[SCRAPER_TOKEN] = {"username": user, "uid": "1", "groups": []}
    d.cluster.kube.grants.add((user, "get", "/metrics"))
    port = d.picker.metrics_port
    with pytest.raises(urllib.error.HTTPError) as refused:
        scrape(port, token="not-a-token")
    assert refused.value.code in (401, 403)
    before = scrape(port)
    n_default, n_tenant = 7, 5
    async with aiohttp.ClientSession() as s:
        for i in range(n_default + n_tenant):
            headers = {SELECTION: d.pods.ips[i % 3]}
            if i >= n_default:
                headers["x-llm-d-inference-fairness-id"] = "tenant-a"
            status, _, info = await post(s, d.url, headers)
            assert status == 200, info
    await until(lambda: total(scrape(port).get("llm_d_epp_request_running", []), "") == 0, 10,
                "every request finished")
    after = scrape(port)

    def grew(family: str, suffix: str, **labels: str) -> float:
        return total(after.get(family, []), suffix, **labels) - total(before.get(family, []), suffix, **labels)

    n = n_default + n_tenant
    assert grew("inference_objective_request", "_total") == n
    assert grew("llm_d_epp_request", "_total") == n
    assert grew("llm_d_epp_request", "_total", fairness_id="default-flow") == n_default
    assert grew("llm_d_epp_request", "_total", fairness_id="tenant-a") == n_tenant
    gie_labels = {k for s in after["inference_objective_request"] for k in s.labels}
    twin_labels = {k for s in after["llm_d_epp_request"] for k in s.labels}
    assert gie_labels == {"model_name", "target_model_name", "priority"}
    assert twin_labels == {"model_name", "target_model_name", "fairness_id", "priority"}
    for gie, twin in (("inference_objective_request_duration_seconds", "llm_d_epp_request_duration_seconds"),
                      ("inference_objective_input_tokens", "llm_d_epp_request_input_tokens"),
                      ("inference_objective_output_tokens", "llm_d_epp_request_output_tokens"),
                      ("inference_objective_request_sizes", "llm_d_epp_request_size_bytes"),
                      ("inference_objective_response_sizes", "llm_d_epp_response_size_bytes")):
        assert grew(gie, "_count") == grew(twin, "_count") == n, (gie, twin)
        assert grew(gie, "_sum") == pytest.approx(grew(twin, "_sum")), (gie, twin)
    inf = float("inf")
    assert bounds(after["llm_d_epp_request_duration_seconds"]) == [*LLMD_DURATION_BUCKETS, inf]
    assert bounds(after["llm_d_epp_request_output_tokens"]) == [*LLMD_OUTPUT_TOKEN_BUCKETS, inf]
    assert bounds(after["llm_d_epp_scheduler_e2e_duration_seconds"]) == [*LLMD_SCHEDULER_BUCKETS, inf]
    assert grew("llm_d_epp_scheduler_e2e_duration_seconds", "_count") == \
        grew("inference_extension_scheduler_e2e_duration_seconds", "_count") >= n
    # Scheduling attempts: the picked pod by name (GIE: pod_name, llm-d: endpoint_name), namespace and port.
    for i, name in enumerate(d.pods.names):
        picked = sum(1 for j in range(n) if j % 3 == i)
        assert grew("llm_d_epp_scheduler_attempts", "_total", status="success", endpoint_name=name,
                    namespace=NS, port=str(d.pods.ports[0])) >= picked
        assert grew("inference_extension_scheduler_attempts", "_total", status="success", pod_name=name) == \
            grew("llm_d_epp_scheduler_attempts", "_total", status="success", endpoint_name=name)
    # The pool gauges, both names, from the same pass.
    ready = {s.labels["name"]: s.value for s in after["llm_d_epp_ready_endpoints"]}
    assert ready == {s.labels["name"]: s.value for s in after["inference_pool_ready_pods"]} == {PRIMARY: 3.0}
    assert {s.labels["model_server_endpoint"] for s in after["llm_d_epp_per_endpoint_queue_size"]} == \
        {s.labels["model_server_pod"] for s in after["inference_pool_per_pod_queue_size"]} == set(d.pods.names)
    assert {s.labels["name"] for s in after["llm_d_epp_average_kv_cache_utilization"]} == {PRIMARY}
