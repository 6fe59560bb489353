"""`--enable-cert-reload`: when the pair in --cert-path changes (a rotated Secret), new TLS handshakes on the ext_proc
port get the new certificate, on both gRPC transports; a pair that does not load is not applied."""

from __future__ import annotations

import asyncio
import os
import ssl
from pathlib import Path

import pytest

from epp.cmd.app import App
from epp.h2grpc.tls import CERT_FILE, KEY_FILE, CertReloader, self_signed_cert
from tests.support.envoy import free_port
from tests.support.stack import serve_args
from tests.support.wait import until


def write_pair(d: Path, key: bytes, crt: bytes) -> None:
    """As the kubelet updates a Secret volume: whole files swapped in (key first, so a reader may see a mismatch)."""
    for name, data in ((KEY_FILE, key), (CERT_FILE, crt)):
        tmp = d / f".{name}.tmp"
        tmp.write_bytes(data)
        os.replace(tmp, d / name)


def presented(port: int) -> bytes:
    pem = ssl.get_server_certificate(("127.0.0.1", port))
    return ssl.PEM_cert_to_DER_cert(pem)


def der(crt: bytes) -> bytes:
    return ssl.PEM_cert_to_DER_cert(crt.decode())


@pytest.mark.parametrize("transport", ["h2", "grpcio"])
async def test_a_rotated_pair_is_served_to_new_connections(tmp_path, transport):
    certs = tmp_path / "tls"
    certs.mkdir()
    first, second = self_signed_cert(), self_signed_cert()
    write_pair(certs, *first)
    eps = tmp_path / "eps.yaml"
    eps.write_text("pools:\n- name: p\n  endpoints:\n  - {address: 127.0.0.1, port: 9}\n")
    port = free_port()
    app = App(serve_args("--secure-serving=true", "--cert-path", str(certs), "--enable-cert-reload",
                         "--grpc-transport", transport, "--grpc-port", str(port), "--endpoints-file", str(eps)))
    await app.start()
    try:
        assert await asyncio.to_thread(presented, port) == der(first[1])
        write_pair(certs, *second)
        await until(_serves(port, der(second[1])), 10, "the rotated certificate on new connections")
    finally:
        await app.stop(0)


def _serves(port: int, want: bytes):
    async def check() -> bool:
        return await asyncio.to_thread(presented, port) == want
    return check


def test_a_pair_that_does_not_match_is_not_applied(tmp_path):
    certs = tmp_path / "tls"
    certs.mkdir()
    first, second = self_signed_cert(), self_signed_cert()
    write_pair(certs, *first)
    applied: list[bytes] = []
    reloader = CertReloader(str(certs), lambda key, crt: applied.append(crt))
    assert not reloader.poll()  # nothing changed
    (certs / KEY_FILE).write_bytes(second[0])  # half a rotation: the new key, the old certificate
    assert not reloader.poll() and applied == [] and reloader.pair == first
    (certs / CERT_FILE).write_bytes(second[1])
    assert reloader.poll() and applied == [second[1]] and reloader.version == 1
    (certs / CERT_FILE).write_bytes(b"not a certificate")
    assert not reloader.poll() and reloader.pair == second


def test_cert_reload_needs_a_cert_path():
    with pytest.raises(ValueError, match="--enable-cert-reload"):
        serve_args("--secure-serving=true", "--enable-cert-reload", "--endpoints-file", "x")
