"""Overload: Pointsman with flow control off and on, in front of modelsim driven at twice its capacity.

    .venv/bin/python bench/bench_overload.py                    # both scenarios, 3 interleaved rounds, ~6 min
    .venv/bin/python bench/bench_overload.py --scenario mixed --rounds 2 --seconds 10

One modelsim fleet (a process), `epp serve` (a process) and Envoy serve every phase; flow control is switched on
and off by rewriting the config file Pointsman hot-reloads, and the phases run interleaved, several rounds, so the
load of a shared machine weighs on all of them alike. Each phase is an open-loop Poisson workload of streaming chat
requests (fixed output length) sent from this process; the next phase starts when every request has ended. Classes:
- `tenant-a`, `tenant-b`: the objective `critical` (priority 10), fairness ids tenant-a / tenant-b, 3:1 requests;
- `batch`: the objective `batch` (priority -1, sheddable), fairness id batch.

Capacity C (req/s) is measured first: a closed loop keeping every engine slot busy, straight at modelsim.
Scenarios (offered load in units of C):
- `mixed`: A 0.375 + B 0.125 (critical 0.5) + batch 1.5 = 2.0 C. Runs: `unloaded` (critical alone at 0.3 C,
  flow control on: the reference p99), `off`, `on`.
- `noisy`: A 1.125 + B 0.375 = 1.5 C, no batch: one tenant floods the pool. Runs `off`, `on`.
Both phases use the same saturation detector (concurrency-detector, maxConcurrency = the engines' max-num-seqs); `on`
adds the flowControl gate and section (TTL 5 s, round-robin fairness, a 16-request cap on the sheddable band, and
a priority-usage-limit-policy that stops dispatching batch at 75% of the slots: running requests cannot be
preempted, so the room a critical request needs must be kept free).

Reported per run and class (and `critical`, both tenants together): offered req/s, served (200s that completed) and goodput (served per second of the
phase's wall time, from its first request to its last response, so a backlog that drains late does not inflate it),
the share of the tenants' goodput, p50/p90/p99 TTFT of served requests (p99 also as the median over rounds of
each round's p99, which one round stalled by a busy machine cannot move), and refusals (429, 503). Targets (flow
control on, `mixed`): critical p99 (median of rounds) within 3x of its unloaded p99; A and B served alike
(served fraction within 10%); the refused requests are batch.
For `noisy`, the max-min fair share is the yardstick: B (below half the capacity) should get all it asks.
Results: bench/out/overload/results.md and results.json.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import random
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import aiohttp
import orjson
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.routing.procs import Proc, free_ports, wait_http, wait_tcp  # noqa: E402
from bench.routing.routers import _start_envoy  # noqa: E402
from epp.envoy_config import EnvoyConfigSpec, render_yaml  # noqa: E402

MODEL = "meta-llama/Llama-3.1-8B"
CLASSES = {  # class -> (objective, fairness id)
    "tenant-a": ("critical", "tenant-a"),
    "tenant-b": ("critical", "tenant-b"),
    "batch": ("batch", "batch"),
}
SCENARIOS = {
    "mixed": {"tenant-a": 0.375, "tenant-b": 0.125, "batch": 1.5},
    "noisy": {"tenant-a": 1.125, "tenant-b": 0.375},
}


@dataclass
class Args:
    servers: int = 2
    max_num_seqs: int = 8
    max_tokens: int = 48
    prompt_chars: int = 600
    seconds: float = 15.0
    ttl: str = "5s"
    batch_queue: int = 16
    sheddable_threshold: float = 0.75  # batch is dispatched while under 75% of the slots: the rest is kept free
    seed: int = 1


@dataclass
class Sample:
    cls: str
    sent: float
    status: int
    ttft: float | None = None
    done: float | None = None
    error: str = ""
    round: int = 0


@dataclass
class ClassRow:
    run: str
    cls: str
    offered_rps: float
    sent: int
    served: int
    goodput_rps: float
    share: float | None
    ttft_p50_ms: float | None
    ttft_p90_ms: float | None
    ttft_p99_ms: float | None
    ttft_p99_rounds_ms: float | None  # the median over rounds of each round's p99: robust to one stalled round
    r429: int
    r503: int
    other: int


@dataclass
class Fleet:
    procs: list[Proc] = field(default_factory=list)
    ports: list[int] = field(default_factory=list)
    url: str = ""


def pct(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


# ---- processes ---------------------------------------------------------------------------------------------------
async def start_modelsim(a: Args, workdir: Path) -> Fleet:
    ports = free_ports(a.servers)
    proc = Proc("modelsim", [sys.executable, "-m", "modelsim", "--servers", str(a.servers), "--ports",
                             ",".join(map(str, ports)), "--model", MODEL, "--max-num-seqs", str(a.max_num_seqs),
                             "--max-waiting", "100000", "--stream-interval-ms", "20"], workdir)
    for p in ports:
        await wait_http(f"http://127.0.0.1:{p}/health", proc, 30)
    return Fleet([proc], ports)


def epp_config(a: Args, flow: bool) -> str:
    doc = {
        "apiVersion": "llm-d.ai/v1alpha1", "kind": "EndpointPickerConfig",
        "plugins": [
            {"type": "concurrency-detector", "name": "slots", "parameters": {"maxConcurrency": a.max_num_seqs}},
            {"type": "queue-scorer"}, {"type": "inflight-requests-scorer"}, {"type": "max-score-picker"},
        ],
        "schedulingProfiles": [{"name": "default", "plugins": [
            {"pluginRef": "queue-scorer"}, {"pluginRef": "inflight-requests-scorer"},
            {"pluginRef": "max-score-picker"}]}],
        "saturationDetector": {"pluginRef": "slots"},
    }
    if flow:
        doc["featureGates"] = ["flowControl"]
        doc["plugins"].append({"type": "priority-usage-limit-policy", "name": "reserve",
                               "parameters": {"sheddableThreshold": a.sheddable_threshold}})
        doc["flowControl"] = {"defaultRequestTTL": a.ttl, "usageLimitPolicyPluginRef": "reserve",
                              "priorityBands": [{"priority": -1, "maxRequests": a.batch_queue}]}
    return yaml.safe_dump(doc, sort_keys=False)


async def start_stack(a: Args, fleet: Fleet, workdir: Path, flow: bool) -> Fleet:
    grpc, health, metrics, listen, admin = free_ports(5)
    eps = workdir / "endpoints.yaml"
    eps.write_text(yaml.safe_dump({
        "pools": [{"name": "default", "endpoints": [
            {"address": "127.0.0.1", "port": p, "name": f"modelsim-{i}", "models": [MODEL]}
            for i, p in enumerate(fleet.ports)]}],
        "objectives": {"critical": 10, "batch": -1},
    }))
    cfg = workdir / "epp-config.yaml"
    cfg.write_text(epp_config(a, flow))
    epp = Proc("epp", [sys.executable, "-m", "epp.cmd.cli", "serve", "--secure-serving=false", "--grpc-host", "127.0.0.1",
                       "--grpc-port",
                       str(grpc), "--grpc-health-port", str(health), "--metrics-port", str(metrics),
                       "--endpoints-file", str(eps), "--config-file", str(cfg), "--seed", str(a.seed)], workdir)
    await wait_tcp(grpc, epp, 30)
    spec = EnvoyConfigSpec(variant="override-host", listen_port=listen, admin_port=admin, epp_port=grpc,
                           endpoints=[("127.0.0.1", p) for p in fleet.ports], response_phases="lean")
    envoy_cfg = workdir / "envoy.yaml"
    envoy_cfg.write_text(render_yaml(spec))
    envoy = await _start_envoy("envoy", envoy_cfg, workdir, listen, admin)
    await asyncio.sleep(1.0)  # first scrapes in
    return Fleet([epp, envoy], fleet.ports, f"http://127.0.0.1:{listen}")


# ---- load ----------------------------------------------------------------------------------------------------------
def body(a: Args, rng: random.Random) -> bytes:
    words = " ".join(f"w{rng.randrange(10**6)}" for _ in range(a.prompt_chars // 8))
    return orjson.dumps({"model": MODEL, "messages": [{"role": "user", "content": words}],
                         "max_tokens": a.max_tokens, "ignore_eos": True, "stream": True})


async def one(session: aiohttp.ClientSession, url: str, cls: str, data: bytes, t0: float) -> Sample:
    objective, fid = CLASSES[cls]
    headers = {"content-type": "application/json", "x-gateway-inference-objective": objective,
               "x-gateway-inference-fairness-id": fid}
    sent = time.monotonic()
    s = Sample(cls, sent - t0, 0)
    try:
        async with session.post(url, data=data, headers=headers, timeout=aiohttp.ClientTimeout(total=60)) as r:
            s.status = r.status
            if r.status != 200:
                await r.read()
                return s
            async for _ in r.content.iter_any():
                if s.ttft is None:
                    s.ttft = time.monotonic() - sent
            s.done = time.monotonic() - t0
    except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
        s.status, s.error = -1, f"{type(exc).__name__}: {exc}"[:200]
    return s


async def drive(url: str, rates: dict[str, float], seconds: float, a: Args, seed: int = 0) -> list[Sample]:
    """Open loop: each class sends Poisson arrivals at its rate for `seconds`; waits for every request. The
    arrivals depend on `seed` only: every phase of a round gets the same plan, each round another."""
    rng = random.Random(a.seed * 1000 + seed)
    plan: list[tuple[float, str]] = []
    for cls, rate in rates.items():
        t = 0.0
        while rate > 0:
            t += rng.expovariate(rate)
            if t >= seconds:
                break
            plan.append((t, cls))
    plan.sort()
    bodies = [body(a, rng) for _ in plan]
    tasks: list[asyncio.Task[Sample]] = []
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        t0 = time.monotonic()
        for (at, cls), data in zip(plan, bodies, strict=True):
            delay = at - (time.monotonic() - t0)
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.ensure_future(one(session, url, cls, data, t0)))
        return list(await asyncio.gather(*tasks))


async def capacity(a: Args, fleet: Fleet) -> float:
    """Requests/s the fleet completes with every engine slot busy (a closed loop, round robin, no router)."""
    rng = random.Random(a.seed + 1)
    urls = [f"http://127.0.0.1:{p}/v1/chat/completions" for p in fleet.ports]
    workers = a.servers * a.max_num_seqs
    done: list[float] = []
    stop_at = time.monotonic() + 15.0
    warm = time.monotonic() + 3.0

    async def worker(i: int, session: aiohttp.ClientSession) -> None:
        while time.monotonic() < stop_at:
            async with session.post(urls[i % len(urls)], data=body(a, rng),
                                    headers={"content-type": "application/json"}) as r:
                await r.read()
            if time.monotonic() > warm:
                done.append(time.monotonic())

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        await asyncio.gather(*(worker(i, session) for i in range(workers)))
    return len(done) / (stop_at - warm)


# ---- report --------------------------------------------------------------------------------------------------------
def rows_for(run: str, samples: list[Sample], rates: dict[str, float], seconds: float) -> list[ClassRow]:
    """`seconds`: the phase's wall time, from its first request to its last response (backlogs included)."""
    served = {c: [s for s in samples if s.cls == c and s.status == 200 and s.done is not None] for c in rates}
    tenant_goodput = sum(len(served[c]) for c in ("tenant-a", "tenant-b") if c in rates)
    out = []
    groups = dict(rates)
    if "tenant-a" in rates and "tenant-b" in rates:
        groups["critical"] = rates["tenant-a"] + rates["tenant-b"]  # both tenants together: more samples
        served["critical"] = served["tenant-a"] + served["tenant-b"]
    for cls, rate in groups.items():
        mine = [s for s in samples if s.cls == cls or (cls == "critical" and s.cls.startswith("tenant-"))]
        ok = served[cls]
        ttfts = [s.ttft for s in ok if s.ttft is not None]
        p50, p90, p99 = pct(ttfts, 0.5), pct(ttfts, 0.9), pct(ttfts, 0.99)
        per_round = [pct([s.ttft for s in ok if s.round == r and s.ttft is not None], 0.99)
                     for r in sorted({s.round for s in ok})]
        p99r = statistics.median([x for x in per_round if x is not None]) if per_round else None
        out.append(ClassRow(
            run=run, cls=cls, offered_rps=rate, sent=len(mine), served=len(ok), goodput_rps=len(ok) / seconds,
            share=(len(ok) / tenant_goodput if tenant_goodput and cls.startswith("tenant-") else None),
            ttft_p50_ms=p50 * 1000 if p50 is not None else None, ttft_p90_ms=p90 * 1000 if p90 is not None else None,
            ttft_p99_ms=p99 * 1000 if p99 is not None else None,
            ttft_p99_rounds_ms=p99r * 1000 if p99r is not None else None,
            r429=sum(s.status == 429 for s in mine), r503=sum(s.status == 503 for s in mine),
            other=sum(s.status not in (200, 429, 503) for s in mine)))
    return out


