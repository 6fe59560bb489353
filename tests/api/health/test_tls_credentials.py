import shutil

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from epp.api.health import add_health_servicer
from epp.fleet.datastore import Datastore
from epp.h2grpc import tls


async def _serve_tls(creds):
    ds = Datastore()
    ds.synced = True
    server = grpc.aio.server()
    add_health_servicer(server, ds)
    port = server.add_secure_port("127.0.0.1:0", creds)
    await server.start()
    return server, port


async def _check_over_tls(port, root_pem):
    creds = grpc.ssl_channel_credentials(root_certificates=root_pem)
    async with grpc.aio.secure_channel(f"localhost:{port}", creds) as ch:
        stub = health_pb2_grpc.HealthStub(ch)
        return (await stub.Check(health_pb2.HealthCheckRequest(service="readiness"), timeout=5)).status


async def test_self_signed_cert_serves_tls_and_verifies_against_itself(monkeypatch):
    generated = []
    real = tls.self_signed_cert

    def capture(hosts=tls.DEFAULT_HOSTS, days=365):
        pair = real(hosts, days)
        generated.append(pair)
        return pair

    monkeypatch.setattr(tls, "self_signed_cert", capture)
    server, port = await _serve_tls(tls.server_credentials(None))
    try:
        key_pem, cert_pem = generated[0]
        assert b"BEGIN CERTIFICATE" in cert_pem and b"PRIVATE KEY" in key_pem
        assert await _check_over_tls(port, cert_pem) == health_pb2.HealthCheckResponse.SERVING
        # a plaintext client cannot talk to it
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
            with pytest.raises(grpc.aio.AioRpcError):
                await health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service=""), timeout=2)
    finally:
        await server.stop(None)


@pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl CLI not installed")
async def test_cert_dir_is_loaded(tmp_path):
    key, crt = tls._generate_with_openssl(["localhost", "127.0.0.1"], 2)  # also exercises the openssl fallback
    (tmp_path / "tls.key").write_bytes(key)
    (tmp_path / "tls.crt").write_bytes(crt)
    server, port = await _serve_tls(tls.server_credentials(str(tmp_path)))
    try:
        assert await _check_over_tls(port, crt) == health_pb2.HealthCheckResponse.SERVING
        # a different self-signed cert is not trusted for this server
        _, other = tls.self_signed_cert(["localhost"])
        with pytest.raises(grpc.aio.AioRpcError):
            await _check_over_tls(port, other)
    finally:
        await server.stop(None)


def test_missing_cert_files_say_what_to_do(tmp_path):
    with pytest.raises(FileNotFoundError, match="tls.crt"):
        tls.server_credentials(str(tmp_path))
