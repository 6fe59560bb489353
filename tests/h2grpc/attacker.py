"""The attacker's side of the hostile-client suite: raw HTTP/2 connections, frames built with hyperframe or by hand
(when they must be malformed), header blocks with hpack, and the persistent attacker's loop."""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
import time
from collections.abc import Callable

import hpack
from hyperframe.frame import DataFrame, SettingsFrame

from epp.protocol import BodyMode
from tests.support.extproc import CHAT, body_msg, headers_msg

PROCESS = "/envoy.service.ext_proc.v3.ExternalProcessor/Process"
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
GRPC_HEADERS = [(":method", "POST"), (":scheme", "http"), (":path", PROCESS), (":authority", "epp"),
                ("content-type", "application/grpc"), ("te", "trailers")]
FD = BodyMode.FULL_DUPLEX_STREAMED
MB = 1 << 20


def grpc_message(message: bytes, compressed: bool = False) -> bytes:
    return struct.pack(">BI", int(compressed), len(message)) + message


def request_bytes(body: bytes = CHAT) -> bytes:
    """The two ext_proc messages of a request (headers, then the whole body), as one gRPC stream body."""
    return grpc_message(headers_msg(mode=FD).SerializeToString()) + grpc_message(body_msg(body, True)
                                                                                 .SerializeToString())


# ---- the attacker ----------------------------------------------------------------------------------------------------
class Raw:
    """One raw HTTP/2 client connection. Sends never raise: a connection the server closed just stops taking data."""

    def __init__(self, port: int, *, preface: bool = True, settings: dict[int, int] | None = None,
                 rcvbuf: int | None = None, timeout: float = 1.0) -> None:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if rcvbuf:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        sock.settimeout(timeout)
        sock.connect(("127.0.0.1", port))
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock = sock
        self.encoder = hpack.Encoder()
        self.closed = False
        self.blocked = False  # a send timed out: the server stopped reading us
        self._sid = -1
        self._reader: threading.Thread | None = None
        self._lock = threading.Lock()  # sends from the test and from a reader thread (SETTINGS ACK)
        self.received = 0
        if preface:
            frame = SettingsFrame(0)
            frame.settings = settings or {}
            self.send(PREFACE + frame.serialize())

    def send(self, data: bytes) -> bool:
        if self.closed or self.blocked:
            return False
        try:
            with self._lock:
                self.sock.sendall(data)
            return True
        except TimeoutError:
            self.blocked = True
        except OSError:
            self.closed = True
        return False

    def next_sid(self) -> int:
        self._sid += 2
        return self._sid

    def headers(self, sid: int, *, end: bool = False, fields: list[tuple[str, str]] | None = None) -> bytes:
        """HEADERS (END_HEADERS) on any stream id, also one a client may not use."""
        return frame(1, 0x4 | (0x1 if end else 0), sid, self.encoder.encode(fields or GRPC_HEADERS))

    @staticmethod
    def data(sid: int, payload: bytes, end: bool = False) -> bytes:
        frame = DataFrame(sid)
        frame.data = payload
        if end:
            frame.flags.add("END_STREAM")
        return frame.serialize()

    def request(self, body: bytes | None = None, end: bool = True) -> tuple[int, bytes]:
        sid = self.next_sid()
        return sid, self.headers(sid) + self.data(sid, request_bytes() if body is None else body, end)

    def read_in_background(self) -> Raw:
        """Read and drop what the server sends, so that its writes never wait on us."""

        def run() -> None:
            while not self.closed:
                try:
                    chunk = self.sock.recv(1 << 16)
                except TimeoutError:
                    continue
                except OSError:
                    break
                if not chunk:
                    break
                self.received += len(chunk)
            self.closed = True

        self._reader = threading.Thread(target=run, daemon=True)
        self._reader.start()
        return self

    def frames(self, timeout: float, until: Callable[[bytes], bool] | None = None) -> list[tuple[int, int, int, bytes]]:
        """(type, flags, stream, payload) of what the server sends until it closes, `timeout` passes or `until` holds
        for the bytes received."""
        buf = b""
        end = time.monotonic() + timeout
        while time.monotonic() < end and not (until and until(buf)):
            self.sock.settimeout(max(0.01, end - time.monotonic()))
            try:
                chunk = self.sock.recv(1 << 16)
            except TimeoutError:
                break
            except OSError:
                chunk = b""
            if not chunk:
                self.closed = True
                break
            buf += chunk
        out, pos = [], 0
        while len(buf) - pos >= 9:
            hi, lo, ftype, flags, sid = struct.unpack_from(">HBBBI", buf, pos)
            length = hi << 8 | lo
            if pos + 9 + length > len(buf):
                break
            out.append((ftype, flags, sid & 0x7FFFFFFF, buf[pos + 9: pos + 9 + length]))
            pos += 9 + length
        return out

    def follow_windows(self, own: bool = True) -> Raw:
        """Read in the background, following the server's flow-control windows (what `send_within` needs) and
        collecting the first 64 KiB of DATA per stream. `own`: open the client's windows wide at the start."""
        self.cond = threading.Condition()
        self.conn_window, self.initial_window = 65535, 65535
        self.windows: dict[int, int] = {}
        self.replies: dict[int, bytes] = {}
        if own:
            self.send(frame(4, 0, 0, struct.pack(">HI", 4, (1 << 31) - 1))
                      + frame(8, 0, 0, struct.pack(">I", 1 << 30)))

        def run() -> None:
            buf = b""
            while not self.closed:
                try:
                    chunk = self.sock.recv(1 << 16)
                except TimeoutError:
                    continue
                except OSError:
                    break
                if not chunk:
                    break
                buf += chunk
                pos = 0
                while len(buf) - pos >= 9:
                    hi, lo, ftype, flags, sid = struct.unpack_from(">HBBBI", buf, pos)
                    length = hi << 8 | lo
                    if pos + 9 + length > len(buf):
                        break
                    self._apply(ftype, flags, sid, buf[pos + 9: pos + 9 + length])
                    pos += 9 + length
                buf = buf[pos:]
            self.closed = True
            with self.cond:
                self.cond.notify_all()

        self._reader = threading.Thread(target=run, daemon=True)
        self._reader.start()
        return self

    def _apply(self, ftype: int, flags: int, sid: int, payload: bytes) -> None:
        with self.cond:
            if ftype == 4 and not flags & 1:  # SETTINGS
                for pos in range(0, len(payload), 6):
                    key, value = struct.unpack_from(">HI", payload, pos)
                    if key == 4:
                        for s in self.windows:
                            self.windows[s] += value - self.initial_window
                        self.initial_window = value
                self.send(frame(4, 1, 0, b""))  # ACK: until then a server may hold us to the default window
            elif ftype == 8:  # WINDOW_UPDATE
                inc = int.from_bytes(payload, "big")
                if sid:
                    self.windows[sid] = self.windows.get(sid, self.initial_window) + inc
                else:
                    self.conn_window += inc
            elif ftype == 0 and len(self.replies.get(sid, b"")) < 65536:
                self.replies[sid] = self.replies.get(sid, b"") + payload
            self.cond.notify_all()

    def send_within(self, sid: int, data: bytes, *, end: bool = True, frame_size: int = 16384,
                    timeout: float = 10.0) -> bool:
        """DATA frames of at most `frame_size` bytes, never beyond the server's windows (waiting for them)."""
        deadline = time.monotonic() + timeout
        pos, batch = 0, []
        while pos < len(data):
            with self.cond:
                room = min(self.conn_window, self.windows.setdefault(sid, self.initial_window))
                if room > 0:
                    n = min(frame_size, len(data) - pos, room)
                    self.conn_window -= n
                    self.windows[sid] -= n
            if room <= 0:
                if batch and not self.send(b"".join(batch)):
                    return False
                batch = []
                with self.cond:
                    opened = self.cond.wait_for(
                        lambda: self.closed or min(self.conn_window, self.windows[sid]) > 0,
                        max(0.0, deadline - time.monotonic()))
                if not opened or self.closed:
                    return False
                continue
            batch.append(frame(0, 0, sid, data[pos: pos + n]))
            pos += n
            if len(batch) >= 512 and not self.send(b"".join(batch)):
                return False
            if len(batch) >= 512:
                batch = []
        if end:
            batch.append(frame(0, 1, sid, b""))
        return self.send(b"".join(batch)) if batch else True

    def goaway(self, timeout: float = 2.0) -> int | None:
        """The error code of the server's GOAWAY, if one comes before the connection ends or `timeout`."""
        for ftype, _, _, payload in self.frames(timeout):
            if ftype == 7:
                return int.from_bytes(payload[4:8], "big")
        return None

    def close(self) -> None:
        self.closed = True
        with contextlib.suppress(OSError):
            self.sock.close()


