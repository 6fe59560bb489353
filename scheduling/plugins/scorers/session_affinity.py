"""session-affinity-scorer: keep a session on the endpoint that served it.

Sources, tried in order (first non-empty value is the session key); default: header x-session-id:
    header <name> | cookie <name> | query <name> (from :path) | jwtClaim <claim> (Bearer token payload, unverified)
Only an xxh3-128 hash of the key is stored, with an idle TTL (ttlSeconds, 300) measured on ctx.now.

    llm-d form: header x-session-token = base64(endpoint key) of a candidate  -> that endpoint 1.0, others 0.0
    known session bound to candidate b, not rebalanced                         -> b 1.0, others 0.0
    new (or expired, or rebalanced) session: least-loaded candidates 1.0, others 0.0
        load(e) = waiting + running + in-flight requests (ctx.inflight)
    rebalance (LLMKube): b is queueing (waiting > 0) and load(b) − min load ≥ busyMargin (4)
    no session key                                                             -> 0.0 everywhere
pre_request binds the session to the chosen endpoint, drops idle ones and sets response header x-session-token;
scoring never changes state (an expired binding is simply not used). A departed endpoint's sessions are dropped.

Replication (scheduling/framework/replication.py): every binding is an idempotent record
[endpoint key, 16-byte hash, age in seconds]; the most recent binding of a session wins, wherever it was made.
"""

from __future__ import annotations

import base64
import binascii
from collections import OrderedDict, deque
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, urlsplit

import orjson
import xxhash

from scheduling.api import NO_LOAD, SchedulingContext, SchedulingResult
from scheduling.framework import BuildContext, ConfigError, Scorer, register
from scheduling.framework.errors import join_path
from scheduling.framework.params import bounded
from scheduling.framework.plugin import State
from scheduling.framework.replication import Record, drain
from scheduling.types import Endpoint

_KEY = "session-affinity.key"
_TYPES = ("header", "cookie", "query", "jwtClaim")
MAX_OUTBOX = 4096  # bindings kept for the bus between two exports
SNAPSHOT = 4096  # the most recent bindings given to a peer that joins


@dataclass(frozen=True)
class Params:
    sources: list[Any] = field(default_factory=lambda: [{"type": "header", "name": "x-session-id"}])
    ttlSeconds: float = bounded(300.0, min=0.0)
    tokenHeader: str = "x-session-token"
    useSessionToken: bool = True
    setResponseHeader: bool = True
    rebalance: bool = True
    busyMargin: int = bounded(4, min=0)
    maxSessions: int = bounded(100_000, min=1)


def _cookie(headers: Mapping[str, str], name: str) -> str:
    raw = headers.get("cookie", "")
    for part in raw.split(";"):
        k, sep, v = part.strip().partition("=")
        if sep and k == name:
            return v.strip().strip('"')
    return ""


def _query(headers: Mapping[str, str], name: str) -> str:
    path = headers.get(":path", "")
    if "?" not in path:
        return ""
    values = parse_qs(urlsplit(path).query).get(name)
    return values[0] if values else ""


def _jwt_claim(headers: Mapping[str, str], name: str) -> str:
    auth = headers.get("authorization", "")
    if not auth.lower().startswith("bearer "):
        return ""
    parts = auth[7:].strip().split(".")
    if len(parts) < 2:
        return ""
    payload = parts[1] + "=" * (-len(parts[1]) % 4)
    try:
        claims = orjson.loads(base64.urlsafe_b64decode(payload))
    except (ValueError, binascii.Error):
        return ""
    value = claims.get(name) if isinstance(claims, dict) else None
    return "" if value is None else str(value)


def session_key(headers: Mapping[str, str], sources: Sequence[tuple[str, str]]) -> str:
    """The first non-empty value of the sources `(header | cookie | query | jwtClaim, name)`, in order; header names
    are lower-case (as the shell delivers headers). "" when every source is empty."""
    for kind, name in sources:
        if kind == "header":
            value = headers.get(name, "")
        elif kind == "cookie":
            value = _cookie(headers, name)
        elif kind == "query":
            value = _query(headers, name)
        else:
            value = _jwt_claim(headers, name)
        if value:
            return value
    return ""


def decode_token(token: str) -> str:
    try:
        return base64.b64decode(token + "=" * (-len(token) % 4), validate=False).decode("utf-8")
    except (ValueError, binascii.Error, UnicodeDecodeError):
        return ""


def encode_token(endpoint_key: str) -> str:
    return base64.b64encode(endpoint_key.encode("utf-8")).decode("ascii")


