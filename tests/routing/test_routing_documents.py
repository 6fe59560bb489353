"""Bad route documents: errors name the document, the field and what was expected; a bad document in a watched
set never takes down the good ones (its last good version keeps serving); hot reload of the routes file."""

from __future__ import annotations

import logging

import pytest
from routing_helpers import decide, hdrs, routed

from epp.routing.documents import DocumentSet, read_yaml
from epp.routing.model import RouteConfigError
from tests.support.wait import until

HEAD = "apiVersion: networking.serving.volcano.sh/v1alpha1\n"
GOOD_SERVER = HEAD + """kind: ModelServer
metadata: {name: s}
spec:
  inferenceEngine: vLLM
  workloadPort: {port: 8000}
  endpoints: [{name: e1, address: 10.0.0.1}]
"""
GOOD_ROUTE = HEAD + """kind: ModelRoute
metadata: {name: r}
spec:
  modelName: m
  rules: [{name: all, targetModels: [{modelServerName: s}]}]
"""

BAD = [
    # (document, the field the error names, words of the expectation)
    (HEAD + "kind: ModelRoute\nmetadata: {name: r2}\nspec:\n  rules: []\n", "spec",
     "modelName or loraAdapters"),
    (GOOD_ROUTE.replace("name: r}", "name: r2}").replace("{modelServerName: s}",
                                                         "{modelServerName: s, weight: 150}"),
     "spec.rules[0].targetModels[0].weight", "an integer in 0..100, got 150"),
    (GOOD_ROUTE.replace("name: r}", "name: r2}").replace("{modelServerName: s}",
                                                         "{modelServerName: s, externalModelProviderName: p}"),
     "spec.rules[0].targetModels[0]", "exactly one of modelServerName or externalModelProviderName"),
    (GOOD_ROUTE.replace("name: r}", "name: r2}").replace("{modelServerName: s}", "{modelServerName: s, weight: 0}"),
     "spec.rules[0].targetModels", "a total weight above 0"),
    (GOOD_ROUTE.replace("name: r}", "name: r2}").replace("{name: all,",
                                                         "{name: all, modelMatch: {uri: {regex: '(['}},"),
     "spec.rules[0].modelMatch.uri.regex", "a valid regular expression"),
    (GOOD_ROUTE.replace("name: r}", "name: r2}").replace("{name: all,",
                                                         "{name: all, modelMatch: {headers: {a: {exact: x, prefix: y}}},"),
     "spec.rules[0].modelMatch.headers.a", "only one of exact, prefix, regex"),
    (GOOD_ROUTE.replace("name: r}", "name: r2}").replace("modelName: m", "modelName: m\n  rateLimit: {unit: week}"),
     "spec.rateLimit.unit", "one of second, minute, hour, day, month, got 'week'"),
    (GOOD_ROUTE.replace("name: r}", "name: r2}").replace("modelName: m", "modelName: m\n  ruless: []"),
     "spec.ruless", "unknown field 'ruless'"),
    (GOOD_SERVER.replace("name: s}", "name: s2}").replace("  endpoints:", "  workloadSelector: {matchLabels: {a: b}}\n"
                                                                         "  endpoints:"),
     "spec", "exactly one of workloadSelector.matchLabels and endpoints (both are set)"),
    (GOOD_SERVER.replace("name: s}", "name: s2}").replace("  workloadPort: {port: 8000}\n", ""),
     "spec.endpoints[0].port", "spec.workloadPort.port as the default"),
    (GOOD_SERVER.replace("name: s}", "name: s2}").replace("inferenceEngine: vLLM", "inferenceEngine: TGI"),
     "spec.inferenceEngine", "one of vLLM, SGLang, got 'TGI'"),
    (GOOD_SERVER.replace("name: s}", "name: s2}").replace(
        "endpoints:", "trafficPolicy: {sessionSticky: {sources: [{type: Body, name: x}]}}\n  endpoints:"),
     "spec.trafficPolicy.sessionSticky.sources[0].type", "one of Header, Query, Cookie, JWTClaim"),
    (GOOD_SERVER.replace("name: s}", "name: s2}").replace(
        "endpoints:", "trafficPolicy: {sessionSticky: {sources: []}}\n  endpoints:"),
     "spec.trafficPolicy.sessionSticky.sources", "at least 1 item"),
    (GOOD_SERVER.replace("name: s}", "name: s2}").replace(
        "endpoints:", "workloadSelector: {pdGroup: {groupKey: g, prefillLabels: {}, decodeLabels: {r: d}}}\n"
                      "  endpoints:"),
     "spec.workloadSelector.pdGroup.prefillLabels", "a non-empty map"),
    (HEAD + "kind: ExternalModelProvider\nmetadata: {name: p}\nspec: {baseURL: 'http://api.example.com'}\n",
     "spec.baseURL", "external providers must use HTTPS"),
    (HEAD + "kind: ExternalModelProvider\nmetadata: {name: p}\nspec:\n  baseURL: https://api.example.com\n"
            "  headers: {Authorization: x}\n", "spec.headers.Authorization", "a non-reserved header"),
    (HEAD + "kind: ExternalModelProvider\nmetadata: {name: p}\nspec:\n  baseURL: https://api.example.com\n"
            "  auth: {scheme: Basic, secretRef: {name: s, key: k}}\n", "spec.auth.scheme", "one of Bearer, APIKey"),
    ("apiVersion: networking.serving.volcano.sh/v1beta9\nkind: ModelRoute\nmetadata: {name: x}\nspec: {}\n",
     "apiVersion", "'networking.serving.volcano.sh/v1alpha1', got 'networking.serving.volcano.sh/v1beta9'"),
    ("apiVersion: example.com/v1\nkind: Route\nmetadata: {name: x}\nspec: {}\n", "apiVersion",
     "a route API (networking.serving.volcano.sh/..., inference.llmkube.dev/...), got 'example.com/v1'"),
    (HEAD + "kind: ModelRoute\nmetadata: {name: Bad_Name}\nspec: {modelName: m}\n", "metadata.name",
     "a DNS-1123 name"),
]


