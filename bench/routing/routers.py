"""Router adapters: each starts a router in front of a running modelsim fleet and returns its base URL.

An adapter is `async start(fleet, workdir) -> Launched`; `Launched.stop()` ends every process it started.
Adapters raise `Unavailable` when their binary is missing, so the runner can skip them.

Pointsman hook: `start_pointsman` renders an endpoints file, asks `epp envoy-config` for an Envoy
bootstrap and runs `epp serve` + Envoy from the command templates `POINTSMAN_EPP_SERVE` and
`POINTSMAN_ENVOY_CONFIG` below. Adjust the templates (or set POINTSMAN_EPP to the epp command) as the
epp CLI evolves.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from bench.routing.procs import ROOT, Proc, free_ports, wait_http, wait_tcp


class Unavailable(RuntimeError):
    """The router's binary is not installed; the runner skips it."""


@dataclass
class FleetInfo:
    urls: list[str]
    model: str
    kv_event_endpoints: list[str] = field(default_factory=list)  # tcp://127.0.0.1:port per server
    oracle_url: str | None = None  # modelsim's in-process oracle router (--oracle-port)
    time_scale: float = 1.0  # wall seconds per model second
    max_num_seqs: int = 16
    kv_replay_endpoints: list[str] = field(default_factory=list)  # the KV events' replay (ROUTER) sockets
    engine_type: str = "vllm"  # the servers' metrics flavour (the endpoints' llm-d.ai/engine-type label)


@dataclass
class Launched:
    url: str
    procs: list[Proc] = field(default_factory=list)

    def stop(self) -> None:
        for p in reversed(self.procs):
            p.stop()


Adapter = Callable[[FleetInfo, Path], Awaitable[Launched]]


def _bin(name: str) -> str:
    here = Path(sys.executable).parent / name
    if here.exists():
        return str(here)
    found = shutil.which(name)
    if found is None:
        raise Unavailable(f"{name} not found (pip install {name.replace('-', '-')} in this venv)")
    return found


async def _started(name: str, argv: list[str], workdir: Path, ready_url: str, port: int,
                   timeout: float = 30.0) -> Launched:
    proc = Proc(name, argv, workdir)
    try:
        await wait_http(ready_url, proc, timeout)
    except BaseException:
        proc.stop()
        raise
    return Launched(f"http://127.0.0.1:{port}", [proc])


async def start_direct(fleet: FleetInfo, workdir: Path) -> Launched:
    """No router: the first server (only meaningful for a one-server fleet)."""
    return Launched(fleet.urls[0])


def render_envoy_rr(fleet: FleetInfo, listen_port: int, admin_port: int) -> str:
    tmpl = (Path(__file__).parent / "envoy-rr.yaml.tmpl").read_text()
    eps = []
    for u in fleet.urls:
        host, port = u.rsplit("//", 1)[1].rsplit(":", 1)
        eps.append(f"        - endpoint: {{address: {{socket_address: {{address: {host}, port_value: {port}}}}}}}")
    return tmpl.format(listen_port=listen_port, admin_port=admin_port, endpoints="\n".join(eps))


async def _start_envoy(name: str, cfg_path: Path, workdir: Path, listen: int, admin: int) -> Proc:
    envoy = _bin("envoy")
    base_id = free_ports(1)[0]
    proc = Proc(name, [envoy, "-c", str(cfg_path), "--concurrency", "2", "--base-id", str(base_id),
                       "--disable-hot-restart", "-l", "warning"], workdir)
    try:
        await wait_http(f"http://127.0.0.1:{admin}/ready", proc, 30.0)
    except BaseException:
        proc.stop()
        raise
    return proc


async def start_envoy_rr(fleet: FleetInfo, workdir: Path) -> Launched:
    listen, admin = free_ports(2)
    cfg = workdir / "envoy-rr.yaml"
    cfg.write_text(render_envoy_rr(fleet, listen, admin))
    proc = await _start_envoy("envoy-rr", cfg, workdir, listen, admin)
    return Launched(f"http://127.0.0.1:{listen}", [proc])


