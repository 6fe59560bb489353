"""Passive health: failures seen on the response path take an endpoint out of rotation; a probe brings it back.

What counts, per routed request (attributed to the endpoint that served it: Envoy's `-served` metadata when
override_host reports it, else Pointsman's pick):
- failure `http_5xx`: response headers with a 5xx status. Envoy's own replies count too: a connection refused or
  reset before the response (503 "upstream connect error"), a route timeout (504);
- failure `cut_short`: the response body had started but the stream ended before its end (an upstream reset
  mid-stream, a killed server). A client that hangs up mid-stream looks the same to Pointsman: that is why only
  `failure_threshold` failures IN A ROW eject, and any good response resets the streak;
- failure `silent`: no response progress for `silence_timeout` (a hung server). Armed for a request that asked to
  stream (`"stream": true`) while it waits for its response headers, and for any response whose body has begun;
  a non-streaming response legitimately says nothing until it is complete (Envoy's route timeout, a 504, covers it);
- success: a response below 500 that ended (its body's end, or trailers; or, when Envoy sends no body messages,
  the stream's end after the headers). A stream that ends without any response (the client went away first)
  counts as neither.

States: `healthy` → (`failure_threshold` consecutive failures) → `ejected` for `cooldown` → `probing`: the endpoint
is a candidate again, and the first request routed to it is the probe; until the probe answers no other request is
sent there. The probe does not wait for the scheduler to prefer the endpoint (with identical prompts it may never:
the others hold the prefix): `probe_for(candidates)` names a probing endpoint with no probe in flight, and the
request path routes the next request that may go there to it (epp/request/exchange.py), so an endpoint is probed
within one tick (`interval`) and one request of its cool-down's end, whatever the profile. A probe answered below 500 makes it `healthy`; a failed probe ejects it again for twice the cool-down (up to
`max_cooldown`); a probe whose client left unanswered lets the next request probe. Ejected endpoints sit in
`Datastore.ejected` (this module is its only writer): the director skips them (routing to every endpoint when all
are out), and EDS reports them UNHEALTHY so a fail-open fallback avoids them too.

What Envoy shows Pointsman decides what passive health can see (`epp envoy-config --response-phases`):
- `full`: everything above.
- `headers`: response headers only: 5xx and connection failures count; no `cut_short`, and `silent` only before
  the headers.
- `lean`: no response messages at all, only the stream's end, which looks the same whether the response completed,
  was reset or the client left: passive health sees nothing, and only scraping (connection refused within ~150 ms,
  a hung metrics endpoint within the staleness threshold) takes an endpoint out. The pre-headers `silent` rule is
  armed only while response headers are seen at all (within the last 10 minutes), so lean streams are never taken
  for silent ones.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from epp.aio import cancel_and_wait
from epp.fleet.datastore import Datastore
from scheduling.types import Endpoint, LLMRequest

if TYPE_CHECKING:
    from epp.fleet.scrape import MetricsScraper

log = logging.getLogger(__name__)

HEALTHY, EJECTED, PROBING = "healthy", "ejected", "probing"
HEADERS_SEEN_WINDOW_S = 600.0  # response headers seen this recently: Envoy sends response phases


class Watch:
    """One routed request, as passive health follows it."""

    __slots__ = ("key", "streaming", "last", "status", "chunks", "complete", "failed", "probe", "closed")

    def __init__(self, key: str, streaming: bool, now: float) -> None:
        self.key = key
        self.streaming = streaming
        self.last = now  # the last sign of life of the response (routing, headers, a body chunk)
        self.status = 0
        self.chunks = 0
        self.complete = False
        self.failed = False
        self.probe = False
        self.closed = False  # the stream ended: no longer watched


class Followed:
    """A routed request's response path, as the request path reports it (a follow, epp/request/observe.py)."""

    __slots__ = ("health", "w")

    def __init__(self, health: PassiveHealth, w: Watch) -> None:
        self.health = health
        self.w = w

    def response_headers(self, ex: Any, status: int, served: str | None) -> None:
        self.health.response_started(self.w, str(status) if status else "", served)

    def response_chunk(self, ex: Any, size: int, end_of_stream: bool) -> None:
        self.health.progress(self.w, end_of_stream)

    def closed(self, ex: Any, usage: Any) -> None:
        self.health.closed(self.w)


@dataclass(slots=True)
class EndpointHealth:
    state: str = HEALTHY
    consecutive: int = 0  # failures in a row
    failures: int = 0
    successes: int = 0
    ejections: int = 0
    reason: str = ""  # the last failure
    since: float = 0.0  # when the current state began
    until: float = 0.0  # ejected: when the probe opens
    cooldown: float = 0.0  # the current ejection time
    probe: Watch | None = None


class HealthMetrics(Protocol):
    def endpoint_failure(self, key: str, kind: str) -> None: ...
    def endpoint_ejected(self, key: str, source: str) -> None: ...


