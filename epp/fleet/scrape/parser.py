"""A fast parser for just the Prometheus series the picker needs, per engine.

It never walks the whole exposition in Python: for each wanted metric name it jumps from sample line to sample
line with `bytes.find(b"\\n" + name)` (C speed), checks the name ends there (`{` or space), and reads the value
after the last `}`. Labels are parsed only for the series that need them (cache geometry, LoRA, Triton's
request_type / kv_cache_block_type selectors). Input is the raw response body (bytes), so nothing is decoded.

When an exposition carries several series of one metric (data-parallel engines, several model names), queue
lengths are summed and KV usage is averaged. For `vllm:lora_requests_info` the series with the largest value (a
unix timestamp) is the current one. An exposition with none of the engine's load series is an error: the endpoint
is probably not the engine its label claims.

Engines (label `llm-d.ai/engine-type`): vllm (default), sglang, trtllm-serve, triton. See docs/model-servers.md.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from scheduling.types import EngineTotals, Metrics, Totals


class MetricsParseError(ValueError):
    pass


_LABEL_RE = re.compile(rb'([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"')

Sample = tuple[bytes, float]  # (raw label block without braces, value)


def samples(data: bytes, name: bytes, grouped: bool = True) -> list[Sample]:
    """All samples of metric `name` (exact name, not a prefix), as (label block, value).

    The text format requires all lines of one metric to form a single group, so by default the scan stops at the
    end of the first group instead of searching the rest of the body; `grouped=False` searches everything.
    """
    out: list[Sample] = []
    n = len(name)
    needle = b"\n" + name
    if data.startswith(name):
        pos = 0
    else:
        pos = data.find(needle)
        if pos >= 0:
            pos += 1
    while pos >= 0:
        end = data.find(b"\n", pos)
        if end < 0:
            end = len(data)
        nxt = data[pos + n : pos + n + 1]
        if nxt == b"{":
            close = data.rfind(b"}", pos, end)
            if close > 0:
                rest = data[close + 1 : end].split()
                if rest:
                    try:
                        out.append((data[pos + n + 1 : close], float(rest[0])))
                    except ValueError:
                        pass
        elif nxt == b" " or nxt == b"\t":
            rest = data[pos + n : end].split()
            if rest:
                try:
                    out.append((b"", float(rest[0])))
                except ValueError:
                    pass
        if data.startswith(name, end + 1):  # the next line continues the group
            pos = end + 1
        elif grouped:
            break
        else:
            pos = data.find(needle, end)
            if pos >= 0:
                pos += 1
    return out


def labels(block: bytes) -> dict[str, str]:
    return {
        k.decode(): v.decode("utf-8", "replace").replace('\\"', '"').replace("\\n", "\n").replace("\\\\", "\\")
        for k, v in _LABEL_RE.findall(block)
    }


def _label(block: bytes, key: bytes) -> bytes | None:
    """One label's raw value without building the whole dict (cheap selector check)."""
    i = block.find(key + b'="')
    while i > 0 and block[i - 1 : i] not in (b",", b" ", b"{"):
        i = block.find(key + b'="', i + 1)
    if i < 0:
        return None
    start = i + len(key) + 2
    end = block.find(b'"', start)
    while end > 0 and block[end - 1 : end] == b"\\":
        end = block.find(b'"', end + 1)
    return block[start:end] if end >= 0 else None


def _sum(ss: list[Sample]) -> float | None:
    return sum(v for _, v in ss) if ss else None


def _mean(ss: list[Sample]) -> float | None:
    return sum(v for _, v in ss) / len(ss) if ss else None


def _int_label(block: bytes, key: bytes) -> int | None:
    raw = _label(block, key)
    try:
        return int(float(raw)) if raw is not None else None
    except ValueError:
        return None


def _str_label(block: bytes, key: bytes) -> str:
    raw = _label(block, key)
    return raw.decode("utf-8", "replace") if raw else ""


def _adapters(value: str) -> frozenset[str]:
    return frozenset(a.strip() for a in value.split(",") if a.strip())


def _count(v: float | None) -> int:
    """A queue length: missing, NaN or infinite counts as 0."""
    if v is None or v != v or v in (float("inf"), float("-inf")):
        return 0
    return max(0, int(v))


def _family(data: bytes, name: bytes) -> bytes | None:
    """The sample lines of histogram `name`: from its first `name_...` line to the next comment line (the text format
    keeps a family's lines together), or the end. None when the engine does not export it."""
    start = 0 if data.startswith(name + b"_") else data.find(b"\n" + name + b"_")
    if start < 0:
        return None
    end = data.find(b"\n#", start + 1)
    return data[start:] if end < 0 else data[start:end + 1]


def _tail_value(line: bytes) -> float:
    """The value of a sample line (after the labels, or after the name)."""
    close = line.rfind(b"}")
    return float((line[close + 1 :] if close >= 0 else line.partition(b" ")[2]).split()[0])


