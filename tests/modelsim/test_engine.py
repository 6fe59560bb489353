"""Deterministic engine tests: the clock is just a float we pass in."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from modelsim.config import EngineConfig
from modelsim.engine import Engine, PromptTooLong, QueueFull, SimRequest

CFG = EngineConfig()


def toks(prefix: int, n: int) -> list[int]:
    """n tokens whose first ones depend only on `prefix` (distinct groups never share a block)."""
    return [prefix * 1_000_000 + i for i in range(n)]


def run_until_idle(e: Engine, t: float = 0.0, limit: int = 1_000_000) -> float:
    for _ in range(limit):
        nt = e.next_event_time()
        if nt is None:
            return t
        t = nt
        e.advance(t)
    raise AssertionError("engine did not go idle")


def test_ttft_formula_single_request() -> None:
    e = Engine(CFG)
    s = e.submit(SimRequest("a", toks(1, 1000), 4), 0.0)
    run_until_idle(e)
    assert s.ttft == pytest.approx(0.030 + 1000 * 0.000250)
    assert s.e2e == pytest.approx(s.ttft + 3 * 0.012)


def test_prefix_hit_cuts_ttft_by_cached_tokens_times_prefill_cost() -> None:
    e = Engine(CFG)
    shared = toks(7, 1600)
    a = e.submit(SimRequest("a", shared + toks(8, 40), 2), 0.0)
    t = run_until_idle(e)
    b = e.submit(SimRequest("b", shared + toks(9, 40), 2), t + 1.0)
    run_until_idle(e, t + 1.0)
    assert a.cached_tokens == 0
    assert b.cached_tokens == 1600  # 100 full shared blocks
    assert a.ttft - b.ttft == pytest.approx(1600 * CFG.prefill_per_token)
    assert e.stats.prefix_hits == 1600 and e.stats.prefix_queries == 2 * 1640


def test_full_prompt_hit_still_recomputes_last_block() -> None:
    e = Engine(CFG)
    p = toks(3, 320)  # exactly 20 blocks
    e.submit(SimRequest("a", p, 1), 0.0)
    run_until_idle(e)
    b = e.submit(SimRequest("b", p, 1), 10.0)
    assert b.cached_tokens == 304


def test_requests_queue_past_max_num_seqs_and_fifo() -> None:
    e = Engine(EngineConfig(max_num_seqs=4))
    seqs = [e.submit(SimRequest(str(i), toks(i, 64), 10), 0.0) for i in range(7)]
    assert len(e.running) == 4 and len(e.waiting) == 3
    assert [s.req.request_id for s in e.waiting] == ["4", "5", "6"]
    run_until_idle(e)
    assert all(s.finish_reason == "length" for s in seqs)
    first_done = min(s.finished_at for s in seqs[:4])
    assert seqs[4].admitted_at == pytest.approx(first_done)
    assert seqs[4].queue_time > 0 and seqs[0].queue_time == 0


def test_queue_limit_raises_queue_full() -> None:
    e = Engine(EngineConfig(max_num_seqs=1, max_waiting=2))
    for i in range(3):
        e.submit(SimRequest(str(i), toks(i, 16), 5), 0.0)
    with pytest.raises(QueueFull):
        e.submit(SimRequest("x", toks(9, 16), 5), 0.0)


def test_load_factor_scales_ttft() -> None:
    e = Engine(CFG)
    for i in range(15):
        e.submit(SimRequest(str(i), toks(i, 100), 50), 0.0)
    last = e.submit(SimRequest("last", toks(99, 100), 50), 0.0)
    e.advance(1.0)
    assert last.ttft == pytest.approx((0.030 + 100 * 0.000250) * 2.0)


def test_eviction_under_pressure_lru_unreferenced_only() -> None:
    e = Engine(EngineConfig(kv_cache_size=64, max_num_seqs=4))
    t = 0.0
    for g in range(10):  # each group 20 blocks; 10 groups = 200 blocks >> 64
        e.submit(SimRequest(str(g), toks(g, 320), 1), t)
        t = run_until_idle(e, t) + 0.1
    assert e.kv.evictions > 0
    assert e.kv.cached_blocks <= 64
    # the most recent group is still cached, the oldest is gone
    assert e.probe(toks(9, 320)) == 304
    assert e.probe(toks(0, 320)) == 0


def test_running_blocks_are_never_evicted() -> None:
    e = Engine(EngineConfig(kv_cache_size=48, max_num_seqs=4))
    long = e.submit(SimRequest("long", toks(1, 320), 400), 0.0)  # holds 21+ blocks for a while
    t = 0.0
    for g in range(2, 8):  # 10-block requests that finish quickly and must evict each other
        e.submit(SimRequest(str(g), toks(g, 160), 1), t)
        for _ in range(3):
            nt = e.next_event_time()
            t = nt if nt is not None else t
            e.advance(t)
    assert e.kv.evictions > 0
    assert long.state == "running"
    assert e.kv.match(long.hashes) == len(long.hashes) == 19


def test_preemption_when_cache_full() -> None:
    e = Engine(EngineConfig(kv_cache_size=24, max_num_seqs=4))
    a = e.submit(SimRequest("a", toks(1, 150), 100), 0.0)
    b = e.submit(SimRequest("b", toks(2, 150), 100), 0.0)
    run_until_idle(e)
    assert e.stats.preemptions > 0
    assert a.generated == 100 and b.generated == 100
    assert e.kv.used == 0


def test_oversized_request_rejected() -> None:
    e = Engine(EngineConfig(kv_cache_size=4))
    with pytest.raises(PromptTooLong):
        e.submit(SimRequest("a", toks(1, 100), 1), 0.0)


def test_lora_requests_that_fit_go_first() -> None:
    e = Engine(EngineConfig(max_num_seqs=2, max_loras=1))
    e.submit(SimRequest("a", toks(1, 32), 50, lora="A"), 0.0)
    e.submit(SimRequest("blocker", toks(2, 32), 5, lora="A"), 0.0)
    b = e.submit(SimRequest("b", toks(3, 32), 5, lora="B"), 0.0)
    a2 = e.submit(SimRequest("a2", toks(4, 32), 5, lora="A"), 0.0)
    t = e.next_event_time()
    while a2.state == "waiting":
        e.advance(t)
        t = e.next_event_time()
    assert b.state == "waiting"  # B cannot load while A is active with max_loras=1
    run_until_idle(e, t)
    assert b.admitted_at > a2.admitted_at


def test_pd_prefill_one_token_and_decode_transfer_ttft() -> None:
    e = Engine(CFG)
    p = e.submit(SimRequest("p", toks(1, 800), 50, remote_decode=True), 0.0)
    d = e.submit(SimRequest("d", toks(2, 800), 5, remote_prefill=True), 0.0)
    run_until_idle(e)
    assert p.generated == 1 and p.finish_reason == "remote_decode"
    assert d.ttft == pytest.approx(CFG.kv_transfer_overhead + 800 * CFG.kv_transfer_per_token)


def test_hit_on_blocks_still_prefilling_waits_for_them() -> None:
    e = Engine(CFG)
    shared = toks(5, 1600)
    a = e.submit(SimRequest("a", shared + [1], 1), 0.0)
    b = e.submit(SimRequest("b", shared + [2], 1), 0.01)
    run_until_idle(e)
    assert b.cached_tokens == 1600
    assert b.first_token_at >= a.first_token_at


def test_cancel_frees_blocks() -> None:
    e = Engine(CFG)
    s = e.submit(SimRequest("a", toks(1, 100), 100), 0.0)
    assert e.kv.used > 0
    e.cancel(s, 0.1)
    assert e.kv.used == 0 and not e.running


def test_chain_with_evicted_head_is_restored_without_leaking_blocks() -> None:
    from modelsim.kvcache import KVCache, block_hashes

    kv = KVCache(capacity=6, block_size=4)
    toks_a = list(range(12))
    ha = block_hashes(toks_a, 4)  # 3 blocks
    assert kv.acquire(ha, 0, 0, 0.0, toks_a)
    kv.release(ha, 0)
    kv._lru.move_to_end(ha[0], last=False)  # make the head the oldest
    assert kv.acquire([], 0, 4, 0.0, [])  # 3 fresh blocks + evicts the head
    assert not kv.contains(ha[0]) and kv.contains(ha[1]) and kv.contains(ha[2])
    kv.release([], 4)
    assert kv.match(ha) == 0
    assert kv.acquire(ha, 0, 1, 0.0, toks_a)  # head re-stored, the cached tail re-referenced
    assert kv.private == 1 and kv.used == 4 and kv.cached_blocks == 3
    kv.release(ha, 1)
    assert kv.private == 0 and kv.used == 0 and kv.free == 6


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5), st.integers(1, 120), st.integers(1, 40), st.booleans()),
                min_size=1, max_size=40))
def test_block_accounting_invariants(ops: list[tuple[int, int, int, bool]]) -> None:
    e = Engine(EngineConfig(kv_cache_size=40, block_size=4, max_num_seqs=3, max_waiting=100))
    t = 0.0
    seqs = []
    for group, n_prompt, n_out, cancel in ops:
        try:
            seqs.append(e.submit(SimRequest("r", toks(group, n_prompt), n_out), t))
        except PromptTooLong:
            pass
        t += 0.05
        e.advance(t)
        if cancel and seqs:
            e.cancel(seqs[len(seqs) // 2], t)
        assert e.kv.private == sum(s.n_private for s in e.running)
        held = Counter(h for s in e.running for h in s.hashes)
        assert all(e.kv._blocks[h].ref == n for h, n in held.items())
        assert 0 <= e.kv.used <= e.kv.capacity and e.kv.cached_blocks + e.kv.private <= e.kv.capacity
    run_until_idle(e, t)
    assert e.kv.used == 0 and e.kv.private == 0 and not e.waiting and not e.running
    assert all(s.state == "finished" for s in seqs)
