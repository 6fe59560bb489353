"""Discovery against a wire-level fake API server, through the real kubernetes client."""

import logging

import pytest
from fakeapi import FakeKubeAPI, objective, pod, pool, rewrite

from epp.fleet.datastore import Datastore
from epp.fleet.k8s.discovery import make_api_client, start_pool_discovery, start_selector_discovery
from tests.support.wait import until

CORE, POOLS, X = "", "inference.networking.k8s.io", "inference.networking.x-k8s.io"
OPTS = {"watch_timeout_s": 2, "backoff_initial_s": 0.05, "backoff_max_s": 0.2, "request_timeout_s": 5}
VLLM = {"app": "vllm"}


def keys(ds, name="llama"):
    snap = ds.snapshot(name)
    return sorted(e.key for e in snap.endpoints) if snap else None


@pytest.fixture(params=["event"])
async def kube(request):
    api = FakeKubeAPI(gone_mode=request.param).start()
    yield api
    api.stop()


@pytest.fixture
async def discover(kube):
    made = []

    async def start(**kw):
        ds = Datastore()
        disc = await start_pool_discovery(ds, "llama", "default", api=make_api_client(host=kube.host), **{**OPTS, **kw})
        made.append(disc)
        return ds, disc

    yield start
    for d in made:
        await d.stop()


def seed(kube):
    kube.apply(POOLS, "inferencepools", pool("llama", VLLM, [8000, 8001]))
    kube.apply(CORE, "pods", pod("p1", "10.0.0.1", {**VLLM, "llm-d.ai/role": "decode"}))
    kube.apply(CORE, "pods", pod("p2", "10.0.0.2", VLLM, ready=False))
    kube.apply(CORE, "pods", pod("p3", "10.0.0.3", {"app": "other"}))
    kube.apply(CORE, "pods", pod("p4", "10.0.0.4", VLLM, terminating=True))
    kube.apply(CORE, "pods", pod("p5", "10.0.0.5", VLLM, annotations={"inference.networking.k8s.io/active-ports": "8001"}))
    kube.apply(CORE, "pods", pod("p6", None, VLLM))  # scheduled, no IP yet
    kube.apply(X, "inferenceobjectives", objective("batch", "llama", -1))
    kube.apply(X, "inferenceobjectives", objective("chat", "llama", None))
    kube.apply(X, "inferenceobjectives", objective("elsewhere", "other-pool", 9))
    kube.apply(X, "inferencemodelrewrites", rewrite("canary", "llama", [
        {"matches": [{"model": {"type": "Exact", "value": "food-review"}}],
         "targets": [{"modelRewrite": "food-review-v1", "weight": 90}, {"modelRewrite": "food-review-v2", "weight": 10}]},
        {"targets": [{"modelRewrite": "base"}]},
    ]))


async def test_initial_sync_builds_endpoints_objectives_and_rewrites(kube, discover):
    seed(kube)
    ds, disc = await discover()
    assert await disc.wait_synced(5)
    assert ds.synced
    assert keys(ds) == ["10.0.0.1:8000", "10.0.0.1:8001", "10.0.0.5:8001"]
    ep = ds.snapshot("llama").by_key["10.0.0.1:8000"]
    assert ep.name == "p1" and ep.namespace == "default" and ep.role == "decode" and ep.labels["app"] == "vllm"
    spec = ds.snapshot("llama").spec
    assert spec.selector == VLLM and spec.target_ports == (8000, 8001)
    assert ds.objectives == {"batch": -1, "chat": 0}
    assert [r.exact for r in ds.rewrites] == [frozenset({"food-review"}), frozenset()]
    assert [t.model for t in ds.rewrites[0].targets] == ["food-review-v1", "food-review-v2"]
    # the pool is watched by name, pods by the pool's selector
    pod_lists = [p for v, pl, p in kube.requests if v == "list" and pl == "pods"]
    assert pod_lists[0]["labelSelector"] == "app=vllm"
    assert [p for v, pl, p in kube.requests if pl == "inferencepools"][0]["fieldSelector"] == "metadata.name=llama"


