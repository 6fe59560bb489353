"""What tracing and shadow profiles cost on the wire, against an A/A control, as ratios within one run.

wrk → front Envoy → Pointsman → a keep-alive backend (bench/extproc_stack.py), one endpoint, lean response
phases, a chat body of `--body-bytes` bytes. By default one Pointsman (an `epp serve` App in this process, started
with tracing and the shadow profile, its startup objects frozen as `epp serve` does) serves every case: before each
measurement the bench publishes the case's director (tracing on at the case's ratio or off, the shadow observer in
or out), so every case runs in the same process behind the same Envoy and only the case differs; the processor CPU
is this process's. `--processes` runs each case as its own `epp serve` behind its own front Envoy instead (what
differs then includes where each process landed). Cases, measured once per round in a rotating order:

    off        no tracing, no shadow
    off A/A    the same flags again: the control. Its ratio to `off` is the run's own noise
    trace 0%   --tracing --tracing-sample-ratio 0: tracing on, nothing sampled (the unsampled path alone)
    trace 1%   --tracing --tracing-sample-ratio 0.01, exporting to a do-nothing OTLP/gRPC collector (otlp_sink.py)
    trace 100% --tracing --tracing-sample-ratio 1
    shadow     --shadow-config gie-default.yaml at its default budget (200 decisions/s, 5% of loop time)
    shadow all the same with no budget (every request shadowed)

Each round's req/s and processor CPU per request (utime+stime of every thread, from /proc) are divided by the
same round's control, the mean of `off` and `off A/A`; the table gives the median of those ratios over the rounds
with their range, so a noisy machine moves both sides of a ratio alike. The A/A line (`off A/A` / `off`) says how
far apart two identical processes land: a case whose ratio is inside that spread is not told from noise. The last column is the CPU per request spent outside the event
loop's thread (the export thread, gRPC's threads), so an export that costs the loop shows as loop CPU.

    .venv/bin/python bench/bench_tracing.py --rounds 9 --duration 3
    .venv/bin/python bench/bench_tracing.py --processes --rounds 5 --duration 5
    .venv/bin/python bench/bench_tracing.py --case "trace 1%" --case "trace 100%"     # only these (and off, A/A)
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_extproc import wrk  # noqa: E402
from extproc_stack import (  # noqa: E402
    ROOT,
    Procs,
    backend_config,
    bin_path,
    chat_body,
    cpu_seconds,
    front_config,
    wrk_script,
)

from epp.cmd.app import App, freeze_startup_objects  # noqa: E402
from epp.cmd.settings import ServeSettings  # noqa: E402
from epp.observe import Shadow, Tracing, TracingObserver, TracingSettings  # noqa: E402
from epp.stack.ports import free_port  # noqa: E402

PROFILE = ROOT / "deploy" / "profiles" / "gie-default.yaml"


def cases(otlp: str) -> dict[str, list[str]]:
    trace = ["--tracing", "--tracing-endpoint", otlp, "--tracing-sample-ratio"]
    return {
        "off": [],
        "off A/A": [],
        "trace 0%": [*trace, "0"],
        "trace 1%": [*trace, "0.01"],
        "trace 100%": [*trace, "1"],
        "shadow": ["--shadow-config", str(PROFILE)],
        "shadow all": ["--shadow-config", str(PROFILE), "--shadow-rate", "1e9", "--shadow-max-cpu", "1"],
    }


@dataclass
class Case:
    name: str
    url: str
    processor: subprocess.Popen | None  # None: the App in this process
    front: subprocess.Popen
    director: Any = None  # the App's director for this case (one process)
    enter: Callable[[], None] | None = None  # called before the case's measurement (one process)
    rps: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)  # processor µs per request
    side: list[float] = field(default_factory=list)  # of which outside the main thread
    p50: list[float] = field(default_factory=list)
    errors: int = 0


def thread_cpu(pid: int) -> tuple[float, float]:
    """(all threads, the main thread) CPU seconds of a process."""
    main = Path(f"/proc/{pid}/task/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return cpu_seconds(pid), (int(main[11]) + int(main[12])) / os.sysconf("SC_CLK_TCK")


def start(args: argparse.Namespace, procs: Procs, script: Path) -> list[Case]:
    """--processes: every case its own `epp serve` behind its own front Envoy."""
    backends, eps, otlp = backend(procs)
    out = []
    for i, (name, flags) in enumerate(cases(otlp).items()):
        if args.case and name not in ("off", "off A/A") and name not in args.case:
            continue
        port = free_port()
        epp = procs.spawn(f"epp-{i}", [bin_path("epp"), "serve", "--secure-serving=false", "--grpc-host", "127.0.0.1",
                                       "--grpc-port", str(port), "--grpc-health-port", "0", "--metrics-port", "0",
                                       "--endpoints-file", str(eps), "--seed", "1", "-v", "0", *flags], port)
        listen = free_port()
        envoy = procs.envoy(f"front-{i}", front_config(listen, free_port(), port, variant="original-dst",
                                                       phases="lean", backends=backends), listen)
        out.append(Case(name, f"http://127.0.0.1:{listen}", epp, envoy))
    for c in out:  # warm up, and fail early on a broken path
        if wrk(c.url, 4, 2, script)[3]:
            raise RuntimeError(f"{c.name}: socket errors while warming up")
    return out


def measure(args: argparse.Namespace, all_cases: list[Case], script: Path) -> None:
    for r in range(args.rounds):
        k = r % len(all_cases)
        for c in all_cases[k:] + all_cases[:k]:  # rotate: no case always runs right after another
            assert c.processor is not None
            pid = c.processor.pid
            cpu0, main0 = thread_cpu(pid)
            rps, p50, total, errors = wrk(c.url, args.conns, args.duration, script)
            cpu1, main1 = thread_cpu(pid)
            c.errors += errors
            n = max(total, 1)
            c.rps.append(rps)
            c.p50.append(p50)
            c.cpu.append((cpu1 - cpu0) / n * 1e6)
            c.side.append(max(0.0, (cpu1 - cpu0) - (main1 - main0)) / n * 1e6)
        print(f"round {r + 1}/{args.rounds} done", file=sys.stderr)


# ---- one process: the cases are directors of one App ----------------------------------------------------------------
def backend(procs: Procs) -> tuple[list[int], Path, str]:
    """The keep-alive backend, the endpoints file and a do-nothing OTLP/gRPC collector."""
    backends = [free_port() for _ in range(4)]
    procs.envoy("backend", backend_config(backends, free_port()), backends[-1])
    eps = procs.dir / "endpoints.yaml"
    eps.write_text(yaml.safe_dump({"pools": [{"name": "p", "endpoints": [
        {"address": "127.0.0.1", "port": backends[0]}]}]}))
    sink = free_port()
    procs.spawn("otlp-sink", [sys.executable, str(ROOT / "bench" / "otlp_sink.py"), "--port", str(sink)], sink)
    return backends, eps, f"http://127.0.0.1:{sink}"


def directors(app: App, otlp: str) -> dict[str, tuple[Any, Callable[[], None] | None]]:
    """Each case's director (and what to do before it runs), from an App started with tracing at 100% and the
    shadow profile: tracing at 0% and 1% get Tracing objects of their own (their own export threads)."""
    from epp.observe.shadow import Budget

    d = app.director
    plain = tuple(o for o in d.observers if not isinstance(o, (TracingObserver, Shadow)))
    traced = (*plain, TracingObserver())
    shadow = app.observe.shadow if app.observe is not None else None
    assert shadow is not None and d.tracing is not None
    s = shadow.settings

    def budget(rate: float, cpu: float) -> Callable[[], None]:
        return lambda: setattr(shadow, "budget", Budget(rate, cpu, shadow.clock()))

    def tracing(ratio: float) -> Tracing:
        return Tracing(TracingSettings(enabled=True, endpoint=otlp, sample_ratio=ratio))

    off = d.replace(tracing=None, observers=plain)
    return {
        "off": (off, None),
        "off A/A": (off, None),
        "trace 0%": (d.replace(tracing=tracing(0.0), observers=traced), None),
        "trace 1%": (d.replace(tracing=tracing(0.01), observers=traced), None),
        "trace 100%": (d.replace(observers=traced), None),
        "shadow": (d.replace(tracing=None, observers=(*plain, shadow)), budget(s.rate, s.max_cpu)),
        "shadow all": (d.replace(tracing=None, observers=(*plain, shadow)), budget(1e9, 1.0)),
    }


async def start_app(args: argparse.Namespace, procs: Procs) -> tuple[App, list[Case]]:
    backends, eps, otlp = backend(procs)
    port = free_port()
    settings = ServeSettings.from_argv([
        "--grpc-host", "127.0.0.1", "--secure-serving=false", "--grpc-port", str(port), "--grpc-health-port", "0",
        "--metrics-port", "0", "--endpoints-file", str(eps), "--seed", "1", "--tracing", "--tracing-endpoint", otlp,
        "--tracing-sample-ratio", "1", "--shadow-config", str(PROFILE)])
    app = App(settings)
    await app.start()
    variants = directors(app, otlp)
    freeze_startup_objects()
    listen = free_port()
    envoy = procs.envoy("front", front_config(listen, free_port(), port, variant="original-dst", phases="lean",
                                              backends=backends), listen)
    url = f"http://127.0.0.1:{listen}"
    cases = [Case(name, url, None, envoy, director, enter) for name, (director, enter) in variants.items()
             if not args.case or name in ("off", "off A/A") or name in args.case]
    return app, cases


async def awrk(url: str, conns: int, duration: float, script: Path) -> tuple[float, float, int, int]:
    """wrk without blocking the event loop the App runs on: (req/s, p50 ms, requests, socket errors)."""
    proc = await asyncio.create_subprocess_exec(
        "wrk", "-t1", f"-c{conns}", f"-d{int(duration)}s", "--timeout", "5s", "--latency", "-s", str(script), url,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    raw, err = await asyncio.wait_for(proc.communicate(), duration + 30)
    out = raw.decode()
    found = re.search(r"Requests/sec:\s+([\d.]+)", out)
    if not found or "Non-2xx" in out:
        raise RuntimeError(f"wrk against {url} failed: {out} {err.decode()}")
    m = re.search(r"50%\s+([\d.]+)(us|ms|s)", out)
    p50 = float(m.group(1)) * {"us": 1e-3, "ms": 1.0, "s": 1e3}[m.group(2)] if m else float("nan")
    total = int(re.search(r"(\d+) requests in", out).group(1))
    errors = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out)
    return float(found.group(1)), p50, total, sum(map(int, errors.groups())) if errors else 0


async def measure_app(args: argparse.Namespace, app: App, all_cases: list[Case], script: Path) -> None:
    for c in all_cases:  # warm up every case
        app.publish(c.director)
        await awrk(c.url, 4, 1, script)
    for r in range(args.rounds):
        k = r % len(all_cases)
        for c in all_cases[k:] + all_cases[:k]:
            if c.enter is not None:
                c.enter()
            app.publish(c.director)
            await asyncio.sleep(0.05)
            cpu0, main0 = time.process_time(), time.thread_time()
            rps, p50, total, errors = await awrk(c.url, args.conns, args.duration, script)
            if c.director.tracing is not None:  # its export thread's work is the case's, not the next one's
                await asyncio.to_thread(c.director.tracing.processor.force_flush)
            cpu1, main1 = time.process_time(), time.thread_time()
            n = max(total, 1)
            c.errors += errors
            c.rps.append(rps)
            c.p50.append(p50)
            c.cpu.append((cpu1 - cpu0) / n * 1e6)
            c.side.append(max(0.0, (cpu1 - cpu0) - (main1 - main0)) / n * 1e6)
        print(f"round {r + 1}/{args.rounds} done", file=sys.stderr)


async def one_process(args: argparse.Namespace, procs: Procs, script: Path) -> list[Case]:
    app, all_cases = await start_app(args, procs)
    try:
        await measure_app(args, app, all_cases, script)
    finally:
        for c in all_cases:
            tracing = c.director.tracing
            if tracing is not None and tracing is not app.director.tracing:
                await asyncio.to_thread(tracing.shutdown)
        await app.stop(0)
    return all_cases


def ratios(values: list[float], base: list[float]) -> tuple[float, float, float]:
    rs = [v / b for v, b in zip(values, base, strict=True)]
    return statistics.median(rs), min(rs), max(rs)


def control(a: list[float], b: list[float]) -> list[float]:
    """Each round's base: the mean of `off` and its A/A twin (one unlucky measurement of `off` moves every ratio
    half as far)."""
    return [(x + y) / 2 for x, y in zip(a, b, strict=True)]


def table(args: argparse.Namespace, all_cases: list[Case], load: tuple[float, float]) -> str:
    off = next(c for c in all_cases if c.name == "off")
    twin = next(c for c in all_cases if c.name == "off A/A")
    base_rps, base_cpu = control(off.rps, twin.rps), control(off.cpu, twin.cpu)
    aa_rps, aa_cpu = ratios(twin.rps, off.rps), ratios(twin.cpu, off.cpu)
    out = [f"{args.rounds} interleaved rounds x {args.duration:g}s at {args.conns} connections, {args.body_bytes}-byte "
           f"body; per-round ratios to the control (the mean of `off` and `off A/A` in that round), medians "
           f"[min..max]; 1-minute load average {load[0]:.1f} before, {load[1]:.1f} after", "",
           f"A/A (`off A/A` / `off`, per round): req/s {aa_rps[0]:.3f} [{aa_rps[1]:.2f}..{aa_rps[2]:.2f}], "
           f"CPU per request {aa_cpu[0]:.3f} [{aa_cpu[1]:.2f}..{aa_cpu[2]:.2f}]", "",
           "| case | req/s | req/s vs control | p50 ms | processor CPU µs/req (best round) | CPU vs control "
           "| off-loop CPU µs/req |",
           "|---|---|---|---|---|---|---|"]
    for c in all_cases:
        rps, rlo, rhi = ratios(c.rps, base_rps)
        cpu, clo, chi = ratios(c.cpu, base_cpu)
        out.append(f"| {c.name} | {statistics.median(c.rps):.0f} | {rps:.3f} [{rlo:.2f}..{rhi:.2f}] "
                   f"| {statistics.median(c.p50):.2f} | {statistics.median(c.cpu):.0f} ({min(c.cpu):.0f}) "
                   f"| {cpu:.3f} [{clo:.2f}..{chi:.2f}] | {statistics.median(c.side):.1f} |")
    failing = [f"{c.name} ({c.errors})" for c in all_cases if c.errors]
    out += ["", "Socket errors or timeouts over 5 s: " + (", ".join(failing) if failing else "none")]
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--duration", type=float, default=5.0, help="seconds per measurement")
    ap.add_argument("--conns", type=int, default=16)
    ap.add_argument("--body-bytes", type=int, default=120)
    ap.add_argument("--case", action="append", default=[], help="only these cases (repeatable; off and its A/A "
                                                                 "control are always in)")
    ap.add_argument("--processes", action="store_true", help="each case its own epp serve and front Envoy")
    ap.add_argument("--out", default=None, help="also write the table to this file")
    args = ap.parse_args()
    if not shutil.which("wrk"):
        subprocess.run(["apt-get", "install", "-y", "-qq", "wrk"], check=False)
    procs = Procs()
    script = procs.dir / "post.lua"
    script.write_text(wrk_script(chat_body(args.body_bytes)))
    try:
        load0 = os.getloadavg()[0]
        if args.processes:
            all_cases = start(args, procs, script)
            measure(args, all_cases, script)
        else:
            all_cases = asyncio.run(one_process(args, procs, script))
        text = table(args, all_cases, (load0, os.getloadavg()[0]))
    finally:
        procs.stop()
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
