from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ReceiptRequest(_message.Message):
    __slots__ = ("decision_id",)
    DECISION_ID_FIELD_NUMBER: _ClassVar[int]
    decision_id: str
    def __init__(self, decision_id: _Optional[str] = ...) -> None: ...

class Receipt(_message.Message):
    __slots__ = ("found", "error", "decision_id", "request_id", "trace_id", "decided_at", "age_seconds", "model", "target_model", "pool", "config", "profile", "decision", "endpoint", "fallbacks", "prefill", "candidates", "runner_up", "margin", "profiles", "decide_seconds", "error_code", "status", "done", "ttft_seconds", "duration_seconds", "prompt_tokens", "completion_tokens", "cached_tokens", "shadow_endpoint")
    FOUND_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    DECISION_ID_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TRACE_ID_FIELD_NUMBER: _ClassVar[int]
    DECIDED_AT_FIELD_NUMBER: _ClassVar[int]
    AGE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    TARGET_MODEL_FIELD_NUMBER: _ClassVar[int]
    POOL_FIELD_NUMBER: _ClassVar[int]
    CONFIG_FIELD_NUMBER: _ClassVar[int]
    PROFILE_FIELD_NUMBER: _ClassVar[int]
    DECISION_FIELD_NUMBER: _ClassVar[int]
    ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    FALLBACKS_FIELD_NUMBER: _ClassVar[int]
    PREFILL_FIELD_NUMBER: _ClassVar[int]
    CANDIDATES_FIELD_NUMBER: _ClassVar[int]
    RUNNER_UP_FIELD_NUMBER: _ClassVar[int]
    MARGIN_FIELD_NUMBER: _ClassVar[int]
    PROFILES_FIELD_NUMBER: _ClassVar[int]
    DECIDE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    DONE_FIELD_NUMBER: _ClassVar[int]
    TTFT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    DURATION_SECONDS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    COMPLETION_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CACHED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    SHADOW_ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    found: bool
    error: str
    decision_id: str
    request_id: str
    trace_id: str
    decided_at: float
    age_seconds: float
    model: str
    target_model: str
    pool: str
    config: str
    profile: str
    decision: str
    endpoint: str
    fallbacks: _containers.RepeatedScalarFieldContainer[str]
    prefill: str
    candidates: _containers.RepeatedScalarFieldContainer[str]
    runner_up: str
    margin: float
    profiles: _containers.RepeatedCompositeFieldContainer[ProfileRun]
    decide_seconds: float
    error_code: str
    status: int
    done: bool
    ttft_seconds: float
    duration_seconds: float
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    shadow_endpoint: str
    def __init__(self, found: _Optional[bool] = ..., error: _Optional[str] = ..., decision_id: _Optional[str] = ..., request_id: _Optional[str] = ..., trace_id: _Optional[str] = ..., decided_at: _Optional[float] = ..., age_seconds: _Optional[float] = ..., model: _Optional[str] = ..., target_model: _Optional[str] = ..., pool: _Optional[str] = ..., config: _Optional[str] = ..., profile: _Optional[str] = ..., decision: _Optional[str] = ..., endpoint: _Optional[str] = ..., fallbacks: _Optional[_Iterable[str]] = ..., prefill: _Optional[str] = ..., candidates: _Optional[_Iterable[str]] = ..., runner_up: _Optional[str] = ..., margin: _Optional[float] = ..., profiles: _Optional[_Iterable[_Union[ProfileRun, _Mapping]]] = ..., decide_seconds: _Optional[float] = ..., error_code: _Optional[str] = ..., status: _Optional[int] = ..., done: _Optional[bool] = ..., ttft_seconds: _Optional[float] = ..., duration_seconds: _Optional[float] = ..., prompt_tokens: _Optional[int] = ..., completion_tokens: _Optional[int] = ..., cached_tokens: _Optional[int] = ..., shadow_endpoint: _Optional[str] = ...) -> None: ...

