"""TLS for the ext_proc server (`--secure-serving`, on by default as in GIE; `--cert-path`; `--enable-cert-reload`).

Gateways (Envoy Gateway, agentgateway, Istio) talk TLS to the EPP without verifying it, so when no certificate is
mounted the EPP serves a freshly generated self-signed one. With a cert path, `tls.crt` and `tls.key` are loaded
from that directory (the layout of a Kubernetes TLS Secret). With `--enable-cert-reload` a CertReloader watches the
two files and new connections get the new pair once both are in place and match (a rotated Secret); a pair that
does not load (half written, key and certificate not matching) is logged and the old one kept.

The certificate is generated with the `cryptography` package when it is importable, otherwise with the openssl CLI.
"""

from __future__ import annotations

import asyncio
import datetime
import hashlib
import ipaddress
import logging
import os
import shutil
import ssl
import subprocess
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

import grpc

log = logging.getLogger(__name__)

DEFAULT_HOSTS: tuple[str, ...] = ("localhost", "127.0.0.1", "::1")
CERT_FILE, KEY_FILE = "tls.crt", "tls.key"


def load_cert_dir(cert_path: str | os.PathLike[str]) -> tuple[bytes, bytes]:
    """(key_pem, cert_pem) from `<dir>/tls.key` and `<dir>/tls.crt`."""
    d = Path(cert_path)
    key, crt = d / KEY_FILE, d / CERT_FILE
    missing = [str(p) for p in (crt, key) if not p.is_file()]
    if missing:
        raise FileNotFoundError(
            f"--cert-path {d}: missing {', '.join(missing)}; mount a TLS secret with tls.crt and tls.key there, "
            "or omit --cert-path to serve a self-signed certificate"
        )
    return key.read_bytes(), crt.read_bytes()


def _generate_with_cryptography(hosts: Sequence[str], days: int) -> tuple[bytes, bytes]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0] if hosts else "pointsman")])
    sans: list[x509.GeneralName] = []
    for h in hosts:
        try:
            sans.append(x509.IPAddress(ipaddress.ip_address(h)))
        except ValueError:
            sans.append(x509.DNSName(h))
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    return key_pem, cert.public_bytes(serialization.Encoding.PEM)


def _generate_with_openssl(hosts: Sequence[str], days: int) -> tuple[bytes, bytes]:
    openssl = shutil.which("openssl")
    if openssl is None:
        raise RuntimeError("cannot generate a self-signed certificate: neither `cryptography` nor openssl is available")
    san = ",".join(
        (f"IP:{h}" if _is_ip(h) else f"DNS:{h}") for h in hosts
    )
    with tempfile.TemporaryDirectory() as tmp:
        key, crt = Path(tmp) / KEY_FILE, Path(tmp) / CERT_FILE
        subprocess.run(
            [openssl, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
             "-keyout", str(key), "-out", str(crt), "-days", str(days),
             "-subj", f"/CN={hosts[0] if hosts else 'pointsman'}", "-addext", f"subjectAltName={san}"],
            check=True, capture_output=True,
        )
        return key.read_bytes(), crt.read_bytes()


def _is_ip(h: str) -> bool:
    try:
        ipaddress.ip_address(h)
    except ValueError:
        return False
    return True


def self_signed_cert(hosts: Sequence[str] = DEFAULT_HOSTS, days: int = 365) -> tuple[bytes, bytes]:
    """A fresh (key_pem, cert_pem) pair for `hosts` (DNS names and IPs in the SAN)."""
    try:
        import cryptography  # noqa: F401
    except ImportError:
        return _generate_with_openssl(hosts, days)
    return _generate_with_cryptography(hosts, days)


def serving_cert(cert_path: str | None, hosts: Sequence[str] = DEFAULT_HOSTS) -> tuple[bytes, bytes]:
    """(key_pem, cert_pem): the mounted cert if `cert_path` is set, else a fresh self-signed one."""
    if cert_path:
        key, crt = load_cert_dir(cert_path)
        log.info("TLS: serving the certificate from %s", cert_path)
    else:
        extra = [os.environ.get("POD_IP", ""), os.environ.get("HOSTNAME", "")]
        key, crt = self_signed_cert([*hosts, *(h for h in extra if h and h not in hosts)])
        log.info("TLS: no --cert-path; serving a self-signed certificate")
    return key, crt


def server_credentials(cert_path: str | None, hosts: Sequence[str] = DEFAULT_HOSTS) -> grpc.ServerCredentials:
    """Credentials for a grpc.aio server's `add_secure_port` (see `serving_cert`)."""
    return grpc.ssl_server_credentials([serving_cert(cert_path, hosts)])


