"""The multimodal regime replayed on a virtual clock: Pointsman's scheduler (the real plugins, in process) in front of
modelsim's engines (the real engine model with its media placeholders and mm hashes), with no processes, no network
and no other load on the machine. Routing policies compare exactly; the live regime (`python -m bench.routing.run
--regimes multimodal`) adds Envoy, the ext_proc hop, the peers and the machine's noise.

    python -m bench.routing.mm_sim --qps 10,25 --duration 30 --seeds 0,1 \\
        --policy pointsman --policy text-priced:config=/path/profile.yaml --policy round-robin

The QPS stages run in sequence on one fleet (as the live run's stages do), each request shows an image of the
regime's pool as a data URL. A policy is `round-robin` (the requests in turn, Envoy's default) or NAME[:config=
PROFILE] (Pointsman's built-in default, or PROFILE). Pointsman sees the prompt as the shell builds it (each image's
payload masked to its identity, the request marked as holding media), each engine's running and waiting counts as
of its last scrape (`--scrape-interval`, 0.05 s) and its own in-flight counts. Reported per stage: TTFT p50 / p90 /
p99 and e2e p50 / p90 (model seconds from the arrival to the engine's first and last token), the prefix hit (cached / prompt tokens) and
`lost`: requests placed where their cached prefix was at least a block shorter than on the best engine at that
moment (the engines' own caches, probed).
"""

from __future__ import annotations

import argparse
import itertools
import math
import random
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from bench.routing.regimes import FleetSpec, regimes
from bench.routing.report import percentile
from bench.routing.slo_sim import Fleet
from bench.routing.workload import Planned, Workload
from epp.tokenize import holds_media, mask_media
from modelsim.config import EngineConfig
from modelsim.engine import Engine, Seq, SimRequest
from modelsim.tokenizer import request_inputs
from scheduling.api import InflightLoad, Scheduler, SchedulingContext
from scheduling.config import load_scheduler
from scheduling.types import ApiKind, Endpoint, LLMRequest

MODEL = "meta-llama/Llama-3.1-8B"
BLOCK = 16  # modelsim's block size: a placement is `lost` when it gives up a block or more of cached prefix


@dataclass(frozen=True)
class Served:
    stage: int
    ttft: float
    e2e: float
    cached: int
    tokens: int
    lost: bool


@dataclass
class MediaReplay:
    """One policy over one planned workload (`plan`: arrival, request, stage, in arrival order)."""

    policy: str
    config: str | None
    fleet: Fleet
    seed: int
    done: list[Served] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.scheduler: Scheduler | None = (None if self.policy == "round-robin"
                                            else load_scheduler(self.config, rng=random.Random(self.seed)))
        self.turn = itertools.count()
        self.live: dict[int, tuple[Endpoint, SchedulingContext | None, Any, int, bool]] = {}

    def run(self, plan: list[tuple[float, Planned, int]]) -> None:
        i = 0
        while True:
            t_arr = plan[i][0] if i < len(plan) else math.inf
            t_eng = min((t for g in self.fleet.engines if (t := g.next_event_time()) is not None), default=math.inf)
            t = min(t_arr, t_eng)
            if t == math.inf:
                return
            for g in self.fleet.engines:
                for kind, seq, at in g.advance(t):
                    if kind == "finish":
                        self._finished(seq, at)
            while i < len(plan) and plan[i][0] <= t:
                self._arrive(i, t, plan[i][1], plan[i][2])
                i += 1

    def _arrive(self, i: int, t: float, p: Planned, stage: int) -> None:
        fleet = self.fleet
        cands = fleet.candidates(t)
        tokens, mm = request_inputs("chat", p.body)
        probes = [g.probe(tokens, None, mm) for g in fleet.engines]
        ctx: SchedulingContext | None = None
        result = None
        if self.scheduler is None:
            ep = cands[next(self.turn) % len(cands)]
        else:
            text = orjson.dumps(p.body["messages"]).decode()
            media = holds_media(p.body)  # the prompt as the shell builds it (epp.request.parsing)
            req = LLMRequest(f"r{i}", MODEL, MODEL, kind=ApiKind.CHAT, prompt=mask_media(text) if media else text,
                             body=p.body, media=media)
            ctx = SchedulingContext(req, cands, {k: InflightLoad(n, 0) for k, n in fleet.inflight.items()}, t)
            result = self.scheduler.schedule(ctx)
            ep = result.primary
            self.scheduler.pre_request(ctx, result)
        fleet.inflight[ep.key] = fleet.inflight.get(ep.key, 0) + 1
        pos = [e.key for e in cands].index(ep.key)
        seq = fleet.engines[pos].submit(SimRequest(f"r{i}", tokens, int(p.body.get("max_tokens", 64)), mm=mm), t)
        self.live[id(seq)] = (ep, ctx, result, stage, probes[pos] + BLOCK <= max(probes))

    def _finished(self, seq: Seq, at: float) -> None:
        ep, ctx, result, stage, lost = self.live.pop(id(seq))
        self.fleet.inflight[ep.key] -= 1
        if self.scheduler is not None and ctx is not None:
            ctx.now = at
            self.scheduler.response_complete(ctx, result)
        if seq.first_token_at is not None:
            self.done.append(Served(stage, seq.first_token_at - seq.arrival, at - seq.arrival, seq.cached_tokens,
                                    len(seq.req.prompt_tokens), lost))


