"""`epp stack`: the local stack on loopback, no Docker: a modelsim fleet, Pointsman and Envoy.

It shows progress while starting, prints where to send requests, then until Ctrl-C shows live routing: which
endpoint took which request (from Pointsman's decision log) and each endpoint's queue, KV and in-flight count.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import grpc
import yaml

from epp.envoy_config import EnvoyConfigSpec, render_yaml
from epp.ports import wait_port
from proto import pointsman_pb2 as api
from proto import pointsman_pb2_grpc

MODEL = "meta-llama/Llama-3.1-8B"
ADAPTER = "sql-lora"


def add_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--servers", type=int, default=4, help="simulated vLLM servers (4)")
    p.add_argument("--sim-base-port", type=int, default=8100)
    p.add_argument("--listen-port", type=int, default=8081, help="where clients send requests (8081)")
    p.add_argument("--grpc-port", type=int, default=9002)
    p.add_argument("--metrics-port", type=int, default=9090)
    p.add_argument("--admin-port", type=int, default=9901)
    p.add_argument("--time-scale", type=float, default=1.0, help="modelsim time scale (1.0 = real time)")
    p.add_argument("--variant", choices=("original-dst", "override-host"), default="override-host")
    p.add_argument("--config-file", default=None, help="scheduling config for Pointsman")
    p.add_argument("--duration", type=float, default=0, help="stop after this many seconds (0 = until Ctrl-C)")
    p.add_argument("--quiet", action="store_true", help="no live view (for scripts)")
    p.add_argument("--example", choices=("pool", "kthena"), default="pool",
                   help="pool: one pool of every server; kthena: a Kthena ModelRoute over two ModelServers")


def _bin(name: str) -> str:
    local = Path(sys.executable).parent / name
    return str(local) if local.exists() else name


def _check_free(port: int, what: str) -> None:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            raise RuntimeError(f"port {port} ({what}) is in use; pick another with the flags (see --help)") from None


class LocalStack:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.dir = Path(tempfile.mkdtemp(prefix="pointsman-stack-"))
        self.procs: list[tuple[str, subprocess.Popen]] = []
        self.decisions: list[str] = []
        self._lock = threading.Lock()

    def step(self, msg: str) -> None:
        print(f"  ... {msg}", flush=True)

    def start(self) -> None:
        a = self.args
        ports = [a.sim_base_port + i for i in range(a.servers)]
        for port, what in [(p, "modelsim") for p in ports] + [
            (a.grpc_port, "Pointsman gRPC"), (a.listen_port, "Envoy listener"), (a.admin_port, "Envoy admin"),
            (a.metrics_port, "Pointsman metrics"), (a.grpc_port + 1, "Pointsman health"),
        ]:
            _check_free(port, what)
        print("Starting the Pointsman local stack", flush=True)
        self.step(f"modelsim: {a.servers} simulated vLLM servers on ports {ports[0]}-{ports[-1]} ({MODEL})")
        sim = self._spawn("modelsim", [_bin("modelsim"), "--servers", str(a.servers), "--base-port",
                                       str(a.sim_base_port), "--model", MODEL, "--lora", ADAPTER,
                                       "--time-scale", str(a.time_scale)])
        for p in ports:
            wait_port(p, proc=sim, what="modelsim")
        eps = {"pools": [{"name": "default", "endpoints": [
            {"address": "127.0.0.1", "port": p, "name": f"sim-{i}", "models": [MODEL, ADAPTER]}
            for i, p in enumerate(ports)]}], "adapters": {ADAPTER: MODEL}}
        eps_file = self.dir / "endpoints.yaml"
        eps_file.write_text(yaml.safe_dump(eps))
        source = ["--endpoints-file", str(eps_file), "--pool-name", "default"]
        fragments = None
        if a.example == "kthena":  # routes instead of one pool: see kthena_example()
            from epp.envoy_providers import fragments_from_files

            routes = self.dir / "routes.yaml"
            routes.write_text(kthena_example(ports))
            source = ["--routes-file", str(routes)]
            fragments = fragments_from_files([routes])[0]
            self.step(f"routes: {routes} (ModelRoute {KTHENA_MODEL}: premium -> v2, others 70/30 v1/v2)")
        self.step(f"Pointsman: ext_proc on :{a.grpc_port}, metrics on :{a.metrics_port}")
        cmd = [_bin("epp"), "serve", "--grpc-host", "127.0.0.1", "--grpc-port", str(a.grpc_port),
               "--grpc-health-port", str(a.grpc_port + 1), "--metrics-port", str(a.metrics_port),
               *source, "--log-decisions"]
        if a.config_file:
            cmd += ["--config-file", a.config_file]
        epp = self._spawn("epp", cmd, capture=True)
        wait_port(a.grpc_port, proc=epp, what="Pointsman")
        self.step(f"Envoy ({a.variant}): listener :{a.listen_port}, admin :{a.admin_port}")
        spec = EnvoyConfigSpec(variant=a.variant, listen_port=a.listen_port, admin_port=a.admin_port,
                               epp_port=a.grpc_port, endpoints=[("127.0.0.1", p) for p in ports],
                               route_fragments=fragments)
        cfg = self.dir / "envoy.yaml"
        cfg.write_text(render_yaml(spec))
        envoy = self._spawn("envoy", [_bin("envoy"), "-c", str(cfg), "--concurrency", "2", "--use-dynamic-base-id",
                                      "--log-level", "warning", "--log-path", str(self.dir / "envoy.log")])
        wait_port(a.listen_port, proc=envoy, what="Envoy")
        url = f"http://127.0.0.1:{a.listen_port}"
        if a.example == "kthena":
            print(kthena_ready(url, a.grpc_port), flush=True)
            return
        print(f"""