class ExplainRequest(_message.Message):
    __slots__ = ("path", "headers", "body", "pool")
    class HeadersEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    PATH_FIELD_NUMBER: _ClassVar[int]
    HEADERS_FIELD_NUMBER: _ClassVar[int]
    BODY_FIELD_NUMBER: _ClassVar[int]
    POOL_FIELD_NUMBER: _ClassVar[int]
    path: str
    headers: _containers.ScalarMap[str, str]
    body: bytes
    pool: str
    def __init__(self, path: _Optional[str] = ..., headers: _Optional[_Mapping[str, str]] = ..., body: _Optional[bytes] = ..., pool: _Optional[str] = ...) -> None: ...

class PluginRun(_message.Message):
    __slots__ = ("name", "type", "kind", "weight", "duration_seconds", "kept", "scores")
    class ScoresEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_FIELD_NUMBER: _ClassVar[int]
    DURATION_SECONDS_FIELD_NUMBER: _ClassVar[int]
    KEPT_FIELD_NUMBER: _ClassVar[int]
    SCORES_FIELD_NUMBER: _ClassVar[int]
    name: str
    type: str
    kind: str
    weight: float
    duration_seconds: float
    kept: _containers.RepeatedScalarFieldContainer[str]
    scores: _containers.ScalarMap[str, float]
    def __init__(self, name: _Optional[str] = ..., type: _Optional[str] = ..., kind: _Optional[str] = ..., weight: _Optional[float] = ..., duration_seconds: _Optional[float] = ..., kept: _Optional[_Iterable[str]] = ..., scores: _Optional[_Mapping[str, float]] = ...) -> None: ...

class ProfileRun(_message.Message):
    __slots__ = ("profile", "targets", "totals", "plugins")
    class TotalsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    PROFILE_FIELD_NUMBER: _ClassVar[int]
    TARGETS_FIELD_NUMBER: _ClassVar[int]
    TOTALS_FIELD_NUMBER: _ClassVar[int]
    PLUGINS_FIELD_NUMBER: _ClassVar[int]
    profile: str
    targets: _containers.RepeatedScalarFieldContainer[str]
    totals: _containers.ScalarMap[str, float]
    plugins: _containers.RepeatedCompositeFieldContainer[PluginRun]
    def __init__(self, profile: _Optional[str] = ..., targets: _Optional[_Iterable[str]] = ..., totals: _Optional[_Mapping[str, float]] = ..., plugins: _Optional[_Iterable[_Union[PluginRun, _Mapping]]] = ...) -> None: ...

class ExplainResponse(_message.Message):
    __slots__ = ("status", "error", "endpoint", "fallbacks", "prefill", "profile", "decision", "candidates", "profiles", "headers", "model", "target_model", "route", "prefix", "token_source", "prompt_tokens", "models", "slo", "slo_attainable", "slo_class", "session", "queued", "queue")
    class HeadersEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    STATUS_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    FALLBACKS_FIELD_NUMBER: _ClassVar[int]
    PREFILL_FIELD_NUMBER: _ClassVar[int]
    PROFILE_FIELD_NUMBER: _ClassVar[int]
    DECISION_FIELD_NUMBER: _ClassVar[int]
    CANDIDATES_FIELD_NUMBER: _ClassVar[int]
    PROFILES_FIELD_NUMBER: _ClassVar[int]
    HEADERS_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    TARGET_MODEL_FIELD_NUMBER: _ClassVar[int]
    ROUTE_FIELD_NUMBER: _ClassVar[int]
    PREFIX_FIELD_NUMBER: _ClassVar[int]
    TOKEN_SOURCE_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MODELS_FIELD_NUMBER: _ClassVar[int]
    SLO_FIELD_NUMBER: _ClassVar[int]
    SLO_ATTAINABLE_FIELD_NUMBER: _ClassVar[int]
    SLO_CLASS_FIELD_NUMBER: _ClassVar[int]
    SESSION_FIELD_NUMBER: _ClassVar[int]
    QUEUED_FIELD_NUMBER: _ClassVar[int]
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    status: int
    error: str
    endpoint: str
    fallbacks: _containers.RepeatedScalarFieldContainer[str]
    prefill: str
    profile: str
    decision: str
    candidates: _containers.RepeatedScalarFieldContainer[str]
    profiles: _containers.RepeatedCompositeFieldContainer[ProfileRun]
    headers: _containers.ScalarMap[str, str]
    model: str
    target_model: str
    route: RouteInfo
    prefix: _containers.RepeatedCompositeFieldContainer[PrefixMatch]
    token_source: str
    prompt_tokens: int
    models: _containers.RepeatedCompositeFieldContainer[EndpointModel]
    slo: str
    slo_attainable: bool
    slo_class: str
    session: SessionInfo
    queued: bool
    queue: str
    def __init__(self, status: _Optional[int] = ..., error: _Optional[str] = ..., endpoint: _Optional[str] = ..., fallbacks: _Optional[_Iterable[str]] = ..., prefill: _Optional[str] = ..., profile: _Optional[str] = ..., decision: _Optional[str] = ..., candidates: _Optional[_Iterable[str]] = ..., profiles: _Optional[_Iterable[_Union[ProfileRun, _Mapping]]] = ..., headers: _Optional[_Mapping[str, str]] = ..., model: _Optional[str] = ..., target_model: _Optional[str] = ..., route: _Optional[_Union[RouteInfo, _Mapping]] = ..., prefix: _Optional[_Iterable[_Union[PrefixMatch, _Mapping]]] = ..., token_source: _Optional[str] = ..., prompt_tokens: _Optional[int] = ..., models: _Optional[_Iterable[_Union[EndpointModel, _Mapping]]] = ..., slo: _Optional[str] = ..., slo_attainable: _Optional[bool] = ..., slo_class: _Optional[str] = ..., session: _Optional[_Union[SessionInfo, _Mapping]] = ..., queued: _Optional[bool] = ..., queue: _Optional[str] = ...) -> None: ...

