"""The scraper's HTTP client: GET of a metrics page over HTTP/1.1 keep-alive, one connection per endpoint.

A scrape is one small GET, twenty times a second per endpoint, on the event loop that also routes requests. With a
general client (aiohttp) a scrape of vLLM's page cost about 470 µs of CPU, parse included, against about 360 µs
with this one (docs/model-servers.md); what a metrics page needs is a request line, a response head, and a body
framed by `content-length`, chunked transfer coding or the connection's end. This client
does that and nothing else: an `asyncio.Protocol` per connection collects the response, `MetricsClient.get` sends
the request and waits for it, and a finished connection goes back to its endpoint's idle list.

- Sent: `GET <path> HTTP/1.1`, `Host`, `Accept: text/plain`, `Connection: keep-alive`. No `Accept-Encoding`, so a
  server sends the page as it is; one that compresses anyway (gzip, deflate) is decompressed.
- Redirects (301, 302, 303, 307, 308) are followed up to `MAX_REDIRECTS` times while they stay on the endpoint (a
  path, or a URL with the same scheme and authority): an engine that mounts its page at `/metrics/` answers
  `/metrics` with a 307. One that points elsewhere is an error: a scrape never goes to another host.
- Limits: a response head over `MAX_HEAD` bytes, a body over `MAX_BODY`, a malformed status line, length or chunk
  size are errors (`HttpError`), and the connection is closed. The caller bounds the time (`timeout`); a GET that
  is cancelled or times out closes its connection, so a late response never reaches the next one.
- A connection the server closed while it was idle is not reused. A reused connection that ends before any byte of
  its response arrives (the server closed it as the request went out) is retried once on a new connection.
- TLS: `ssl` is the `SSLContext` to use (`insecure_context()` skips verification, as
  `--model-server-metrics-https-insecure-skip-verify` asks), None for plain HTTP.
"""

from __future__ import annotations

import asyncio
import ssl as ssl_mod
import zlib
from collections import defaultdict
from typing import NamedTuple

MAX_HEAD = 64 * 1024  # bytes of a response's status line and headers
MAX_BODY = 64 * 1024 * 1024  # bytes of a metrics page
MAX_IDLE = 4  # idle connections kept per endpoint
MAX_INTERIM = 8  # 1xx responses skipped before the response
MAX_REDIRECTS = 3  # redirects followed, on the same endpoint only
REDIRECTS = frozenset({301, 302, 303, 307, 308})


class HttpError(Exception):
    """The server's response could not be read (malformed, too large, or cut short)."""


class Response:
    __slots__ = ("status", "body", "location")

    def __init__(self, status: int, body: bytes, location: bytes = b"") -> None:
        self.status, self.body, self.location = status, body, location


def insecure_context() -> ssl_mod.SSLContext:
    ctx = ssl_mod.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl_mod.CERT_NONE
    return ctx


class _Connection(asyncio.Protocol):
    """One connection: collects one response at a time (`expect`), reports it through a future."""

    __slots__ = ("transport", "buf", "reader", "waiter", "closed", "got_bytes", "keep")

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
        self.reader = ResponseReader()
        self.waiter: asyncio.Future[Response] | None = None
        self.closed = False
        self.got_bytes = False  # some of the current response arrived
        self.keep = False  # the connection may serve another request

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def expect(self, waiter: asyncio.Future[Response]) -> None:
        self.waiter, self.got_bytes = waiter, False
        self.buf.clear()
        self.reader = ResponseReader()

    def data_received(self, data: bytes) -> None:
        self.got_bytes = True
        if self.waiter is None:  # nothing was asked: a server talking out of turn
            self.close()
            return
        self.buf += data
        self._advance(False)

    def eof_received(self) -> bool | None:
        self._advance(True)
        return None  # close the transport

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        w = self.waiter
        if w is not None and not w.done():
            self._advance(True)
            if not w.done():
                w.set_exception(ConnectionError(f"connection closed before the response ended ({exc or 'EOF'})"))

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()

    def _advance(self, at_eof: bool) -> None:
        w = self.waiter
        if w is None or w.done():
            return
        try:
            done = self.reader.read(self.buf, at_eof)
        except HttpError as e:
            self.waiter = None
            w.set_exception(e)
            self.close()
            return
        if done is not None:
            response, keep = done
            self.waiter, self.keep = None, keep and not at_eof
            w.set_result(response)


class _Head(NamedTuple):
    status: int
    length: int | None  # content-length
    chunked: bool
    keep: bool  # the server keeps the connection open
    encoding: bytes  # content-encoding
    location: bytes  # where a redirect points


