"""Prompt hashing, the bounded prefix index, and prefix routing."""

from __future__ import annotations

import random

import pytest
import xxhash
from sched_helpers import GIE_DEFAULT, ctx, ep, match, req

from scheduling.api import SchedulingResult
from scheduling.config import load_scheduler
from scheduling.prefix import PrefixIndex, StreamingBlockHasher, block_hashes, chain_seed


def test_hash_formula():
    prompt = "a" * 64 + "b" * 64 + "tail"
    seed = xxhash.xxh3_64_intdigest(b"llama\0salt")
    assert chain_seed("llama", "salt") == seed
    h0 = xxhash.xxh3_64_intdigest(b"a" * 64, seed)
    h1 = xxhash.xxh3_64_intdigest(b"b" * 64, h0)
    h2 = xxhash.xxh3_64_intdigest(b"tail", h1)  # trailing partial block included
    assert block_hashes(prompt, "llama", "salt") == [h0, h1, h2]
    # a long ASCII prompt (cut by several unpacks) equals the block-by-block definition
    long = "".join(chr(33 + i % 90) for i in range(64 * 600 + 5))
    want, prev = [], chain_seed("m")
    for i in range(0, 64 * 600, 64):
        prev = xxhash.xxh3_64_intdigest(long[i : i + 64].encode(), prev)
        want.append(prev)
    assert block_hashes(long, "m", max_blocks=1000) == want + [xxhash.xxh3_64_intdigest(long[-5:].encode(), prev)]


def test_hash_limits_and_unicode():
    assert len(block_hashes("x" * 64 * 300, "m")) == 256
    assert len(block_hashes("x" * 64 * 300, "m", max_blocks=10)) == 10
    assert block_hashes("", "m") == []
    assert len(block_hashes("x" * 32 * 4, "m", block_tokens=8)) == 4
    # characters, not bytes: 64 two-byte characters are one block
    uni = "é" * 64 + "z"
    hs = block_hashes(uni, "m")
    assert len(hs) == 2
    assert hs[0] == xxhash.xxh3_64_intdigest(("é" * 64).encode(), chain_seed("m"))
    # an ASCII block hashes the same whether the rest of the prompt is ASCII or not
    assert block_hashes("a" * 64 + "é", "m")[0] == block_hashes("a" * 64 + "e", "m")[0]
    # model and salt separate the chains, and the separator keeps them apart
    assert block_hashes("abc", "m1") != block_hashes("abc", "m2")
    assert block_hashes("abc", "m", "s1") != block_hashes("abc", "m", "s2")
    assert chain_seed("ab", "c") != chain_seed("a", "bc")
    # a lone surrogate (a streaming scanner may decode one from an escape) is hashed, not an error
    assert len(block_hashes("\ud800" * 70, "m")) == 2


def test_index_consecutive_match():
    idx = PrefixIndex(100)
    idx.record("a", [1, 2, 3, 4])
    idx.record("b", [1, 2])
    idx.record("c", [2, 3, 4])  # no first block
    assert match(idx, [1, 2, 3, 4, 5]) == {"a": 4, "b": 2}
    assert match(idx, [9, 1]) == {}
    assert match(idx, []) == {}


def test_index_lru_capacity_clock():
    idx = PrefixIndex(3)
    idx.record("a", [1, 2, 3])
    idx.record("a", [1])  # touch 1
    idx.record("a", [4])  # evicts 2 (oldest unreferenced), 1 got a second chance
    assert idx.size("a") == 3
    assert idx.holds("a", 1) and not idx.holds("a", 2) and idx.holds("a", 3) and idx.holds("a", 4)
    idx.record("a", [5, 6, 7])
    assert idx.size("a") == 3 and len(idx) == 3


def test_index_shared_block_eviction_is_per_endpoint():
    idx = PrefixIndex(2)
    idx.record("a", [1, 2])
    idx.record("b", [1, 2])
    idx.record("a", [3, 4])
    assert not idx.holds("a", 1) and idx.holds("b", 1)
    assert match(idx, [1, 2]) == {"b": 2}
    idx.forget("b")
    assert match(idx, [1, 2]) == {} and len(idx) == 2


def test_index_set_capacity_shrinks():
    idx = PrefixIndex(10)
    idx.record("a", list(range(1, 11)))
    idx.set_capacity("a", 4)
    assert idx.size("a") == 4 and len(idx) == 4


def test_index_bounded_by_capacity():
    idx = PrefixIndex(500)
    rnd = random.Random(1)
    for e in range(20):
        for _ in range(10):
            idx.record(f"e{e}", [rnd.getrandbits(64) for _ in range(256)])
    assert all(idx.size(f"e{e}") == 500 for e in range(20))
    assert len(idx) == 20 * 500
    assert sum(len(r) for r in idx._rings) == 20 * 500


def test_repeated_system_prompt_goes_back_to_same_endpoint():
    sched = load_scheduler(GIE_DEFAULT, rng=random.Random(3))
    eps = [ep(i, waiting=1, kv=0.3) for i in range(16)]
    system = "You are a helpful assistant. " * 60  # ~1.7 KB shared prefix
    c = ctx(req(system + "first question"), eps)
    first = sched.schedule(c)
    sched.pre_request(c, first)
    for i in range(5):
        c = ctx(req(system + f"another question {i}", rid=f"r{i}"), eps)
        res = sched.schedule(c)
        assert res.primary.key == first.primary.key
        sched.pre_request(c, res)


def test_prefix_recorded_for_prefill_endpoint():
    sched = load_scheduler(GIE_DEFAULT, rng=random.Random(3))
    fs = sched.fallback
    prefix = fs.profiles["default"].scorers[2][0]
    d, p = ep(1), ep(2)
    c = ctx(req("x" * 640), [d, p])
    fs.pre_request(c, SchedulingResult(targets=[d], prefill=p, state={}))
    assert match(prefix.prefix.index, block_hashes("x" * 640, "llama")) == {d.key: 10, p.key: 10}


