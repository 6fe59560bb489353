"""List+watch of one Kubernetes resource with the official (synchronous) client, driven from asyncio.

The blocking HTTP calls run in daemon threads (so a watch blocked on a socket never holds up interpreter exit);
every result is handed back to the event loop, where the callbacks run. Callbacks therefore never race with the
director or the scraper.

Mechanics (the client-go reflector's):
- LIST (raw JSON, `_preload_content=False`) → `on_list(items)` replaces the whole view; remember resourceVersion.
- WATCH from that resourceVersion with `timeoutSeconds`, bookmarks on. Each ADDED/MODIFIED/DELETED goes to
  `on_event(type, obj)`; the resourceVersion advances with every event and bookmark.
- The server ends the watch (timeout): watch again from the last resourceVersion.
- 410 Gone (an ERROR event with code 410, or HTTP 410): the version is compacted away → LIST again.
- Any other failure (connection refused, stream cut mid-event, 5xx): back off (doubling, capped) and resume the
  watch from the last resourceVersion; a failed LIST is retried the same way.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import threading
from collections.abc import Callable
from typing import Any, TypedDict, TypeVar

from kubernetes.client.exceptions import ApiException
from kubernetes.watch.watch import iter_resp_lines

from epp.aio import cancel_and_wait

log = logging.getLogger(__name__)

_R = TypeVar("_R")

ListCall = Callable[..., Any]  # e.g. functools.partial(CoreV1Api.list_namespaced_pod, "ns", label_selector="a=b")


class ReflectorOptions(TypedDict, total=False):
    """A reflector's timings, passed on by every watcher that builds reflectors (each has the default below)."""

    watch_timeout_s: int  # a watch request's timeoutSeconds (300)
    backoff_initial_s: float  # the first wait after a failure, doubling (0.2)
    backoff_max_s: float  # the longest wait (10)
    request_timeout_s: float  # a LIST's client-side timeout (30)


class Gone(Exception):
    """The watched resourceVersion is too old (HTTP 410): relist."""


async def in_daemon_thread(fn: Callable[[], _R]) -> _R:
    """Run a blocking call in a fresh daemon thread and await its result."""
    loop = asyncio.get_running_loop()
    fut: asyncio.Future[_R] = loop.create_future()

    def _result(value: _R) -> None:
        if not fut.done():
            fut.set_result(value)

    def _error(exc: BaseException) -> None:
        if not fut.done():
            fut.set_exception(exc)

    def target() -> None:
        try:
            result = fn()
        except BaseException as e:  # noqa: BLE001 - handed to the loop
            try:
                loop.call_soon_threadsafe(_error, e)
            except RuntimeError:  # loop closed
                pass
        else:
            try:
                loop.call_soon_threadsafe(_result, result)
            except RuntimeError:
                pass

    threading.Thread(target=target, daemon=True, name="k8s-watch").start()
    return await fut