class Silence:
    """The requests the silence rule may fail, oldest sign of life first (the clock is monotonic, and a watch moves
    to the end whenever it shows life), so a tick looks at the due ones only, never at every request in flight:
    `quiet` asked to stream and waits for its response headers (armed only while response headers are seen at all);
    `flowing` has a response body under way (always armed)."""

    __slots__ = ("quiet", "flowing", "headers_seen_at")

    def __init__(self) -> None:
        self.quiet: OrderedDict[Watch, None] = OrderedDict()
        self.flowing: OrderedDict[Watch, None] = OrderedDict()
        self.headers_seen_at = -HEADERS_SEEN_WINDOW_S  # when response headers were last seen

    def track(self, w: Watch) -> None:
        """Queue `w` where the silence rule looks for it now (at the end: it just showed life), or nowhere."""
        if w.failed or w.complete or w.closed:
            self.untrack(w)
        elif w.chunks:
            flowing = self.flowing
            if w in flowing:
                flowing.move_to_end(w)  # the per-chunk case
            else:
                self.quiet.pop(w, None)
                flowing[w] = None
        elif w.streaming and w.status == 0:
            self.quiet[w] = None
            self.quiet.move_to_end(w)
        else:
            self.quiet.pop(w, None)  # headers came, no body yet: never silent before the body begins

    def untrack(self, w: Watch) -> None:
        self.quiet.pop(w, None)
        self.flowing.pop(w, None)

    def due(self, now: float, limit: float) -> list[Watch]:
        """The requests silent for longer than `limit`: the head of each armed queue, up to the first that is not
        (O(due requests), not O(requests in flight)); failing them takes them off the queues."""
        due: list[Watch] = []
        queues = (self.quiet, self.flowing) if now - self.headers_seen_at < HEADERS_SEEN_WINDOW_S else (self.flowing,)
        for queue in queues:
            for w in queue:
                if not now - w.last > limit:
                    break
                due.append(w)
        return due


