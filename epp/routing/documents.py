"""Route documents from any source, compiled per document with last-good semantics.

Every document is compiled on its own by the dialect of its apiVersion group (epp/routing/dialects). A document that
fails keeps the last good version of the same object (kind, namespace, name) from the same source, so a bad
document never takes down the good ones, nor the object's previous version; the error is logged with the
document, the field and what was expected, and counted. The current RoutingTable is the union of every source's
good documents.

Sources: "file:<path>" (the whole set is replaced at each reload; a document that disappeared is gone) and
"kubernetes" (objects are upserted and deleted one by one by the watcher).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import yaml

from epp.routing.dialect import Dialect, Identity
from epp.routing.dialects import BY_GROUP
from epp.routing.model import PoolBackend, ProviderBackend, Route, RouteConfigError, RoutingTable
from epp.routing.validate import document_name

log = logging.getLogger(__name__)

# A dialect compiles one document to one object (Kthena) or to several (a router document that defines its routes
# and backends at once): objects of the shared route model, or the dialect's own (kept under its name).
Compiled = object


@dataclass(frozen=True, slots=True)
class RawDocument:
    obj: object
    where: str  # e.g. "routes.yaml, document 3"
    position: float = 0.0


def read_yaml(text: str, label: str) -> list[RawDocument]:
    """A multi-document YAML text -> its documents (`kind: List` / `...List` expanded). Raises RouteConfigError when
    the YAML itself does not parse (nothing in it can be trusted then)."""
    try:
        raw = list(yaml.safe_load_all(text))
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark is not None else "the file"
        raise RouteConfigError(label, where, f"valid YAML ({getattr(err, 'problem', None) or err})") from None
    out = []
    n = 0
    for obj in raw:
        if obj is None:
            continue
        items = obj.get("items") if isinstance(obj, Mapping) and str(obj.get("kind", "")).endswith("List") else None
        for item in items if isinstance(items, list) else [obj]:
            n += 1
            out.append(RawDocument(item, f"{label}, document {n}", float(n)))
    return out


def _group(obj: object) -> str:
    api = obj.get("apiVersion") if isinstance(obj, Mapping) else None
    return str(api).split("/", 1)[0] if isinstance(api, str) and "/" in api else ""


class DocumentSet:
    def __init__(self, on_error: Callable[[str, RouteConfigError], None] | None = None,
                 dialects: Mapping[str, Dialect] = BY_GROUP) -> None:
        self.dialects = dialects  # apiVersion group -> dialect
        # source -> identity -> (dialect name, compiled objects)
        self._good: dict[str, dict[Identity, tuple[str, tuple[Compiled, ...]]]] = {}
        self.errors: dict[tuple[str, str], str] = {}  # (source, document) -> current error message
        self.error_total = 0
        self.on_error = on_error

    def _compile(self, source: str, doc: RawDocument
                 ) -> tuple[Identity | None, tuple[str, tuple[Compiled, ...]] | None]:
        group = _group(doc.obj)
        dialect = self.dialects.get(group)
        ident = dialect.identity(doc.obj) if dialect is not None and isinstance(doc.obj, Mapping) else None
        try:
            if dialect is None:
                name = document_name(doc.obj, doc.where)
                got_api = doc.obj.get("apiVersion") if isinstance(doc.obj, Mapping) else doc.obj
                raise RouteConfigError(name, "apiVersion", f"a route API "
                                       f"({', '.join(f'{g}/...' for g in self.dialects)}), got {got_api!r}")
            got = dialect.compile(doc.obj, doc.where, doc.position)
        except RouteConfigError as err:
            self._record(source, doc.where, ident, err)
            return ident, None
        self.errors.pop((source, doc.where), None)
        return ident, (dialect.name, tuple(got) if isinstance(got, Sequence) else (got,))

    def _record(self, source: str, where: str, ident: Identity | None, err: RouteConfigError) -> None:
        self.errors[(source, where)] = str(err)
        self.error_total += 1
        kept = ident is not None and ident in self._good.get(source, {})
        log.error("route document rejected: %s%s", err,
                  "; its last good version keeps serving" if kept else "")
        if self.on_error is not None:
            self.on_error(ident[0] if ident else "unknown", err)

    # ---- sources -------------------------------------------------------------------------------------------
    def replace(self, source: str, docs: Sequence[RawDocument]) -> None:
        """A source's whole set (a file): documents absent now are removed; a failing one keeps its last good."""
        old = self._good.get(source, {})
        new: dict[Identity, tuple[str, tuple[Compiled, ...]]] = {}
        self.errors = {k: v for k, v in self.errors.items() if k[0] != source}
        for doc in docs:
            ident, compiled = self._compile(source, doc)
            if compiled is not None and ident is not None:
                new[ident] = compiled
            elif ident is not None and ident in old and ident not in new:
                new[ident] = old[ident]
        self._good[source] = new

    def upsert(self, source: str, doc: RawDocument) -> bool:
        """One object changed (Kubernetes). False when it failed (its last good version stays)."""
        ident, compiled = self._compile(source, doc)
        if compiled is None or ident is None:
            return False
        self._good.setdefault(source, {})[ident] = compiled
        return True

    def delete(self, source: str, ident: Identity) -> None:
        self._good.get(source, {}).pop(ident, None)
        self.errors = {k: v for k, v in self.errors.items()
                       if not (k[0] == source and f"{ident[0]} {ident[1]}/{ident[2]}" in v)}

    def clear(self, source: str) -> None:
        self._good.pop(source, None)

    # ---- the table -----------------------------------------------------------------------------------------
    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for objs in self._good.values():
            for kind, _, _ in objs:
                out[kind] = out.get(kind, 0) + 1
        return out

    def table(self) -> RoutingTable:
        routes: dict[str, Route] = {}
        pools: dict[str, PoolBackend] = {}
        providers: dict[str, ProviderBackend] = {}
        extras: dict[str, dict[object, object]] = {}  # dialect -> key -> its own object
        for objs in self._good.values():
            for dialect, group in objs.values():
                for obj in group:
                    if isinstance(obj, Route):
                        routes[f"{obj.kind}/{obj.key}"] = obj
                    elif isinstance(obj, PoolBackend):
                        pools[obj.key] = obj
                    elif isinstance(obj, ProviderBackend):
                        providers[obj.key] = obj
                    else:
                        extras.setdefault(dialect, {})[getattr(obj, "key", id(obj))] = obj
        return RoutingTable.build(list(routes.values()), list(pools.values()), list(providers.values()),
                                  {name: list(objs.values()) for name, objs in extras.items()})
