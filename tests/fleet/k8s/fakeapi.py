"""A wire-level fake Kubernetes API server for the discovery tests.

A real HTTP/1.1 server (http.server in a thread) speaking the list/watch JSON protocol for pods, secrets,
endpointslices, inferencepools, inferenceobjectives, inferencemodelrewrites and Kthena's modelroutes, modelservers and
externalmodelproviders:

- LIST  GET /api/v1/namespaces/{ns}/pods, GET /apis/{group}/{version}/namespaces/{ns}/{plural}
  → {"kind": "...List", "metadata": {"resourceVersion"}, "items": [...]}; labelSelector (k=v, k!=v) and
  fieldSelector (metadata.name=...) are honoured.
- WATCH the same path with ?watch=true&resourceVersion=N&timeoutSeconds=T → a chunked stream of
  {"type": ADDED|MODIFIED|DELETED|BOOKMARK|ERROR, "object": ...} lines, one per chunk. Events are translated by the
  selector the way the API server does (an object that stops matching is DELETED, one that starts matching is
  ADDED). The stream ends after timeoutSeconds.
- 410 Gone: `compact()` forgets history; a watch from an older resourceVersion gets an ERROR event with code 410
  (gone_mode="event") or an HTTP 410 Status (gone_mode="http"). `expire_watches()` sends the 410 ERROR event to every
  open watch.
- `cut_watches()` drops every open watch connection mid-stream (half an event written, no final chunk).
- CREATE POST /apis/authentication.k8s.io/v1/tokenreviews: `tokens` (token -> user info) says who a token is;
  POST /apis/authorization.k8s.io/v1/subjectaccessreviews: allowed iff (user, verb, path) of the review's
  nonResourceAttributes is in `grants`. `reviews` records (kind, what was asked) in order.
"""

from __future__ import annotations

import copy
import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

import yaml

KINDS = {
    ("", "pods"): "Pod",
    ("", "secrets"): "Secret",
    ("networking.serving.volcano.sh", "modelroutes"): "ModelRoute",
    ("networking.serving.volcano.sh", "modelservers"): "ModelServer",
    ("networking.serving.volcano.sh", "externalmodelproviders"): "ExternalModelProvider",
    ("inference.llmkube.dev", "modelrouters"): "ModelRouter",
    ("inference.networking.k8s.io", "inferencepools"): "InferencePool",
    ("inference.networking.x-k8s.io", "inferencepools"): "InferencePool",
    ("inference.networking.x-k8s.io", "inferenceobjectives"): "InferenceObjective",
    ("inference.networking.x-k8s.io", "inferencemodelrewrites"): "InferenceModelRewrite",
    ("discovery.k8s.io", "endpointslices"): "EndpointSlice",
}
VERSIONS = {"": "v1", "inference.networking.k8s.io": "v1", "inference.networking.x-k8s.io": "v1alpha2",
            "networking.serving.volcano.sh": "v1alpha1", "inference.llmkube.dev": "v1alpha1", "discovery.k8s.io": "v1"}


def _match_labels(labels: dict[str, str], selector: str) -> bool:
    for term in filter(None, (t.strip() for t in selector.split(","))):
        if "!=" in term:
            k, v = term.split("!=", 1)
            if labels.get(k) == v:
                return False
        else:
            k, v = term.split("==", 1) if "==" in term else term.split("=", 1)
            if labels.get(k) != v:
                return False
    return True


def _match_fields(obj: dict[str, Any], selector: str) -> bool:
    for term in filter(None, (t.strip() for t in selector.split(","))):
        k, v = term.split("=", 1)
        if k != "metadata.name":
            raise ValueError(f"unsupported field selector {k}")
        if obj["metadata"]["name"] != v:
            return False
    return True