def test_capacity_autotuned_from_metrics():
    sched = load_scheduler(GIE_DEFAULT, rng=random.Random(3))
    prefix = sched.fallback.profiles["default"].scorers[2][0]
    e = ep(1, num_gpu_blocks=1000, block_size=32)
    c = ctx(req("hello" * 30), [e])
    sched.pre_request(c, sched.schedule(c))
    assert prefix.prefix.index.capacity(e.key) == 1000 * 32 // 16


from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from scheduling.prefix import BlockHasher  # noqa: E402


@settings(max_examples=80, deadline=None)
@given(
    prompt=st.text(max_size=2000),
    bt=st.integers(1, 8),
    maxb=st.integers(0, 40),
    steps=st.lists(st.integers(0, 50), max_size=4),
)
def test_lazy_hasher_equals_block_hashes(prompt, bt, maxb, steps):
    want = block_hashes(prompt, "m", "s", bt, maxb)
    lazy = BlockHasher(prompt, "m", "s", bt, maxb)
    for k in steps:
        assert lazy.upto(k) == want[: max(len(lazy.hashes), min(k, len(want)))]
    assert lazy.all() == want and lazy.total == len(want)


@settings(max_examples=80, deadline=None)
@given(
    n_blocks=st.integers(1, 120),
    held=st.lists(st.tuples(st.integers(0, 5), st.integers(0, 120), st.integers(0, 120)), max_size=12),
    holes=st.lists(st.tuples(st.integers(0, 5), st.integers(0, 120)), max_size=4),
)
def test_lazy_match_equals_full_match(n_blocks, held, holes):
    prompt = "".join(chr(97 + (i * 7) % 26) * 8 for i in range(n_blocks * 2))  # 16 chars per block
    hs = block_hashes(prompt, "m", block_tokens=4)
    idx = PrefixIndex(1000)
    for e, a, b in held:
        idx.record(f"e{e}", hs[: min(a, b)])
    for e, pos in holes:
        if pos < len(hs) and idx.holds(f"e{e}", hs[pos]):
            idx.forget(f"e{e}")
    want = match(idx, hs)
    assert idx.match_lazy(BlockHasher(prompt, "m", block_tokens=4), chunk=3) == want
    assert idx.match_lazy(BlockHasher(prompt, "m", block_tokens=4)) == want


def test_departed_endpoints_are_forgotten():
    sched = load_scheduler(GIE_DEFAULT, rng=random.Random(3))
    prefix = sched.fallback.profiles["default"].scorers[2][0]
    old, new = ep(1), ep(2)
    c = ctx(req("z" * 640), [old], now=0.0)
    sched.pre_request(c, sched.schedule(c))
    assert prefix.prefix.index.size(old.key) == 10
    for i in range(600):  # the old pod is gone unreported; 900 s later the producer's periodic sweep drops it
        c = ctx(req(f"q{i}"), [new], now=1000.0 + i)
        sched.pre_request(c, sched.schedule(c))
    assert prefix.prefix.index.size(old.key) == 0 and old.key not in prefix.prefix.index.endpoints()
    c = ctx(req("y" * 640), [new], now=2000.0)
    sched.pre_request(c, sched.schedule(c))
    sched.endpoint_removed(new.key)
    assert prefix.prefix.index.endpoints() == [] and sched.tracked_endpoints() == set()


@settings(max_examples=80, deadline=None)
@given(
    ops=st.lists(
        st.tuples(st.sampled_from(["record", "capacity", "forget"]), st.integers(0, 3),
                  st.lists(st.integers(0, 40), max_size=12), st.integers(1, 10)),
        max_size=30,
    )
)
def test_room_is_capacity_minus_held_after_every_change(ops):
    idx = PrefixIndex(8)
    for op, e, hashes, cap in ops:
        key = f"e{e}"
        if op == "record":
            idx.record(key, hashes)
        elif op == "capacity":
            idx.set_capacity(key, cap)
        else:
            idx.forget(key)
        assert dict(idx.room()) == {k: idx.capacity(k) - idx.size(k) for k in idx.endpoints()}
        assert all(v >= 0 for v in idx.room().values())


@settings(max_examples=200, deadline=None)
@given(
    parts=st.lists(st.text(alphabet=st.one_of(st.characters(), st.sampled_from("abc xyz")), max_size=300),
                   max_size=12),
    bt=st.integers(1, 6),
    maxb=st.integers(0, 30),
)
def test_streaming_hasher_equals_block_hashes(parts, bt, maxb):
    """Fed in arbitrary pieces (non-ASCII text split anywhere), the chain equals block_hashes of the whole text; each
    complete block is hashed by the feed that completes it."""
    text = "".join(parts)
    want = block_hashes(text, "m", "s", bt, maxb)
    sh = StreamingBlockHasher("m", "s", bt, maxb)
    seen = 0
    for part in parts:
        added = sh.feed(part)
        seen += len(part)
        complete = min(seen // (bt * 4), maxb)
        assert added >= 0 and len(sh.hashes) == complete
        assert sh.hashes == want[:complete]
        assert sh.pending == (seen - complete * bt * 4 if complete < maxb else 0)
    assert sh.finish() == want
    assert sh.finish() == want  # idempotent


def test_streaming_hasher_refuses_text_after_finish():
    sh = StreamingBlockHasher("m")
    sh.feed("x" * 70)
    assert sh.finish() == block_hashes("x" * 70, "m")
    with pytest.raises(ValueError, match="after finish"):
        sh.feed("more")