def server_ssl_context(cert_path: str | None, hosts: Sequence[str] = DEFAULT_HOSTS) -> ssl.SSLContext:
    """An SSLContext (ALPN h2) for the h2 transport's `add_secure_port` (see `serving_cert`)."""
    from epp.h2grpc.server import server_ssl_context as context

    return context(*serving_cert(cert_path, hosts))


def load_pem_pair(ctx: ssl.SSLContext, key_pem: bytes, cert_pem: bytes) -> None:
    """Load a (key, cert) PEM pair into `ctx` (new handshakes use it); ssl.SSLError when they do not match."""
    with tempfile.TemporaryDirectory() as tmp:  # load_cert_chain reads files only
        cert, key = os.path.join(tmp, CERT_FILE), os.path.join(tmp, KEY_FILE)
        Path(cert).write_bytes(cert_pem)
        fd = os.open(key, os.O_WRONLY | os.O_CREAT, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(key_pem)
        ctx.load_cert_chain(cert, key)


def check_pair(key_pem: bytes, cert_pem: bytes) -> None:
    """ssl.SSLError unless the key and the certificate load and match."""
    load_pem_pair(ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER), key_pem, cert_pem)


class CertReloader:
    """Watches `<cert_path>/tls.crt` and `tls.key` (following the symlinks a mounted Secret uses) and hands a new,
    matching pair to `apply`. `version` counts the pairs applied after the first."""

    def __init__(self, cert_path: str, apply: Callable[[bytes, bytes], None], interval: float = 1.0) -> None:
        self.dir = Path(cert_path)
        self.apply = apply
        self.interval = interval
        self.version = 0
        self.pair = load_cert_dir(cert_path)
        self._seen = self.fingerprint()
        self._task: asyncio.Task[None] | None = None

    def fingerprint(self) -> tuple[bytes, ...]:
        """The two files' contents, hashed (a rewrite within one mtime tick, same size and inode, still shows)."""
        out = []
        for name in (CERT_FILE, KEY_FILE):
            try:
                out.append(hashlib.sha256((self.dir / name).read_bytes()).digest())
            except OSError:
                out.append(b"")
        return tuple(out)

    def poll(self) -> bool:
        """Reload if the files changed since the last look; True when a new pair was applied."""
        seen = self.fingerprint()
        if seen == self._seen:
            return False
        self._seen = seen
        try:
            key, crt = load_cert_dir(self.dir)
            check_pair(key, crt)
        except (OSError, ssl.SSLError) as e:
            log.warning("TLS: %s changed but does not load (%s); still serving the previous certificate",
                        self.dir, e)
            return False
        if (key, crt) == self.pair:
            return False
        self.pair = (key, crt)
        self.apply(key, crt)
        self.version += 1
        log.info("TLS: reloaded the certificate from %s", self.dir)
        return True

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="cert-reload")

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            self.poll()

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None


def reloading_credentials(reloader: CertReloader) -> grpc.ServerCredentials:
    """grpc.aio server credentials that pick up the reloader's newest pair at the next handshake."""
    applied = [reloader.version]

    def fetch() -> grpc.ServerCertificateConfiguration | None:
        if reloader.version == applied[0]:
            return None
        applied[0] = reloader.version
        return grpc.ssl_server_certificate_configuration([reloader.pair])

    initial = grpc.ssl_server_certificate_configuration([reloader.pair])
    return grpc.dynamic_ssl_server_credentials(initial, fetch)



def peer_certificate(host: str, port: int, timeout: float = 2.0) -> bytes | None:
    """The PEM certificate a TLS server at host:port presents (not verified), or None when it does not speak TLS
    (a plaintext HTTP/2 port answers the ClientHello with garbage or closes)."""
    import socket

    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    ctx.set_alpn_protocols(["h2"])
    try:
        with socket.create_connection((host, port), timeout=timeout) as raw, \
                ctx.wrap_socket(raw, server_hostname=host) as tls:
            der = tls.getpeercert(binary_form=True)
    except (ssl.SSLError, OSError):
        return None
    return ssl.DER_cert_to_PEM_cert(der).encode() if der else None


def certificate_name(cert_pem: bytes) -> str:
    """A name the certificate is for (its first DNS SAN, else its CN; "localhost" when it names none): what a
    client that trusts exactly this certificate tells gRPC to expect."""
    try:
        from cryptography import x509
        from cryptography.x509.oid import NameOID
    except ImportError:
        return "localhost"
    cert = x509.load_pem_x509_certificate(cert_pem)
    try:
        names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        dns = names.get_values_for_type(x509.DNSName)
        if dns:
            return str(dns[0])
    except x509.ExtensionNotFound:
        pass
    cn = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    return str(cn[0].value) if cn else "localhost"
