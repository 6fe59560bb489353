"""Render deploy/ with `kubectl kustomize` and check it against the code: RBAC covers exactly what the watchers
read, the Deployment's flags are ones the CLI accepts, probes ask for services the health server answers."""

import argparse
import random
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from epp.api.health import LIVENESS_SERVICES, READINESS_SERVICES
from epp.cmd.cli import build_parser
from epp.cmd.foreign import FOREIGN_FLAGS, NATIVE
from epp.fleet.k8s import GIE_FLAGS, WATCH_VERBS, WATCHED_RESOURCES
from scheduling.config import load_scheduler

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
KUBECTL = shutil.which("kubectl") or "/usr/bin/kubectl"

pytestmark = pytest.mark.skipif(not Path(KUBECTL).exists(), reason="kubectl not installed")


def render(path: Path) -> list[dict]:
    out = subprocess.run([KUBECTL, "kustomize", str(path)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


@pytest.fixture(scope="module")
def docs() -> list[dict]:
    return render(DEPLOY)


def one(docs, kind, name=None):
    found = [d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


def epp_service(docs):
    return one(docs, "Service", "pointsman-epp")


def container(docs):
    return one(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]


def granted(docs) -> set[tuple[str, str, str]]:
    """(group, resource, verb) granted to the Deployment's service account through its (Cluster)RoleBindings."""
    sa = one(docs, "Deployment")["spec"]["template"]["spec"]["serviceAccountName"]
    one(docs, "ServiceAccount", sa)
    roles = {(d["kind"], d["metadata"]["name"]): d for d in docs if d["kind"] in ("Role", "ClusterRole")}
    out = set()
    for b in (d for d in docs if d["kind"] in ("RoleBinding", "ClusterRoleBinding")):
        if not any(s["kind"] == "ServiceAccount" and s["name"] == sa for s in b.get("subjects", [])):
            continue
        role = roles[(b["roleRef"]["kind"], b["roleRef"]["name"])]
        for rule in role.get("rules", []):
            for g in rule.get("apiGroups", []):
                for r in rule.get("resources", []):
                    for v in rule.get("verbs", []):
                        out.add((g, r, v))
    return out


def test_rbac_covers_every_watched_resource_and_nothing_more(docs):
    have = granted(docs)
    need = {(r.group, r.plural, v) for r in WATCHED_RESOURCES for v in WATCH_VERBS}
    missing = need - have
    assert not missing, f"the code watches resources the RBAC does not grant: {sorted(missing)}"
    extra = have - need
    assert not extra, f"RBAC grants more than the watchers need (least privilege): {sorted(extra)}"
    assert not any(d["kind"] in ("ClusterRole", "ClusterRoleBinding") for d in docs), "namespaced Role is enough"


def test_deployment_flags_are_gie_flags_and_the_cli_accepts_them(docs):
    c = container(docs)
    args = c["args"]
    flags = [a.split("=", 1)[0] for a in args if a.startswith("--")]
    assert flags and set(flags) <= set(GIE_FLAGS), set(flags) - set(GIE_FLAGS)
    assert {"--pool-name", "--pool-namespace", "--config-file", "--grpc-port", "--grpc-health-port",
            "--metrics-port"} <= set(flags)
    argv = [*c["command"][1:], *[a.replace("$(POD_NAMESPACE)", "default") for a in args]]
    ns = build_parser().parse_args(argv)  # SystemExit here means the CLI rejects a Deployment flag
    assert ns.pool_name == one(docs, "InferencePool")["metadata"]["name"]
    assert (ns.grpc_port, ns.grpc_health_port, ns.metrics_port) == (9002, 9003, 9090)


def test_every_gie_flag_is_accepted_by_the_cli():
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    serve = sub.choices["serve"]
    missing = [f for f in GIE_FLAGS if f not in serve._option_string_actions]
    assert not missing, f"`epp serve` does not accept GIE flags: {missing}"
    # ... and they are GIE's flags as the foreign-flag table says, with the same meaning.
    native = {f"--{f.name}" for f in FOREIGN_FLAGS if f.how == NATIVE}
    assert set(GIE_FLAGS) <= native, set(GIE_FLAGS) - native


def test_probes_ports_and_service(docs):
    c = container(docs)
    args = dict(a.split("=", 1) for a in c["args"] if "=" in a)
    health_port = int(args["--grpc-health-port"])
    assert c["livenessProbe"]["grpc"] == {"port": health_port, "service": "liveness"}
    assert c["readinessProbe"]["grpc"] == {"port": health_port, "service": "readiness"}
    assert "liveness" in LIVENESS_SERVICES and "readiness" in READINESS_SERVICES
    ports = {p["containerPort"] for p in c["ports"]}
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert ports == {int(args["--grpc-port"]), health_port, int(args["--metrics-port"]),
                     int(env["POINTSMAN_BUS_PORT"])}
    svc = epp_service(docs)
    by_port = {p["port"]: p for p in svc["spec"]["ports"]}
    assert by_port[9002]["appProtocol"] in ("http2", "kubernetes.io/h2c")
    assert 9090 in by_port
    tpl_labels = one(docs, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert all(tpl_labels.get(k) == v for k, v in svc["spec"]["selector"].items())
    assert c["image"].startswith("pointsman:")


def test_inference_pool_points_at_the_service(docs):
    pool = one(docs, "InferencePool")
    assert pool["apiVersion"] == "inference.networking.k8s.io/v1"
    ref = pool["spec"]["endpointPickerRef"]
    svc = epp_service(docs)
    assert ref["name"] == svc["metadata"]["name"]
    assert ref["port"]["number"] in {p["port"] for p in svc["spec"]["ports"]}
    assert 1 <= len(pool["spec"]["targetPorts"]) <= 8 and pool["spec"]["selector"]["matchLabels"]


def test_configmap_is_mounted_where_the_flag_points_and_is_a_valid_config(docs):
    c = container(docs)
    cfg_path = dict(a.split("=", 1) for a in c["args"] if "=" in a)["--config-file"]
    mount = next(m for m in c["volumeMounts"] if cfg_path.startswith(m["mountPath"].rstrip("/") + "/"))
    vol = next(v for v in one(docs, "Deployment")["spec"]["template"]["spec"]["volumes"] if v["name"] == mount["name"])
    cm = one(docs, "ConfigMap", vol["configMap"]["name"])
    text = cm["data"][Path(cfg_path).name]
    load_scheduler(list(yaml.safe_load_all(text)), rng=random.Random(0))


@pytest.mark.parametrize("gw", ["envoy-gateway", "envoy-ai-gateway", "agentgateway", "istio"])
def test_gateway_examples_route_to_the_pool(docs, gw):
    pool = one(docs, "InferencePool")["metadata"]["name"]
    gdocs = render(DEPLOY / "gateways" / gw)
    routes = [d for d in gdocs if d["kind"] in ("HTTPRoute", "AIGatewayRoute")]
    assert routes
    refs = [b for r in routes for rule in r["spec"]["rules"] for b in rule["backendRefs"]]
    assert refs and all(
        b["group"] == "inference.networking.k8s.io" and b["kind"] == "InferencePool" and b["name"] == pool for b in refs
    )
    gateways = {d["metadata"]["name"] for d in gdocs if d["kind"] == "Gateway"}
    assert all(p["name"] in gateways for r in routes for p in r["spec"]["parentRefs"])


# ---- active-active: two replicas, a PodDisruptionBudget, the replica bus's headless Service ------------------------
def test_two_replicas_with_a_disruption_budget_that_keeps_one(docs):
    dep = one(docs, "Deployment")
    replicas = dep["spec"]["replicas"]
    assert replicas >= 2
    pdb = one(docs, "PodDisruptionBudget")
    labels = dep["spec"]["template"]["metadata"]["labels"]
    assert all(labels.get(k) == v for k, v in pdb["spec"]["selector"]["matchLabels"].items())
    assert 1 <= pdb["spec"]["minAvailable"] < replicas  # a drain can proceed, and one replica always routes


def test_the_bus_finds_peers_through_a_headless_service_the_cli_reads(docs, monkeypatch):
    c = container(docs)
    env = {e["name"]: e for e in c["env"]}
    svc_name = env["POINTSMAN_BUS_SERVICE"]["value"]
    bus_port = int(env["POINTSMAN_BUS_PORT"]["value"])
    svc = one(docs, "Service", svc_name)
    assert svc["spec"]["clusterIP"] == "None" and svc["spec"]["publishNotReadyAddresses"] is True
    tpl_labels = one(docs, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert all(tpl_labels.get(k) == v for k, v in svc["spec"]["selector"].items())
    assert [p["targetPort"] for p in svc["spec"]["ports"]] == [bus_port]
    assert env["POD_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
    secret = env["POINTSMAN_BUS_SECRET"]["valueFrom"]["secretKeyRef"]
    assert secret["optional"] is True  # the secret is the operator's to create, never shipped in the repo
    # the environment the Deployment sets is what the CLI reads
    from epp.cmd.settings import ServeSettings

    for name in ("POINTSMAN_BUS_SERVICE", "POINTSMAN_BUS_PORT"):
        monkeypatch.setenv(name, env[name]["value"])
    monkeypatch.setenv("POD_IP", "10.1.2.3")
    argv = [*c["command"][1:], *[a.replace("$(POD_NAMESPACE)", "default") for a in c["args"]]]
    settings = ServeSettings.from_args(build_parser().parse_args(argv)).replicas.bus
    assert settings is not None and settings.service == svc_name
    assert settings.address == f"10.1.2.3:{bus_port}" and settings.bind == f"tcp://10.1.2.3:{bus_port}"


def test_only_pointsman_pods_reach_the_bus_port(docs):
    pol = one(docs, "NetworkPolicy")
    c = container(docs)
    bus_port = int({e["name"]: e.get("value") for e in c["env"]}["POINTSMAN_BUS_PORT"])
    tpl_labels = one(docs, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert all(tpl_labels.get(k) == v for k, v in pol["spec"]["podSelector"]["matchLabels"].items())
    bus_rules = [r for r in pol["spec"]["ingress"] if any(p["port"] == bus_port for p in r["ports"])]
    assert len(bus_rules) == 1 and bus_rules[0]["from"] == [{"podSelector": {"matchLabels": {"app": "pointsman"}}}]
    open_ports = {p["port"] for r in pol["spec"]["ingress"] if "from" not in r for p in r["ports"]}
    assert {p["containerPort"] for p in c["ports"]} - {bus_port} <= open_ports  # the other ports stay reachable
