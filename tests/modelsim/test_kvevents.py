"""modelsim's KV events over real ZMQ sockets, decoded with plain msgpack (not Pointsman's decoder)."""

from __future__ import annotations

import asyncio

import aiohttp
import msgpack
import pytest
import zmq
import zmq.asyncio

from epp.stack.ports import free_port_block
from modelsim import tokenizer as tk
from modelsim.config import EngineConfig
from modelsim.kvevents import KVEventPublisher, hash_bytes
from tests.support.wait import until

MODEL = "meta-llama/Llama-3.1-8B"
STORED_ARRAY_LEN = 12  # tag + 11 fields, trailing nils included (msgspec array_like writes every field)


async def _sub(publisher: KVEventPublisher) -> zmq.asyncio.Socket:
    """A subscriber to everything the publisher sends from now on. ZMQ's slow joiner: what is published before the
    subscription reaches the publisher is lost, so this returns once the publisher has counted it."""
    before = publisher.subscriptions()
    sub = zmq.asyncio.Context.instance().socket(zmq.SUB)
    sub.setsockopt(zmq.LINGER, 0)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(publisher.endpoint)
    await until(lambda: publisher.subscriptions() > before, 10, "the subscription to reach the publisher")
    return sub


async def _drain(sub: zmq.asyncio.Socket, quiet: float = 0.5, first: float = 10.0) -> list[list[bytes]]:
    """Every frame until the publisher has been quiet for `quiet` seconds. The first frame may take longer on a
    loaded machine (the engine publishes after its step), so it gets `first` seconds; none at all is an empty list."""
    frames = []
    try:
        while True:
            frames.append(await asyncio.wait_for(sub.recv_multipart(), quiet if frames else first))
    except asyncio.TimeoutError:
        pass
    return frames


async def _complete(url: str, prompt: str, model: str = MODEL, **extra: object) -> dict:
    async with aiohttp.ClientSession() as s:
        async with s.post(f"{url}/v1/completions", json={"model": model, "prompt": prompt, "max_tokens": 1,
                                                         **extra}) as r:
            assert r.status == 200, await r.text()
            return await r.json()


def _events(frames: list[list[bytes]]) -> list:
    out = []
    for _, _, payload in frames:
        out.extend(msgpack.unpackb(payload, raw=False)[1])
    return out


async def test_array_encoding_matches_vllm(make_fleet) -> None:
    fleet = await make_fleet(1, kv_events=True, time_scale=0.05, engine=EngineConfig(kv_cache_size=24))
    srv = fleet.servers[0]
    sub = await _sub(srv.publisher)
    prompt_a = "a" * 640 + "!"  # 10 full blocks + a partial one
    for p in (prompt_a, "b" * 640 + "!", "c" * 640 + "!"):  # 3 × 11 blocks > 24: evictions
        await _complete(fleet.urls[0], p)
    frames = await _drain(sub)
    sub.close(0)
    assert frames, "no KV events received"
    seqs = []
    for topic, seq, payload in frames:
        assert topic == f"kv@127.0.0.1:{srv.port}@{MODEL}".encode()
        assert len(seq) == 8
        seqs.append(int.from_bytes(seq, "big"))
        ts, events, dp_rank = msgpack.unpackb(payload, raw=False)
        assert isinstance(ts, float) and dp_rank == 0  # vLLM stamps rank 0 without data parallelism
    assert seqs == list(range(len(seqs)))  # from 0, no gaps
    events = _events(frames)
    stored = [e for e in events if e[0] == "BlockStored"]
    removed = [e for e in events if e[0] == "BlockRemoved"]
    first = stored[0]
    assert len(first) == STORED_ARRAY_LEN
    tag, hashes, parent, token_ids, block_size, lora_id, medium, lora_name, extra, group, kind, window = first
    assert parent is None and block_size == 16 and medium == "GPU" and group == 0
    assert lora_id is None and lora_name is None and extra is None and kind is None and window is None
    assert len(hashes) == 10 and token_ids == tk.encode(prompt_a)[:160]
    assert all(isinstance(h, int) for h in hashes)
    # vLLM emits one BlockRemoved per evicted block: [tag, [hash], medium, group_idx]
    assert removed and all(len(e) == 4 and len(e[1]) == 1 and e[2] == "GPU" and e[3] == 0 for e in removed)
    assert {e[1][0] for e in removed} & set(hashes)  # group a was evicted first (LRU)


