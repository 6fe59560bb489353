"""The outside-traffic regime replayed on a virtual clock, with a per-request account of the slow routed requests.

Pointsman's scheduler (the real plugins, in process, on the engines' KV events) or the greedy oracle in front of
modelsim's engines (the real engine model), with no processes, no network and no other load: two policies compare
exactly on one workload. A share of the requests (`--outside-fraction`) goes straight to a uniformly chosen engine.

    python -m bench.routing.outside_sim --qps 10,20 --duration 60 --seeds 0,1 \\
        --policy pointsman-kv --policy oracle --policy nohold:config=/path/profile.yaml

A policy is `oracle` (modelsim.oracle's greedy cost on the engines' exact state) or NAME[:config=PROFILE][:PARAM=VALUE]:
Pointsman's estimated-latency profile with prefixSource precise (or PROFILE; each PARAM=VALUE, a YAML value, set on
its first plugin, the estimated-latency scorer), its precise index fed every engine's KV events as they happen. Pointsman sees each engine's running and waiting counts as of its last scrape (`--scrape-interval`).
Every routed request is classed by why it was slow: `hit` (its group's prefix cached where it went), `miss-none`
(cached nowhere when it arrived), `miss-elsewhere` (cached on another engine), `queued` (waited for a batch slot),
and the report gives each class's share and TTFT, and where the TTFT p90 of the routed requests falls.
"""

from __future__ import annotations

import argparse
import itertools
import math
import random
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from bench.routing.regimes import FleetSpec, regimes
from bench.routing.report import percentile
from bench.routing.workload import Planned, Workload
from modelsim.config import EngineConfig
from modelsim.engine import Engine, Seq, SimRequest
from modelsim.oracle import predicted_cost
from modelsim.tokenizer import encode, prompt_text
from scheduling.api import InflightLoad, SchedulingContext, SchedulingResult
from scheduling.config import ModelScheduler, load_scheduler
from scheduling.prefix.precise import PreciseIndex
from scheduling.prefix.precise_data import PRECISE_INDEX
from scheduling.types import Endpoint, LLMRequest, Metrics

MODEL = "meta-llama/Llama-3.1-8B"
PROFILE = Path(__file__).resolve().parents[2] / "deploy" / "profiles" / "estimated-latency.yaml"


@dataclass
class Req:
    """One request of the replay and what the engine did with it."""

    i: int
    group: int
    routed: bool
    measured: bool
    server: int = -1
    cached_where: tuple[int, ...] = ()  # engines holding the group's system prompt when it arrived
    seq: Seq | None = None

    @property
    def ttft(self) -> float | None:
        s = self.seq
        return None if s is None or s.first_token_at is None else s.first_token_at - s.arrival

    def cause(self, prefix_tokens: int) -> str:
        s = self.seq
        assert s is not None
        if (s.queue_time or 0.0) > 0.05:
            return "queued"
        if s.cached_tokens >= prefix_tokens:
            return "hit"
        return "miss-elsewhere" if self.cached_where else "miss-none"


@dataclass
class Sim:
    """The engines, what a router last scraped of them, its in-flight counts and the precise index they feed."""

    engines: list[Engine]
    endpoints: list[Endpoint]
    scrape_interval: float
    index: PreciseIndex = field(default_factory=lambda: PreciseIndex(block_size=16))
    inflight: dict[str, int] = field(default_factory=dict)
    scraped_at: float = -math.inf
    actor: str = "queue"  # who stores blocks now: an "outside" or a "routed" arrival, or the engines' queues
    watched: frozenset[int] = frozenset()  # the groups' system-prompt blocks
    last_copies: Counter[str] = field(default_factory=Counter)  # watched blocks evicted with no other engine holding

    def scrape(self, now: float) -> list[Endpoint] | None:
        """A fresh scrape when the interval has passed (the endpoints), else None."""
        if now - self.scraped_at < self.scrape_interval:
            return None
        self.scraped_at = now
        self.endpoints = [Endpoint(e.key, e.address, e.port, name=e.name, metrics=Metrics(
            waiting=len(g.waiting), running=len(g.running), kv_usage=g.kv.usage, block_size=g.cfg.block_size,
            num_gpu_blocks=g.cfg.kv_cache_size, updated_at=now, stale=False))
            for e, g in zip(self.endpoints, self.engines, strict=True)]
        return self.endpoints

    def publish(self) -> None:
        """Every engine's KV events since the last call, into the precise index (as the subscriber applies them)."""
        for ep, g in zip(self.endpoints, self.engines, strict=True):
            for ev in g.kv.drain_events():
                if ev[0] == "stored":
                    self.index.store(ep.key, 0, [ev[1]], ev[2], ev[3], g.cfg.block_size, ev[4])
                elif ev[0] == "removed":
                    self.index.remove(ep.key, 0, [ev[1]])
                    if ev[1] in self.watched and not any(o.kv.contains(ev[1]) for o in self.engines if o is not g):
                        self.last_copies[self.actor] += 1
                else:
                    self.index.clear(ep.key, 0)


