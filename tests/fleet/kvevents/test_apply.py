"""Applying decoded events to the index, the sequence tracker, and where endpoints publish (pure)."""

from __future__ import annotations

import argparse

import pytest

from epp.fleet.kvevents.apply import SeqAction, SequenceTracker, apply_events, lora_identity
from epp.fleet.kvevents.decode import AllBlocksCleared, BlockRemoved, BlockStored, UnknownEvent
from epp.fleet.kvevents.settings import KVEventsSettings, add_flags
from epp.fleet.kvevents.sources import (
    ANNOTATION_DP_SIZE,
    ANNOTATION_ENDPOINT,
    ANNOTATION_REPLAY,
    ANNOTATION_TOPIC,
    KVEventsConfigError,
    KVEventsSource,
    KVEventsTemplate,
    parse_kv_events_field,
    source_for,
)
from epp.fleet.static_source import StaticConfigError, parse_static_config
from scheduling.prefix.precise import LIVE, PreciseIndex
from scheduling.types import Endpoint

TOKS = list(range(64))


def test_apply_events_in_order() -> None:
    idx = PreciseIndex(block_size=16)
    events = [
        BlockStored([1, 2], None, TOKS[:32], 16),
        BlockStored([3], 2, TOKS[32:48], 16, lora_id=None, medium="GPU"),
        BlockStored([9], 77, TOKS[48:64], 16),  # unknown parent: orphan
        BlockStored([4], None, TOKS[:16], 16, group_idx=1),  # another KV group: ignored
        BlockStored([5], None, TOKS[:16], 16, medium="DISK"),  # a tier the index does not keep: ignored
        BlockRemoved([3]),
        UnknownEvent("BlockPinned"),
    ]
    st = apply_events(idx, "a", 0, events)
    assert (st.stored, st.removed, st.orphaned, st.ignored, st.stored_events, st.removed_events) == (3, 1, 1, 3, 3, 1)
    assert idx.match(idx.keys_for(TOKS))["a"].blocks == 2
    st = apply_events(idx, "a", 0, [AllBlocksCleared(), BlockStored([7], None, TOKS[:16], 16)])
    assert st.cleared == 1 and idx.state("a") == LIVE and idx.match(idx.keys_for(TOKS))["a"].blocks == 1


def test_lora_identity_prefers_the_name() -> None:
    assert lora_identity("sql", 3) == "sql" and lora_identity(None, 3) == "lora-id:3"
    assert lora_identity(None, None) is None and lora_identity("", None) is None
    idx = PreciseIndex(block_size=16)
    apply_events(idx, "a", 0, [BlockStored([1], None, TOKS[:16], 16, lora_id=2, lora_name="sql")])
    assert idx.match(idx.keys_for(TOKS[:16], "sql"))["a"].blocks == 1
    assert idx.match(idx.keys_for(TOKS[:16])) == {}


def test_sequence_tracker() -> None:
    t = SequenceTracker()
    assert t.classify(0).action is SeqAction.FRESH and not t.classify(0).restart
    d = t.classify(5)
    assert (d.action, d.start, d.from_zero) == (SeqAction.GAP, 0, True)
    t.advance(5)
    assert t.classify(6).action is SeqAction.APPLY
    d = t.classify(9)
    assert (d.action, d.start, d.from_zero) == (SeqAction.GAP, 6, False)
    d = t.classify(2)  # went back: a restart seen past 0
    assert (d.action, d.start, d.from_zero, d.restart) == (SeqAction.GAP, 0, True, True)
    d = t.classify(0)
    assert d.action is SeqAction.FRESH and d.restart
    t.advance(6, b"A" * 16)
    d = t.classify(7, b"B" * 16)  # a new stream id: restarted even though the seq looks right
    assert d.action is SeqAction.GAP and d.restart and d.from_zero
    t2 = SequenceTracker()
    t2.caught_up(4)
    assert t2.classify(3).action is SeqAction.DUPLICATE and t2.classify(4).action is SeqAction.DUPLICATE
    assert t2.classify(5).action is SeqAction.APPLY
    t3 = SequenceTracker()
    t3.caught_up(None)  # the publisher had published nothing
    assert t3.classify(0).action is SeqAction.APPLY


# ---- sources ---------------------------------------------------------------------------------------------
def _ep(ann: dict[str, str] | None = None, models: frozenset[str] = frozenset()) -> Endpoint:
    return Endpoint(key="10.0.0.5:8000", address="10.0.0.5", port=8000, name="vllm-0", models=models,
                    annotations=ann or {})


