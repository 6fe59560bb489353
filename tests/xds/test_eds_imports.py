"""envoy-data-plane (typed config, ~2 s to import) stays off the request path: `epp serve`, with or without EDS,
never imports it; only `epp envoy-config` (and whatever renders a config) does."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

SERVE = """
import asyncio, sys
from epp.cmd.cli import build_parser  # builds every subcommand's flags, the stack's included
from epp.cmd.app import App
from epp.cmd.settings import ServeSettings
import epp.extproc.server, epp.request.director, epp.protocol, epp.xds

async def main(eds):
    args = build_parser().parse_args(["serve", "--grpc-host", "127.0.0.1", "--grpc-port", "0",
                                      "--grpc-health-port", "0", "--metrics-port", "0",
                                      "--endpoints-file", sys.argv[1], "--eds", eds])
    app = App(ServeSettings.from_args(args))
    await app.start()
    assert (app.eds is not None) == (eds == "true")
    await app.stop(0)

asyncio.run(main("true"))
asyncio.run(main("false"))
{extra}
print(",".join(sorted(m for m in sys.modules if m.split(".")[0] in ("envoy_data_plane", "betterproto2"))))
"""


def loaded_after(tmp_path: Path, extra: str = "") -> str:
    eps = tmp_path / "eps.yaml"
    eps.write_text("pools:\n- name: p\n  endpoints:\n  - {address: 127.0.0.1, port: 1}\n")
    run = subprocess.run([sys.executable, "-c", SERVE.format(extra=extra), str(eps)], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    return run.stdout.strip().splitlines()[-1] if run.stdout.strip() else ""


def test_serving_with_and_without_eds_never_imports_envoy_data_plane(tmp_path):
    assert loaded_after(tmp_path) == ""


@pytest.mark.envoy
def test_rendering_a_config_does_import_it(tmp_path):
    """The control: the check above would see the import if the serve path made it."""
    extra = "from epp.envoy_config import EnvoyConfigSpec, render_yaml; render_yaml(EnvoyConfigSpec())"
    assert "envoy_data_plane" in loaded_after(tmp_path, extra).split(",")
