"""The envoy-only component: only the gateway's pods reach Pointsman's gRPC port; health, metrics and the replica
bus keep their rules."""

import os
from pathlib import Path

import pytest
import yaml

from tests.deploy.test_kustomize import DEPLOY, KUBECTL, one, render

pytestmark = pytest.mark.skipif(not Path(KUBECTL).exists(), reason="kubectl not installed")


def rules_for(policy: dict, port: int) -> list[dict]:
    return [r for r in policy["spec"]["ingress"] if any(p["port"] <= port <= p.get("endPort", p["port"])
                                                       for p in r["ports"])]


def test_only_the_gateway_reaches_the_grpc_port(tmp_path):
    rel = os.path.relpath(DEPLOY, tmp_path)
    (tmp_path / "kustomization.yaml").write_text(yaml.safe_dump({
        "resources": [rel, f"{rel}/gateways/envoy"], "components": [f"{rel}/gateways/envoy-only"]}))
    docs = render(tmp_path)
    policy = one(docs, "NetworkPolicy")
    epp = one(docs, "Deployment", "pointsman")["spec"]["template"]["spec"]["containers"][0]
    grpc_port = next(p["containerPort"] for p in epp["ports"] if p["name"] == "grpc")
    gateway = next(d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "envoy-inference-gateway")
    gateway_labels = gateway["spec"]["template"]["metadata"]["labels"]
    grpc_rules = rules_for(policy, grpc_port)
    assert grpc_rules and all("from" in r for r in grpc_rules)  # no rule leaves it open to everyone
    sources = [f["podSelector"]["matchLabels"] for r in grpc_rules for f in r["from"]]
    assert sources and all(all(gateway_labels.get(k) == v for k, v in s.items()) for s in sources)
    assert {"app": "pointsman"} not in sources
    # the others as in the base: health and metrics open, the bus for Pointsman pods only
    base = one(render(DEPLOY), "NetworkPolicy")
    for port in (9003, 9090):
        assert any("from" not in r for r in rules_for(policy, port))
    assert [r["from"] for r in rules_for(policy, 9004)] == [r["from"] for r in rules_for(base, 9004)]
    # the service the gateway's bootstrap calls is the port the policy guards
    svc = one(docs, "Service", "pointsman-epp")
    assert any(p["targetPort"] == grpc_port for p in svc["spec"]["ports"])
