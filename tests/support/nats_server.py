"""A real Debian nats-server for tests, and a TCP proxy in front of it that a test can cut.

`NatsServer().start()` runs nats-server on an OS-chosen loopback port with JetStream on (`-js -sd <tmp dir>`),
never daemonized, and waits until it accepts clients. It can be paused (SIGSTOP: connections stay open, nothing
is answered), resumed, killed and restarted on the same port (a broker restart), and stopped (its directory goes).
`scripts/bootstrap.sh --test-deps` installs Debian's nats-server when it is missing.

`TcpProxy(port)` forwards a loopback port to the server's: `cut()` closes every connection through it and refuses
new ones (a partition between one client and the broker), `heal()` accepts again.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time

from epp.stack import nats_binary
from tests.support.server_process import ServerProcess


class NatsServer(ServerProcess):
    what = "nats-server"

    def __init__(self, *args: str) -> None:
        super().__init__()
        self.args = args  # extra nats-server flags

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def command(self, port: int) -> list[str]:
        return [nats_binary(), "-a", "127.0.0.1", "-p", str(port), "-js", "-sd", os.path.join(self.dir, "js"),
                "-l", self.log_path, *self.args]

    def ready(self) -> None:
        """The port answers before JetStream has recovered its streams: wait for the log line that says it has."""
        deadline = time.monotonic() + 10
        while "Server is ready" not in self.log_tail(20_000):
            if time.monotonic() > deadline:
                raise RuntimeError("nats-server never said it was ready")
            time.sleep(0.02)

    def start(self, port: int | None = None) -> NatsServer:
        super().start(port)
        return self


class TcpProxy:
    """127.0.0.1:<port> -> 127.0.0.1:<target>, in the test's event loop."""

    def __init__(self, target: int) -> None:
        self.target = target
        self.port = 0
        self.open = True
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    async def start(self) -> TcpProxy:
        self._server = await asyncio.start_server(self._client, "127.0.0.1", self.port)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if not self.open:
            writer.close()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target)
        except OSError:
            writer.close()
            return
        self._writers |= {writer, up_writer}
        await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer))

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except (OSError, asyncio.CancelledError):
            pass
        finally:
            self._writers.discard(writer)
            with contextlib.suppress(Exception):
                writer.close()

    def cut(self) -> None:
        """Close every connection through the proxy and refuse new ones."""
        self.open = False
        for w in list(self._writers):
            w.close()
        self._writers.clear()

    def heal(self) -> None:
        self.open = True

    async def stop(self) -> None:
        self.cut()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