class FakeKubeAPI:
    def __init__(self, gone_mode: str = "event", missing: frozenset[str] = frozenset()) -> None:
        self.gone_mode = gone_mode
        self.missing = set(missing)  # plurals whose CRD is "not installed": 404 (set or clear it while running)
        self.rv = 100
        self.objects: dict[tuple[str, str, str, str], dict[str, Any]] = {}  # (group, plural, ns, name)
        self.log: list[tuple[int, str, tuple[str, str, str], dict[str, Any] | None, dict[str, Any]]] = []
        self.compacted_rv = 0
        self.cond = threading.Condition()
        self.requests: list[tuple[str, str, dict[str, str]]] = []  # (verb list|watch, plural, params)
        self._cut_gen = 0
        self._expire_gen = 0
        self.open_watches = 0
        self.fail_next = 0  # answer this many upcoming requests with HTTP 500
        self.tokens: dict[str, dict[str, Any]] = {}  # TokenReview: token -> {"username", "uid", "groups"}
        self.grants: set[tuple[str, str, str]] = set()  # SubjectAccessReview: (user, verb, nonResourceURL)
        self.reviews: list[tuple[str, dict[str, Any]]] = []  # ("TokenReview"|"SubjectAccessReview", spec)
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler_class())
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    # ---- lifecycle ---------------------------------------------------------------------------------------
    @property
    def host(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def kubeconfig(self, path: Path, token: str = "t") -> Path:
        """A kubeconfig at `path` that reaches this server, presenting `token` (what Pointsman's client sends)."""
        path.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "fake",
            "clusters": [{"name": "fake", "cluster": {"server": self.host}}],
            "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "u"}}],
            "users": [{"name": "u", "user": {"token": token}}],
        }))
        return path

    def start(self) -> FakeKubeAPI:
        self.thread.start()
        return self

    def stop(self) -> None:
        with self.cond:
            self._cut_gen += 1
            self.cond.notify_all()
        self.server.shutdown()
        self.server.server_close()

    # ---- state changes (test side) -----------------------------------------------------------------------
    def _write(self, etype: str, group: str, plural: str, obj: dict[str, Any]) -> dict[str, Any]:
        with self.cond:
            self.rv += 1
            obj = copy.deepcopy(obj)
            meta = obj.setdefault("metadata", {})
            ns = meta.setdefault("namespace", "default")
            meta["resourceVersion"] = str(self.rv)
            meta.setdefault("creationTimestamp", "2026-01-01T00:00:00Z")
            obj.setdefault("apiVersion", f"{group}/{VERSIONS[group]}" if group else "v1")
            obj.setdefault("kind", KINDS[(group, plural)])
            key = (group, plural, ns, meta["name"])
            old = self.objects.get(key)
            if etype == "DELETED":
                self.objects.pop(key, None)
            else:
                if old is not None:
                    meta["creationTimestamp"] = old["metadata"]["creationTimestamp"]
                    meta["uid"] = old["metadata"].get("uid")
                else:
                    meta.setdefault("uid", f"uid-{self.rv}")
                self.objects[key] = obj
            self.log.append((self.rv, etype, (group, plural, ns), old, obj))
            self.cond.notify_all()
            return obj

    def apply(self, group: str, plural: str, obj: dict[str, Any]) -> dict[str, Any]:
        key = (group, plural, obj["metadata"].get("namespace", "default"), obj["metadata"]["name"])
        return self._write("MODIFIED" if key in self.objects else "ADDED", group, plural, obj)

    def delete(self, group: str, plural: str, name: str, namespace: str = "default") -> None:
        obj = self.objects[(group, plural, namespace, name)]
        self._write("DELETED", group, plural, obj)

    def compact(self) -> None:
        """Forget all history: any watch from a resourceVersion before now gets 410."""
        with self.cond:
            self.compacted_rv = self.rv
            self.log.clear()

    def expire_watches(self) -> None:
        with self.cond:
            self.compact()
            self._expire_gen += 1
            self.cond.notify_all()

    def cut_watches(self) -> None:
        with self.cond:
            self._cut_gen += 1
            self.cond.notify_all()

    def count(self, verb: str, plural: str) -> int:
        return sum(1 for v, p, _ in self.requests if v == verb and p == plural)

    # ---- HTTP --------------------------------------------------------------------------------------------
    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        api = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def _json(self, status: int, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _status(self, code: int, reason: str, message: str) -> dict[str, Any]:
                return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                        "message": message, "reason": reason, "code": code}

            def do_POST(self) -> None:  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
                spec = body.get("spec") or {}
                path = urlparse(self.path).path
                with api.cond:
                    failing = api.fail_next > 0
                    api.fail_next -= 1 if failing else 0
                if failing:
                    return self._json(500, self._status(500, "InternalError", "injected failure"))
                if path == "/apis/authentication.k8s.io/v1/tokenreviews":
                    api.reviews.append(("TokenReview", {"token": "<redacted>"}))
                    user = api.tokens.get(spec.get("token", ""))
                    status = {"authenticated": True, "user": user} if user else {"authenticated": False,
                                                                                "error": "invalid token"}
                    return self._json(201, {**body, "status": status})
                if path == "/apis/authorization.k8s.io/v1/subjectaccessreviews":
                    api.reviews.append(("SubjectAccessReview", spec))
                    attrs = spec.get("nonResourceAttributes") or {}
                    allowed = (spec.get("user"), attrs.get("verb"), attrs.get("path")) in api.grants
                    return self._json(201, {**body, "status": {"allowed": allowed,
                                                               "reason": "" if allowed else "no grant"}})
                return self._json(404, self._status(404, "NotFound", path))

            def do_GET(self) -> None:  # noqa: N802
                url = urlparse(self.path)
                parts = url.path.strip("/").split("/")
                params = {k: v[0] for k, v in parse_qs(url.query).items()}
                if parts[:2] == ["api", "v1"] and len(parts) == 5 and parts[2] == "namespaces":
                    group, ns, plural = "", parts[3], parts[4]
                elif parts[0] == "apis" and len(parts) == 6 and parts[3] == "namespaces":
                    group, ns, plural = parts[1], parts[4], parts[5]
                    if VERSIONS.get(group) != parts[2]:
                        return self._json(404, self._status(404, "NotFound", f"no {group}/{parts[2]}"))
                else:
                    return self._json(404, self._status(404, "NotFound", url.path))
                if (group, plural) not in KINDS or plural in api.missing:
                    return self._json(404, self._status(404, "NotFound", plural))
                watch = params.get("watch") in ("true", "1")
                with api.cond:
                    failing = api.fail_next > 0
                    api.fail_next -= 1 if failing else 0
                if failing:
                    api.requests.append(("failed", plural, params))
                    return self._json(500, self._status(500, "InternalError", "injected failure"))
                with api.cond:  # a watch counted is a watch a later cut or expiry reaches
                    api.requests.append(("watch" if watch else "list", plural, params))
                    gens = api._cut_gen, api._expire_gen
                if watch:
                    return self._watch(group, plural, ns, params, gens)
                return self._list(group, plural, ns, params)

            def _selected(self, obj: dict[str, Any] | None, params: dict[str, str]) -> bool:
                if obj is None:
                    return False
                labels = obj["metadata"].get("labels") or {}
                return _match_labels(labels, params.get("labelSelector", "")) and _match_fields(
                    obj, params.get("fieldSelector", ""))

            def _list(self, group: str, plural: str, ns: str, params: dict[str, str]) -> None:
                with api.cond:
                    items = [copy.deepcopy(o) for (g, p, n, _), o in sorted(api.objects.items())
                             if g == group and p == plural and n == ns and self._selected(o, params)]
                    rv = api.rv
                kind = KINDS[(group, plural)] + "List"
                self._json(200, {"kind": kind, "apiVersion": f"{group}/{VERSIONS[group]}" if group else "v1",
                                 "metadata": {"resourceVersion": str(rv)}, "items": items})

            def _chunk(self, data: bytes) -> None:
                self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
                self.wfile.flush()

            def _watch(
                self, group: str, plural: str, ns: str, params: dict[str, str], gens: tuple[int, int]
            ) -> None:
                since = int(params.get("resourceVersion") or 0)
                timeout = float(params.get("timeoutSeconds") or 1800)
                if since and since < api.compacted_rv and api.gone_mode == "http":
                    return self._json(410, self._status(410, "Expired", f"too old resource version: {since}"))
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                deadline = time.monotonic() + timeout
                cut_gen, exp_gen = gens
                with api.cond:
                    api.open_watches += 1
                try:
                    if since and since < api.compacted_rv:
                        return self._send_gone(since)
                    if not since:  # "any": start from now (a real server would send synthetic ADDEDs)
                        since = api.rv
                    while True:
                        with api.cond:
                            events = [e for e in api.log if e[0] > since and e[2] == (group, plural, ns)]
                            if not events:
                                left = deadline - time.monotonic()
                                if left <= 0 or api._cut_gen != cut_gen or api._expire_gen != exp_gen:
                                    pass
                                else:
                                    api.cond.wait(min(left, 0.5))
                                    events = [e for e in api.log if e[0] > since and e[2] == (group, plural, ns)]
                            cut = api._cut_gen != cut_gen
                            expired = api._expire_gen != exp_gen
                        if cut:
                            # half an event, then drop the connection without the terminating chunk
                            self._chunk(b'{"type":"ADDED","object":{"metadata":{"name":"half')
                            self.connection.shutdown(socket.SHUT_RDWR)
                            self.close_connection = True
                            return
                        if expired:
                            return self._send_gone(since)
                        for rv, etype, _, old, new in events:
                            since = rv
                            out = self._translate(etype, old, new, params)
                            if out:
                                self._chunk(json.dumps({"type": out, "object": new}).encode() + b"\n")
                        if time.monotonic() >= deadline:
                            self._chunk(b"")  # clean end of the stream
                            return
                except (BrokenPipeError, ConnectionResetError, OSError):
                    self.close_connection = True
                finally:
                    with api.cond:
                        api.open_watches -= 1

            def _translate(self, etype: str, old: dict[str, Any] | None, new: dict[str, Any],
                           params: dict[str, str]) -> str | None:
                now_in = self._selected(new, params)
                was_in = self._selected(old, params)
                if etype == "DELETED":
                    return "DELETED" if now_in else None
                if now_in and was_in:
                    return "MODIFIED"
                if now_in:
                    return "ADDED"
                if was_in:
                    return "DELETED"
                return None

            def _send_gone(self, since: int) -> None:
                status = self._status(410, "Expired", f"too old resource version: {since} ({api.compacted_rv})")
                self._chunk(json.dumps({"type": "ERROR", "object": status}).encode() + b"\n")
                self._chunk(b"")

        return Handler


