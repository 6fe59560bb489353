"""`epp serve` freezes what it built at start out of the cyclic GC's reach (epp/cmd/app.py), and only then: the
serve path, in a process of its own, until a SIGTERM stops it cleanly."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from tests.support.envoy import free_port

SCRIPT = textwrap.dedent("""
    import asyncio, gc, os, signal, sys, time
    from epp.cmd.app import run
    from epp.cmd.settings import ServeSettings

    async def main() -> int:
        settings = ServeSettings.from_argv(sys.argv[1:])
        before = gc.get_freeze_count()
        task = asyncio.get_running_loop().create_task(run(settings))
        deadline = time.monotonic() + 30
        while gc.get_freeze_count() == before and not task.done() and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        print("frozen", before, gc.get_freeze_count(), flush=True)
        os.kill(os.getpid(), signal.SIGTERM)
        return await task

    sys.exit(asyncio.run(main()))
""")


def test_serve_freezes_its_startup_objects_and_still_stops(tmp_path: Path) -> None:
    eps = tmp_path / "eps.yaml"
    eps.write_text("pools:\n- name: p\n  endpoints:\n  - {address: 127.0.0.1, port: 9}\n")
    out = subprocess.run([sys.executable, "-c", SCRIPT, "--grpc-host", "127.0.0.1", "--grpc-port", str(free_port()),
                          "--grpc-health-port", "0", "--metrics-port", "0", "--endpoints-file", str(eps)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    line = next(ln for ln in out.stdout.splitlines() if ln.startswith("frozen"))
    _, before, after = line.split()
    assert int(before) == 0 and int(after) > 10_000, line  # the modules, descriptors and the app: many objects