async def test_not_synced_until_the_pool_exists(kube, discover):
    kube.apply(CORE, "pods", pod("p1", "10.0.0.1", VLLM))
    ds, disc = await discover()
    # Every reflector lists, hands the list over, then watches: once all three watch, discovery has seen everything
    # there is (no pool) and will do nothing more until an event arrives.
    await until(lambda: all(kube.count("watch", plural) >= 1 for plural in
                            ("inferencepools", "inferenceobjectives", "inferencemodelrewrites")), 10.0, "the pool, objective and rewrite watches")
    assert kube.count("list", "pods") == 0  # no pool, no selector: pods are not even listed
    assert not ds.synced and ds.snapshot("llama") is None
    kube.apply(POOLS, "inferencepools", pool("llama", VLLM, [8000]))
    assert await disc.wait_synced(5)
    assert keys(ds) == ["10.0.0.1:8000"]


async def test_pod_lifecycle(kube, discover):
    seed(kube)
    ds, disc = await discover()
    assert await disc.wait_synced(5)
    kube.apply(CORE, "pods", pod("p7", "10.0.0.7", VLLM))
    await until(lambda: "10.0.0.7:8000" in keys(ds), 10.0, "p7 added")
    kube.apply(CORE, "pods", pod("p7", "10.0.0.7", VLLM, ready=False))
    await until(lambda: "10.0.0.7:8000" not in keys(ds), 10.0, "p7 not ready")
    kube.apply(CORE, "pods", pod("p2", "10.0.0.2", VLLM))  # becomes ready
    await until(lambda: "10.0.0.2:8001" in keys(ds), 10.0, "p2 ready")
    kube.apply(CORE, "pods", pod("p1", "10.0.0.1", VLLM, annotations={"inference.networking.k8s.io/active-ports": "8000"}))
    await until(lambda: "10.0.0.1:8001" not in keys(ds), 10.0, "p1 narrowed to 8000")
    assert "10.0.0.1:8000" in keys(ds)
    kube.apply(CORE, "pods", pod("p5", "10.0.0.5", VLLM, terminating=True))
    await until(lambda: "10.0.0.5:8001" not in keys(ds), 10.0, "p5 terminating")
    kube.apply(CORE, "pods", pod("p3", "10.0.0.3", VLLM))  # relabelled into the pool
    await until(lambda: "10.0.0.3:8000" in keys(ds), 10.0, "p3 joins")
    kube.apply(CORE, "pods", pod("p3", "10.0.0.3", {"app": "other"}))  # and out again
    await until(lambda: "10.0.0.3:8000" not in keys(ds), 10.0, "p3 leaves")
    kube.delete(CORE, "pods", "p2")
    await until(lambda: keys(ds) == ["10.0.0.1:8000"], 10.0, "p2 deleted")


async def test_pool_changes_selector_and_ports(kube, discover):
    seed(kube)
    kube.apply(CORE, "pods", pod("v2-a", "10.0.1.1", {"app": "vllm-v2"}))
    ds, disc = await discover()
    assert await disc.wait_synced(5)
    lists_before = kube.count("list", "pods")
    kube.apply(POOLS, "inferencepools", pool("llama", {"app": "vllm-v2"}, [9000]))
    await until(lambda: keys(ds) == ["10.0.1.1:9000"], 10.0, "new selector's pods")
    assert kube.count("list", "pods") == lists_before + 1
    assert ds.snapshot("llama").spec.target_ports == (9000,)
    kube.apply(CORE, "pods", pod("v2-b", "10.0.1.2", {"app": "vllm-v2"}))  # the new watch is live
    await until(lambda: "10.0.1.2:9000" in keys(ds), 10.0, "pod under the new selector")
    kube.apply(CORE, "pods", pod("old", "10.0.0.9", VLLM))  # the old selector is no longer watched
    # A marker under the new selector, applied after it: once discovery has it, an old-selector watch would have
    # been sent the older event too.
    kube.apply(CORE, "pods", pod("v2-c", "10.0.1.3", {"app": "vllm-v2"}))
    await until(lambda: "10.0.1.3:9000" in keys(ds), 10.0, "the marker pod under the new selector")
    assert "10.0.0.9:9000" not in keys(ds)
    kube.apply(POOLS, "inferencepools", pool("llama", {"app": "vllm-v2"}, [9000, 9001]))
    await until(lambda: len(keys(ds)) == 6, 10.0, "second port")  # three pods, two ports each


