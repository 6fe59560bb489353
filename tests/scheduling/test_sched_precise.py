"""precise-prefix-cache-scorer and the precise prefix data: the formula, its fallbacks to the approximate index,
speculative entries, token-ids declarations, llm-d's parameters, and the readers that can use it."""

from __future__ import annotations

import random
from typing import Any

import pytest
from sched_helpers import ctx, ep, req

from scheduling.config import load_scheduler
from scheduling.framework import ConfigError
from scheduling.framework.model_scheduler import ModelScheduler
from scheduling.prefix.precise import CPU, GPU, PENDING, UNKNOWN, PreciseIndex
from scheduling.prefix.precise_data import (
    APPROXIMATE,
    EVENTS,
    PRECISE_INDEX,
    PRECISE_PREFIX,
    TOKEN_IDS,
    decision_prefix_hits,
)
from scheduling.types import CHARS_PER_TOKEN, LLMRequest

TOKENS = list(range(1000, 1000 + 16 * 10))  # ten full 16-token blocks


def config(scorer: str = "precise-prefix-cache-scorer", params: dict | None = None, extra: list | None = None) -> dict:
    plugins = [{"type": scorer, **({"parameters": params} if params is not None else {})}, *(extra or []),
               {"type": "max-score-picker"}]
    return {"apiVersion": "inference.networking.x-k8s.io/v1alpha1", "kind": "EndpointPickerConfig",
            "plugins": plugins,
            "schedulingProfiles": [{"name": "default", "plugins": [{"pluginRef": scorer},
                                                                    {"pluginRef": "max-score-picker"}]}]}


def load(doc: dict, index: PreciseIndex | None = None) -> ModelScheduler:
    services = {PRECISE_INDEX: index} if index is not None else None
    return load_scheduler([doc], rng=random.Random(0), services=services)


def store(index: PreciseIndex, key: str, blocks: int, medium: int = GPU, rank: int = 0, base: int = 0) -> None:
    """The engine at `key` stores the first `blocks` blocks of TOKENS (one BlockStored from the start)."""
    index.set_state(key, rank, index.slot_states(key).get(rank, PENDING))
    hashes = [base + 7000 + i for i in range(blocks)]
    index.store(key, rank, hashes, None, TOKENS[: 16 * blocks], 16, None, medium)


def tokreq(tokens: list[int] | None = TOKENS, prompt: str | None = None) -> LLMRequest:
    r = req(prompt if prompt is not None else "x" * (len(tokens or []) * CHARS_PER_TOKEN))
    r.token_ids = tokens
    r.token_source = "local" if tokens is not None else ""
    return r


def plugin_scores(result: Any, name: str = "precise-prefix-cache-scorer") -> dict[str, float]:
    det = next(d for d in result.profile_results["default"].details if d.type == name)
    return dict(det.scores)


def test_scores_the_longest_consecutive_prefix_weighted_by_medium():
    idx = PreciseIndex()
    a, b, c, d = ep(0), ep(1), ep(2), ep(3)
    for e in (a, b, c, d):
        idx.clear(e.key, 0)  # live: AllBlocksCleared / a fresh publisher
    store(idx, a.key, 6)  # 6 of 10 blocks on the GPU
    store(idx, b.key, 8, CPU)  # 8 on the CPU tier
    store(idx, c.key, 10)
    idx.remove(c.key, 0, [7000 + 3])  # evicted block 3: only the first 3 count (consecutive from the start)
    sched = load(config(), idx)
    res = sched.schedule(ctx(tokreq(), [a, b, c, d], explain=True))
    got = plugin_scores(res)
    assert got == pytest.approx({a.key: 0.6, b.key: 0.8 * 0.8, c.key: 0.3, d.key: 0.0})
    assert res.primary.key == b.key
    hits = decision_prefix_hits(res.state)
    assert hits is not None
    assert (hits[b.key].source, hits[b.key].blocks, hits[b.key].cpu, hits[b.key].total) == (EVENTS, 8, 8, 10)
    assert (hits[a.key].gpu, hits[d.key].blocks) == (6, 0)


