"""The streaming body reader against `parse_body`: the same model, prompt and body for every body, in any chunks.

Bodies are random JSON objects written with random whitespace, escapes (`\\uXXXX`, surrogate pairs, `\\/`, the short
escapes), non-ASCII text and key orders, cut at random chunk boundaries; some are damaged. The streaming reader must
give exactly what `parse_body` gives, or raise the same SchedulingError (a 400 with the same message).
"""

from __future__ import annotations

import json
import random

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from epp.request import jsonvalues
from epp.request.parsing import parse_body
from epp.request.streaming import StreamingBody
from scheduling.types import ApiKind, SchedulingError

PROPERTY = settings(max_examples=300, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
KINDS = [ApiKind.CHAT, ApiKind.COMPLETIONS, ApiKind.EMBEDDINGS, ApiKind.RESPONSES, ApiKind.CONVERSATIONS,
         ApiKind.MESSAGES, ApiKind.OTHER]
WS = ["", "", "", " ", "\n", "\t", "\r\n  "]
SHORT = {'"': '\\"', "\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t", "\b": "\\b", "\f": "\\f"}

text = st.text(alphabet=st.one_of(st.characters(codec="utf-8", exclude_categories=("Cs",)),
                                  st.sampled_from(list('"\\/\n\t\x01{}[],:é😀'))), max_size=12)
scalars = st.one_of(st.none(), st.booleans(), st.integers(-10**12, 10**12), text,
                    st.floats(allow_nan=False, allow_infinity=False))
values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                       st.dictionaries(text, inner, max_size=4)), max_leaves=12)
message = st.fixed_dictionaries({"role": st.sampled_from(["system", "user", "assistant", "tool"]),
                                 "content": st.one_of(text, values)},
                                optional={"name": text, "tool_calls": values})


def write_string(draw: st.DrawFn, s: str) -> str:
    out = []
    # Each character's spelling is drawn; a long string's from one drawn seed (a draw per character would run past
    # Hypothesis's buffer and turn the example into a slow, discarded overrun).
    hows = random.Random(draw(st.integers(0, 2**32))) if len(s) > 64 else None
    for ch in s:
        how = draw(st.integers(0, 7)) if hows is None else hows.randrange(8)
        if ch in SHORT and how:
            out.append(SHORT[ch])
        elif ord(ch) < 0x20 or ch in SHORT or how == 0:  # a \u escape (a surrogate pair past the BMP)
            o = ord(ch)
            if o > 0xFFFF:
                o -= 0x10000
                hi, lo = 0xD800 + (o >> 10), 0xDC00 + (o & 0x3FF)
                out.append(f"\\u{hi:04x}\\u{lo:04X}")
            else:
                out.append(f"\\u{o:04x}" if how % 2 else f"\\u{o:04X}")
        elif ch == "/" and how == 1:
            out.append("\\/")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def write(draw: st.DrawFn, v: object) -> str:
    """JSON text of v with random whitespace and escapes (a different, valid spelling of the same value)."""
    def ws() -> str:
        return draw(st.sampled_from(WS))

    if isinstance(v, dict):
        items = [ws() + write_string(draw, k) + ws() + ":" + ws() + write(draw, x) + ws() for k, x in v.items()]
        return "{" + (",".join(items) if items else ws()) + "}"
    if isinstance(v, list):
        items = [ws() + write(draw, x) + ws() for x in v]
        return "[" + (",".join(items) if items else ws()) + "]"
    if isinstance(v, str):
        return write_string(draw, v)
    if isinstance(v, float) and draw(st.booleans()):
        return repr(v).replace("e", "E").replace("inf", "1e999")
    return json.dumps(v)


