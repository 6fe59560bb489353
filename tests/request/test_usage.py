"""Usage tokens from JSON and SSE response bodies, fed in arbitrary chunks."""

from __future__ import annotations

import orjson

from epp.request.usage import UsageScanner


def feed_in_pieces(scanner: UsageScanner, data: bytes, size: int) -> None:
    for i in range(0, len(data), size):
        scanner.feed(data[i : i + size], i + size >= len(data))


def test_json_usage_with_cached_tokens():
    body = orjson.dumps({"usage": {"prompt_tokens": 120, "completion_tokens": 9,
                                   "prompt_tokens_details": {"cached_tokens": 64}}})
    s = UsageScanner("application/json")
    feed_in_pieces(s, body, 7)
    assert (s.usage.prompt_tokens, s.usage.completion_tokens, s.usage.cached_tokens, s.usage.found) == (120, 9, 64, True)


def test_sse_first_usage_wins_and_done_is_skipped():
    events = [{"choices": [{"delta": {"content": "a"}}]},
              {"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 2}},
              {"choices": [], "usage": {"prompt_tokens": 99, "completion_tokens": 99}}]
    body = b"".join(b"data: " + orjson.dumps(e) + b"\n\n" for e in events) + b"data: [DONE]\n\n"
    s = UsageScanner("text/event-stream")
    feed_in_pieces(s, body, 3)
    assert (s.usage.prompt_tokens, s.usage.completion_tokens) == (5, 2)


def test_responses_api_completed_event():
    ev = {"type": "response.completed", "response": {"usage": {"input_tokens": 11, "output_tokens": 4}}}
    body = b"event: response.completed\ndata: " + orjson.dumps(ev) + b"\n\n"
    s = UsageScanner("text/event-stream; charset=utf-8")
    feed_in_pieces(s, body, 10)
    assert (s.usage.prompt_tokens, s.usage.completion_tokens) == (11, 4)


def test_anthropic_stream_merges_input_and_output():
    start = {"type": "message_start", "message": {"usage": {"input_tokens": 30, "output_tokens": 1}}}
    delta = {"type": "message_delta", "usage": {"output_tokens": 17}}
    body = b"".join(b"event: x\ndata: " + orjson.dumps(e) + b"\n\n" for e in (start, delta))
    s = UsageScanner("text/event-stream")
    feed_in_pieces(s, body, 5)
    assert (s.usage.prompt_tokens, s.usage.completion_tokens) == (30, 17)


def test_oversized_json_is_not_parsed():
    s = UsageScanner("application/json", max_json_bytes=10)
    s.feed(b'{"usage": {"prompt_tokens": 1, "completion_tokens": 1}}', True)
    assert not s.usage.found