class Reflector:
    def __init__(
        self,
        name: str,
        list_call: ListCall,
        on_list: Callable[[list[dict[str, Any]]], None],
        on_event: Callable[[str, dict[str, Any]], None],
        watch_timeout_s: int = 300,
        backoff_initial_s: float = 0.2,
        backoff_max_s: float = 10.0,
        request_timeout_s: float = 30.0,
    ) -> None:
        self.name = name
        self.list_call = list_call
        self.on_list = on_list
        self.on_event = on_event
        self.watch_timeout_s = watch_timeout_s
        self.backoff_initial_s = backoff_initial_s
        self.backoff_max_s = backoff_max_s
        self.request_timeout_s = request_timeout_s
        self.resource_version: str | None = None
        self.lists = 0  # completed LISTs (the initial one and every resync)
        self.watches = 0  # watch requests started
        self.listed = asyncio.Event()  # set after the first successful LIST has been applied
        self._stop = threading.Event()
        self._resp: Any = None
        self._task: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    # ---- lifecycle ---------------------------------------------------------------------------------------
    def start(self) -> asyncio.Task[None]:
        if self._task is None or self._task.done():
            self._loop = asyncio.get_running_loop()
            self._task = self._loop.create_task(self.run(), name=f"reflector:{self.name}")
        return self._task

    async def stop(self) -> None:
        self._stop.set()
        self._abort_stream()
        await cancel_and_wait(self._task)
        self._task = None

    def _abort_stream(self) -> None:
        resp = self._resp
        if resp is None:
            return
        try:
            conn = getattr(resp, "connection", None)
            sock = getattr(conn, "sock", None) if conn is not None else None
            if sock is not None:
                sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    # ---- the loop ----------------------------------------------------------------------------------------
    async def run(self) -> None:
        self._loop = asyncio.get_running_loop()
        backoff = self.backoff_initial_s
        need_list = True
        while not self._stop.is_set():
            try:
                if need_list:
                    items, rv = await in_daemon_thread(self._list)
                    self.resource_version = rv
                    self.lists += 1
                    self.on_list(items)
                    self.listed.set()
                    need_list = False
                self.watches += 1
                await in_daemon_thread(self._watch)
                backoff = self.backoff_initial_s  # a clean end (server timeout): watch again at once
            except asyncio.CancelledError:
                raise
            except Gone:
                log.info("%s: resourceVersion %s expired (410 Gone); relisting", self.name, self.resource_version)
                need_list = True
            except Exception as e:
                if self._stop.is_set():
                    break
                if isinstance(e, ApiException) and e.status == 410:
                    log.info("%s: HTTP 410 Gone for resourceVersion %s; relisting", self.name, self.resource_version)
                    need_list = True
                    continue
                log.warning("%s: %s failed (%s: %s); retrying in %.1fs", self.name,
                            "list" if need_list else "watch", type(e).__name__, e, backoff)
                await asyncio.sleep(backoff)
                backoff = min(self.backoff_max_s, backoff * 2)

    # ---- blocking parts (daemon threads) -----------------------------------------------------------------
    def _list(self) -> tuple[list[dict[str, Any]], str]:
        resp = self.list_call(_preload_content=False, _request_timeout=self.request_timeout_s)
        try:
            data = json.loads(resp.data)
        finally:
            resp.release_conn()
        rv = str((data.get("metadata") or {}).get("resourceVersion") or "")
        return list(data.get("items") or []), rv

    def _deliver(self, etype: str, obj: dict[str, Any]) -> None:
        if self._stop.is_set():
            return
        try:
            self.on_event(etype, obj)
        except Exception:
            log.exception("%s: handling a %s event failed", self.name, etype)

    def _watch(self) -> None:
        assert self._loop is not None
        resp = self.list_call(
            watch=True,
            resource_version=self.resource_version or None,
            timeout_seconds=self.watch_timeout_s,
            allow_watch_bookmarks=True,
            _preload_content=False,
            _request_timeout=(self.request_timeout_s, self.watch_timeout_s + 30),
        )
        self._resp = resp
        try:
            for line in iter_resp_lines(resp):
                if self._stop.is_set():
                    return
                if not line.strip():
                    continue
                ev = json.loads(line)
                etype, obj = ev.get("type"), ev.get("object") or {}
                if etype == "ERROR":
                    code = obj.get("code")
                    if code == 410:
                        raise Gone(obj.get("message", ""))
                    raise RuntimeError(f"watch error {code} {obj.get('reason')}: {obj.get('message')}")
                rv = (obj.get("metadata") or {}).get("resourceVersion")
                if rv:
                    self.resource_version = str(rv)
                if etype in ("ADDED", "MODIFIED", "DELETED"):
                    self._loop.call_soon_threadsafe(self._deliver, etype, obj)
        finally:
            self._resp = None
            resp.close()  # never hand a half-read stream back to the pool
            resp.release_conn()