async def start_vllm_router(fleet: FleetInfo, workdir: Path, policy: str = "cache_aware") -> Launched:
    exe = _bin("vllm-router")
    port, prom = free_ports(2)
    argv = [exe, "--host", "127.0.0.1", "--port", str(port), "--policy", policy, "--worker-urls", *fleet.urls,
            "--prometheus-host", "127.0.0.1", "--prometheus-port", str(prom), "--log-level", "warning",
            "--max-concurrent-requests", "100000", "--queue-size", "100000", "--request-timeout-secs", "600",
            "--disable-retries", "--disable-circuit-breaker"]
    if policy == "kv_aware":
        if not fleet.kv_event_endpoints:
            raise Unavailable("kv_aware needs the fleet's KV events (--kv-events-port)")
        for u, ep in zip(fleet.urls, fleet.kv_event_endpoints, strict=True):
            argv += ["--kv-event-source", f"{u}={ep}"]
        argv += ["--kv-event-model", fleet.model, "--kv-event-block-size", "16"]
    return await _started(f"vllm-router-{policy}", argv, workdir, f"http://127.0.0.1:{port}/health", port)


async def start_vllm_router_kv(fleet: FleetInfo, workdir: Path) -> Launched:
    return await start_vllm_router(fleet, workdir, "kv_aware")


async def start_sglang_router(fleet: FleetInfo, workdir: Path) -> Launched:
    exe = _bin("sglang-router")
    port, prom = free_ports(2)
    argv = [exe, "launch", "--host", "127.0.0.1", "--port", str(port), "--policy", "cache_aware",
            "--worker-urls", *fleet.urls, "--prometheus-host", "127.0.0.1", "--prometheus-port", str(prom),
            "--log-level", "warn"]
    return await _started("sglang-router", argv, workdir, f"http://127.0.0.1:{port}/health", port)


async def start_oracle(fleet: FleetInfo, workdir: Path) -> Launched:
    """modelsim's in-process oracle router: exact state, no extra hop."""
    if fleet.oracle_url is None:
        raise Unavailable("the fleet was started without --oracle-port")
    await wait_http(f"{fleet.oracle_url}/health", None, 30.0)
    return Launched(fleet.oracle_url)


async def start_oracle_proxy(fleet: FleetInfo, workdir: Path) -> Launched:
    """The HTTP-proxy oracle (bench/routing/oracle.py): probes /admin/fleet/probe per request."""
    (port,) = free_ports(1)
    argv = [sys.executable, "-m", "bench.routing.oracle", "--port", str(port)]
    for u in fleet.urls:
        argv += ["--backend", u]
    return await _started("oracle-proxy", argv, workdir, f"http://127.0.0.1:{port}/health", port)


# ---- Pointsman (epp behind Envoy) ------------------------------------------------------------------
# HOOK: fill in / adjust as the epp CLI settles. Placeholders: {epp} (the epp command, from $POINTSMAN_EPP
# or `epp` on PATH or `python -m epp.cmd.cli`), {grpc_port}, {health_port}, {metrics_port}, {endpoints_file},
# {listen_port}, {admin_port}, {envoy_config}, {extra} ($POINTSMAN_EPP_ARGS, e.g. a --config-file).
POINTSMAN_ENVOY_CONFIG = ("{epp} envoy-config --variant override-host --listen-port {listen_port} "
                          "--admin-port {admin_port} --epp 127.0.0.1:{grpc_port} "
                          "--endpoints-file {endpoints_file} --response-phases {phases} --epp-tls=false -o {envoy_config}")
POINTSMAN_EPP_SERVE = ("{epp} serve --secure-serving=false --grpc-host 127.0.0.1 --grpc-port {grpc_port} --grpc-health-port {health_port} "
                       "--metrics-port {metrics_port} --endpoints-file {endpoints_file} {extra}")


