"""KV events over a real ZMQ SUB socket, decoded with msgpack."""

from __future__ import annotations

import asyncio

import aiohttp
import msgpack
import zmq
import zmq.asyncio

from modelsim import tokenizer as tk
from modelsim.config import EngineConfig

MODEL = "meta-llama/Llama-3.1-8B"


async def test_block_stored_and_removed_wire_format(make_fleet) -> None:
    fleet = await make_fleet(1, kv_events=True, time_scale=0.05, engine=EngineConfig(kv_cache_size=24))
    srv = fleet.servers[0]
    ctx = zmq.asyncio.Context.instance()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.LINGER, 0)
    sub.setsockopt(zmq.SUBSCRIBE, b"kv@")
    sub.connect(srv.publisher.endpoint)
    await asyncio.sleep(0.3)  # slow joiner
    prompt_a = "a" * 640 + "!"  # 10 full blocks + a partial one
    async with aiohttp.ClientSession() as s:
        for p in (prompt_a, "b" * 640 + "!", "c" * 640 + "!"):  # 3 × 11 blocks > 24: evictions
            async with s.post(f"{fleet.urls[0]}/v1/completions",
                              json={"model": MODEL, "prompt": p, "max_tokens": 1}) as r:
                assert r.status == 200
    frames = []
    try:
        while True:
            frames.append(await asyncio.wait_for(sub.recv_multipart(), 1.0))
    except asyncio.TimeoutError:
        pass
    sub.close(0)
    assert frames, "no KV events received"
    seqs = []
    stored, removed = [], []
    for topic, seq, payload in frames:
        assert topic == f"kv@127.0.0.1:{srv.port}@{MODEL}".encode()
        assert len(seq) == 8
        seqs.append(int.from_bytes(seq, "big"))
        batch = msgpack.unpackb(payload, raw=False)
        ts, events, dp_rank = batch
        assert isinstance(ts, float) and dp_rank is None
        for ev in events:
            if ev[0] == "BlockStored":
                stored.append(ev)
            elif ev[0] == "BlockRemoved":
                removed.append(ev)
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))
    first = stored[0]
    tag, hashes, parent, token_ids, block_size, lora_id, medium, lora_name = first
    assert tag == "BlockStored" and parent is None and block_size == 16 and medium == "GPU"
    assert len(hashes) == 10 and token_ids == tk.encode(prompt_a)[:160]
    assert lora_id is None and lora_name is None
    assert removed and removed[0][2] == "GPU"
    all_removed = {h for ev in removed for h in ev[1]}
    assert all_removed & set(hashes)  # group a was evicted first (LRU)


async def test_replay_router_returns_retained_batches_then_sentinel(make_fleet) -> None:
    from bench.routing.procs import free_port_block

    replay_base = free_port_block(1)
    fleet = await make_fleet(1, kv_events=True, time_scale=0.05, kv_events_replay_port=replay_base)
    async with aiohttp.ClientSession() as s:
        for p in ("r" * 200, "s" * 200):
            async with s.post(f"{fleet.urls[0]}/v1/completions",
                              json={"model": MODEL, "prompt": p, "max_tokens": 1}) as r:
                assert r.status == 200
    ctx = zmq.asyncio.Context.instance()
    dealer = ctx.socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    dealer.connect(f"tcp://127.0.0.1:{replay_base}")
    await dealer.send_multipart([b"", (1).to_bytes(8, "big")])
    got = []
    while True:
        frames = await asyncio.wait_for(dealer.recv_multipart(), 2.0)
        _, seq, payload = frames
        n = int.from_bytes(seq, "big", signed=True)
        if n == -1:
            assert payload == b""
            break
        got.append((n, msgpack.unpackb(payload)))
    dealer.close(0)
    assert [n for n, _ in got] == [1]
    assert got[0][1][1][0][0] == "BlockStored"
