"""The slo regime replayed on a virtual clock: Pointsman's scheduler (the real plugins, in process) in front of
modelsim's engines (the real engine model, `modelsim.engine.Engine`), with no processes, no network and no other
load on the machine. It measures the routing policy alone, so two policies compare exactly on one workload; the
live regime (`python -m bench.routing.run --regimes slo`) adds Envoy, the ext_proc hop and the machine's noise.

    python -m bench.routing.slo_sim --servers 8 --qps 32 --duration 60 --slo-mix 0.3:250/20,0.7:2000 \\
        --policy pointsman --policy nohdr:headers=none --policy y0:config=/path/profile.yaml

A policy is NAME[:headers=plain|none][:config=PROFILE][:hold=on|off][:phases=lean|full]: Pointsman's built-in default (or PROFILE)
sees the requests with the plain SLO headers (`x-slo-ttft-ms` / `x-slo-tpot-ms`) or with none. As the shell does,
the replay holds a loose request back while its pick is busy (scheduling/latency/hold.py: a tight request there has
not had its first token, or sloHoldShare × maxNumSeqs are in flight), until it is not or its slack runs out, then
schedules it afresh; `hold=off` sends every request at once (as before holding existed). A tight request is pending
until its predicted TTFT has passed or it ends, and with `phases=full` also until its first token (Pointsman sees it
with Envoy's response phases; the benchmark runs Pointsman with lean phases, the default here). The last column counts the
requests held and the p90 of their wait. The pressure workload
(groups sized to 73% of the fleet's KV) starts with one request per group, unmeasured, then a Poisson stage.
Pointsman sees each engine's running and waiting counts as of its last scrape (`--scrape-interval`, 0.05 s) and
its own in-flight counts; TTFT is the engine's first token minus the arrival, plus `--hop-ms` (a fixed router hop).
"""

from __future__ import annotations

import argparse
import heapq
import math
import random
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from bench.routing.client import SLO_HEADERS
from bench.routing.regimes import FleetSpec, regimes
from bench.routing.report import percentile
from bench.routing.workload import Planned, SloMix, Workload
from modelsim.config import EngineConfig
from modelsim.engine import Engine, Seq, SimRequest
from modelsim.tokenizer import encode, prompt_text
from scheduling.api import InflightLoad, Scheduler, SchedulingContext, SchedulingResult
from scheduling.config import load_scheduler
from scheduling.latency import SloVerdict, TightWork, busy, decision_slo, hold_budget, is_tight
from scheduling.types import Endpoint, LLMRequest, Metrics

MODEL = "meta-llama/Llama-3.1-8B"


@dataclass(frozen=True)
class Policy:
    name: str
    headers: str = "plain"  # bench.routing.client.SLO_HEADERS
    config: str | None = None  # a scheduling profile; None: the built-in default
    hold: str = "on"  # on: loose requests the profile marks holdable wait while their pick is busy
    phases: str = "lean"  # lean: Pointsman never sees a response's first token (the benchmark's Envoy); full: it does

    @classmethod
    def parse(cls, text: str) -> Policy:
        name, *opts = text.split(":")
        kw: dict[str, str] = {}
        for o in opts:
            k, sep, v = o.partition("=")
            if not sep or k not in ("headers", "config", "hold", "phases"):
                raise ValueError(f"policy {text!r}: options are headers=plain|none, config=PATH, hold=on|off and "
                                 "phases=lean|full")
            kw[k] = v
        if kw.get("headers", "plain") not in SLO_HEADERS:
            raise ValueError(f"policy {text!r}: headers must be one of {', '.join(SLO_HEADERS)}")
        if kw.get("hold", "on") not in ("on", "off") or kw.get("phases", "lean") not in ("lean", "full"):
            raise ValueError(f"policy {text!r}: hold must be on or off, phases lean or full")
        return cls(name, **kw)


@dataclass
class Done:
    tight: bool
    ttft: float
    tpot: float | None
    slo_ttft: float | None
    slo_tpot: float | None

    @property
    def met(self) -> bool:
        if self.slo_ttft is not None and self.ttft > self.slo_ttft:
            return False
        return self.slo_tpot is None or (self.tpot is not None and self.tpot <= self.slo_tpot)


