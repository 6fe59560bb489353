"""Optional extras (epp/extras.py): a feature whose extra is missing is an error naming the extra (exit 2), and the
base serve path imports none of the optional packages.

A missing package is simulated in a fresh interpreter by `sys.modules[name] = None`, which makes every import of it
fail as if it were not installed; each case has a control that runs the same command with the package present.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from epp.cmd.settings import ServeSettings
from tests.support.envoy import free_port

ROOT = Path(__file__).resolve().parents[2]
OPTIONAL = ("redis", "zmq", "msgpack", "tokenizers", "jinja2", "envoy_data_plane", "pydantic", "betterproto2",
            "uvloop", "modelsim")

CLI = """
import sys
for name in sys.argv[1].split(","):
    if name:
        sys.modules[name] = None  # as if not installed
from {module} import main
sys.exit(main(sys.argv[2:]))
"""


def epp(blocked: str, *argv: str, module: str = "epp.cmd.cli") -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", CLI.format(module=module), blocked, *argv], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)


@pytest.fixture
def eps(tmp_path: Path) -> Path:
    path = tmp_path / "eps.yaml"
    path.write_text("pools:\n- name: p\n  endpoints:\n  - {address: 127.0.0.1, port: 1}\n")
    return path


@pytest.mark.parametrize("blocked,flags,extra,feature", [
    ("redis", ["--redis-url", "127.0.0.1:6379"], "redis", "--redis-url"),
    ("zmq", ["--kv-events-port", "5557"], "precise", "--kv-events-port"),
    ("tokenizers", ["--tokenizers-dir", "{tmp}"], "precise", "--tokenizers-dir"),
    ("msgpack", ["--bus-peers", "10.0.0.5:9004"], "replicas", "--bus-peers"),
    ("zmq", ["--workers", "2", "--worker-index", "0", "--worker-dir", "{tmp}"], "replicas", "--workers"),
    ("zmq", ["--workers", "2", "--grpc-host", "256.0.0.1"], "replicas", "--workers"),  # the supervisor, first
])
def test_a_serve_flag_without_its_extra_names_the_extra(eps, tmp_path, blocked, flags, extra, feature):
    flags = [f.format(tmp=tmp_path) for f in flags]
    run = epp(blocked, "serve", "--endpoints-file", str(eps), *flags)
    assert run.returncode == 2, run.stderr
    assert f"error: {feature} needs the '{extra}' extra: pip install 'pointsman[{extra}]'" in run.stderr
    assert "Traceback" not in run.stderr
    # The control: with the package installed, the same flags are good settings.
    assert ServeSettings.from_argv(["--endpoints-file", str(eps), *flags])


def test_commands_without_their_extra_name_it(tmp_path):
    run = epp("envoy_data_plane", "envoy-config", "-o", str(tmp_path / "envoy.yaml"))
    assert run.returncode == 2 and "error: epp envoy-config needs the 'envoy-config' extra" in run.stderr, run.stderr
    assert not (tmp_path / "envoy.yaml").exists()
    assert epp("", "envoy-config", "-o", str(tmp_path / "envoy.yaml")).returncode == 0  # the control
    run = epp("msgpack", "stack", "--duration", "1")
    assert run.returncode == 2 and "error: epp stack needs the 'stack' extra" in run.stderr, run.stderr
    run = epp("msgpack", "--servers", "1", "--base-port", "1", module="modelsim.cli")
    assert run.returncode == 2 and "error: modelsim needs the 'stack' extra" in run.stderr, run.stderr


SERVE = """
import asyncio, sys
if sys.argv[2]:
    sys.modules[sys.argv[2]] = None  # as if not installed
from epp.cmd.app import App
from epp.cmd.settings import ServeSettings

async def main():
    app = App(ServeSettings.from_argv(["--secure-serving=false", "--grpc-host", "127.0.0.1", "--grpc-port", "0",
                                       "--grpc-health-port", "0",
                                       "--endpoints-file", sys.argv[1], "--metrics-port", sys.argv[3]]))
    await app.start()
    await asyncio.sleep(0)
    print("invalid:", sorted(app.precise.invalid.values()))
    await app.stop(0)

asyncio.run(main())
optional = set(sys.argv[4].split(","))
loaded = {m.split(".")[0] for m, mod in sys.modules.items() if mod is not None and m.split(".")[0] in optional}
print("loaded:", ",".join(sorted(loaded)))
"""


def serve(eps: Path, blocked: str = "") -> tuple[str, str]:
    argv = [str(eps), blocked, str(free_port()), ",".join(OPTIONAL)]
    run = subprocess.run([sys.executable, "-c", SERVE, *argv], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    return lines[-2].removeprefix("invalid: "), lines[-1].removeprefix("loaded: ")


def test_the_base_serve_path_imports_no_optional_package(eps):
    """`epp serve` from a file with the defaults (metrics and the dashboard, EDS, passive health, the
    estimated-latency profile, tokenization for configs that read tokens)."""
    assert serve(eps) == ("[]", "")


def test_the_check_sees_an_optional_import(tmp_path):
    """The control of the test above, and a runtime case: an endpoint that publishes KV events loads ZMQ; without
    the extra it is left without a subscription, the reason named, and Pointsman keeps serving."""
    eps = tmp_path / "eps.yaml"
    eps.write_text("pools:\n- name: p\n  endpoints:\n  - {address: 127.0.0.1, port: 1, kvEvents: 'tcp://127.0.0.1:1'}\n")
    invalid, loaded = serve(eps)
    assert invalid == "[]" and "zmq" in loaded.split(",")
    invalid, loaded = serve(eps, "zmq")
    assert "subscribing to KV events needs the 'precise' extra: pip install 'pointsman[precise]'" in invalid
    assert "zmq" not in loaded.split(",")