async def test_map_encoding_and_bytes_hashes(make_fleet) -> None:
    fleet = await make_fleet(1, kv_events=True, time_scale=0.05, engine=EngineConfig(kv_cache_size=24),
                             kv_events_encoding="map", kv_events_hash_format="bytes")
    sub = await _sub(fleet.servers[0].publisher)
    for p in ("a" * 640 + "!", "b" * 640 + "!", "c" * 640 + "!"):
        await _complete(fleet.urls[0], p)
    events = _events(await _drain(sub))
    sub.close(0)
    stored = [e for e in events if e["type"] == "BlockStored"]
    removed = [e for e in events if e["type"] == "BlockRemoved"]
    assert stored and removed
    first = stored[0]
    # omit_defaults: defaulted fields (extra_keys, spec kind/window) left out; fields without defaults written
    assert set(first) == {"type", "block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id",
                          "medium", "lora_name", "group_idx"}
    assert first["parent_block_hash"] is None and first["lora_id"] is None and first["group_idx"] == 0
    assert all(isinstance(h, bytes) and len(h) == 32 for h in first["block_hashes"])
    second = stored[1]
    assert second["parent_block_hash"] is None or isinstance(second["parent_block_hash"], bytes)
    assert set(removed[0]) == {"type", "block_hashes", "medium", "group_idx"}
    assert hash_bytes(12345)[-8:] == (12345).to_bytes(8, "big")


async def test_lora_requests_carry_lora_id_and_name(make_fleet) -> None:
    fleet = await make_fleet(1, kv_events=True, time_scale=0.05, loras=("sql-lora", "chat-lora"))
    sub = await _sub(fleet.servers[0].publisher)
    await _complete(fleet.urls[0], "x" * 200, model="chat-lora")
    events = _events(await _drain(sub))
    sub.close(0)
    stored = [e for e in events if e[0] == "BlockStored"]
    assert stored and stored[0][5] == 2 and stored[0][7] == "chat-lora"  # ids in load order, from 1


async def test_sglang_style_one_event_per_block(make_fleet) -> None:
    fleet = await make_fleet(1, kv_events=True, time_scale=0.05, kv_events_style="sglang")
    sub = await _sub(fleet.servers[0].publisher)
    prompt = "s" * 200  # 3 full blocks
    await _complete(fleet.urls[0], prompt)
    events = _events(await _drain(sub))
    sub.close(0)
    stored = [e for e in events if e[0] == "BlockStored"]
    assert len(stored) == 3 and all(len(e) == 7 and len(e[1]) == 1 for e in stored)
    assert stored[0][2] is None and stored[1][2] == stored[0][1][0] and stored[2][2] == stored[1][1][0]
    assert [t for e in stored for t in e[3]] == tk.encode(prompt)[:48]


async def _replay(endpoint: str, start: int) -> list[list[bytes]]:
    dealer = zmq.asyncio.Context.instance().socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    dealer.connect(endpoint)
    await dealer.send_multipart([b"", start.to_bytes(8, "big")])
    got = []
    while True:
        frames = await asyncio.wait_for(dealer.recv_multipart(), 2.0)
        got.append(frames)
        if frames[-2] == (-1).to_bytes(8, "big", signed=True):
            break
    dealer.close(0)
    return got


@pytest.mark.parametrize("encoding", ["array", "map"])
async def test_replay_router_protocol(make_fleet, encoding: str) -> None:
    replay_base = free_port_block(1)
    fleet = await make_fleet(1, kv_events=True, time_scale=0.05, kv_events_replay_port=replay_base,
                             kv_events_encoding=encoding, kv_events_buffer_steps=2)
    for p in ("r" * 200, "s" * 200, "t" * 200):
        await _complete(fleet.urls[0], p)
    topic = fleet.servers[0].publisher.topic
    got = await _replay(f"tcp://127.0.0.1:{replay_base}", 1)
    end = got.pop()
    if encoding == "array":  # [b"", seq, payload] ... [b"", -1, b""]
        assert end == [b"", (-1).to_bytes(8, "big", signed=True), b""]
        assert all(len(f) == 3 and f[0] == b"" for f in got)
        seqs = [int.from_bytes(f[1], "big") for f in got]
    else:  # newer vLLM: [b"", topic, seq, payload] ... [b"", b"", -1, b""]
        assert end == [b"", b"", (-1).to_bytes(8, "big", signed=True), b""]
        assert all(len(f) == 4 and f[1] == topic for f in got)
        seqs = [int.from_bytes(f[2], "big") for f in got]
    assert seqs == [1, 2]  # buffer_steps=2 keeps the last two batches; seq 0 is gone
    payload = msgpack.unpackb(got[0][-1], raw=False)
    tag = payload[1][0][0] if encoding == "array" else payload[1][0]["type"]
    assert tag == "BlockStored"