class SessionInfo(_message.Message):
    __slots__ = ("id", "source", "turn", "parallel", "bound", "decision", "expected_gap_seconds", "warm_seconds")
    ID_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    TURN_FIELD_NUMBER: _ClassVar[int]
    PARALLEL_FIELD_NUMBER: _ClassVar[int]
    BOUND_FIELD_NUMBER: _ClassVar[int]
    DECISION_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_GAP_SECONDS_FIELD_NUMBER: _ClassVar[int]
    WARM_SECONDS_FIELD_NUMBER: _ClassVar[int]
    id: str
    source: str
    turn: int
    parallel: bool
    bound: str
    decision: str
    expected_gap_seconds: float
    warm_seconds: float
    def __init__(self, id: _Optional[str] = ..., source: _Optional[str] = ..., turn: _Optional[int] = ..., parallel: _Optional[bool] = ..., bound: _Optional[str] = ..., decision: _Optional[str] = ..., expected_gap_seconds: _Optional[float] = ..., warm_seconds: _Optional[float] = ...) -> None: ...

class EndpointModel(_message.Message):
    __slots__ = ("endpoint", "timings", "overhead_seconds", "prefill_seconds_per_token", "inter_token_seconds", "backlog_weight", "calibration", "fitted_age_seconds", "prefill_points", "decode_tokens", "engine_ttft_mean_seconds", "engine_ttft_p90_seconds", "trust", "hit_belief", "trust_reason", "agreement", "engine_hit_ratio", "predicted_hit_ratio", "outside_share", "predicted_ttft_seconds", "predicted_tpot_seconds", "meets_slo", "ttft_headroom_seconds", "tpot_headroom_seconds")
    ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    TIMINGS_FIELD_NUMBER: _ClassVar[int]
    OVERHEAD_SECONDS_FIELD_NUMBER: _ClassVar[int]
    PREFILL_SECONDS_PER_TOKEN_FIELD_NUMBER: _ClassVar[int]
    INTER_TOKEN_SECONDS_FIELD_NUMBER: _ClassVar[int]
    BACKLOG_WEIGHT_FIELD_NUMBER: _ClassVar[int]
    CALIBRATION_FIELD_NUMBER: _ClassVar[int]
    FITTED_AGE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    PREFILL_POINTS_FIELD_NUMBER: _ClassVar[int]
    DECODE_TOKENS_FIELD_NUMBER: _ClassVar[int]
    ENGINE_TTFT_MEAN_SECONDS_FIELD_NUMBER: _ClassVar[int]
    ENGINE_TTFT_P90_SECONDS_FIELD_NUMBER: _ClassVar[int]
    TRUST_FIELD_NUMBER: _ClassVar[int]
    HIT_BELIEF_FIELD_NUMBER: _ClassVar[int]
    TRUST_REASON_FIELD_NUMBER: _ClassVar[int]
    AGREEMENT_FIELD_NUMBER: _ClassVar[int]
    ENGINE_HIT_RATIO_FIELD_NUMBER: _ClassVar[int]
    PREDICTED_HIT_RATIO_FIELD_NUMBER: _ClassVar[int]
    OUTSIDE_SHARE_FIELD_NUMBER: _ClassVar[int]
    PREDICTED_TTFT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    PREDICTED_TPOT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    MEETS_SLO_FIELD_NUMBER: _ClassVar[int]
    TTFT_HEADROOM_SECONDS_FIELD_NUMBER: _ClassVar[int]
    TPOT_HEADROOM_SECONDS_FIELD_NUMBER: _ClassVar[int]
    endpoint: str
    timings: str
    overhead_seconds: float
    prefill_seconds_per_token: float
    inter_token_seconds: float
    backlog_weight: float
    calibration: float
    fitted_age_seconds: float
    prefill_points: float
    decode_tokens: float
    engine_ttft_mean_seconds: float
    engine_ttft_p90_seconds: float
    trust: str
    hit_belief: float
    trust_reason: str
    agreement: float
    engine_hit_ratio: float
    predicted_hit_ratio: float
    outside_share: float
    predicted_ttft_seconds: float
    predicted_tpot_seconds: float
    meets_slo: bool
    ttft_headroom_seconds: float
    tpot_headroom_seconds: float
    def __init__(self, endpoint: _Optional[str] = ..., timings: _Optional[str] = ..., overhead_seconds: _Optional[float] = ..., prefill_seconds_per_token: _Optional[float] = ..., inter_token_seconds: _Optional[float] = ..., backlog_weight: _Optional[float] = ..., calibration: _Optional[float] = ..., fitted_age_seconds: _Optional[float] = ..., prefill_points: _Optional[float] = ..., decode_tokens: _Optional[float] = ..., engine_ttft_mean_seconds: _Optional[float] = ..., engine_ttft_p90_seconds: _Optional[float] = ..., trust: _Optional[str] = ..., hit_belief: _Optional[float] = ..., trust_reason: _Optional[str] = ..., agreement: _Optional[float] = ..., engine_hit_ratio: _Optional[float] = ..., predicted_hit_ratio: _Optional[float] = ..., outside_share: _Optional[float] = ..., predicted_ttft_seconds: _Optional[float] = ..., predicted_tpot_seconds: _Optional[float] = ..., meets_slo: _Optional[bool] = ..., ttft_headroom_seconds: _Optional[float] = ..., tpot_headroom_seconds: _Optional[float] = ...) -> None: ...

