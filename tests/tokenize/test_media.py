"""Media in requests (issue 30, part 4): each item's identity per API kind, the marker the precise path tokenizes,
the masked inline payloads the approximate path hashes, and the streaming reader with large data URLs."""

from __future__ import annotations

import base64
import random

import orjson
import pytest

from epp.request.parsing import SHORT_PROMPT, parse_body
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


def test_mask_replaces_long_inline_payloads_only() -> None:
    kept = orjson.dumps({"url": "data:image/png;base64,QUJD", "t": "a long sentence, " * 40,
                         "h": "https://x/" + "a" * 400, "n": 12}).decode()
    assert mask_media(kept) == kept  # short payloads, text, URLs: unchanged
    assert mask_media("no quotes at all " * 100) == "no quotes at all " * 100
    run = "x" * INLINE_MIN  # long inline data: masked (equal data, equal text); short, escaped or elsewhere: kept
    assert mask_media(f'{{"data":"{run}"}}') == f'{{"data":"{mask_media_id(run)}"}}'
    assert mask_media(f'{{"file_data":"{run}"}}') == f'{{"file_data":"{mask_media_id(run)}"}}'
    for kept in (f'{{"data":"{run[1:]}"}}', f'{{"text":"{run}"}}', f'{{"data":"{run}\\n"}}'):
        assert mask_media(kept) == kept
    p1, p2 = b64(1, 3000), b64(2, 3000)
    t1 = orjson.dumps([{"url": f"data:image/png;base64,{p1}"}, {"data": p2}]).decode()
    m1 = mask_media(t1)
    assert p1 not in m1 and p2 not in m1 and len(m1) < 2 * MEDIA_TOKENS * 4 + 100
    assert f'"data:image/png;base64,{mask_media_id(p1)}"' in m1
    assert f'"data":"{mask_media_id(p2)}"' in m1
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
    """parse_body skips the media walk for a short prompt without "data" (mask_media would leave it as it is): the
    prompt is still the walk's answer, masked when the body holds media and as it is otherwise."""
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
    assert len(orjson.dumps(short["messages"])) < SHORT_PROMPT  # the short path, and its payload is masked:
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
