"""Usage tokens from a response body, JSON or SSE, fed chunk by chunk.

- JSON: `usage.prompt_tokens` / `completion_tokens` (`input_tokens` / `output_tokens` for the responses and
  Anthropic APIs) and `usage.prompt_tokens_details.cached_tokens`.
- SSE: `data:` lines are scanned, `[DONE]` skipped; the first object carrying usage wins. For the responses API
  the `response.completed` event carries it inside `response`; Anthropic splits input (message_start) and
  output (message_delta) usage across events, so their counts are merged.
A non-SSE body is kept only up to `max_json_bytes`; a larger one is not parsed (counted as unknown usage).
"""

from __future__ import annotations

from dataclasses import dataclass

import orjson


@dataclass(slots=True)
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    found: bool = False


def _merge(usage: Usage, u: object) -> bool:
    if not isinstance(u, dict):
        return False
    p = u.get("prompt_tokens", u.get("input_tokens"))
    c = u.get("completion_tokens", u.get("output_tokens"))
    if p is None and c is None:
        return False
    if isinstance(p, int):
        usage.prompt_tokens = p
    if isinstance(c, int):
        usage.completion_tokens = c
    details = u.get("prompt_tokens_details") or u.get("input_tokens_details") or {}
    if isinstance(details, dict) and isinstance(details.get("cached_tokens"), int):
        usage.cached_tokens = details["cached_tokens"]
    elif isinstance(u.get("cache_read_input_tokens"), int):
        usage.cached_tokens = u["cache_read_input_tokens"]
    usage.found = True
    return True


def _from_object(usage: Usage, obj: object) -> bool:
    if not isinstance(obj, dict):
        return False
    if _merge(usage, obj.get("usage")):
        return True
    inner = obj.get("response") or obj.get("message")  # responses API / Anthropic message_start
    return isinstance(inner, dict) and _merge(usage, inner.get("usage"))


class UsageScanner:
    def __init__(self, content_type: str = "", max_json_bytes: int = 4 * 1024 * 1024) -> None:
        self.sse = "text/event-stream" in content_type
        self.usage = Usage()
        self._buf = bytearray()
        self._max = max_json_bytes
        self._overflow = False
        self._done = False
        self._anthropic_output_seen = False
        self.response_id = ""  # the Responses API's response id, when the body carried one (session chains)

    def feed(self, chunk: bytes, end_of_stream: bool = False) -> None:
        if self._done:
            return
        if self.sse:
            self._buf += chunk
            while True:
                nl = self._buf.find(b"\n")
                if nl < 0:
                    break
                line = bytes(self._buf[:nl]).strip()
                del self._buf[: nl + 1]
                self._line(line)
            if end_of_stream and self._buf:
                self._line(bytes(self._buf).strip())
                self._buf.clear()
            return
        if not self._overflow:
            if len(self._buf) + len(chunk) > self._max:
                self._overflow = True
                self._buf.clear()
            else:
                self._buf += chunk
        if end_of_stream and not self._overflow and self._buf:
            try:
                obj = orjson.loads(self._buf)
            except orjson.JSONDecodeError:
                obj = None
            _from_object(self.usage, obj)
            self._response_id(obj)
            self._buf.clear()
            self._done = True

    def _line(self, line: bytes) -> None:
        if not line.startswith(b"data:"):
            return
        payload = line[5:].strip()
        if not payload or payload == b"[DONE]":
            return
        try:
            obj = orjson.loads(payload)
        except orjson.JSONDecodeError:
            return
        if not self.response_id:
            self._response_id(obj)
        if isinstance(obj, dict) and obj.get("type") == "message_delta":
            # Anthropic: output tokens arrive last; keep the input count from message_start.
            u = obj.get("usage") or {}
            if isinstance(u.get("output_tokens"), int):
                self.usage.completion_tokens = u["output_tokens"]
                self.usage.found = True
            return
        if self.usage.found and not (isinstance(obj, dict) and obj.get("type") == "message_start"):
            return  # the first object carrying usage wins
        _from_object(self.usage, obj)

    def _response_id(self, obj: object) -> None:
        """A Responses API body (`"object": "response"`) or event (`response.created` and the like) names its id."""
        if not isinstance(obj, dict):
            return
        if obj.get("object") != "response":
            obj = obj.get("response")
            if not isinstance(obj, dict) or obj.get("object", "response") != "response":
                return
        rid = obj.get("id")
        if isinstance(rid, str) and rid:
            self.response_id = rid