@dataclass
class Fleet:
    """The engines, what Pointsman last scraped of them, and its in-flight counts."""

    engines: list[Engine]
    endpoints: list[Endpoint]
    scrape_interval: float
    inflight: dict[str, int] = field(default_factory=dict)
    scraped_at: float = -math.inf

    def candidates(self, now: float) -> list[Endpoint]:
        if now - self.scraped_at >= self.scrape_interval:
            self.scraped_at = now
            self.endpoints = [Endpoint(e.key, e.address, e.port, name=e.name, metrics=Metrics(
                waiting=len(g.waiting), running=len(g.running), kv_usage=g.kv.usage, updated_at=now, stale=False))
                for e, g in zip(self.endpoints, self.engines, strict=True)]
        return self.endpoints


def _fleet(servers: int, kv_blocks: int, scrape_interval: float) -> Fleet:
    engines = [Engine(EngineConfig(kv_cache_size=kv_blocks)) for _ in range(servers)]
    eps = [Endpoint(f"10.0.0.{i + 1}:8000", f"10.0.0.{i + 1}", 8000, name=f"sim-{i}") for i in range(servers)]
    return Fleet(engines, eps, scrape_interval)


class Replay:
    """One policy over one planned workload."""

    def __init__(self, policy: Policy, fleet: Fleet, seed: int, hop: float) -> None:
        self.policy, self.fleet, self.hop = policy, fleet, hop
        rng = random.Random(seed)
        self.scheduler: Scheduler = load_scheduler(policy.config, rng=rng)
        self.live: dict[int, Live] = {}
        self.hold = policy.hold == "on"  # hold loose requests while their pick is busy (hold.py)
        self.full = policy.phases == "full"  # Pointsman sees each response's first token
        self.tight = TightWork()
        self.holds = Holds()
        self.held_for: list[float] = []  # how long each request that was held waited
        self.done: list[Done] = []
        self.placed: Counter[str] = Counter()  # the classes the scheduler placed requests as (tight, loose)

    def run(self, plan: list[tuple[float, Planned, bool]]) -> None:
        """`plan`: (arrival, request, measured) in arrival order."""
        i = 0
        holds = self.holds
        while True:
            t_arr = plan[i][0] if i < len(plan) else math.inf
            t_eng = min((t for g in self.fleet.engines if (t := g.next_event_time()) is not None), default=math.inf)
            t = min(t_arr, t_eng, holds.next_deadline(), holds.next_wake())
            if t == math.inf:
                return
            self._advance(t)
            for key in holds.woken(t):  # the tight work pending there is due to have started
                self._pump(key, t)
            for h in holds.expired(t):
                self._send(h, t)
            while i < len(plan) and plan[i][0] <= t:
                self._arrive(Held(i, *plan[i]), t)
                i += 1

    def _advance(self, t: float) -> None:
        for g in self.fleet.engines:
            for kind, seq, at in g.advance(t):
                if kind == "finish":
                    self._finished(seq, at)
                elif seq.generated == 1 and self.full and self.live[id(seq)].tight:  # (seen: response phases)
                    live = self.live[id(seq)]
                    self.tight.started(live.ep.key, live.h.i)
                    self._pump(live.ep.key, at)

    def _busy(self, key: str, verdict: SloVerdict, t: float) -> bool:
        return busy(verdict, self.tight.busy(key, t), self.fleet.inflight.get(key, 0))

    def _pump(self, key: str, t: float) -> None:
        """`key` may no longer be busy: the requests held for it go, oldest first, while it is not."""
        while (h := self.holds.first(key)) is not None and not self._busy(key, h.verdict, t):
            self.holds.take(key)
            self._send(h.h, t)

    def _request(self, h: Held) -> LLMRequest:
        p = h.p
        names = SLO_HEADERS[self.policy.headers]
        headers: dict[str, str] = {}
        if names is not None and p.slo_ttft is not None:
            headers[names[0]] = f"{p.slo_ttft * 1000:g}"
            if p.slo_tpot is not None:
                headers[names[1]] = f"{p.slo_tpot * 1000:g}"
        return LLMRequest(f"r{h.i}", MODEL, MODEL, headers=headers, prompt=prompt_text("chat", p.body), body=p.body)

    def _arrive(self, h: Held, t: float) -> None:
        """A request arrives: scheduled and sent, or held while its pick has tight work pending (hold.py)."""
        self._send(h, t, may_hold=True)

    def _send(self, h: Held, t: float, may_hold: bool = False) -> None:
        req = self._request(h)
        fleet = self.fleet
        cands = fleet.candidates(t)
        inflight = {k: InflightLoad(n, 0) for k, n in fleet.inflight.items()}
        ctx = SchedulingContext(req, cands, inflight, t)
        result = self.scheduler.schedule(ctx)
        ep = result.primary
        verdict = decision_slo(result.state)
        if may_hold and self.hold and verdict is not None:
            budget = hold_budget(verdict, ep.key)
            if budget > 0 and self._busy(ep.key, verdict, t):
                self.holds.add(ep.key, Waiting(h, verdict), t + budget, self.tight.until(ep.key))
                return
        if verdict is not None:
            self.placed[verdict.klass] += 1
        if not may_hold:
            self.held_for.append(t - h.at)
        self.scheduler.pre_request(ctx, result)
        fleet.inflight[ep.key] = fleet.inflight.get(ep.key, 0) + 1
        tight = is_tight(verdict)
        if tight and verdict is not None:  # pending until its first token (seen), its end or its predicted TTFT
            self.tight.sent(ep.key, h.i, t + verdict.predicted[ep.key][0])
        engine = fleet.engines[[e.key for e in cands].index(ep.key)]
        seq = engine.submit(SimRequest(f"r{h.i}", encode(req.prompt), int(h.p.body.get("max_tokens", 64))), t)
        self.live[id(seq)] = Live(seq, ep, ctx, result, h, tight)

    def _finished(self, seq: Seq, at: float) -> None:
        live = self.live.pop(id(seq))
        ep, ctx, result, h = live.ep, live.ctx, live.result, live.h
        self.fleet.inflight[ep.key] -= 1
        if live.tight:
            self.tight.started(ep.key, h.i)
        ctx.now = at
        self.scheduler.response_complete(ctx, result)
        self._pump(ep.key, at)
        if not h.measured or seq.first_token_at is None:
            return
        n = seq.generated
        p = h.p
        tpot = (at - seq.first_token_at) / (n - 1) if n > 1 else None
        self.done.append(Done(p.tight, seq.first_token_at - h.at + self.hop, tpot, p.slo_ttft, p.slo_tpot))


