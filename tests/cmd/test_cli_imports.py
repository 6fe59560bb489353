"""The client commands load only what they use (issue 29, "a light CLI").

Each command runs as it does for a user, in a fresh interpreter (`python -c` calling `epp.cmd.cli.main`, what the
`epp` script runs), against a real `epp serve` where it talks to one; at exit the process writes the names of the
modules it loaded. None of the server's machinery may be among them: the servers, the request path, the fleet's
watchers and scrapers, the scheduler's plugins, Kubernetes, the replica bus, rate limits, flow control, tracing,
aiohttp, Prometheus. `epp serve --help` builds every flag of `epp serve` and must not load them either: settings
modules hold flags and dataclasses only (the subsystem imports its settings, never the reverse). The control at the
end imports the serve path, and the same check sees the machinery there.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.envoy import free_port
from tests.support.wait import wait_until

ROOT = Path(__file__).resolve().parents[2]

# What a client command must not load (prefixes of module names), and why each is there.
HEAVY: dict[str, str] = {
    "epp.cmd.app": "`epp serve`'s components",
    "epp.cmd.settings": "`epp serve`'s flags",
    "epp.extproc.server": "the ext_proc gRPC server",
    "epp.h2grpc.server": "the HTTP/2 gRPC server",
    "epp.h2grpc.connection": "the HTTP/2 gRPC server's connections",
    "epp.api.explain": "the API's server side",
    "epp.api.metrics": "the metrics port",
    "epp.api.dashboard": "the dashboard",
    "epp.request": "the request path",
    "epp.fleet.scrape": "the metrics scraper",
    "epp.fleet.k8s.discovery": "the Kubernetes watchers",
    "epp.fleet.kvevents.service": "the KV-event subscriptions",
    "epp.fleet.passive": "passive health",
    "epp.routing.service": "the routing service",
    "epp.bus": "the replica bus",
    "epp.ratelimit": "rate limits",
    "epp.flowcontrol": "flow control",
    "epp.observe": "tracing, receipts, the shadow",
    "epp.tokenize": "tokenization",
    "epp.xds": "the EDS server",
    "scheduling.plugins": "the scheduling plugins",
    "scheduling.config": "the scheduling config loader",
    "kubernetes": "the Kubernetes client",
    "aiohttp": "HTTP clients and servers",
    "prometheus_client": "metrics",
    "opentelemetry": "the OpenTelemetry SDK",
    "zmq": "ZMQ (KV events, the replica bus)",
}

# What `epp serve`'s settings modules read beyond their own package's face: the pure parsers and types of their flags'
# values (address lists, the KV-event template, the receipt and output settings, which are all flags).
SETTINGS_READS: dict[str, str] = {
    "epp.bus.peers": "--bus-peers and --workers addresses",
    "epp.fleet.kvevents.sources": "--kv-events-* templates and their validation",
    "epp.observe.receipts": "the receipt flags and settings (that module is all settings)",
    "epp.request.outputs": "the routing-output flags and settings (that module is all settings)",
    # --session-body-fields' choices are the core's BODY_FIELDS; scheduling/sessions/identity.py takes the session
    # key from the session-affinity scorer, and with it that plugin's package (the core's own layout: allowed here
    # until the key moves next to the identity).
    "scheduling.plugins": "scheduling.sessions.identity's session key",
    "scheduling.plugins.scorers": "scheduling.sessions.identity's session key",
    "scheduling.plugins.scorers.session_affinity": "scheduling.sessions.identity's session key",
}
PACKAGES = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "epp").rglob("__init__.py")}

PROBE = """
import atexit, json, os, sys

def dump():
    with open(os.environ["MODULES_OUT"], "w") as f:
        json.dump(sorted(sys.modules), f)

