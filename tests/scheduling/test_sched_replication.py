"""Replication of plugin state between processes, plugin side: what two schedulers exchange through
export/apply makes their views equal, records are idempotent, bad records are rejected and counted, and the
endpoint lifecycle holds for peers' state too."""

from __future__ import annotations

import random

import msgpack
import pytest
from sched_helpers import ctx, ep, plugin, req, scores, state

from scheduling.api import SchedulingResult
from scheduling.config import load_scheduler
from scheduling.framework.replication import ReplicatedRecords, ReplicatedState, replicated
from scheduling.latency import SharedBacklog
from scheduling.prefix import block_hashes

PER_TOKEN = 250e-6


def wire(records):
    """What the bus does to records: msgpack there and back."""
    return msgpack.unpackb(msgpack.packb(records, use_bin_type=True), raw=False)


def pick(p, request, candidates, chosen, now=0.0):
    st = state()
    c = ctx(request, candidates, now=now)
    if hasattr(p, "score"):
        p.score(c, candidates, st)
    res = SchedulingResult(targets=[chosen])
    for x in [p, *p.producers.values()]:  # the plugin, then the producers it reads (as a scheduler orders them)
        x.pre_request(c, res, st)


# ---- approximate prefix ---------------------------------------------------------------------------------
def test_prefix_records_make_a_peer_index_hold_the_same_blocks():
    a_side, b_side = plugin("prefix-cache-scorer"), plugin("prefix-cache-scorer")
    pa, pb = a_side.prefix, b_side.prefix
    assert isinstance(pa, ReplicatedRecords)
    pa.set_replicating(True)
    e1, e2 = ep(1), ep(2)
    prompt = "s" * 64 * 8
    pick(a_side, req(prompt), [e1, e2], e1)
    recs = wire(pa.export_records(0.0))
    assert recs == [[e1.key, block_hashes(prompt, "llama")]]
    assert pa.export_records(0.0) == []  # handed out once
    assert pb.apply_records("a", recs, 5.0) == 0
    assert pb.apply_records("a", recs, 6.0) == 0  # idempotent
    got = scores(b_side, ctx(req(prompt), [e1, e2]))
    assert got == [1.0, 0.0]
    assert pb.index.size(e1.key) == pa.index.size(e1.key) == 8


def test_prefix_records_are_collected_only_while_replicating():
    s = plugin("prefix-cache-scorer")
    e1 = ep(1)
    pick(s, req("x" * 200), [e1], e1)
    assert s.prefix.export_records(0.0) == []
    s.prefix.set_replicating(True)
    s.prefix.set_replicating(False)
    pick(s, req("y" * 200), [e1], e1)
    assert s.prefix.export_records(0.0) == []


def test_prefix_snapshot_for_a_joining_peer_holds_recent_picks_of_live_endpoints():
    a_side, b_side = plugin("prefix-cache-scorer"), plugin("prefix-cache-scorer")
    a_side.prefix.set_replicating(True)
    e1, e2 = ep(1), ep(2)
    pick(a_side, req("a" * 640), [e1, e2], e1)
    pick(a_side, req("b" * 640), [e1, e2], e2)
    a_side.prefix.export_records(0.0)  # already sent to the peers there were
    snap = wire(a_side.prefix.snapshot_records(0.0))
    assert [r[0] for r in snap] == [e1.key, e2.key]
    assert b_side.prefix.apply_records("a", snap, 0.0) == 0
    assert scores(b_side, ctx(req("b" * 640), [e1, e2])) == [0.0, 1.0]
    a_side.prefix.endpoint_removed(e2.key)
    assert [r[0] for r in a_side.prefix.snapshot_records(0.0)] == [e1.key]


@pytest.mark.parametrize("bad", [
    ["10.0.0.1:8000"],
    ["10.0.0.1:8000", "not a list"],
    ["10.0.0.1:8000", [1, -2]],
    ["10.0.0.1:8000", [1, True]],
    ["10.0.0.1:8000", [2**64]],
    ["10.0.0.1:8000", [1.5]],
    ["10.0.0.1:8000", list(range(300))],  # more than maxPrefixBlocksToMatch
    ["10.0.0.1:8000", [1], "extra"],
])
def test_malformed_prefix_records_are_rejected_and_counted(bad):
    s = plugin("prefix-cache-scorer")
    good = ["10.0.0.2:8000", [1, 2, 3]]
    assert s.prefix.apply_records("peer", [bad, good], 0.0) == 1
    assert s.prefix.index.endpoints() == ["10.0.0.2:8000"]