def make_sim(servers: int, kv_blocks: int, scrape_interval: float, watched: frozenset[int] = frozenset()) -> Sim:
    engines = [Engine(EngineConfig(kv_cache_size=kv_blocks)) for _ in range(servers)]
    eps = [Endpoint(f"10.0.0.{i + 1}:8000", f"10.0.0.{i + 1}", 8000, name=f"sim-{i}") for i in range(servers)]
    sim = Sim(engines, eps, scrape_interval, watched=watched)
    for e in eps:
        sim.index.clear(e.key, 0)  # a live, empty slot per engine
    return sim


ORACLES = ("oracle", "oracle-victims")
Handle = tuple[SchedulingContext, SchedulingResult] | None  # a routed request's decision, for its end


class Router:
    """Pointsman's scheduler on the precise index, or a greedy oracle on the engines' exact state."""

    def __init__(self, policy: str, config: str | None, sim: Sim, seed: int,
                 params: dict[str, object] | None = None) -> None:
        self.oracle = policy if policy in ORACLES else None
        self.sim = sim
        self.scheduler: ModelScheduler | None = None
        if self.oracle is None:
            doc = yaml.safe_load(Path(config or PROFILE).read_text())
            if config is None:
                doc["plugins"][0]["parameters"]["prefixSource"] = "precise"
            doc["plugins"][0]["parameters"].update(params or {})
            self.scheduler = load_scheduler(doc, rng=random.Random(seed),
                                            services={PRECISE_INDEX: sim.index})

    def scraped(self, endpoints: list[Endpoint], now: float) -> None:
        if self.scheduler is not None:
            self.scheduler.engine_metrics(endpoints, now)

    def pick(self, req: LLMRequest, tokens: list[int], now: float) -> tuple[int, Handle]:
        sim = self.sim
        if self.scheduler is None:
            price = victims_cost if self.oracle == "oracle-victims" else _oracle_cost
            costs = [price(sim.engines, k, tokens) for k in range(len(sim.engines))]
            return min(range(len(costs)), key=costs.__getitem__), None
        cands = sim.endpoints
        inflight = {k: InflightLoad(n, 0) for k, n in sim.inflight.items()}
        ctx = SchedulingContext(req, cands, inflight, now)
        result = self.scheduler.schedule(ctx)
        self.scheduler.pre_request(ctx, result)
        return [e.key for e in cands].index(result.primary.key), (ctx, result)

    def finished(self, handle: Handle, now: float) -> None:
        if self.scheduler is None or handle is None:
            return
        ctx, result = handle
        ctx.now = now
        self.scheduler.response_complete(ctx, result)


def _oracle_cost(engines: list[Engine], k: int, tokens: list[int]) -> float:
    return predicted_cost(_state(engines[k], tokens), 0, 64)


