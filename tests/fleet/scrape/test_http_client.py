"""The scraper's HTTP client (epp/fleet/scrape/http.py) against real servers: aiohttp's, and a raw asyncio server
answering exactly the bytes a test writes (framings, compressions, broken and hostile responses)."""

from __future__ import annotations

import asyncio
import gzip
import ssl
import zlib
from collections.abc import Awaitable, Callable

import pytest
from aiohttp import web

from epp.fleet.scrape.http import MAX_HEAD, HttpError, MetricsClient, insecure_context

PAGE = b"# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{model_name=\"m\"} 3\n" * 400

Answer = Callable[[bytes, asyncio.StreamWriter], Awaitable[bool]]  # the request head -> keep the connection?


class RawServer:
    """Answers each request head with whatever `answer` writes; counts connections and requests."""

    def __init__(self, answer: Answer) -> None:
        self.answer = answer
        self.connections = 0
        self.requests: list[bytes] = []
        self.server: asyncio.AbstractServer | None = None
        self.port = 0

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                self.requests.append(head)
                if not await self.answer(head, writer):
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def __aenter__(self) -> RawServer:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()


async def get(client: MetricsClient, port: int, timeout: float = 2.0, **kw) -> bytes:
    resp = await client.get("127.0.0.1", port, "/metrics", authority=f"127.0.0.1:{port}", timeout=timeout, **kw)
    assert resp.status == 200, resp.status
    return resp.body


def fixed(body: bytes, *extra: bytes, status: bytes = b"200 OK", version: bytes = b"HTTP/1.1") -> Answer:
    async def answer(head: bytes, w: asyncio.StreamWriter) -> bool:
        w.write(version + b" " + status + b"\r\nContent-Length: " + str(len(body)).encode() + b"\r\n"
                + b"".join(x + b"\r\n" for x in extra) + b"\r\n" + body)
        await w.drain()
        return b"connection: close" not in b"".join(extra).lower()
    return answer


async def test_the_request_is_a_plain_keepalive_get_and_the_connection_is_reused() -> None:
    async with RawServer(fixed(PAGE)) as srv:
        client = MetricsClient()
        for _ in range(5):
            assert await get(client, srv.port) == PAGE
        await client.close()
    assert srv.connections == 1 and len(srv.requests) == 5
    head = srv.requests[0].lower()
    assert head.startswith(b"get /metrics http/1.1\r\n") and f"host: 127.0.0.1:{srv.port}".encode() in head
    assert b"accept-encoding" not in head  # the page comes as it is


async def test_chunked_pages_in_pieces_with_extensions_and_trailers() -> None:
    async def answer(head: bytes, w: asyncio.StreamWriter) -> bool:
        w.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        for i in range(0, len(PAGE), 7000):
            piece = PAGE[i:i + 7000]
            w.write(f"{len(piece):x};ext=1\r\n".encode() + piece + b"\r\n")
            await w.drain()
            await asyncio.sleep(0.001)
        w.write(b"0\r\nX-Trailer: yes\r\n\r\n")
        return True

    async with RawServer(answer) as srv:
        client = MetricsClient()
        assert await get(client, srv.port) == PAGE
        assert await get(client, srv.port) == PAGE  # and the connection is still usable
        await client.close()
    assert srv.connections == 1


@pytest.mark.parametrize("encoding", [b"gzip", b"deflate"])
async def test_a_compressed_page_is_inflated(encoding: bytes) -> None:
    body = gzip.compress(PAGE) if encoding == b"gzip" else zlib.compress(PAGE)
    async with RawServer(fixed(body, b"Content-Encoding: " + encoding)) as srv:
        client = MetricsClient()
        assert await get(client, srv.port) == PAGE
        await client.close()


async def test_connection_close_and_http10_bodies_read_to_the_end() -> None:
    async def until_close(head: bytes, w: asyncio.StreamWriter) -> bool:
        w.write(b"HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\n" + PAGE)
        await w.drain()
        return False  # the body ends with the connection

    for answer in (fixed(PAGE, b"Connection: close"), until_close):
        async with RawServer(answer) as srv:
            client = MetricsClient()
            for _ in range(3):
                assert await get(client, srv.port) == PAGE
            await client.close()
        assert srv.connections == 3  # a connection the server ends is never reused


async def test_an_idle_connection_the_server_closed_is_replaced() -> None:
    """The server keeps a connection for one response, then closes it while the client holds it idle: the next GET
    goes out on a new connection without an error."""
    async def once(head: bytes, w: asyncio.StreamWriter) -> bool:
        await fixed(PAGE)(head, w)
        return False

    async with RawServer(once) as srv:
        client = MetricsClient()
        for _ in range(3):
            assert await get(client, srv.port) == PAGE
            await asyncio.sleep(0.05)
        await client.close()
    assert srv.connections == 3


async def test_a_late_response_never_reaches_the_next_request() -> None:
    """A GET that times out closes its connection: the answer that comes later is not read as the next one's."""
    answers = iter([b"late", b"fresh"])

    async def slow_first(head: bytes, w: asyncio.StreamWriter) -> bool:
        body = next(answers)
        if body == b"late":
            await asyncio.sleep(0.3)
        await fixed(body)(head, w)
        return True

    async with RawServer(slow_first) as srv:
        client = MetricsClient()
        with pytest.raises(TimeoutError):
            await get(client, srv.port, timeout=0.1)
        await asyncio.sleep(0.3)
        assert await get(client, srv.port) == b"fresh"
        await client.close()
    assert srv.connections == 2