class PassiveHealth:
    def __init__(
        self,
        datastore: Datastore,
        *,
        failure_threshold: int = 5,
        cooldown: float = 10.0,
        max_cooldown: float = 300.0,
        silence_timeout: float = 60.0,
        interval: float = 0.25,
        clock: Callable[[], float] = time.monotonic,
        metrics: HealthMetrics | None = None,
    ) -> None:
        if failure_threshold < 1 or cooldown <= 0 or max_cooldown < cooldown or silence_timeout <= 0:
            raise ValueError("passive health: need failure_threshold >= 1, 0 < cooldown <= max_cooldown, "
                             "silence_timeout > 0")
        self.datastore = datastore
        self.failure_threshold = failure_threshold
        self.cooldown = cooldown
        self.max_cooldown = max_cooldown
        self.silence_timeout = silence_timeout
        self.interval = interval
        self.clock = clock
        self.metrics = metrics
        self.scraper: MetricsScraper | None = None  # for reporting its view next to this one
        self.states: dict[str, EndpointHealth] = {}
        self.silence = Silence()
        self.awaiting_probe: set[str] = set()  # probing endpoints with no probe in flight
        self._task: asyncio.Task[None] | None = None
        datastore.on_endpoint_removed(self.forget)

    # ---- the request observer (epp/request/observe.py) -------------------------------------------------------
    def decided(self, ex: Any) -> Followed | None:
        """Follow a committed request's response path (None for an external provider: no endpoint of ours)."""
        result = ex.result
        if result is None:
            return None
        return Followed(self, self.routed(result.primary.key, ex.ctx.request))

    def rejected(self, ex: Any, code: str) -> None:
        pass

    def probe_for(self, candidates: Sequence[Endpoint]) -> Endpoint | None:
        """A candidate whose cool-down is over and that waits for its probe, if any: the request at hand probes it."""
        waiting = self.awaiting_probe
        if not waiting:
            return None
        for e in candidates:
            if e.key in waiting:
                return e
        return None

    # ---- what a followed request reports -------------------------------------------------------------------------
    def routed(self, key: str, req: LLMRequest) -> Watch:
        body = req.body
        w = Watch(key, bool(body.get("stream")) if body else False, self.clock())
        if w.streaming:
            self.silence.quiet[w] = None
        st = self.states.get(key)
        if st is not None and st.state == PROBING and st.probe is None:
            st.probe = w
            w.probe = True
            self.awaiting_probe.discard(key)
            self.datastore.ejected.add(key)  # one request at a time while probing
        return w

    def response_started(self, w: Watch, status: str, served: str | None) -> None:
        now = self.clock()
        self.silence.headers_seen_at = now
        w.last = now
        if served and served != w.key and "," not in served:
            self._release_probe(w)  # Envoy served another host (override_host fallback): judge that one
            w.key = served
        w.status = int(status) if status.isdigit() else 0
        if w.status >= 500:
            self._fail(w, f"HTTP {w.status}", "http_5xx")
        elif w.probe:
            self._restore(w)  # it answers: back in rotation (the response's end still counts for the streak)
        self.silence.track(w)

    def progress(self, w: Watch, end: bool) -> None:
        w.last = self.clock()
        w.chunks += 1
        if end and not w.complete:
            w.complete = True
            if 0 < w.status < 500:
                self._succeed(w)
        self.silence.track(w)

    def closed(self, w: Watch) -> None:
        w.closed = True
        self.silence.untrack(w)
        if 0 < w.status < 500 and not w.complete and not w.failed:
            if w.chunks:
                self._fail(w, "the response was cut short (reset, or the client left)", "cut_short")
            else:
                self._succeed(w)  # headers without body messages: Envoy sends response headers only
        self._release_probe(w)

    # ---- verdicts ------------------------------------------------------------------------------------------------
    def _state(self, key: str) -> EndpointHealth:
        st = self.states.get(key)
        if st is None:
            st = self.states[key] = EndpointHealth(since=self.clock())
        return st

    def _succeed(self, w: Watch) -> None:
        st = self._state(w.key)
        st.successes += 1
        st.consecutive = 0

    def _restore(self, w: Watch) -> None:
        st = self._state(w.key)
        if st.probe is w:
            st.probe = None
            w.probe = False
            st.state, st.since, st.cooldown, st.consecutive = HEALTHY, self.clock(), 0.0, 0
            self.awaiting_probe.discard(w.key)
            self.datastore.ejected.discard(w.key)
            log.info("endpoint %s answered its probe; back in rotation", w.key)

    def _fail(self, w: Watch, reason: str, kind: str) -> None:
        if w.failed:
            return  # one failure per request
        w.failed = True
        self.silence.untrack(w)
        st = self._state(w.key)
        st.failures += 1
        st.consecutive += 1
        st.reason = reason
        if self.metrics is not None:
            self.metrics.endpoint_failure(w.key, kind)
        if w.probe and st.probe is w:
            st.probe = None
            w.probe = False
            self._eject(w.key, st, min(self.max_cooldown, max(self.cooldown, st.cooldown * 2)), "its probe failed")
        elif st.state == HEALTHY and st.consecutive >= self.failure_threshold:
            self._eject(w.key, st, self.cooldown, f"{st.consecutive} failures in a row")

    def _eject(self, key: str, st: EndpointHealth, cooldown: float, why: str) -> None:
        if key not in self.datastore.members():
            return  # it left meanwhile
        now = self.clock()
        st.state, st.since, st.until, st.cooldown = EJECTED, now, now + cooldown, cooldown
        st.ejections += 1
        self.awaiting_probe.discard(key)
        self.datastore.ejected.add(key)
        if self.metrics is not None:
            self.metrics.endpoint_ejected(key, "passive")
        log.warning("endpoint %s out of rotation for %.1f s: %s (last: %s)", key, cooldown, why, st.reason)

    def _release_probe(self, w: Watch) -> None:
        """A probe that ends (or moves to another host) without a verdict lets the next request probe."""
        if not w.probe:
            return
        w.probe = False
        st = self.states.get(w.key)
        if st is not None and st.probe is w:
            st.probe = None
            if st.state == PROBING:
                self.awaiting_probe.add(w.key)
                self.datastore.ejected.discard(w.key)

    # ---- time ---------------------------------------------------------------------------------------------------
    def tick(self) -> None:
        """Open the probe of endpoints whose cool-down is over; fail requests that went silent."""
        now = self.clock()
        for key, st in self.states.items():
            if st.state == EJECTED and now >= st.until:
                st.state, st.since = PROBING, now
                if st.probe is None:
                    self.awaiting_probe.add(key)
                    self.datastore.ejected.discard(key)
                log.info("endpoint %s: cool-down over, the next request probes it", key)
        for w in self.silence.due(now, self.silence_timeout):
            self._fail(w, f"no response for {now - w.last:.1f} s", "silent")  # leaves the queue

    def start(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run(), name="passive-health")

    async def stop(self) -> None:
        await cancel_and_wait(self._task)
        self._task = None

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            try:
                self.tick()
            except Exception:  # the loop must survive anything
                log.exception("passive health tick failed")

    def forget(self, key: str) -> None:
        """The endpoint left (datastore lifecycle): a key that comes back starts healthy."""
        st = self.states.pop(key, None)
        self.awaiting_probe.discard(key)
        if st is not None and st.probe is not None:
            st.probe.probe = False  # the one request that may carry its probe flag (see routed, _release_probe)

    # ---- reporting ---------------------------------------------------------------------------------------------
    def view(self, key: str) -> tuple[str, str, EndpointHealth | None]:
        """(state, reason, detail) as `epp endpoints` shows it: scrape failures first, then passive health."""
        now = self.clock()
        st = self.states.get(key)
        scraper = self.scraper
        if key in self.datastore.unhealthy:
            err = scraper.last_error(key) if scraper is not None else ""
            n = scraper.failures(key) if scraper is not None else 0
            return "out", f"{n} failed scrapes in a row: {err}".strip(": "), st
        if st is None:
            return HEALTHY, "", None
        if st.state == EJECTED:
            return EJECTED, f"{st.reason}; probe in {max(0.0, st.until - now):.1f} s", st
        if st.state == PROBING:
            return PROBING, f"{st.reason}; {'probe in flight' if st.probe else 'next request probes'}", st
        return HEALTHY, "", st
