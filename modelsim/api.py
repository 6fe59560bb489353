"""Request parsing and response bodies for the OpenAI and Anthropic APIs. Pure: no I/O.

Output text: token i of every reply is the i-th 4-character piece of `OUTPUT_TEXT` (cycled), so the
reply re-tokenizes to exactly `completion_tokens` tokens with modelsim.tokenizer.

Output length: `ignore_eos: true` gives exactly max_tokens (finish_reason "length"). Otherwise the
"natural" length is 1 + (xxh64 of the prompt token ids) mod (2 × max_tokens); when it is shorter than
max_tokens the reply ends with "stop", else "length". max_tokens defaults to the engine's
default_max_tokens (16).
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import xxhash

from modelsim import tokenizer as tk

OUTPUT_TEXT = "The quick brown fox jumps over the lazy dog while the router picks. "
_PIECES = [OUTPUT_TEXT[i : i + 4] for i in range(0, len(OUTPUT_TEXT) - len(OUTPUT_TEXT) % 4, 4)]

PATH_API = {
    "/v1/chat/completions": tk.API_CHAT,
    "/v1/completions": tk.API_COMPLETIONS,
    "/v1/messages": tk.API_MESSAGES,
    "/v1/responses": tk.API_RESPONSES,
}


class BadRequest(ValueError):
    """The body is not a valid request; the message says what to fix."""


def token_text(i: int) -> str:
    return _PIECES[i % len(_PIECES)]


def output_text(start: int, end: int) -> str:
    return "".join(token_text(i) for i in range(start, end))


@dataclass
class ParsedRequest:
    api: str
    model: str
    tokens: list[int]
    max_tokens: int
    output_tokens: int
    finish_reason: str
    stream: bool
    include_usage: bool
    remote_decode: bool
    remote_prefill: bool
    kv_transfer_params: dict[str, Any] | None


def _max_tokens(api: str, body: Mapping[str, Any], default: int) -> int:
    keys = {
        tk.API_CHAT: ("max_completion_tokens", "max_tokens"),
        tk.API_COMPLETIONS: ("max_tokens",),
        tk.API_MESSAGES: ("max_tokens",),
        tk.API_RESPONSES: ("max_output_tokens",),
    }[api]
    for k in keys:
        v = body.get(k)
        if v is not None:
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise BadRequest(f"{k} must be a positive integer, got {v!r}")
            return v
    return default


def natural_length(tokens: Sequence[int], max_tokens: int) -> int:
    h = xxhash.xxh64(struct.pack(f">{len(tokens)}Q", *tokens)).intdigest() if tokens else 0
    return 1 + h % (2 * max_tokens)


def parse_request(api: str, body: Any, default_max_tokens: int,
                  tokenize: Callable[[str, Mapping[str, Any]], list[int]] = tk.request_tokens) -> ParsedRequest:
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise BadRequest("'model' is required and must be a string")
    if api == tk.API_CHAT and not isinstance(body.get("messages"), list):
        raise BadRequest("'messages' is required and must be a list")
    if api == tk.API_MESSAGES and not isinstance(body.get("messages"), list):
        raise BadRequest("'messages' is required and must be a list")
    if api == tk.API_COMPLETIONS and "prompt" not in body:
        raise BadRequest("'prompt' is required")
    tokens = tokenize(api, body)
    if not tokens:
        raise BadRequest("the prompt is empty")
    max_tokens = _max_tokens(api, body, default_max_tokens)
    if body.get("ignore_eos"):
        n, reason = max_tokens, "length"
    else:
        natural = natural_length(tokens, max_tokens)
        n, reason = (natural, "stop") if natural < max_tokens else (max_tokens, "length")
    ktp = body.get("kv_transfer_params")
    ktp = ktp if isinstance(ktp, dict) else None
    so = body.get("stream_options") or {}
    return ParsedRequest(
        api=api,
        model=model,
        tokens=tokens,
        max_tokens=max_tokens,
        output_tokens=n,
        finish_reason=reason,
        stream=bool(body.get("stream")),
        include_usage=bool(isinstance(so, dict) and so.get("include_usage")),
        remote_decode=bool(ktp and ktp.get("do_remote_decode")),
        remote_prefill=bool(ktp and ktp.get("do_remote_prefill")),
        kv_transfer_params=ktp,
    )


def usage(prompt: int, completion: int, cached: int) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached},
    }


def anthropic_stop(reason: str) -> str:
    return {"length": "max_tokens", "stop": "end_turn"}.get(reason, reason)


def full_body(
    p: ParsedRequest, rid: str, created: int, text: str, n_out: int, cached: int, reason: str,
    ktp: dict[str, Any] | None,
) -> dict[str, Any]:
    """The non-streaming reply of any generation API."""
    n_in = len(p.tokens)
    if p.api == tk.API_MESSAGES:
        return {
            "id": f"msg_{rid}", "type": "message", "role": "assistant", "model": p.model,
            "content": [{"type": "text", "text": text}], "stop_reason": anthropic_stop(reason),
            "stop_sequence": None,
            "usage": {"input_tokens": n_in, "output_tokens": n_out, "cache_read_input_tokens": cached},
        }
    if p.api == tk.API_RESPONSES:
        return {
            "id": f"resp_{rid}", "object": "response", "created_at": created, "status": "completed",
            "model": p.model,
            "output": [{"type": "message", "id": f"msg_{rid}", "status": "completed", "role": "assistant",
                        "content": [{"type": "output_text", "text": text, "annotations": []}]}],
            "usage": {"input_tokens": n_in, "output_tokens": n_out, "total_tokens": n_in + n_out,
                      "input_tokens_details": {"cached_tokens": cached}},
        }
    if p.api == tk.API_CHAT:
        choice = {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                  "finish_reason": reason}
        obj, prefix = "chat.completion", "chatcmpl"
    else:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": reason}
        obj, prefix = "text_completion", "cmpl"
    out: dict[str, Any] = {"id": f"{prefix}-{rid}", "object": obj, "created": created, "model": p.model,
                           "choices": [choice], "usage": usage(n_in, n_out, cached)}
    if ktp is not None:
        out["kv_transfer_params"] = ktp
    return out


def openai_chunk(p: ParsedRequest, rid: str, created: int, text: str | None, reason: str | None,
                 first: bool = False) -> dict[str, Any]:
    if p.api == tk.API_CHAT:
        delta: dict[str, Any] = {}
        if first:
            delta["role"] = "assistant"
        if text is not None:
            delta["content"] = text
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": reason}
        return {"id": f"chatcmpl-{rid}", "object": "chat.completion.chunk", "created": created,
                "model": p.model, "choices": [choice]}
    choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": reason}
    return {"id": f"cmpl-{rid}", "object": "text_completion", "created": created, "model": p.model,
            "choices": [choice]}


def openai_usage_chunk(p: ParsedRequest, rid: str, created: int, n_out: int, cached: int,
                       ktp: dict[str, Any] | None) -> dict[str, Any]:
    obj = "chat.completion.chunk" if p.api == tk.API_CHAT else "text_completion"
    prefix = "chatcmpl" if p.api == tk.API_CHAT else "cmpl"
    out: dict[str, Any] = {"id": f"{prefix}-{rid}", "object": obj, "created": created, "model": p.model,
                           "choices": [], "usage": usage(len(p.tokens), n_out, cached)}
    if ktp is not None:
        out["kv_transfer_params"] = ktp
    return out


def anthropic_events_start(p: ParsedRequest, rid: str, cached: int) -> list[tuple[str, dict[str, Any]]]:
    msg = {"id": f"msg_{rid}", "type": "message", "role": "assistant", "model": p.model, "content": [],
           "stop_reason": None, "stop_sequence": None,
           "usage": {"input_tokens": len(p.tokens), "output_tokens": 0, "cache_read_input_tokens": cached}}
    return [
        ("message_start", {"type": "message_start", "message": msg}),
        ("content_block_start", {"type": "content_block_start", "index": 0,
                                 "content_block": {"type": "text", "text": ""}}),
    ]


def anthropic_delta(text: str) -> tuple[str, dict[str, Any]]:
    return ("content_block_delta", {"type": "content_block_delta", "index": 0,
                                    "delta": {"type": "text_delta", "text": text}})


def anthropic_events_end(reason: str, n_out: int) -> list[tuple[str, dict[str, Any]]]:
    return [
        ("content_block_stop", {"type": "content_block_stop", "index": 0}),
        ("message_delta", {"type": "message_delta",
                           "delta": {"stop_reason": anthropic_stop(reason), "stop_sequence": None},
                           "usage": {"output_tokens": n_out}}),
        ("message_stop", {"type": "message_stop"}),
    ]


def error_body(status: int, message: str, api: str = tk.API_CHAT) -> dict[str, Any]:
    if api == tk.API_MESSAGES:
        return {"type": "error", "error": {"type": _ERR_TYPES.get(status, "api_error"), "message": message}}
    return {"object": "error", "message": message, "type": _ERR_TYPES.get(status, "api_error"),
            "param": None, "code": status}


_ERR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
              404: "not_found_error", 429: "rate_limit_error", 500: "api_error", 503: "overloaded_error"}
