"""Core value types shared by the scheduler (pure) and the EPP shell.

Nothing here does I/O. Endpoints and metrics are snapshots: the datastore replaces them, it never
mutates one that a scheduling cycle may be reading.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

# Characters per token where a prompt has not been tokenized: the one approximation every estimate uses.
CHARS_PER_TOKEN = 4

# Role label keys: llm-d and Heimdall.
ROLE_LABELS: tuple[str, ...] = ("llm-d.ai/role", "mif.moreh.io/role")


class ApiKind(str, Enum):
    CHAT = "chat/completions"
    COMPLETIONS = "completions"
    EMBEDDINGS = "embeddings"
    RESPONSES = "responses"
    CONVERSATIONS = "conversations"
    MESSAGES = "messages"  # Anthropic
    OTHER = "other"  # unknown path or headers-only request: no body parsing


class ErrorCode(str, Enum):
    """GIE error codes and the HTTP status each one maps to."""

    BAD_REQUEST = "BadRequest"
    UNAUTHORIZED = "Unauthorized"
    FORBIDDEN = "Forbidden"
    NOT_FOUND = "NotFound"
    PAYLOAD_TOO_LARGE = "PayloadTooLarge"
    RESOURCE_EXHAUSTED = "ResourceExhausted"
    INTERNAL = "Internal"
    SERVICE_UNAVAILABLE = "ServiceUnavailable"

    @property
    def http_status(self) -> int:
        return _STATUS[self]


_STATUS = {
    ErrorCode.BAD_REQUEST: 400,
    ErrorCode.UNAUTHORIZED: 401,
    ErrorCode.FORBIDDEN: 403,
    ErrorCode.NOT_FOUND: 404,
    ErrorCode.PAYLOAD_TOO_LARGE: 413,
    ErrorCode.RESOURCE_EXHAUSTED: 429,
    ErrorCode.INTERNAL: 500,
    ErrorCode.SERVICE_UNAVAILABLE: 503,
}


class SchedulingError(Exception):
    """A decision that cannot be made. The shell turns it into `inference error: <Code> - <message>`."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message

    def __str__(self) -> str:
        return f"inference error: {self.code.value} - {self.message}"


Totals = tuple[float, float]  # a histogram's cumulative (sum, count)


@dataclass(frozen=True, slots=True)
class EngineTotals:
    """What an engine's /metrics says cumulatively about the requests it served (None: not exported), read at each
    scrape; two scrapes' difference describes the interval between them. Counters only grow; an engine restart
    starts them over.

    `prompt_tokens` and `cached_tokens` count the prompt tokens and how many of them came from the prefix cache,
    `counted_at` says when: "admission" (vLLM's prefix-cache queries and hits; `requests` is then the TTFT count) or
    "end" (SGLang's prompt and cached tokens, with `requests` and `generation_tokens` of the same finished
    requests)."""

    ttft: Totals | None = None  # time to first token
    itl: Totals | None = None  # inter-token latency (or the older time per output token)
    prefill: Totals | None = None  # time in prefill, queue excluded (vLLM; observed at the request's end)
    decode: Totals | None = None  # time from the first token to the last (vLLM; observed at the request's end)
    queue: Totals | None = None  # time waiting before the first admission
    prompt_tokens: float | None = None
    cached_tokens: float | None = None
    requests: float | None = None
    generation_tokens: float | None = None
    counted_at: str = "admission"
    ttft_buckets: tuple[tuple[float, float], ...] = ()  # (upper bound in seconds, cumulative count), all series


@dataclass(frozen=True, slots=True)
class Metrics:
    """The latest model-server state of one endpoint, as scraped.

    `updated_at` is a monotonic timestamp in seconds from the injected clock; None means never scraped.
    `stale` is set by the datastore when the scrape is older than the staleness threshold.
    """

    waiting: int = 0
    running: int = 0
    kv_usage: float = 0.0  # 0..1
    active_loras: frozenset[str] = frozenset()
    waiting_loras: frozenset[str] = frozenset()
    max_lora: int = 0
    block_size: int | None = None  # tokens per KV block (vllm:cache_config_info)
    num_gpu_blocks: int | None = None
    updated_at: float | None = None
    stale: bool = True
    # Engine-reported latency, the mean over the last scrape period (from the engine's histograms); None until two
    # scrapes have seen requests finish.
    ttft_s: float | None = None  # time to first token
    tpot_s: float | None = None  # time per output token (inter-token latency)
    # The histograms' cumulative (TTFT sum, TTFT count, TPOT sum, TPOT count) the period means come from.
    latency_totals: tuple[float, float, float, float] | None = None
    # The engine's cumulative latency histograms and prefix-cache counters (what fitted engine timings and the
    # prefix trust learn from); None when the engine exports none of them.
    engine: EngineTotals | None = field(default=None, compare=False)
    # Derived once per snapshot (not per request): waiting + running when the scrape is fresh, else 0.
    fresh_load: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "fresh_load", 0 if self.stale else self.waiting + self.running)