def test_medium_weights_come_from_kv_cache_backend_configs():
    idx = PreciseIndex()
    a, b = ep(0), ep(1)
    for e in (a, b):
        idx.clear(e.key, 0)
    store(idx, a.key, 5)
    store(idx, b.key, 8, CPU)
    weights = {"indexerConfig": {"kvCacheBackendConfigs": [{"name": "gpu", "weight": 1.0},
                                                            {"name": "cpu", "weight": 0.5}]}}
    res = load(config(params=weights), idx).schedule(ctx(tokreq(), [a, b], explain=True))
    assert plugin_scores(res) == pytest.approx({a.key: 0.5, b.key: 0.4})
    assert res.primary.key == a.key


def test_endpoints_not_live_are_scored_from_the_approximate_index():
    idx = PreciseIndex()
    live, pending, unknown, none = ep(0), ep(1), ep(2), ep(3)
    idx.clear(live.key, 0)
    idx.set_state(pending.key, 0, PENDING)
    idx.mark_unknown(unknown.key, 0)
    store(idx, live.key, 2)
    sched = load(config(), idx)
    prompt = "p" * (16 * CHARS_PER_TOKEN * 10)  # ten approximate blocks
    # The approximate index learns that `unknown` holds the prompt: the producer records the pick.
    first = ctx(tokreq(prompt=prompt), [unknown])
    sched.pre_request(first, sched.schedule(first))
    # ... and events that `pending` holds it all, which must not count while it is pending
    store(idx, pending.key, 10)
    res = sched.schedule(ctx(tokreq(prompt=prompt), [live, pending, unknown, none], explain=True))
    got = plugin_scores(res)
    hits = decision_prefix_hits(res.state)
    assert hits is not None
    assert hits[live.key].source == EVENTS and got[live.key] == pytest.approx(0.2)
    assert hits[pending.key].source == APPROXIMATE and hits[pending.key].state == PENDING
    assert got[pending.key] == 0.0
    assert hits[unknown.key].source == APPROXIMATE and hits[unknown.key].state == UNKNOWN
    assert got[unknown.key] == pytest.approx(1.0)  # the approximate index: all ten blocks recorded there
    assert hits[none.key].state is None and got[none.key] == 0.0
    assert res.primary.key == unknown.key


def test_without_token_ids_every_endpoint_is_approximate():
    idx = PreciseIndex()
    a = ep(0)
    idx.clear(a.key, 0)
    store(idx, a.key, 10)
    res = load(config(), idx).schedule(ctx(tokreq(None, prompt="q" * 640), [a, ep(1)], explain=True))
    hits = decision_prefix_hits(res.state)
    assert hits is not None and {h.source for h in hits.values()} == {APPROXIMATE}
    assert plugin_scores(res) == {a.key: 0.0, ep(1).key: 0.0}


def test_picks_enter_as_speculative_entries_until_events_confirm_them_or_they_lapse_after_the_request():
    idx = PreciseIndex()
    a, b = ep(0), ep(1)
    for e in (a, b):
        idx.clear(e.key, 0)
    sched = load(config(params={"speculativeTTL": "2s"}), idx)
    c1 = ctx(tokreq(), [a, b], now=100.0)
    r1 = sched.schedule(c1)
    sched.pre_request(c1, r1)
    chosen, other = r1.primary, (b if r1.primary is a else a)
    r2 = sched.schedule(ctx(tokreq(), [a, b], now=101.0, explain=True))
    assert r2.primary.key == chosen.key  # the speculative entry pulls the next request along
    hits = decision_prefix_hits(r2.state)
    assert hits is not None and (hits[chosen.key].speculative, hits[chosen.key].gpu) == (10, 0)
    assert plugin_scores(r2)[chosen.key] == pytest.approx(1.0)
    # the engine stores 4 blocks: confirmed (held by events now), the rest still speculative
    store(idx, chosen.key, 4)
    assert idx.counters["confirmed"] == 4
    r3 = sched.schedule(ctx(tokreq(), [a, b], now=101.5, explain=True))
    h3 = decision_prefix_hits(r3.state)
    assert h3 is not None and (h3[chosen.key].gpu, h3[chosen.key].speculative) == (4, 6)
    # the request still runs (queued in the engine, say): past the TTL its entries are still held
    r4 = sched.schedule(ctx(tokreq(), [a, b], now=110.0, explain=True))
    h4 = decision_prefix_hits(r4.state)
    assert h4 is not None and (h4[chosen.key].gpu, h4[chosen.key].speculative) == (4, 6)
    # it ends at 111: what events never confirmed lapses a TTL later
    c1.now = 111.0
    sched.response_complete(c1, r1)
    r5 = sched.schedule(ctx(tokreq(), [a, b], now=112.9, explain=True))
    h5 = decision_prefix_hits(r5.state)
    assert h5 is not None and h5[chosen.key].speculative == 6
    r6 = sched.schedule(ctx(tokreq(), [a, b], now=113.1, explain=True))
    h6 = decision_prefix_hits(r6.state)
    assert h6 is not None and (h6[chosen.key].gpu, h6[chosen.key].speculative) == (4, 0)
    assert h6[other.key].blocks == 0
    assert plugin_scores(r6)[chosen.key] == pytest.approx(0.4)