Ready. Send requests to {url}, for example:

  curl -s {url}/v1/chat/completions -H 'content-type: application/json' \\
    -d '{{"model": "{MODEL}", "messages": [{{"role": "user", "content": "Hello!"}}]}}'

  curl -sN {url}/v1/completions -H 'content-type: application/json' \\
    -d '{{"model": "{ADAPTER}", "prompt": "SELECT", "max_tokens": 8, "stream": true}}'

Explain a decision:  {_bin('epp')} explain --addr 127.0.0.1:{a.grpc_port} --body '{{"model": "{MODEL}", "messages": [{{"role": "user", "content": "hi"}}]}}'
Pointsman metrics:   http://127.0.0.1:{a.metrics_port}/metrics      Files: {self.dir}
""", flush=True)

    def _spawn(self, name: str, cmd: list[str], capture: bool = False) -> subprocess.Popen:
        log = open(self.dir / f"{name}.log", "wb")  # noqa: SIM115 - lives as long as the process
        proc = subprocess.Popen(cmd, stdout=log if not capture else subprocess.PIPE, stderr=subprocess.STDOUT,
                                start_new_session=True)
        self.procs.append((name, proc))
        if capture:
            threading.Thread(target=self._tail, args=(proc, log), daemon=True).start()
        return proc

    def _tail(self, proc: subprocess.Popen, log) -> None:
        assert proc.stdout is not None
        for raw in proc.stdout:
            log.write(raw)
            log.flush()
            line = raw.decode(errors="replace").rstrip()
            if " decision " in line:
                with self._lock:
                    self.decisions.append(line.split(" decision ", 1)[1])

    def watch(self) -> None:
        a = self.args
        stub = pointsman_pb2_grpc.PointsmanStub(grpc.insecure_channel(f"127.0.0.1:{a.grpc_port}"))
        deadline = time.monotonic() + a.duration if a.duration else None
        while deadline is None or time.monotonic() < deadline:
            time.sleep(1.0)
            for name, proc in self.procs:
                if proc.poll() is not None:
                    raise RuntimeError(f"{name} exited with code {proc.returncode}; see {self.dir}/{name}.log")
            if a.quiet:
                continue
            with self._lock:
                recent, self.decisions = self.decisions[-8:], []
            for d in recent:
                print(f"  route  {d}", flush=True)
            try:
                resp = stub.ListEndpoints(api.ListEndpointsRequest(), timeout=2)
            except grpc.RpcError:
                continue
            row = "  ".join(f"{e.key.split(':')[-1]}: q={e.waiting} run={e.running} kv={e.kv_usage:.0%} "
                            f"inflight={e.inflight}" for e in resp.endpoints)
            print(f"  fleet  {row}", flush=True)

    def stop(self) -> None:
        for _name, proc in reversed(self.procs):
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        for _name, proc in self.procs:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()


KTHENA_MODEL = "deepseek-r1"


def kthena_example(ports: list[int]) -> str:
    """Two ModelServers over the simulated servers (v1: the first half, v2: the rest; both serve MODEL, which the
    route's virtual model name is overwritten to) and a ModelRoute: premium users to v2, the others 70/30."""
    half = max(1, len(ports) // 2)
    groups = {"v1": ports[:half], "v2": ports[half:] or ports[:half]}
    docs = []
    for name, ps in groups.items():
        docs.append({"apiVersion": "networking.serving.volcano.sh/v1alpha1", "kind": "ModelServer",
                     "metadata": {"name": f"llama-{name}", "namespace": "default"},
                     "spec": {"model": MODEL, "inferenceEngine": "vLLM", "workloadPort": {"port": ps[0]},
                              "endpoints": [{"name": f"sim-{p}", "address": "127.0.0.1", "port": p} for p in ps],
                              "trafficPolicy": {"retry": {"attempts": 1}}}})
    docs.append({"apiVersion": "networking.serving.volcano.sh/v1alpha1", "kind": "ModelRoute",
                 "metadata": {"name": "deepseek", "namespace": "default"},
                 "spec": {"modelName": KTHENA_MODEL, "rules": [
                     {"name": "premium", "modelMatch": {"headers": {"x-user-tier": {"exact": "premium"}}},
                      "targetModels": [{"modelServerName": "llama-v2"}]},
                     {"name": "canary", "targetModels": [{"modelServerName": "llama-v1", "weight": 70},
                                                         {"modelServerName": "llama-v2", "weight": 30}]}]}})
    return yaml.safe_dump_all(docs, sort_keys=False)


def kthena_ready(url: str, grpc_port: int) -> str:
    body = f'{{"model": "{KTHENA_MODEL}", "messages": [{{"role": "user", "content": "Hello!"}}]}}'
    return f"""
Ready. Send requests to {url}, for example:

  curl -s {url}/v1/chat/completions -H 'content-type: application/json' -d '{body}'
  curl -s {url}/v1/chat/completions -H 'content-type: application/json' -H 'x-user-tier: premium' -d '{body}'

Explain a decision (the rule, the split and the pick):
  {_bin('epp')} explain --addr 127.0.0.1:{grpc_port} --body '{body}'
  {_bin('epp')} explain --addr 127.0.0.1:{grpc_port} -H 'x-user-tier: premium' --body '{body}'
"""


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def stack_command(args: argparse.Namespace) -> int:
    stack = LocalStack(args)
    signal.signal(signal.SIGTERM, _interrupt)  # a TERM stops the whole stack too, never orphans it
    try:
        stack.start()
        stack.watch()
        return 0
    except KeyboardInterrupt:
        print("\nstopping", flush=True)
        return 0
    except (RuntimeError, TimeoutError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    finally:
        stack.stop()
