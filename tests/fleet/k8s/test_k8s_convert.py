import pytest
from fakeapi import pod, pool, rewrite

from epp.fleet.k8s import ROUTE_RESOURCES, WATCHED_RESOURCES, Resource
from epp.fleet.k8s.convert import (
    InvalidObject,
    parse_ports,
    parse_selector,
    pod_endpoints,
    pool_spec,
    rewrite_rules,
)
from epp.fleet.k8s.discovery import list_call, make_api_client


def test_selector_and_ports_flags():
    assert parse_selector("app=vllm, tier==gpu") == {"app": "vllm", "tier": "gpu"}
    with pytest.raises(ValueError, match="key=value"):
        parse_selector("app!=vllm")
    with pytest.raises(ValueError, match="selects nothing"):
        parse_selector(" , ")
    assert parse_ports("8000,8001,8000") == (8000, 8001)
    with pytest.raises(ValueError, match="1-65535"):
        parse_ports("80a")
    with pytest.raises(ValueError, match="1 to 8"):
        parse_ports(",".join(str(8000 + i) for i in range(9)))


def test_pool_spec_validation_names_the_field():
    spec = pool_spec(pool("p", {"app": "x"}, [8000, 8001]))
    assert spec.target_ports == (8000, 8001) and spec.app_protocol == "http"
    with pytest.raises(InvalidObject, match="matchLabels"):
        pool_spec(pool("p", {}, [8000]))
    with pytest.raises(InvalidObject, match=r"targetPorts\[0\].number"):
        pool_spec(pool("p", {"a": "b"}, [0]))
    with pytest.raises(InvalidObject, match="1 to 8"):
        pool_spec(pool("p", {"a": "b"}, list(range(8000, 8009))))


def test_pod_endpoints_ipv6_models_and_phase():
    p = pod("v6", "fd00::5", {"llm-d.ai/model": "llama"}, annotations={"llm-d.ai/models": "meta/llama-3, sql-lora"})
    eps = pod_endpoints(p, [8000])
    assert eps[0].key == "[fd00::5]:8000" and eps[0].models == {"meta/llama-3", "sql-lora"}
    assert pod_endpoints(pod("x", "10.0.0.1", {"llm-d.ai/model": "llama"}), [8000])[0].models == {"llama"}
    assert pod_endpoints(pod("x", "10.0.0.1", {}, phase="Succeeded"), [8000]) == []


def test_rewrite_rules_validation():
    with pytest.raises(InvalidObject, match=r"targets\[0\].weight"):
        rewrite_rules(rewrite("r", "p", [{"targets": [{"modelRewrite": "a", "weight": -1}]}]))
    with pytest.raises(InvalidObject, match="targets must not be empty"):
        rewrite_rules(rewrite("r", "p", [{"matches": [{"model": {"value": "m"}}]}]))
    rules = rewrite_rules(rewrite("r", "p", [{"targets": [{"modelRewrite": "a"}]}], created="2026-02-01T00:00:00Z"))
    assert rules[0].generic and rules[0].created > 0 and rules[0].name == "default/r"


def test_watchers_only_for_declared_resources():
    api = make_api_client(host="http://127.0.0.1:1")
    for res in (*WATCHED_RESOURCES, *ROUTE_RESOURCES):
        assert callable(list_call(api, res, "default"))
    with pytest.raises(ValueError, match="WATCHED_RESOURCES"):
        list_call(api, Resource("", "v1", "configmaps", "ConfigMap"), "default")


def test_v1alpha2_pool_spec():
    obj = {"apiVersion": "inference.networking.x-k8s.io/v1alpha2", "kind": "InferencePool",
           "metadata": {"name": "old", "namespace": "ns"},
           "spec": {"selector": {"app": "vllm"}, "targetPortNumber": 8000, "extensionRef": {"name": "epp"}}}
    spec = pool_spec(obj)
    assert spec.name == "old" and spec.namespace == "ns" and spec.selector == {"app": "vllm"}
    assert spec.target_ports == (8000,)
    with pytest.raises(InvalidObject, match="spec.targetPortNumber must be 1-65535"):
        pool_spec({**obj, "spec": {"selector": {"app": "vllm"}, "targetPortNumber": 0}})
    with pytest.raises(InvalidObject, match="spec.selector must be a non-empty map of labels"):
        pool_spec({**obj, "spec": {"selector": {"matchLabels": {"app": "vllm"}}, "targetPortNumber": 8000}})
