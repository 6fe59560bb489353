"""Token keys and the precise prefix index (pure): events in, matches out."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduling.prefix.precise import CPU, GPU, LIVE, MALFORMED, ORPHAN, PENDING, UNKNOWN, PreciseIndex
from scheduling.prefix.token_keys import ROOT, chain_keys, extend_chain, pack_tokens, root_key

TOKS = list(range(1000, 1100))


# ---- token keys ------------------------------------------------------------------------------------------
def test_chain_keys_are_prefix_stable_and_full_blocks_only() -> None:
    full = chain_keys(TOKS, 16)
    assert len(full) == 6  # 100 tokens -> 6 full blocks, the partial one has no key
    assert chain_keys(TOKS[:50], 16) == full[:3]
    assert chain_keys(TOKS, 16, max_blocks=2) == full[:2]
    assert chain_keys(TOKS[:15], 16) == []
    assert len(set(full)) == 6
    other = list(TOKS)
    other[0] += 1
    assert not set(chain_keys(other, 16)) & set(full)  # chained: one different token changes every key


def test_lora_is_part_of_the_key() -> None:
    assert chain_keys(TOKS, 16, lora="sql-lora") != chain_keys(TOKS, 16)
    assert chain_keys(TOKS, 16, lora="a") != chain_keys(TOKS, 16, lora="b")
    assert root_key(None) == ROOT != root_key("a")


def test_token_ids_outside_32_bits_are_reduced_not_rejected() -> None:
    assert pack_tokens([2**32 + 5]) == pack_tokens([5])
    assert pack_tokens([-1]) == pack_tokens([2**32 - 1])


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 50_000), min_size=0, max_size=120), st.integers(1, 9),
       st.lists(st.integers(1, 20), min_size=1, max_size=30))
def test_extend_chain_over_any_split_equals_chain_keys(tokens: list[int], bs: int, cuts: list[int]) -> None:
    parent, tail, got, i = ROOT, b"", [], 0
    for c in cuts * 10:
        if i >= len(tokens):
            break
        keys, parent, tail = extend_chain(parent, tail, pack_tokens(tokens[i : i + c]), bs)
        got += keys
        i += c
    if i < len(tokens):
        keys, parent, tail = extend_chain(parent, tail, pack_tokens(tokens[i:]), bs)
        got += keys
    assert got == chain_keys(tokens, bs)


# ---- the index -----------------------------------------------------------------------------------------
def _store_chain(idx: PreciseIndex, ep: str, tokens: list[int], eb: int, per_event: int, rank: int = 0,
                 medium: int = GPU, lora: str | None = None, base: int = 0) -> list[int]:
    """Store `tokens`' full engine blocks of size `eb`, `per_event` blocks per BlockStored; returns the hashes."""
    n = len(tokens) // eb
    hashes = [base + i + 1 for i in range(n)]
    for start in range(0, n, per_event):
        hs = hashes[start : start + per_event]
        parent = hashes[start - 1] if start else None
        got = idx.store(ep, rank, hs, parent, tokens[start * eb : (start + len(hs)) * eb], eb, lora, medium)
        assert got == len(hs)
    return hashes


def test_store_match_remove() -> None:
    idx = PreciseIndex(block_size=16)
    hashes = _store_chain(idx, "a", TOKS, 16, per_event=4)
    keys = idx.keys_for(TOKS)
    m = idx.match(keys)["a"]
    assert (m.blocks, m.gpu, m.cpu, m.speculative, m.score, m.rank) == (6, 6, 0, 0, 6.0, 0)
    assert m.state == PENDING and m.from_events == 6
    assert idx.remove("a", 0, [hashes[3]]) == 1
    assert idx.match(keys)["a"].blocks == 3  # consecutive from the start only
    assert idx.remove("a", 0, [hashes[0]]) == 1
    assert "a" not in idx.match(keys)
    assert idx.remove("a", 0, [999]) == 0 and idx.counters["unknown_removals"] == 1