def _epp_command() -> str:
    env = os.environ.get("POINTSMAN_EPP")
    if env:
        return env
    exe = Path(sys.executable).parent / "epp"
    if exe.exists():
        return str(exe)
    if shutil.which("epp"):
        return "epp"
    probe = subprocess.run([sys.executable, "-c", "import epp.cmd.cli"], cwd=str(ROOT), capture_output=True,
                           env={**os.environ, "PYTHONPATH": str(ROOT)})
    if probe.returncode == 0:
        return f"{shlex.quote(sys.executable)} -c 'import sys; from epp.cmd.cli import main; sys.exit(main())'"
    raise Unavailable("epp is not available (no POINTSMAN_EPP, no `epp` on PATH, `import epp.cmd.cli` fails)")


def write_endpoints_file(fleet: FleetInfo, path: Path, kv_events: bool = False) -> None:
    eps = []
    for i, u in enumerate(fleet.urls):
        host, port = u.rsplit("//", 1)[1].rsplit(":", 1)
        ep: dict[str, object] = {"address": host, "port": int(port), "name": f"modelsim-{i}", "models": [fleet.model]}
        if fleet.engine_type != "vllm":
            ep["labels"] = {"llm-d.ai/engine-type": fleet.engine_type}
        if kv_events and fleet.kv_event_endpoints:
            kv = {"endpoint": fleet.kv_event_endpoints[i]}
            if fleet.kv_replay_endpoints:
                kv["replay"] = fleet.kv_replay_endpoints[i]
            ep["kvEvents"] = kv
        eps.append(ep)
    path.write_text(yaml.safe_dump({"pools": [{"name": "default", "namespace": "default", "endpoints": eps}]}))


BEST_PROFILE = ROOT / "deploy" / "profiles" / "estimated-latency.yaml"


def write_best_profile(fleet: FleetInfo, path: Path, prefix_source: str | None = None) -> Path:
    """deploy/profiles/estimated-latency.yaml with its engine timings in this fleet's wall-clock seconds (and, when
    given, its prefixSource: approximate or precise)."""
    doc = yaml.safe_load(BEST_PROFILE.read_text())
    params = doc["plugins"][0]["parameters"]
    if prefix_source is not None:
        params["prefixSource"] = prefix_source
    params["prefillSecondsPerToken"] *= fleet.time_scale
    params["overheadSeconds"] *= fleet.time_scale
    params["interTokenSeconds"] *= fleet.time_scale
    params["maxNumSeqs"] = fleet.max_num_seqs
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


GIE_DEFAULT_PROFILE = ROOT / "deploy" / "profiles" / "gie-default.yaml"
POINTSMAN_BASES = ("pointsman", "pointsman-best", "pointsman-approx", "pointsman-precise", "pointsman-gie",
                   "pointsman-kv")


def write_default_profile(path: Path, prefix_source: str) -> Path:
    """deploy/profiles/estimated-latency.yaml as shipped (Pointsman's default: reference timings, learnt online)
    with its prefixSource set."""
    doc = yaml.safe_load(BEST_PROFILE.read_text())
    doc["plugins"][0]["parameters"]["prefixSource"] = prefix_source
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def pointsman_base_args(base: str, fleet: FleetInfo, workdir: Path, tag: str | None = None) -> tuple[str, bool]:
    """The `epp serve` flags of a Pointsman router in POINTSMAN_BASES (plus $POINTSMAN_EPP_ARGS), and whether it
    subscribes to the engines' KV events. Profiles are written to `workdir` as `<tag>-profile.yaml`."""
    env = os.environ.get("POINTSMAN_EPP_ARGS", "")
    tag = tag or base
    if base == "pointsman":
        return env, False
    if base == "pointsman-gie":
        # GIE's default profile (queue ×2, KV ×2, prefix ×3), Pointsman's own default until this benchmark
        return f"--config-file {GIE_DEFAULT_PROFILE} {env}", False
    if base == "pointsman-kv":
        # the default (reference timings, learnt from the engines) on the engines' KV events
        profile = write_default_profile(workdir / f"{tag}-profile.yaml", "precise")
        return f"--config-file {profile} {env}", True
    # the estimated-latency profile with the fleet's timings: on the approximate index (Pointsman's own past
    # picks; `pointsman-best` is the same) or the precise one (the engines' KV events, subscribed from the endpoints
    # file; requests tokenized by the engine's /tokenize, Pointsman's default without a local tokenizer)
    source = {"pointsman-best": None, "pointsman-approx": "approximate", "pointsman-precise": "precise"}.get(base, "")
    if source == "":
        raise ValueError(f"unknown Pointsman base {base!r}; choose from {', '.join(POINTSMAN_BASES)}")
    profile = write_best_profile(fleet, workdir / f"{tag}-profile.yaml", source)
    return f"--config-file {profile} {env}", base == "pointsman-precise"


