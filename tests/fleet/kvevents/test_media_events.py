"""The precise index never predicts a hit for a different image (issue 30, part 4).

modelsim engines serve chats about an image and publish vLLM-format KV events (placeholder tokens, the mm hash in
the blocks' extra keys); Pointsman decodes and applies them, tokenizes requests about the same or another image the
ways it can (the engine's /tokenize, which modelsim answers with its own tokenizer, and the character
approximation) and matches. Neither the events nor Pointsman's own speculative entries may carry a request past
the first block holding its media unless it is the same media."""

from __future__ import annotations

import orjson
import pytest

from epp.fleet.kvevents.apply import apply_events
from epp.fleet.kvevents.decode import decode_payload
from epp.request.parsing import parse_body
from epp.tokenize import approx_tokens, tokenize_input
from modelsim import tokenizer as tk
from modelsim.config import EngineConfig
from modelsim.engine import Engine, SimRequest
from modelsim.kvevents import EventEncoder, encode_batch
from scheduling.prefix.precise import PreciseIndex
from scheduling.types import ApiKind

B = 16
SYSTEM = "You are a careful visual assistant; answer in one short sentence and name the objects. " * 6
CAT, DOG = "https://img.example/cat.png", "https://img.example/dog.png"
LOOK = "Look closely at the picture, at its background and at every animal in it, then answer this question: " * 2


def chat(url: str, question: str = LOOK + "What is in this picture?") -> dict:
    return {"model": "m", "messages": [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}},
                                     {"type": "text", "text": question}]}]}


def serve(body: dict, encoding: str) -> list:
    """One modelsim engine serves `body`; its KV events as Pointsman decodes them."""
    e = Engine(EngineConfig(kv_cache_size=4096))
    tokens, mm = tk.request_inputs(tk.API_CHAT, body)
    e.submit(SimRequest("r", tokens, 1, mm=mm), 0.0)
    while (nt := e.next_event_time()) is not None:
        e.advance(nt)
    wire = EventEncoder(B, encoding).encode(e.kv.drain_events())
    assert any(isinstance(ev, dict) and ev.get("extra_keys") or isinstance(ev, list) and ev[8] for ev in wire)
    return decode_payload(encode_batch(wire))[1]


def engine_tokens(body: dict) -> list[int]:
    """Pointsman's tokens from the engine's /tokenize (modelsim answers it with its tokenizer)."""
    ti = tokenize_input(ApiKind.CHAT, body, "m")
    assert ti.messages is not None
    return tk.request_tokens(tk.API_CHAT, {"messages": list(ti.messages)})


def approx(body: dict) -> list[int]:
    return approx_tokens(parse_body(ApiKind.CHAT, orjson.dumps(body)).prompt)


def before_media(body: dict) -> int:
    """Full blocks of the engine's prompt that hold no placeholder token."""
    return tk.request_inputs(tk.API_CHAT, body)[1][0][0] // B


@pytest.mark.parametrize("encoding", ["array", "map"])
@pytest.mark.parametrize("tokenize", [engine_tokens, approx])
def test_no_hit_is_predicted_past_the_first_media_block(encoding: str, tokenize) -> None:
    idx = PreciseIndex(block_size=B)
    apply_events(idx, "cat-pod", 0, serve(chat(CAT), encoding))
    apply_events(idx, "dog-pod", 0, serve(chat(DOG), encoding))
    limit = before_media(chat(CAT))
    assert limit >= 5  # the system prompt fills blocks: there is a prefix to share
    for url in (CAT, DOG, "https://img.example/owl.png"):
        got = idx.match(idx.keys_for(tokenize(chat(url))))
        assert set(got) <= {"cat-pod", "dog-pod"}
        assert all(m.blocks <= limit for m in got.values()), (url, got)
        # what precedes the image is shared by both engines, whatever the image
        if tokenize is engine_tokens:
            assert {k: m.blocks for k, m in got.items()} == {"cat-pod": got["cat-pod"].blocks,
                                                            "dog-pod": got["cat-pod"].blocks}
            assert got["cat-pod"].blocks >= limit - 2


@pytest.mark.parametrize("tokenize", [engine_tokens, approx])
def test_speculative_entries_follow_the_media(tokenize) -> None:
    """Pointsman's own record of a pick joins the same image and question, never another image."""
    idx = PreciseIndex(block_size=B)
    cat = idx.keys_for(tokenize(chat(CAT)))
    idx.add_speculative("cat-pod", cat, now=0.0, ttl=60.0)
    assert idx.match(idx.keys_for(tokenize(chat(CAT))), 1.0)["cat-pod"].blocks == len(cat)
    dog = idx.keys_for(tokenize(chat(DOG)))
    shared = next(i for i, (x, y) in enumerate(zip(cat, dog, strict=False)) if x != y)
    got = idx.match(dog, 1.0).get("cat-pod")
    assert got is not None and got.blocks == shared < len(dog)
    assert shared <= before_media(chat(CAT)) + 1  # only up to the block holding the image's marker
    # the same image with another question shares past the image, as far as the question
    other_q = idx.keys_for(tokenize(chat(CAT, LOOK + "How many animals are there?")))
    assert shared < idx.match(other_q, 1.0)["cat-pod"].blocks < len(other_q)