@pytest.mark.parametrize("eb", [1, 2, 3, 5, 16, 32, 48])
def test_engine_block_size_need_not_match(eb: int) -> None:
    idx = PreciseIndex(block_size=16)
    tokens = list(range(5000, 5000 + 10 * 48))
    _store_chain(idx, "a", tokens, eb, per_event=3)
    full = len(tokens) // eb * eb  # tokens the engine cached
    assert idx.match(idx.keys_for(tokens))["a"].blocks == full // 16


def test_removal_of_a_large_engine_block_drops_all_its_keys() -> None:
    idx = PreciseIndex(block_size=16)
    tokens = list(range(64))
    hashes = _store_chain(idx, "a", tokens, 32, per_event=2)
    assert idx.match(idx.keys_for(tokens))["a"].blocks == 4
    idx.remove("a", 0, [hashes[1]])
    assert idx.match(idx.keys_for(tokens))["a"].blocks == 2


def test_orphans_and_malformed_events_are_dropped_and_counted() -> None:
    idx = PreciseIndex(block_size=4)
    assert idx.store("a", 0, [5, 6], 4, list(range(8)), 4) == ORPHAN
    assert idx.counters["orphaned"] == 2 and len(idx) == 0
    assert idx.store("a", 0, [5, 6, 7], None, list(range(8)), 4) == MALFORMED
    assert idx.counters["malformed"] == 1 and len(idx) == 0


def test_duplicate_stores_need_as_many_removals() -> None:
    idx = PreciseIndex(block_size=4)
    idx.store("a", 0, [1], None, [1, 2, 3, 4], 4)
    idx.store("a", 0, [1], None, [1, 2, 3, 4], 4)  # a second physical block with the same content
    keys = idx.keys_for([1, 2, 3, 4])
    idx.remove("a", 0, [1])
    assert idx.match(keys)["a"].blocks == 1
    idx.remove("a", 0, [1])
    assert idx.match(keys) == {}


def test_lora_blocks_match_only_lora_requests() -> None:
    idx = PreciseIndex(block_size=16)
    _store_chain(idx, "a", TOKS, 16, per_event=6, lora="sql-lora")
    assert idx.match(idx.keys_for(TOKS)) == {}
    assert idx.match(idx.keys_for(TOKS, "sql-lora"))["a"].blocks == 6


def test_media_weights_and_tier_updates() -> None:
    idx = PreciseIndex(block_size=16, gpu_weight=1.0, cpu_weight=0.8)
    hashes = _store_chain(idx, "a", TOKS, 16, per_event=6)
    keys = idx.keys_for(TOKS)
    # offloaded to CPU without tokens (a tier update), then evicted from the GPU tail-first
    assert idx.store("a", 0, hashes, None, [], 16, None, CPU) == 6
    idx.remove("a", 0, hashes[3:], GPU)
    m = idx.match(keys)["a"]
    assert (m.blocks, m.gpu, m.cpu) == (6, 3, 3) and m.score == pytest.approx(3 + 3 * 0.8)
    assert idx.size("a", GPU) == 3 and idx.size("a", CPU) == 6
    # a CPU block's successor can chain from it
    idx.remove("a", 0, hashes[5:], CPU)
    assert idx.store("a", 0, [77], hashes[4], TOKS[80:96], 16, None, CPU) == 1
    assert idx.match(keys)["a"].cpu == 3


def test_speculative_entries_confirmation_and_ttl() -> None:
    idx = PreciseIndex(block_size=16, speculative_ttl=2.0)
    keys = idx.keys_for(TOKS)
    assert idx.add_speculative("b", keys[:4], now=10.0) == 4
    m = idx.match(keys, now=10.5)["b"]
    assert (m.blocks, m.speculative, m.gpu, m.score) == (4, 4, 0, 4.0)
    _store_chain(idx, "b", TOKS[:32], 16, per_event=2)  # events confirm the first two
    m = idx.match(keys, now=11.0)["b"]
    assert (m.blocks, m.gpu, m.speculative) == (4, 2, 2) and idx.counters["confirmed"] == 2
    m = idx.match(keys, now=12.5)["b"]  # the unconfirmed two lapsed
    assert (m.blocks, m.gpu, m.speculative) == (2, 2, 0) and idx.counters["lapsed"] == 2
    assert idx.add_speculative("b", keys[:2], now=13.0) == 0  # already held by events