# ---- object builders ---------------------------------------------------------------------------------------
def pod(name: str, ip: str | None, labels: dict[str, str], ready: bool = True, namespace: str = "default",
        annotations: dict[str, str] | None = None, terminating: bool = False, phase: str = "Running") -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": namespace, "labels": labels}
    if annotations:
        meta["annotations"] = annotations
    if terminating:
        meta["deletionTimestamp"] = "2026-01-01T00:05:00Z"
    status: dict[str, Any] = {"phase": phase, "conditions": [
        {"type": "Initialized", "status": "True"},
        {"type": "Ready", "status": "True" if ready else "False"},
        {"type": "ContainersReady", "status": "True" if ready else "False"},
    ]}
    if ip:
        status["podIP"] = ip
        status["podIPs"] = [{"ip": ip}]
    return {"metadata": meta, "spec": {"containers": [{"name": "vllm", "image": "vllm/vllm-openai"}]}, "status": status}


def pool(name: str, selector: dict[str, str], ports: list[int], namespace: str = "default",
         epp: str | None = None) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": namespace}, "spec": {
        "selector": {"matchLabels": selector},
        "targetPorts": [{"number": p} for p in ports],
        "endpointPickerRef": {"name": epp or f"{name}-epp", "port": {"number": 9002}, "failureMode": "FailClose"},
    }}


