"""Loopback port helpers: ports below the kernel's ephemeral range, never handed out twice in a row."""

from __future__ import annotations

import socket

from epp.stack.ports import free_port, free_port_block


def ephemeral_low() -> int:
    with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
        return int(f.read().split()[0])


def test_free_ports_are_distinct_bindable_and_outside_the_ephemeral_range():
    ports = [free_port() for _ in range(500)]
    assert len(set(ports)) == len(ports)
    assert max(ports) < ephemeral_low()  # a client socket can never be given one of them meanwhile
    with socket.socket() as s:  # free for a listener that sets no SO_REUSEADDR
        s.bind(("127.0.0.1", ports[-1]))


def test_a_block_does_not_overlap_ports_handed_out_before():
    single = {free_port() for _ in range(200)}
    base = free_port_block(50)
    assert not single & set(range(base, base + 50))


def test_a_long_run_of_single_ports_leaves_room_for_blocks():
    """The memory of handed-out ports is bounded: after thousands of ports a block of 50 is still found."""
    for _ in range(3000):
        free_port()
    base = free_port_block(50)
    assert 20000 <= base and base + 50 <= ephemeral_low()
