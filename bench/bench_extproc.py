"""Proxy-path benchmark: Envoy direct vs Envoy + Pointsman vs vllm-router, interleaved in one run.

The backend is an Envoy with four direct_response listeners (a fixed JSON reply), so the numbers measure the
routing path, not a model. wrk sends the same ~120-byte chat POST at 1 and 16 connections. For every path and
round we record req/s and p50 latency; for Pointsman also its CPU time per request (utime+stime from /proc).
Medians over rounds are printed as a markdown table with ratios against Envoy direct.

    .venv/bin/python bench/bench_extproc.py --rounds 3 --duration 5 [--workers 1,2]
Needs wrk (Debian package `wrk`; installed with apt-get when missing) and, for the peer, `pip install vllm-router`.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from epp.envoy_config import EnvoyConfigSpec, render  # noqa: E402
from epp.ports import free_port, wait_port  # noqa: E402

BODY = '{"model":"meta-llama/Llama-3.1-8B","messages":[{"role":"user","content":"What is the capital of France?"}]}'
REPLY = '{"id":"x","object":"chat.completion","choices":[{"message":{"content":"Paris"}}],"usage":{"prompt_tokens":9,"completion_tokens":1}}'


def bin_path(name: str) -> str:
    local = Path(sys.executable).parent / name
    return str(local) if local.exists() else (shutil.which(name) or name)


def backend_config(ports: list[int], admin: int) -> dict:
    listeners = []
    for p in ports:
        hcm = {
            "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
            "stat_prefix": f"b{p}",
            "route_config": {"virtual_hosts": [{"name": "b", "domains": ["*"], "routes": [{
                "match": {"prefix": "/"},
                "direct_response": {"status": 200, "body": {"inline_string": REPLY}},
                "response_headers_to_add": [{"header": {"key": "content-type", "value": "application/json"}}],
            }]}]},
            "http_filters": [{"name": "envoy.filters.http.router", "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}],
        }
        listeners.append({"name": f"b{p}", "address": {"socket_address": {"address": "127.0.0.1", "port_value": p}},
                          "filter_chains": [{"filters": [{"name": "envoy.filters.network.http_connection_manager",
                                                          "typed_config": hcm}]}]})
    return {"admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": admin}}},
            "static_resources": {"listeners": listeners}}


def direct_config(listen: int, admin: int, ports: list[int]) -> dict:
    cfg = render(EnvoyConfigSpec(variant="override-host", listen_port=listen, admin_port=admin,
                                 endpoints=[("127.0.0.1", p) for p in ports]))
    hcm = cfg["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
    hcm["http_filters"] = hcm["http_filters"][-1:]  # router only: no ext_proc
    cluster = cfg["static_resources"]["clusters"][1]
    cluster.pop("load_balancing_policy")
    cluster["lb_policy"] = "ROUND_ROBIN"
    cfg["static_resources"]["clusters"] = [cluster]
    return cfg


class Procs:
    def __init__(self) -> None:
        self.procs: list[subprocess.Popen] = []
        self.dir = Path(tempfile.mkdtemp(prefix="bench-extproc-"))

    def envoy(self, name: str, cfg: dict, listen: int, concurrency: int = 1) -> subprocess.Popen:
        path = self.dir / f"{name}.yaml"
        path.write_text(yaml.safe_dump(cfg))
        p = subprocess.Popen([bin_path("envoy"), "-c", str(path), "--concurrency", str(concurrency),
                              "--use-dynamic-base-id", "--log-level", "error"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.procs.append(p)
        wait_port(listen)
        return p

    def spawn(self, cmd: list[str], port: int) -> subprocess.Popen:
        p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=open(self.dir / "spawn.log", "ab"))  # noqa: SIM115
        self.procs.append(p)
        wait_port(port)
        return p

    def stop(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()


def cpu_seconds(pid: int) -> float:
    """CPU time of `pid` and of its live children (the workers of `epp serve --workers N`)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    total = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    for task in Path(f"/proc/{pid}/task").glob("*/children"):
        for child in task.read_text().split():
            try:
                total += cpu_seconds(int(child))
            except (FileNotFoundError, ProcessLookupError):
                pass
    return total


