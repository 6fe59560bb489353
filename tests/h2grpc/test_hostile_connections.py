"""Hostile clients, part 3: connections: no or a slow preface, idle, churn, the connection cap.

The hostile-client suite: one test per HTTP/2 denial-of-service class, against a real `epp serve` on each
transport (`--grpc-transport h2`, the default, and `grpcio`).

Every test runs its attack for about half a second, as a persistent attacker would (a new connection whenever the server
closes one), and asserts the four criteria (hostile.judge): the server is alive, a fresh client is routed within
2 s, its RSS grows by at most 100 MB, and its CPU falls back under half a core. Where a class has a defence of its
own (a GOAWAY with a given code, a connection closed by a timeout) that is asserted too, on the h2 transport.
grpcio is marked where its options cannot bound it (strict xfail, with the reason).
"""

from __future__ import annotations

import time

from tests.h2grpc.attacker import (
    Raw,
    closed_within,
    request_bytes,
)
from tests.h2grpc.hostile import judge, transports

ENHANCE_YOUR_CALM, PROTOCOL_ERROR, FRAME_SIZE_ERROR, FLOW_CONTROL_ERROR = 0xB, 0x1, 0x6, 0x3


@transports()
def test_slowloris(target):
    """40 connections: half never send a byte, half dribble the preface, a byte every 50 ms (the suite's handshake
    timeout is 0.5 s: it runs out mid-preface)."""
    closed: list[int] = []

    def attack(port: int) -> list[Raw]:
        silent = [Raw(port, preface=False) for _ in range(20)]
        dribble = [Raw(port, preface=False) for _ in range(20)]
        for i in range(16):  # the attacker's pace
            for c in dribble:
                c.send(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"[i: i + 1])
            time.sleep(0.05)
        closed.append(closed_within(silent + dribble, 2.0))
        return silent + dribble

    judge(target, "slowloris (no or a slow preface)", attack).check()
    assert closed[0] == 40, f"only {closed[0]} of 40 connections were closed by the handshake timeout"


@transports()
def test_idle_connections(target):
    closed: list[int] = []
    elapsed: list[float] = []

    def attack(port: int) -> list[Raw]:
        conns = [Raw(port) for _ in range(30)]
        t0 = time.monotonic()
        closed.append(closed_within(conns, 2.5))  # the suite's idle timeout is 0.5 s
        elapsed.append(time.monotonic() - t0)
        return conns

    judge(target, "idle connections", attack).check()
    assert closed[0] == 30, f"only {closed[0]} of 30 idle connections were closed"
    assert elapsed[0] >= 0.4, "closed before the idle timeout"


@transports(grpcio_may_fail="after the 500 connections grpc took from 0.05 s to over 2 s to route the next client "
                             "(on a loaded machine)")
def test_connection_churn(target):
    """500 connections, one after the other, each with one request, closed at once. (A count, not a time: a
    client opening connections as fast as it can is a request flood, which only capacity answers.)"""
    request = request_bytes()

    def attack(port: int) -> list[Raw]:
        for _ in range(500):
            conn = Raw(port)
            sid = conn.next_sid()
            conn.send(conn.headers(sid) + Raw.data(sid, request, end=True))
            conn.close()
        return []

    judge(target, "connection churn (500 connections)", attack).check()


@transports(grpcio_fails="grpc refuses connections beyond grpc.max_allowed_incoming_connections instead of "
                         "closing idle ones, so idle connections held by one client lock the others out")
def test_connection_cap(target):
    """200 idle connections against a cap of 64: the server must stay at the cap and still take a new client."""
    still_open: list[int] = []

    def attack(port: int) -> list[Raw]:
        conns = [Raw(port) for _ in range(200)]
        still_open.append(200 - closed_within(conns, 2.0, enough=200 - 64))
        return conns

    judge(target, "connection cap (200 idle against 64)", attack).check()
    assert still_open[0] <= 64, f"{still_open[0]} connections open, over the cap of 64"
