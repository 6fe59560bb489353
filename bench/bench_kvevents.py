"""KV events and the precise prefix index: memory, event-apply throughput, per-request cost (not a test).

1. Memory (tracemalloc) of the precise index at E endpoints × B engine blocks of 16 tokens: unique blocks (the
   worst case: no block shared by two endpoints) and a shared layout (every endpoint holds the same quarter of
   its blocks, e.g. a common system prompt). Reported as bytes per held block and MB per endpoint.
2. Event-apply throughput on one core: vLLM-encoded messages (``[topic, seq, msgpack batch]``) built beforehand
   from a simulated engine (a bounded cache per endpoint: each step stores a new chain of 4-64 blocks, half of
   them extending a cached chain, and evicts the oldest blocks one BlockRemoved each, as vLLM does) are decoded
   and applied: ``decode_message`` + ``apply_events``. A block event is one block hash in a BlockStored or a
   BlockRemoved. Also end to end over real ZMQ (modelsim's publisher → the subscriber, one process).
3. Per-request cost at 64 endpoints: tokenization (a local BPE tokenizer with a chat template, built here, and the
   character approximation), keys, and `match`, interleaved per request with the approximate index's lookup of
   the same prompt (scheduling.prefix: characters hashed, `match_lazy`). Medians in µs.
4. The whole decision at 64 endpoints, as the director makes it: the tokenization step (epp.tokenize.shell, the
   local tokenizer loaded) + `schedule` + `pre_request` (the producers record the pick: speculative entries, the
   approximate index), for the shipped profiles reading the precise index and for those that do not (which pay
   no tokenization), interleaved per request. Medians in µs.

    python bench/bench_kvevents.py [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import random
import statistics
import sys
import time
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import msgpack  # noqa: E402

from epp.fleet.kvevents.apply import apply_events  # noqa: E402
from epp.fleet.kvevents.decode import decode_message  # noqa: E402
from scheduling.prefix.hashing import BlockHasher  # noqa: E402
from scheduling.prefix.index import PrefixIndex  # noqa: E402
from scheduling.prefix.precise import PreciseIndex  # noqa: E402
from scheduling.prefix.token_keys import chain_keys  # noqa: E402

BS = 16


# ---- 1. memory -------------------------------------------------------------------------------------------
def _fill(idx: PreciseIndex, endpoints: int, blocks: int, shared: float) -> int:
    """Each endpoint stores `blocks` engine blocks in chains of 64; the first `shared` fraction of chains is the
    same for every endpoint (same tokens, the endpoint's own engine hashes). Returns the blocks held."""
    per_chain = 64
    span = per_chain * BS
    chains = blocks // per_chain
    common = int(chains * shared)
    h = 1
    for e in range(endpoints):
        ep = f"10.0.{e // 250}.{e % 250}:8000"
        for c in range(chains):
            start = c * span if c < common else ((e + 1) * chains + c) * span  # distinct content per chain
            idx.store(ep, 0, range(h, h + per_chain), None, range(start, start + span), BS)
            h += per_chain
    return endpoints * chains * per_chain


def bench_memory(endpoints: int, blocks: int, shared: float) -> tuple[float, float, int]:
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    idx = PreciseIndex(block_size=BS, capacity=blocks)
    held = _fill(idx, endpoints, blocks, shared)
    gc.collect()
    used = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    keys = len(idx)
    del idx
    gc.collect()
    return used / held, used / endpoints / 1e6, keys


# ---- 2. event-apply throughput -----------------------------------------------------------------------------
def _stored(enc: str, hashes: list[int], parent: int | None, tokens: list[int]) -> object:
    if enc == "array":
        return ["BlockStored", hashes, parent, tokens, BS, None, "GPU", None, None, 0, None, None]
    return {"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": parent, "token_ids": tokens,
            "block_size": BS, "lora_id": None, "medium": "GPU", "lora_name": None, "group_idx": 0}


def _removed(enc: str, h: int) -> object:
    if enc == "array":
        return ["BlockRemoved", [h], "GPU", 0]
    return {"type": "BlockRemoved", "block_hashes": [h], "medium": "GPU", "group_idx": 0}


def make_messages(enc: str, endpoints: int, steps: int, capacity: int, seed: int = 2
                  ) -> tuple[list[tuple[str, list[bytes]]], int]:
    """Per endpoint an engine with `capacity` cached blocks; returns (endpoint, frames) messages and the number
    of block events they carry."""
    rnd = random.Random(seed)
    out: list[tuple[str, list[bytes]]] = []
    events = 0
    state = []
    for e in range(endpoints):
        state.append({"cache": {}, "order": [], "seq": 0, "next": (e + 1) << 40, "ep": f"10.0.0.{e}:8000"})
    for step in range(steps):
        st = state[step % endpoints]
        cache, order = st["cache"], st["order"]
        n = rnd.randrange(4, 65)
        parent = None
        if order and rnd.random() < 0.5:
            parent = order[rnd.randrange(max(0, len(order) - 256), len(order))]
            if parent not in cache:
                parent = None
        hashes = list(range(st["next"], st["next"] + n))
        st["next"] += n
        tokens = [rnd.randrange(128000) for _ in range(n * BS)]
        evs = [_stored(enc, hashes, parent, tokens)]
        for h in hashes:
            cache[h] = True
        order.extend(hashes)
        while len(cache) > capacity:  # vLLM evicts one block per BlockRemoved
            old = order.pop(0)
            if cache.pop(old, None):
                evs.append(_removed(enc, old))
                events += 1
        events += n
        payload = msgpack.packb([time.time(), evs, 0], use_bin_type=True)
        out.append((st["ep"], [b"kv@bench", st["seq"].to_bytes(8, "big"), payload]))
        st["seq"] += 1
    return out, events


def bench_apply(enc: str, endpoints: int, steps: int, capacity: int, repeat: int) -> tuple[float, int, int]:
    msgs, events = make_messages(enc, endpoints, steps, capacity)
    best = 0.0
    for _ in range(repeat):
        idx = PreciseIndex(block_size=BS)
        gc.collect()
        t0 = time.process_time()
        for ep, frames in msgs:
            apply_events(idx, ep, 0, decode_message(frames).events)
        dt = time.process_time() - t0
        best = max(best, events / dt)
        orphans = idx.counters["orphaned"]
    return best, events, orphans


async def bench_zmq(steps: int, capacity: int) -> float:
    """modelsim's publisher → KVEventSubscriber over TCP loopback, both in this process (one core)."""
    from epp.fleet.kvevents.sources import KVEventsSource
    from epp.fleet.kvevents.subscriber import KVEventSubscriber
    from epp.stack.ports import free_port
    from modelsim.kvevents import KVEventPublisher

    msgs, events = make_messages("array", 1, steps, capacity)
    port = free_port()
    pub = KVEventPublisher(f"tcp://127.0.0.1:{port}", "kv@bench", BS)
    pub._sock.setsockopt(__import__("zmq").SNDHWM, 0)
    idx = PreciseIndex(block_size=BS)
    sub = KVEventSubscriber(idx, catch_up_after=None, rcvhwm=0)
    sub.add_endpoint("e", KVEventsSource(f"tcp://127.0.0.1:{port}"))
    await asyncio.sleep(0.5)
    t0 = time.perf_counter()
    for _, frames in msgs:
        pub._sock.send_multipart(frames)
        pub.seq += 1
        if pub.seq % 200 == 0:
            await asyncio.sleep(0)
    while sub.status()["e"][0].last_seq != len(msgs) - 1:
        await asyncio.sleep(0.001)
    dt = time.perf_counter() - t0
    await sub.close()
    pub.close()
    return events / dt


# ---- 3. per-request cost --------------------------------------------------------------------------------
WORDS = ("the router picks an endpoint by prefix cache load queue latency model server token block event "
         "replay subscriber index request prompt system user assistant answer question context window").split()


def _text(rnd: random.Random, chars: int) -> str:
    out: list[str] = []
    n = 0
    while n < chars:
        w = rnd.choice(WORDS)
        out.append(w)
        n += len(w) + 1
    return " ".join(out)[:chars]


def build_tokenizer(d: Path) -> Path:
    import json

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    rnd = random.Random(3)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=1000, show_progress=False,
                                  special_tokens=["<s>", "</s>", "<|im_start|>", "<|im_end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([_text(rnd, 200) for _ in range(300)], trainer)
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 0)])
    d.mkdir(parents=True, exist_ok=True)
    tok.save(str(d / "tokenizer.json"))
    template = ("{{ bos_token }}{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
                "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    (d / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<s>", "eos_token": "</s>",
                                                         "chat_template": template}))
    return d