@pytest.mark.parametrize("text,field,expected", BAD, ids=[b[1] for b in BAD])
def test_a_bad_document_names_the_document_the_field_and_the_expectation(text, field, expected, caplog):
    docs = DocumentSet()
    with caplog.at_level(logging.ERROR):
        docs.replace("file:routes.yaml", read_yaml(GOOD_SERVER + "---\n" + text, "routes.yaml"))
    [(key, msg)] = docs.errors.items()
    assert key == ("file:routes.yaml", "routes.yaml, document 2")
    assert "(routes.yaml, document 2)" in msg, msg
    assert f": {field}: expected " in msg, msg
    assert expected in msg, msg
    assert msg in caplog.text
    assert docs.error_total == 1
    assert docs.counts().get("ModelServer") == 1  # the good document next to it serves


def test_invalid_yaml_is_one_error_naming_the_file_and_line():
    with pytest.raises(RouteConfigError) as e:
        read_yaml(GOOD_SERVER + "---\nkind: [unclosed\n", "routes.yaml")
    assert str(e.value).startswith("routes.yaml: line ") and "expected valid YAML" in str(e.value)


def test_a_document_that_turns_bad_keeps_its_last_good_version_and_the_others_serve():
    d, svc = routed(GOOD_SERVER + "---\n" + GOOD_ROUTE)
    assert hdrs(decide(d, "m")[1])["x-gateway-destination-endpoint"] == "10.0.0.1:8000"
    broken = GOOD_SERVER.replace("address: 10.0.0.1", "address: 10.0.0.2").replace("inferenceEngine: vLLM",
                                                                                  "inferenceEngine: nope")
    svc.load_text(broken + "---\n" + GOOD_ROUTE.replace("rules:", "rules:\n  - {name: new, modelMatch: "
                                                        "{headers: {x: {exact: y}}}, targetModels: "
                                                        "[{modelServerName: s}]}\n  rules_old:"), "routes.yaml")
    # Both documents are now bad: each keeps its last good version.
    assert len(svc.documents.errors) == 2
    assert hdrs(decide(d, "m")[1])["x-gateway-destination-endpoint"] == "10.0.0.1:8000"
    # Fix the route, keep the server broken: the new route serves, the server's last good version too.
    svc.load_text(broken + "---\n" + GOOD_ROUTE.replace("{name: all,", "{name: fixed,"), "routes.yaml")
    assert len(svc.documents.errors) == 1
    assert svc.router.table.routes[0].rules[0].name == "fixed"
    assert hdrs(decide(d, "m")[1])["x-gateway-destination-endpoint"] == "10.0.0.1:8000"
    # A document removed from the file is gone.
    svc.load_text(GOOD_SERVER, "routes.yaml")
    assert decide(d, "m")[1].reject_status == 404


async def test_routes_file_hot_reload(tmp_path, caplog):
    from epp.fleet.datastore import Datastore
    from epp.routing.service import RoutingService

    path = tmp_path / "routes.yaml"
    path.write_text(GOOD_SERVER + "---\n" + GOOD_ROUTE)
    ds = Datastore()
    import random

    svc = RoutingService(ds, random.Random(1))
    await svc.add_file(path, interval=0.05)
    try:
        assert [r.key for r in svc.router.table.routes] == ["default/r"]
        path.write_text(GOOD_SERVER + "---\n" + GOOD_ROUTE.replace("modelName: m", "modelName: m2"))
        await until(lambda: svc.router.table.routes and svc.router.table.routes[0].models == ("m2",), 5,
                    "the edited route reloaded", 0.05)
        caplog.set_level(logging.ERROR, logger="epp.fleet.reload")
        broken = path.with_suffix(".new")
        broken.write_text("kind: [broken")  # unparsable YAML: everything keeps serving
        broken.replace(path)  # in one step: the watcher never reads a half-written (empty) file
        await until(lambda: any("expected valid YAML" in r.getMessage() for r in caplog.records), 5,
                    "the watcher to reject the broken file")
        assert svc.router.table.routes[0].models == ("m2",)
    finally:
        await svc.stop()
