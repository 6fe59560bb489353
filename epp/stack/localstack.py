"""`epp stack`: the local stack on loopback, no Docker: a modelsim fleet, Pointsman and Envoy.

It shows progress while starting, prints where to send requests and the dashboard's URL (the live page on the
metrics port), then until Ctrl-C shows live routing: which endpoint took which request (from Pointsman's decision
log) and each endpoint's queue, KV and in-flight count.

Envoy's pool cluster is fed by Pointsman's EDS server (override-host variant), so the fleet can change live: `+`
adds a simulated server and `-` takes the last one out of the pool (keys in a terminal; lines `+`/`-` on a piped
stdin). Editing the generated endpoints file (its path is printed) works the same way: Pointsman reloads it and
Envoy follows within a second, with no restart.
"""

from __future__ import annotations

import argparse
import os
import queue
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import IO, Any

import grpc
import yaml

from epp.argtypes import parse_bool as _bool
from epp.routing.dialect import StackExample
from epp.routing.dialects import BY_NAME, DIALECTS
from epp.stack.children import die_with_parent
from epp.stack.ports import free_port, wait_port
from proto import pointsman_pb2 as api
from proto import pointsman_pb2_grpc

MODEL = "meta-llama/Llama-3.1-8B"
ADAPTER = "sql-lora"


def add_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--servers", type=int, default=4, help="simulated vLLM servers (4)")
    p.add_argument("--sim-base-port", type=int, default=8100,
                   help="server i listens on this + i (8100); 0: the OS picks a free port for each server")
    p.add_argument("--listen-port", type=int, default=8081, help="where clients send requests (8081)")
    p.add_argument("--grpc-port", type=int, default=9002)
    p.add_argument("--grpc-health-port", type=int, default=9003)
    p.add_argument("--metrics-port", type=int, default=9090)
    p.add_argument("--admin-port", type=int, default=9901)
    p.add_argument("--time-scale", type=float, default=1.0, help="modelsim time scale (1.0 = real time)")
    p.add_argument("--variant", choices=("original-dst", "override-host"), default="override-host",
                   help="override-host (default): pool cluster fed live by Pointsman's EDS; original-dst: no list")
    p.add_argument("--config-file", default=None,
                   help="scheduling config for Pointsman (default: deploy/profiles/estimated-latency-precise.yaml "
                        "with --kv-events, else the built-in default)")
    p.add_argument("--shadow-config", default=None,
                   help="a scheduling config Pointsman runs in shadow on the same requests (docs/observability.md)")
    p.add_argument("--kv-events", type=_bool, default=True,
                   help="modelsim publishes KV-cache events (and replays them) and Pointsman subscribes (true)")
    p.add_argument("--workers", type=int, default=1,
                   help="Pointsman worker processes sharing the gRPC port and their state (docs/replicas.md)")
    p.add_argument("--duration", type=float, default=0, help="stop after this many seconds (0 = until Ctrl-C)")
    p.add_argument("--quiet", action="store_true", help="no live view (for scripts)")
    examples = {d.name: d.example.help for d in DIALECTS if d.example is not None}
    p.add_argument("--example", choices=("pool", *examples), default="pool",
                   help="pool: one pool of every server; " + "; ".join(f"{k}: {v}" for k, v in examples.items()))