@register("session-affinity-scorer")
class SessionAffinityScorer(Scorer[Params]):
    Params = Params
    clamped = True

    def setup(self, build: BuildContext) -> None:
        srcs = []
        for i, src in enumerate(self.params.sources):
            p = join_path(join_path(build.path, "sources"), i)
            if not isinstance(src, Mapping) or set(src) - {"type", "name"}:
                raise ConfigError(build.source, p, f"expected {{type, name}}, got {src!r}")
            if src.get("type") not in _TYPES:
                raise ConfigError(
                    build.source,
                    join_path(p, "type"),
                    f"expected one of {', '.join(_TYPES)}, got {src.get('type')!r}",
                )
            name = src.get("name")
            if not isinstance(name, str) or not name:
                raise ConfigError(
                    build.source, join_path(p, "name"), f"expected a non-empty string, got {name!r}"
                )
            srcs.append((src["type"], name.lower() if src["type"] == "header" else name))
        self._sources = srcs
        self.sessions: OrderedDict[int, tuple[str, float]] = OrderedDict()  # hash -> (endpoint key, last use)
        self._outbox: deque[tuple[int, str, float]] | None = None  # (hash, endpoint, at): set while replicating

    def session_key(self, headers: Mapping[str, str]) -> str:
        return session_key(headers, self._sources)

    def _expire(self, now: float) -> None:
        ttl = self.params.ttlSeconds
        sessions = self.sessions
        while sessions:
            h, (_, last) = next(iter(sessions.items()))
            if now - last <= ttl:
                break
            sessions.popitem(last=False)

    def score(self, ctx: SchedulingContext, candidates: list[Endpoint], state: State) -> list[float]:
        n = len(candidates)
        p = self.params
        headers = ctx.request.headers
        if p.useSessionToken:
            token = headers.get(p.tokenHeader)
            if token:
                key = decode_token(token)
                if any(e.key == key for e in candidates):
                    return [1.0 if e.key == key else 0.0 for e in candidates]
        skey = self.session_key(headers)
        if not skey:
            return [0.0] * n
        h = xxhash.xxh3_128_intdigest(skey.encode("utf-8"))
        state[_KEY] = h
        inflight = ctx.inflight
        loads = [
            e.metrics.waiting + e.metrics.running + inflight.get(e.key, NO_LOAD).requests for e in candidates
        ]
        low = min(loads)
        bound = self.sessions.get(h)
        if bound is not None and ctx.now - bound[1] <= p.ttlSeconds:
            for j, e in enumerate(candidates):
                if e.key == bound[0]:
                    busy = p.rebalance and e.metrics.waiting > 0 and loads[j] - low >= p.busyMargin
                    if not busy:
                        return [1.0 if i == j else 0.0 for i in range(n)]
                    break
        return [1.0 if x == low else 0.0 for x in loads]

    def pre_request(self, ctx: SchedulingContext, result: SchedulingResult, state: State) -> None:
        if not result.targets:
            return
        key = result.targets[0].key
        if self.params.useSessionToken and self.params.setResponseHeader:
            result.response_headers[self.params.tokenHeader] = encode_token(key)
        h = state.get(_KEY)
        if h is None:
            return
        self._expire(ctx.now)
        sessions = self.sessions
        sessions[h] = (key, ctx.now)
        sessions.move_to_end(h)
        while len(sessions) > self.params.maxSessions:
            sessions.popitem(last=False)
        if self._outbox is not None:
            self._outbox.append((h, key, ctx.now))

    def endpoint_removed(self, key: str) -> None:
        """Sessions bound to a departed endpoint start over (an ip:port that comes back is a new pod)."""
        gone = [h for h, (ep, _) in self.sessions.items() if ep == key]
        for h in gone:
            del self.sessions[h]

    def tracked_endpoints(self) -> Collection[str]:
        return {ep for ep, _ in self.sessions.values()}

    # ---- replication -------------------------------------------------------------------------------------
    def replication_key(self) -> str:
        return "session-affinity"

    def set_replicating(self, on: bool) -> None:
        self._outbox = deque(maxlen=MAX_OUTBOX) if on else None

    def export_records(self, now: float) -> list[Record]:
        """[endpoint key, hash as 16 big-endian bytes, age in seconds as of `now`]: an age, not a time, so that
        receivers on other clocks place the binding right."""
        return [[key, h.to_bytes(16, "big"), max(0.0, now - at)] for h, key, at in drain(self._outbox)]

    def snapshot_records(self, now: float) -> list[Record]:
        """The SNAPSHOT most recently used live bindings, newest first."""
        out: list[Record] = []
        ttl = self.params.ttlSeconds
        for h, (key, last) in reversed(self.sessions.items()):
            if len(out) >= SNAPSHOT or now - last > ttl:
                break
            out.append([key, h.to_bytes(16, "big"), max(0.0, now - last)])
        return out

    def apply_records(self, peer: str, records: Sequence[Record], now: float) -> int:
        bad = 0
        ttl = self.params.ttlSeconds
        sessions = self.sessions
        for rec in records:
            if (len(rec) != 3 or not isinstance(rec[1], bytes) or len(rec[1]) != 16
                    or not isinstance(rec[2], (int, float)) or isinstance(rec[2], bool) or not 0 <= rec[2] < 1e9):
                bad += 1
                continue
            last = now - min(float(rec[2]), ttl)
            h = int.from_bytes(rec[1], "big")
            cur = sessions.get(h)
            if cur is not None and cur[1] >= last:
                continue  # what this process knows is as recent
            sessions[h] = (rec[0], last)
            sessions.move_to_end(h)
        while len(sessions) > self.params.maxSessions:
            sessions.popitem(last=False)
        return bad
