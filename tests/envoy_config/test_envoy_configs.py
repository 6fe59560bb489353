"""Every shipped or generated Envoy config passes `envoy --mode validate`; Docker files are checked statically."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from epp.cmd.cli import main as epp_main
from epp.envoy_config import VARIANTS, EnvoyConfigSpec, build_bootstrap, render
from tests.support.envoy import validate

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.envoy


@pytest.mark.parametrize("path", sorted((ROOT / "envoy").glob("*.yaml")), ids=lambda p: p.name)
def test_shipped_envoy_configs_validate(path):
    doc = yaml.safe_load(path.read_text())
    if "static_resources" not in doc:
        pytest.skip("not an Envoy bootstrap")
    res = validate(path)
    assert res.returncode == 0, res.stdout + res.stderr


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("phases", ["full", "headers", "lean"])
def test_generated_configs_validate(tmp_path, variant, phases):
    out = tmp_path / "envoy.yaml"
    argv = ["envoy-config", "--variant", variant, "--endpoint", "10.0.0.1:8000", "--endpoint", "[fd00::2]:8000",
            "--response-phases", phases, "-o", str(out)]
    assert epp_main(argv) == 0
    res = validate(out)
    assert res.returncode == 0, res.stdout + res.stderr


@pytest.mark.parametrize("extra", [[], ["--epp-tls=false"], ["--epp-tls"], ["--response-phases", "lean"],
                                   ["--variant", "override-host"], ["--epp", "[::1]:9002", "--pool-name", "llama"],
                                   ["--epp", "pointsman-epp.default.svc:9002"]],
                         ids=["default", "plain", "tls", "lean", "explicit-variant", "ipv6-epp", "dns-epp"])
def test_eds_configs_validate(tmp_path, extra):
    out = tmp_path / "envoy.yaml"
    assert epp_main(["envoy-config", "--eds", *extra, "-o", str(out)]) == 0
    res = validate(out)
    assert res.returncode == 0, res.stdout + res.stderr
    doc = yaml.safe_load(out.read_text())
    pool = next(c for c in doc["static_resources"]["clusters"] if c["name"] == "pool")
    assert pool["type"] == "EDS" and "load_assignment" not in pool
    source = pool["eds_cluster_config"]["eds_config"]
    assert source["resource_api_version"] == "V3"
    api = source["api_config_source"]
    assert api["api_type"] == "GRPC" and api["transport_api_version"] == "V3"
    # EDS rides the `epp` cluster (Pointsman's gRPC port, HTTP/2, TLS when --epp-tls).
    assert api["grpc_services"][0]["envoy_grpc"]["cluster_name"] == "epp"
    assert pool["eds_cluster_config"]["service_name"] == ("llama" if "llama" in extra else "default")
    policy = pool["load_balancing_policy"]["policies"][0]["typed_extension_config"]
    assert policy["name"] == "envoy.load_balancing_policies.override_host"
    assert doc["node"]["id"], "xDS needs a node id"
    epp = doc["static_resources"]["clusters"][0]
    assert epp["type"] == ("STRICT_DNS" if "pointsman-epp.default.svc:9002" in extra else "STATIC")
    # TLS to Pointsman unless told it serves plaintext (`epp serve` serves TLS by default), never verifying it.
    tls = epp.get("transport_socket", {}).get("typed_config", {})
    assert bool(tls) == ("--epp-tls=false" not in extra)
    assert "validation_context" not in tls.get("common_tls_context", {})


def test_eds_pool_name_comes_from_the_endpoints_file(tmp_path):
    eps = tmp_path / "eps.yaml"
    eps.write_text(yaml.safe_dump({"pools": [{"name": "first", "endpoints": [{"address": "10.0.0.1", "port": 1}]},
                                             {"name": "second", "endpoints": []}]}))
    out = tmp_path / "envoy.yaml"
    assert epp_main(["envoy-config", "--eds", "--endpoints-file", str(eps), "-o", str(out)]) == 0
    pool = yaml.safe_load(out.read_text())["static_resources"]["clusters"][1]
    assert pool["eds_cluster_config"]["service_name"] == "first"
    assert "load_assignment" not in pool, "with --eds the endpoints come from Pointsman, not the file"
    assert epp_main(["envoy-config", "--eds", "--endpoints-file", str(eps), "--pool-name", "second",
                     "-o", str(out)]) == 0
    assert yaml.safe_load(out.read_text())["static_resources"]["clusters"][1]["eds_cluster_config"][
        "service_name"] == "second"


def test_an_unreadable_endpoints_file_is_named_not_a_traceback(tmp_path, capsys):
    # envoy-config reads the file as `epp serve` does (epp.fleet.static_source.read_static_file)
    bad = tmp_path / "bad.yaml"
    bad.write_text("pools: [\n")
    for path, says in ((tmp_path / "missing.yaml", "cannot read"), (bad, "not YAML")):
        assert epp_main(["envoy-config", "--variant", "override-host", "--endpoints-file", str(path)]) == 2
        assert f"{path}: {says}" in capsys.readouterr().err


@pytest.mark.parametrize("argv,message", [
    (["--eds", "--variant", "original-dst"], "original-dst variant has no endpoint list"),
    (["--eds", "--endpoint", "10.0.0.1:8000"], "do not also list them"),
    (["--request-body-mode", "SIDEWAYS"], "unknown ext_proc body mode"),
])
def test_bad_combinations_are_clear_errors(capsys, argv, message):
    assert epp_main(["envoy-config", *argv]) == 2
    assert message in capsys.readouterr().err


def test_the_builder_uses_typed_messages():
    from envoy_data_plane.envoy.config.bootstrap.v3 import Bootstrap
    from envoy_data_plane.envoy.config.cluster.v3 import ClusterDiscoveryType

    boot = build_bootstrap(EnvoyConfigSpec(variant="override-host", eds=True))
    assert isinstance(boot, Bootstrap)
    assert [c.name for c in boot.static_resources.clusters] == ["epp", "pool"]
    assert boot.static_resources.clusters[1].type == ClusterDiscoveryType.EDS
    # The wire form round-trips: what Envoy would receive over xDS equals what the YAML says.
    again = Bootstrap.parse(bytes(boot))
    assert again.to_dict() == boot.to_dict()


def test_ext_proc_filter_settings_match_the_contract():
    cfg = render(EnvoyConfigSpec(variant="override-host", endpoints=[("10.0.0.1", 8000)]))
    hcm = cfg["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
    ext = hcm["http_filters"][0]["typed_config"]
    mode = ext["processing_mode"]
    assert mode["request_body_mode"] == "FULL_DUPLEX_STREAMED"
    assert mode["request_trailer_mode"] == "SEND" and mode["response_trailer_mode"] == "SEND"
    assert ext["metadata_options"]["receiving_namespaces"]["untyped"] == ["envoy.lb", "pointsman"]  # pick, receipt
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
    for needed in ("COPY epp", "COPY scheduling", "COPY modelsim", 'ENTRYPOINT ["epp"]'):
        assert needed in dockerfile
    epp_cmd = services["epp"]["command"]
    run = subprocess.run([sys.executable, "-c", "import sys; from epp.cmd.cli import build_parser; "
                          "build_parser().parse_args(sys.argv[1:])", *epp_cmd], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    sim_cmd = services["modelsim"]["command"]
    run = subprocess.run([sys.executable, "-c", "import sys; from modelsim.cli import build_parser; "
                          "build_parser().parse_args(sys.argv[1:])", *sim_cmd], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr


# How envoy/*.yaml were generated (the docker-compose addresses); regenerate with these after a builder change.
SHIPPED = {
    "original-dst.yaml": ["--variant", "original-dst"],
    "override-host.yaml": ["--variant", "override-host", "--endpoints-file", "envoy/endpoints.example.yaml"],
    "override-host-eds.yaml": ["--eds", "--endpoints-file", "envoy/endpoints.example.yaml"],
}


@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_shipped_configs_are_what_the_generator_writes(tmp_path, monkeypatch, name):
    monkeypatch.chdir(ROOT)
    out = tmp_path / name
    argv = ["envoy-config", "--listen-address", "0.0.0.0", "--epp", "172.28.0.20:9002", *SHIPPED[name], "-o", str(out)]
    assert epp_main(argv) == 0
    assert out.read_text() == (ROOT / "envoy" / name).read_text(), f"regenerate envoy/{name}: epp {' '.join(argv)}"


@pytest.mark.parametrize("extra", [["--eds"], ["--endpoint", "10.0.0.1:8000"], ["--eds", "--epp-tls"],
                                   ["--eds", "--response-phases", "lean"]], ids=["eds", "static", "tls", "lean"])
def test_fail_open_configs_validate_and_say_what_they_do(tmp_path, extra):
    out = tmp_path / "envoy.yaml"
    assert epp_main(["envoy-config", "--failure-mode", "open", *extra, "-o", str(out)]) == 0
    res = validate(out)
    assert res.returncode == 0, res.stdout + res.stderr
    doc = yaml.safe_load(out.read_text())
    hcm = doc["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
    ext = hcm["http_filters"][0]["typed_config"]
    assert ext["failure_mode_allow"] is True
    assert ext["message_timeout"] == "30s"
    mode = ext["processing_mode"]
    assert mode["request_body_mode"] == "BUFFERED"  # Envoy keeps the body: a broken stream loses nothing
    assert mode.get("response_body_mode", "NONE") == ("NONE" if "lean" in extra else "STREAMED")
    epp, pool = doc["static_resources"]["clusters"]
    assert epp["connect_timeout"] == "0.250s"
    hc = epp["health_checks"][0]
    assert hc["grpc_health_check"]["service_name"] == "envoy.service.ext_proc.v3.ExternalProcessor"
    assert epp["common_lb_config"]["healthy_panic_threshold"] == {"value": 0.0}
    policy = pool["load_balancing_policy"]["policies"][0]["typed_extension_config"]
    assert policy["name"] == "envoy.load_balancing_policies.override_host"
    fallback = policy["typed_config"]["fallback_policy"]["policies"][0]["typed_extension_config"]
    assert fallback["name"] == "envoy.load_balancing_policies.least_request"


def test_fail_closed_is_the_default_and_fail_open_needs_endpoints(tmp_path, capsys):
    out = tmp_path / "envoy.yaml"
    assert epp_main(["envoy-config", "--eds", "-o", str(out)]) == 0
    doc = yaml.safe_load(out.read_text())
    ext = doc["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]["http_filters"][0]
    assert ext["typed_config"]["failure_mode_allow"] is False
    assert ext["typed_config"]["processing_mode"]["request_body_mode"] == "FULL_DUPLEX_STREAMED"
    assert "health_checks" not in doc["static_resources"]["clusters"][0]
    assert epp_main(["envoy-config", "--failure-mode", "open", "--variant", "original-dst"]) == 2
    assert "original-dst cluster has none" in capsys.readouterr().err
    assert epp_main(["envoy-config", "--failure-mode", "open", "--eds", "--request-body-mode",
                     "FULL_DUPLEX_STREAMED", "-o", str(out)]) == 0
    assert "answers 500 to requests whose ext_proc stream breaks" in capsys.readouterr().err
