"""Who may see the dashboard: its token, the session cookie the sign-in form sets, and the page's content policy.

Without a token every route is open. With one, a request needs `Authorization: Bearer <token>` or the session
cookie (HttpOnly, SameSite=Strict, scoped to the path prefix), which is an HMAC of the token rather than the token.
Both are compared in constant time. The token is never logged.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Awaitable, Callable

from aiohttp import web

COOKIE = "pointsman_dashboard"
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
       "form-action 'self'; base-uri 'none'; frame-ancestors 'none'")
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class TokenAuth:
    def __init__(self, token: str | None, prefix: str, login_html: str) -> None:
        self.prefix = prefix
        self._token = token.encode() if token else None
        self._session = (hmac.new(self._token, b"pointsman-dashboard-session", hashlib.sha256).hexdigest().encode()
                         if self._token else b"")
        self._login_html = login_html  # the sign-in form, with {{action}} and {{message}} to fill in

    def authorized(self, request: web.Request) -> bool:
        if self._token is None:
            return True
        auth = request.headers.get("Authorization", "")
        if auth[:7].lower() == "bearer " and hmac.compare_digest(auth[7:].strip().encode(), self._token):
            return True
        cookie = request.cookies.get(COOKIE)
        return cookie is not None and hmac.compare_digest(cookie.encode(), self._session)

    def guard(self, handler: Handler) -> Handler:
        async def guarded(request: web.Request) -> web.StreamResponse:
            if not self.authorized(request):
                return web.json_response({"error": "unauthorized: send Authorization: Bearer <token>"},
                                         status=401, headers={"WWW-Authenticate": 'Bearer realm="pointsman"'})
            return await handler(request)

        return guarded

    def login_page(self, message: str, status: int) -> web.Response:
        # Relative URLs, like the page's: they keep working behind a reverse proxy that rewrites the prefix.
        html = self._login_html.replace("{{action}}", "login").replace("{{message}}", message)
        return web.Response(text=html, status=status, content_type="text/html", headers={"Content-Security-Policy": CSP})

    async def login(self, request: web.Request) -> web.Response:
        """POST P + "login", form field `token`: sets the session cookie and returns to the page."""
        if self._token is None:
            raise web.HTTPSeeOther(self.prefix)
        form = await request.post()
        given = str(form.get("token", "")).strip().encode()
        if not hmac.compare_digest(given, self._token):
            return self.login_page("That token is not right.", 401)
        resp = web.Response(status=303, headers={"Location": "./"})
        resp.set_cookie(COOKIE, self._session.decode(), path=self.prefix, httponly=True, samesite="Strict",
                        secure=request.secure)
        return resp