def histogram(data: bytes, name: bytes, buckets: bool = False
              ) -> tuple[Totals | None, tuple[tuple[float, float], ...]]:
    """Histogram `name` over all its series, in one pass over its own lines: (sum, count) (None when not exported)
    and, when asked, the (upper bound, cumulative count) buckets summed by bound, +Inf last."""
    family = _family(data, name)
    if family is None:
        return None, ()
    total, count, seen = 0.0, 0.0, False
    acc: dict[float, float] = {}
    n = len(name)
    for line in family.split(b"\n"):
        if not line.startswith(name):
            continue
        kind = line[n : n + 7]
        try:
            if kind.startswith(b"_sum") and line[n + 4 : n + 5] in (b"{", b" "):
                total += _tail_value(line)
            elif kind.startswith(b"_count") and line[n + 6 : n + 7] in (b"{", b" "):
                count += _tail_value(line)
                seen = True
            elif buckets and kind == b"_bucket":
                i = line.find(b'le="')
                j = line.find(b'"', i + 4)
                if i >= 0 and j >= 0:
                    le = float(line[i + 4 : j])
                    acc[le] = acc.get(le, 0.0) + _tail_value(line)
        except (ValueError, IndexError):
            continue
    return ((total, count) if seen else None), tuple(sorted(acc.items()))


def histogram_totals(data: bytes, name: bytes) -> Totals | None:
    """(sum, count) of histogram `name` over all its series, searching only its own lines."""
    return histogram(data, name)[0]


def histogram_buckets(data: bytes, name: bytes) -> tuple[tuple[float, float], ...]:
    """(upper bound, cumulative count) of histogram `name`, summed over its series by bound, +Inf last."""
    return histogram(data, name, buckets=True)[1]


def _counter(data: bytes, *names: bytes) -> float | None:
    """A counter summed over its series: the first of `names` the engine exports."""
    for name in names:
        ss = samples(data, name, grouped=False)
        if ss:
            return sum(v for _, v in ss)
    return None


def vllm_engine_totals(data: bytes) -> EngineTotals | None:
    """vLLM's latency histograms and prefix-cache counters (the prefix-cache counters cover the requests that got
    their first token: the TTFT histogram's count)."""
    ttft, ttft_buckets = histogram(data, b"vllm:time_to_first_token_seconds", buckets=True)
    itl = (histogram_totals(data, b"vllm:inter_token_latency_seconds")
           or histogram_totals(data, b"vllm:time_per_output_token_seconds"))
    if ttft is None and itl is None:
        return None
    return EngineTotals(
        ttft=ttft,
        itl=itl,
        prefill=histogram_totals(data, b"vllm:request_prefill_time_seconds"),
        decode=histogram_totals(data, b"vllm:request_decode_time_seconds"),
        queue=histogram_totals(data, b"vllm:request_queue_time_seconds"),
        prompt_tokens=_counter(data, b"vllm:prefix_cache_queries_total", b"vllm:gpu_prefix_cache_queries_total"),
        cached_tokens=_counter(data, b"vllm:prefix_cache_hits_total", b"vllm:gpu_prefix_cache_hits_total"),
        requests=ttft[1] if ttft is not None else None,
        ttft_buckets=ttft_buckets,
    )


def sglang_engine_totals(data: bytes) -> EngineTotals | None:
    """SGLang's latency histograms and token counters (prompt and cached tokens over the finished requests)."""
    ttft, ttft_buckets = histogram(data, b"sglang:time_to_first_token_seconds", buckets=True)
    itl = (histogram_totals(data, b"sglang:inter_token_latency_seconds")
           or histogram_totals(data, b"sglang:time_per_output_token_seconds"))
    if ttft is None and itl is None:
        return None
    return EngineTotals(
        ttft=ttft,
        itl=itl,
        queue=histogram_totals(data, b"sglang:queue_time_seconds"),
        prompt_tokens=_counter(data, b"sglang:prompt_tokens_total"),
        cached_tokens=_counter(data, b"sglang:cached_tokens_total"),
        requests=_counter(data, b"sglang:num_requests_total"),
        generation_tokens=_counter(data, b"sglang:generation_tokens_total"),
        counted_at="end",
        ttft_buckets=ttft_buckets,
    )


def _build(
    engine_name: str, now: float, waiting: float | None, running: float | None, kv: float | None, *,
    block_size: int | None = None, num_gpu_blocks: int | None = None, active_loras: frozenset[str] = frozenset(),
    waiting_loras: frozenset[str] = frozenset(), max_lora: int = 0,
    latency_totals: tuple[float, float, float, float] | None = None, engine: EngineTotals | None = None,
) -> Metrics:
    if waiting is None and running is None and kv is None:
        raise MetricsParseError(f"no {engine_name} load series (waiting/running/KV usage) in the exposition")
    return Metrics(
        waiting=_count(waiting),
        running=_count(running),
        kv_usage=min(1.0, max(0.0, kv)) if kv is not None and kv == kv else 0.0,  # kv == kv: not NaN
        updated_at=now,
        stale=False,
        block_size=block_size,
        num_gpu_blocks=num_gpu_blocks,
        active_loras=active_loras,
        waiting_loras=waiting_loras,
        max_lora=max_lora,
        latency_totals=latency_totals,
        engine=engine,
    )