def bench_request(endpoints: int, requests: int, system_chars: int, user_chars: int, tmp: Path
                  ) -> dict[str, list[float]]:
    import orjson

    from epp.tokenize import RequestTokenizer, TokenizerRegistry, approx_tokens, tokenize_input
    from scheduling.types import ApiKind

    rnd = random.Random(4)
    reg = TokenizerRegistry(models={"bench": build_tokenizer(tmp / "tok")})
    rt = RequestTokenizer(reg)
    reg.get("bench")
    systems = [_text(rnd, system_chars) for _ in range(32)]
    idx = PreciseIndex(block_size=BS)
    approx = PrefixIndex()
    eps = [f"10.0.0.{i}:8000" for i in range(endpoints)]
    h = 1
    bodies = []
    for i in range(requests + endpoints * 4):
        sysp = systems[i % len(systems)]
        body = {"model": "bench", "messages": [{"role": "system", "content": sysp},
                                               {"role": "user", "content": _text(rnd, user_chars)}]}
        bodies.append(body)
    # warm both indexes: each endpoint served 4 conversations (its system prompts cached in full)
    for i, body in enumerate(bodies[: endpoints * 4]):
        ep = eps[i % endpoints]
        text = orjson.dumps(body["messages"]).decode()
        tokens = rt.tokenize_nowait(tokenize_input(ApiKind.CHAT, body, "bench", prompt_text=text)).tokens
        n = len(tokens) // BS
        idx.store(ep, 0, list(range(h, h + n)), None, tokens[: n * BS], BS)
        h += n
        approx.record(ep, BlockHasher(text, "bench").all())
    out: dict[str, list[float]] = {k: [] for k in ("tokenize_local", "tokenize_approx", "keys", "match",
                                                   "precise_total", "approx_index_total", "tokens", "matched")}
    clock = time.perf_counter_ns
    for body in bodies[endpoints * 4:]:
        text = orjson.dumps(body["messages"]).decode()
        t0 = clock()
        req = tokenize_input(ApiKind.CHAT, body, "bench", prompt_text=text)
        res = rt.tokenize_nowait(req)
        t1 = clock()
        keys = chain_keys(res.tokens, BS)
        t2 = clock()
        m = idx.match(keys, now=1.0)
        t3 = clock()
        approx_tokens(text)
        t4 = clock()
        approx.match_lazy(BlockHasher(text, "bench"))
        t5 = clock()
        out["tokenize_local"].append((t1 - t0) / 1e3)
        out["keys"].append((t2 - t1) / 1e3)
        out["match"].append((t3 - t2) / 1e3)
        out["precise_total"].append((t3 - t0) / 1e3)
        out["tokenize_approx"].append((t4 - t3) / 1e3)
        out["approx_index_total"].append((t5 - t4) / 1e3)
        out["tokens"].append(len(res.tokens))
        out["matched"].append(max((x.blocks for x in m.values()), default=0))
    return out


