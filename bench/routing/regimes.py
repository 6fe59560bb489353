"""The benchmark's fleet and regimes, sized against the fleet's KV capacity.

A regime is a workload (shared-prefix requests on a QPS ladder, or agent sessions on a concurrency ladder) plus
the disturbances it runs under (traffic that bypasses the router, prefix-cache resets) and what each request
carries (SLO headers). `samples` runs it on several workload seeds, each on a fresh fleet and router.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from bench.routing.agent import AgentSpec
from bench.routing.workload import SloMix, WorkloadSpec

# the peers, the greedy oracle and Pointsman's default: the routers every new regime compares by default
NEW_REGIME_ROUTERS = ("envoy-rr", "vllm-router", "sglang-router", "pointsman", "oracle")


@dataclass(frozen=True)
class FleetSpec:
    servers: int = 4
    kv_cache_size: int = 1024  # blocks of 16 tokens per server
    max_num_seqs: int = 16
    time_scale: float = 0.5
    stream_interval_ms: float = 20.0
    latency_factors: tuple[float, ...] = ()  # per server (2 = twice as slow); () = all alike
    engine_type: str = "vllm"  # the servers' metrics flavour: vllm or sglang
    metrics_time: str = "wall"  # the servers' latency histograms in wall seconds, Pointsman's clock

    @property
    def cluster_tokens(self) -> int:
        return self.servers * self.kv_cache_size * 16


@dataclass(frozen=True)
class Regime:
    name: str
    spec: WorkloadSpec
    qps: tuple[float, ...]  # the ladder: QPS, or concurrent sessions for an agent regime
    outside: float = 0.0  # fraction of requests sent straight to a (uniformly chosen) server, bypassing the router
    reset_every: float = 0.0  # model seconds between prefix-cache resets of one server (rotating); 0 = none
    warmup: bool = False  # one unmeasured request per group through the router first (the disturbances, not the
    # cold start, are what these regimes measure)
    slo: SloMix | None = None  # every request carries SLO headers drawn from this mix
    slo_headers: str = "llm-d"  # their names (bench.routing.client.SLO_HEADERS: llm-d, plain)
    slo_strip: tuple[str, ...] = ()  # routers whose requests carry none (judged against the same SLOs)
    samples: tuple[int, ...] = ()  # workload seeds, each on a fresh fleet; () = the run's --seed
    routers: tuple[str, ...] = ()  # the default routers; () = bench.routing.routers.DEFAULT_ROUTERS
    agent: AgentSpec | None = None  # an agent-sessions regime (qps = concurrent sessions)
    sessions: int = 0  # agent: sessions per stage; 0 = twice the concurrency


@dataclass(frozen=True)
class RegimeOptions:
    """Command-line settings of the new regimes."""

    outside: float = 0.3
    reset_every: float = 10.0
    saturation_qps: float = 30.0
    saturation_samples: int = 3
    slo: SloMix = field(default_factory=lambda: SloMix.parse("0.3:250,0.7:2000"))
    slo_headers: str = "llm-d"
    slo_strip: tuple[str, ...] = ()
    agent: AgentSpec = field(default_factory=AgentSpec)
    agent_concurrency: tuple[float, ...] = (64,)
    agent_sessions: int = 0


def regimes(fleet: FleetSpec, opts: RegimeOptions | None = None, seed: int = 0) -> dict[str, Regime]:
    opts = opts or RegimeOptions()
    per_server = fleet.kv_cache_size * 16
    pressure_groups = max(2, round(0.73 * fleet.cluster_tokens / 2000))
    # distinct system prompts ~73% of the cluster's KV
    pressure = WorkloadSpec(num_groups=pressure_groups, prompts_per_group=5, system_prompt_len=2000, question_len=200,
                            output_len=64)
    new = NEW_REGIME_ROUTERS
    return {
        # working set ~20% of the cluster's KV, well under one server's
        "fits": Regime("fits", WorkloadSpec(num_groups=max(2, per_server // 2 // 1536), prompts_per_group=5,
                                            system_prompt_len=1536, question_len=128, output_len=64),
                       (10, 20, 40)),
        "pressure": Regime("pressure", pressure, (5, 10, 20, 30)),
        # Zipf popularity over many groups, longer outputs
        "skew": Regime("skew", WorkloadSpec(num_groups=2 * pressure_groups, prompts_per_group=8,
                                            system_prompt_len=1000, question_len=100, output_len=192, zipf_s=1.1),
                       (5, 10, 15)),
        # nothing shared: every prompt unique
        "no-sharing": Regime("no-sharing", WorkloadSpec(num_groups=1, prompts_per_group=10**9, system_prompt_len=0,
                                                        question_len=1500, output_len=64), (5, 10, 20)),
        # the pressure workload, with a share of the requests sent straight to the servers (another router, batch
        # jobs): they fill and evict caches that only the engines' own KV events tell a router about
        "outside-traffic": Regime("outside-traffic", pressure, (10, 20, 30), outside=opts.outside, warmup=True,
                                  routers=(*new, "pointsman-precise")),
        # the pressure workload while one server's prefix cache is reset at intervals (a restart, an operator's
        # /reset_prefix_cache), running requests included
        "cache-resets": Regime("cache-resets", pressure, (10, 20, 30), reset_every=opts.reset_every, warmup=True,
                               routers=(*new, "pointsman-precise")),
        # pressure at its highest QPS on several workload samples: where calibration from finished requests lags
        "saturation": Regime("saturation", pressure, (opts.saturation_qps,),
                             samples=tuple(seed + i for i in range(opts.saturation_samples)),
                             routers=(*new[:4], "pointsman-best", new[4])),
        # the pressure workload, each request with a TTFT SLO (a tight and a loose class by default)
        "slo": Regime("slo", pressure, (10, 20, 30), slo=opts.slo, slo_headers=opts.slo_headers,
                      slo_strip=opts.slo_strip, warmup=True, routers=new),
        # chats about images: 4 system prompts, a pool of 32 images (Zipf) shown across users and turns as 12 KB data
        # URLs, a question after the image; each (system, image) prefix is its own cache entry (modelsim: 256
        # placeholder tokens and the image's mm hash, as vLLM)
        "multimodal": Regime("multimodal", WorkloadSpec(num_groups=4, prompts_per_group=8, system_prompt_len=400,
                                                        question_len=64, output_len=64, images=32,
                                                        image_bytes=12_288, image_zipf=1.0),
                             (10, 20, 30), routers=(*new, "pointsman-precise")),
        # agent sessions: growing contexts, tool pauses, fan-out (the ladder is concurrent sessions)
        "agent": Regime("agent", pressure, opts.agent_concurrency, agent=opts.agent, sessions=opts.agent_sessions,
                        routers=new),
    }
