"""HTTPS upstreams for the provider tests: a CA the test creates, certificates it signs (or self-signed ones), and
an aiohttp echo server that reports what it received (path, headers, model) and answers in the provider's shape."""

from __future__ import annotations

import datetime
import ipaddress
import ssl
from pathlib import Path

import orjson
from aiohttp import web
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _sans(hosts: list[str]) -> x509.SubjectAlternativeName:
    out: list[x509.GeneralName] = []
    for h in hosts:
        try:
            out.append(x509.IPAddress(ipaddress.ip_address(h)))
        except ValueError:
            out.append(x509.DNSName(h))
    return x509.SubjectAlternativeName(out)


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def make_certs(directory: Path, hosts: list[str], *, self_signed: bool = False) -> dict[str, Path]:
    """A CA and a server certificate it signs for `hosts` (or, self_signed, a certificate nobody vouches for).
    Returns the paths of ca.crt (absent when self-signed), server.crt and server.key."""
    directory.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.timezone.utc)
    server_key = ec.generate_private_key(ec.SECP256R1())
    paths = {"server.crt": directory / "server.crt", "server.key": directory / "server.key"}
    builder = (x509.CertificateBuilder().subject_name(_name(hosts[0])).public_key(server_key.public_key())
               .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
               .not_valid_after(now + datetime.timedelta(days=2)).add_extension(_sans(hosts), critical=False))
    if self_signed:
        cert = builder.issuer_name(_name(hosts[0])).sign(server_key, hashes.SHA256())
    else:
        ca_key = ec.generate_private_key(ec.SECP256R1())
        ca = (x509.CertificateBuilder().subject_name(_name("pointsman test CA")).issuer_name(_name("pointsman test CA"))
              .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
              .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=2))
              .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
              .sign(ca_key, hashes.SHA256()))
        paths["ca.crt"] = directory / "ca.crt"
        paths["ca.crt"].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
        cert = builder.issuer_name(ca.subject).sign(ca_key, hashes.SHA256())
    paths["server.crt"].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    paths["server.key"].write_bytes(_pem_key(server_key))
    return paths


class EchoUpstream:
    """An HTTPS (or HTTP) server that records every request and echoes it: {"model", "path", "headers", ...}.
    GET /metrics answers idle load gauges and is not recorded."""

    def __init__(self, port: int, certs: dict[str, Path] | None = None, status: int = 200,
                 first: list[int] | None = None) -> None:
        self.port = port
        self.certs = certs
        self.status = status
        self.first = list(first or ())  # statuses of the first requests, in order; then `status`
        self.requests: list[dict] = []
        self.runner: web.AppRunner | None = None

    async def _metrics(self, request: web.Request) -> web.Response:
        """Load gauges a scraper reads (vLLM and SGLang names), so model-server endpoints scrape cleanly."""
        text = "".join(f"{name} 0\n" for name in ("vllm:num_requests_waiting", "vllm:num_requests_running",
                                                  "vllm:kv_cache_usage_perc", "sglang:num_queue_reqs",
                                                  "sglang:num_running_reqs", "sglang:token_usage"))
        return web.Response(text=text, content_type="text/plain")

    async def _handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        try:
            parsed = orjson.loads(body) if body else {}
        except orjson.JSONDecodeError:
            parsed = {}
        info = {"path": request.path_qs, "host": request.host, "model": parsed.get("model"), "port": self.port,
                "headers": {k.lower(): v for k, v in request.headers.items()}, "body": parsed}
        self.requests.append(info)
        status = self.first.pop(0) if self.first else self.status
        return web.Response(status=status, body=orjson.dumps(info), content_type="application/json",
                            headers={"x-served-by": str(self.port)})

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/metrics", self._metrics)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        ctx = None
        if self.certs is not None:
            ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            ctx.load_cert_chain(self.certs["server.crt"], self.certs["server.key"])
        await web.TCPSite(self.runner, "127.0.0.1", self.port, ssl_context=ctx).start()

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()
