"""The InferencePool's failureMode and the plain Envoy gateway's bootstrap say the same thing, in the base (FailClose)
and with the fail-open component (FailOpen); each shipped bootstrap is what `epp envoy-config` writes today."""

import os
import shlex
from pathlib import Path

import pytest
import yaml

from epp.cmd.cli import main as epp_main
from tests.deploy.test_kustomize import DEPLOY, KUBECTL, render
from tests.support.envoy import validate

pytestmark = pytest.mark.skipif(not Path(KUBECTL).exists(), reason="kubectl not installed")
BOOTSTRAPS = [DEPLOY / "gateways" / "envoy" / "bootstrap-fail-close.yaml",
              DEPLOY / "gateways" / "envoy-fail-open" / "bootstrap-fail-open.yaml"]


def ext_proc(bootstrap: dict) -> dict:
    hcm = bootstrap["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
    return hcm["http_filters"][0]["typed_config"]


def setup(docs: list[dict]) -> tuple[str, dict]:
    pool = next(d for d in docs if d["kind"] == "InferencePool")
    cm = next(d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "envoy-bootstrap")
    return pool["spec"]["endpointPickerRef"]["failureMode"], yaml.safe_load(cm["data"]["envoy.yaml"])


def test_base_pool_and_plain_envoy_both_fail_closed():
    mode, bootstrap = setup(render(DEPLOY) + render(DEPLOY / "gateways" / "envoy"))
    assert mode == "FailClose" and ext_proc(bootstrap)["failure_mode_allow"] is False


def test_the_fail_open_component_switches_both(tmp_path):
    rel = os.path.relpath(DEPLOY, tmp_path)
    (tmp_path / "kustomization.yaml").write_text(yaml.safe_dump({
        "resources": [rel, f"{rel}/gateways/envoy"], "components": [f"{rel}/gateways/envoy-fail-open"]}))
    mode, bootstrap = setup(render(tmp_path))
    assert mode == "FailOpen"
    ext = ext_proc(bootstrap)
    assert ext["failure_mode_allow"] is True and ext["processing_mode"]["request_body_mode"] == "BUFFERED"
    pool = bootstrap["static_resources"]["clusters"][1]
    assert pool["type"] == "EDS" and pool["eds_cluster_config"]["service_name"] == "vllm-llama3-8b-instruct"


@pytest.mark.parametrize("path", BOOTSTRAPS, ids=lambda p: p.name)
def test_shipped_bootstraps_are_what_the_generator_writes_and_validate(tmp_path, path):
    first, _, body = path.read_text().partition("\n")
    argv = shlex.split(first.removeprefix("# epp "))
    out = tmp_path / "envoy.yaml"
    assert epp_main([*argv, "-o", str(out)]) == 0
    assert out.read_text() == body, f"regenerate {path.name}: {first[2:]}"
    res = validate(path)
    assert res.returncode == 0, res.stdout + res.stderr
