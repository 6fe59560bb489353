"""The EPP container args real deployers render, exactly (each list item is one argument as the kubelet passes it:
YAML quotes gone, quotes inside a plain scalar kept): GIE's v1.5 conformance Deployments and v1.6 lwepp ones, GIE
v1.5's inferencepool/standalone charts, llm-d-router v0.10's gateway/standalone charts and dev manifests, KServe's
LLMInferenceService scheduler config and user examples, llm-d-deployer's presets, and llm-d v0.4-era values for the
GIE chart. Release `rel`, namespace `ns1`, pool selector `app=m` where a chart is rendered.

Paths a Deployment mounts (`/config/...`, certificate directories) and `${...}` placeholders are what the deployer
writes; a test that starts Pointsman maps them onto files it made (MOUNTS).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from epp.h2grpc.tls import CERT_FILE, KEY_FILE, self_signed_cert
from tests.fleet.k8s.fakeapi import pod, pool

if TYPE_CHECKING:
    from epp.cmd.settings import ServeSettings
    from tests.fleet.k8s.fakeapi import FakeKubeAPI

POOL = ["--pool-name", "rel", "--pool-namespace", "ns1", "--pool-group", "inference.networking.k8s.io"]
GIE_TAIL = ["--zap-encoder", "json", "--config-file", "/config/default-plugins.yaml"]

SGLANG = ['--total-queued-requests-metric="sglang:num_queue_reqs"',
          '--total-running-requests-metric="sglang:num_running_reqs"',
          '--kv-cache-usage-percentage-metric="sglang:token_usage"',
          '--cache-info-metric="sglang:cache_config_info"']
TRITON = ["--total-queued-requests-metric", "nv_trt_llm_request_metrics{request_type=waiting}",
          "--total-running-requests-metric", "nv_trt_llm_request_metrics{request_type=scheduled}",
          "--kv-cache-usage-percentage-metric", "nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type=fraction}",
          "--lora-info-metric", ""]
TRTLLM_SERVE = ['--total-queued-requests-metric="trtllm_num_requests_waiting"',
                '--total-running-requests-metric="trtllm_num_requests_running"',
                '--kv-cache-usage-percentage-metric="trtllm_kv_cache_utilization"',
                '--cache-info-metric="trtllm_cache_config_info"',
                '--model-server-metrics-path="/prometheus/metrics"',
                "--lora-info-metric", ""]

# name -> (args, the gRPC health service names its probes ask on the health port)
DEPLOYERS: dict[str, tuple[list[str], tuple[str, ...]]] = {
    # GIE conformance (conformance/resources/base.yaml)
    "gie-v1.5-conformance": ([
        "--pool-name", "primary-inference-pool", "--pool-namespace", "inference-conformance-app-backend",
        "--v", "4", "--zap-encoder", "json", "--grpc-port", "9002", "--grpc-health-port", "9003",
        "--config-file", "/config/conformance-plugins.yaml"], ("inference-extension",)),
    "gie-v1.6-lwepp-conformance": ([
        "--pool-name", "primary-inference-pool", "--pool-namespace", "inference-conformance-app-backend",
        "--zap-encoder", "json", "--grpc-port", "9002", "--grpc-health-port", "9003"], ("inference-extension",)),
    # GIE v1.5 inferencepool chart (config/charts/epplib/templates/_deployment.yaml)
    "gie-v1.5-chart-defaults": ([*POOL, *GIE_TAIL, "--v", "1", "--tracing=false"], ("inference-extension",)),
    "gie-v1.5-chart-replicas-3": ([*POOL, *GIE_TAIL, "--ha-enable-leader-election", "--v", "1", "--tracing=false"],
                                  ("liveness", "readiness")),
    "gie-v1.5-chart-sglang": ([*POOL, *SGLANG, *GIE_TAIL, "--v", "1", "--tracing=false"], ("inference-extension",)),
    "gie-v1.5-chart-triton-tensorrt-llm": ([*POOL, *TRITON, *GIE_TAIL, "--v", "1", "--tracing=false"],
                                           ("inference-extension",)),
    "gie-v1.5-chart-trtllm-serve": ([*POOL, *TRTLLM_SERVE, *GIE_TAIL, "--v", "1", "--tracing=false"],
                                    ("inference-extension",)),
    "gie-v1.5-chart-flags-map": ([*POOL, *GIE_TAIL, "--enable-pprof", "false", "--refresh-metrics-interval", "100ms",
                                  "--v", "1", "--tracing=false"], ("inference-extension",)),
    "gie-v1.5-chart-monitoring-no-auth-tracing": ([*POOL, *GIE_TAIL, "--v", "1", "--tracing=true",
                                                   "--metrics-endpoint-auth=false"], ("inference-extension",)),
    "gie-v1.5-standalone-chart": (["--endpoint-selector", "app=m", "--endpoint-target-ports", "8000", *GIE_TAIL,
                                   "--tracing=false"], ("inference-extension",)),
    "llm-d-v0.4-values-on-gie-chart": ([*POOL, *GIE_TAIL, "--kv-cache-usage-percentage-metric",
                                        "vllm:kv_cache_usage_perc", "--v", "4"], ("inference-extension",)),
    # llm-d-router v0.10 charts (config/charts/routerlib/templates/_deployment.yaml)
    "llm-d-v0.10-gateway-defaults": ([*POOL, *GIE_TAIL, "--grpc-health-port", "9003", "--tracing=false"],
                                     ("inference-extension",)),
    "llm-d-v0.10-gateway-replicas-2": ([*POOL, *GIE_TAIL, "--ha-enable-leader-election", "--grpc-health-port", "9003",
                                        "--ha-enable-leader-election=false", "--v=2", "--tracing=false"],
                                       ("liveness", "readiness")),
    "llm-d-v0.10-gateway-gke-health-9010": ([*POOL, *GIE_TAIL, "--grpc-health-port", "9010", "--tracing=false"],
                                            ("inference-extension",)),
    "llm-d-v0.10-standalone-defaults": ([*POOL, *GIE_TAIL, "--grpc-health-port", "9003", "--tracing=false"],
                                        ("inference-extension",)),
    "llm-d-v0.10-standalone-no-pool": (["--endpoint-selector", "app=m,tier=x", "--endpoint-target-ports", "8000",
                                        *GIE_TAIL, "--grpc-health-port", "9003", "--tracing=false"],
                                       ("inference-extension",)),
    "llm-d-v0.10-standalone-agentgateway": (["--endpoint-selector", "app=m", "--endpoint-target-ports", "8000",
                                             *GIE_TAIL, "--grpc-health-port", "9003", "--secure-serving=false",
                                             "--tracing=false"], ("inference-extension",)),
    "llm-d-v0.10-dev-manifest": ([
        "--pool-name", "${POOL_NAME}", "--pool-namespace", "${NAMESPACE}", "--v", "4", "--zap-encoder", "json",
        "--grpc-port", "9002", "--grpc-health-port", "9003", "--config-file", "/etc/epp/epp-config.yaml",
        "--allow-experimental-plugins=true", "--metrics-endpoint-auth=${METRICS_ENDPOINT_AUTH}",
        "--ha-enable-leader-election=${ENABLE_LEADER_ELECTION}"], ("envoy.service.ext_proc.v3.ExternalProcessor",)),
    # KServe (config/llmisvc/config-llm-scheduler.yaml: camelCase) and its users' kebab-case examples
    "kserve-config-llm-scheduler": ([
        "--poolName", "rel", "--poolNamespace", "ns1", "--zap-encoder", "json", "--grpcPort", "9002",
        "--grpcHealthPort", "9003", "--secureServing", "--modelServerMetricsScheme", "https",
        "--modelServerMetricsHttpsInsecureSkipVerify", "--certPath", "/etc/ssl/certs"],
        ("envoy.service.ext_proc.v3.ExternalProcessor",)),
    "kserve-user-example": ([
        "--pool-group", "inference.networking.x-k8s.io", "--pool-name", "rel", "--pool-namespace", "ns1",
        "--zap-encoder", "json", "--grpc-port", "9002", "--grpc-health-port", "9003", "--secure-serving",
        "--model-server-metrics-scheme", "https", "--model-server-metrics-https-insecure-skip-verify",
        "--cert-path", "/var/run/kserve/tls", "--config-text", "${CONFIG_TEXT}"],
        ("envoy.service.ext_proc.v3.ExternalProcessor",)),
    # llm-d-deployer (deprecated) presets
    "llm-d-deployer-preset": ([
        "--poolName", "rel", "--poolNamespace", "ns1", "-v", "4", "--zap-encoder", "json", "--grpcPort", "9002",
        "--grpcHealthPort", "9003"], ("envoy.service.ext_proc.v3.ExternalProcessor",)),
}

# What the dev manifest's envsubst fills in.
ENVSUBST = {"${POOL_NAME}": "rel", "${NAMESPACE}": "ns1", "${METRICS_ENDPOINT_AUTH}": "false",
            "${ENABLE_LEADER_ELECTION}": "true"}
# Mounted paths: config files and certificate directories.
CONFIG_PATHS = ("/config/conformance-plugins.yaml", "/config/default-plugins.yaml", "/etc/epp/epp-config.yaml")
CERT_DIRS = ("/etc/ssl/certs", "/var/run/kserve/tls")


def mounted(args: list[str], mounts: dict[str, str]) -> list[str]:
    """`args` with placeholders filled and mounted paths replaced (whole arguments or `--flag=value` values)."""
    subst = {**ENVSUBST, **mounts}
    out = []
    for a in args:
        for k, v in subst.items():
            a = a.replace(k, v) if k.startswith("$") or a == k or a.endswith("=" + k) else a
        out.append(a)
    return out


CONFIG = ("apiVersion: inference.networking.x-k8s.io/v1alpha1\nkind: EndpointPickerConfig\n"
          "plugins:\n- type: queue-scorer\n")


def mounts(tmp: Path) -> dict[str, str]:
    """The deployers' mounted paths, as files of the caller's: a config Pointsman loads, a TLS Secret's directory."""
    cfg = tmp / "plugins.yaml"
    cfg.write_text(CONFIG)
    certs = tmp / "tls"
    certs.mkdir(exist_ok=True)
    key, crt = self_signed_cert()
    (certs / KEY_FILE).write_bytes(key)
    (certs / CERT_FILE).write_bytes(crt)
    return {**{p: str(cfg) for p in CONFIG_PATHS}, **{d: str(certs) for d in CERT_DIRS}, "${CONFIG_TEXT}": CONFIG}


def fill(api: FakeKubeAPI, settings: ServeSettings) -> None:
    """The objects the deployment expects: its InferencePool (or, without one, pods its selector matches)."""
    s = settings.sources
    ns = s.pool_namespace
    if s.kind == "pool":
        if s.pool_group == "inference.networking.x-k8s.io":
            api.apply(s.pool_group, "inferencepools", {"metadata": {"name": s.pool_name, "namespace": ns},
                                                       "spec": {"selector": {"app": "m"}, "targetPortNumber": 8000}})
        else:
            api.apply(s.pool_group, "inferencepools", pool(s.pool_name or "", {"app": "m"}, [8000], namespace=ns))
    api.apply("", "pods", pod("m-0", "127.0.0.1", {"app": "m", "tier": "x"}, namespace=ns))