class PrefixMatch(_message.Message):
    __slots__ = ("endpoint", "source", "blocks", "total_blocks", "block_tokens", "gpu_blocks", "cpu_blocks", "speculative_blocks", "index_state", "weighted")
    ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    BLOCKS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    BLOCK_TOKENS_FIELD_NUMBER: _ClassVar[int]
    GPU_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    CPU_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    SPECULATIVE_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    INDEX_STATE_FIELD_NUMBER: _ClassVar[int]
    WEIGHTED_FIELD_NUMBER: _ClassVar[int]
    endpoint: str
    source: str
    blocks: int
    total_blocks: int
    block_tokens: int
    gpu_blocks: int
    cpu_blocks: int
    speculative_blocks: int
    index_state: str
    weighted: float
    def __init__(self, endpoint: _Optional[str] = ..., source: _Optional[str] = ..., blocks: _Optional[int] = ..., total_blocks: _Optional[int] = ..., block_tokens: _Optional[int] = ..., gpu_blocks: _Optional[int] = ..., cpu_blocks: _Optional[int] = ..., speculative_blocks: _Optional[int] = ..., index_state: _Optional[str] = ..., weighted: _Optional[float] = ...) -> None: ...

class RouteInfo(_message.Message):
    __slots__ = ("route", "rule", "rule_index", "split", "target", "kind", "pool", "provider_cluster", "engine_model", "session", "rate_limit", "strategy", "backend", "fallbacks", "mirrors", "classification", "timeout", "notes", "budgets")
    ROUTE_FIELD_NUMBER: _ClassVar[int]
    RULE_FIELD_NUMBER: _ClassVar[int]
    RULE_INDEX_FIELD_NUMBER: _ClassVar[int]
    SPLIT_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    POOL_FIELD_NUMBER: _ClassVar[int]
    PROVIDER_CLUSTER_FIELD_NUMBER: _ClassVar[int]
    ENGINE_MODEL_FIELD_NUMBER: _ClassVar[int]
    SESSION_FIELD_NUMBER: _ClassVar[int]
    RATE_LIMIT_FIELD_NUMBER: _ClassVar[int]
    STRATEGY_FIELD_NUMBER: _ClassVar[int]
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    FALLBACKS_FIELD_NUMBER: _ClassVar[int]
    MIRRORS_FIELD_NUMBER: _ClassVar[int]
    CLASSIFICATION_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_FIELD_NUMBER: _ClassVar[int]
    NOTES_FIELD_NUMBER: _ClassVar[int]
    BUDGETS_FIELD_NUMBER: _ClassVar[int]
    route: str
    rule: str
    rule_index: int
    split: _containers.RepeatedCompositeFieldContainer[RouteSplit]
    target: str
    kind: str
    pool: str
    provider_cluster: str
    engine_model: str
    session: str
    rate_limit: str
    strategy: str
    backend: str
    fallbacks: _containers.RepeatedScalarFieldContainer[str]
    mirrors: _containers.RepeatedScalarFieldContainer[str]
    classification: str
    timeout: str
    notes: _containers.RepeatedScalarFieldContainer[str]
    budgets: _containers.RepeatedCompositeFieldContainer[BudgetInfo]
    def __init__(self, route: _Optional[str] = ..., rule: _Optional[str] = ..., rule_index: _Optional[int] = ..., split: _Optional[_Iterable[_Union[RouteSplit, _Mapping]]] = ..., target: _Optional[str] = ..., kind: _Optional[str] = ..., pool: _Optional[str] = ..., provider_cluster: _Optional[str] = ..., engine_model: _Optional[str] = ..., session: _Optional[str] = ..., rate_limit: _Optional[str] = ..., strategy: _Optional[str] = ..., backend: _Optional[str] = ..., fallbacks: _Optional[_Iterable[str]] = ..., mirrors: _Optional[_Iterable[str]] = ..., classification: _Optional[str] = ..., timeout: _Optional[str] = ..., notes: _Optional[_Iterable[str]] = ..., budgets: _Optional[_Iterable[_Union[BudgetInfo, _Mapping]]] = ...) -> None: ...

