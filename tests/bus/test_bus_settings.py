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


def test_a_nats_url_puts_the_bus_on_nats_with_a_subject_per_pool():
    s = settings("--bus-url", "nats://alice:s3cret@10.0.0.9:4222,nats://10.0.0.10", "--bus-address", "10.0.0.5",
                 "--pool-name", "my pool", "--pool-namespace", "team-a")
    assert s.nats is not None and s.nats.servers == ("nats://10.0.0.9:4222", "nats://10.0.0.10:4222")
    assert s.nats.user == "alice" and s.nats.password == "s3cret"
    assert s.subject == "pointsman.bus.team-a.my_pool" and s.address == "10.0.0.5:9004" and s.peers == []
    assert "s3cret" not in repr(s) and "s3cret" not in s.nats.redacted()
    assert s.nats.redacted() == "nats://10.0.0.9:4222,nats://10.0.0.10:4222 (user alice, password)"
    assert settings("--bus-url", "nats://n:4222", "--bus-subject", "x.y", "--bus-address", "h").subject == "x.y"


def test_nats_credentials_and_tls_flags():
    s = settings("--bus-url", "tls://tok3n@n:4443", "--bus-nats-creds", "/etc/nats/u.creds",
                 "--bus-nats-ca", "/ca.pem", "--bus-address", "h")
    assert s.nats.token == "tok3n" and s.nats.creds == "/etc/nats/u.creds" and s.nats.tls_ca == "/ca.pem"
    assert s.nats.redacted() == "tls://n:4443 (token, creds file /etc/nats/u.creds, tls)"
    assert "tok3n" not in repr(s.nats)


@pytest.mark.parametrize("flags, message", [
    (("--bus-url", "http://n:4222"), "nats:// or tls://"),
    (("--bus-url", "nats://n:99999"), "bad port"),
    (("--bus-url", "nats://n:4222/path"), "expected nats://"),
    (("--bus-url", " , "), "a NATS URL is needed"),
    (("--bus-url", "nats://n", "--bus-nats-cert", "c.pem"), "both the certificate and its key"),
    (("--bus-url", "nats://n", "--bus-subject", "a.*"), "no wildcards"),
    (("--bus-url", "nats://n", "--bus-peers", "a:1"), "replaces --bus-peers"),
])
def test_bad_nats_flags_are_refused_clearly(flags, message):
    with pytest.raises(ValueError, match=message):
        settings("--bus-address", "h", *flags)
