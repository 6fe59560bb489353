from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

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
    __slots__ = ("status", "error", "endpoint", "fallbacks", "prefill", "profile", "decision", "candidates", "profiles", "headers", "model", "target_model")
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
    def __init__(self, status: _Optional[int] = ..., error: _Optional[str] = ..., endpoint: _Optional[str] = ..., fallbacks: _Optional[_Iterable[str]] = ..., prefill: _Optional[str] = ..., profile: _Optional[str] = ..., decision: _Optional[str] = ..., candidates: _Optional[_Iterable[str]] = ..., profiles: _Optional[_Iterable[_Union[ProfileRun, _Mapping]]] = ..., headers: _Optional[_Mapping[str, str]] = ..., model: _Optional[str] = ..., target_model: _Optional[str] = ...) -> None: ...

class ListEndpointsRequest(_message.Message):
    __slots__ = ("pool",)
    POOL_FIELD_NUMBER: _ClassVar[int]
    pool: str
    def __init__(self, pool: _Optional[str] = ...) -> None: ...

class EndpointInfo(_message.Message):
    __slots__ = ("pool", "key", "name", "labels", "models", "role", "waiting", "running", "kv_usage", "active_loras", "stale", "metrics_age_seconds", "inflight", "routable", "state", "reason", "failures", "consecutive_failures", "scrape_failures", "ejections")
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
    def __init__(self, pool: _Optional[str] = ..., key: _Optional[str] = ..., name: _Optional[str] = ..., labels: _Optional[_Mapping[str, str]] = ..., models: _Optional[_Iterable[str]] = ..., role: _Optional[str] = ..., waiting: _Optional[int] = ..., running: _Optional[int] = ..., kv_usage: _Optional[float] = ..., active_loras: _Optional[_Iterable[str]] = ..., stale: _Optional[bool] = ..., metrics_age_seconds: _Optional[float] = ..., inflight: _Optional[int] = ..., routable: _Optional[bool] = ..., state: _Optional[str] = ..., reason: _Optional[str] = ..., failures: _Optional[int] = ..., consecutive_failures: _Optional[int] = ..., scrape_failures: _Optional[int] = ..., ejections: _Optional[int] = ...) -> None: ...

class ListEndpointsResponse(_message.Message):
    __slots__ = ("endpoints", "pools", "default_pool")
    ENDPOINTS_FIELD_NUMBER: _ClassVar[int]
    POOLS_FIELD_NUMBER: _ClassVar[int]
    DEFAULT_POOL_FIELD_NUMBER: _ClassVar[int]
    endpoints: _containers.RepeatedCompositeFieldContainer[EndpointInfo]
    pools: _containers.RepeatedScalarFieldContainer[str]
    default_pool: str
    def __init__(self, endpoints: _Optional[_Iterable[_Union[EndpointInfo, _Mapping]]] = ..., pools: _Optional[_Iterable[str]] = ..., default_pool: _Optional[str] = ...) -> None: ...
