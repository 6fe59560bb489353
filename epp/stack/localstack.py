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

import queue
import signal
import socket
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc
import yaml

from epp.api.pb import pointsman_pb2 as api
from epp.api.pb import pointsman_pb2_grpc
from epp.routing import StackExample
from epp.routing.dialects import BY_NAME
from epp.stack.children import Children
from epp.stack.keys import Keys
from epp.stack.natsd import start_nats_server
from epp.stack.ports import free_port, wait_port
from epp.stack.settings import StackSettings

if TYPE_CHECKING:
    from epp.envoy_config import RouteFragments

MODEL = "meta-llama/Llama-3.1-8B"
ADAPTER = "sql-lora"


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
    def __init__(self, settings: StackSettings) -> None:
        self.settings = settings
        self.dir = Path(tempfile.mkdtemp(prefix="pointsman-stack-"))
        self.children = Children(self.dir)  # modelsim, Pointsman, Envoy
        self.eps_file = self.dir / "endpoints.yaml"
        self.active: list[int] = []  # simulated servers in the pool (ports), in the endpoints file
        self.spare: list[int] = []  # running servers taken out of the pool, reused first by `+`
        self.ports_seen: list[int] = []  # every server's port, in start order (sim-<i> names)
        self.keys = Keys()  # fleet commands from stdin
        self.kv_ports: dict[int, tuple[int, int]] = {}  # server port -> (KV-event PUB port, replay port)
        dialect = BY_NAME.get(settings.example)
        self.example: StackExample | None = dialect.example if dialect is not None else None

    def step(self, msg: str) -> None:
        print(f"  ... {msg}", flush=True)

    def start(self) -> None:
        a = self.settings
        ports = [self._sim_port(i) for i in range(a.servers)]
        for port, what in [(p, "modelsim") for p in ports] + [
            (a.grpc_port, "Pointsman gRPC"), (a.listen_port, "Envoy listener"), (a.admin_port, "Envoy admin"),
            (a.metrics_port, "Pointsman metrics"), (a.grpc_health_port, "Pointsman health"),
            *([(a.nats_port, "nats-server")] if a.bus == "nats" else []),
        ]:
            _check_free(port, what)
        print("Starting the Pointsman local stack", flush=True)
        self._start_fleet(ports)
        self.active = list(ports)
        self.write_endpoints()
        source, fragments = self._routes(ports)
        if a.bus == "nats":
            self.step(f"nats-server on :{a.nats_port} (the replica bus)")
            source += ["--bus-url", start_nats_server(self.children, a.nats_port, self.dir)]
        self._start_pointsman(source)
        # EDS keeps one pool ("default") current; the examples' pools are listed statically.
        eds = a.variant == "override-host" and a.example == "pool"
        self._start_envoy(ports, eds, fragments)
        print(self._ready(eds), flush=True)

    def _routes(self, ports: list[int]) -> tuple[list[str], RouteFragments | None]:
        """Pointsman's source flags, and the Envoy fragments of the example's route documents (None: one pool)."""
        eps_file = self.eps_file
        source = ["--endpoints-file", str(eps_file), "--pool-name", "default"]
        fragments: RouteFragments | None = None
        example = self.example
        if example is not None:  # a routing dialect's example: route documents over the servers
            from epp.envoy_config import fragments_from_files

            routes = self.dir / "routes.yaml"
            routes.write_text(example.routes(ports, MODEL))
            source = ["--routes-file", str(routes)]
            if example.pools is not None:  # its backends are pools of the endpoints file
                source = ["--endpoints-file", str(eps_file), *source]
            fragments = fragments_from_files([routes])[0]
            self.step(f"routes: {routes} ({example.describe()})")
        return source, fragments

    def _start_pointsman(self, source: list[str]) -> None:
        a = self.settings
        workers = f" ({a.workers} workers)" if a.workers > 1 else ""
        self.step(f"Pointsman{workers}: ext_proc on :{a.grpc_port}, metrics on :{a.metrics_port}")
        cmd = [_bin("epp"), "serve", "--grpc-host", "127.0.0.1", "--grpc-port", str(a.grpc_port),
               "--grpc-health-port", str(a.grpc_health_port), "--metrics-port", str(a.metrics_port),
               *source, "--log-decisions",
               "--secure-serving=false"]  # loopback only: Envoy, `epp explain` and the fleet view talk plaintext
        config = a.config_file or (str(PRECISE_PROFILE) if a.kv_events else None)
        if config:
            cmd += ["--config-file", config]
        if a.shadow_config:
            cmd += ["--shadow-config", a.shadow_config, "--decision-header", "x-pointsman-decision"]
        if a.workers > 1:
            cmd += ["--workers", str(a.workers)]
        epp = self.children.spawn("epp", cmd, capture=True)
        # every port it serves, not only the first: it binds the health and metrics ports after the gRPC one, and a
        # port it cannot bind ends it (then the stack says so here instead of printing "Ready.")
        for port in (a.grpc_port, a.grpc_health_port, a.metrics_port):
            if port:
                wait_port(port, proc=epp, what="Pointsman")

    def _start_envoy(self, ports: list[int], eds: bool, fragments: RouteFragments | None) -> None:
        a = self.settings
        self.step(f"Envoy ({a.variant}{', endpoints by EDS from Pointsman' if eds else ''}): "
                  f"listener :{a.listen_port}, admin :{a.admin_port}")
        from epp.envoy_config import EnvoyConfigSpec, render_yaml

        spec = EnvoyConfigSpec(variant=a.variant, listen_port=a.listen_port, admin_port=a.admin_port,
                               epp_port=a.grpc_port, eds=eds, pool_name="default",
                               endpoints=[] if eds else [("127.0.0.1", p) for p in ports],
                               route_fragments=fragments, epp_workers=a.workers)
        cfg = self.dir / "envoy.yaml"
        cfg.write_text(render_yaml(spec))
        envoy = self.children.spawn("envoy", [
            _bin("envoy"), "-c", str(cfg), "--concurrency", "2", "--use-dynamic-base-id", "--log-level", "warning",
            "--log-path", str(self.dir / "envoy.log")])
        wait_port(a.listen_port, proc=envoy, what="Envoy")

    def _ready(self, eds: bool) -> str:
        """Where to send requests, and what to try."""
        a = self.settings
        url = f"http://127.0.0.1:{a.listen_port}"
        if self.example is not None:
            return self.example.ready(url, a.grpc_port, a.metrics_port, _bin("epp"), MODEL)
        return f"""
Ready. Send requests to {url}, for example:

  curl -s {url}/v1/chat/completions -H 'content-type: application/json' \\
    -d '{{"model": "{MODEL}", "messages": [{{"role": "user", "content": "Hello!"}}]}}'

  curl -sN {url}/v1/completions -H 'content-type: application/json' \\
    -d '{{"model": "{ADAPTER}", "prompt": "SELECT", "max_tokens": 8, "stream": true}}'

Explain a decision:  {_bin('epp')} explain --addr 127.0.0.1:{a.grpc_port} --body '{{"model": "{MODEL}", "messages": [{{"role": "user", "content": "hi"}}]}}'
Dashboard:           http://127.0.0.1:{a.metrics_port}/   (fleet, decisions, explain, charts, config)
Pointsman metrics:   http://127.0.0.1:{a.metrics_port}/metrics      Files: {self.dir}
{self._fleet_help(eds)}"""

    def _start_fleet(self, ports: list[int]) -> None:
        """The simulated servers, publishing KV events (with --kv-events) on ports of their own."""
        a = self.settings
        self.step(f"modelsim: {a.servers} simulated vLLM servers on ports {', '.join(map(str, ports))} ({MODEL})")
        sim = self.children.spawn("modelsim", [_bin("modelsim"), "--servers", str(a.servers), "--ports",
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
        return self.settings.sim_base_port + index if self.settings.sim_base_port else free_port()

    def _kv_flags(self, ports: list[int]) -> list[str]:
        """modelsim's flags for its servers' KV-event sockets: two free ports per server (PUB, replay)."""
        if not self.settings.kv_events:
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
        a = self.settings
        if self.spare:
            port = self.spare.pop()
        else:
            port = max(self.ports_seen) + 1 if a.sim_base_port else free_port()
            _check_free(port, "a new modelsim server")
            sim = self.children.spawn(f"modelsim-{port}", [
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
        """Feed `+`/`-` from stdin into the command queue (only the EDS variant can change the fleet live)."""
        if self.settings.variant == "override-host":
            self.keys.start()

    def watch(self) -> None:
        a = self.settings
        stub = pointsman_pb2_grpc.PointsmanStub(grpc.insecure_channel(f"127.0.0.1:{a.grpc_port}"))
        deadline = time.monotonic() + a.duration if a.duration else None
        while deadline is None or time.monotonic() < deadline:
            self._run_commands(until=time.monotonic() + 1.0)
            self.children.check()
            if a.quiet:
                continue
            for d in self.children.recent_decisions():
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
                cmd = self.keys.commands.get(timeout=left)
            except queue.Empty:
                return
            try:
                msg = self.handle(cmd)
            except (RuntimeError, TimeoutError) as e:
                msg = f"cannot add a server: {e}"
            if msg:
                print(f"  fleet  {msg}", flush=True)

    def stop(self) -> None:
        self.keys.restore()
        self.children.stop()


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def stack_command(settings: StackSettings) -> int:
    stack = LocalStack(settings)
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