def fmt(x: float | None, nd: int = 0) -> str:
    return "-" if x is None else f"{x:.{nd}f}"


def markdown(rows: list[ClassRow]) -> str:
    lines = ["| run | class | offered req/s | sent | served | goodput req/s | tenant share | TTFT p50 ms | "
             "TTFT p90 ms | TTFT p99 ms | p99, median of rounds | 429 | 503 | other |", "|" + "---|" * 14]
    for r in rows:
        lines.append(f"| {r.run} | {r.cls} | {r.offered_rps:.1f} | {r.sent} | {r.served} | {r.goodput_rps:.2f} | "
                     f"{fmt(r.share * 100 if r.share is not None else None)}{'%' if r.share is not None else ''} | "
                     f"{fmt(r.ttft_p50_ms)} | {fmt(r.ttft_p90_ms)} | {fmt(r.ttft_p99_ms)} | "
                     f"{fmt(r.ttft_p99_rounds_ms)} | {r.r429} | {r.r503} | {r.other} |")
    return "\n".join(lines)


def verdicts(rows: list[ClassRow]) -> list[str]:
    by = {(r.run, r.cls): r for r in rows}
    out = []
    if ("mixed/unloaded", "tenant-a") in by and ("mixed/on", "tenant-a") in by:
        for cls in ("critical", "tenant-a", "tenant-b"):
            base, on = by[("mixed/unloaded", cls)].ttft_p99_rounds_ms, by[("mixed/on", cls)].ttft_p99_rounds_ms
            off = by[("mixed/off", cls)].ttft_p99_rounds_ms
            if base and on and off:
                out.append(f"mixed {cls}: TTFT p99 (median of rounds) on {on:.0f} ms = {on / base:.2f}x unloaded "
                           f"({base:.0f} ms), off {off / base:.2f}x; target on <= 3x: "
                           f"{'met' if on <= 3 * base else 'NOT met'}")
        a, b = by[("mixed/on", "tenant-a")], by[("mixed/on", "tenant-b")]
        fa, fb = a.served / max(1, a.sent), b.served / max(1, b.sent)
        out.append(f"mixed/on tenants served {fa:.1%} vs {fb:.1%} of what they sent; target within 10%: "
                   f"{'met' if abs(fa - fb) <= 0.10 else 'NOT met'}")
        refused = {cls: by[("mixed/on", cls)].r429 + by[("mixed/on", cls)].r503 for cls in CLASSES}
        out.append(f"mixed/on refused (429+503) by class: {refused}; target only batch: "
                   f"{'met' if refused['tenant-a'] == refused['tenant-b'] == 0 else 'NOT met'}")
    if ("noisy/on", "tenant-b") in by:
        b = by[("noisy/on", "tenant-b")]
        out.append(f"noisy/on tenant-b (below its fair share) served {b.served / max(1, b.sent):.1%} of what it "
                   f"sent, TTFT p99 {fmt(b.ttft_p99_ms)} ms; noisy/off: "
                   f"{by[('noisy/off', 'tenant-b')].served / max(1, by[('noisy/off', 'tenant-b')].sent):.1%}, "
                   f"TTFT p99 {fmt(by[('noisy/off', 'tenant-b')].ttft_p99_ms)} ms")
    return out