@st.composite
def bodies(draw: st.DrawFn) -> tuple[ApiKind, bytes]:
    kind = draw(st.sampled_from(KINDS))
    members: dict[str, object] = {}
    fields = {
        ApiKind.CHAT: {"messages": st.lists(message, max_size=4), "tools": st.one_of(st.lists(values, max_size=2),
                                                                                      values)},
        ApiKind.COMPLETIONS: {"prompt": st.one_of(text, st.lists(text, max_size=3), st.lists(st.integers(0, 99)))},
        ApiKind.EMBEDDINGS: {"input": st.one_of(text, st.lists(text, max_size=3))},
        ApiKind.RESPONSES: {"instructions": st.one_of(text, values), "tools": values, "input": st.one_of(text, values)},
        ApiKind.CONVERSATIONS: {"items": st.lists(values, max_size=3)},
        ApiKind.MESSAGES: {"system": st.one_of(text, values), "tools": values, "messages": st.lists(message,
                                                                                                   max_size=3)},
        ApiKind.OTHER: {"input": values},
    }[kind]
    for name, strategy in fields.items():
        if draw(st.integers(0, 5)):
            members[name] = draw(strategy)
    if draw(st.integers(0, 7)):
        members["model"] = draw(st.one_of(st.sampled_from(["llama", "m/é"]), text, values))
    for name in draw(st.lists(st.sampled_from(["max_tokens", "stream", "cache_salt", "temperature", "x"]),
                              max_size=3)):
        members[name] = draw(values)
    if draw(st.integers(0, 3)) == 0:  # a long string somewhere in the prompt
        long = draw(text) * draw(st.integers(300, 3000)) + "end"
        target = "messages" if kind in (ApiKind.CHAT, ApiKind.MESSAGES) else "prompt"
        if target == "messages":
            members.setdefault("messages", []).append({"role": "user", "content": long})  # type: ignore[union-attr]
        else:
            members[target] = long
    order = draw(st.permutations(list(members)))
    pieces = [draw(st.sampled_from(WS)) + write_string(draw, k) + draw(st.sampled_from(WS)) + ":"
              + draw(st.sampled_from(WS)) + write(draw, members[k]) + draw(st.sampled_from(WS)) for k in order]
    if draw(st.integers(0, 9)) == 0 and pieces:  # a duplicate member: the last one wins
        pieces.append(pieces[0])
    raw = (draw(st.sampled_from(WS)) + "{" + ",".join(pieces) + "}" + draw(st.sampled_from(WS))).encode()
    damage = draw(st.integers(0, 6))
    if damage == 0 and raw:  # cut a byte out
        k = draw(st.integers(0, len(raw) - 1))
        raw = raw[:k] + raw[k + 1:]
    elif damage == 1:  # insert a byte
        k = draw(st.integers(0, len(raw)))
        raw = raw[:k] + draw(st.sampled_from([b",", b"}", b"]", b'"', b"\\", b"\x01", b"\xff", b"x", b"{"])) + raw[k:]
    return kind, raw


def chunks(draw: st.DrawFn, raw: bytes) -> list[bytes]:
    cuts = sorted(set(draw(st.lists(st.integers(0, len(raw)), max_size=12))))
    return [raw[a:b] for a, b in zip([0, *cuts], [*cuts, len(raw)], strict=True)]


def expected(kind: ApiKind, raw: bytes) -> object:
    try:
        p = parse_body(kind, raw)
    except SchedulingError as e:
        return ("error", e.code, str(e))
    return (p.kind, p.body, p.model, p.prompt)


def streamed(kind: ApiKind, pieces: list[bytes], views: bool = False) -> object:
    sb = StreamingBody(kind)
    heads = []
    for p in pieces:
        sb.feed(memoryview(bytearray(p)) if views else p)
        sb.start()
        heads.append(sb.head_text() if sb.head_chars else "")
    try:
        p = sb.finish()
    except SchedulingError as e:
        return ("error", e.code, str(e))
    if sb.stream.members.head_ok:
        for h in heads:  # whatever was published as the prompt's head is a prefix of the prompt
            assert p.prompt.startswith(h), (h[:80], p.prompt[:80])
    else:  # the head's member came again (the last one wins, as in a dict): the head is withdrawn
        assert sb.head_chars == 0
    return (p.kind, p.body, p.model, p.prompt)


@PROPERTY
@given(st.data())
def test_streaming_reader_matches_parse_body(data):
    kind, raw = data.draw(bodies())
    pieces = chunks(data.draw, raw)
    assert streamed(kind, pieces) == expected(kind, raw)