@dataclass(frozen=True)
class Held:
    """A planned request (its index, arrival, body and objectives, whether it is measured)."""

    i: int
    at: float
    p: Planned
    measured: bool


@dataclass(frozen=True)
class Live:
    seq: Seq
    ep: Endpoint
    ctx: SchedulingContext
    result: SchedulingResult
    h: Held
    tight: bool  # placed as tight: held loose requests wait for its first token


@dataclass(frozen=True)
class Waiting:
    h: Held
    verdict: SloVerdict  # what it was held for (its pick's busy rule)


class Holds:
    """The loose requests held back, by the endpoint they wait for, and their deadlines."""

    def __init__(self) -> None:
        self.by_key: dict[str, dict[int, Waiting]] = {}
        self.deadlines: list[tuple[float, int, str]] = []
        self.wakes: list[tuple[float, str]] = []  # when the tight work a key's held requests wait for is due

    def add(self, key: str, w: Waiting, deadline: float, wake: float | None) -> None:
        self.by_key.setdefault(key, {})[w.h.i] = w
        heapq.heappush(self.deadlines, (deadline, w.h.i, key))
        if wake is not None and wake < deadline:
            heapq.heappush(self.wakes, (wake, key))

    def next_wake(self) -> float:
        return self.wakes[0][0] if self.wakes else math.inf

    def woken(self, t: float) -> list[str]:
        out = []
        while self.wakes and self.wakes[0][0] <= t:
            out.append(heapq.heappop(self.wakes)[1])
        return out

    def first(self, key: str) -> Waiting | None:
        waiting = self.by_key.get(key)
        return next(iter(waiting.values())) if waiting else None

    def take(self, key: str, i: int | None = None) -> Waiting:
        waiting = self.by_key[key]
        w = waiting.pop(next(iter(waiting)) if i is None else i)
        if not waiting:
            del self.by_key[key]
        return w

    def _live(self, i: int, key: str) -> bool:
        return i in self.by_key.get(key, {})

    def next_deadline(self) -> float:
        dl = self.deadlines
        while dl and not self._live(dl[0][1], dl[0][2]):
            heapq.heappop(dl)
        return dl[0][0] if dl else math.inf

    def expired(self, t: float) -> list[Held]:
        out = []
        while self.next_deadline() <= t:
            _, i, key = heapq.heappop(self.deadlines)
            out.append(self.take(key, i).h)
        return out