@pytest.mark.parametrize("kube", ["event", "http"], indirect=True)
async def test_410_gone_relists(kube, discover):
    seed(kube)
    ds, disc = await discover()
    assert await disc.wait_synced(5)
    assert kube.count("list", "pods") == 1
    if kube.gone_mode == "event":
        # changes the watch will never replay, then the server says the watch's version is gone
        kube.compact()
        kube.apply(CORE, "pods", pod("p8", "10.0.0.8", VLLM))
        kube.delete(CORE, "pods", "p1")
        kube.compact()
        kube.expire_watches()
    else:
        kube.cut_watches()  # the client comes back with its old resourceVersion ...
        kube.apply(CORE, "pods", pod("p8", "10.0.0.8", VLLM))
        kube.delete(CORE, "pods", "p1")
        kube.compact()  # ... which is gone by then: HTTP 410
    await until(lambda: keys(ds) == ["10.0.0.5:8001", "10.0.0.8:8000", "10.0.0.8:8001"], 10.0, "relist")
    assert kube.count("list", "pods") >= 2
    assert ds.synced


async def test_watch_cut_mid_stream_resumes_without_relist(kube, discover):
    seed(kube)
    ds, disc = await discover()
    assert await disc.wait_synced(5)
    lists = kube.count("list", "pods")
    watches = kube.count("watch", "pods")
    kube.cut_watches()
    kube.apply(CORE, "pods", pod("p9", "10.0.0.9", VLLM))
    # The cut may land after the event went out on the old stream: either way the client must watch again.
    await until(lambda: kube.count("watch", "pods") > watches, 10.0, "a new watch after the cut")
    await until(lambda: "10.0.0.9:8000" in keys(ds), 10.0, "event after reconnect")
    assert kube.count("list", "pods") == lists  # history still there: resumed from resourceVersion
    assert not any(e.name.startswith("half") for e in ds.snapshot("llama").endpoints)


async def test_watch_timeout_rewatches_from_last_version(kube, discover):
    seed(kube)
    ds, disc = await discover(watch_timeout_s=1)
    assert await disc.wait_synced(5)
    watches = kube.count("watch", "pods")
    await until(lambda: kube.count("watch", "pods") > watches, 3, "re-watch after timeout")
    rvs = [int(p["resourceVersion"]) for v, pl, p in kube.requests if v == "watch" and pl == "pods"]
    assert rvs == sorted(rvs) and rvs[0] > 0
    kube.apply(CORE, "pods", pod("p10", "10.0.0.10", VLLM))
    await until(lambda: "10.0.0.10:8000" in keys(ds), 10.0)
    assert kube.count("list", "pods") == 1


async def test_objectives_and_rewrites_follow_changes(kube, discover, caplog):
    seed(kube)
    ds, disc = await discover()
    assert await disc.wait_synced(5)
    kube.apply(X, "inferenceobjectives", objective("chat", "llama", 5))
    await until(lambda: ds.objectives.get("chat") == 5, 10.0)
    kube.delete(X, "inferenceobjectives", "batch")
    await until(lambda: "batch" not in ds.objectives, 10.0)
    with caplog.at_level(logging.ERROR):
        kube.apply(X, "inferencemodelrewrites", rewrite("broken", "llama", [
            {"matches": [{"model": {"type": "RegularExpression", "value": ".*"}}], "targets": [{"modelRewrite": "x"}]}]))
        kube.apply(X, "inferencemodelrewrites", rewrite("older", "llama", [
            {"matches": [{"model": {"value": "food-review"}}], "targets": [{"modelRewrite": "legacy"}]}],
            created="2025-06-01T00:00:00Z"))
        await until(lambda: len(ds.rewrites) == 3, 10.0)
    assert "not supported" in caplog.text
    assert [r.targets[0].model for r in ds.rewrites][0] == "legacy"  # oldest first
    kube.delete(X, "inferencemodelrewrites", "canary")
    await until(lambda: [r.name for r in ds.rewrites] == ["default/older"], 10.0)