def media_fleet(servers: int, kv_blocks: int, scrape_interval: float) -> Fleet:
    engines = [Engine(EngineConfig(kv_cache_size=kv_blocks)) for _ in range(servers)]
    eps = [Endpoint(f"10.0.0.{i + 1}:8000", f"10.0.0.{i + 1}", 8000, name=f"sim-{i}") for i in range(servers)]
    return Fleet(engines, eps, scrape_interval)


def media_plan(qps: list[float], duration: float, seed: int) -> list[tuple[float, Planned, int]]:
    """The multimodal regime's stages in sequence, 5 model seconds apart (arrival, request, stage)."""
    wl = Workload(regimes(FleetSpec())["multimodal"].spec, MODEL, seed)
    out: list[tuple[float, Planned, int]] = []
    start = 0.0
    for stage, q in enumerate(qps):
        out += [(start + p.at, p, stage) for p in wl.plan(q, duration, 10**6, stage_seed=stage)]
        start += duration + 5.0
    return out


def rows(name: str, done: list[Served], qps: list[float]) -> list[str]:
    out = []
    for stage, q in enumerate(qps):
        d = [x for x in done if x.stage == stage]
        hit = sum(x.cached for x in d) / max(1, sum(x.tokens for x in d))
        ps = [percentile([x.ttft for x in d], v) for v in (0.5, 0.9, 0.99)]
        ps += [percentile([x.e2e for x in d], v) for v in (0.5, 0.9)]
        cells = " | ".join("-" if v is None else f"{v:.3f}" for v in ps)
        out.append(f"| {name} | {q:g} | {len(d)} | {cells} | {100 * hit:.1f}% | {sum(x.lost for x in d)} |")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--servers", type=int, default=4)
    ap.add_argument("--kv-cache-size", type=int, default=1024)
    ap.add_argument("--qps", default="10,25", help="comma list: the stages, in sequence on one fleet")
    ap.add_argument("--duration", type=float, default=30.0, help="model seconds per stage")
    ap.add_argument("--seeds", default="0", help="comma list of workload seeds")
    ap.add_argument("--scrape-interval", type=float, default=0.05)
    ap.add_argument("--policy", action="append", default=[], help="round-robin, or NAME[:config=PATH]")
    args = ap.parse_args(argv)
    policies: list[tuple[str, str | None]] = []
    for text in args.policy or ["pointsman", "round-robin"]:
        name, _, opt = text.partition(":")
        if opt and not opt.startswith("config="):
            raise SystemExit(f"policy {text!r}: the one option is config=PATH")
        config = opt.removeprefix("config=") or None
        if config is not None and not Path(config).is_file():
            raise SystemExit(f"policy {name}: no such profile {config}")
        policies.append((name, config))
    qps = [float(q) for q in args.qps.split(",")]
    print("| policy (seed) | QPS | reqs | TTFT p50 s | TTFT p90 s | TTFT p99 s | e2e p50 s | e2e p90 s | prefix hit | "
          "lost |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for seed in (int(s) for s in args.seeds.split(",")):
        plan = media_plan(qps, args.duration, seed)
        for name, config in policies:
            replay = MediaReplay(name, config, media_fleet(args.servers, args.kv_cache_size, args.scrape_interval),
                                 seed)
            replay.run(plan)
            print("\n".join(rows(f"{name} ({seed})", replay.done, qps)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