def test_speculative_indexing_can_be_turned_off():
    idx = PreciseIndex()
    a = ep(0)
    idx.clear(a.key, 0)
    sched = load(config(params={"speculativeIndexing": False}), idx)
    c = ctx(tokreq(), [a], now=1.0)
    sched.pre_request(c, sched.schedule(c))
    assert idx.counters["speculative"] == 0
    res = sched.schedule(ctx(tokreq(), [a], now=1.1, explain=True))
    assert plugin_scores(res)[a.key] == 0.0


def test_a_private_index_without_the_shell_forgets_departed_endpoints():
    sched = load(config())  # no services: the producer keeps its own index
    a = ep(0)
    c = ctx(tokreq(), [a], now=1.0)
    sched.pre_request(c, sched.schedule(c))
    producer = sched.producer(c.request, PRECISE_PREFIX)
    assert producer is not None and a.key in producer.tracked_endpoints()
    sched.endpoint_removed(a.key)
    assert a.key not in sched.tracked_endpoints()


def test_only_configs_that_read_tokens_have_a_token_producer():
    r = req("hello")
    assert load_scheduler(None, rng=random.Random(0)).producer(r, TOKEN_IDS) is None  # the default profile
    gie = load_scheduler(config("prefix-cache-scorer"), rng=random.Random(0))
    assert gie.producer(r, TOKEN_IDS) is None
    assert load(config()).producer(r, TOKEN_IDS) is not None
    el = config("estimated-latency-scorer", {"prefixSource": "precise"})
    assert load(el).producer(r, TOKEN_IDS) is not None
    assert load(config("estimated-latency-scorer")).producer(r, TOKEN_IDS) is None


def test_declared_token_producer_carries_llm_d_parameters():
    tp = {"type": "token-producer", "parameters": {"modelName": "acme/m", "vllm": {"http": "http://render:8000/",
                                                                                    "timeout": "250ms"}}}
    sched = load(config(extra=[tp]))
    producer = sched.producer(req("x"), TOKEN_IDS)
    assert producer is not None and producer.type_name == "token-producer"
    assert (producer.engine_url, producer.timeout, producer.model_name) == ("http://render:8000", 0.25, "acme/m")
    bad = {"type": "token-producer", "parameters": {"vllm": {"grpc": "x"}}}
    with pytest.raises(ConfigError, match=r"vllm.grpc: unknown parameter"):
        load(config(extra=[bad]))
    with pytest.raises(ConfigError, match=r"vllm.http: expected an http"):
        load(config(extra=[{"type": "token-producer", "parameters": {"vllm": {"http": "render:8000"}}}]))


LLMD_ALL = {
    "tokenProcessorConfig": {"blockSize": 16, "hashSeed": "12345"},
    "kvEventsConfig": {"topicFilter": "kv@", "concurrency": 4, "discoverPods": True,
                       "podDiscoveryConfig": {"socketPort": 5556}},
    "indexerConfig": {"kvBlockIndexConfig": {"inMemoryConfig": {"size": 100000000, "podCacheSize": 10},
                                             "enableMetrics": True}},
    "speculativeIndexing": True,
    "speculativeTTL": "2s",
}