DECISION_CONFIGS = {
    "precise-prefix-cache-scorer": "precise-prefix-cache-scorer",
    "estimated-latency, prefixSource precise": "estimated-latency-precise.yaml",
    "estimated-latency (approximate; the default)": "estimated-latency.yaml",
    "prefix-cache-scorer (approximate)": "prefix-cache-scorer",
}


def _decision_scheduler(what: str, services: dict[str, object]) -> object:
    from scheduling.config import load_scheduler

    root = Path(__file__).resolve().parents[1]
    if what.endswith(".yaml"):
        return load_scheduler(root / "deploy" / "profiles" / what, rng=random.Random(0), services=services)
    doc = {"apiVersion": "inference.networking.x-k8s.io/v1alpha1", "kind": "EndpointPickerConfig",
           "plugins": [{"type": what}, {"type": "max-score-picker"}],
           "schedulingProfiles": [{"name": "default", "plugins": [{"pluginRef": what},
                                                                   {"pluginRef": "max-score-picker"}]}]}
    return load_scheduler([doc], rng=random.Random(0), services=services)


def bench_decision(endpoints: int, requests: int, system_chars: int, user_chars: int, tmp: Path
                   ) -> dict[str, list[float]]:
    """Microseconds per whole decision (tokenize if the config reads tokens, schedule, pre_request)."""
    import orjson

    from epp.tokenize import RequestTokenizer, TokenizerRegistry, tokenize_input
    from epp.tokenize.shell import RequestTokens
    from scheduling.api import SchedulingContext
    from scheduling.prefix.precise_data import PRECISE_INDEX
    from scheduling.types import ApiKind, Endpoint, LLMRequest

    rnd = random.Random(5)
    reg = TokenizerRegistry(models={"bench": build_tokenizer(tmp / "tok2")})
    reg.get("bench")
    tokens = RequestTokens(RequestTokenizer(reg))
    eps = [Endpoint(f"10.0.0.{i}:8000", f"10.0.0.{i}", 8000) for i in range(endpoints)]
    idx = PreciseIndex(block_size=BS)
    for e in eps:
        idx.clear(e.key, 0)  # live
    scheds = {label: _decision_scheduler(what, {PRECISE_INDEX: idx}) for label, what in DECISION_CONFIGS.items()}
    systems = [_text(rnd, system_chars) for _ in range(32)]
    bodies = [{"model": "bench", "messages": [{"role": "system", "content": systems[i % 32]},
                                              {"role": "user", "content": _text(rnd, user_chars)}]}
              for i in range(requests + endpoints * 4)]
    h = 1
    for i, body in enumerate(bodies[: endpoints * 4]):  # each endpoint's engine cached 4 conversations
        text = orjson.dumps(body["messages"]).decode()
        toks = tokens.tokenizer.tokenize_nowait(tokenize_input(ApiKind.CHAT, body, "bench", prompt_text=text)).tokens
        n = len(toks) // BS
        idx.store(eps[i % endpoints].key, 0, list(range(h, h + n)), None, toks[: n * BS], BS)
        h += n
    out: dict[str, list[float]] = {label: [] for label in scheds}
    clock = time.perf_counter_ns
    now = 0.0
    for body in bodies[endpoints * 4:]:
        text = orjson.dumps(body["messages"]).decode()
        for label, sched in scheds.items():
            now += 0.001
            req = LLMRequest("r", "bench", "bench", ApiKind.CHAT, prompt=text, body=body)
            ctx = SchedulingContext(req, eps, {}, now)
            t0 = clock()
            pending = tokens.prepare(ctx, sched)
            assert pending is None  # the local tokenizer is loaded: never an awaitable here
            result = sched.schedule(ctx)  # type: ignore[attr-defined]
            sched.pre_request(ctx, result)  # type: ignore[attr-defined]
            out[label].append((clock() - t0) / 1e3)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    q = args.quick
    print("## precise index memory (tracemalloc)\n")
    print("| endpoints | blocks each | layout | distinct keys | bytes per held block | MB per endpoint |")
    print("|---|---|---|---|---|---|")
    for eps, blocks in ((8, 8192),) if q else ((64, 16384), (8, 65536)):
        for shared, label in ((0.0, "unique"), (0.25, "25% shared")):
            per_block, per_ep, keys = bench_memory(eps, blocks, shared)
            print(f"| {eps} | {blocks:,} | {label} | {keys:,} | {per_block:.0f} | {per_ep:.1f} |")
    print("\n## event apply, one core (decode_message + apply_events; process time)\n")
    print("| encoding | endpoints | engine cache (blocks) | block events | orphaned blocks | block events/s |")
    print("|---|---|---|---|---|---|")
    steps = 2000 if q else 20000
    for enc in ("array", "map"):
        rate, events, orphans = bench_apply(enc, 16, steps, 4096, 1 if q else 3)
        print(f"| {enc} | 16 | 4,096 | {events:,} | {orphans} | {rate:,.0f} |")
    zmq_rate = asyncio.run(bench_zmq(steps // 2, 4096))
    print(f"\nEnd to end over ZMQ (publisher and subscriber in one process, wall time): {zmq_rate:,.0f} block "
          "events/s\n")
    import tempfile

    print("## per request at 64 endpoints (µs, median; p90 in brackets)\n")
    with tempfile.TemporaryDirectory() as tmp:
        r = bench_request(64, 100 if q else 500, 6000, 1200, Path(tmp))
    def med(k: str) -> str:
        v = sorted(r[k])
        return f"{statistics.median(v):,.0f} [{v[int(0.9 * (len(v) - 1))]:,.0f}]"
    print("| prompt tokens | matched blocks | tokenize (local HF + template) | keys | match | precise total "
          "| approx tokenize | approximate index lookup |")
    print("|---|---|---|---|---|---|---|---|")
    print(f"| {statistics.median(r['tokens']):,.0f} | {statistics.median(r['matched']):,.0f} | "
          f"{med('tokenize_local')} | {med('keys')} | {med('match')} | {med('precise_total')} | "
          f"{med('tokenize_approx')} | {med('approx_index_total')} |")
    print("\n## the whole decision at 64 endpoints: tokenize (if read) + schedule + pre_request "
          "(µs, median [p90])\n")
    with tempfile.TemporaryDirectory() as tmp:
        d = bench_decision(64, 100 if q else 400, 6000, 1200, Path(tmp))
    print("| config | tokenizes | µs per decision |")
    print("|---|---|---|")
    for label, xs in d.items():
        v = sorted(xs)
        reads = "yes (local)" if "precise" in label else "no"
        print(f"| {label} | {reads} | {statistics.median(v):,.0f} [{v[int(0.9 * (len(v) - 1))]:,.0f}] |")


if __name__ == "__main__":
    main()
