"""A long body that comes in one message is read only as far as the decision needs (issue 32): the prompt's head,
a slice at a time (`epp.request.early.HEAD_SLICE`), when the decision can come from it; the whole body, as before,
when it cannot (the model after the prompt, a head that never begins)."""

from __future__ import annotations

from dataclasses import replace

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from epp.protocol import BodyMode
from epp.request.early import HEAD_SLICE, reads_tokens
from epp.request.parsing import parse_body
from scheduling.types import ApiKind
from tests.support.extproc import SyncMachine, body_msg, headers_msg, real_director, set_headers

DEST = "x-gateway-destination-endpoint"


def chat(model_first: bool, chars: int = 256_000) -> bytes:
    text = ("what the agent saw so far, turn after turn; " * (chars // 44 + 1))[:chars]
    messages = [{"role": "user", "content": text}]
    body = {"model": "m", "messages": messages, "max_tokens": 7} if model_first else \
        {"messages": messages, "model": "m", "max_tokens": 7}
    return orjson.dumps(body)


TRUSTED = "x-model-from-an-earlier-filter"


def decide(raw: bytes, pieces: int = 1, mode: BodyMode = BodyMode.FULL_DUPLEX_STREAMED, *, trusted: bool = False,
           whole: bool = False):
    """`trusted`: the model also comes in a header the director trusts (`--trusted-model-header`); `whole`: no
    decision on the head (`--early-decisions=false`), the body read whole."""
    director = real_director()
    if trusted:
        director = replace(director, early=replace(director.early, model_headers=(TRUSTED,)))
    if whole:
        director = replace(director, early=replace(director.early, decisions=False))
    ex = director.exchange()
    m = SyncMachine(ex, request_body_mode=mode)
    m.feed(headers_msg(**({TRUSTED: "m"} if trusted else {})))
    size = -(-len(raw) // pieces)
    replies = []
    for i in range(0, len(raw), size):
        replies += m.feed(body_msg(raw[i : i + size], i + size >= len(raw)))
    return ex, replies


def destination(replies) -> bytes | None:
    for r in replies:  # the routing headers ride on the headers reply, or on the body's in BUFFERED
        phase = r.WhichOneof("response")
        if phase in ("request_headers", "request_body") and DEST in set_headers(r, phase):
            return set_headers(r, phase)[DEST]
    return None


@pytest.mark.parametrize("trusted", [True, False])
@pytest.mark.parametrize("mode", [BodyMode.FULL_DUPLEX_STREAMED, BodyMode.BUFFERED])
def test_a_long_body_in_one_message_is_read_only_as_far_as_its_head(mode: BodyMode, trusted: bool) -> None:
    """The model from a trusted header, or from the body when the whole body (checked at once: it is all here)
    names no other: the decision reads the head, the streaming reader no further."""
    raw = chat(model_first=True)
    ex, replies = decide(raw, mode=mode, trusted=trusted)
    reader = ex.intake.reader if ex.intake is not None else None
    assert reader is not None and ex.early == "m"
    # One slice: the message is entered at once (the rest is held, not awaited), and the rest is never parsed.
    assert reader.read <= HEAD_SLICE < len(raw)
    req = ex.ctx.request if ex.ctx is not None else None
    whole = parse_body(ApiKind.CHAT, raw)
    assert req is not None and whole.prompt.startswith(req.prompt) and len(req.prompt) >= 16_384
    assert destination(replies) is not None
    ex.close()


def test_the_first_slice_reads_no_further_than_the_head_can_end() -> None:
    """A character takes a byte at least, so the head (the 16 KB the default scheduler hashes) ends within its
    length and HEAD_LEAD of the body's start when the model comes first: that is all a first slice parses."""
    from epp.request.early import HEAD_LEAD, prompt_chars_needed

    ex, replies = decide(chat(model_first=True))
    needed = prompt_chars_needed(ex.d.scheduler)
    assert ex.early == "m" and destination(replies) is not None
    assert ex.intake is not None and ex.intake.reader is not None
    assert needed <= ex.intake.reader.read <= needed + HEAD_LEAD < HEAD_SLICE
    ex.close()


def test_a_prompt_after_long_members_still_decides_on_its_head() -> None:
    """20 KB of tools before the messages: no head has begun when the first slice ends, but one begins within
    HEAD_SLICE, so the reading goes on a slice at a time and the decision still comes from the head."""
    tools = [{"type": "function", "function": {"name": f"tool_{i}", "description": "d" * 180}} for i in range(100)]
    text = ("what the agent saw so far, turn after turn; " * 6000)[:256_000]
    raw = orjson.dumps({"model": "m", "tools": tools, "messages": [{"role": "user", "content": text}]})
    assert 20_000 < raw.index(b'"messages"') < HEAD_SLICE
    ex, replies = decide(raw)
    assert ex.early == "m" and destination(replies) is not None
    assert ex.intake is not None and ex.intake.reader is not None and ex.intake.reader.read < 2 * HEAD_SLICE
    ex.close()


def sdk_chat(chars: int = 256_000, **after: object) -> bytes:
    """A chat body as OpenAI's Python client writes it: `messages` first, then `model` and the other members."""
    text = ("what the agent saw so far, turn after turn; " * (chars // 44 + 1))[:chars]
    return orjson.dumps({"messages": [{"role": "user", "content": text}], "model": "m", **after})


@pytest.mark.parametrize(("mode", "pieces"), [(BodyMode.FULL_DUPLEX_STREAMED, 1), (BodyMode.FULL_DUPLEX_STREAMED, 4),
                                              (BodyMode.BUFFERED, 1)])
def test_the_model_after_the_prompt_decides_on_the_head_at_the_body_end(mode: BodyMode, pieces: int) -> None:
    """The head cannot decide before the body ends (its model has not arrived), and the rest of the prompt is not
    read: at the end one scan of the body gives the members after the prompt, the decision reads those and the
    head, as an early decision does (the token estimate is the body's size), and picks where the whole body would."""
    from epp.request.early import prompt_chars_needed

    raw = sdk_chat(max_tokens=7, user="agent-7", metadata={"k": [1, 2]})
    ex, replies = decide(raw, pieces, mode)
    assert ex.early == "m" and ex.intake is not None and ex.intake.checks is None
    reader = ex.intake.reader
    needed = prompt_chars_needed(ex.d.scheduler)
    assert reader is not None and reader.read < 64 * 1024 + HEAD_SLICE < len(raw)  # the rest of the prompt: unread
    req = ex.ctx.request if ex.ctx is not None else None
    whole = parse_body(ApiKind.CHAT, raw)
    assert req is not None and whole.prompt.startswith(req.prompt) and len(req.prompt) >= needed
    assert req.expected_prompt_chars == len(raw) and req.model == "m"
    assert {k: v for k, v in req.body.items() if k != "messages"} == {"model": "m", "max_tokens": 7,
                                                                       "user": "agent-7", "metadata": {"k": [1, 2]}}
    late_dest = destination(replies)
    ex.close()
    whole_ex, whole_replies = decide(raw, pieces, mode, whole=True)
    assert whole_ex.early is None and whole_ex.ctx is not None and whole_ex.ctx.request.prompt == whole.prompt
    assert late_dest is not None and late_dest == destination(whole_replies)
    whole_ex.close()


@pytest.mark.parametrize(("tail", "error"), [
    (b',"model":7}', b"'model' must be a string"),
    (b',"model":""}', b"model not found in request body"),
    (b',"max_tokens":7}', b"model not found in request body"),
    (b',"model":"m",}', b"request body is not valid JSON"),
    (b',"model":"m"', b"request body is not valid JSON"),
])
@pytest.mark.parametrize(("mode", "pieces"), [(BodyMode.FULL_DUPLEX_STREAMED, 3), (BodyMode.FULL_DUPLEX_STREAMED, 1),
                                              (BodyMode.BUFFERED, 1)])
def test_a_body_the_end_scan_cannot_decide_gets_the_whole_reads_error(tail: bytes, error: bytes, mode: BodyMode,
                                                                       pieces: int) -> None:
    """No model, a model that is not a string, malformed JSON after the prompt: the rest is read and parsed as
    before, and the client gets the same 400 as a body read whole."""
    raw = sdk_chat()[:-1].rsplit(b',"model"', 1)[0] + tail
    ex, replies = decide(raw, pieces, mode)
    assert ex.early is None
    reply = next(r for r in replies if r.WhichOneof("response") == "immediate_response").immediate_response
    assert reply.status.code == 400 and error in reply.body, reply.body[:200]
    ex.close()


def test_the_last_model_after_the_prompt_is_the_one_decided_with() -> None:
    """JSON's last member wins for the decision as for the model server, its key read through escapes."""
    raw = sdk_chat()[:-1] + b',"mod\\u0065l":"other"}'
    assert orjson.loads(raw)["model"] == "other"
    ex, replies = decide(raw, 3)
    assert ex.early == "other" and ex.ctx is not None and ex.ctx.request.model == "other"
    assert destination(replies) is not None
    ex.close()


def test_a_body_whose_end_comes_in_trailers_is_decided_on_its_head_too() -> None:
    from tests.support.extproc import trailers_msg

    raw = sdk_chat(max_tokens=7)
    ex = real_director().exchange()
    m = SyncMachine(ex, request_body_mode=BodyMode.FULL_DUPLEX_STREAMED)
    m.feed(headers_msg())
    replies = m.feed(body_msg(raw[:100_000], False)) + m.feed(body_msg(raw[100_000:], False))
    assert destination(replies) is None and ex.intake is not None and ex.intake.late
    replies = m.feed(trailers_msg())
    assert ex.early == "m" and destination(replies) is not None
    assert ex.ctx is not None and ex.ctx.request.body["max_tokens"] == 7
    assert _echoed(replies) == raw
    ex.close()


def test_a_pool_with_model_rewrites_reads_the_whole_body_as_before() -> None:
    """A rewrite changes the model's value in the body, which the head decision would not have read."""
    director = real_director()
    director.datastore.rewrites = {"m": object()}  # any rewrite for the pool
    raw = sdk_chat()
    ex = director.exchange()
    m = SyncMachine(ex, request_body_mode=BodyMode.FULL_DUPLEX_STREAMED)
    m.feed(headers_msg())
    m.feed(body_msg(raw, True))
    assert ex.early is None and ex.intake is not None and not ex.intake.late
    ex.close()


@pytest.mark.parametrize(("pieces", "mode", "trusted"), [(1, BodyMode.FULL_DUPLEX_STREAMED, True),
                                                         (3, BodyMode.FULL_DUPLEX_STREAMED, False),
                                                         (1, BodyMode.BUFFERED, True)])
def test_the_head_decides_where_the_whole_body_would(pieces: int, mode: BodyMode, trusted: bool) -> None:
    """On the same (idle) pool, the decision made on the head of a long body picks the endpoint the whole body's
    decision picks (read as it streamed in, in one message, or sent whole)."""
    raw = chat(model_first=True)
    early_ex, early = decide(raw, pieces, mode, trusted=trusted)
    late_ex, late = decide(raw, pieces, mode, whole=True)
    assert early_ex.early is not None and late_ex.early is None
    assert destination(early) == destination(late) is not None
    early_ex.close()
    late_ex.close()


def test_a_short_body_in_one_message_is_parsed_whole() -> None:
    raw = chat(model_first=True, chars=HEAD_SLICE // 2)
    ex, _ = decide(raw)
    reader = ex.intake.reader if ex.intake is not None else None
    assert ex.early is None and reader is not None and not reader.reading  # one orjson call at the end
    ex.close()


async def _serve_director(tmp_path, *flags: str):
    from epp.cmd.app import App
    from tests.support.envoy import free_port
    from tests.support.stack import serve_args

    eps = tmp_path / "eps.yaml"
    eps.write_text("pools:\n- name: p\n  endpoints:\n  - {address: 127.0.0.1, port: 9, models: [m]}\n")
    app = App(serve_args("--grpc-port", str(free_port()), "--endpoints-file", str(eps), "--passive-health",
                         "false", *flags))
    await app.start()
    return app


async def test_epp_serve_decides_a_long_body_on_its_head(tmp_path) -> None:
    """`epp serve` always has a tokenizer ready (precise prefix routing), yet the built-in default config reads no
    token ids: its long bodies decide on their head, as the early rules say (they used to wait for the whole body
    because a tokenizer existed). Agent sessions are on: the session header names the session up front."""
    app = await _serve_director(tmp_path)
    try:
        ex = app.director.exchange()
        m = SyncMachine(ex, request_body_mode=BodyMode.FULL_DUPLEX_STREAMED)
        m.feed(headers_msg(**{"x-session-id": "agent-7"}))
        raw = chat(model_first=True)
        replies = m.feed(body_msg(raw[:100_000], False))
        assert ex.early == "m" and ex.intake is not None and ex.intake.reader is not None
        assert ex.intake.reader.read <= HEAD_SLICE < len(raw)
        assert destination(replies) is not None
        last = m.feed(body_msg(raw[100_000:], True))  # the whole body confirms the model: its end is echoed
        assert {r.WhichOneof("response") for r in last} == {"request_body"}
        assert _echoed(replies + last) == raw
        ex.close()
    finally:
        await app.stop(0)


async def test_epp_serve_with_a_config_reading_token_ids_waits_for_the_whole_body(tmp_path) -> None:
    """A config that reads token ids (the precise prefix profile) tokenizes the whole prompt: no early decision."""
    from pathlib import Path

    profile = Path(__file__).resolve().parents[2] / "deploy" / "profiles" / "estimated-latency-precise.yaml"
    app = await _serve_director(tmp_path, "--config-file", str(profile))
    try:
        ex = app.director.exchange()
        m = SyncMachine(ex, request_body_mode=BodyMode.FULL_DUPLEX_STREAMED)
        m.feed(headers_msg())
        raw = chat(model_first=True)
        m.feed(body_msg(raw[:40_000], False))
        assert ex.early is None  # a head long enough for the hashes, but the tokens need the whole prompt
        assert reads_tokens(app.director.scheduler)
        ex.close()
    finally:
        await app.stop(0)


async def test_a_short_body_in_two_messages_is_left_unread_until_its_end(tmp_path) -> None:
    """Envoy often sends a short body and its end in two messages: the body is kept, not read by the streaming
    reader, until it could hold the hashed head (so it is still one orjson call at its end)."""
    app = await _serve_director(tmp_path)
    try:
        ex = app.director.exchange()
        m = SyncMachine(ex, request_body_mode=BodyMode.FULL_DUPLEX_STREAMED)
        m.feed(headers_msg())
        raw = chat(model_first=True, chars=200)
        m.feed(body_msg(raw, False))
        assert ex.intake is not None and ex.intake.reader is not None and not ex.intake.reader.reading
        replies = m.feed(body_msg(b"", True))
        req = ex.ctx.request if ex.ctx is not None else None
        assert req is not None and req.prompt == parse_body(ApiKind.CHAT, raw).prompt
        assert destination(replies) is not None
        ex.close()
    finally:
        await app.stop(0)


# ---- a model the decision read in the head, and the whole body ---------------------------------------------------
def _echoed(replies) -> bytes:
    return b"".join(r.request_body.response.body_mutation.streamed_response.body for r in replies
                    if r.WhichOneof("response") == "request_body")


def _stream(raw: bytes, cut: int, *, trusted: bool = False, config: dict | None = None):
    """A full-duplex chat body in two messages, cut after `cut` bytes: the decision comes after the first."""
    director = real_director(config=config)
    if trusted:
        director = replace(director, early=replace(director.early, model_headers=(TRUSTED,)))
    ex = director.exchange()
    m = SyncMachine(ex, request_body_mode=BodyMode.FULL_DUPLEX_STREAMED)
    m.feed(headers_msg(**({TRUSTED: "m"} if trusted else {})))
    first = m.feed(body_msg(raw[:cut], False))
    return director, ex, m, first


def twice(second: object, chars: int = 64_000) -> bytes:
    """A chat body naming `m` before its prompt and `second` after it (JSON's last member: what vLLM serves)."""
    text = ("the turns so far " * (chars // 17 + 1))[:chars]
    head = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": text}]})[:-1]
    return head + b',"max_tokens":7,"model":' + orjson.dumps(second) + b"}"


@pytest.mark.parametrize("second", ["premium-adapter", None, 7])
def test_a_model_named_again_after_the_decision_point_is_refused_at_the_body_end(second: object) -> None:
    """The decision took `m` from the head; the body ends naming another model, which the engine would serve. The
    last chunk is answered with a 400 instead of its echo, so the upstream never gets a complete request; the
    request is counted as a rejection and released."""
    from epp.protocol.machine import Phase
    from tests.protocol.test_protocol_properties import inflight

    raw = twice(second)
    director, ex, m, first = _stream(raw, 40_000)
    assert ex.early == "m" and destination(first) is not None and inflight(director) == 1
    last = m.feed(body_msg(raw[40_000:], True))
    assert [r.WhichOneof("response") for r in last] == ["immediate_response"]
    reply = last[0].immediate_response
    assert reply.status.code == 400 and b"names its model twice" in reply.body and b"'m'" in reply.body
    assert _echoed(first) == raw[:40_000]  # what went upstream: never the end of the body
    assert m.phase is Phase.CLOSED and m.finished
    ex.close()
    assert inflight(director) == 0


@pytest.mark.parametrize("key", [rb"mod\u0065l", rb"\u006D\u006f\u0064\u0065\u006c"])
def test_a_model_named_again_in_escapes_is_refused_too(key: bytes) -> None:
    """The check reads the key as the model server's JSON parser does: `"mod\u0065l"` is `"model"`, JSON's last
    member of that name, though its bytes never spell it."""
    raw = twice("m")[:-1] + b',"' + key + b'":"premium-adapter"}'
    assert orjson.loads(raw)["model"] == "premium-adapter"
    _, ex, m, first = _stream(raw, 40_000)
    assert ex.early == "m" and destination(first) is not None
    last = m.feed(body_msg(raw[40_000:], True))
    assert last[0].immediate_response.status.code == 400
    assert b"'premium-adapter' at its end" in last[0].immediate_response.body
    ex.close()


def test_a_model_named_again_inside_a_value_is_not_a_second_model() -> None:
    """Only a top-level member names the model: the same key in a message, a tool's schema or a string passes."""
    raw = twice("m")[:-1] + b',"tools":[{"type":"function","function":{"name":"f","parameters":{"model":"x"}}}],' \
        b'"metadata":{"model":"premium-adapter","note":"\\"model\\": \\"y\\""}}'
    assert orjson.loads(raw)["model"] == "m"
    _, ex, m, first = _stream(raw, 40_000)
    last = m.feed(body_msg(raw[40_000:], True))
    assert _echoed(first + last) == raw
    ex.close()


def test_a_body_that_confirms_its_model_streams_through_untouched() -> None:
    """The same model repeated (or named once) passes: every chunk is echoed, in order, the body whole."""
    for raw in (twice("m"), chat(model_first=True, chars=64_000)):
        director, ex, m, first = _stream(raw, 40_000)
        assert ex.early == "m"
        last = m.feed(body_msg(raw[40_000:], True))
        assert _echoed(first + last) == raw
        ex.close()


def test_a_body_that_ends_malformed_after_an_early_decision_gets_a_clear_400() -> None:
    raw = chat(model_first=True, chars=64_000)[:-2] + b"]"  # the root object never closes
    _, ex, m, _first = _stream(raw, 40_000)
    last = m.feed(body_msg(raw[40_000:], True))
    assert last[0].immediate_response.status.code == 400
    assert b"request body is not valid JSON" in last[0].immediate_response.body
    ex.close()


def test_a_model_from_a_trusted_header_is_not_checked_against_the_body() -> None:
    """The header came from a filter that read the whole body: the rest is echoed as it comes, not kept."""
    raw = twice("premium-adapter")
    _, ex, m, first = _stream(raw, 40_000, trusted=True)
    assert ex.early == "m" and ex.intake is not None and ex.intake.checks is None
    last = m.feed(body_msg(raw[40_000:], True))
    assert _echoed(first + last) == raw
    ex.close()


@pytest.mark.parametrize("mode", [BodyMode.FULL_DUPLEX_STREAMED, BodyMode.BUFFERED])
def test_a_whole_body_naming_its_model_twice_is_decided_on_the_last_as_the_engine_reads_it(mode: BodyMode) -> None:
    """Envoy sent the body whole (BUFFERED, or one full-duplex message): one scan of it gives the decision the model
    the engine serves (JSON's last member), as a body decided at its end always had, and the members after the
    prompt; the prompt is read no further than its head."""
    raw = twice("other")
    ex, replies = decide(raw, mode=mode)
    assert ex.early == "other" and ex.request is not None and ex.request.model == "other"
    assert ex.request.body is not None and ex.request.body["max_tokens"] == 7
    assert ex.intake is not None and ex.intake.reader is not None and ex.intake.reader.read < HEAD_SLICE
    assert destination(replies) is not None
    ex.close()


@pytest.mark.parametrize("mode", [BodyMode.FULL_DUPLEX_STREAMED, BodyMode.BUFFERED])
def test_a_whole_body_decided_on_its_head_sees_the_members_after_its_prompt(mode: BodyMode) -> None:
    """The model first, `max_tokens` and `user` after a long prompt, the body sent whole: the decision on the head
    reads them, as the whole body's decision does (an early decision, before the body ends, cannot)."""
    raw = chat(model_first=True)[:-1] + b',"user":"agent-7"}'
    ex, _ = decide(raw, mode=mode)
    assert ex.early == "m" and ex.request is not None and ex.request.body is not None
    assert ex.request.body["max_tokens"] == 7 and ex.request.body["user"] == "agent-7"
    ex.close()


def test_trailers_that_end_the_body_after_an_early_decision_are_checked_too() -> None:
    from tests.support.extproc import trailers_msg

    raw = twice("premium-adapter")
    _, ex, m, _first = _stream(raw, 40_000)
    m.feed(body_msg(raw[40_000:], False))
    last = m.feed(trailers_msg())
    assert [r.WhichOneof("response") for r in last] == ["immediate_response"]
    assert last[0].immediate_response.status.code == 400
    ex.close()


def test_a_body_past_the_limit_after_an_early_decision_gets_413() -> None:
    """The rest of the body still counts against max_body_bytes (it is kept for the check)."""
    raw = chat(model_first=True, chars=200_000)
    director = real_director()
    ex = director.exchange()
    m = SyncMachine(ex, request_body_mode=BodyMode.FULL_DUPLEX_STREAMED, max_body_bytes=100_000)
    m.feed(headers_msg())
    assert destination(m.feed(body_msg(raw[:40_000], False))) is not None
    assert m.feed(body_msg(raw[40_000:80_000], False))[0].WhichOneof("response") == "request_body"
    last = m.feed(body_msg(raw[80_000:], True))
    assert last[0].immediate_response.status.code == 413
    ex.close()


def test_streamed_without_waiting_checks_the_body_end_too() -> None:
    """STREAMED with send_body_without_waiting_for_header_response decides early as full duplex does; its later
    chunks pass unchanged, and the last one is refused when the body names another model."""
    raw = twice("premium-adapter")
    ex = real_director().exchange()
    m = SyncMachine(ex, request_body_mode=BodyMode.STREAMED, send_body_without_waiting=True)
    m.feed(headers_msg(mode=BodyMode.STREAMED, wait=False))
    first = m.feed(body_msg(raw[:40_000], False))
    assert ex.early == "m" and destination(first) is not None
    last = m.feed(body_msg(raw[40_000:], True))
    assert [r.WhichOneof("response") for r in last] == ["immediate_response"]
    assert last[0].immediate_response.status.code == 400
    ex.close()


def test_an_early_rewrite_covers_the_body_up_to_the_decision_only() -> None:
    """A model rewrite decided early replaces the chunks received up to the decision; the chunks kept for the check
    afterwards (they came while an awaitable decision was pending) are echoed as they are, so they must not be in it."""
    from epp.request.early import Intake
    from tests.support.extproc import LOAD_ONLY

    director = real_director(config=LOAD_ONLY)
    raw = twice("m", chars=2_000)
    intake = Intake()
    headers = {":path": "/v1/chat/completions", "content-type": "application/json"}
    assert intake.chunk(director, headers, raw[:100], False) and intake.early == "m"
    assert intake.rest(raw[100:1_000], False) is None
    assert intake.rewritten("m-v2") == raw[:100].replace(b'"m"', b'"m-v2"', 1)
    assert intake.rest(raw[1_000:], True) is None  # and the whole body confirms "m"


@pytest.mark.parametrize("depth", [900, 1000, 1100])
def test_deep_nesting_after_the_prompt_is_judged_as_orjson_judges_it(depth: int) -> None:
    """msgspec's scan nests only as deep as Python's stack: a body nested deeper after the prompt goes to orjson
    (which allows 1,024 levels) instead of failing the stream, whether the model came before the prompt (the
    check) or after it (the decision at the end)."""
    nested = b"[" * depth + b"]" * depth
    refused = depth > 1000
    for raw in (twice("m")[:-1] + b',"deep":' + nested + b"}", sdk_chat()[:-1] + b',"deep":' + nested + b"}"):
        try:
            orjson.loads(raw)
            assert not refused
        except orjson.JSONDecodeError:
            assert refused
        ex, replies = decide(raw, 3)
        answers = [r.WhichOneof("response") for r in replies]
        if refused:
            assert "immediate_response" in answers
            reply = next(r for r in replies if r.WhichOneof("response") == "immediate_response").immediate_response
            assert reply.status.code == 400 and b"not valid JSON" in reply.body
        else:
            assert "immediate_response" not in answers and destination(replies) is not None
            assert _echoed(replies) == raw
        ex.close()


def test_a_scheduler_born_where_a_freed_one_lived_answers_for_itself() -> None:
    """A config reload frees the old scheduler, and the next one may be allocated at its address. What the early
    rules ask of a scheduler (the head its prefix producers hash) must be the new one's, not the old one's (a cache
    keyed by id() kept the old answer: a reload could decide on a head of the old config's length)."""
    from types import SimpleNamespace

    from epp.request.early import prompt_chars_needed

    class Scheduler:  # what the rules read of one: its plugins' block sizes, whether a config reads token ids
        def __init__(self, blocks: int) -> None:
            self.blocks = blocks

        def plugins(self) -> list[SimpleNamespace]:
            return [SimpleNamespace(block_tokens=16, max_blocks=self.blocks)]

        def reads(self, name: str) -> bool:
            return False

    reused = 0
    for _ in range(50):
        old = Scheduler(256)
        assert prompt_chars_needed(old) == 16_384
        address = id(old)
        del old
        new = Scheduler(1)  # the same size as the one just freed: CPython hands it the same block
        reused += id(new) == address
        assert prompt_chars_needed(new) == 64
    assert reused  # the case this is about happened


def test_a_config_that_hashes_the_whole_prompt_never_decides_on_its_head() -> None:
    """The byte-prefix-affinity scorer (LLMKube's prefixAffinity) hashes every 1 KB block of the prompt: a decision
    on the head would hash another prompt than the same request sent short. Neither the model-first body nor the
    model-last one is decided on its head; both read the whole prompt."""
    config = {"apiVersion": "inference.networking.x-k8s.io/v1alpha1", "kind": "EndpointPickerConfig",
              "plugins": [{"type": "byte-prefix-affinity-scorer"}, {"type": "queue-scorer"}]}
    for raw in (chat(model_first=True), sdk_chat()):
        ex = real_director(config=config).exchange()
        m = SyncMachine(ex, request_body_mode=BodyMode.FULL_DUPLEX_STREAMED)
        m.feed(headers_msg())
        replies = m.feed(body_msg(raw[:40_000], False))
        assert destination(replies) is None and ex.early is None
        replies = m.feed(body_msg(raw[40_000:], True))
        assert ex.early is None and ex.ctx is not None
        assert ex.ctx.request.prompt == parse_body(ApiKind.CHAT, raw).prompt and destination(replies) is not None
        ex.close()


def test_an_agent_sessions_program_head_is_read_before_a_decision_on_the_head() -> None:
    """With agent sessions on, a program is told by its prompt's first 2,048 characters: a config that hashes no
    prompt still waits for them, so a long body's program is the one its short turns have."""
    from epp.request.sessions import SessionIdentity
    from epp.request.settings import SessionSettings
    from tests.support.extproc import LOAD_ONLY

    director = replace(real_director(config=LOAD_ONLY), sessions=SessionIdentity(SessionSettings()))
    raw = chat(model_first=True, chars=64_000)
    ex = director.exchange()
    m = SyncMachine(ex, request_body_mode=BodyMode.FULL_DUPLEX_STREAMED)
    m.feed(headers_msg(**{"x-session-id": "agent-7"}))
    assert destination(m.feed(body_msg(raw[:1_000], False))) is None and ex.early is None  # (it was decided here)
    assert destination(m.feed(body_msg(raw[1_000:1_500], False))) is None and ex.early is None
    replies = m.feed(body_msg(raw[1_500:40_000], False))
    assert ex.early == "m" and destination(replies) is not None
    assert ex.ctx is not None and len(ex.ctx.request.prompt) >= 2_048
    ex.close()


def test_the_decision_log_says_when_a_decision_was_made_on_the_head(caplog) -> None:
    """`--log-decisions`: `(early)` for a decision made before the body ended, `(on its head)` for one made at its
    end with the rest of the prompt unread (the model after the prompt), nothing for a body read whole."""
    import logging

    def logged(raw: bytes, pieces: int, **kw: bool) -> str:
        director = real_director()
        director = replace(director, config=replace(director.config, log_decisions=True))
        if kw.get("whole"):
            director = replace(director, early=replace(director.early, decisions=False))
        ex = director.exchange()
        m = SyncMachine(ex, request_body_mode=BodyMode.FULL_DUPLEX_STREAMED)
        m.feed(headers_msg())
        size = -(-len(raw) // pieces)
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="epp.director"):
            for i in range(0, len(raw), size):
                m.feed(body_msg(raw[i: i + size], i + size >= len(raw)))
        ex.close()
        return next(r.getMessage() for r in caplog.records if r.getMessage().startswith("decision "))

    assert "(early)" in logged(chat(model_first=True), 4)
    assert "(on its head)" in logged(sdk_chat(), 4)
    assert "(early)" not in (whole := logged(sdk_chat(), 4, whole=True)) and "(on its head)" not in whole


def test_with_model_rewrites_a_whole_body_is_checked_against_its_head_model() -> None:
    """A rewrite changes the model value the head read, so with rewrites for the pool a body sent whole keeps the
    check: confirmed, it is decided on the head's model; naming another at its end, it is read whole."""
    def decided(raw: bytes):
        director = real_director()
        director.datastore.rewrites = {"m": object()}
        ex = director.exchange()
        m = SyncMachine(ex, request_body_mode=BodyMode.BUFFERED)
        m.feed(headers_msg())
        replies = m.feed(body_msg(raw, True))
        return ex, replies

    ex, replies = decided(chat(model_first=True))
    assert ex.early == "m" and ex.request is not None and "max_tokens" not in (ex.request.body or {})
    assert destination(replies) is not None
    ex.close()
    ex, replies = decided(twice("other"))
    assert ex.early is None and ex.request is not None and ex.request.model == "other"
    ex.close()


_SCALARS = st.one_of(st.integers(-10**6, 10**6), st.booleans(), st.none(), st.text(max_size=20),
                     st.floats(allow_nan=False, allow_infinity=False))
_VALUES = st.recursive(_SCALARS, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                         st.dictionaries(st.text(max_size=8), inner, max_size=3)),
                       max_leaves=8)


_MODELS = st.tuples(st.sampled_from(["model", "mod\\u0065l"]), st.one_of(st.sampled_from(["m", "other"]), _VALUES))


@settings(max_examples=100, deadline=None)
@given(before=st.lists(st.one_of(_MODELS, st.tuples(st.sampled_from(["stream", "user", "n", "x"]), _VALUES)),
                       max_size=3),
       after=st.lists(st.one_of(_MODELS, st.tuples(st.sampled_from(["max_tokens", "user", "cache_salt", "y"]),
                                                   _VALUES)), max_size=4),
       pieces=st.integers(1, 4), buffered=st.booleans())
def test_a_decision_on_the_head_reads_the_members_a_whole_parse_reads(before, after, pieces, buffered) -> None:
    """Members before and after a long prompt, any values, repeated names, a key spelled in escapes: whatever the
    decision on the head reads of the body (its model, its members but the prompt) is what orjson's whole parse
    reads, and a body the whole parse refuses gets the whole parse's 400."""
    text = ("what the agent saw so far, turn after turn; " * 1000)[:40_000]
    parts = [b'"' + k.encode() + b'":' + orjson.dumps(v) for k, v in before]
    parts.append(b'"messages":' + orjson.dumps([{"role": "user", "content": text}]))
    parts += [b'"' + k.encode() + b'":' + orjson.dumps(v) for k, v in after]
    raw = b"{" + b",".join(parts) + b"}"
    want = orjson.loads(raw)
    mode = BodyMode.BUFFERED if buffered else BodyMode.FULL_DUPLEX_STREAMED
    ex, replies = decide(raw, 1 if buffered else pieces, mode)
    model = want.get("model")
    if not isinstance(model, str) or not model:
        reply = next(r for r in replies if r.WhichOneof("response") == "immediate_response").immediate_response
        assert reply.status.code == 400
    else:
        assert ex.request is not None and ex.request.model == model and destination(replies) is not None
        if ex.early is not None and (buffered or pieces == 1 or ex.intake.ended):  # (decided at the end)
            seen = {k: v for k, v in (ex.request.body or {}).items() if k not in ("messages", "tools")}
            assert seen == {k: v for k, v in want.items() if k not in ("messages", "tools")}
    ex.close()


@pytest.mark.parametrize(("carrier", "early"), [
    ({}, False),  # no session header: `user` after the prompt names it, so the decision waits for the end
    ({"x-session-id": "agent-7"}, True),  # the header names it up front: decided before the body ends
])
def test_a_session_named_after_the_prompt_is_seen_by_the_decision(carrier: dict[str, str], early: bool) -> None:
    """Agents that carry their session in the body (`user`, `prompt_cache_key`, `metadata.session_id`) send it after
    the messages. A decision on the head before the body ended would route the turn with no session (no stay, no
    fan-out rule): without a session header it is made at the end, on the head, with the members after the prompt."""
    from epp.request.sessions import SessionIdentity
    from epp.request.settings import SessionSettings

    director = replace(real_director(), sessions=SessionIdentity(SessionSettings()))
    raw = chat(model_first=True)[:-1] + b',"user":"agent-7"}'
    ex = director.exchange()
    m = SyncMachine(ex, request_body_mode=BodyMode.FULL_DUPLEX_STREAMED)
    m.feed(headers_msg(**carrier))
    first = m.feed(body_msg(raw[:100_000], False))
    assert (destination(first) is not None) is early and (ex.early is not None) is early
    last = m.feed(body_msg(raw[100_000:], True))
    assert ex.early == "m" and destination(first + last) is not None and _echoed(first + last) == raw
    assert ex.request is not None and ex.request.session is not None
    assert ex.request.session.source == ("header:x-session-id" if early else "user")
    ex.close()


def test_a_session_field_before_the_prompt_lets_the_decision_come_early() -> None:
    from epp.request.sessions import SessionIdentity
    from epp.request.settings import SessionSettings

    director = replace(real_director(), sessions=SessionIdentity(SessionSettings()))
    text = ("what the agent saw so far, turn after turn; " * 6000)[:200_000]
    raw = orjson.dumps({"model": "m", "user": "agent-7", "messages": [{"role": "user", "content": text}]})
    ex = director.exchange()
    m = SyncMachine(ex, request_body_mode=BodyMode.FULL_DUPLEX_STREAMED)
    m.feed(headers_msg())
    assert destination(m.feed(body_msg(raw[:100_000], False))) is not None and ex.early == "m"
    assert ex.request is not None and ex.request.session is not None and ex.request.session.source == "user"
    ex.close()


def test_a_body_waiting_unread_for_its_end_still_counts_against_the_limit() -> None:
    """The rest of a body kept unread after its head (model after the prompt) is held against max_body_bytes: past
    it the client gets a 413 and nothing stays in flight."""
    from tests.protocol.test_protocol_properties import inflight

    raw = sdk_chat(chars=200_000)
    director = real_director()
    ex = director.exchange()
    m = SyncMachine(ex, request_body_mode=BodyMode.FULL_DUPLEX_STREAMED, max_body_bytes=100_000)
    m.feed(headers_msg())
    assert destination(m.feed(body_msg(raw[:40_000], False))) is None  # no decision yet: the model follows
    assert ex.intake is not None and ex.intake.late
    m.feed(body_msg(raw[40_000:80_000], False))
    last = m.feed(body_msg(raw[80_000:], True))
    assert last[0].immediate_response.status.code == 413
    ex.close()
    assert inflight(director) == 0
