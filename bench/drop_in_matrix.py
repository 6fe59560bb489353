"""What `epp serve` does with each deployer's exact container args (tests/cmd/deployer_argv.py): GIE's conformance
Deployments and charts, llm-d-router's charts and manifests, KServe's scheduler configs, llm-d-deployer's presets.

Each deployer's args start a real `epp serve` process against the wire-level fake API server (its InferencePool
and a pod), with this run's loopback ports appended (last wins, as pflag). The row says how it ended within the
wait: the exit code and the error it printed, or what it serves: TLS or plaintext on the ext_proc port and the
status of every gRPC health name that deployer's probes ask.

    .venv/bin/python bench/drop_in_matrix.py [--epp-root DIR] [--wait 20]

`--epp-root` runs the `epp` of another checkout (say an older commit, `git worktree add /tmp/before <commit>`)
under the same deployers and fake API server, for a before/after table.
"""

from __future__ import annotations

import argparse
import os
import socket
import ssl
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import grpc  # noqa: E402
from grpc_health.v1 import health_pb2, health_pb2_grpc  # noqa: E402

from epp.cmd.settings import ServeSettings  # noqa: E402
from tests.cmd.deployer_argv import DEPLOYERS, fill, mounted, mounts  # noqa: E402
from tests.fleet.k8s.fakeapi import FakeKubeAPI  # noqa: E402

STATUS = {v: k for k, v in health_pb2.HealthCheckResponse.ServingStatus.items()}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def fill_for(api: FakeKubeAPI, argv: list[str]) -> None:
    """The deployment's InferencePool and a pod, as Pointsman reads them from its args (none for args it refuses)."""
    try:
        fill(api, ServeSettings.from_argv(argv))
    except ValueError:
        pass


def serves_tls(port: int) -> bool:
    try:
        ssl.get_server_certificate(("127.0.0.1", port), timeout=3)
        return True
    except (OSError, ssl.SSLError):
        return False


def health(port: int, service: str, tls: bool) -> str:
    target = f"127.0.0.1:{port}"
    if tls:
        pem = ssl.get_server_certificate(("127.0.0.1", port), timeout=3).encode()
        ch = grpc.secure_channel(target, grpc.ssl_channel_credentials(root_certificates=pem),
                                 options=[("grpc.ssl_target_name_override", "localhost")])
    else:
        ch = grpc.insecure_channel(target)
    with ch:
        try:
            resp = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service=service), timeout=3)
            return STATUS[resp.status]
        except grpc.RpcError as e:
            return e.code().name


def run(name: str, epp_root: Path, wait: float, tmp: Path) -> str:
    args, probed = DEPLOYERS[name]
    api = FakeKubeAPI().start()
    grpc_port, health_port = free_port(), free_port()
    argv = [*mounted(args, mounts(tmp)), f"--grpc-port={grpc_port}", f"--grpc-health-port={health_port}",
            "--grpc-host=127.0.0.1", "--metrics-port=0", f"--kubeconfig={api.kubeconfig(tmp / 'kubeconfig')}"]
    fill_for(api, argv)
    env = {k: v for k, v in os.environ.items() if k not in ("KUBERNETES_SERVICE_HOST", "NAMESPACE")}
    env["PYTHONPATH"] = str(epp_root)
    code = "import sys; from epp.cmd.cli import main; sys.exit(main())"
    proc = subprocess.Popen([sys.executable, "-c", code, "serve", *argv], cwd=epp_root, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        end = time.monotonic() + wait
        statuses: dict[str, str] = {}
        while time.monotonic() < end and proc.poll() is None:
            time.sleep(0.3)
            try:
                socket.create_connection(("127.0.0.1", grpc_port), timeout=1).close()
            except OSError:
                continue
            tls = serves_tls(grpc_port)
            statuses = {s or '""': health(health_port, s, False) for s in probed}
            if all(v == "SERVING" for v in statuses.values()) or time.monotonic() > end - 1:
                names = ", ".join(f"{k} {v}" for k, v in statuses.items())
                return f"serves {'TLS' if tls else 'plaintext'}; health: {names}"
        if proc.poll() is not None:
            err = [line for line in (proc.stderr.read() if proc.stderr else "").splitlines() if line.strip()]
            return f"exit {proc.returncode}: {err[-1][:90] if err else ''}"
        return f"no ext_proc port within {wait:.0f} s"
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
        api.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--epp-root", type=Path, default=ROOT, help="the checkout whose epp runs (default: this one)")
    ap.add_argument("--wait", type=float, default=20.0, help="seconds for each start (default 20)")
    a = ap.parse_args()
    print("| deployer | what `epp serve` does |\n|---|---|")
    for name in sorted(DEPLOYERS):
        with tempfile.TemporaryDirectory() as tmp:
            print(f"| {name} | {run(name, a.epp_root.resolve(), a.wait, Path(tmp))} |", flush=True)


if __name__ == "__main__":
    main()