# ---- session affinity -----------------------------------------------------------------------------------
def test_session_bindings_replicate_by_hash_and_the_newest_wins():
    a, b = plugin("session-affinity-scorer"), plugin("session-affinity-scorer")
    assert isinstance(a, ReplicatedRecords)
    a.set_replicating(True)
    e1, e2, e3 = ep(1), ep(2), ep(3)
    r = req("hi", headers={"x-session-id": "alice"})
    pick(a, r, [e1, e2, e3], e2, now=100.0)
    recs = wire(a.export_records(100.25))
    assert len(recs) == 1 and recs[0][0] == e2.key and len(recs[0][1]) == 16
    assert recs[0][2] == pytest.approx(0.25)
    assert b"alice" not in msgpack.packb(recs)  # only the hash travels
    assert b.apply_records("a", recs, 7.0) == 0
    assert scores(b, ctx(r, [e1, e2, e3], now=8.0)) == [0.0, 1.0, 0.0]
    assert b.sessions[next(iter(b.sessions))][1] == pytest.approx(6.75)  # placed by its age on b's clock
    # b rebinds the session at 20.0; a binding a made before that (0.5 s before b received it) does not undo it
    b.set_replicating(True)
    pick(b, r, [e1, e2, e3], e3, now=20.0)
    a.set_replicating(True)
    pick(a, r, [e1, e2, e3], e2, now=200.0)
    late = wire(a.export_records(200.75))
    assert b.apply_records("a", late, 20.5) == 0
    assert scores(b, ctx(r, [e1, e2, e3], now=21.0)) == [0.0, 0.0, 1.0]
    assert a.apply_records("b", wire(b.export_records(20.0)), 201.0) == 0  # newer than a's own: taken
    assert scores(a, ctx(r, [e1, e2, e3], now=201.0)) == [0.0, 0.0, 1.0]


def test_session_snapshot_holds_live_bindings_newest_first():
    a = plugin("session-affinity-scorer", {"ttlSeconds": 10})
    e1, e2 = ep(1), ep(2)
    pick(a, req("x", headers={"x-session-id": "old"}), [e1, e2], e1, now=0.0)
    pick(a, req("x", headers={"x-session-id": "new"}), [e1, e2], e2, now=5.0)
    snap = a.snapshot_records(12.0)  # "old" idle for 12 s > ttl: not offered
    assert [(r[0], r[2]) for r in snap] == [(e2.key, 7.0)]
    b = plugin("session-affinity-scorer", {"ttlSeconds": 10})
    b.apply_records("a", wire(snap), 50.0)
    assert scores(b, ctx(req("x", headers={"x-session-id": "new"}), [e1, e2], now=51.0)) == [0.0, 1.0]


def test_session_records_expire_like_local_bindings_and_bad_ones_are_counted():
    b = plugin("session-affinity-scorer", {"ttlSeconds": 10})
    e1, e2 = ep(1), ep(2)
    h = (12345).to_bytes(16, "big")
    bad = [[e1.key, b"short", 0.0], [e1.key, h, -1.0], [e1.key, h, "x"], [e1.key, h], [e1.key, h, True]]
    assert b.apply_records("a", [*bad, [e1.key, h, 9.0]], 100.0) == len(bad)
    assert len(b.sessions) == 1
    b.endpoint_removed(e1.key)
    assert not b.sessions and b.tracked_endpoints() == set()
    b.apply_records("a", [[e2.key, h, 1e6]], 100.0)  # older than the TTL: placed at the TTL's edge
    assert b.sessions[12345][1] == pytest.approx(90.0)


# ---- prefill backlog ------------------------------------------------------------------------------------
def test_backlog_is_one_queue_whoever_sent_the_tokens():
    q = SharedBacklog()
    rate = 1000.0  # tokens per second
    q.add("e", 1000.0, 0.0, rate)
    q.set_peer("b", {"e": 1000.0}, 0.0, lambda k: rate)
    assert q.total("e", 0.0, rate) == pytest.approx(2000.0)
    assert q.total("e", 1.0, rate) == pytest.approx(1000.0)  # the engine's rate, not twice it
    assert q.own(1.0, lambda k: rate) == {"e": pytest.approx(500.0)}  # each share drained in proportion
    q.set_peer("b", {"e": 200.0}, 1.0, lambda k: rate)  # b's next absolute snapshot replaces its share
    assert q.total("e", 1.0, rate) == pytest.approx(700.0)
    q.set_peer("b", None, 1.0, lambda k: rate)  # b expired: its share goes, nothing phantom stays
    assert q.total("e", 1.0, rate) == pytest.approx(500.0)
    assert q.peers() == []
    assert q.total("e", 2.0, rate) == 0.0 and q.own(2.0, lambda k: rate) == {}


def test_drained_local_backlogs_are_dropped_and_reads_do_not_change():
    q = SharedBacklog()

    def rate(key: str) -> float:
        return 1000.0

    q.add("drained", 500.0, 0.0, 1000.0)
    q.add("busy", 5000.0, 0.0, 1000.0)
    q.add("shared", 500.0, 0.0, 1000.0)
    q.set_peer("b", {"shared": 100.0}, 0.0, rate)
    reads = {k: q.total(k, 1.0, 1000.0) for k in ("drained", "busy", "shared")}
    own = q.own(1.0, rate)
    assert q.drop_drained(1.0, rate) == 1
    assert set(q.endpoints()) == {"busy", "shared"}  # a peer's share keeps its queue (set_peer owns it)
    assert {k: q.total(k, 1.0, 1000.0) for k in reads} == reads and q.own(1.0, rate) == own
    q.add("drained", 300.0, 1.0, 1000.0)  # starts again as a queue that had drained would
    assert q.total("drained", 1.1, 1000.0) == pytest.approx(200.0)