def test_speculative_refresh_outlives_the_first_expiry() -> None:
    idx = PreciseIndex(block_size=16, speculative_ttl=2.0)
    keys = idx.keys_for(TOKS)
    idx.add_speculative("b", keys[:2], now=0.0)
    idx.add_speculative("b", keys[:2], now=1.5)
    assert idx.match(keys, now=2.5)["b"].speculative == 2
    assert idx.match(keys, now=3.6) == {}


def test_states_clear_and_unknown() -> None:
    idx = PreciseIndex(block_size=16)
    _store_chain(idx, "a", TOKS, 16, per_event=6)
    idx.add_speculative("a", idx.keys_for(list(range(64))), now=0.0)
    assert idx.state("a") == PENDING and idx.state("zz") is None
    idx.clear("a", 0)  # AllBlocksCleared: nothing held, speculative entries gone too, live
    assert idx.state("a") == LIVE and idx.match(idx.keys_for(TOKS)) == {} and len(idx) == 0
    _store_chain(idx, "a", TOKS, 16, per_event=6)
    idx.mark_unknown("a", 0)
    assert idx.state("a") == UNKNOWN and idx.size("a") == 0 and len(idx) == 0
    _store_chain(idx, "a", TOKS, 16, per_event=6)  # later events still apply while unknown
    m = idx.match(idx.keys_for(TOKS))["a"]
    assert m.blocks == 6 and m.state == UNKNOWN
    idx.set_state("a", 1, LIVE)
    assert idx.state("a") == UNKNOWN and idx.slot_states("a") == {0: UNKNOWN, 1: LIVE}
    assert idx.states() == {"a": UNKNOWN}
    with pytest.raises(ValueError):
        idx.set_state("a", 0, "bogus")


def test_data_parallel_ranks_are_kept_apart() -> None:
    idx = PreciseIndex(block_size=16)
    _store_chain(idx, "a", TOKS, 16, per_event=6, rank=0)
    _store_chain(idx, "a", TOKS[:48], 16, per_event=3, rank=1, base=100)
    keys = idx.keys_for(TOKS)
    assert idx.match(keys)["a"].rank == 0 and idx.match(keys)["a"].blocks == 6
    idx.remove("a", 0, [3])  # rank 0 loses block 3; rank 1 still has 0..2
    m = idx.match(keys)["a"]
    assert (m.blocks, m.rank) in ((3, 0), (3, 1))
    idx.clear("a", 0)
    m = idx.match(keys)["a"]
    assert (m.blocks, m.rank) == (3, 1)


def test_capacity_drops_the_least_recently_stored() -> None:
    idx = PreciseIndex(block_size=4, capacity=5)
    _store_chain(idx, "a", list(range(100, 132)), 4, per_event=1)  # 8 blocks, chain
    assert idx.size("a") == 5 and idx.counters["evicted"] == 3
    assert idx.match(idx.keys_for(list(range(100, 132)))) == {}  # the head went first
    idx.set_capacity("a", 2)
    assert idx.size("a") == 2


def test_churn_keeps_the_order_queue_bounded() -> None:
    idx = PreciseIndex(block_size=4, capacity=1000)
    for i in range(5000):
        idx.store("a", 0, [i + 1], None, [i, i, i, i], 4)
        idx.remove("a", 0, [i + 1])
    slot = idx.holders.find("a", 0)
    assert slot is not None
    assert len(slot.orders[GPU]) < 200 and idx.size("a") == 0 and len(idx) == 0


