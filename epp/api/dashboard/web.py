"""The dashboard's HTTP surface, added to the metrics server's aiohttp application.

Under the path prefix P (default "/"):
    GET  P                      the page (static/index.html); with a token and no credentials, a sign-in form
    POST P + "login"            form field `token`: sets an HttpOnly session cookie and returns to the page
    GET  P + "static/<file>"    the page's JS and CSS, shipped in the package (no external assets)
    GET  P + "api/fleet"        one row per endpoint
    GET  P + "api/decisions"    recent decisions (?since=<seq>), newest last
    GET  P + "api/decisions/N"  one decision with its per-plugin scores
    GET  P + "api/series"       the last 15 minutes of chart data
    GET  P + "api/config"       effective scheduling configs, model bindings, last reloads; `scope` names the worker
                                the page shows with `epp serve --workers N` (null otherwise)
    GET  P + "api/receipts/ID"  a decision by its decision id, as it was made (epp/observe/receipts.py)
    GET  P + "api/shadow"       the shadow profile's report (epp/observe/shadow.py); {"enabled": false} without one
    POST P + "api/explain"      a dry-run decision for {path, headers, body, pool}, as `epp explain` returns it
    GET  P + "api/events"       server-sent events: `decisions`, `outcomes`, `tick` (fleet + the newest point)

Everything is read-only: explain is a dry run and no route changes routing state. With a token every route above
but static/ (the package's JS and CSS, which hold no data) needs `Authorization: Bearer <token>` or the session
cookie (compared in constant time: auth.py); /metrics stays open for Prometheus scrapers. The token is never logged.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping
from importlib import resources
from typing import TYPE_CHECKING, Any

import orjson
from aiohttp import web

from epp.api.client import format_timings
from epp.api.dashboard import views
from epp.api.dashboard.auth import CSP, TokenAuth
from epp.api.dashboard.recorder import DecisionRecorder
from epp.api.dashboard.series import Sampler
from epp.api.explain import PointsmanService, fill_model, latency_model
from epp.api.pb import pointsman_pb2 as api

if TYPE_CHECKING:
    from importlib.abc import Traversable

    from epp.fleet import PassiveHealth
    from epp.request import Director

log = logging.getLogger(__name__)

MAX_EVENT_CLIENTS = 32
EVENT_POLL_S = 0.25  # how often an event stream looks for new decisions
MAX_PUSH = 50  # decisions sent per poll at most: a busy picker costs an open page at most 200 rows a second
STATIC_TYPES = {".js": "text/javascript", ".css": "text/css", ".html": "text/html", ".txt": "text/plain"}


def normalize_prefix(prefix: str) -> str:
    p = "/" + prefix.strip().strip("/")
    p = p if p == "/" else p + "/"
    if p == "/metrics/":
        raise ValueError("--dashboard-path-prefix cannot be /metrics (Prometheus is served there)")
    return p


def _load_static() -> dict[str, tuple[bytes, str]]:
    files: dict[str, tuple[bytes, str]] = {}
    root = resources.files("epp.api.dashboard") / "static"

    def walk(node: Traversable, rel: str) -> None:
        for child in node.iterdir():
            name = f"{rel}{child.name}"
            if child.is_dir():
                walk(child, name + "/")
                continue
            ext = "." + child.name.rsplit(".", 1)[-1] if "." in child.name else ""
            files[name] = (child.read_bytes(), STATIC_TYPES.get(ext, "application/octet-stream"))

    walk(root, "")
    return files


def _json(obj: object, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(obj), status=status, content_type="application/json",
                        headers={"Cache-Control": "no-store"})


class Dashboard:
    def __init__(
        self,
        director: Director,
        *,
        recorder: DecisionRecorder | None = None,
        passive: PassiveHealth | None = None,
        prefix: str = "/",
        token: str | None = None,
        capacity: int = 500,
        config_source: Callable[[], str] = lambda: "built-in default",
        watchers: Mapping[str, Any] | None = None,
        started_at: float | None = None,
    ) -> None:
        self.explainer = PointsmanService(director, passive)  # holds the current director (swapped on reload)
        self.prefix = normalize_prefix(prefix)
        self.static = _load_static()
        self.auth = TokenAuth(token, self.prefix, self.static["login.html"][0].decode())
        self.recorder = recorder if recorder is not None else DecisionRecorder(capacity)
        self.sampler = Sampler(self.recorder, director.datastore, director.clock, model=self._model)
        self.config_source = config_source
        self.watchers = watchers if watchers is not None else {}
        self.started_at = started_at or time.time()
        self.clients = 0
        # With `epp serve --workers N` the page is one worker's (epp/workers): {"label": ..., "note": ...}.
        self.scope: dict[str, str] | None = None
        self.shadow: Any = None  # the shadow runner (epp/observe/shadow.py), with --shadow-config
        self.rows = capacity  # decisions the page lists (the recorder may keep more, for receipts)
        self._task: asyncio.Task[None] | None = None
        self._closing = asyncio.Event()

    @property
    def director(self) -> Any:
        return self.explainer.director

    # ---- lifecycle ---------------------------------------------------------------------------------------
    def _model(self, key: str, now: float) -> dict[str, Any] | None:
        """The latency model's trust and timings for the fleet table (none without an estimated-latency scorer)."""
        scorer = latency_model(self.director)
        if scorer is None:
            return None
        m = scorer.endpoint_model(key, now)
        msg = api.EndpointModel()
        fill_model(msg, key, m)
        return {"trust": m.trust.state, "belief": round(m.trust.belief, 3), "trust_reason": m.trust.reason,
                "timings": format_timings(msg),
                "outside": None if m.trust.outside_share is None else round(m.trust.outside_share, 3)}

    def install(self, app: web.Application) -> None:
        """Add the routes to the metrics server's application (before it starts)."""
        p = self.prefix
        r = app.router
        guard = self.auth.guard
        if p != "/":
            r.add_get(p.rstrip("/"), guard(self._to_prefix))
        r.add_get(p, self._page)
        r.add_post(p + "login", self.auth.login)
        r.add_get(p + "static/{path:.+}", self._static)  # the package's own JS/CSS: no data, no token needed
        r.add_get(p + "api/fleet", guard(self._fleet))
        r.add_get(p + "api/decisions", guard(self._decisions))
        r.add_get(p + "api/decisions/{seq:\\d+}", guard(self._decision))
        r.add_get(p + "api/series", guard(self._series))
        r.add_get(p + "api/config", guard(self._config))
        r.add_post(p + "api/explain", guard(self._explain))
        r.add_get(p + "api/receipts/{id}", guard(self._receipt))
        r.add_get(p + "api/shadow", guard(self._shadow))
        r.add_get(p + "api/events", guard(self._events))

    async def start(self) -> None:
        self.sampler.sample()
        self._task = asyncio.get_running_loop().create_task(self._sample_loop(), name="dashboard-sampler")

    async def stop(self) -> None:
        self._closing.set()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _sample_loop(self) -> None:
        next_at = time.monotonic()
        while True:
            next_at += 1.0
            await asyncio.sleep(max(0.0, next_at - time.monotonic()))
            try:
                self.sampler.sample()
            except Exception:  # the page must never take the picker down
                log.exception("dashboard sampler failed")

    def to_wall(self, t: float) -> float:
        return time.time() - (float(self.director.clock()) - t)

    # ---- the page and its assets -------------------------------------------------------------------------
    async def _to_prefix(self, request: web.Request) -> web.Response:
        raise web.HTTPMovedPermanently(self.prefix)

    async def _page(self, request: web.Request) -> web.Response:
        if not self.auth.authorized(request):
            return self.auth.login_page("This dashboard needs a token.", 401)
        body, ctype = self.static["index.html"]
        return web.Response(body=body, content_type=ctype,
                            headers={"Content-Security-Policy": CSP, "Cache-Control": "no-cache"})

    async def _static(self, request: web.Request) -> web.Response:
        got = self.static.get(request.match_info["path"])
        if got is None or request.match_info["path"].endswith(".html"):
            raise web.HTTPNotFound()
        return web.Response(body=got[0], content_type=got[1], headers={"Cache-Control": "no-cache"})

    # ---- JSON APIs ---------------------------------------------------------------------------------------
    async def _fleet(self, request: web.Request) -> web.Response:
        return _json({"pools": self.director.datastore.pool_names(), "endpoints": self.sampler.fleet})

    async def _decisions(self, request: web.Request) -> web.Response:
        try:
            since = int(request.query.get("since", "0"))
        except ValueError:
            return _json({"error": "since must be a decision sequence number"}, 400)
        recs = self.recorder.since(since)[-self.rows:]
        return _json({"seq": self.recorder.seq, "capacity": self.rows,
                      "decisions": [views.summary(r, self.to_wall, self.director.ids) for r in recs]})

    async def _decision(self, request: web.Request) -> web.Response:
        rec = self.recorder.get(int(request.match_info["seq"]))
        if rec is None:
            return _json({"error": "that decision is no longer in the ring buffer "
                                   f"(the last {self.recorder.capacity} are kept)"}, 404)
        return _json(views.detail(rec, self.to_wall, self.director.ids))

    async def _receipt(self, request: web.Request) -> web.Response:
        from google.protobuf import json_format

        from epp.api.receipts import format_receipt

        got = self.explainer.receipt(request.match_info["id"])
        out = json_format.MessageToDict(got, preserving_proto_field_name=True)
        out["text"] = format_receipt(got)
        out.setdefault("found", False)
        return _json(out)  # a lookup that finds nothing is an answer too: `found` false and the reason in `error`

    async def _shadow(self, request: web.Request) -> web.Response:
        shadow = self.shadow
        if shadow is None:
            return _json({"enabled": False})
        return _json({"enabled": True, **shadow.report.view(), "rate": shadow.settings.rate,
                      "max_cpu": shadow.settings.max_cpu, "learn": shadow.settings.learn})

    async def _series(self, request: web.Request) -> web.Response:
        return _json(self.sampler.series())

    async def _config(self, request: web.Request) -> web.Response:
        view = views.config_view(self.director.scheduler, self.config_source(), self.watchers, self.started_at,
                                 views.budget_states(self.director.admitters))
        return _json({**view, "scope": self.scope})

    async def _explain(self, request: web.Request) -> web.Response:
        try:
            req = orjson.loads(await request.read())
        except web.HTTPRequestEntityTooLarge as e:
            return _json({"error": f"the explain request is too large: {e.text}"}, 413)
        except orjson.JSONDecodeError as e:
            return _json({"error": f"the explain request is not JSON: {e}"}, 400)
        if not isinstance(req, dict):
            return _json({"error": "the explain request must be a JSON object"}, 400)
        try:
            headers = req.get("headers") or {}
            if isinstance(headers, str):
                headers = views.parse_header_lines(headers)
            elif not isinstance(headers, dict):
                raise ValueError("headers must be 'name: value' lines or an object")
            body = req.get("body") or ""
            if not isinstance(body, str):
                raise ValueError("body must be a string (the request body as sent)")
            out = await views.explain_async(self.explainer, str(req.get("path") or "/v1/chat/completions"),
                                            {str(k).lower(): str(v) for k, v in headers.items()}, body.encode(),
                                            str(req.get("pool") or ""))
        except ValueError as e:
            return _json({"error": str(e)}, 400)
        return _json(out)

    # ---- server-sent events ------------------------------------------------------------------------------
    async def _events(self, request: web.Request) -> web.StreamResponse:
        if self.clients >= MAX_EVENT_CLIENTS:
            return _json({"error": f"too many live views (at most {MAX_EVENT_CLIENTS})"}, 503)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-store",
                                           "X-Accel-Buffering": "no"})
        await resp.prepare(request)
        self.clients += 1
        try:
            await self._stream(request, resp)
        except (ConnectionResetError, asyncio.CancelledError):
            pass
        finally:
            self.clients -= 1
        return resp

    async def _stream(self, request: web.Request, resp: web.StreamResponse) -> None:
        rec = self.recorder
        try:
            last = int(request.query.get("since", rec.seq))
        except ValueError:
            last = rec.seq
        version = -1
        pending: dict[int, Any] = {}  # decisions sent before they finished: their outcome follows later

        async def send(event: str, data: object) -> None:
            await resp.write(b"event: " + event.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n")

        while not self._closing.is_set() and request.transport is not None and not request.transport.is_closing():
            new = rec.since(last)
            if new:
                last = new[-1].seq
                new = new[-MAX_PUSH:]
                await send("decisions", [views.summary(r, self.to_wall, self.director.ids) for r in new])
                for r in new:
                    if not r.ended:
                        pending[r.seq] = r
            if self.sampler.version != version:
                version = self.sampler.version
                done = [r for r in pending.values() if r.ended]
                if done or len(pending) > rec.capacity:
                    for r in done:
                        del pending[r.seq]
                    while len(pending) > rec.capacity:
                        del pending[next(iter(pending))]
                    await send("outcomes", [views.summary(r, self.to_wall, self.director.ids) for r in done])
                await send("tick", {"fleet": self.sampler.fleet, "point": self.sampler.points[-1],
                                    "seq": rec.seq, "clients": self.clients})
            await asyncio.sleep(EVENT_POLL_S)