UNKNOWN_METRICS = Metrics()


@dataclass(frozen=True, slots=True)
class Endpoint:
    """One model-server endpoint (pod × target port).

    `key` ("ip:port", IPv6 in brackets) identifies the endpoint everywhere: datastore, in-flight counts,
    prefix indexes and the destination header.
    """

    key: str
    address: str
    port: int
    name: str = ""  # pod name (or the static-config name)
    namespace: str = ""
    labels: Mapping[str, str] = field(default_factory=dict)
    models: frozenset[str] = frozenset()  # served models/adapters; empty means "serves whatever it is asked"
    metrics: Metrics = UNKNOWN_METRICS
    annotations: Mapping[str, str] = field(default_factory=dict)  # pointsman.ai/* pod annotations (or file)

    @property
    def role(self) -> str | None:
        for key in ROLE_LABELS:
            value = self.labels.get(key)
            if value:
                return value
        return None

    @property
    def engine(self) -> str:
        return (
            self.labels.get("llm-d.ai/engine-type")
            or self.labels.get("inference.networking.k8s.io/engine-type")
            or "vllm"
        )

    def with_metrics(self, metrics: Metrics) -> Endpoint:
        return Endpoint(
            self.key, self.address, self.port, self.name, self.namespace, self.labels, self.models, metrics,
            self.annotations,
        )


def serves(e: Endpoint, target_model: str, lora_adapter: str | None = None) -> bool:
    """Whether `e` serves the model: it lists no models (serves whatever it is asked), or lists the target model or
    the request's LoRA adapter."""
    models = e.models
    return not models or target_model in models or (lora_adapter is not None and lora_adapter in models)


def endpoint_key(address: str, port: int) -> str:
    """`ip:port`, with IPv6 addresses in brackets."""
    if ":" in address and not address.startswith("["):
        return f"[{address}]:{port}"
    return f"{address}:{port}"


@dataclass(frozen=True, slots=True)
class SessionRef:
    """Which agent session (and program) a request belongs to, as the shell identified it before any hashing
    (scheduling/sessions/identity.py). Only hashes of what the client sent are kept."""

    key: int  # xxh3-128 of the session value, with its source
    source: str  # where it came from: header:<name>, user, previous_response_id, metadata.user_id, ...
    program: int = 0  # xxh3-64 of the program (an explicit program header, else the prompt's head); 0: unknown

    @property
    def label(self) -> str:
        """A short, stable, non-reversible name for logs, explain and the dashboard."""
        return f"{self.key & 0xFFFFFFFFFFFF:012x}"


@dataclass(slots=True)
class LLMRequest:
    """A complete inference request as the scheduler sees it.

    `prompt` is the text that prefix-cache plugins hash: for chat the JSON of messages (plus system/tools for
    Anthropic), the prompt for completions, instructions/tools/input for responses. `prompt_chars` is its length.

    `token_ids` are the prompt's tokens as the engine will see them, set by the shell before scheduling only when
    the loaded scheduler reads them (a plugin requests the `token-ids` data); `token_source` says where they came
    from: "prompt" (the request was token ids), "local" (a local tokenizer), "engine" (the engine's /tokenize) or
    "approx" (the character approximation).
    """

    request_id: str
    model: str  # what the client asked for
    target_model: str  # after rewrite; what the model server is asked for
    kind: ApiKind = ApiKind.OTHER
    headers: Mapping[str, str] = field(default_factory=dict)  # lower-case names
    prompt: str = ""
    priority: int = 0
    objective: str = ""
    cache_salt: str = ""
    lora_adapter: str | None = None  # set when target_model is a known adapter
    base_model: str | None = None
    body: Mapping[str, Any] | None = None  # the parsed body (read-only for plugins)
    token_ids: Sequence[int] | None = None  # the prompt's tokens, when the scheduler reads them (see above)
    token_source: str = ""  # prompt | local | engine | approx ("" when not tokenized)
    # Decided before the body ended: `prompt` is only its head; the whole prompt's length estimated by the shell
    # (from content-length). 0: `prompt` is the whole prompt.
    expected_prompt_chars: int = 0
    session: SessionRef | None = None  # the agent session the request belongs to (scheduling/sessions), if known
    media: bool = False  # the prompt holds media (an image, audio, video or file part: its identity in `prompt`)

    @property
    def prompt_chars(self) -> int:
        return max(len(self.prompt), self.expected_prompt_chars)

    @property
    def estimated_tokens(self) -> int:
        """Prompt tokens: the real count when the request was tokenized, else estimated from characters
        (CHARS_PER_TOKEN, the one place that approximation is made for a count)."""
        if self.token_ids is not None:
            return len(self.token_ids)
        return max(len(self.prompt), self.expected_prompt_chars) // CHARS_PER_TOKEN