class BudgetInfo(_message.Message):
    __slots__ = ("name", "scope", "window_seconds", "tokens_used", "usd_used", "max_tokens", "max_usd", "utilization")
    NAME_FIELD_NUMBER: _ClassVar[int]
    SCOPE_FIELD_NUMBER: _ClassVar[int]
    WINDOW_SECONDS_FIELD_NUMBER: _ClassVar[int]
    TOKENS_USED_FIELD_NUMBER: _ClassVar[int]
    USD_USED_FIELD_NUMBER: _ClassVar[int]
    MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MAX_USD_FIELD_NUMBER: _ClassVar[int]
    UTILIZATION_FIELD_NUMBER: _ClassVar[int]
    name: str
    scope: str
    window_seconds: float
    tokens_used: int
    usd_used: float
    max_tokens: float
    max_usd: float
    utilization: float
    def __init__(self, name: _Optional[str] = ..., scope: _Optional[str] = ..., window_seconds: _Optional[float] = ..., tokens_used: _Optional[int] = ..., usd_used: _Optional[float] = ..., max_tokens: _Optional[float] = ..., max_usd: _Optional[float] = ..., utilization: _Optional[float] = ...) -> None: ...

class RouteSplit(_message.Message):
    __slots__ = ("target", "kind", "weight", "chosen")
    TARGET_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_FIELD_NUMBER: _ClassVar[int]
    CHOSEN_FIELD_NUMBER: _ClassVar[int]
    target: str
    kind: str
    weight: int
    chosen: bool
    def __init__(self, target: _Optional[str] = ..., kind: _Optional[str] = ..., weight: _Optional[int] = ..., chosen: _Optional[bool] = ...) -> None: ...