def test_forget_frees_the_slot_without_leaking_bits() -> None:
    idx = PreciseIndex(block_size=16)
    _store_chain(idx, "a", TOKS, 16, per_event=6)
    _store_chain(idx, "b", TOKS, 16, per_event=6, base=50)
    idx.add_speculative("a", idx.keys_for(list(range(64))), now=0.0)
    idx.forget("a")
    assert "a" not in idx.endpoints() and set(idx.match(idx.keys_for(TOKS))) == {"b"}
    _store_chain(idx, "c", TOKS[:16], 16, per_event=1)  # reuses a's slot number
    assert idx.match(idx.keys_for(TOKS))["c"].blocks == 1
    idx.forget("b")
    idx.forget("c")
    assert len(idx) == 0


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**32))
def test_match_agrees_with_a_naive_model(seed: int) -> None:
    """Random stores, removals, clears and speculative picks on several endpoints and ranks, compared with sets."""
    rng = random.Random(seed)
    bs = 4
    prompts = [[rng.randrange(20) for _ in range(bs * rng.randrange(1, 6))] for _ in range(6)]
    idx = PreciseIndex(block_size=bs, speculative_ttl=5.0)
    held: dict[tuple[str, int, int], dict[int, int]] = {}  # (ep, rank, medium) -> engine hash -> key
    count: dict[tuple[str, int, int, int], int] = {}  # stores not yet matched by a removal
    spec: dict[str, dict[int, float]] = {}
    now = 0.0
    for _ in range(60):
        now += rng.random()
        ep, rank, medium = rng.choice("abc"), rng.randrange(2), rng.choice((GPU, CPU))
        op = rng.random()
        p = rng.choice(prompts)
        keys = chain_keys(p, bs)
        hashes = [hash(("h", tuple(p[: (i + 1) * bs]))) & 0xFFFFFFFF for i in range(len(keys))]
        if op < 0.5:
            if idx.store(ep, rank, hashes, None, p, bs, None, medium) >= 0:
                held.setdefault((ep, rank, medium), {}).update(zip(hashes, keys, strict=True))
                for h in hashes:
                    count[(ep, rank, medium, h)] = count.get((ep, rank, medium, h), 0) + 1
                for k in keys:
                    spec.get(ep, {}).pop(k, None)
        elif op < 0.75:
            gone = rng.sample(hashes, rng.randrange(len(hashes) + 1))
            idx.remove(ep, rank, gone, medium)
            for h in gone:
                c = count.get((ep, rank, medium, h), 0)
                if c > 1:
                    count[(ep, rank, medium, h)] = c - 1
                else:
                    count.pop((ep, rank, medium, h), None)
                    held.get((ep, rank, medium), {}).pop(h, None)
        elif op < 0.85:
            idx.clear(ep, rank)
            held.pop((ep, rank, GPU), None)
            held.pop((ep, rank, CPU), None)
            count = {k: v for k, v in count.items() if k[:2] != (ep, rank)}
            spec.pop(ep, None)
        else:
            have = {k for (e, _, _), m in held.items() if e == ep for k in m.values()}
            idx.add_speculative(ep, keys, now)
            for k in keys:
                if k not in have:
                    spec.setdefault(ep, {})[k] = now + 5.0
        # compare on every prompt
        for q in prompts:
            qk = chain_keys(q, bs)
            got = {e: m.blocks for e, m in idx.match(qk, now).items()}
            want = {}
            for e in "abc":
                live_spec = {k for k, t in spec.get(e, {}).items() if t > now}
                best = 0
                for r in range(2):
                    ks = set(held.get((e, r, GPU), {}).values()) | set(held.get((e, r, CPU), {}).values())
                    n = 0
                    for k in qk:
                        if k not in ks and k not in live_spec:
                            break
                        n += 1
                    best = max(best, n)
                if best:
                    want[e] = best
            assert got == want


def test_ending_a_request_shortens_its_speculative_entries_and_never_extends_them() -> None:
    idx = PreciseIndex(block_size=16, speculative_ttl=2.0)
    keys = idx.keys_for(list(range(64)))
    idx.add_speculative("a", keys, now=0.0, ttl=600.0)  # held while the request runs
    idx.add_speculative("b", keys[:2], now=0.0)  # another endpoint, the default TTL
    assert idx.end_speculative("a", keys, now=50.0) == 4
    assert idx.match(keys, now=51.9)["a"].speculative == 4
    assert "a" not in idx.match(keys, now=52.1)
    assert idx.end_speculative("b", keys[:2], now=1.0, ttl=5.0) == 0  # 1 + 5 is later than its own 2: unchanged
    assert "b" not in idx.match(keys, now=2.1)
    assert idx.counters["lapsed"] == 6