@pytest.mark.parametrize(("raw", "error"), [
    (b"HTTP/1.1 2OO OK\r\n\r\n", "malformed status line"),
    (b"SMTP ready\r\n\r\n", "malformed status line"),
    (b"HTTP/1.1 200 OK\r\nContent-Length: ten\r\n\r\n", "malformed content-length"),
    (b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n", "malformed header line"),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", "malformed chunk size"),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabcXY", "no CRLF after its data"),
    (b"HTTP/1.1 200 OK\r\nContent-Length: 99999999999\r\n\r\n", "over the"),
    (b"HTTP/1.1 200 OK\r\nContent-Encoding: br\r\nContent-Length: 1\r\n\r\nx", "unsupported content-encoding"),
    (b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: 4\r\n\r\nnope", "malformed gzip"),
    (b"HTTP/1.1 200 OK\r\nX: " + b"y" * MAX_HEAD, "response head over"),
    (b"HTTP/1.1 100 Continue\r\n\r\n" * 3000, "interim"),
])
async def test_broken_responses_are_clear_errors(raw: bytes, error: str) -> None:
    async def answer(head: bytes, w: asyncio.StreamWriter) -> bool:
        w.write(raw)
        await w.drain()
        await asyncio.sleep(0.2)
        return False

    async with RawServer(answer) as srv:
        client = MetricsClient()
        with pytest.raises(HttpError, match=error):
            await get(client, srv.port)
        await client.close()


async def test_a_response_cut_short_is_a_connection_error() -> None:
    async def cut(head: bytes, w: asyncio.StreamWriter) -> bool:
        w.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly this")
        await w.drain()
        return False

    async with RawServer(cut) as srv:
        client = MetricsClient()
        with pytest.raises((HttpError, ConnectionError), match="closed"):
            await get(client, srv.port)
        await client.close()


async def test_a_dead_port_is_an_oserror_and_a_status_is_reported_as_is() -> None:
    client = MetricsClient()
    async with RawServer(fixed(b"gone", status=b"503 Service Unavailable")) as srv:
        resp = await client.get("127.0.0.1", srv.port, "/metrics", authority="x", timeout=2.0)
        assert (resp.status, resp.body) == (503, b"gone")
        port = srv.port
    await client.close()
    fresh = MetricsClient()  # no idle connection to the old server: a new one is refused
    with pytest.raises(OSError):
        await fresh.get("127.0.0.1", port, "/metrics", authority="x", timeout=2.0)
    await fresh.close()


async def test_https_with_and_without_verification(tmp_path) -> None:
    from tests.support.upstream import make_certs

    certs = make_certs(tmp_path, ["127.0.0.1"], self_signed=True)
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_ctx.load_cert_chain(certs["server.crt"], certs["server.key"])
    app = web.Application()

    async def metrics(request: web.Request) -> web.Response:
        return web.Response(body=PAGE, content_type="text/plain")

    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=server_ctx)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    client = MetricsClient()
    try:
        assert await get(client, port, ssl=insecure_context()) == PAGE
        with pytest.raises(ssl.SSLError):  # a self-signed certificate is refused when verified
            await get(client, port, ssl=ssl.create_default_context())
    finally:
        await client.close()
        await runner.cleanup()


async def test_interim_responses_are_skipped_and_a_chunked_body_may_come_a_byte_at_a_time() -> None:
    page = PAGE[:3000]
    raw = (b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
           + b"".join(f"{len(page[i:i + 97]):x}\r\n".encode() + page[i:i + 97] + b"\r\n" for i in range(0, 3000, 97))
           + b"0\r\n\r\n")

    async def trickle(head: bytes, w: asyncio.StreamWriter) -> bool:
        for i in range(len(raw)):
            w.write(raw[i:i + 1])
            await w.drain()
        return True

    async with RawServer(trickle) as srv:
        client = MetricsClient()
        assert await get(client, srv.port, timeout=20.0) == page
        await client.close()


def redirecting(location_for: Callable[[bytes], bytes | None]) -> Answer:
    """307 to `location_for(path)` when it names one, else the page."""
    async def answer(head: bytes, w: asyncio.StreamWriter) -> bool:
        path = head.split(b" ", 2)[1]
        loc = location_for(path)
        if loc is None:
            return await fixed(PAGE)(head, w)
        w.write(b"HTTP/1.1 307 Temporary Redirect\r\nLocation: " + loc + b"\r\nContent-Length: 0\r\n\r\n")
        await w.drain()
        return True
    return answer


async def test_a_redirect_on_the_same_endpoint_is_followed() -> None:
    """A page mounted at /metrics/ (Starlette answers /metrics with a 307), by path or by URL."""
    async with RawServer(redirecting(lambda p: b"/metrics/" if p == b"/metrics" else None)) as srv:
        client = MetricsClient()
        assert await get(client, srv.port) == PAGE
        await client.close()
    assert [r.split(b" ", 2)[1] for r in srv.requests] == [b"/metrics", b"/metrics/"]
    absolute: list[int] = []
    async with RawServer(redirecting(
            lambda p: f"http://127.0.0.1:{absolute[0]}/m2".encode() if p == b"/metrics" else None)) as srv:
        absolute.append(srv.port)
        client = MetricsClient()
        assert await get(client, srv.port) == PAGE
        await client.close()


@pytest.mark.parametrize(("location", "error"), [
    (b"http://169.254.169.254/latest/meta-data", "redirect away from the endpoint"),
    (b"//evil.example/metrics", "redirect away from the endpoint"),
    (b"/metrics", "more than 3 redirects"),
])
async def test_redirects_away_or_in_a_loop_are_errors(location: bytes, error: str) -> None:
    async with RawServer(redirecting(lambda p: location)) as srv:
        client = MetricsClient()
        with pytest.raises(HttpError, match=error):
            await get(client, srv.port)
        await client.close()