class ListEndpointsRequest(_message.Message):
    __slots__ = ("pool",)
    POOL_FIELD_NUMBER: _ClassVar[int]
    pool: str
    def __init__(self, pool: _Optional[str] = ...) -> None: ...

class EndpointInfo(_message.Message):
    __slots__ = ("pool", "key", "name", "labels", "models", "role", "waiting", "running", "kv_usage", "active_loras", "stale", "metrics_age_seconds", "inflight", "routable", "state", "reason", "failures", "consecutive_failures", "scrape_failures", "ejections", "model")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    POOL_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    MODELS_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    WAITING_FIELD_NUMBER: _ClassVar[int]
    RUNNING_FIELD_NUMBER: _ClassVar[int]
    KV_USAGE_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_LORAS_FIELD_NUMBER: _ClassVar[int]
    STALE_FIELD_NUMBER: _ClassVar[int]
    METRICS_AGE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    INFLIGHT_FIELD_NUMBER: _ClassVar[int]
    ROUTABLE_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    FAILURES_FIELD_NUMBER: _ClassVar[int]
    CONSECUTIVE_FAILURES_FIELD_NUMBER: _ClassVar[int]
    SCRAPE_FAILURES_FIELD_NUMBER: _ClassVar[int]
    EJECTIONS_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    pool: str
    key: str
    name: str
    labels: _containers.ScalarMap[str, str]
    models: _containers.RepeatedScalarFieldContainer[str]
    role: str
    waiting: int
    running: int
    kv_usage: float
    active_loras: _containers.RepeatedScalarFieldContainer[str]
    stale: bool
    metrics_age_seconds: float
    inflight: int
    routable: bool
    state: str
    reason: str
    failures: int
    consecutive_failures: int
    scrape_failures: int
    ejections: int
    model: EndpointModel
    def __init__(self, pool: _Optional[str] = ..., key: _Optional[str] = ..., name: _Optional[str] = ..., labels: _Optional[_Mapping[str, str]] = ..., models: _Optional[_Iterable[str]] = ..., role: _Optional[str] = ..., waiting: _Optional[int] = ..., running: _Optional[int] = ..., kv_usage: _Optional[float] = ..., active_loras: _Optional[_Iterable[str]] = ..., stale: _Optional[bool] = ..., metrics_age_seconds: _Optional[float] = ..., inflight: _Optional[int] = ..., routable: _Optional[bool] = ..., state: _Optional[str] = ..., reason: _Optional[str] = ..., failures: _Optional[int] = ..., consecutive_failures: _Optional[int] = ..., scrape_failures: _Optional[int] = ..., ejections: _Optional[int] = ..., model: _Optional[_Union[EndpointModel, _Mapping]] = ...) -> None: ...

class ListEndpointsResponse(_message.Message):
    __slots__ = ("endpoints", "pools", "default_pool")
    ENDPOINTS_FIELD_NUMBER: _ClassVar[int]
    POOLS_FIELD_NUMBER: _ClassVar[int]
    DEFAULT_POOL_FIELD_NUMBER: _ClassVar[int]
    endpoints: _containers.RepeatedCompositeFieldContainer[EndpointInfo]
    pools: _containers.RepeatedScalarFieldContainer[str]
    default_pool: str
    def __init__(self, endpoints: _Optional[_Iterable[_Union[EndpointInfo, _Mapping]]] = ..., pools: _Optional[_Iterable[str]] = ..., default_pool: _Optional[str] = ...) -> None: ...
