"""`epp kv-relay`'s flags and `epp serve --kv-events-url`: bad values are clear errors before anything starts; the
NATS target never shows credentials."""

from __future__ import annotations

import pytest

from epp.cmd.cli import build_parser, main
from epp.cmd.settings import ServeSettings
from epp.fleet.kvevents.settings import RelaySettings
from epp.fleet.kvevents.sources import KVEventsConfigError
from epp.natsconn import NatsConfigError, NatsTarget

GOOD = ["kv-relay", "--engine-events", "tcp://127.0.0.1:5557", "--endpoint", "10.0.0.5:8000", "--pool", "llama",
        "--nats-url", "nats://127.0.0.1:4222"]


def relay_settings(*extra: str) -> RelaySettings:
    return RelaySettings.from_args(build_parser(only="kv-relay").parse_args([*GOOD, *extra]))


def test_good_flags() -> None:
    s = relay_settings("--engine-replay", "tcp://127.0.0.1:5558", "--rank", "1", "--stream-max-age", "600")
    assert (s.engine_events, s.engine_replay, s.endpoint, s.pool, s.rank) == (
        "tcp://127.0.0.1:5557", "tcp://127.0.0.1:5558", "10.0.0.5:8000", "llama", 1)
    assert s.stream_max_age == 600 and s.duplicate_window == 120


@pytest.mark.parametrize(("extra", "message"), [
    (("--engine-replay", "127.0.0.1:5558"), "--engine-replay: expected tcp://host:port"),
    (("--nats-url", "http://x:1"), "--nats-url"),
    (("--stream-max-age", "0"), "--stream-max-age: expected a positive number"),
    (("--max-pending", "-1"), "--max-pending"),
    (("--rank", "-1"), "--rank"),
    (("--pool", "a pool"), "cannot name a NATS subject"),
    (("--stream-max-age", "60"), "--duplicate-window: must not exceed --stream-max-age"),
])
def test_bad_flags_name_the_flag(extra: tuple[str, ...], message: str) -> None:
    with pytest.raises(KVEventsConfigError, match=message):
        relay_settings(*extra)


def test_the_cli_reports_a_bad_flag(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*GOOD, "--engine-events", "udp://x:1"]) == 2
    assert "--engine-events: expected tcp://host:port" in capsys.readouterr().err


def test_serve_kv_events_url(tmp_path) -> None:
    eps = tmp_path / "endpoints.yaml"
    eps.write_text("pools:\n- name: p\n  endpoints:\n  - {address: 127.0.0.1, port: 1}\n")
    base = ["--endpoints-file", str(eps)]
    assert ServeSettings.from_argv([*base, "--kv-events-url", "nats://127.0.0.1:4222"]).kvevents.nats_url == \
        "nats://127.0.0.1:4222"
    with pytest.raises(KVEventsConfigError, match="--kv-events-url"):
        ServeSettings.from_argv([*base, "--kv-events-url", "127.0.0.1:4222"])


def test_nats_target_hides_credentials() -> None:
    t = NatsTarget.parse("nats://user:s3cret@10.0.0.1:4222, nats://10.0.0.2:4222")
    assert t.servers == ("nats://10.0.0.1:4222", "nats://10.0.0.2:4222")
    assert (t.user, t.password) == ("user", "s3cret")
    assert t.redacted() == "nats://10.0.0.1:4222,nats://10.0.0.2:4222 (user user, password)"
    assert "s3cret" not in t.redacted() and "s3cret" not in repr(t)
    with pytest.raises(NatsConfigError) as e:
        NatsTarget.parse("nats://user:s3cret@10.0.0.1:port")
    assert "bad port" in str(e.value) and "s3cret" not in str(e.value)
    with pytest.raises(NatsConfigError, match="needs both the certificate and its key"):
        NatsTarget.parse("tls://h:1", tls_cert="c.pem")
