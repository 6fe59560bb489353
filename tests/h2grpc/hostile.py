"""Hostile HTTP/2 clients against a real `epp serve`, and the four criteria every attack is judged by.

- The attacker's side (connections, frames, the persistent loop) is attacker.py.
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
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import grpc
import pytest
import yaml
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc

from epp.stack.ports import free_port
from tests.h2grpc.attacker import FD, MB, Raw
from tests.support.extproc import CHAT, body_msg, headers_msg

ROOT = Path(__file__).resolve().parents[2]
CLK_TCK = os.sysconf("SC_CLK_TCK")

ROUTE_WITHIN = 2.0  # s: a fresh client's pick
MAX_RSS_GROWTH_MB = 100
CPU_FALLBACK = 0.5  # cores
CPU_FALLBACK_WITHIN = 5.0  # s
ATTACK_SECONDS = 0.6  # how long each flood goes on

# The suite's limits: tight timeouts, so that attacks show their effect quickly; the rest are the defaults.
SUITE_FLAGS = ("--grpc-handshake-timeout", "1s", "--grpc-idle-timeout", "0.5s", "--grpc-max-connection-age", "0",
               "--grpc-max-message-bytes", str(40 * MB), "--grpc-max-connection-buffer-bytes", str(16 * MB),
               "--grpc-max-server-buffer-bytes", str(48 * MB), "--grpc-max-connections", "64")


def transports(grpcio_fails: str | None = None, *, grpcio_may_fail: str | None = None) -> pytest.MarkDecorator:
    """Both transports. `grpcio_fails`: grpcio fails this attack every time (strict xfail); `grpcio_may_fail`: its
    figures straddle a criterion from run to run (xfail, not strict: either outcome is the expected one)."""
    grpcio: object = "grpcio"
    if grpcio_fails:
        grpcio = pytest.param("grpcio", marks=pytest.mark.xfail(reason=grpcio_fails, strict=True))
    elif grpcio_may_fail:
        grpcio = pytest.param("grpcio", marks=pytest.mark.xfail(reason=grpcio_may_fail, strict=False))
    return pytest.mark.parametrize("transport", ["h2", grpcio])


def goaway_on_h2(target: Target, send: Callable[[Raw], object], code: int, what: str = "") -> None:
    """On the h2 transport, what `send` does to a fresh connection is answered with GOAWAY `code`."""
    if target.transport != "h2" or target.baseline:
        return
    conn = Raw(target.port)
    try:
        send(conn)
        got = conn.goaway()
        assert got == code, f"{what}: GOAWAY {got}, expected {code}"
    finally:
        conn.close()


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
        cmd = [sys.executable, "-m", "epp.cmd.cli", "serve", "--secure-serving=false", "--grpc-host", "127.0.0.1", "--grpc-port", str(self.port),
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
