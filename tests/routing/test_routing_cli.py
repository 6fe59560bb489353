"""`epp envoy-config --routes-file`: a config Envoy accepts, and bad documents named on stderr."""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml
from routing_helpers import EXAMPLE, ROOT

from tests.support.envoy import validate

pytestmark = pytest.mark.envoy

PROVIDER = """---
apiVersion: networking.serving.volcano.sh/v1alpha1
kind: ExternalModelProvider
metadata: {name: openai}
spec: {baseURL: 'https://api.openai.com', model: gpt-4o-mini, auth: {secretRef: {name: k, key: token}}}
"""


def envoy_config(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "epp.cmd.cli", "envoy-config", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)


def test_envoy_config_from_routes_is_valid(tmp_path):
    routes = tmp_path / "routes.yaml"
    routes.write_text(EXAMPLE.read_text() + PROVIDER)
    out = tmp_path / "envoy.yaml"
    res = envoy_config("--variant", "override-host", "--routes-file", str(routes), "-o", str(out))
    assert res.returncode == 0, res.stderr
    cfg = yaml.safe_load(out.read_text())
    clusters = {c["name"]: c for c in cfg["static_resources"]["clusters"]}
    tls = clusters["provider.default.openai"]["transport_socket"]["typed_config"]
    assert tls["sni"] == "api.openai.com"
    assert tls["common_tls_context"]["validation_context"]["trusted_ca"]["filename"] == \
        "/etc/ssl/certs/ca-certificates.crt"
    pool = {f"{e['endpoint']['address']['socket_address']['address']}:"
            f"{e['endpoint']['address']['socket_address']['port_value']}"
            for e in clusters["pool"]["load_assignment"]["endpoints"][0]["lb_endpoints"]}
    assert pool == {"10.0.1.1:8000", "10.0.1.2:8000", "10.0.2.1:30000", "10.0.2.2:30001"}
    routes_ = cfg["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"][
        "route_config"]["virtual_hosts"][0]["routes"]
    assert routes_[0]["match"]["headers"][0] == {"name": "x-pointsman-provider",
                                                 "string_match": {"exact": "provider.default.openai"}}
    assert routes_[-1]["route"]["retry_policy"]["num_retries"] == 1  # deepseek-v1 retries once
    check = validate(out)
    assert check.returncode == 0, check.stdout + check.stderr
    ca = tmp_path / "ca.pem"
    ca.write_text("")  # only its path goes into the config
    res = envoy_config("--routes-file", str(routes), "--provider-ca-file", str(ca))
    assert res.returncode == 0, res.stderr
    cluster = next(c for c in yaml.safe_load(res.stdout)["static_resources"]["clusters"]
                   if c["name"] == "provider.default.openai")
    assert cluster["transport_socket"]["typed_config"]["common_tls_context"]["validation_context"][
        "trusted_ca"]["filename"] == str(ca)


def test_envoy_config_names_a_bad_document(tmp_path):
    routes = tmp_path / "routes.yaml"
    routes.write_text(EXAMPLE.read_text().replace("inferenceEngine: SGLang", "inferenceEngine: TGI"))
    res = envoy_config("--variant", "override-host", "--routes-file", str(routes))
    assert res.returncode == 2
    assert "ModelServer default/deepseek-v2" in res.stderr and "spec.inferenceEngine: expected one of vLLM, SGLang" \
        in res.stderr, res.stderr