atexit.register(dump)
from epp.cmd.cli import main
sys.exit(main(sys.argv[1:]))
"""

# What the API's clients (`epp endpoints`, `epp explain`) do not need at all: they speak gRPC to a running Pointsman.
NOT_FOR_CLIENTS = ("epp.fleet", "epp.routing", "epp.h2grpc.server", "epp.h2grpc.connection", "epp.envoy_config",
                   "scheduling", "yaml")

ENDPOINTS = "pools:\n- name: p\n  endpoints:\n  - {address: 127.0.0.1, port: 1}\n  - {address: 127.0.0.1, port: 2}\n"


def heavy_in(modules: list[str]) -> list[str]:
    return sorted(f"{m} ({why})" for m in modules for prefix, why in HEAVY.items()
                  if m == prefix or m.startswith(prefix + "."))


def run(tmp: Path, *argv: str, stdin: str = "") -> tuple[subprocess.CompletedProcess[str], list[str]]:
    out = tmp / f"modules-{len(list(tmp.glob('modules-*')))}.json"
    done = subprocess.run([sys.executable, "-c", PROBE, *argv], cwd=ROOT, capture_output=True, text=True,
                          input=stdin, timeout=120, env={**os.environ, "MODULES_OUT": str(out)})
    return done, json.loads(out.read_text())


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real `epp serve` (TLS on its gRPC port, as by default) over an endpoints file; its gRPC address."""
    tmp = tmp_path_factory.mktemp("serve")
    eps = tmp / "endpoints.yaml"
    eps.write_text(ENDPOINTS)
    addr = f"127.0.0.1:{free_port()}"
    proc = subprocess.Popen([sys.executable, "-m", "epp.cmd.cli", "serve", "--endpoints-file", str(eps),
                             "--grpc-host", "127.0.0.1", "--grpc-port", addr.rsplit(":", 1)[1],
                             "--grpc-health-port", "0", "--metrics-port", "0"], cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_until(lambda: proc.poll() is not None or subprocess.run(
            [sys.executable, "-m", "epp.cmd.cli", "endpoints", "--addr", addr], cwd=ROOT, capture_output=True,
            timeout=60).returncode == 0, 60, "epp serve answers `epp endpoints`")
        assert proc.poll() is None, "epp serve exited"
        yield addr
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_epp_endpoints_answers_without_the_server_machinery(server: str, tmp_path: Path) -> None:
    done, modules = run(tmp_path, "endpoints", "--addr", server)
    assert done.returncode == 0, done.stderr
    assert "127.0.0.1:1" in done.stdout and "127.0.0.1:2" in done.stdout
    assert heavy_in(modules) == []
    assert [m for m in modules if m.startswith(NOT_FOR_CLIENTS)] == []
    assert "epp.api.client" in modules  # what it uses


def test_epp_explain_answers_without_the_server_machinery(server: str, tmp_path: Path) -> None:
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hello"}]})
    done, modules = run(tmp_path, "explain", "--addr", server, "--json", "--body", body)
    assert json.loads(done.stdout)["status"] in (200, 503), done.stderr  # answered (no endpoint is up)
    assert heavy_in(modules) == []
    assert [m for m in modules if m.startswith(NOT_FOR_CLIENTS)] == []


@pytest.mark.parametrize("argv", [("explain", "--help"), ("endpoints", "--help"), ("kv-relay", "--help"), ("--help",)])
def test_help_of_a_client_command_loads_no_server(argv: tuple[str, ...], tmp_path: Path) -> None:
    done, modules = run(tmp_path, *argv)
    assert done.returncode == 0 and "usage: epp" in done.stdout, done.stderr
    assert heavy_in(modules) == []
    assert "grpc" not in modules  # the help asks nobody


def test_epp_envoy_config_renders_without_the_server_machinery(tmp_path: Path) -> None:
    eps = tmp_path / "endpoints.yaml"
    eps.write_text(ENDPOINTS)
    done, modules = run(tmp_path, "envoy-config", "--eds", "--endpoints-file", str(eps), "-o", str(tmp_path / "e.yaml"))
    assert done.returncode == 0, done.stderr
    assert "ext_proc" in (tmp_path / "e.yaml").read_text()
    assert heavy_in(modules) == []
    assert "grpc" not in modules


def test_serve_help_builds_every_flag_from_settings_modules_only(tmp_path: Path) -> None:
    done, modules = run(tmp_path, "serve", "--help")
    assert done.returncode == 0 and "--pool-name" in done.stdout and "--tracing" in done.stdout, done.stderr
    beyond = [m for m in modules if m not in PACKAGES and not m.endswith(".settings") and m not in SETTINGS_READS]
    assert heavy_in(beyond) == []
    assert "grpc" not in modules


def test_the_check_sees_the_machinery_where_it_is_loaded(tmp_path: Path) -> None:
    """The control: the serve path loads what the client commands must not, and `heavy_in` names it."""
    out = tmp_path / "serve-path.json"
    subprocess.run([sys.executable, "-c", "import json, sys; import epp.cmd.app; "
                    f"json.dump(sorted(sys.modules), open({str(out)!r}, 'w'))"], cwd=ROOT, check=True, timeout=120)
    found = heavy_in(json.loads(out.read_text()))
    for prefix in ("epp.cmd.app", "epp.extproc.server", "epp.request", "scheduling.plugins", "prometheus_client"):
        assert any(f.startswith(prefix) for f in found), prefix


def test_epp_kv_relay_runs_without_the_server_machinery(tmp_path: Path) -> None:
    """The relay beside each engine loads ZMQ, nats-py and the relay; nothing else of the server's (aiohttp aside:
    nats-py imports it for its websocket transport). NATS is not there: it waits for it until SIGTERM, then exits 0."""
    out = tmp_path / "modules.json"
    proc = subprocess.Popen([sys.executable, "-c", PROBE, "kv-relay", "--engine-events", "tcp://127.0.0.1:1",
                             "--endpoint", "127.0.0.1:8000", "--pool", "p", "--nats-url",
                             f"nats://127.0.0.1:{free_port()}"], cwd=ROOT, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, "MODULES_OUT": str(out)})
    assert proc.stderr is not None
    line = ""
    while "retrying" not in line and proc.poll() is None:
        line = proc.stderr.readline()
    proc.terminate()
    assert proc.wait(timeout=60) == 0
    modules = json.loads(out.read_text())
    assert [m for m in heavy_in(modules) if not m.startswith(("aiohttp", "zmq"))] == []
    assert "epp.fleet.kvevents.relay" in modules and "nats" in modules