def test_backlog_state_replicates_between_estimated_latency_scorers():
    a, b = plugin("estimated-latency-scorer"), plugin("estimated-latency-scorer")
    assert isinstance(a, ReplicatedState)
    e1, e2 = ep(1), ep(2)
    pick(a, req("q" * 4 * 4000), [e1, e2], e1, now=0.0)  # a sends 4000 uncached tokens to e1
    exported = a.export_state(0.5)
    assert exported == {e1.key: pytest.approx(4000 - 0.5 / PER_TOKEN)}
    b.apply_peer_state("a", exported, 10.0)  # b's clock differs: the share drains from when b got it
    small = req("z" * 400)
    seen_by_b = scores(b, ctx(small, [e1, e2], now=10.25))
    seen_by_a = scores(a, ctx(small, [e1, e2], now=0.75))
    assert seen_by_b == pytest.approx(seen_by_a)
    assert seen_by_b[0] < 1.0 == seen_by_b[1]
    assert b.export_state(10.25) == {}  # b publishes only its own share
    b.endpoint_removed(e1.key)
    assert e1.key not in b.tracked_endpoints()
    b.apply_peer_state("a", None, 11.0)
    assert b.tracked_endpoints() == set()


def finish(p, request, candidates, chosen, start, end):
    """One request through the scorer's lifecycle: scored and sent at `start`, finished at `end`."""
    st = state()
    c = ctx(request, candidates, now=start)
    p.score(c, candidates, st)
    res = SchedulingResult(targets=[chosen])
    p.pre_request(c, res, st)
    c.now = end
    p.response_complete(c, res, st)


def test_finished_requests_teach_every_replica_as_one_scorer_learns():
    """Durations and calibration samples travel as records: replicas sharing them learn what one scorer that saw
    every request learns (so two replicas calibrate as fast as one)."""
    one, a, b = (plugin("estimated-latency-scorer") for _ in range(3))
    a.set_replicating(True)
    b.set_replicating(True)
    e1, e2 = ep(1), ep(2)
    for i in range(20):  # the engines are 3x faster than the reference: every request takes a third
        side = a if i % 2 else b
        for p in (one, side):
            finish(p, req("x" * 400 + str(i)), [e1, e2], e1 if i % 3 else e2, 10.0 * i, 10.0 * i + 0.6)
        # each replica hands its finished requests to the other (the bus)
        for src, dst in ((a, b), (b, a)):
            assert dst.apply_records("peer", wire(src.export_records(10.0 * i)), 10.0 * i) == 0
    for p in (a, b):
        assert p.model.learner.scale(e1.key) == pytest.approx(one.model.learner.scale(e1.key), rel=1e-2)
        assert p.model.learner.pool_scale == pytest.approx(one.model.learner.pool_scale, rel=1e-2)
        assert p.model.learner.durations[e2.key] == pytest.approx(one.model.learner.durations[e2.key], rel=1e-2)
    assert one.model.learner.scale(e1.key) < 0.9  # it did learn something
    # a replica that joins takes what the others learnt, without a request of its own
    late = plugin("estimated-latency-scorer")
    assert late.apply_records("a", wire(a.snapshot_records(0.0)), 0.0) == 0
    assert late.model.learner.scale(e1.key) == pytest.approx(a.model.learner.scale(e1.key))
    assert late.apply_records("a", [[e1.key, float("nan"), 1.0], [e1.key, 1.0, 99.0], [e1.key, 1.0]], 0.0) == 3


def test_backlog_rejects_nonsense_values():
    s = plugin("estimated-latency-scorer")
    e1 = ep(1)
    s.apply_peer_state("p", {e1.key: float("inf"), "10.9.9.9:1": -5.0}, 0.0)
    assert s.tracked_endpoints() == set()


# ---- which plugins, under which names -------------------------------------------------------------------
def test_replicated_lists_plugins_under_names_equal_across_processes():
    cfg = """
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: prefix-cache-scorer
- {type: prefix-cache-scorer, name: big-blocks, parameters: {blockSizeTokens: 64}}
- type: session-affinity-scorer
- type: estimated-latency-scorer
- type: max-score-picker
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: prefix-cache-scorer
  - pluginRef: big-blocks
  - pluginRef: session-affinity-scorer
  - pluginRef: estimated-latency-scorer
  - pluginRef: max-score-picker
"""
    import yaml

    def load():
        return load_scheduler(list(yaml.safe_load_all(cfg)), rng=random.Random(0))

    recs1, states1 = replicated(load())
    recs2, states2 = replicated(load())
    assert sorted(recs1) == sorted(recs2)
    assert sorted(recs1) == [
        "config/approx-prefix-cache-producer[16]:approx-prefix/16",
        "config/approx-prefix-cache-producer[64]:approx-prefix/64",
        "config/estimated-latency-scorer:estimated-latency",
        "config/session-affinity-scorer:session-affinity",
    ]
    assert list(states1) == ["config/estimated-latency-scorer:estimated-latency"] == list(states2)