# ---- main ----------------------------------------------------------------------------------------------------------
PHASES = {  # phase -> (scenario rates in units of C, flow control on)
    "mixed/unloaded": ({"tenant-a": 0.3 * 0.75, "tenant-b": 0.3 * 0.25}, True),
    "mixed/off": (SCENARIOS["mixed"], False),
    "mixed/on": (SCENARIOS["mixed"], True),
    "noisy/off": (SCENARIOS["noisy"], False),
    "noisy/on": (SCENARIOS["noisy"], True),
}


async def set_flow(cfg: Path, a: Args, flow: bool) -> None:
    """Switch flow control by rewriting the config file Pointsman hot-reloads (polled every second)."""
    text = epp_config(a, flow)
    if cfg.read_text() != text:
        cfg.write_text(text)
        await asyncio.sleep(2.5)


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--scenario", choices=["mixed", "noisy", "all"], default="all")
    ap.add_argument("--seconds", type=float, default=Args.seconds, help="per phase and round")
    ap.add_argument("--rounds", type=int, default=3, help="the phases run interleaved, this many times each")
    ap.add_argument("--servers", type=int, default=Args.servers)
    ap.add_argument("--sheddable-threshold", type=float, default=Args.sheddable_threshold,
                    help="priority-usage-limit-policy sheddableThreshold with flow control on (0.75)")
    ap.add_argument("--out", default=str(ROOT / "bench" / "out" / "overload"))
    ns = ap.parse_args()
    a = Args(servers=ns.servers, seconds=ns.seconds, sheddable_threshold=ns.sheddable_threshold)
    out = Path(ns.out).resolve()
    workdir = out / "work"
    fleet = await start_modelsim(a, workdir / "fleet")
    stack = None
    try:
        cap = await capacity(a, fleet)
        print(f"capacity: {cap:.1f} req/s ({a.servers} servers x {a.max_num_seqs} slots, {a.max_tokens} output "
              f"tokens)", flush=True)
        stack = await start_stack(a, fleet, workdir, False)
        cfg = workdir / "epp-config.yaml"
        names = [n for n in PHASES if ns.scenario == "all" or n.startswith(ns.scenario)]
        samples: dict[str, list[Sample]] = {n: [] for n in names}
        spans = {n: 0.0 for n in names}
        for r in range(ns.rounds):
            order = names[r % len(names):] + names[:r % len(names)]  # a different phase goes first each round
            for name in order:
                rates_c, flow = PHASES[name]
                await set_flow(cfg, a, flow)
                got = await drive(stack.url + "/v1/chat/completions", {c: x * cap for c, x in rates_c.items()},
                                  a.seconds, a, seed=r)
                for x in got:
                    x.round = r
                samples[name] += got
                spans[name] += max([a.seconds] + [s.done for s in got if s.done is not None])
                print(f"round {r + 1} {name}: {len(got)} sent, {sum(s.status == 200 for s in got)} served",
                      flush=True)
    finally:
        for p in (stack.procs if stack else []) + fleet.procs:
            p.stop()
    rows: list[ClassRow] = []
    for name in names:
        rates = {c: x * cap for c, x in PHASES[name][0].items()}
        rows += rows_for(name, samples[name], rates, spans[name])
        errors = collections.Counter(s.error or s.status for s in samples[name] if s.status not in (200, 429, 503))
        if errors:
            print(f"{name}: client errors {dict(errors.most_common(3))}", flush=True)
    table = markdown(rows)
    notes = verdicts(rows)
    header = (f"capacity C = {cap:.1f} req/s ({a.servers} modelsim servers x {a.max_num_seqs} slots, {a.max_tokens} "
              f"streamed output tokens, prompts ~{a.prompt_chars // 4} tokens); phases interleaved, "
              f"{ns.rounds} x {a.seconds:.0f} s each; sheddableThreshold {a.sheddable_threshold}")
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.md").write_text(header + "\n\n" + table + "\n\n" + "\n".join(f"- {n}" for n in notes) + "\n")
    (out / "results.json").write_text(json.dumps({"capacity_rps": cap, "args": asdict(a), "rounds": ns.rounds,
                                                   "rows": [asdict(r) for r in rows], "verdicts": notes,
                                                   "spans_s": spans,
                                                   "samples": {n: [asdict(x) for x in v] for n, v in samples.items()}}))
    print("\n" + header + "\n\n" + table + "\n")
    for n in notes:
        print("-", n)


if __name__ == "__main__":
    asyncio.run(main())
