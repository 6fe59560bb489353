"""Hostile HTTP/2 clients against a real `epp serve`, and the four criteria every attack is judged by.

- `Raw`: an attacker's connection: a raw socket, frames built with hyperframe (or by hand when they must be
  malformed), header blocks with hpack.
- `Target`: the server under attack, a real `epp serve` process on either transport (`--grpc-transport h2|grpcio`)
  with the suite's tight limits. `FRONTDOOR_BASELINE=/path/to/checkout` runs another checkout's server instead
  (PYTHONPATH, without the limit flags it may not know): that is how the figures for the code before are taken.
- `judge()`: runs an attack, then: a fresh gRPC client must route within 2 s (while the attacker's connections
  are still open), the server's CPU must fall back under half a core once they are closed, the process must be
  alive and route again, and its RSS may grow by at most 100 MB (sampled every few milliseconds throughout).
  `FRONTDOOR_REPORT=file.jsonl` appends each verdict's figures to that file.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import grpc
import hpack
import yaml
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc
from hyperframe.frame import DataFrame, SettingsFrame

from epp.ports import free_port
from epp.protocol import BodyMode
from tests.support.extproc import CHAT, body_msg, headers_msg

ROOT = Path(__file__).resolve().parents[2]
PROCESS = "/envoy.service.ext_proc.v3.ExternalProcessor/Process"
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
GRPC_HEADERS = [(":method", "POST"), (":scheme", "http"), (":path", PROCESS), (":authority", "epp"),
                ("content-type", "application/grpc"), ("te", "trailers")]
FD = BodyMode.FULL_DUPLEX_STREAMED
MB = 1 << 20
CLK_TCK = os.sysconf("SC_CLK_TCK")

ROUTE_WITHIN = 2.0  # s: a fresh client's pick
MAX_RSS_GROWTH_MB = 100
CPU_FALLBACK = 0.5  # cores
CPU_FALLBACK_WITHIN = 5.0  # s

# The suite's limits: tight timeouts, so that attacks show their effect quickly; the rest are the defaults.
SUITE_FLAGS = ("--grpc-handshake-timeout", "1s", "--grpc-idle-timeout", "0.5s", "--grpc-max-connection-age", "0",
               "--grpc-max-message-bytes", str(40 * MB), "--grpc-max-connection-buffer-bytes", str(16 * MB),
               "--grpc-max-server-buffer-bytes", str(48 * MB), "--grpc-max-connections", "64")


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


def for_a_while(seconds: float, step: Callable[[], bool]) -> int:
    """Call `step` until it returns False or `seconds` pass; how many times it ran."""
    end = time.monotonic() + seconds
    n = 0
    while time.monotonic() < end and step():
        n += 1
    return n


# ---- the server under attack -------------------------------------------------------------------------------------
def route_once(port: int, timeout: float = ROUTE_WITHIN) -> float | None:
    """A fresh gRPC client sends one request (Envoy's lean sequence); seconds until the pick, or None."""
    t0 = time.monotonic()
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = pb_grpc.ExternalProcessorStub(channel)
            replies = stub.Process(iter([headers_msg(mode=FD), body_msg(CHAT, True)]), timeout=timeout)
            for reply in replies:
                assert isinstance(reply, pb.ProcessingResponse)
                kind = reply.WhichOneof("response")
                if kind not in ("request_headers", "request_body"):
                    return None
                mutation = getattr(reply, kind).response.header_mutation.set_headers
                if any(o.header.key == "x-gateway-destination-endpoint" for o in mutation):
                    return time.monotonic() - t0
    except grpc.RpcError:
        return None
    return None


@dataclass
class Target:
    transport: str
    flags: tuple[str, ...] = SUITE_FLAGS
    baseline: str | None = field(default_factory=lambda: os.environ.get("FRONTDOOR_BASELINE") or None)
    port: int = 0
    proc: subprocess.Popen[bytes] | None = None
    dirty: bool = False  # a test failed on it: start afresh for the next one

    def start(self) -> Target:
        tmp = Path(tempfile.mkdtemp(prefix="frontdoor-"))
        eps = tmp / "endpoints.yaml"  # never scraped (1h): routing needs no live backend, and the server idles
        eps.write_text(yaml.safe_dump({"pools": [{"name": "pool", "endpoints": [
            {"address": "127.0.0.1", "port": p} for p in (9, 19)]}]}))
        self.port = free_port()
        env = dict(os.environ)
        flags = list(self.flags)
        if self.baseline:
            env["PYTHONPATH"] = self.baseline
            flags = _without_limit_flags(flags)
        cmd = [sys.executable, "-m", "epp.cli", "serve", "--grpc-host", "127.0.0.1", "--grpc-port", str(self.port),
               "--grpc-health-port", "0", "--metrics-port", "0", "--endpoints-file", str(eps),
               "--refresh-metrics-interval", "1h", "--metrics-staleness-threshold", "2h", "-v", "0",
               "--grpc-transport", self.transport, *flags]
        self.proc = subprocess.Popen(cmd, cwd=tmp, env=env, stdout=subprocess.DEVNULL,
                                     stderr=open(tmp / "epp.log", "wb"))  # noqa: SIM115
        end = time.monotonic() + 30
        while route_once(self.port, 1.0) is None:
            assert self.proc.poll() is None, f"epp serve exited: {(tmp / 'epp.log').read_text()[-2000:]}"
            assert time.monotonic() < end, "epp serve did not start routing"
            time.sleep(0.1)
        self.dirty = False
        return self

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def ready(self) -> Target:
        """Running and healthy (started afresh after a failed test)."""
        if self.proc is None or self.proc.poll() is not None or self.dirty:
            self.stop()
            self.start()
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def cpu(self) -> float:
        """CPU seconds of the server process, all threads."""
        with open(f"/proc/{self.pid}/stat") as f:
            parts = f.read().rsplit(")", 1)[1].split()
        return (int(parts[11]) + int(parts[12])) / CLK_TCK

    def rss(self) -> int:
        with open(f"/proc/{self.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        return 0

    def route(self, timeout: float = ROUTE_WITHIN) -> float | None:
        return route_once(self.port, timeout)


def _without_limit_flags(flags: list[str]) -> list[str]:
    out, skip = [], False
    for f in flags:
        if skip:
            skip = False
        elif f.startswith("--grpc-") and f != "--grpc-transport":
            skip = True
        else:
            out.append(f)
    return out


class _Peak(threading.Thread):
    """Samples the server's RSS every 5 ms; `peak` is the highest seen."""

    def __init__(self, target: Target) -> None:
        super().__init__(daemon=True)
        self.target = target
        self.peak = target.rss()
        self.stopped = threading.Event()

    def run(self) -> None:
        while not self.stopped.wait(0.005):
            with contextlib.suppress(OSError, AssertionError):
                self.peak = max(self.peak, self.target.rss())


@dataclass
class Verdict:
    attack: str
    transport: str
    cpu_s: float  # server CPU from the attack's start to the fresh client's pick
    rss_mb: float  # peak RSS growth
    route_s: float | None  # the fresh client's time to its pick (None: not within 2 s)
    fallback_s: float | None  # from closing the attacker to CPU under half a core (None: not within 5 s)
    alive: bool
    detail: str = ""

    @property
    def failures(self) -> list[str]:
        out = []
        if not self.alive:
            out.append("the server died or stopped routing")
        if self.route_s is None:
            out.append(f"a fresh client was not routed within {ROUTE_WITHIN:g} s")
        if self.rss_mb > MAX_RSS_GROWTH_MB:
            out.append(f"RSS grew by {self.rss_mb:.0f} MB")
        if self.fallback_s is None:
            out.append(f"CPU did not fall under {CPU_FALLBACK} core within {CPU_FALLBACK_WITHIN:g} s")
        return out

    def check(self) -> None:
        assert not self.failures, f"{self.attack} on {self.transport}: {'; '.join(self.failures)} ({self})"


def _cpu_fallback(target: Target) -> float | None:
    t0 = time.monotonic()
    while time.monotonic() - t0 < CPU_FALLBACK_WITHIN:
        if not target.alive():
            return None
        c0, w0 = target.cpu(), time.monotonic()
        time.sleep(0.2)
        if (target.cpu() - c0) / (time.monotonic() - w0) < CPU_FALLBACK:
            return time.monotonic() - t0
    return None


def judge(target: Target, attack: str, run: Callable[[int], Iterable[Raw] | None],
          detail: Callable[[], str] | None = None) -> Verdict:
    """Run `run(port)` (it returns the connections to hold open while a fresh client routes) and take the verdict;
    `detail()` adds what the attack saw of itself to it."""
    target.ready()
    sampler = _Peak(target)
    base = sampler.peak
    sampler.start()
    cpu0 = target.cpu()
    held = list(run(target.port) or [])
    route_s = target.route() if target.alive() else None
    cpu_s = target.cpu() - cpu0 if target.alive() else float("nan")
    for conn in held:
        conn.close()
    fallback_s = _cpu_fallback(target)
    alive = target.alive() and target.route() is not None
    sampler.stopped.set()
    sampler.join()
    verdict = Verdict(attack, f"{target.transport}{' (baseline)' if target.baseline else ''}", round(cpu_s, 2),
                      round((sampler.peak - base) / MB, 1), None if route_s is None else round(route_s, 3),
                      None if fallback_s is None else round(fallback_s, 2), alive, detail() if detail else "")
    if verdict.failures:
        target.dirty = True
    report = os.environ.get("FRONTDOOR_REPORT")
    if report:
        with open(report, "a") as f:
            f.write(json.dumps({**asdict(verdict), "failures": verdict.failures}) + "\n")
    return verdict
