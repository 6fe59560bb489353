"""Where a process's bus lives and who its peers are, from the flags (and the environment the Deployment sets)."""

from __future__ import annotations

import pytest

from tests.support.stack import serve_args


def settings(*flags: str):
    return serve_args("--endpoints-file", "x", *flags).replicas.bus


def test_no_bus_for_one_process_without_peers():
    assert settings() is None


def test_static_peers_with_an_address_and_a_port():
    s = settings("--bus-peers", "10.0.0.5:9004, 10.0.0.6:9004", "--bus-address", "10.0.0.5", "--bus-secret", "k")
    assert s.address == "10.0.0.5:9004" and s.bind == "tcp://10.0.0.5:9004"
    assert s.peers == ["10.0.0.5:9004", "10.0.0.6:9004"]  # its own address is skipped by the bus itself
    assert s.secret == b"k" and s.service is None
    s = settings("--bus-peers", "a:7000", "--bus-address", "pod-a.example:7000")
    assert s.address == "pod-a.example:7000" and s.bind == "tcp://*:7000"  # a name: bind every interface


def test_ipv6_addresses_keep_their_brackets():
    s = settings("--bus-peers", "[fd00::2]:9004", "--bus-address", "fd00::1")
    assert s.address == "[fd00::1]:9004" and s.bind == "tcp://[fd00::1]:9004"
    assert settings("--bus-peers", "x:1", "--bus-address", "[fd00::1]:9100").address == "[fd00::1]:9100"


def test_workers_of_replicas_listen_on_consecutive_ports():
    s = settings("--workers", "3", "--worker-index", "2", "--worker-dir", "/tmp/w", "--bus-peers",
                 "10.0.0.5:9004,10.0.0.6:9004", "--bus-address", "10.0.0.5")
    assert s.address == "10.0.0.5:9006"
    assert s.peers == sorted(f"10.0.0.{h}:{9004 + j}" for h in (5, 6) for j in range(3))


def test_workers_of_one_pod_share_over_ipc():
    s = settings("--workers", "2", "--worker-index", "1", "--worker-dir", "/run/pm")
    assert s.address == "ipc:///run/pm/bus-1" and s.peers == ["ipc:///run/pm/bus-0", "ipc:///run/pm/bus-1"]
    with pytest.raises(ValueError, match="supervisor"):
        settings("--workers", "2", "--worker-index", "0")  # a worker started by hand


def test_the_environment_configures_the_bus(monkeypatch, tmp_path):
    monkeypatch.setenv("POINTSMAN_BUS_SERVICE", "pointsman-bus")
    monkeypatch.setenv("POINTSMAN_BUS_PORT", "9100")
    monkeypatch.setenv("POD_IP", "10.1.2.3")
    monkeypatch.setenv("POINTSMAN_BUS_SECRET", "from-env")
    s = settings()
    assert (s.service, s.service_port, s.address, s.secret) == ("pointsman-bus", 9100, "10.1.2.3:9100", b"from-env")
    f = tmp_path / "secret"
    f.write_text("from-file\n")
    assert settings("--bus-secret-file", str(f)).secret == b"from-file"
    f.write_text("")
    with pytest.raises(ValueError, match="empty"):
        settings("--bus-secret-file", str(f))


@pytest.mark.parametrize("bad", ["10.0.0.5", "10.0.0.5:", "10.0.0.5:http", ":9004"])
def test_bad_peer_addresses_are_named(bad):
    with pytest.raises(ValueError, match="host:port"):
        settings("--bus-peers", bad)