def _plan(servers: int, qps: float, duration: float, mix: SloMix, seed: int) -> list[tuple[float, Planned, bool]]:
    spec = regimes(FleetSpec(servers=servers))["pressure"].spec
    wl = Workload(spec, MODEL, seed)
    warm = wl.warmup(8.0)
    start = (warm[-1].at if warm else 0.0) + 5.0
    stage = wl.plan(qps, duration, 10**6, stage_seed=0, slo=mix)
    return [(p.at, p, False) for p in warm] + [(start + p.at, p, True) for p in stage]


def summarize(name: str, done: list[Done], duration: float, held: list[float]) -> str:
    tight = [d for d in done if d.tight]
    loose = [d for d in done if not d.tight]

    def pq(ds: list[Done], q: float) -> str:
        v = percentile([d.ttft for d in ds], q)
        return "-" if v is None else f"{v:.3f}"

    met = sum(d.met for d in done)
    return (f"| {name} | {len(done)} ({len(tight)}) | {100 * sum(d.met for d in tight) / max(1, len(tight)):.1f}% | "
            f"{100 * met / max(1, len(done)):.1f}% | {pq(tight, 0.5)} / {pq(tight, 0.9)} | {pq(loose, 0.5)} / "
            f"{pq(loose, 0.9)} | {met / duration:.2f} | {len(held)} / {1000 * (percentile(held, 0.9) or 0.0):.0f} |")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--servers", type=int, default=8)
    ap.add_argument("--kv-cache-size", type=int, default=1024)
    ap.add_argument("--qps", type=float, default=32.0)
    ap.add_argument("--duration", type=float, default=60.0, help="model seconds of the measured stage")
    ap.add_argument("--slo-mix", default="0.3:250/20,0.7:2000")
    ap.add_argument("--seeds", default="0", help="comma list of workload seeds")
    ap.add_argument("--scrape-interval", type=float, default=0.05)
    ap.add_argument("--hop-ms", type=float, default=0.0)
    ap.add_argument("--policy", action="append", default=[],
                    help="NAME[:headers=plain|none][:config=PATH][:hold=on|off][:phases=lean|full]")
    args = ap.parse_args(argv)
    policies = [Policy.parse(p) for p in args.policy] or [Policy("pointsman"), Policy("pointsman-nohdr", "none")]
    for p in policies:
        if p.config is not None and not Path(p.config).is_file():
            raise SystemExit(f"policy {p.name}: no such profile {p.config}")
    mix = SloMix.parse(args.slo_mix)
    print("| policy (seed) | reqs (tight) | tight met | all met | tight TTFT p50 / p90 s | loose TTFT p50 / p90 s | "
          "goodput req/s | held / p90 ms |\n|---|---:|---:|---:|---:|---:|---:|---:|")
    for seed in (int(s) for s in args.seeds.split(",")):
        plan = _plan(args.servers, args.qps, args.duration, mix, seed)
        for p in policies:
            replay = Replay(p, _fleet(args.servers, args.kv_cache_size, args.scrape_interval), seed, args.hop_ms / 1e3)
            replay.run(plan)
            print(summarize(f"{p.name} ({seed})", replay.done, args.duration, replay.held_for), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
