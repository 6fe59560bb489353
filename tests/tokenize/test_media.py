"""Media in requests (issue 30, part 4): each item's identity per API kind, the marker the precise path tokenizes,
the masked inline payloads the approximate path hashes, and the streaming reader with large data URLs."""

from __future__ import annotations

import base64
import json
import random

import orjson
import pytest

from epp.request.parsing import parse_body
from epp.request.streaming import StreamingBody
from epp.tokenize import holds_media, mask_media, media_marker, media_ref, tokenize_input
from epp.tokenize.media import INLINE_MIN, MEDIA_TOKENS, identity
from scheduling.prefix.hashing import block_hashes
from scheduling.types import ApiKind


def b64(seed: int, size: int) -> str:
    return base64.b64encode(random.Random(seed).randbytes(size)).decode()


def data_url(seed: int, size: int = 30_000, mime: str = "image/png") -> str:
    return f"data:{mime};base64,{b64(seed, size)}"


PARTS = [  # (part, kind, reference)
    ({"type": "image_url", "image_url": {"url": "https://x/cat.png"}}, "image_url", "https://x/cat.png"),
    ({"type": "image_url", "image_url": "https://x/cat.png"}, "image_url", "https://x/cat.png"),
    ({"type": "image_url", "image_url": {"url": "data:image/png;base64,QUJD"}}, "image_url",
     "data:image/png;base64,QUJD"),
    ({"type": "input_audio", "input_audio": {"data": "UklGRg==", "format": "wav"}}, "input_audio", "UklGRg=="),
    ({"type": "video_url", "video_url": {"url": "https://x/v.mp4"}}, "video_url", "https://x/v.mp4"),
    ({"type": "file", "file": {"file_data": "JVBERi0x", "filename": "a.pdf"}}, "file", "JVBERi0x"),
    ({"type": "file", "file": {"file_id": "file-1"}}, "file", "file-1"),
    ({"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "QUJD"}}, "image", "QUJD"),
    ({"type": "image", "source": {"type": "url", "url": "https://x/cat.png"}}, "image", "https://x/cat.png"),
    ({"type": "document", "source": {"type": "base64", "media_type": "application/pdf", "data": "JVBE"}},
     "document", "JVBE"),
    ({"type": "input_image", "image_url": "https://x/cat.png"}, "input_image", "https://x/cat.png"),
    ({"type": "input_image", "file_id": "file-2"}, "input_image", "file-2"),
    ({"type": "input_file", "file_data": "JVBE"}, "input_file", "JVBE"),
    ({"type": "image_url", "image_url": {"url": "https://x/a.png"}, "uuid": "img-7"}, "image_url", "uuid:img-7"),
]


@pytest.mark.parametrize(("part", "kind", "ref"), PARTS)
def test_each_media_part_has_its_reference(part: dict, kind: str, ref: str) -> None:
    assert media_ref(part) == (kind, ref)
    assert media_marker(part) == f"<|media:{identity(kind, ref)}|>"


@pytest.mark.parametrize("part", [{"type": "text", "text": "hi"}, {"type": "input_text", "text": "x"}, "plain",
                                  {"type": "tool_result"}, {"text": "no type"}, 3, None])
def test_text_and_other_parts_are_not_media(part: object) -> None:
    assert media_ref(part) is None and media_marker(part) is None


def test_identity_separates_kinds_and_references() -> None:
    ids = {identity(k, r) for _, k, r in PARTS}
    assert len(ids) == len({(k, r) for _, k, r in PARTS})
    assert identity("image_url", "a") != identity("image_url", "b") != identity("image", "a")


def chat(image: dict, question: str = "What is in this picture?") -> dict:
    return {"model": "m", "messages": [
        {"role": "system", "content": "You are a careful visual assistant. " * 4},
        {"role": "user", "content": [{"type": "text", "text": question}, image]}]}


def test_tokenize_input_puts_a_marker_where_each_item_stands() -> None:
    cat = {"type": "image_url", "image_url": {"url": "https://x/cat.png"}}
    dog = {"type": "image_url", "image_url": {"url": "https://x/dog.png"}}
    a, b, a2 = (tokenize_input(ApiKind.CHAT, chat(img), "m") for img in (cat, dog, cat))
    assert a.messages is not None and b.messages is not None and a2.messages is not None
    assert a.messages[1]["content"] == f"What is in this picture?\n{media_marker(cat)}"
    assert a.messages == a2.messages and a.messages != b.messages
    assert a.messages[0] == b.messages[0]  # what comes before the media is shared
    # Anthropic blocks (system too) and Responses input items
    anth = tokenize_input(ApiKind.MESSAGES, {"system": "S", "messages": [{"role": "user", "content": [
        PARTS[7][0], {"type": "text", "text": "q"}]}]}, "m")
    assert anth.messages is not None and anth.messages[1]["content"] == f"{media_marker(PARTS[7][0])}\nq"
    resp = tokenize_input(ApiKind.RESPONSES, {"input": [{"role": "user", "content": [
        {"type": "input_text", "text": "q"}, PARTS[10][0]]}]}, "m")
    assert resp.messages is not None and resp.messages[0]["content"] == f"q\n{media_marker(PARTS[10][0])}"


def test_mask_replaces_long_inline_payloads_of_media_parts_only() -> None:
    kept = orjson.dumps({"url": "data:image/png;base64,QUJD", "t": "a long sentence, " * 40,
                         "h": "https://x/" + "a" * 400, "n": 12}).decode()
    assert mask_media(kept) == kept  # short payloads, text, URLs: unchanged
    assert mask_media("no quotes at all " * 100) == "no quotes at all " * 100
    run = "x" * INLINE_MIN  # long inline data of a media part: masked (equal data, equal text)

    def dumps(v: object) -> str:
        return orjson.dumps(v).decode()

    for part in ({"type": "input_audio", "input_audio": {"data": run, "format": "wav"}},
                 {"type": "file", "file": {"file_data": run}}, {"type": "input_file", "file_data": run},
                 {"input_file_first": 1, "file_data": run, "type": "input_file"},  # "type" after the payload
                 {"type": "image", "source": {"type": "base64", "data": run}}):
        assert mask_media(dumps([part])) == dumps([part]).replace(run, mask_media_id(run)), part
    # short, escaped, or outside a media part (a text part, a tool's arguments, two levels down): kept
    for part in ({"type": "input_audio", "input_audio": {"data": run[1:]}},
                 {"type": "input_audio", "input_audio": {"data": run + "\n"}}, {"type": "text", "data": run},
                 {"data": run}, {"type": "function", "function": {"arguments": {"data": run}}},
                 {"type": "file", "file": {"inner": {"file_data": run}}}, {"type": "file", "file": [{"data": run}]}):
        assert mask_media(dumps([part])) == dumps([part]), part
    p1, p2 = b64(1, 3000), b64(2, 3000)
    t1 = dumps([{"type": "image_url", "image_url": {"url": f"data:image/png;base64,{p1}"}},
                {"type": "input_audio", "input_audio": {"data": p2}}, {"type": "text", "text": f"data:x,{p1}"}])
    m1 = mask_media(t1)
    assert p2 not in m1 and m1.count(p1) == 1 and len(m1) < 2 * MEDIA_TOKENS * 4 + 6000
    assert f'"data:image/png;base64,{mask_media_id(p1)}"' in m1
    assert f'"data":"{mask_media_id(p2)}"' in m1
    assert f'"text":"data:x,{p1}"' in m1  # a text quoting a data URL is text
    assert mask_media(t1) == m1 and mask_media(t1.replace(p2, b64(3, 3000))) != m1


def mask_media_id(payload: str) -> str:
    return f"#media:{identity('inline', payload)}".ljust(MEDIA_TOKENS * 4, "~")


def test_partial_mask_is_a_prefix_of_the_whole() -> None:
    text = orjson.dumps(chat({"type": "image_url", "image_url": {"url": data_url(5, 5000)}})["messages"]).decode()
    whole = mask_media(text)
    for cut in list(range(0, len(text), 97)) + [len(text)]:
        assert whole.startswith(mask_media(text[:cut], partial=True)), cut


def test_approximate_blocks_share_the_same_image_and_split_different_ones() -> None:
    def blocks(img: str, q: str = "What is in this picture?") -> list[int]:
        raw = orjson.dumps(chat({"type": "image_url", "image_url": {"url": img}}, q))
        return block_hashes(parse_body(ApiKind.CHAT, raw).prompt, "m")

    a, a2, b = blocks(data_url(1)), blocks(data_url(1)), blocks(data_url(2))
    assert a == a2 and len(a) < 60  # 40 KB of base64 does not fill the blocks: the image weighs 256 tokens
    common = next(i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y)
    assert 0 < common and a[:common] == b[:common]  # the system prompt before the image is shared
    # the same image behind a different question shares up to the question, as the text does without media
    c = blocks(data_url(1), "Describe the colours.")
    assert c[:2] == a[:2] and c != a
    # URLs: different URLs split, equal ones join
    assert blocks("https://x/cat.png") == blocks("https://x/cat.png") != blocks("https://x/dog.png")


@pytest.mark.parametrize(("part", "kind", "ref"), PARTS)
def test_a_body_holds_media_wherever_a_part_stands(part: dict, kind: str, ref: str) -> None:
    assert holds_media({"model": "m", "messages": [{"role": "user", "content": ["hi", part]}]})
    assert holds_media({"model": "m", "input": [{"type": "message", "content": [{"type": "input_text"}, part]}]})
    assert holds_media({"model": "m", "messages": [{"role": "user", "content": [
        {"type": "tool_result", "content": [part]}]}]})  # nested, as an Anthropic tool result carries images


def test_a_text_only_body_is_not_searched_for_payloads() -> None:
    """A text that quotes a data URL is text: only a body with a media part is masked (holds_media), so a long
    text-only prompt is never scanned for payloads."""
    quoted = f'he said "{data_url(3, 3_000)}" and left'
    body = {"model": "m", "messages": [{"role": "user", "content": [{"type": "text", "text": quoted}]},
                                       {"role": "user", "content": quoted}]}
    assert not holds_media(body)
    parsed = parse_body(ApiKind.CHAT, orjson.dumps(body))
    assert b64(3, 3_000) in parsed.prompt  # left as it is
    with_image = {**body, "messages": [*body["messages"], chat({"type": "image_url", "image_url": {
        "url": data_url(4)}}, "and this?")["messages"][-1]]}
    assert holds_media(with_image)
    assert b64(4, 30_000) not in parse_body(ApiKind.CHAT, orjson.dumps(with_image)).prompt  # masked


def test_the_prompt_is_masked_exactly_when_the_body_holds_media_short_or_long() -> None:
    """The prompt is masked when the body holds a media part (a short payload too) and left as it is otherwise (a
    data URL quoted in a text-only body)."""
    image = {"type": "image_url", "image_url": {"url": data_url(5, 240)}}  # a short payload, still masked
    linked = {"type": "image_url", "image_url": {"url": "https://x/cat.png"}}  # media, but nothing to mask
    quoted = f'see "{data_url(6, 240)}"'
    short = {"model": "m", "messages": [{"role": "user", "content": [{"type": "text", "text": "what?"}, image]}]}
    bodies = [short, chat(linked, "and this?"), chat(linked, "data " * 400),
              chat(image, "x" * 2_000), {"model": "m", "messages": [{"role": "user", "content": quoted}]},
              {"model": "m", "messages": [{"role": "user", "content": "How far is the moon?"}]}]
    for body in bodies:
        whole = parse_body(ApiKind.CHAT, orjson.dumps(body)).prompt
        text = orjson.dumps(body["messages"]).decode()
        assert whole == (mask_media(text) if holds_media(body) else text)
    assert b64(5, 240) not in parse_body(ApiKind.CHAT, orjson.dumps(bodies[0])).prompt
    assert b64(6, 240) in parse_body(ApiKind.CHAT, orjson.dumps(bodies[4])).prompt


@pytest.mark.parametrize("chunk", [1000, 16_384])
def test_streaming_reader_with_a_large_data_url(chunk: int) -> None:
    """A 1.4 MB data URL read piecewise: the same parse as whole, the head a prefix of the masked prompt."""
    body = chat({"type": "image_url", "image_url": {"url": data_url(9, 1 << 20)}})
    raw = orjson.dumps({**body, "max_tokens": 5})
    sb = StreamingBody(ApiKind.CHAT)
    heads = []
    for i in range(0, len(raw), chunk):
        sb.feed(raw[i : i + chunk])
        sb.start()
        heads.append(sb.head_text())
        assert sb.stream.error is None
    parsed = sb.finish()
    assert parsed == parse_body(ApiKind.CHAT, raw)
    assert len(parsed.prompt) < 600 + MEDIA_TOKENS * 4 and "#media:" in parsed.prompt
    assert all(parsed.prompt.startswith(h) for h in heads)
    assert max(len(h) for h in heads) == len(parsed.prompt) - 1 or heads[-1] == parsed.prompt[: len(heads[-1])]


def _text_quoting(seed: int) -> dict:
    quoted = data_url(seed, 3_000)
    return {"model": "m", "messages": [{"role": "system", "content": f"he said {quoted}"},
                                       {"role": "user", "content": [{"type": "text", "text": quoted}]}]}


HEAD_BODIES = {
    "text only, quoting data URLs": _text_quoting(11),
    "text quoting a data URL, then an image": {**_text_quoting(12), "messages": [
        *_text_quoting(12)["messages"], chat({"type": "image_url", "image_url": {"url": data_url(13, 4_000)}})[
            "messages"][-1]]},
    "the part's type after its payload": {"model": "m", "messages": [{"role": "user", "content": [
        {"input_audio": {"data": b64(14, 4_000), "format": "wav"}, "type": "input_audio"},
        {"type": "text", "text": "what is said?"}]}]},
    "an image in a tool result": {"model": "m", "messages": [{"role": "user", "content": [
        {"type": "tool_result", "content": [{"type": "image_url", "image_url": {"url": data_url(15, 4_000)}}]}]}]},
}


FORMS = {  # how a client may write the same body
    "compact": lambda b: orjson.dumps(b),
    "indented, escaped": lambda b: json.dumps(b, indent=2).replace("/", "\\/").replace("_url", "\\u005furl").encode(),
}


@pytest.mark.parametrize("name", list(HEAD_BODIES))
@pytest.mark.parametrize("chunk", [97, 1000, 4096])
@pytest.mark.parametrize("form", list(FORMS))
def test_the_early_head_and_the_whole_prompt_mask_alike(name: str, chunk: int, form: str) -> None:
    """One structural rule for the streaming head and the whole prompt: a payload is masked where it sits in a media
    part, never in text. Every head an early decision could read is a prefix of the prompt the whole body gives,
    with the same media flag once the part has arrived, and the head of the whole messages is the whole prompt."""
    from epp.request.resolve import read_body

    body = HEAD_BODIES[name]
    raw = FORMS[form]({**body, "max_tokens": 5})
    whole = parse_body(ApiKind.CHAT, raw)
    sb = StreamingBody(ApiKind.CHAT)
    heads = []
    for i in range(0, len(raw), chunk):
        sb.feed(raw[i : i + chunk])
        sb.start()
        _, _, prompt, media = read_body(ApiKind.CHAT, {}, sb, "m")  # what an early decision reads
        assert whole.prompt.startswith(prompt), (name, i)
        assert not media or whole.media
        heads.append((prompt, media))
    assert heads[-1] == (whole.prompt, whole.media)  # all the messages in: the head is the prompt
    assert sb.finish() == whole
    if name.startswith("text only"):
        assert not whole.media and b64(11, 3_000) in whole.prompt  # text quoting a data URL: never masked
    else:
        assert whole.media and "#media:" in whole.prompt


def test_an_early_decision_waits_for_a_masked_head_covering_what_is_hashed() -> None:
    """The default scheduler hashes 16 KB of prompt. A 40 KB image in the first message makes the raw head long
    but its masked head short: the decision waits until the text after it brings the masked head to 16 KB, then is
    made early on a head that is a prefix of the whole prompt, marked as holding media."""
    from epp.protocol import BodyMode
    from tests.support.extproc import SyncMachine, body_msg, headers_msg, real_director

    director = real_director()
    image = {"type": "image_url", "image_url": {"url": data_url(21, 30_000)}}
    turns = [{"role": "assistant" if k % 2 else "user", "content": f"turn {k} " * 100} for k in range(60)]
    body = {"model": "m", "messages": [{"role": "user", "content": [image, {"type": "text", "text": "look"}]},
                                       *turns], "max_tokens": 5}
    raw = orjson.dumps(body)
    whole = parse_body(ApiKind.CHAT, raw)
    ex = director.exchange()
    m = SyncMachine(ex, request_body_mode=BodyMode.FULL_DUPLEX_STREAMED)
    m.feed(headers_msg())
    chunk, decided_at = 4096, None
    for i in range(0, len(raw), chunk):
        m.feed(body_msg(raw[i : i + chunk], i + chunk >= len(raw)))
        if decided_at is None and ex.early is not None:
            decided_at = i + chunk
    assert decided_at is not None and decided_at < len(raw)  # early, before the body ended ...
    image_chars = len(image["image_url"]["url"])
    assert decided_at > image_chars + 16_384 - 1_024  # ... once the text after the image filled a masked head
    req = ex.ctx.request if ex.ctx is not None else None
    assert req is not None and req.media and whole.prompt.startswith(req.prompt) and len(req.prompt) >= 16_384
    ex.close()


def test_a_short_body_whose_type_key_is_escaped_still_holds_media() -> None:
    """parse_body searches a short body for a spelt-out "type" key before walking it for media parts: a key written
    with a \\u escape is still found by the walk (the same parse as the streaming reader's)."""
    image = {"type": "image_url", "image_url": {"url": data_url(7, 240)}}
    raw = orjson.dumps(chat(image, "what is it?"))
    escaped = raw.replace(b'"type"', b'"\\u0074ype"')
    assert len(escaped) < 4096 and b'"type"' not in escaped
    for body in (raw, escaped):
        parsed = parse_body(ApiKind.CHAT, body)
        assert parsed.media and b64(7, 240) not in parsed.prompt
    text_only = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]})
    assert not parse_body(ApiKind.CHAT, text_only).media