class ResponseReader:
    """One HTTP/1.1 response read from a buffer that grows: the head once it is whole, then the body, each chunk of
    a chunked body looked at once (`read` again after more bytes came)."""

    __slots__ = ("head", "at", "body", "interim")

    def __init__(self) -> None:
        self.head: _Head | None = None
        self.at = 0  # where the unread part of the buffer begins
        self.body = bytearray()  # a chunked body so far
        self.interim = 0  # 1xx responses skipped

    def read(self, buf: bytearray, at_eof: bool) -> tuple[Response, bool] | None:
        """The response and whether the connection stays open, or None while it is incomplete."""
        head = self.head
        while head is None:
            end = buf.find(b"\r\n\r\n", self.at)
            if end < 0:
                if len(buf) - self.at > MAX_HEAD:
                    raise HttpError(f"response head over {MAX_HEAD} bytes")
                return None
            if end - self.at > MAX_HEAD:
                raise HttpError(f"response head over {MAX_HEAD} bytes")
            head = _head(bytes(buf[self.at:end]))
            self.at = end + 4
            if 100 <= head.status < 200:  # an interim response: skip it and read on
                self.interim += 1
                if self.interim > MAX_INTERIM:
                    raise HttpError(f"more than {MAX_INTERIM} interim (1xx) responses")
                head = None
        self.head = head
        keep = head.keep
        start = self.at
        body: bytes
        if head.status in (204, 304):
            body, used = b"", start
        elif head.chunked:
            used = self._chunks(buf)
            if used < 0:
                if at_eof:
                    raise HttpError("connection closed inside a chunked body")
                return None
            body = bytes(self.body)
        elif head.length is not None:
            if head.length > MAX_BODY:
                raise HttpError(f"body of {head.length} bytes over the {MAX_BODY}-byte limit")
            if len(buf) - start < head.length:
                if at_eof:
                    raise HttpError(f"connection closed after {len(buf) - start} of {head.length} body bytes")
                return None
            body, used = bytes(buf[start : start + head.length]), start + head.length
        else:  # read until the connection ends
            if len(buf) - start > MAX_BODY:
                raise HttpError(f"body over the {MAX_BODY}-byte limit")
            if not at_eof:
                return None
            body, used, keep = bytes(buf[start:]), len(buf), False
        if used != len(buf):  # bytes past the response: the connection is not in a state to reuse
            keep = False
        if head.encoding in (b"gzip", b"x-gzip", b"deflate"):
            body = _inflate(body, head.encoding)
        elif head.encoding not in (b"", b"identity"):
            raise HttpError(f"unsupported content-encoding {head.encoding[:40]!r}")
        return Response(head.status, body, head.location), keep

    def _chunks(self, buf: bytearray) -> int:
        """Read the chunks that are whole from `at` on; where the message ends once the last came, else -1."""
        out, at = self.body, self.at
        while True:
            eol = buf.find(b"\r\n", at)
            if eol < 0:
                if len(buf) - at > 1024:
                    raise HttpError("malformed chunk size line")
                self.at = at
                return -1
            size_text = bytes(buf[at:eol]).split(b";", 1)[0].strip()
            try:
                size = int(size_text, 16)
            except ValueError:
                raise HttpError(f"malformed chunk size {size_text[:20]!r}") from None
            if size < 0:
                raise HttpError(f"malformed chunk size {size_text[:20]!r}")
            if size == 0:  # the last chunk; the trailers (usually none) end with an empty line
                end = buf.find(b"\r\n\r\n", eol)
                if end < 0:
                    if len(buf) - eol > MAX_HEAD:
                        raise HttpError(f"trailers over {MAX_HEAD} bytes")
                    self.at = at
                    return -1
                return end + 4
            if len(out) + size > MAX_BODY:
                raise HttpError(f"body over the {MAX_BODY}-byte limit")
            data_end = eol + 2 + size
            if len(buf) < data_end + 2:
                self.at = at
                return -1
            if buf[data_end : data_end + 2] != b"\r\n":
                raise HttpError("malformed chunk: no CRLF after its data")
            out += buf[eol + 2 : data_end]
            at = data_end + 2


def _head(raw: bytes) -> _Head:
    lines = raw.split(b"\r\n")
    parts = lines[0].split(b" ", 2)
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit() or len(parts[1]) != 3:
        raise HttpError(f"malformed status line {lines[0][:80]!r}")
    length: int | None = None
    chunked = False
    keep = parts[0] == b"HTTP/1.1"
    encoding = location = b""
    for line in lines[1:]:
        name, sep, value = line.partition(b":")
        if not sep:
            raise HttpError(f"malformed header line {line[:80]!r}")
        name, value = name.strip().lower(), value.strip()
        if name == b"content-length":
            if not value.isdigit():
                raise HttpError(f"malformed content-length {value[:40]!r}")
            length = int(value)
        elif name == b"transfer-encoding":
            chunked = value.lower().endswith(b"chunked")
        elif name == b"connection":
            tokens = {t.strip() for t in value.lower().split(b",")}
            keep = b"close" not in tokens and (keep or b"keep-alive" in tokens)
        elif name == b"content-encoding":
            encoding = value.lower()
        elif name == b"location":
            location = value
    return _Head(int(parts[1]), length, chunked, keep, encoding, location)


