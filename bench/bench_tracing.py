"""What tracing and shadow profiles cost on the wire, against an A/A control, as ratios within one run.

wrk → front Envoy → `epp serve` → a keep-alive backend (bench/extproc_stack.py), one endpoint, lean response
phases, a chat body of `--body-bytes` bytes. The cases are separate `epp serve` processes, each behind its own
front Envoy, measured once per round in a rotating order:

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

    .venv/bin/python bench/bench_tracing.py --rounds 5 --duration 5
    .venv/bin/python bench/bench_tracing.py --case "trace 1%" --case "trace 100%"     # only these (and off, A/A)
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

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
    processor: subprocess.Popen
    front: subprocess.Popen
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
    backends = [free_port() for _ in range(4)]
    procs.envoy("backend", backend_config(backends, free_port()), backends[-1])
    eps = procs.dir / "endpoints.yaml"
    eps.write_text(yaml.safe_dump({"pools": [{"name": "p", "endpoints": [
        {"address": "127.0.0.1", "port": backends[0]}]}]}))
    sink = free_port()
    procs.spawn("otlp-sink", [sys.executable, str(ROOT / "bench" / "otlp_sink.py"), "--port", str(sink)], sink)
    out = []
    for i, (name, flags) in enumerate(cases(f"http://127.0.0.1:{sink}").items()):
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
           "| case | req/s | req/s vs control | p50 ms | processor CPU µs/req | CPU vs control "
           "| off-loop CPU µs/req |",
           "|---|---|---|---|---|---|---|"]
    for c in all_cases:
        rps, rlo, rhi = ratios(c.rps, base_rps)
        cpu, clo, chi = ratios(c.cpu, base_cpu)
        out.append(f"| {c.name} | {statistics.median(c.rps):.0f} | {rps:.3f} [{rlo:.2f}..{rhi:.2f}] "
                   f"| {statistics.median(c.p50):.2f} | {statistics.median(c.cpu):.0f} "
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
    ap.add_argument("--out", default=None, help="also write the table to this file")
    args = ap.parse_args()
    if not shutil.which("wrk"):
        subprocess.run(["apt-get", "install", "-y", "-qq", "wrk"], check=False)
    procs = Procs()
    script = procs.dir / "post.lua"
    script.write_text(wrk_script(chat_body(args.body_bytes)))
    try:
        load0 = os.getloadavg()[0]
        all_cases = start(args, procs, script)
        measure(args, all_cases, script)
        text = table(args, all_cases, (load0, os.getloadavg()[0]))
    finally:
        procs.stop()
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