async def test_reset_prefix_cache_publishes_all_blocks_cleared(make_fleet) -> None:
    fleet = await make_fleet(1, kv_events=True, time_scale=0.05)
    sub = await _sub(fleet.servers[0].publisher)
    await _complete(fleet.urls[0], "q" * 200)
    async with aiohttp.ClientSession() as s:
        async with s.post(f"{fleet.urls[0]}/reset_prefix_cache") as r:
            assert r.status == 200
    events = _events(await _drain(sub))
    sub.close(0)
    assert events[-1] == ["AllBlocksCleared"]
    assert fleet.servers[0].engine.kv.cached_blocks == 0


async def test_reset_refused_while_running_unless_forced(make_fleet) -> None:
    fleet = await make_fleet(1, kv_events=True, time_scale=1.0)
    sub = await _sub(fleet.servers[0].publisher)
    url = fleet.urls[0]
    async with aiohttp.ClientSession() as s:
        body = {"model": MODEL, "prompt": "w" * 200, "max_tokens": 100, "ignore_eos": True}  # ~1.2 s running
        gen = asyncio.ensure_future(s.post(f"{url}/v1/completions", json=body))
        await until(lambda: fleet.servers[0].engine.running, 1, "the request running", 0.01)
        async with s.post(f"{url}/reset_prefix_cache") as r:
            assert r.status == 409
        async with s.post(f"{url}/reset_prefix_cache?reset_running_requests=true") as r:
            assert r.status == 200
        resp = await gen
        assert resp.status == 200
        data = await resp.json()
        assert data["usage"]["completion_tokens"] == 100
    events = _events(await _drain(sub))
    sub.close(0)
    tags = [e[0] for e in events]
    assert tags.count("AllBlocksCleared") == 1
    # the preempted request was re-admitted after the reset and stored its blocks again
    assert "BlockStored" in tags[tags.index("AllBlocksCleared"):]
    assert fleet.servers[0].engine.stats.preemptions == 1


async def test_tokenize_matches_block_stored_tokens(make_fleet) -> None:
    fleet = await make_fleet(1, kv_events=True, time_scale=0.05)
    sub = await _sub(fleet.servers[0].publisher)
    url = fleet.urls[0]
    messages = [{"role": "system", "content": "You are terse. " * 8}, {"role": "user", "content": "hi " * 30}]
    async with aiohttp.ClientSession() as s:
        async with s.post(f"{url}/tokenize", json={"model": MODEL, "messages": messages}) as r:
            assert r.status == 200
            tok = await r.json()
        async with s.post(f"{url}/v1/chat/completions",
                          json={"model": MODEL, "messages": messages, "max_tokens": 1}) as r:
            assert r.status == 200
        async with s.post(f"{url}/tokenize", json={"prompt": "abcdefgh", "return_token_strs": True}) as r:
            plain = await r.json()
        async with s.post(f"{url}/tokenize", json={"model": "nope", "prompt": "x"}) as r:
            assert r.status == 404
        async with s.post(f"{url}/tokenize", json={"model": MODEL}) as r:
            assert r.status == 400
    assert set(tok) == {"count", "max_model_len", "tokens", "token_strs"} and tok["token_strs"] is None
    assert tok["count"] == len(tok["tokens"]) and tok["max_model_len"] == 32768
    stored = [e for e in _events(await _drain(sub)) if e[0] == "BlockStored"]
    sub.close(0)
    n = len(stored[0][3])
    assert n >= 16 and stored[0][3] == tok["tokens"][:n]
    assert plain["tokens"] == tk.encode("abcdefgh") and plain["token_strs"] == ["abcd", "efgh"]