PRECISE_PROFILE = Path(__file__).resolve().parents[2] / "deploy" / "profiles" / "estimated-latency-precise.yaml"


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
        self.procs: list[tuple[str, subprocess.Popen[bytes]]] = []
        self.decisions: list[str] = []
        self._lock = threading.Lock()
        self.eps_file = self.dir / "endpoints.yaml"
        self.active: list[int] = []  # simulated servers in the pool (ports), in the endpoints file
        self.spare: list[int] = []  # running servers taken out of the pool, reused first by `+`
        self.ports_seen: list[int] = []  # every server's port, in start order (sim-<i> names)
        self.commands: queue.Queue[str] = queue.Queue()
        self.kv_ports: dict[int, tuple[int, int]] = {}  # server port -> (KV-event PUB port, replay port)
        self._tty: list[Any] | None = None  # saved terminal attributes while keys are read
        dialect = BY_NAME.get(args.example)
        self.example: StackExample | None = dialect.example if dialect is not None else None

    def step(self, msg: str) -> None:
        print(f"  ... {msg}", flush=True)

    def start(self) -> None:
        a = self.args
        ports = [self._sim_port(i) for i in range(a.servers)]
        for port, what in [(p, "modelsim") for p in ports] + [
            (a.grpc_port, "Pointsman gRPC"), (a.listen_port, "Envoy listener"), (a.admin_port, "Envoy admin"),
            (a.metrics_port, "Pointsman metrics"), (a.grpc_health_port, "Pointsman health"),
        ]:
            _check_free(port, what)
        print("Starting the Pointsman local stack", flush=True)
        self._start_fleet(ports)
        self.active = list(ports)
        self.write_endpoints()
        eps_file = self.eps_file
        source = ["--endpoints-file", str(eps_file), "--pool-name", "default"]
        fragments = None
        example = self.example
        if example is not None:  # a routing dialect's example: route documents over the servers
            from epp.envoy_config.providers import fragments_from_files

            routes = self.dir / "routes.yaml"
            routes.write_text(example.routes(ports, MODEL))
            source = ["--routes-file", str(routes)]
            if example.pools is not None:  # its backends are pools of the endpoints file
                source = ["--endpoints-file", str(eps_file), *source]
            fragments = fragments_from_files([routes])[0]
            self.step(f"routes: {routes} ({example.describe()})")
        workers = f" ({a.workers} workers)" if a.workers > 1 else ""
        self.step(f"Pointsman{workers}: ext_proc on :{a.grpc_port}, metrics on :{a.metrics_port}")
        cmd = [_bin("epp"), "serve", "--grpc-host", "127.0.0.1", "--grpc-port", str(a.grpc_port),
               "--grpc-health-port", str(a.grpc_health_port), "--metrics-port", str(a.metrics_port),
               *source, "--log-decisions"]
        config = a.config_file or (str(PRECISE_PROFILE) if a.kv_events else None)
        if config:
            cmd += ["--config-file", config]
        if getattr(a, "shadow_config", None):
            cmd += ["--shadow-config", a.shadow_config, "--decision-header", "x-pointsman-decision"]
        if a.workers > 1:
            cmd += ["--workers", str(a.workers)]
        epp = self._spawn("epp", cmd, capture=True)
        wait_port(a.grpc_port, proc=epp, what="Pointsman")
        # EDS keeps one pool ("default") current; the examples' pools are listed statically.
        eds = a.variant == "override-host" and a.example == "pool"
        self.step(f"Envoy ({a.variant}{', endpoints by EDS from Pointsman' if eds else ''}): "
                  f"listener :{a.listen_port}, admin :{a.admin_port}")
        from epp.envoy_config import EnvoyConfigSpec, render_yaml

        spec = EnvoyConfigSpec(variant=a.variant, listen_port=a.listen_port, admin_port=a.admin_port,
                               epp_port=a.grpc_port, eds=eds, pool_name="default",
                               endpoints=[] if eds else [("127.0.0.1", p) for p in ports],
                               route_fragments=fragments, epp_workers=a.workers)
        cfg = self.dir / "envoy.yaml"
        cfg.write_text(render_yaml(spec))
        envoy = self._spawn("envoy", [_bin("envoy"), "-c", str(cfg), "--concurrency", "2", "--use-dynamic-base-id",
                                      "--log-level", "warning", "--log-path", str(self.dir / "envoy.log")])
        wait_port(a.listen_port, proc=envoy, what="Envoy")
        url = f"http://127.0.0.1:{a.listen_port}"
        if example is not None:
            print(example.ready(url, a.grpc_port, a.metrics_port, _bin("epp"), MODEL), flush=True)
            return
        print(f"""
Ready. Send requests to {url}, for example:

  curl -s {url}/v1/chat/completions -H 'content-type: application/json' \\
    -d '{{"model": "{MODEL}", "messages": [{{"role": "user", "content": "Hello!"}}]}}'

  curl -sN {url}/v1/completions -H 'content-type: application/json' \\
    -d '{{"model": "{ADAPTER}", "prompt": "SELECT", "max_tokens": 8, "stream": true}}'

Explain a decision:  {_bin('epp')} explain --addr 127.0.0.1:{a.grpc_port} --body '{{"model": "{MODEL}", "messages": [{{"role": "user", "content": "hi"}}]}}'
Dashboard:           http://127.0.0.1:{a.metrics_port}/   (fleet, decisions, explain, charts, config)
Pointsman metrics:   http://127.0.0.1:{a.metrics_port}/metrics      Files: {self.dir}
{self._fleet_help(eds)}""", flush=True)

    def _start_fleet(self, ports: list[int]) -> None:
        """The simulated servers, publishing KV events (with --kv-events) on ports of their own."""
        a = self.args
        self.step(f"modelsim: {a.servers} simulated vLLM servers on ports {', '.join(map(str, ports))} ({MODEL})")
        sim = self._spawn("modelsim", [_bin("modelsim"), "--servers", str(a.servers), "--ports",
                                       ",".join(map(str, ports)), "--model", MODEL, "--lora", ADAPTER,
                                       "--time-scale", str(a.time_scale), *self._kv_flags(ports)])
        if a.kv_events:
            pubs = ", ".join(f"{p}->{self.kv_ports[p][0]}" for p in ports)
            self.step(f"KV events: each server publishes (server->port: {pubs}) and replays; Pointsman subscribes")
        for p in ports:
            wait_port(p, proc=sim, what="modelsim")

    def _fleet_help(self, eds: bool) -> str:
        if not eds:
            return "The fleet is fixed with --variant original-dst (Envoy has no endpoint list to update).\n"
        return (f"Change the fleet live: + adds a simulated server, - removes one (or edit {self.eps_file};\n"
                f"Envoy follows through EDS, no restart).\n")

    # ---- the fleet, live -----------------------------------------------------------------------------------
    def _sim_port(self, index: int) -> int:
        """Server i's port: base + i, or one the OS picks on its own with --sim-base-port 0."""
        return self.args.sim_base_port + index if self.args.sim_base_port else free_port()

    def _kv_flags(self, ports: list[int]) -> list[str]:
        """modelsim's flags for its servers' KV-event sockets: two free ports per server (PUB, replay)."""
        if not self.args.kv_events:
            return []
        for p in ports:
            self.kv_ports[p] = (free_port(), free_port())
        return ["--kv-events-ports", ",".join(str(self.kv_ports[p][0]) for p in ports),
                "--kv-events-replay-ports", ",".join(str(self.kv_ports[p][1]) for p in ports)]

    def _endpoint(self, port: int) -> dict[str, Any]:
        ep: dict[str, Any] = {"address": "127.0.0.1", "port": port, "name": self._name(port), "models": [MODEL, ADAPTER]}
        kv = self.kv_ports.get(port)
        if kv is not None:
            ep["kvEvents"] = {"endpoint": f"tcp://127.0.0.1:{kv[0]}", "replay": f"tcp://127.0.0.1:{kv[1]}"}
        return ep

    def _name(self, port: int) -> str:
        return f"sim-{self.ports_seen.index(port)}"

    def write_endpoints(self) -> None:
        """Rewrite the endpoints file atomically (Pointsman polls it; a half-written file is never read)."""
        for p in self.active:
            if p not in self.ports_seen:
                self.ports_seen.append(p)
        eps = {"pools": [{"name": "default", "endpoints": [self._endpoint(p) for p in self.active]}],
               "adapters": {ADAPTER: MODEL}}
        example = self.example
        if example is not None and example.pools is not None:  # the example's backends (e.g. InferenceServices)
            eps["pools"] = example.pools(self.active, self._endpoint)
        tmp = self.eps_file.with_suffix(".tmp")
        tmp.write_text(yaml.safe_dump(eps, sort_keys=False))
        tmp.replace(self.eps_file)

    def add_server(self) -> str:
        a = self.args
        if self.spare:
            port = self.spare.pop()
        else:
            port = max(self.ports_seen) + 1 if a.sim_base_port else free_port()
            _check_free(port, "a new modelsim server")
            sim = self._spawn(f"modelsim-{port}", [
                _bin("modelsim"), "--servers", "1", "--base-port", str(port), "--model", MODEL, "--lora", ADAPTER,
                "--time-scale", str(a.time_scale), *self._kv_flags([port])])
            wait_port(port, proc=sim, what="modelsim")
        self.active.append(port)
        self.write_endpoints()
        return f"added {self._name(port)} on :{port} ({len(self.active)} in the pool)"

    def remove_server(self) -> str:
        if len(self.active) <= 1:
            return "the pool keeps at least one server"
        port = self.active.pop()
        self.spare.append(port)  # keeps running: its in-flight requests finish; `+` brings it back
        self.write_endpoints()
        return f"removed {self._name(port)} (:{port}) from the pool ({len(self.active)} left)"

    def handle(self, command: str) -> str | None:
        cmd = command.strip().lower()
        if cmd in ("+", "add"):
            return self.add_server()
        if cmd in ("-", "remove"):
            return self.remove_server()
        return None if not cmd else f"unknown command {cmd!r}: + adds a server, - removes one"

    def read_commands(self) -> None:
        """Feed `+`/`-` from stdin into the command queue: single keys on a terminal, lines otherwise."""
        if self.args.variant != "override-host" or sys.stdin is None or sys.stdin.closed:
            return
        interactive = sys.stdin.isatty() and sys.stdout.isatty()
        if interactive:
            import termios
            import tty

            fd = sys.stdin.fileno()
            self._tty = [fd, termios.tcgetattr(fd)]
            tty.setcbreak(fd)  # keys without Enter; Ctrl-C still interrupts
        threading.Thread(target=self._read_stdin, args=(interactive,), daemon=True).start()

    def _read_stdin(self, keys: bool) -> None:
        try:
            while True:
                data = sys.stdin.read(1) if keys else sys.stdin.readline()
                if not data:
                    return
                if data.strip():
                    self.commands.put(data)
        except (OSError, ValueError):
            return

    def _restore_terminal(self) -> None:
        if self._tty is not None:
            import termios

            termios.tcsetattr(self._tty[0], termios.TCSADRAIN, self._tty[1])
            self._tty = None

    def _spawn(self, name: str, cmd: list[str], capture: bool = False) -> subprocess.Popen[bytes]:
        log = open(self.dir / f"{name}.log", "wb")  # noqa: SIM115 - lives as long as the process
        proc = subprocess.Popen(cmd, stdout=log if not capture else subprocess.PIPE, stderr=subprocess.STDOUT,
                                start_new_session=True, preexec_fn=die_with_parent)
        self.procs.append((name, proc))
        if capture:
            threading.Thread(target=self._tail, args=(proc, log), daemon=True).start()
        return proc

    def _tail(self, proc: subprocess.Popen[bytes], log: IO[bytes]) -> None:
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
            self._run_commands(until=time.monotonic() + 1.0)
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

    def _run_commands(self, until: float) -> None:
        """Apply fleet commands as they come, until `until` (the next live-view tick)."""
        while (left := until - time.monotonic()) > 0:
            try:
                cmd = self.commands.get(timeout=left)
            except queue.Empty:
                return
            try:
                msg = self.handle(cmd)
            except (RuntimeError, TimeoutError) as e:
                msg = f"cannot add a server: {e}"
            if msg:
                print(f"  fleet  {msg}", flush=True)

    def stop(self) -> None:
        self._restore_terminal()
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


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def stack_command(args: argparse.Namespace) -> int:
    stack = LocalStack(args)
    signal.signal(signal.SIGTERM, _interrupt)  # a TERM stops the whole stack too, never orphans it
    try:
        stack.start()
        stack.read_commands()
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