def wrk(url: str, conns: int, duration: float, script: Path) -> tuple[float, float, int]:
    run = subprocess.run(["wrk", "-t1", f"-c{conns}", f"-d{int(duration)}s", "--latency", "-s", str(script), url],
                         capture_output=True, text=True, timeout=duration + 30)
    out = run.stdout
    found = re.search(r"Requests/sec:\s+([\d.]+)", out)
    if not found:
        raise RuntimeError(f"wrk against {url} failed: {out} {run.stderr}")
    rps = float(found.group(1))
    m = re.search(r"50%\s+([\d.]+)(us|ms|s)", out)
    scale = {"us": 1e-3, "ms": 1.0, "s": 1e3}[m.group(2)]
    total = int(re.search(r"(\d+) requests in", out).group(1))
    non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    if non2xx:
        raise RuntimeError(f"{url}: {non2xx.group(1)} non-2xx responses")
    return rps, float(m.group(1)) * scale, total


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--duration", type=float, default=5.0)
    ap.add_argument("--conns", default="1,16")
    ap.add_argument("--epp-args", default="", help="extra flags for `epp serve`")
    ap.add_argument("--compare", action="append", default=[], metavar="FLAGS",
                    help="also measure a second Pointsman started with these extra flags, behind its own Envoy, "
                         "interleaved with the first (e.g. --compare=--dashboard=false); repeatable")
    ap.add_argument("--lean", action="store_true", help="Envoy sends Pointsman the request phases only")
    ap.add_argument("--workers", default="1",
                    help="comma list of `epp serve --workers` counts to measure side by side, e.g. 1,2 (each behind "
                         "its own Envoy, configured with --epp-workers; CPU is the whole process group's)")
    ap.add_argument("--no-peer", action="store_true", help="skip vllm-router")
    ap.add_argument("--toy", choices=("aio", "sync", "gen"), default=None,
                    help="also measure bench/toy_extproc.py (the gRPC floor) behind a second Envoy")
    args = ap.parse_args()
    if not shutil.which("wrk"):
        subprocess.run(["apt-get", "install", "-y", "-qq", "wrk"], check=False)
    procs = Procs()
    script = procs.dir / "post.lua"
    script.write_text(f'wrk.method = "POST"\nwrk.body = \'{BODY}\'\n'
                      'wrk.headers["Content-Type"] = "application/json"\nwrk.path = "/v1/chat/completions"\n')
    try:
        backends = [free_port() for _ in range(4)]
        procs.envoy("backend", backend_config(backends, free_port()), backends[-1])
        paths: dict[str, str] = {}
        direct = free_port()
        procs.envoy("direct", direct_config(direct, free_port(), backends), direct)
        paths["Envoy direct"] = f"http://127.0.0.1:{direct}"
        eps = procs.dir / "endpoints.yaml"
        eps.write_text(yaml.safe_dump({"pools": [{"name": "p", "endpoints": [
            {"address": "127.0.0.1", "port": p} for p in backends]}]}))
        measured: dict[str, subprocess.Popen] = {}  # path name -> the processor whose CPU time is measured
        variants = [("", int(w)) for w in args.workers.split(",")] + [(c, 1) for c in args.compare]
        for i, (extra, workers) in enumerate(variants):
            grpc_port = free_port()
            if workers > 1:
                extra = f"{extra} --workers {workers}".strip()
            # A metrics port as in production: it also serves the dashboard, whose recorder is on by default.
            epp = procs.spawn([bin_path("epp"), "serve", "--grpc-host", "127.0.0.1", "--grpc-port", str(grpc_port),
                               "--grpc-health-port", "0", "--metrics-port", str(free_port()), "--endpoints-file",
                               str(eps), "-v", "0", *args.epp_args.split(), *extra.split()], grpc_port)
            with_epp = free_port()
            spec = EnvoyConfigSpec(variant="original-dst", listen_port=with_epp, admin_port=free_port(),
                                   epp_port=grpc_port, response_phases="lean" if args.lean else "full",
                                   epp_workers=workers)
            procs.envoy(f"with-epp{i}", render(spec), with_epp)
            name = "Envoy + Pointsman" + (f" {extra}" if extra else "")
            paths[name] = f"http://127.0.0.1:{with_epp}"
            measured[name] = epp
        toy = None
        if args.toy:
            toy_port = free_port()
            toy = procs.spawn([sys.executable, str(ROOT / "bench" / "toy_extproc.py"), "--port", str(toy_port),
                               "--backend", f"127.0.0.1:{backends[0]}", *([] if args.toy == "aio" else [f"--{args.toy}"])],
                              toy_port)
            with_toy = free_port()
            spec = EnvoyConfigSpec(variant="original-dst", listen_port=with_toy, admin_port=free_port(),
                                   epp_port=toy_port, response_phases="lean" if args.lean else "full")
            procs.envoy("with-toy", render(spec), with_toy)
            paths[f"Envoy + toy {args.toy} processor"] = f"http://127.0.0.1:{with_toy}"
            measured[f"Envoy + toy {args.toy} processor"] = toy
        if not args.no_peer and shutil.which(bin_path("vllm-router")):
            vr = free_port()
            procs.spawn([bin_path("vllm-router"), "--host", "127.0.0.1", "--port", str(vr), "--policy",
                         "cache_aware", "--log-level", "error", "--worker-urls",
                         *[f"http://127.0.0.1:{p}" for p in backends]], vr)
            paths["vllm-router (cache_aware)"] = f"http://127.0.0.1:{vr}"
        for url in paths.values():  # warm up
            wrk(url, 4, 1, script)
        results: dict[tuple[str, int], list[tuple[float, float, float]]] = {}
        for _ in range(args.rounds):
            for conns in [int(c) for c in args.conns.split(",")]:
                for name, url in paths.items():
                    proc = measured.get(name)
                    cpu0 = cpu_seconds(proc.pid) if proc else 0.0
                    rps, p50, total = wrk(url, conns, args.duration, script)
                    cpu = (cpu_seconds(proc.pid) - cpu0) / max(total, 1) * 1e6 if proc else 0.0
                    results.setdefault((name, conns), []).append((rps, p50, cpu))
        print(f"\n{args.rounds} interleaved rounds x {args.duration:g}s, medians; epp flags: {args.epp_args or '-'}"
              f"{', lean response phases' if args.lean else ''}\n")
        print("| path | conns | req/s | p50 ms | vs Envoy direct | processor CPU µs/req |")
        print("|---|---|---|---|---|---|")
        for conns in [int(c) for c in args.conns.split(",")]:
            base = statistics.median(r[0] for r in results[("Envoy direct", conns)])
            for name in paths:
                rows = results[(name, conns)]
                rps = statistics.median(r[0] for r in rows)
                p50 = statistics.median(r[1] for r in rows)
                cpu = statistics.median(r[2] for r in rows)
                print(f"| {name} | {conns} | {rps:.0f} | {p50:.2f} | {rps / base:.2f}x | "
                      f"{f'{cpu:.0f}' if cpu else '-'} |")
    finally:
        procs.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
