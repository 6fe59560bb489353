"""The contract between the EPP shell and the scheduler.

The shell builds a `SchedulingContext` per request (candidates already narrowed by pool, subset hints and the
conformance header) and calls `Scheduler.schedule`. The scheduler returns a `SchedulingResult` or raises
`SchedulingError`. After the pick the shell calls `pre_request`; when the stream ends for any reason it calls
`response_complete` exactly once. When an endpoint leaves every pool it calls `endpoint_removed`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from scheduling.types import Endpoint, LLMRequest


@dataclass(frozen=True, slots=True)
class InflightLoad:
    """The picker's own exact count of requests it sent to an endpoint that have not finished."""

    requests: int = 0
    tokens: int = 0  # estimated prompt tokens of those requests


NO_LOAD = InflightLoad()


@dataclass(slots=True)
class SchedulingContext:
    request: LLMRequest
    candidates: Sequence[Endpoint]
    inflight: Mapping[str, InflightLoad] = field(default_factory=dict)  # by Endpoint.key
    now: float = 0.0  # monotonic seconds, from the shell's clock
    explain: bool = False  # collect per-plugin detail

    def load(self, endpoint: Endpoint) -> InflightLoad:
        return self.inflight.get(endpoint.key, NO_LOAD)


@dataclass(slots=True)
class PluginDetail:
    """What one plugin did in one profile run (filled only when explain is on, or cheaply always for timing)."""

    name: str
    type: str
    kind: str  # "filter" | "scorer" | "picker"
    duration_s: float = 0.0
    weight: float | None = None  # scorers
    kept: list[str] | None = None  # filters: endpoint keys that passed
    scores: dict[str, float] | None = None  # scorers: raw clamped score by endpoint key
    values: Sequence[float] | None = None  # scorers: the clamped scores in ProfileResult.scored order (by reference)


@dataclass(slots=True)
class ProfileResult:
    profile: str
    targets: list[Endpoint]  # ordered, best first
    totals: dict[str, float] = field(default_factory=dict)  # weighted sum by endpoint key (explain only)
    details: list[PluginDetail] = field(default_factory=list)
    # The endpoints the scorers saw and their weighted totals, in the same order: references to the lists the
    # run computed anyway (no copy), for cheap after-the-fact views such as the dashboard's decision stream.
    scored: Sequence[Endpoint] | None = None
    score_totals: Sequence[float] | None = None


@dataclass(slots=True)
class SchedulingResult:
    targets: list[Endpoint]  # where the request goes: primary first, then fallbacks
    profile: str = "default"  # the scheduling profile (config) that made the decision
    profile_results: dict[str, ProfileResult] = field(default_factory=dict)
    prefill: Endpoint | None = None  # P/D: the prefill endpoint, sent in x-prefiller-host-port
    decision: str = ""  # P/D: "decode-only" | "prefill-decode"; "" for single-profile handlers
    # Headers the shell should add to the client response (e.g. llm-d `x-session-token`); set by pre_request.
    response_headers: dict[str, str] = field(default_factory=dict)
    # Per-decision scratch space of the scheduler (hashes, matches, routing). Opaque to the shell.
    state: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def primary(self) -> Endpoint:
        return self.targets[0]


@dataclass(frozen=True)
class Saturation:
    """The saturation detector admission and flow control consult: see epp/fleet/saturation.py.

    `detector` "utilization" (utilization-detector: scraped queue depth and KV usage) uses the first four fields;
    "concurrency" (concurrency-detector: the picker's own in-flight counts) uses `headroom` and the last three."""

    queue_depth_threshold: float = 5.0
    kv_cache_util_threshold: float = 0.8
    metrics_staleness_s: float = 0.2
    headroom: float = 0.0
    detector: str = "utilization"  # "utilization" | "concurrency"
    concurrency_mode: str = "requests"  # concurrency-detector: "requests" | "tokens"
    max_concurrency: int = 100
    max_token_concurrency: int = 1_000_000


ROUND_ROBIN = "round-robin-fairness-policy"
GLOBAL_STRICT = "global-strict-fairness-policy"
FCFS = "fcfs-ordering-policy"
DEFAULT_BAND_MAX_BYTES = 1_000_000_000  # GIE's default capacity of a priority band


@dataclass(frozen=True)
class PriorityBand:
    """One priority level of flow control (GIE PriorityBandConfig). Limits count queued requests; 0 = no limit."""

    priority: int = 0
    max_bytes: int = DEFAULT_BAND_MAX_BYTES
    max_requests: int = 0
    fairness: str = ROUND_ROBIN  # which flow of the band goes next
    ordering: str = FCFS  # which request of a flow goes next


@dataclass(frozen=True)
class FlowControl:
    """The `flowControl` section (GIE FlowControlConfig), applied by epp/flowcontrol.

    Global limits count every queued request of a pool; 0 = no limit. `default_ttl_s` 0 means a request waits
    until its client goes away. `usage_limit` is the static-usage-limit-policy threshold: requests are dispatched
    while the pool's saturation is below it."""

    max_bytes: int = 0
    max_requests: int = 0
    default_ttl_s: float = 0.0
    default_band: PriorityBand = field(default_factory=PriorityBand)
    bands: tuple[PriorityBand, ...] = ()
    usage_limit: float = 1.0
    sheddable_usage_limit: float | None = None  # priority-usage-limit-policy: the ceiling for priorities < 0

    def limit(self, priority: int) -> float:
        """The saturation below which requests of `priority` are dispatched."""
        if priority < 0 and self.sheddable_usage_limit is not None:
            return min(self.usage_limit, self.sheddable_usage_limit)
        return self.usage_limit

    def band(self, priority: int) -> PriorityBand:
        """The configured band for `priority`, else the default band's template at that priority."""
        for b in self.bands:
            if b.priority == priority:
                return b
        d = self.default_band
        return PriorityBand(priority, d.max_bytes, d.max_requests, d.fairness, d.ordering)


@dataclass(frozen=True)
class Scrape:
    """How the shell scrapes model-server metrics (metrics-data-source + core-metrics-extractor)."""

    scheme: str = "http"
    path: str = "/metrics"
    insecure_skip_verify: bool = True
    engine_label_key: str = "llm-d.ai/engine-type"
    default_engine: str = "vllm"


@dataclass(frozen=True)
class ShellConfig:
    """What the shell applies from a loaded config (defaults when a section is absent)."""

    feature_gates: frozenset[str] = frozenset()
    saturation: Saturation = field(default_factory=Saturation)
    scrape: Scrape = field(default_factory=Scrape)
    parser: str = "openai-parser"
    flow_control: FlowControl | None = None  # None: off (no flowControl feature gate)


@runtime_checkable
class Scheduler(Protocol):
    def schedule(self, ctx: SchedulingContext, *, dry_run: bool = False) -> SchedulingResult:
        """Pick endpoints. Raises SchedulingError (ResourceExhausted when filters leave nothing). Changes no state;
        with `dry_run` it does not advance its random source either (explain)."""
        ...

    def pre_request(self, ctx: SchedulingContext, result: SchedulingResult) -> None:
        """Called once the decision is committed (stateful plugins record it here)."""
        ...

    def response_complete(self, ctx: SchedulingContext, result: SchedulingResult) -> None:
        """Called exactly once when the request's stream ends, whatever the outcome."""
        ...

    def endpoint_removed(self, key: str) -> None:
        """The endpoint left every pool: drop whatever is kept for it."""
        ...
