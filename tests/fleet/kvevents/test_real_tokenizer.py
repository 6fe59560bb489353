"""End to end with a real (test-built) tokenizer: modelsim caches and publishes the token ids of a Hugging Face
tokenizer with a chat template; Pointsman's local tokenizer and the engine's /tokenize give the same ids, so the
keys of a request match the keys derived from BlockStored."""

from __future__ import annotations

from pathlib import Path

import aiohttp

from epp.fleet.kvevents.decode import BlockStored
from epp.fleet.kvevents.sources import KVEventsSource
from epp.fleet.kvevents.subscriber import KVEventSubscriber
from epp.tokenize import EngineTokenizer, LocalTokenizer, RequestTokenizer, TokenizerRegistry, tokenize_input
from scheduling.prefix.precise import LIVE, PreciseIndex
from scheduling.prefix.token_keys import chain_keys
from scheduling.types import ApiKind
from tests.support.tiny_tokenizer import build_tokenizer
from tests.support.wait import until

MODEL = "acme/tiny-chat"


async def test_local_tokenizer_keys_match_event_keys(make_fleet, tmp_path: Path) -> None:
    tokdir = build_tokenizer(tmp_path / MODEL)
    fleet = await make_fleet(1, model=MODEL, tokenizer=str(tokdir))
    url = fleet.urls[0]
    cfg = fleet.config
    index = PreciseIndex(block_size=16)
    seen: list[BlockStored] = []
    sub = KVEventSubscriber(index, catch_up_after=0.2,
                            on_batch=lambda k, r, b: seen.extend(e for e in b.events if isinstance(e, BlockStored)))
    sub.add_endpoint("sim-0", KVEventsSource(f"tcp://127.0.0.1:{cfg.kv_events_port}",
                                             f"tcp://127.0.0.1:{cfg.kv_events_replay_port}"))
    eng = EngineTokenizer()
    try:
        await until(lambda: index.state("sim-0") == LIVE, 3.0)
        body = {"model": MODEL, "max_tokens": 1, "messages": [
            {"role": "system", "content": "You are a helpful assistant. " * 12},
            {"role": "user", "content": "What is the capital of France? Write a haiku about routers and caches."}]}
        async with aiohttp.ClientSession() as s:
            async with s.post(f"{url}/v1/chat/completions", json=body) as r:
                assert r.status == 200, await r.text()
                usage = (await r.json())["usage"]
        rt = RequestTokenizer(TokenizerRegistry(root=tmp_path), eng)
        req = tokenize_input(ApiKind.CHAT, body, MODEL)
        local = await rt.tokenize(req, [url])
        assert local.source == "local"
        assert usage["prompt_tokens"] == len(local.tokens)  # the engine read exactly these tokens
        via_engine = await eng.tokenize(url, MODEL, messages=req.messages)
        assert via_engine == local.tokens  # vLLM's /tokenize with messages: same ids
        assert local.tokens == LocalTokenizer.from_dir(tokdir).encode_chat(req.messages)
        keys = index.keys_for(local.tokens)
        cached = (len(local.tokens) - 1) // 16
        await until(lambda: index.match(keys).get("sim-0") is not None
                    and index.match(keys)["sim-0"].blocks == cached, 3.0)
        assert chain_keys([t for e in seen for t in e.token_ids], 16) == keys[:cached]
        # a completions prompt gets the tokenizer's special tokens (BOS), as vLLM adds them
        async with aiohttp.ClientSession() as s:
            async with s.post(f"{url}/tokenize", json={"model": MODEL, "prompt": "hello world"}) as r:
                assert (await r.json())["tokens"][0] == 0
    finally:
        await eng.close()
        await sub.close()
