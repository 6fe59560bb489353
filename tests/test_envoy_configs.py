"""Every shipped or generated Envoy config passes `envoy --mode validate`; Docker files are checked statically."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from epp.cli import main as epp_main
from epp.envoy_config import VARIANTS, EnvoyConfigSpec, render
from tests.support.envoy import validate

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.envoy


@pytest.mark.parametrize("path", sorted((ROOT / "envoy").glob("*.yaml")), ids=lambda p: p.name)
def test_shipped_envoy_configs_validate(path):
    doc = yaml.safe_load(path.read_text())
    if "static_resources" not in doc:
        pytest.skip("not an Envoy bootstrap")
    res = validate(path)
    assert res.returncode == 0, res.stdout + res.stderr


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("phases", ["full", "lean"])
def test_generated_configs_validate(tmp_path, variant, phases):
    out = tmp_path / "envoy.yaml"
    argv = ["envoy-config", "--variant", variant, "--endpoint", "10.0.0.1:8000", "--endpoint", "[fd00::2]:8000",
            "--response-phases", phases, "-o", str(out)]
    assert epp_main(argv) == 0
    res = validate(out)
    assert res.returncode == 0, res.stdout + res.stderr


def test_ext_proc_filter_settings_match_the_contract():
    cfg = render(EnvoyConfigSpec(variant="override-host", endpoints=[("10.0.0.1", 8000)]))
    hcm = cfg["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
    ext = hcm["http_filters"][0]["typed_config"]
    mode = ext["processing_mode"]
    assert mode["request_body_mode"] == "FULL_DUPLEX_STREAMED"
    assert mode["request_trailer_mode"] == "SEND" and mode["response_trailer_mode"] == "SEND"
    assert ext["metadata_options"]["receiving_namespaces"]["untyped"] == ["envoy.lb"]
    assert ext["failure_mode_allow"] is False
    assert hcm["http_filters"][-1]["name"] == "envoy.filters.http.router"
    pool = cfg["static_resources"]["clusters"][1]
    policy = pool["load_balancing_policy"]["policies"][0]["typed_extension_config"]["typed_config"]
    assert policy["override_host_sources"][0]["metadata"]["key"] == "envoy.lb"


def test_override_host_without_endpoints_is_a_clear_error(capsys):
    assert epp_main(["envoy-config", "--variant", "override-host"]) == 2
    assert "needs the pool's endpoints" in capsys.readouterr().err


def test_docker_files_are_consistent():
    compose = yaml.safe_load((ROOT / "envoy" / "docker-compose.yaml").read_text())
    services = compose["services"]
    assert {"envoy", "epp", "modelsim"} <= set(services)
    for svc in services.values():
        for vol in svc.get("volumes", []):
            src = vol.split(":", 1)[0]
            assert (ROOT / "envoy" / src).resolve().exists(), f"compose mounts a missing file {src}"
        if "build" in svc:
            assert (ROOT / "envoy" / svc["build"]["context"] / svc["build"]["dockerfile"]).exists()
    # Envoy must reach the EPP where compose puts it.
    envoy_cfg = yaml.safe_load((ROOT / "envoy" / "original-dst.yaml").read_text())
    epp_ep = envoy_cfg["static_resources"]["clusters"][0]["load_assignment"]["endpoints"][0]["lb_endpoints"][0]
    epp_ip = services["epp"]["networks"]["stack"]["ipv4_address"]
    assert epp_ep["endpoint"]["address"]["socket_address"]["address"] == epp_ip
    # The EPP's endpoints file points at the modelsim container's ports.
    sim_ip = services["modelsim"]["networks"]["stack"]["ipv4_address"]
    eps = yaml.safe_load((ROOT / "envoy" / "endpoints.example.yaml").read_text())["pools"][0]["endpoints"]
    assert {e["address"] for e in eps} == {sim_ip}
    # The commands in the Dockerfile and compose parse with the real CLIs.
    dockerfile = (ROOT / "Dockerfile").read_text()
    for needed in ("COPY epp", "COPY scheduling", "COPY proto", "COPY modelsim", 'ENTRYPOINT ["epp"]'):
        assert needed in dockerfile
    epp_cmd = services["epp"]["command"]
    run = subprocess.run([sys.executable, "-c", "import sys; from epp.cli import build_parser; "
                          "build_parser().parse_args(sys.argv[1:])", *epp_cmd], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    sim_cmd = services["modelsim"]["command"]
    run = subprocess.run([sys.executable, "-c", "import sys; from modelsim.cli import build_parser; "
                          "build_parser().parse_args(sys.argv[1:])", *sim_cmd], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
