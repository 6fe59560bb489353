"""Who may read /metrics (`--metrics-endpoint-auth`): the check GIE's EPP makes, with the Kubernetes API.

A request must carry `Authorization: Bearer <token>`. The token is sent to the API server in a TokenReview
(authentication.k8s.io/v1); a token it does not authenticate gets 401. The user it names is checked with a
SubjectAccessReview (authorization.k8s.io/v1) for the request's verb (the HTTP method in lower case: `get`) on the
non-resource URL (the request path: `/metrics`); a user not allowed gets 403. When the API server cannot be asked,
the answer is 500 and the reason goes to the log. Answers are cached as controller-runtime's filter caches them:
an authenticated token for a minute, an allowed user for five minutes, a denied one for 30 seconds.

Prometheus needs a ClusterRole with `nonResourceURLs: ["/metrics"], verbs: ["get"]`; Pointsman's ServiceAccount
needs `create` on tokenreviews and subjectaccessreviews (deploy/ grants both when auth is on).

Tokens never reach a log, a metric or an error message: the caches key on a SHA-256 of the token.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import Awaitable, Callable, Collection
from dataclasses import dataclass
from typing import Any

from aiohttp import web

log = logging.getLogger(__name__)

AUTHN_TTL_S, ALLOW_TTL_S, DENY_TTL_S = 60.0, 300.0, 30.0


@dataclass(frozen=True)
class User:
    name: str
    uid: str = ""
    groups: tuple[str, ...] = ()
    extra: tuple[tuple[str, tuple[str, ...]], ...] = ()


def bearer_token(header: str | None) -> str | None:
    """The token of an `Authorization: Bearer <token>` header (None when absent or another scheme)."""
    if not header:
        return None
    scheme, _, token = header.strip().partition(" ")
    token = token.strip()
    return token if scheme.lower() == "bearer" and token else None


class KubeReviews:
    """TokenReview and SubjectAccessReview over a kubernetes ApiClient (blocking calls, run in a thread)."""

    def __init__(self, api: Any) -> None:
        self.api = api

    def token_review(self, token: str) -> User | None:
        from kubernetes import client as k8s

        review = k8s.V1TokenReview(api_version="authentication.k8s.io/v1", kind="TokenReview",
                                   spec=k8s.V1TokenReviewSpec(token=token))
        status = k8s.AuthenticationV1Api(self.api).create_token_review(review).status
        if status is None or not status.authenticated or status.user is None:
            return None
        u = status.user
        extra = tuple(sorted((k, tuple(v or ())) for k, v in (u.extra or {}).items()))
        return User(u.username or "", u.uid or "", tuple(u.groups or ()), extra)

    def access_review(self, user: User, verb: str, path: str) -> tuple[bool, str]:
        from kubernetes import client as k8s

        spec = k8s.V1SubjectAccessReviewSpec(
            user=user.name, uid=user.uid or None, groups=list(user.groups) or None,
            extra={k: list(v) for k, v in user.extra} or None,
            non_resource_attributes=k8s.V1NonResourceAttributes(path=path, verb=verb))
        review = k8s.V1SubjectAccessReview(api_version="authorization.k8s.io/v1", kind="SubjectAccessReview",
                                           spec=spec)
        status = k8s.AuthorizationV1Api(self.api).create_subject_access_review(review).status
        return bool(status and status.allowed and not status.denied), (status.reason or "") if status else ""


class MetricsAuth:
    """The check of one request, with the caches (see the module docstring)."""

    def __init__(self, reviews: KubeReviews, clock: Callable[[], float] = time.monotonic) -> None:
        self.reviews = reviews
        self.clock = clock
        self._users: dict[str, tuple[float, User | None]] = {}  # sha256(token) -> (expires, user)
        self._decisions: dict[tuple[User, str, str], tuple[float, bool]] = {}
        self.api_calls = 0  # reviews sent to the API server

    async def check(self, authorization: str | None, method: str, path: str) -> tuple[int, str]:
        """(HTTP status, message): 200 when the request may read `path`."""
        token = bearer_token(authorization)
        if token is None:
            return 401, "Unauthorized"
        try:
            user = await self._user(token)
        except Exception as e:  # the API server is unreachable or refuses us: not the client's fault
            log.error("metrics auth: TokenReview failed: %s", _reason(e))
            return 500, "Authentication failed"
        if user is None:
            return 401, "Unauthorized"
        try:
            allowed = await self._allowed(user, method.lower(), path)
        except Exception as e:
            log.error("metrics auth: SubjectAccessReview for user %s failed: %s", user.name, _reason(e))
            return 500, f"Authorization for user {user.name} failed"
        if not allowed:
            return 403, f"Authorization denied for user {user.name}"
        return 200, ""

    async def _user(self, token: str) -> User | None:
        key = hashlib.sha256(token.encode()).hexdigest()
        now = self.clock()
        hit = self._users.get(key)
        if hit is not None and hit[0] > now:
            return hit[1]
        self.api_calls += 1
        user = await asyncio.to_thread(self.reviews.token_review, token)
        self._users[key] = (now + AUTHN_TTL_S, user)
        _trim(self._users, now)
        return user

    async def _allowed(self, user: User, verb: str, path: str) -> bool:
        key = (user, verb, path)
        now = self.clock()
        hit = self._decisions.get(key)
        if hit is not None and hit[0] > now:
            return hit[1]
        self.api_calls += 1
        allowed, reason = await asyncio.to_thread(self.reviews.access_review, user, verb, path)
        if not allowed:
            log.debug("metrics auth: %s may not %s %s: %s", user.name, verb, path, reason)
        self._decisions[key] = (now + (ALLOW_TTL_S if allowed else DENY_TTL_S), allowed)
        _trim(self._decisions, now)
        return allowed

    def middleware(self, paths: Collection[str] = ("/metrics",)) -> Callable[..., Awaitable[web.StreamResponse]]:
        """An aiohttp middleware guarding `paths` (the dashboard keeps its own token)."""

        @web.middleware
        async def guard(request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
                        ) -> web.StreamResponse:
            if request.path in paths:
                status, message = await self.check(request.headers.get("Authorization"), request.method,
                                                   request.path)
                if status != 200:
                    return web.Response(status=status, text=message + "\n")
            return await handler(request)

        return guard


def _reason(e: Exception) -> str:
    status = getattr(e, "status", None)
    return f"HTTP {status} {getattr(e, 'reason', '')}".strip() if status else type(e).__name__


def _trim(cache: dict[Any, tuple[float, Any]], now: float, cap: int = 4096) -> None:
    """Expired entries go once a cache is large; past `cap` the oldest go too (random tokens cannot grow it)."""
    if len(cache) > cap:
        for k in [k for k, (expires, _) in cache.items() if expires <= now]:
            del cache[k]
        while len(cache) > cap:
            del cache[next(iter(cache))]


__all__ = ["ALLOW_TTL_S", "AUTHN_TTL_S", "DENY_TTL_S", "KubeReviews", "MetricsAuth", "User", "bearer_token"]