def victims_cost(engines: list[Engine], k: int, tokens: list[int]) -> float:
    """The oracle's cost with its eviction term replaced by the blocks engine `k` would really evict (the head of
    its LRU list), each priced at its whole prefill when no other engine holds it and at nothing when one does: what
    a router that knew every engine's eviction order could add to the greedy oracle."""
    g = engines[k]
    st = _state(g, tokens)
    per_block = g.cfg.block_size * g.cfg.prefill_per_token
    uncached = len(tokens) - g.probe(tokens)
    over = max(0, -(-(uncached + 64) // g.cfg.block_size) - g.kv.fresh)
    others = [e.kv for j, e in enumerate(engines) if j != k]
    sole = sum(1 for h in itertools.islice(g.kv.lru_order(), over) if not any(o.contains(h) for o in others))
    return predicted_cost(st, 0, 64) - over * per_block / 2 + sole * per_block


def _state(g: Engine, tokens: list[int]) -> dict[str, object]:
    return {"max_num_seqs": g.cfg.max_num_seqs, "running": len(g.running), "waiting": len(g.waiting),
            "load_factor": g.cfg.load_factor, "prompt_tokens": len(tokens), "cached_tokens": g.probe(tokens),
            "prefill_overhead": g.cfg.prefill_overhead, "prefill_per_token": g.cfg.prefill_per_token,
            "itl": g.cfg.itl, "block_size": g.cfg.block_size, "fresh_blocks": g.kv.fresh}


class Replay:
    """One policy over one planned workload."""

    def __init__(self, router: Router, sim: Sim, system_tokens: int) -> None:
        self.router, self.sim = router, sim
        self.system_tokens = system_tokens  # a group's system prompt, in whole blocks of tokens
        self.live: dict[int, tuple[Req, Handle]] = {}
        self.reqs: list[Req] = []

    def run(self, plan: list[tuple[float, Planned, bool, int]]) -> list[Req]:
        """`plan`: (arrival, request, measured, outside server or -1) in arrival order."""
        i, sim = 0, self.sim
        while True:
            t_arr = plan[i][0] if i < len(plan) else math.inf
            t_eng = min((t for g in sim.engines if (t := g.next_event_time()) is not None), default=math.inf)
            t = min(t_arr, t_eng)
            if t == math.inf:
                return self.reqs
            self._advance(t)
            while i < len(plan) and plan[i][0] <= t:
                self._arrive(i, *plan[i])
                i += 1

    def _advance(self, t: float) -> None:
        for g in self.sim.engines:
            for kind, seq, at in g.advance(t):
                if kind == "finish":
                    self._finished(seq, at)
        self.sim.publish()
        eps = self.sim.scrape(t)
        if eps is not None:
            self.router.scraped(eps, t)

    def _arrive(self, i: int, t: float, p: Planned, measured: bool, outside: int) -> None:
        sim = self.sim
        text = prompt_text("chat", p.body)
        tokens = encode(text)
        head = tokens[: self.system_tokens]
        where = tuple(k for k, g in enumerate(sim.engines) if g.probe(head + [0]) >= self.system_tokens)
        r = Req(i, p.group, outside < 0, measured, cached_where=where)
        handle: Handle = None
        if outside >= 0:
            r.server = outside
        else:
            req = LLMRequest(f"r{i}", MODEL, MODEL, headers={}, prompt=text, body=p.body, token_ids=tokens)
            r.server, handle = self.router.pick(req, tokens, t)
            key = sim.endpoints[r.server].key
            sim.inflight[key] = sim.inflight.get(key, 0) + 1
        sim.actor = "outside" if outside >= 0 else "routed"
        r.seq = sim.engines[r.server].submit(SimRequest(f"r{i}", tokens, int(p.body.get("max_tokens", 64))), t)
        sim.publish()
        sim.actor = "queue"
        self.live[id(r.seq)] = (r, handle)
        self.reqs.append(r)

    def _finished(self, seq: Seq, at: float) -> None:
        r, handle = self.live.pop(id(seq))
        if r.routed:
            self.sim.inflight[self.sim.endpoints[r.server].key] -= 1
            self.router.finished(handle, at)


def plan(servers: int, qps: float, duration: float, outside: float, seed: int) -> tuple[
        list[tuple[float, Planned, bool, int]], int, frozenset[int]]:
    """The warm-up (one routed request per group) then a Poisson stage with `outside` of it bypassing the router;
    a group's system prompt in whole blocks of tokens; and the hashes of the system prompts' blocks."""
    spec = regimes(FleetSpec(servers=servers))["pressure"].spec
    wl = Workload(spec, MODEL, seed)
    rng = random.Random(f"{seed}/outside/{qps}")
    warm = wl.warmup(8.0)
    start = (warm[-1].at if warm else 0.0) + 5.0
    stage = wl.plan(qps, duration, 10**6, stage_seed=0)
    out = [(p.at, p, False, -1) for p in warm]
    for p in stage:
        bypass = rng.random() < outside
        out.append((start + p.at, p, True, rng.randrange(servers) if bypass else -1))
    system = len(encode(prompt_text("chat", {"messages": [wl.body(0, 0)["messages"][0]]}))) // 16 * 16 - 16
    probe = Engine(EngineConfig())
    blocks = frozenset(h for g in range(spec.num_groups)
                       for h in probe.kv_chain(encode(prompt_text("chat", wl.body(g, 0)))[:system]))
    return out, system, blocks


def report(name: str, reqs: list[Req], system_tokens: int, last_copies: Counter[str]) -> str:
    """One row: routed TTFT p50 / p90, all requests' p90, the routed requests' causes (share, TTFT p50), the mean
    number of engines holding a routed request's group as it arrived, and the system prompts' blocks evicted while
    no other engine held them (in system prompts), by whose admission evicted them."""
    routed = [r for r in reqs if r.measured and r.routed and r.ttft is not None]
    every = [r.ttft for r in reqs if r.measured and r.ttft is not None]
    ttfts = [r.ttft for r in routed if r.ttft is not None]
    by: dict[str, list[float]] = {}
    for r in routed:
        by.setdefault(r.cause(system_tokens), []).append(r.ttft or 0.0)
    cells = []
    for c in ("hit", "miss-elsewhere", "miss-none", "queued"):
        v = by.get(c, [])
        cells.append(f"{100 * len(v) / max(1, len(routed)):.1f}% / {percentile(v, 0.5) or 0:.3f}")
    spread = Counter(len(r.cached_where) for r in routed)
    lost = " / ".join(f"{last_copies[a] / (system_tokens // 16):.1f}" for a in ("outside", "routed", "queue"))
    return (f"| {name} | {len(routed)} | {percentile(ttfts, 0.5) or 0:.3f} | {percentile(ttfts, 0.9) or 0:.3f} | "
            f"{percentile(every, 0.9) or 0:.3f} | " + " | ".join(cells) +
            f" | {sum(k * n for k, n in spread.items()) / max(1, len(routed)):.2f} | {lost} |")


HEADER = ("| policy (QPS, seed) | routed | TTFT p50 | TTFT p90 | all p90 | hit | miss, cached elsewhere | "
          "miss, cached nowhere | queued | copies at arrival | last copies evicted, by outside / routed / queue |\n"
          "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")


def parse_policy(text: str) -> tuple[str, str | None, dict[str, object]]:
    """NAME[:config=PATH][:PARAM=VALUE]... as (name, profile or None, the scorer parameters to set)."""
    name, *opts = text.split(":")
    cfg: str | None = None
    params: dict[str, object] = {}
    for o in opts:
        k, sep, v = o.partition("=")
        if not sep:
            raise SystemExit(f"policy {text!r}: options are config=PATH and PARAM=VALUE")
        if k == "config":
            if not Path(v).is_file():
                raise SystemExit(f"policy {name}: no such profile {v}")
            cfg = v
        else:
            params[k] = yaml.safe_load(v)
    return name, cfg, params


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--servers", type=int, default=4)
    ap.add_argument("--kv-cache-size", type=int, default=1024)
    ap.add_argument("--qps", default="10,20", help="comma list")
    ap.add_argument("--duration", type=float, default=60.0, help="model seconds of the measured stage")
    ap.add_argument("--outside-fraction", type=float, default=0.3)
    ap.add_argument("--seeds", default="0", help="comma list of workload seeds")
    ap.add_argument("--scrape-interval", type=float, default=0.05)
    ap.add_argument("--policy", action="append", default=[], help="oracle or NAME[:config=PATH]")
    args = ap.parse_args(argv)
    policies = [parse_policy(text) for text in args.policy or ["pointsman-kv", "oracle"]]
    print(HEADER)
    for qps in (float(q) for q in args.qps.split(",")):
        for seed in (int(s) for s in args.seeds.split(",")):
            the_plan, system, blocks = plan(args.servers, qps, args.duration, args.outside_fraction, seed)
            for name, cfg, params in policies:
                sim = make_sim(args.servers, args.kv_cache_size, args.scrape_interval, blocks)
                router = Router(name, cfg, sim, seed, params)
                reqs = Replay(router, sim, system).run(the_plan)
                print(report(f"{name} ({qps:g}, {seed})", reqs, system, sim.last_copies), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