def test_accepts_llm_d_documented_parameters():
    sched = load(config(params=LLMD_ALL))
    scorer = next(p for p in sched.plugins() if p.type_name == "precise-prefix-cache-scorer")
    assert scorer.kv_events_template() == (5556, "kv@")
    load(config(params={"tokenProcessorConfig": {"blockSizeTokens": 64},
                        "indexerConfig": {"kvBlockIndexConfig": {"enableMetrics": True}}}))


@pytest.mark.parametrize("params,path,why", [
    ({"indexerConfig": {"tokenizersPoolConfig": {"modelName": "m"}}}, "indexerConfig.tokenizersPoolConfig",
     "--tokenizers-dir"),
    ({"indexerConfig": {"kvBlockIndexConfig": {"redisConfig": {"address": "redis://x"}}}},
     "kvBlockIndexConfig.redisConfig", "lives in the Pointsman process"),
    ({"kvEventsConfig": {"zmqEndpoint": "tcp://*:5557"}}, "kvEventsConfig.zmqEndpoint", "own publisher"),
    ({"indexerConfig": {"kvCacheBackendConfigs": [{"name": "disk", "weight": 0.1}]}}, "kvCacheBackendConfigs",
     "gpu or cpu"),
    ({"tokenProcessorConfig": {"blockSize": 0}}, "tokenProcessorConfig.blockSize", "positive integer"),
    ({"kvEventsConfig": {"bogus": 1}}, "kvEventsConfig.bogus", "unknown parameter"),
    ({"speculativeTTL": "soon"}, "speculativeTTL", "duration"),
])
def test_refuses_what_does_not_apply_with_the_reason(params, path, why):
    with pytest.raises(ConfigError) as err:
        load(config(params=params))
    assert path in str(err.value) and why in str(err.value)


def test_readers_sharing_the_precise_data_must_agree():
    doc = config(params={"speculativeTTL": "1s"})
    doc["plugins"].insert(1, {"type": "estimated-latency-scorer", "parameters": {"prefixSource": "precise"}})
    load(doc)  # the latency scorer sets nothing: it agrees
    doc["plugins"].insert(1, {"type": "precise-prefix-cache-producer", "parameters": {"speculativeTTL": 5}})
    with pytest.raises(ConfigError, match="speculativeTTL"):
        load(doc)


def test_estimated_latency_reads_the_precise_prefix_when_asked():
    idx = PreciseIndex()
    a, b = ep(0), ep(1)
    for e in (a, b):
        idx.clear(e.key, 0)
    store(idx, b.key, 10)  # b's engine really holds the prompt
    prompt = "z" * (16 * CHARS_PER_TOKEN * 10)
    for source, expected in (("approximate", None), ("precise", b.key)):
        sched = load(config("estimated-latency-scorer", {"prefixSource": source, "calibrate": False}), idx)
        c = ctx(tokreq(prompt=prompt), [a, b], explain=True)
        first = sched.schedule(c)
        sched.pre_request(c, first)  # the approximate index now believes the first pick holds the prompt
        res = sched.schedule(ctx(tokreq(prompt=prompt), [a, b], explain=True))
        if expected is None:
            assert res.primary.key == first.primary.key
        else:
            assert res.primary.key == expected and first.primary.key == expected
            s = plugin_scores(res, "estimated-latency-scorer")
            assert s[b.key] == 1.0 and s[a.key] < 1.0


@pytest.mark.parametrize("name", ["kvcache-aware", "prefix-cache"])
def test_kthena_prefix_scorers_map_onto_the_precise_index_when_the_shell_has_one(name):
    r = req("x")
    assert load(config(name)).producer(r, PRECISE_PREFIX) is None
    idx = PreciseIndex()
    sched = load(config(name), idx)
    assert sched.producer(r, PRECISE_PREFIX) is not None and sched.producer(r, TOKEN_IDS) is not None
    a, b = ep(0), ep(1)
    idx.clear(a.key, 0)
    store(idx, a.key, 5)
    res = sched.schedule(ctx(tokreq(), [a, b], explain=True))
    assert plugin_scores(res, name) == pytest.approx({a.key: 0.5, b.key: 0.0})
