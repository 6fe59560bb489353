"""One owner for prefix data: producers are wired per loaded config, readers declare what they read, and a reader
without a writer or conflicting parameters is a config error that names both plugins."""

from __future__ import annotations

import random

import pytest
from sched_helpers import ctx, ep, match, req

from scheduling.config import ConfigError, load_scheduler
from scheduling.prefix import block_hashes


def epp(plugins: list[dict], refs: list[str] | None = None) -> dict:
    doc: dict = {"apiVersion": "llm-d.ai/v1alpha1", "kind": "EndpointPickerConfig", "plugins": plugins}
    if refs is not None:
        doc["schedulingProfiles"] = [{"name": "default", "plugins": [{"pluginRef": r} for r in refs]}]
    return doc


def load(doc: dict):
    return load_scheduler(doc, rng=random.Random(0), name="cfg.yaml")


def test_reader_at_another_block_size_than_the_writer_is_an_error_naming_both():
    doc = epp([
        {"type": "prefix-cache-affinity-filter", "name": "affinity", "parameters": {"blockSizeTokens": 32}},
        {"type": "prefix-cache-scorer", "name": "prefix", "parameters": {"blockSizeTokens": 16}},
    ])
    with pytest.raises(ConfigError) as err:
        load(doc)
    msg = str(err.value)
    assert "'affinity'" in msg and "'prefix'" in msg and "approx-prefix[32]" in msg
    assert err.value.path == "plugins[0].parameters"


def test_a_reader_alone_has_no_writer():
    with pytest.raises(ConfigError, match=r"'nohit' \(no-hit-lru-scorer\) reads approx-prefix\[16\], but no plugin"):
        load(epp([{"type": "no-hit-lru-scorer", "name": "nohit"}]))


def test_conflicting_producer_parameters_name_both_plugins():
    doc = epp([
        {"type": "prefix-cache-scorer", "name": "a", "parameters": {"lruCapacityPerServer": 1000}},
        {"type": "estimated-latency-scorer", "name": "b", "parameters": {"lruCapacityPerServer": 2000}},
    ])
    with pytest.raises(ConfigError) as err:
        load(doc)
    msg = str(err.value)
    assert "'a'" in msg and "'b'" in msg and "lruCapacityPerServer" in msg
    assert err.value.path.endswith("lruCapacityPerServer")


def test_two_declared_producers_for_one_key():
    doc = epp([
        {"type": "approx-prefix-cache-producer", "name": "p1"},
        {"type": "approx-prefix-cache-producer", "name": "p2"},
        {"type": "prefix-cache-scorer"},
    ])
    with pytest.raises(ConfigError, match=r"'p2'.*'p1'.*both produce approx-prefix\[16\]"):
        load(doc)


def test_declared_producer_feeds_a_lone_reader_and_is_the_only_writer():
    doc = epp(
        [
            {"type": "approx-prefix-cache-producer", "name": "producer", "parameters": {"blockSizeTokens": 32}},
            {"type": "prefix-cache-affinity-filter", "name": "affinity",
             "parameters": {"blockSizeTokens": 32, "explorationProbability": 0.0}},
            {"type": "queue-scorer"},
        ],
        ["affinity", "queue-scorer"],
    )
    sched = load(doc)
    producer = next(p for p in sched.plugins() if p.name == "producer")
    affinity = next(p for p in sched.plugins() if p.name == "affinity")
    assert affinity.prefix is producer
    a, b = ep(1, waiting=5), ep(2)
    prompt = "w" * 128 * 8  # 8 blocks of 32 tokens
    c = ctx(req(prompt), [a, b])
    first = sched.schedule(c)
    assert first.primary == b  # nothing cached yet: the queue decides
    sched.pre_request(c, first)
    assert match(producer.index, block_hashes(prompt, "llama", block_tokens=32)) == {b.key: 8}
    # Now b holds the prefix; make it the busier one: the filter still keeps only b.
    a2, b2 = ep(1), ep(2, waiting=9)
    assert sched.schedule(ctx(req(prompt), [a2, b2])).primary == b2


def test_declared_producer_parameters_must_agree_with_readers():
    doc = epp([
        {"type": "approx-prefix-cache-producer", "name": "producer", "parameters": {"maxPrefixBlocksToMatch": 64}},
        {"type": "prefix-cache-scorer", "name": "scorer", "parameters": {"maxPrefixBlocksToMatch": 128}},
    ])
    with pytest.raises(ConfigError, match=r"'scorer'.*maxPrefixBlocksToMatch=128.*'producer'.*=64"):
        load(doc)


def test_pd_prefix_decider_reads_prefix_data_and_needs_a_writer():
    plugins = [
        {"type": "pd-profile-handler", "parameters": {"nonCachedTokens": 64}},
        {"type": "decode-filter"},
        {"type": "prefill-filter"},
        {"type": "queue-scorer"},
    ]
    profiles = [
        {"name": "decode", "plugins": [{"pluginRef": "decode-filter"}, {"pluginRef": "queue-scorer"}]},
        {"name": "prefill", "plugins": [{"pluginRef": "prefill-filter"}, {"pluginRef": "queue-scorer"}]},
    ]
    doc = epp(plugins)
    doc["schedulingProfiles"] = profiles
    with pytest.raises(ConfigError, match="pd-profile-handler.*reads approx-prefix"):
        load(doc)
    # the "always" decider never reads it, so it needs no writer
    doc["plugins"][0] = {"type": "pd-profile-handler", "parameters": {"decider": "always"}}
    load(doc)


def test_every_prefix_plugin_of_one_block_size_shares_one_producer():
    doc = epp(
        [
            {"type": "prefix-cache-scorer", "name": "prefix"},
            {"type": "estimated-latency-scorer", "name": "latency"},
            {"type": "no-hit-lru-scorer", "name": "nohit"},
            {"type": "prefix-cache-affinity-filter", "name": "affinity"},
            {"type": "kv-block-occupancy-scorer", "name": "occupancy"},
        ],
        ["affinity", "prefix", "latency", "nohit", "occupancy"],
    )
    sched = load(doc)
    readers = [p for p in sched.plugins() if p.name in ("prefix", "latency", "nohit", "affinity", "occupancy")]
    producers = {id(p.prefix) for p in readers}
    assert len(producers) == 1
    producer = readers[0].prefix
    e = ep(1)
    c = ctx(req("r" * 64 * 5), [e])
    res = sched.schedule(c)
    sched.pre_request(c, res)
    assert producer.index.size(e.key) == 5  # recorded once, by the producer alone