@settings(PROPERTY, max_examples=100)
@given(st.data())
def test_chunks_read_from_the_wire_as_views_read_as_bytes(data):
    """The machine hands on a chunk read from the wire as a view of its message (not a copy): the same result."""
    kind, raw = data.draw(bodies())
    pieces = chunks(data.draw, raw) if data.draw(st.booleans()) else [raw]
    assert streamed(kind, pieces, views=True) == expected(kind, raw)


def test_a_rewrite_before_the_end_cuts_a_view_as_bytes():
    raw = b'{"model":"a","messages":[{"role":"user","content":"hi"}]}'
    sb = StreamingBody(ApiKind.CHAT)
    sb.feed(memoryview(bytearray(raw[:30])))
    sb.start()
    assert sb.rewritten_prefix("bb", 30) == raw[:30].replace(b'"a"', b'"bb"', 1)


@settings(PROPERTY, max_examples=150)
@given(st.data())
def test_streaming_reader_matches_parse_body_with_small_thresholds(data):
    """Tiny thresholds: every value past a few bytes is entered and every string read in pieces."""
    kind, raw = data.draw(bodies())
    pieces = chunks(data.draw, raw)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(jsonvalues, "DEEP_BYTES", 8)
        mp.setattr(jsonvalues, "LONG_STRING", 4)
        got = streamed(kind, pieces)
    assert got == expected(kind, raw)


@pytest.mark.parametrize("size", [200, 16_384, 1 << 20])
def test_one_long_message_in_16k_chunks_needs_no_whole_parse(size):
    """The benchmark's body shape: a long user message; read piecewise, the prompt head grows as it arrives."""
    content = ("The quick brown fox said \"hi\"\\n and left. é " * (size // 40 + 1))[:size]
    raw = orjson.dumps({"model": "llama", "messages": [{"role": "system", "content": content},
                                                       {"role": "user", "content": "hi"}], "max_tokens": 5})
    sb = StreamingBody(ApiKind.CHAT)
    grew = 0
    for i in range(0, len(raw), 16_384):
        before = sb.head_chars
        sb.feed(raw[i : i + 16_384])
        grew += sb.head_chars > before
        assert sb.stream.error is None
    sb.start()
    assert sb.model == "llama"
    assert sb.finish() == parse_body(ApiKind.CHAT, raw)
    if size > 100_000:
        assert grew >= len(raw) // 16_384 - 2  # the head grew with (nearly) every chunk
        assert len(sb.stream._buf) < 64  # nothing left over to parse at the end


def test_invalid_json_is_a_400_with_orjson_message():
    sb = StreamingBody(ApiKind.CHAT)
    for piece in (b'{"model": "m", "messages": [{"role": "user", ', b'"content": "x"},]}'):
        sb.feed(piece)
    with pytest.raises(SchedulingError) as e:
        sb.finish()
    assert e.value.code.http_status == 400
    assert "BadRequest - request body is not valid JSON: trailing comma" in str(e.value)


def test_a_repeated_head_member_withdraws_the_head():
    """A body whose prompt member comes twice: the last one is the prompt (as orjson's dict), so the head published
    from the first is withdrawn (head_chars 0) once the second begins, and the prompt is the second's."""
    raw = b'{"input":["first question"],"model":"m","input":["second"]}'
    sb = StreamingBody(ApiKind.EMBEDDINGS)
    sb.feed(raw[:28])
    sb.start()
    assert sb.head_chars > 0 and "first" in sb.head_text()
    sb.feed(raw[28:])
    sb.start()
    assert sb.head_chars == 0
    assert sb.finish().prompt == '["second"]'


@pytest.mark.parametrize("cut", [4096, 10_000, 16_384, 32_768])
def test_a_long_string_keeps_the_whitespace_a_chunk_starts_with(cut):
    """A long string read in pieces keeps a space that falls at the start of a chunk (the reader once skipped it as
    if it were between tokens, so the prompt lost a character at some chunk boundaries)."""
    text = ("lorem ipsum dolor sit amet " * 4000)[:100_000]
    raw = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": text}]})
    sb = StreamingBody(ApiKind.CHAT)
    for i in range(0, len(raw), cut):
        sb.feed(raw[i : i + cut])
    assert sb.finish() == parse_body(ApiKind.CHAT, raw)
