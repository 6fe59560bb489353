"""Routing dialects behind one interface: the registered ones declare what the shell needs, and a new dialect is one
declaration that compiles onto the shared route model (the router, matcher and pools then serve it unchanged)."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import orjson

from epp.fleet.datastore import Datastore
from epp.fleet.k8s import ROUTE_RESOURCES, Resource
from epp.request.director import Director
from epp.routing.dialect import Dialect
from epp.routing.dialects import BY_GROUP, DIALECTS
from epp.routing.documents import DocumentSet, RawDocument
from epp.routing.model import Match, PoolBackend, Route, Rule, StaticEndpoint, Target
from epp.routing.router import Router
from epp.routing.validate import Doc, document_name
from scheduling.config import load_scheduler

ROOT = Path(__file__).resolve().parents[2]


def test_every_registered_dialect_declares_what_the_shell_needs() -> None:
    assert [d.name for d in DIALECTS] == ["kthena", "llmkube"]
    for d in DIALECTS:
        assert d.group and BY_GROUP[d.group] is d
        assert d.resources and set(d.resources) <= set(ROUTE_RESOURCES), "the RBAC grants what a dialect watches"
        assert (ROOT / d.page).is_file(), d.page
        assert d.example is not None and d.example.routes([8000, 8001], "m").strip()
    assert next(d for d in DIALECTS if d.name == "llmkube").runtime is not None


# ---- a third dialect: one declaration ---------------------------------------------------------------------------
GROUP = "routes.example.dev"


def compile_simple(obj: Any, where: str, position: float) -> list[Any]:
    """`kind: SimpleRoute`: `spec.model` to the endpoints in `spec.hosts` (host:port), all of one pool."""
    doc = Doc(document_name(obj, where))
    ns, name = doc.object_ref(obj.get("metadata", {}))
    spec = obj["spec"]
    key = f"{ns}/{name}"
    eps = tuple(StaticEndpoint(f"h{i}", h.split(":")[0], int(h.split(":")[1])) for i, h in enumerate(spec["hosts"]))
    pool = PoolBackend(key=key, kind="SimpleRoute", namespace=ns, endpoints=eps)
    route = Route(key=key, kind="SimpleRoute", source=where, models=(spec["model"],), order=(position, key),
                  rules=(Rule("all", 0, Match(), (Target("pool", key, 1),)),))
    return [route, pool]


SIMPLE = Dialect(name="simple", group=GROUP, resources=(Resource(GROUP, "v1", "simpleroutes", "SimpleRoute"),),
                 compile=compile_simple)


def test_a_new_dialect_is_one_declaration_served_by_the_shared_router() -> None:
    docs = DocumentSet(dialects={**BY_GROUP, GROUP: SIMPLE})
    doc = {"apiVersion": f"{GROUP}/v1", "kind": "SimpleRoute", "metadata": {"name": "s"},
           "spec": {"model": "tiny", "hosts": ["10.9.0.1:8000", "10.9.0.2:8000"]}}
    docs.replace("file:x", [RawDocument(doc, "x, document 1", 1.0)])
    assert not docs.errors and docs.counts() == {"SimpleRoute": 1}
    ds = Datastore()
    router = Router(ds, random.Random(1))
    router.apply(docs.table())
    d = Director(ds, load_scheduler(None, rng=random.Random(1)), router=router)
    out = d.exchange().decide({":path": "/v1/chat/completions", ":method": "POST"},
                              orjson.dumps({"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}), {})
    assert not out.reject_status, out.reject_body
    assert dict(out.set_headers)["x-gateway-destination-endpoint"] in ("10.9.0.1:8000", "10.9.0.2:8000")


def test_a_document_of_no_registered_dialect_names_the_known_ones() -> None:
    docs = DocumentSet()
    docs.replace("file:x", [RawDocument({"apiVersion": f"{GROUP}/v1", "kind": "SimpleRoute",
                                         "metadata": {"name": "s"}}, "x, document 1")])
    [err] = docs.errors.values()
    assert "networking.serving.volcano.sh/..." in err and "inference.llmkube.dev/..." in err and GROUP in err