def _inflate(body: bytes, encoding: bytes) -> bytes:
    wbits = 16 + zlib.MAX_WBITS if encoding != b"deflate" else zlib.MAX_WBITS
    d = zlib.decompressobj(wbits)
    try:
        out = d.decompress(body, MAX_BODY)
    except zlib.error:
        if encoding != b"deflate":
            raise HttpError("malformed gzip body") from None
        try:  # a raw deflate stream, as some servers send for "deflate"
            out = zlib.decompressobj(-zlib.MAX_WBITS).decompress(body, MAX_BODY)
        except zlib.error:
            raise HttpError("malformed deflate body") from None
    if d.unconsumed_tail:
        raise HttpError(f"decompressed body over the {MAX_BODY}-byte limit")
    return out


def _same_endpoint(location: bytes, authority: str, scheme: str) -> str:
    """The path a redirect points to, when it stays on the endpoint (a path, or a URL of the same scheme and
    authority); else HttpError."""
    text = location.decode("latin-1")
    if text.startswith("/") and not text.startswith("//"):
        return text
    origin = f"{scheme}://{authority}"
    if text.lower().startswith(origin.lower()) and text[len(origin):len(origin) + 1] in ("/", ""):
        return text[len(origin):] or "/"
    raise HttpError(f"redirect away from the endpoint, to {text[:120]!r}")


def _expire(waiter: asyncio.Future[Response]) -> None:
    if not waiter.done():
        waiter.set_exception(TimeoutError("no complete response within the scrape timeout"))


class MetricsClient:
    """GETs over kept-alive connections, by endpoint (host, port, TLS)."""

    def __init__(self) -> None:
        self._idle: defaultdict[tuple[str, int, int], list[_Connection]] = defaultdict(list)
        self._open: set[_Connection] = set()

    async def get(self, host: str, port: int, path: str, *, authority: str, timeout: float,
                  ssl: ssl_mod.SSLContext | None = None) -> Response:
        """GET `path` from host:port (`authority` is the Host header) within `timeout` seconds, following up to
        MAX_REDIRECTS redirects on the same endpoint (a page mounted at `/metrics/` answers `/metrics` with a 307,
        as Starlette does). Raises OSError (TimeoutError among them) and HttpError."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        for _ in range(MAX_REDIRECTS + 1):
            resp = await self._get(host, port, path, authority, deadline, ssl)
            if resp.status not in REDIRECTS or not resp.location:
                return resp
            path = _same_endpoint(resp.location, authority, "https" if ssl is not None else "http")
        raise HttpError(f"more than {MAX_REDIRECTS} redirects")

    async def _get(self, host: str, port: int, path: str, authority: str, deadline: float,
                   ssl: ssl_mod.SSLContext | None) -> Response:
        loop = asyncio.get_running_loop()
        key = (host, port, id(ssl) if ssl is not None else 0)
        request = (f"GET {path} HTTP/1.1\r\nHost: {authority}\r\nAccept: text/plain\r\n"
                   f"Connection: keep-alive\r\n\r\n").encode()
        idle = self._idle[key]
        while idle:
            conn = idle.pop()
            if conn.closed:
                continue
            try:
                return await self._exchange(key, conn, request, deadline)
            except ConnectionError:
                if conn.got_bytes:
                    raise
                break  # closed by the server as the request went out: once more, on a new connection
        _, conn = await asyncio.wait_for(
            loop.create_connection(_Connection, host, port, ssl=ssl, server_hostname=host if ssl is not None else None),
            max(0.0, deadline - loop.time()))
        return await self._exchange(key, conn, request, deadline)

    async def _exchange(self, key: tuple[str, int, int], conn: _Connection, request: bytes, deadline: float
                        ) -> Response:
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[Response] = loop.create_future()
        conn.expect(waiter)
        self._open.add(conn)
        timer = loop.call_at(deadline, _expire, waiter)
        try:
            assert conn.transport is not None
            conn.transport.write(request)
            response = await waiter
        except BaseException:
            conn.close()  # cancelled, timed out or failed: a late response must not reach the next request
            raise
        finally:
            timer.cancel()
            self._open.discard(conn)
        idle = self._idle[key]
        if conn.keep and not conn.closed and len(idle) < MAX_IDLE:
            idle.append(conn)
        else:
            conn.close()
        return response

    def forget(self, host: str, port: int) -> None:
        """Close the idle connections to an endpoint that left."""
        for key in [k for k in self._idle if k[0] == host and k[1] == port]:
            for conn in self._idle.pop(key):
                conn.close()

    async def close(self) -> None:
        for conns in self._idle.values():
            for conn in conns:
                conn.close()
        self._idle.clear()
        for conn in list(self._open):
            conn.close()
        self._open.clear()
        await asyncio.sleep(0)  # let the transports finish closing
