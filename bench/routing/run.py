"""Routing benchmark runner: a fresh modelsim fleet per (router, regime, workload sample), a ladder per regime.

    python -m bench.routing.run                 # full run, all routers and the original regimes
    python -m bench.routing.run --quick         # a few minutes: 2 regimes, 2 QPS points, short stages
    python -m bench.routing.run --routers oracle,envoy-rr --regimes pressure --qps 10,20
    python -m bench.routing.run --regimes slo,agent --router-variant 'pointsman-s1:--seed 1'

Writes bench/out/routing/results.md, results.json and one PNG per regime. All latencies and rates are in
*model* time (wall time / time scale), so runs at different time scales are comparable; router overhead
is magnified by 1/time_scale in model time. Regimes are sized against the fleet's KV cache:
``pressure`` makes distinct prefixes about 73% of the cluster's KV (several times one server's). The regimes and
their flags: bench/routing/README.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
from dataclasses import asdict, replace
from pathlib import Path

from bench.routing.agent import AgentSpec, parse_carriers
from bench.routing.agent_client import AgentRow, agent_markdown
from bench.routing.procs import ROOT
from bench.routing.regimes import FleetSpec, Regime, RegimeOptions, regimes
from bench.routing.report import Row, markdown, write_outputs
from bench.routing.routers import DEFAULT_ROUTERS, ROUTERS, Adapter, Unavailable
from bench.routing.stages import run_one
from bench.routing.variants import parse_variant, variant_adapter
from bench.routing.workload import SloMix

ORIGINAL_REGIMES = ("fits", "pressure", "skew", "no-sharing", "outside-traffic", "cache-resets")


def _floats(text: str) -> tuple[float, ...]:
    return tuple(float(x) for x in text.split(",") if x.strip())


def regime_options(args: argparse.Namespace) -> RegimeOptions:
    if not 0.0 <= args.outside_fraction < 1.0:
        raise ValueError(f"--outside-fraction must be in [0, 1), got {args.outside_fraction}")
    agent = AgentSpec(turns=args.agent_turns, turns_spread=min(args.agent_turns - 1, args.agent_turns_spread),
                      pause_mean=args.agent_pause, fanout_share=args.agent_fanout,
                      carriers=parse_carriers(args.session_carrier), session_header=args.session_header)
    return RegimeOptions(outside=args.outside_fraction, reset_every=args.reset_every,
                         saturation_qps=args.saturation_qps, saturation_samples=args.saturation_samples,
                         slo=SloMix.parse(args.slo_mix, args.slo_tpot_ms), slo_headers=args.slo_headers,
                         slo_strip=tuple(x for x in args.slo_strip.split(",") if x), agent=agent,
                         agent_concurrency=_floats(args.agent_concurrency) if args.agent_concurrency
                         else (16.0 * args.servers,), agent_sessions=args.agent_sessions)


def _plan(args: argparse.Namespace, all_regimes: dict[str, Regime],
          variants: dict[str, Adapter]) -> list[tuple[Regime, list[str]]]:
    """The regimes to run (with the ladder and sample overrides applied), each with its routers."""
    names = args.regimes.split(",") if args.regimes else (["fits", "pressure"] if args.quick
                                                            else list(ORIGINAL_REGIMES))
    out = []
    for name in names:
        if name not in all_regimes:
            raise ValueError(f"unknown regime {name!r}; choose from {sorted(all_regimes)}")
        regime = all_regimes[name]
        if args.qps:
            regime = replace(regime, qps=_floats(args.qps))
        elif args.quick:
            regime = replace(regime, qps=regime.qps[:: max(1, len(regime.qps) - 1)][:2])
        if args.samples:
            regime = replace(regime, samples=tuple(int(x) for x in args.samples.split(",")))
        routers = args.routers.split(",") if args.routers else list(regime.routers or DEFAULT_ROUTERS)
        routers += [v for v in variants if v not in routers]
        for r in routers:
            if r not in ROUTERS and r not in variants:
                raise ValueError(f"unknown router {r!r}; choose from {sorted(ROUTERS)} or declare it with "
                                 f"--router-variant")
        out.append((regime, routers))
    return out


async def main_async(args: argparse.Namespace) -> int:
    fs = FleetSpec(servers=args.servers, time_scale=args.time_scale, kv_cache_size=args.kv_cache_size,
                   latency_factors=_floats(args.latency_factors) if args.latency_factors else (),
                   engine_type=args.engine_type, metrics_time=args.metrics_time)
    try:
        variants: dict[str, Adapter] = {}
        for text in args.router_variant:
            v = parse_variant(text, set(ROUTERS) | set(variants))
            variants[v.name] = variant_adapter(v)
        plan = _plan(args, regimes(fs, regime_options(args), args.seed), variants)
    except ValueError as exc:
        print(f"bench.routing.run: {exc}", file=sys.stderr)
        return 2
    duration = args.duration or (15.0 if args.quick else 45.0)
    out_dir = Path(args.out)
    rows: list[Row] = []
    agent_rows: list[AgentRow] = []
    skipped: list[str] = []
    try:
        await _run_all(plan, {**ROUTERS, **variants}, args, fs, duration, out_dir / "work", rows, agent_rows, skipped)
    except asyncio.CancelledError:
        skipped.append("interrupted: the table holds the stages finished before the interrupt")
        _write(rows, agent_rows, skipped, fs, duration, out_dir, args.router_variant)
        raise
    _write(rows, agent_rows, skipped, fs, duration, out_dir, args.router_variant)
    return 0


async def _run_all(plan: list[tuple[Regime, list[str]]], adapters: dict[str, Adapter], args: argparse.Namespace,
                   fs: FleetSpec, duration: float, workdir: Path, rows: list[Row], agent_rows: list[AgentRow],
                   skipped: list[str]) -> None:
    for regime, routers in plan:
        s = regime.spec
        if regime.agent is not None:
            a = regime.agent
            print(f"regime {regime.name}: agent sessions, {a.agent_types} agents x {a.system_len}-token system "
                  f"prompts, {a.turns}±{a.turns_spread} turns, output {a.output_len}, tool results {a.tool_len}, "
                  f"pause mean {a.pause_mean} s, fan-out {a.fanout_share:.0%}; concurrency {list(regime.qps)}",
                  flush=True)
        else:
            print(f"regime {regime.name}: {s.num_groups} groups x {s.prompts_per_group}, system "
                  f"{s.system_prompt_len} tok, question {s.question_len}, output {s.output_len}, zipf {s.zipf_s}"
                  + (f", {s.images} images (zipf {s.image_zipf}, {s.image_bytes} bytes)" if s.images else "") + "; "
                  f"distinct prefixes {s.distinct_prefix_tokens} tok = "
                  f"{100 * s.distinct_prefix_tokens / fs.cluster_tokens:.0f}% of cluster KV; QPS {list(regime.qps)}",
                  flush=True)
        for seed in regime.samples or (args.seed,):
            for router in routers:
                try:
                    got = await run_one(router, adapters[router], regime, fs, duration, args.max_requests, workdir,
                                        seed)
                except Unavailable as exc:
                    skipped.append(f"{router}: {exc}")
                    print(f"  {router}: skipped ({exc})", flush=True)
                    continue
                except RuntimeError as exc:
                    skipped.append(f"{router}/{regime.name}: failed: {str(exc)[:300]}")
                    print(f"  {router}/{regime.name}: FAILED {exc}", flush=True)
                    continue
                agent_rows += [r for r in got if isinstance(r, AgentRow)]
                rows += [r for r in got if isinstance(r, Row)]


def _write(rows: list[Row], agent_rows: list[AgentRow], skipped: list[str], fs: FleetSpec, duration: float,
           out_dir: Path, variants: list[str]) -> None:
    hetero = f", latency factors {list(fs.latency_factors)}" if fs.latency_factors else ""
    header = (f"# Routing benchmark\n\nFleet: {fs.servers} modelsim servers x {fs.kv_cache_size} KV blocks of 16 "
              f"tokens, max-num-seqs {fs.max_num_seqs}, time scale {fs.time_scale}{hetero}, {fs.engine_type} "
              f"metrics; stage duration {duration} model s. Times in model seconds.\n")
    if variants:
        header += "\nRouter variants:\n" + "\n".join(f"- `{v}`" for v in variants) + "\n"
    if skipped:
        header += "\nSkipped or failed:\n" + "\n".join(f"- {s}" for s in sorted(set(skipped))) + "\n"
    paths = write_outputs(rows, out_dir, header)
    if agent_rows:
        with open(paths[0], "a") as fh:
            fh.write(agent_markdown(agent_rows))
        (out_dir / "agent.json").write_text(json.dumps([asdict(r) for r in agent_rows], indent=1))
        paths.append(out_dir / "agent.json")
    print()
    if rows:
        print(markdown(rows, ""))
    print(agent_markdown(agent_rows))
    print("wrote " + ", ".join(str(p) for p in paths), flush=True)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="short run: fits+pressure, 2 QPS points, 15 s stages")
    ap.add_argument("--routers", help=f"comma list from {','.join(ROUTERS)} (default: the regime's own list)")
    ap.add_argument("--router-variant", action="append", default=[], metavar="NAME[@BASE]:FLAGS",
                    help="a Pointsman variant: BASE (default pointsman) plus FLAGS on `epp serve` ({fleet_profile}: "
                         "the estimated-latency profile with the fleet's timings); repeatable; runs in every regime")
    ap.add_argument("--regimes", help="comma list from fits,pressure,skew,no-sharing,outside-traffic,cache-resets,"
                                      "saturation,slo,agent,multimodal (default: the first six)")
    ap.add_argument("--qps", help="comma list overriding every regime's ladder (QPS, model time; agent: sessions)")
    ap.add_argument("--samples", help="comma list of workload seeds overriding every regime's (each a fresh fleet)")
    ap.add_argument("--duration", type=float, help="model seconds per QPS stage (default 45, quick 15)")
    ap.add_argument("--max-requests", type=int, default=3000, help="cap per stage (default 3000)")
    ap.add_argument("--servers", type=int, default=4)
    ap.add_argument("--kv-cache-size", type=int, default=1024)
    ap.add_argument("--time-scale", type=float, default=0.5, help="wall/model time (default 0.5 = 2x fast)")
    ap.add_argument("--latency-factors", help="comma list, one per server: its engine timings x this (2 = twice "
                                              "as slow); default all 1")
    ap.add_argument("--engine-type", choices=("vllm", "sglang"), default="vllm", help="the servers' metrics names")
    ap.add_argument("--metrics-time", choices=("wall", "model"), default="wall",
                    help="the servers' latency histograms in wall seconds (default: the routers' clock) or model s")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=str(ROOT / "bench" / "out" / "routing"))
    g = ap.add_argument_group("regime settings")
    g.add_argument("--outside-fraction", type=float, default=0.3, help="outside-traffic: share bypassing the "
                                                                       "router (default 0.3)")
    g.add_argument("--reset-every", type=float, default=10.0, help="cache-resets: model s between resets (10)")
    g.add_argument("--saturation-qps", type=float, default=30.0, help="saturation: the stage's QPS (30)")
    g.add_argument("--saturation-samples", type=int, default=3, help="saturation: workload seeds seed..seed+N-1 (3)")
    g.add_argument("--slo-mix", default="0.3:250,0.7:2000",
                   help="slo: share:TTFT-ms[/TPOT-ms] classes, model ms (default 0.3:250,0.7:2000)")
    g.add_argument("--slo-tpot-ms", type=float, default=None, help="slo: TPOT SLO of classes without one (none)")
    g.add_argument("--slo-headers", choices=("llm-d", "plain"), default="llm-d",
                   help="slo: x-llm-d-slo-ttft-ms/-tpot-ms (llm-d, default) or x-slo-ttft-ms/-tpot-ms (plain)")
    g.add_argument("--slo-strip", default="", metavar="ROUTERS",
                   help="slo: comma list of routers whose requests carry no SLO headers (judged the same): e.g. a "
                        "variant 'pointsman-nohdr:' listed here is Pointsman without the headers")
    g.add_argument("--agent-concurrency", help="agent: concurrent sessions ladder (default 16 per server: 64)")
    g.add_argument("--agent-sessions", type=int, default=0, help="agent: sessions per stage (default 2 x "
                                                                 "concurrency)")
    g.add_argument("--agent-turns", type=int, default=6, help="agent: mean turns per session (6)")
    g.add_argument("--agent-turns-spread", type=int, default=2, help="agent: turns uniform in mean ± this (2)")
    g.add_argument("--agent-pause", type=float, default=5.0, help="agent: mean tool pause, model s (5)")
    g.add_argument("--agent-fanout", type=float, default=0.2, help="agent: share of later turns that fan out (0.2)")
    g.add_argument("--session-carrier", default="header+user:0.7,user:0.3",
                   help="agent: how sessions send their id, weighted sets of header, user, prompt_cache_key, "
                        "metadata, none (default header+user:0.7,user:0.3)")
    g.add_argument("--session-header", default="x-session-id", help="agent: the session header (x-session-id)")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)

    def on_term(signum: int, frame: object) -> None:
        raise KeyboardInterrupt  # asyncio.run cancels the run; every fleet and router is stopped

    signal.signal(signal.SIGTERM, on_term)
    try:
        return asyncio.run(main_async(args))
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