def test_annotations_win_over_the_template() -> None:
    tpl = KVEventsTemplate(port=5557, replay_port=5558, topic="kv@{ip}:{port}@{model}")
    assert source_for(_ep(), tpl) == KVEventsSource("tcp://10.0.0.5:5557", "tcp://10.0.0.5:5558", "kv@10.0.0.5:8000@")
    one = _ep(models=frozenset({"llama"}))
    assert source_for(one, tpl).topic == "kv@10.0.0.5:8000@llama"
    ann = {ANNOTATION_ENDPOINT: "6000", ANNOTATION_REPLAY: "tcp://{ip}:6001", ANNOTATION_TOPIC: "kv@x",
           ANNOTATION_DP_SIZE: "2"}
    src = source_for(_ep(ann), tpl)
    assert src == KVEventsSource("tcp://10.0.0.5:6000", "tcp://10.0.0.5:6001", "kv@x", 2)
    assert src.rank_endpoint(1) == "tcp://10.0.0.5:6001" and src.rank_replay(1) == "tcp://10.0.0.5:6002"
    assert source_for(_ep(), None) is None and source_for(_ep(), KVEventsTemplate()) is None
    v6 = Endpoint(key="[fd00::1]:8000", address="fd00::1", port=8000)
    assert source_for(v6, tpl).endpoint == "tcp://[fd00::1]:5557"


@pytest.mark.parametrize("ann", [
    {ANNOTATION_ENDPOINT: "udp://1.2.3.4:5"},
    {ANNOTATION_ENDPOINT: "tcp://1.2.3.4"},
    {ANNOTATION_ENDPOINT: "tcp://1.2.3.4:99999"},
    {ANNOTATION_ENDPOINT: "5557", ANNOTATION_DP_SIZE: "zero"},
    {ANNOTATION_ENDPOINT: "5557", ANNOTATION_DP_SIZE: "0"},
    {ANNOTATION_ENDPOINT: "tcp://{host}:1"},
])
def test_bad_annotations_name_the_field(ann: dict[str, str]) -> None:
    with pytest.raises(KVEventsConfigError, match="vllm-0: pointsman.ai/kv-events"):
        source_for(_ep(ann))


def test_endpoints_file_kv_events_field() -> None:
    doc = {"pools": [{"name": "p", "endpoints": [
        {"address": "10.0.0.5", "port": 8000, "kvEvents": "tcp://10.0.0.5:5557"},
        {"address": "10.0.0.6", "port": 8000,
         "kvEvents": {"endpoint": 5557, "replay": "tcp://{ip}:5558", "topic": "kv@", "dataParallelSize": 2}},
        {"address": "10.0.0.7", "port": 8000},
    ]}]}
    (spec, eps), = parse_static_config(doc, "f.yaml")[0]
    assert source_for(eps[0]) == KVEventsSource("tcp://10.0.0.5:5557")
    assert source_for(eps[1]) == KVEventsSource("tcp://10.0.0.6:5557", "tcp://10.0.0.6:5558", "kv@", 2)
    assert source_for(eps[2]) is None and eps[2].annotations == {}
    assert eps[1].with_metrics(eps[1].metrics).annotations == eps[1].annotations


@pytest.mark.parametrize(("raw", "needle"), [
    (42.0, "expected tcp://host:port or a mapping"),
    ({"replay": "tcp://a:1"}, "kvEvents.endpoint: required"),
    ({"endpoint": "tcp://a:1", "bogus": 1}, "unknown field(s) ['bogus']"),
    ({"endpoint": "ftp://a:1"}, "expected tcp://host:port"),
    ({"endpoint": "tcp://a:1", "dataParallelSize": 100}, "dataParallelSize"),
])
def test_endpoints_file_errors(raw: object, needle: str) -> None:
    doc = {"pools": [{"name": "p", "endpoints": [{"address": "10.0.0.5", "port": 8000, "kvEvents": raw}]}]}
    with pytest.raises(StaticConfigError) as exc:
        parse_static_config(doc, "f.yaml")
    assert "f.yaml" in str(exc.value) and "pools[0].endpoints[0].kvEvents" in str(exc.value)
    assert needle in str(exc.value)
    with pytest.raises(KVEventsConfigError):
        parse_kv_events_field(raw, "x")


def test_command_line_template() -> None:
    ap = argparse.ArgumentParser()
    add_flags(ap)

    def template_from_args(ns: argparse.Namespace):
        return KVEventsSettings.from_args(ns).template

    assert template_from_args(ap.parse_args([])) is None
    tpl = template_from_args(ap.parse_args(["--kv-events-port", "5557", "--kv-events-replay-port", "5558",
                                            "--kv-events-topic", "kv@{ip}", "--kv-events-dp-size", "2"]))
    assert tpl == KVEventsTemplate(5557, 5558, "kv@{ip}", 2)
    with pytest.raises(KVEventsConfigError):
        template_from_args(ap.parse_args(["--kv-events-port", "70000"]))


def test_pod_annotations_ride_along_on_endpoints() -> None:
    from epp.fleet.k8s.convert import pod_endpoints

    pod = {"metadata": {"name": "vllm-0", "namespace": "ns", "labels": {"app": "vllm"},
                        "annotations": {ANNOTATION_ENDPOINT: "5557", ANNOTATION_REPLAY: "5558",
                                        "kubectl.kubernetes.io/last-applied-configuration": "{...}"}},
           "status": {"podIP": "10.1.2.3", "phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}}
    (ep,) = pod_endpoints(pod, [8000])
    assert ep.annotations == {ANNOTATION_ENDPOINT: "5557", ANNOTATION_REPLAY: "5558"}  # only pointsman.ai/*
    assert source_for(ep) == KVEventsSource("tcp://10.1.2.3:5557", "tcp://10.1.2.3:5558")