def parse_vllm(data: bytes, now: float) -> Metrics:
    kv = _mean(samples(data, b"vllm:kv_cache_usage_perc"))
    if kv is None:
        kv = _mean(samples(data, b"vllm:gpu_cache_usage_perc"))
    block_size = num_blocks = None
    cfg = samples(data, b"vllm:cache_config_info")
    if cfg:
        block_size, num_blocks = _int_label(cfg[0][0], b"block_size"), _int_label(cfg[0][0], b"num_gpu_blocks")
    active: frozenset[str] = frozenset()
    waiting_l: frozenset[str] = frozenset()
    max_lora = 0
    lora = samples(data, b"vllm:lora_requests_info")
    if lora:
        newest = max(lora, key=lambda s: s[1])  # value is a unix timestamp: the newest series is current
        block = newest[0]
        active = _adapters(_str_label(block, b"running_lora_adapters"))
        waiting_l = _adapters(_str_label(block, b"waiting_lora_adapters"))
        max_lora = _int_label(block, b"max_lora") or 0
    return _build(
        "vllm",
        now,
        _sum(samples(data, b"vllm:num_requests_waiting")),
        _sum(samples(data, b"vllm:num_requests_running")),
        kv,
        block_size=block_size,
        num_gpu_blocks=num_blocks,
        active_loras=active,
        waiting_loras=waiting_l,
        max_lora=max_lora,
        latency_totals=_legacy(engine := vllm_engine_totals(data)),
        engine=engine,
    )


def parse_sglang(data: bytes, now: float) -> Metrics:
    block_size = num_blocks = None
    cfg = samples(data, b"sglang:cache_config_info")
    if cfg:
        block_size, num_blocks = _int_label(cfg[0][0], b"page_size"), _int_label(cfg[0][0], b"num_pages")
    return _build(
        "sglang",
        now,
        _sum(samples(data, b"sglang:num_queue_reqs")),
        _sum(samples(data, b"sglang:num_running_reqs")),
        _mean(samples(data, b"sglang:token_usage")),
        block_size=block_size,
        num_gpu_blocks=num_blocks,
        latency_totals=_legacy(engine := sglang_engine_totals(data)),
        engine=engine,
    )


def _legacy(engine: EngineTotals | None) -> tuple[float, float, float, float] | None:
    """(TTFT sum, count, TPOT sum, count) for the period means (least-latency-scorer)."""
    if engine is None:
        return None
    return (*(engine.ttft or (0.0, 0.0)), *(engine.itl or (0.0, 0.0)))


def _opt_int(v: float | None) -> int | None:
    return None if v is None else int(v)


def parse_trtllm(data: bytes, now: float) -> Metrics:
    return _build(
        "trtllm-serve",
        now,
        _sum(samples(data, b"trtllm_num_requests_waiting")),
        _sum(samples(data, b"trtllm_num_requests_running")),
        _mean(samples(data, b"trtllm_kv_cache_utilization")),
        block_size=_opt_int(_mean(samples(data, b"trtllm_kv_cache_tokens_per_block"))),
        num_gpu_blocks=_opt_int(_sum(samples(data, b"trtllm_kv_cache_max_blocks"))),
    )


def _select(ss: list[Sample], key: bytes, value: bytes) -> list[Sample]:
    return [s for s in ss if _label(s[0], key) == value]


def parse_triton(data: bytes, now: float) -> Metrics:
    req = samples(data, b"nv_trt_llm_request_metrics")
    kvm = samples(data, b"nv_trt_llm_kv_cache_block_metrics")
    sel = b"kv_cache_block_type"
    return _build(
        "triton",
        now,
        _sum(_select(req, b"request_type", b"waiting")),
        _sum(_select(req, b"request_type", b"scheduled")),
        _mean(_select(kvm, sel, b"fraction")),
        block_size=_opt_int(_mean(_select(kvm, sel, b"tokens_per"))),
        num_gpu_blocks=_opt_int(_sum(_select(kvm, sel, b"max"))),
    )


PARSERS: dict[str, Callable[[bytes, float], Metrics]] = {
    "vllm": parse_vllm,
    "sglang": parse_sglang,
    "trtllm-serve": parse_trtllm,
    "trtllm": parse_trtllm,
    "tensorrt-llm": parse_trtllm,
    "triton": parse_triton,
    "triton-trtllm": parse_triton,
    "triton-tensorrt-llm": parse_triton,
}


def parser_for(engine: str) -> Callable[[bytes, float], Metrics]:
    """The parser for an engine name (case-insensitive). Raises KeyError naming the known engines."""
    try:
        return PARSERS[engine.lower()]
    except KeyError:
        raise KeyError(f"unknown engine {engine!r}; expected one of {sorted(PARSERS)}") from None


def parse_metrics(data: bytes, engine: str, now: float) -> Metrics:
    return parser_for(engine)(data, now)