def endpoint_slice(name: str, service: str, ips: list[str], port: int = 9004, ready: bool = True,
                   namespace: str = "default") -> dict[str, Any]:
    """An EndpointSlice of a (headless) Service, as the EndpointSlice controller writes it."""
    return {"metadata": {"name": name, "namespace": namespace, "labels": {"kubernetes.io/service-name": service}},
            "addressType": "IPv4",
            "endpoints": [{"addresses": [ip], "conditions": {"ready": ready, "serving": ready, "terminating": False},
                           "targetRef": {"kind": "Pod", "name": f"pod-{ip}"}} for ip in ips],
            "ports": [{"name": "bus", "port": port, "protocol": "TCP"}]}


def secret(name: str, data: dict[str, str], namespace: str = "default") -> dict[str, Any]:
    import base64

    return {"metadata": {"name": name, "namespace": namespace}, "type": "Opaque",
            "data": {k: base64.b64encode(v.encode()).decode() for k, v in data.items()}}


def objective(name: str, pool_name: str, priority: int | None, namespace: str = "default") -> dict[str, Any]:
    spec: dict[str, Any] = {"poolRef": {"group": "inference.networking.k8s.io", "name": pool_name}}
    if priority is not None:
        spec["priority"] = priority
    return {"metadata": {"name": name, "namespace": namespace}, "spec": spec}


def rewrite(name: str, pool_name: str, rules: list[dict[str, Any]], created: str = "2026-01-01T00:00:00Z",
            namespace: str = "default") -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": namespace, "creationTimestamp": created},
            "spec": {"poolRef": {"group": "inference.networking.k8s.io", "name": pool_name}, "rules": rules}}
