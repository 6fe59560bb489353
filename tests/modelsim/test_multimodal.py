"""modelsim's media, modelled on vLLM: placeholder tokens per item, the item's mm hash in the keys of the blocks
its placeholders overlap (so the same tokens with another image never hit), and those hashes published as the
blocks' ``extra_keys`` in BlockStored."""

from __future__ import annotations

import msgpack

from modelsim import tokenizer as tk
from modelsim.config import EngineConfig
from modelsim.engine import Engine, SimRequest
from modelsim.kvcache import extra_keys
from modelsim.kvevents import EventEncoder, encode_batch

SYSTEM = "You are a careful visual assistant; answer in one short sentence. " * 3


def chat(url: str, question: str = "What is in this picture?") -> dict:
    return {"model": "m", "messages": [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": [{"type": "text", "text": question},
                                     {"type": "image_url", "image_url": {"url": url}}]}]}


def test_media_become_placeholders_with_an_mm_hash() -> None:
    tokens, mm = tk.request_inputs(tk.API_CHAT, chat("https://x/cat.png"))
    assert len(mm) == 1
    offset, length, h = mm[0]
    assert length == tk.MM_TOKENS and tokens[offset : offset + length] == [tk.PLACEHOLDER] * length
    assert tk.PLACEHOLDER not in tokens[:offset] and tk.PLACEHOLDER not in tokens[offset + length :]
    other, mm2 = tk.request_inputs(tk.API_CHAT, chat("https://x/dog.png"))
    assert other == tokens and mm2[0][2] != h  # equal tokens, another hash: only the hash tells them apart
    assert tk.request_inputs(tk.API_CHAT, chat("https://x/cat.png"))[1] == mm
    text_only = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    assert tk.request_inputs(tk.API_CHAT, text_only) == (tk.request_tokens(tk.API_CHAT, text_only), ())
    anth = {"model": "m", "messages": [{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "QUJD"}}]}]}
    assert len(tk.request_inputs(tk.API_MESSAGES, anth)[1]) == 1
    resp = {"model": "m", "input": [{"role": "user", "content": [{"type": "input_image", "image_url": "u"}]}]}
    assert len(tk.request_inputs(tk.API_RESPONSES, resp)[1]) == 1


def test_extra_keys_cover_the_blocks_the_placeholders_overlap() -> None:
    assert extra_keys(4, 16, [(20, 20, "a")]) == [None, ("a",), ("a",), None]
    assert extra_keys(3, 16, [(0, 16, "a"), (16, 1, "b")]) == [("a",), ("b",), None]
    assert extra_keys(2, 16, [(10, 4, "a"), (14, 4, "b")]) == [("a", "b"), ("b",), None][:2]


def run(e: Engine, rid: str, body: dict, t: float) -> SimRequest:
    tokens, mm = tk.request_inputs(tk.API_CHAT, body)
    req = SimRequest(rid, tokens, 1, mm=mm)
    e.submit(req, t)
    while (nt := e.next_event_time()) is not None:
        e.advance(nt)
    return req


def test_another_image_hits_only_the_blocks_before_it() -> None:
    e = Engine(EngineConfig(kv_cache_size=4096))
    tokens, mm = tk.request_inputs(tk.API_CHAT, chat("https://x/cat.png"))
    run(e, "a", chat("https://x/cat.png"), 0.0)
    before = mm[0][0] // 16 * 16  # full blocks before the placeholders
    _, mm_dog = tk.request_inputs(tk.API_CHAT, chat("https://x/dog.png"))
    assert e.probe(tokens, None, mm_dog) == before
    assert e.probe(tokens, None, mm) == (len(tokens) - 1) // 16 * 16  # the same image: all but the last token
    assert e.probe(tokens) == before  # without the hash, the placeholders are other blocks too


def test_block_stored_carries_the_mm_hashes_as_extra_keys() -> None:
    e = Engine(EngineConfig(kv_cache_size=4096))
    tokens, mm = tk.request_inputs(tk.API_CHAT, chat("https://x/cat.png"))
    run(e, "a", chat("https://x/cat.png"), 0.0)
    raw = e.kv.drain_events()
    for encoding in ("array", "map"):
        (stored,) = msgpack.unpackb(encode_batch(EventEncoder(16, encoding).encode(raw)), raw=False)[1]
        extra = stored[8] if encoding == "array" else stored["extra_keys"]
        n = len(extra)
        assert n == (len(tokens) - 1) // 16
        want = extra_keys(n, 16, mm)
        assert [tuple(x) if x else None for x in extra] == want
        assert any(want) and want[0] is None
    # a text-only chain publishes no extra keys at all (nil), as before
    e2 = Engine(EngineConfig(kv_cache_size=4096))
    body = {"model": "m", "messages": [{"role": "user", "content": SYSTEM}]}
    run(e2, "b", body, 0.0)
    (stored,) = msgpack.unpackb(encode_batch(EventEncoder(16).encode(e2.kv.drain_events())), raw=False)[1]
    assert stored[8] is None