async def test_pool_deleted_and_recreated(kube, discover):
    seed(kube)
    ds, disc = await discover()
    assert await disc.wait_synced(5)
    kube.delete(POOLS, "inferencepools", "llama")
    await until(lambda: not ds.synced and ds.snapshot("llama") is None, 10.0, "pool removed")
    kube.apply(POOLS, "inferencepools", pool("llama", VLLM, [8000]))
    assert await disc.wait_synced(5)
    await until(lambda: keys(ds) == ["10.0.0.1:8000", "10.0.0.5:8000"] or keys(ds) == ["10.0.0.1:8000"], 10.0)
    # p5's active-ports annotation says 8001 only; with the pool on 8000 it has no endpoint
    assert keys(ds) == ["10.0.0.1:8000"]


async def test_api_errors_back_off_and_recover(kube, discover):
    seed(kube)
    kube.fail_next = 3  # the first requests get HTTP 500
    ds, disc = await discover()
    assert await disc.wait_synced(5)
    assert keys(ds) == ["10.0.0.1:8000", "10.0.0.1:8001", "10.0.0.5:8001"]


async def test_selector_mode(kube):
    kube.apply(CORE, "pods", pod("s1", "10.0.2.1", {"app": "sim", "tier": "a"}))
    kube.apply(CORE, "pods", pod("s2", "10.0.2.2", {"app": "sim", "tier": "b"}))
    ds = Datastore()
    disc = await start_selector_discovery(ds, "default", {"app": "sim", "tier": "a"}, (8000, 8001),
                                          pool_name="standalone", api=make_api_client(host=kube.host), **OPTS)
    try:
        assert await disc.wait_synced(5)
        assert keys(ds, "standalone") == ["10.0.2.1:8000", "10.0.2.1:8001"]
        kube.apply(CORE, "pods", pod("s3", "10.0.2.3", {"app": "sim", "tier": "a"}))
        await until(lambda: len(keys(ds, "standalone")) == 4, 10.0)
        kube.delete(CORE, "pods", "s1")
        await until(lambda: keys(ds, "standalone") == ["10.0.2.3:8000", "10.0.2.3:8001"], 10.0)
        assert kube.count("list", "inferencepools") == 0
    finally:
        await disc.stop()


def pool_v1alpha2(name, selector, port):
    return {"metadata": {"name": name, "namespace": "default"},
            "spec": {"selector": selector, "targetPortNumber": port,
                     "extensionRef": {"name": f"{name}-epp", "failureMode": "FailClose"}}}


async def test_pool_group_v1alpha2_inferencepool(kube, discover):
    """--pool-group inference.networking.x-k8s.io watches the older v1alpha2 InferencePool; objectives must refer
    to the pool in that group."""
    kube.apply(X, "inferencepools", pool_v1alpha2("llama", VLLM, 8000))
    kube.apply(POOLS, "inferencepools", pool("llama", {"app": "other"}, [9000]))  # the v1 namesake is not ours
    kube.apply(CORE, "pods", pod("p1", "10.0.0.1", VLLM))
    kube.apply(CORE, "pods", pod("p2", "10.0.0.2", {"app": "other"}))
    old_style = objective("batch", "llama", -1)
    old_style["spec"]["poolRef"]["group"] = X
    kube.apply(X, "inferenceobjectives", old_style)
    kube.apply(X, "inferenceobjectives", objective("v1-ref", "llama", 5))  # refers to the v1 group
    ds, disc = await discover(pool_group=X)
    assert await disc.wait_synced(5)
    assert keys(ds) == ["10.0.0.1:8000"]
    assert ds.objectives == {"batch": -1}
    assert any(r[1] == "inferencepools" and r[0] == "list" for r in kube.requests)
    kube.apply(X, "inferencepools", pool_v1alpha2("llama", VLLM, 8001))  # the port moves
    await until(lambda: keys(ds) == ["10.0.0.1:8001"], 10.0, "v1alpha2 port change")


async def test_unknown_pool_group_is_refused(kube):
    with pytest.raises(ValueError, match="--pool-group 'example.com' is not an InferencePool API group"):
        await start_pool_discovery(Datastore(), "llama", "default", api=make_api_client(host=kube.host),
                                   pool_group="example.com", **OPTS)