async def start_pointsman_base(base: str, fleet: FleetInfo, workdir: Path) -> Launched:
    extra, kv_events = pointsman_base_args(base, fleet, workdir)
    return await start_pointsman(fleet, workdir, extra=extra, kv_events=kv_events)


async def start_pointsman_best(fleet: FleetInfo, workdir: Path) -> Launched:
    """Pointsman with its best profile: the estimated-latency scorer with the fleet's engine timings."""
    return await start_pointsman_base("pointsman-best", fleet, workdir)


async def start_pointsman_approx(fleet: FleetInfo, workdir: Path) -> Launched:
    return await start_pointsman_base("pointsman-approx", fleet, workdir)


async def start_pointsman_precise(fleet: FleetInfo, workdir: Path) -> Launched:
    return await start_pointsman_base("pointsman-precise", fleet, workdir)


async def start_pointsman_gie(fleet: FleetInfo, workdir: Path) -> Launched:
    return await start_pointsman_base("pointsman-gie", fleet, workdir)


async def start_pointsman_kv(fleet: FleetInfo, workdir: Path) -> Launched:
    return await start_pointsman_base("pointsman-kv", fleet, workdir)


async def start_pointsman(fleet: FleetInfo, workdir: Path, extra: str | None = None,
                          kv_events: bool = False, env: dict[str, str] | None = None) -> Launched:
    epp = _epp_command()
    grpc, health, metrics, listen, admin = free_ports(5)
    endpoints, envoy_cfg = workdir / "pointsman-endpoints.yaml", workdir / "pointsman-envoy.yaml"
    write_endpoints_file(fleet, endpoints, kv_events)
    values = {"epp": epp, "grpc_port": grpc, "health_port": health, "metrics_port": metrics,
              "endpoints_file": endpoints, "listen_port": listen, "admin_port": admin, "envoy_config": envoy_cfg,
              "extra": os.environ.get("POINTSMAN_EPP_ARGS", "") if extra is None else extra,
              "phases": os.environ.get("POINTSMAN_RESPONSE_PHASES", "lean")}
    rendered = subprocess.run(POINTSMAN_ENVOY_CONFIG.format(**values), shell=True, cwd=str(workdir),
                              capture_output=True, timeout=60,
                              env={**os.environ, "PYTHONPATH": str(ROOT)})
    if rendered.returncode != 0:
        raise Unavailable(f"`epp envoy-config` failed: {rendered.stderr.decode(errors='replace')[-800:]}")
    epp_proc = Proc("pointsman-epp", ["/bin/sh", "-c", "exec " + POINTSMAN_EPP_SERVE.format(**values)], workdir,
                    env=env)
    try:
        await wait_tcp(grpc, epp_proc, 30.0)
        envoy = await _start_envoy("pointsman-envoy", envoy_cfg, workdir, listen, admin)
    except BaseException:
        epp_proc.stop()
        raise
    return Launched(f"http://127.0.0.1:{listen}", [epp_proc, envoy])