def frame(ftype: int, flags: int, sid: int, payload: bytes) -> bytes:
    """Any frame, also a malformed one: the 9-byte header says what it is told."""
    return struct.pack(">HBBBI", len(payload) >> 8, len(payload) & 0xFF, ftype, flags, sid) + payload


def persist(port: int, seconds: float, make: Callable[[int], Raw], step: Callable[[Raw], object],
            hold: int = 16) -> list[Raw]:
    """A persistent attacker: `step(conn)` again and again for `seconds`, on a new connection from `make` whenever
    the server closed the last one; one the server stopped reading is held open (up to `hold` of them)."""
    end = time.monotonic() + seconds
    held: list[Raw] = []
    conn: Raw | None = None
    while time.monotonic() < end:
        if conn is None or conn.closed or conn.blocked:
            if conn is not None and conn.blocked and len(held) < hold:
                held.append(conn)
            elif conn is not None:
                conn.close()
            try:
                conn = make(port)
            except OSError:
                conn = None
                time.sleep(0.01)
                continue
        step(conn)
    return held + ([conn] if conn is not None else [])


def open_streams(conn: Raw, n: int, batch: int = 500) -> list[int]:
    """`n` streams, each with the request headers message and left open (no END_STREAM)."""
    sids, frames = [], []
    for _ in range(n):
        sid = conn.next_sid()
        sids.append(sid)
        frames.append(conn.headers(sid) + Raw.data(sid, HEADERS_MSG))
        if len(frames) == batch:
            conn.send(b"".join(frames))
            frames = []
    if frames:
        conn.send(b"".join(frames))
    return sids


# ---- connections ---------------------------------------------------------------------------------------------------
def closed_within(conns: list[Raw], seconds: float, enough: int | None = None) -> int:
    """How many of `conns` the server has closed, waiting up to `seconds` for `enough` of them (default: all)."""
    end = time.monotonic() + seconds
    want = len(conns) if enough is None else enough
    while True:
        closed = sum(map(_closed_by_server, conns))
        if closed >= want or time.monotonic() > end:
            return closed
        time.sleep(0.02)


def _closed_by_server(conn: Raw) -> bool:
    conn.sock.settimeout(0.001)
    try:
        while conn.sock.recv(65536):
            pass
        return True
    except (TimeoutError, BlockingIOError):
        return False
    except OSError:
        return True


HEADERS_MSG = grpc_message(headers_msg(mode=FD).SerializeToString())