async def start_pointsman_replicas(fleet: FleetInfo, workdir: Path, *, replicas: int = 2, bus: bool = True,
                                   workers: int = 1) -> Launched:
    """Several Pointsman replicas (`epp serve` processes) behind one Envoy whose `epp` cluster lists them all, so
    each decides 1/replicas of the requests; with `bus` they share load and routing state over the replica bus,
    without it each routes on its own view (what a second GIE EPP replica does). `workers` > 1: one replica with
    that many worker processes instead (`epp serve --workers N`)."""
    epp = _epp_command()
    endpoints, envoy_cfg = workdir / "pointsman-endpoints.yaml", workdir / "pointsman-envoy.yaml"
    write_endpoints_file(fleet, endpoints)
    ports = free_ports(2 + 4 * replicas)  # one draw: ports of separate draws could collide
    listen, admin = ports[:2]
    extra = os.environ.get("POINTSMAN_EPP_ARGS", "")
    bus_ports = ports[2:2 + replicas]
    peers = ",".join(f"127.0.0.1:{p}" for p in bus_ports)
    procs: list[Proc] = []
    grpcs: list[int] = []
    try:
        for i in range(replicas):
            grpc, health, metrics = ports[2 + replicas + 3 * i:5 + replicas + 3 * i]
            values = {"epp": epp, "grpc_port": grpc, "health_port": health, "metrics_port": metrics,
                      "endpoints_file": endpoints, "extra": extra}
            cmd = POINTSMAN_EPP_SERVE.format(**values)
            if bus and replicas > 1:
                cmd += f" --bus-address 127.0.0.1 --bus-port {bus_ports[i]} --bus-peers {peers}"
            if workers > 1:
                cmd += f" --workers {workers}"
            procs.append(Proc(f"pointsman-epp-{i}", ["/bin/sh", "-c", "exec " + cmd], workdir))
            grpcs.append(grpc)
        epps = " ".join(f"--epp 127.0.0.1:{g}" for g in grpcs)
        rendered = subprocess.run(
            f"{epp} envoy-config --variant override-host --listen-port {listen} --admin-port {admin} {epps} "
            f"--epp-workers {workers} --endpoints-file {endpoints} --epp-tls=false "
            f"--response-phases {os.environ.get('POINTSMAN_RESPONSE_PHASES', 'lean')} -o {envoy_cfg}",
            shell=True, cwd=str(workdir), capture_output=True, timeout=60, env={**os.environ, "PYTHONPATH": str(ROOT)})
        if rendered.returncode != 0:
            raise Unavailable(f"`epp envoy-config` failed: {rendered.stderr.decode(errors='replace')[-800:]}")
        for proc, grpc in zip(procs, grpcs, strict=True):
            await wait_tcp(grpc, proc, 30.0)
        procs.append(await _start_envoy("pointsman-envoy", envoy_cfg, workdir, listen, admin))
    except BaseException:
        for p in reversed(procs):
            p.stop()
        raise
    return Launched(f"http://127.0.0.1:{listen}", procs)


async def start_pointsman_2r_bus(fleet: FleetInfo, workdir: Path) -> Launched:
    return await start_pointsman_replicas(fleet, workdir, replicas=2, bus=True)


async def start_pointsman_2r_nobus(fleet: FleetInfo, workdir: Path) -> Launched:
    return await start_pointsman_replicas(fleet, workdir, replicas=2, bus=False)


async def start_pointsman_2w(fleet: FleetInfo, workdir: Path) -> Launched:
    return await start_pointsman_replicas(fleet, workdir, replicas=1, workers=2)


ROUTERS: dict[str, Adapter] = {
    "envoy-rr": start_envoy_rr,
    "vllm-router": start_vllm_router,
    "vllm-router-kv": start_vllm_router_kv,
    "sglang-router": start_sglang_router,
    "pointsman": start_pointsman,
    "pointsman-gie": start_pointsman_gie,
    "pointsman-best": start_pointsman_best,
    "pointsman-approx": start_pointsman_approx,
    "pointsman-precise": start_pointsman_precise,
    "pointsman-kv": start_pointsman_kv,  # the default (timings learnt, not set) on the engines' KV events
    "pointsman-2r-bus": start_pointsman_2r_bus,  # 2 replicas sharing state over the replica bus
    "pointsman-2r-nobus": start_pointsman_2r_nobus,  # 2 replicas, each on its own view
    "pointsman-2w": start_pointsman_2w,  # 1 replica, 2 worker processes (epp serve --workers 2)
    "oracle": start_oracle,
    "oracle-proxy": start_oracle_proxy,
}
# pointsman-best is pointsman-approx (the same profile and index), so only the latter runs by default.
DEFAULT_ROUTERS = ["envoy-rr", "vllm-router", "vllm-router-kv", "sglang-router", "pointsman", "pointsman-gie",
                   "pointsman-approx", "pointsman-precise", "oracle"]
