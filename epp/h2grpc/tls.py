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
    """A name the certificate is for (its first DNS SAN, else its subject's CN; "localhost" when it names none or
    does not parse): what a client that trusts exactly this certificate tells gRPC to expect.

    Read from the DER with a few lines of ASN.1 (X.509's TBSCertificate layout, RFC 5280 4.1) rather than through
    the cryptography package, whose import alone costs `epp endpoints` a quarter of its start-up."""
    try:
        der = ssl.PEM_cert_to_DER_cert(cert_pem.decode("ascii"))
        return _der_name(der) or "localhost"
    except (ValueError, IndexError, UnicodeDecodeError):
        return "localhost"


_OID_SAN = bytes.fromhex("551d11")  # 2.5.29.17 subjectAltName
_OID_CN = bytes.fromhex("550403")  # 2.5.4.3 commonName


def _tlv(der: bytes, at: int) -> tuple[int, int, int]:
    """(tag, start of the value, end of the value) of the DER element at `at`."""
    tag, length = der[at], der[at + 1]
    at += 2
    if length & 0x80:
        n = length & 0x7F
        if not 0 < n <= 4:
            raise ValueError("unsupported DER length")
        length = int.from_bytes(der[at:at + n], "big")
        at += n
    if at + length > len(der):
        raise ValueError("truncated DER")
    return tag, at, at + length


def _children(der: bytes, start: int, end: int) -> list[tuple[int, int, int]]:
    out = []
    while start < end:
        tag, vs, ve = _tlv(der, start)
        out.append((tag, vs, ve))
        start = ve
    return out


def _der_name(der: bytes) -> str | None:
    _, cs, ce = _tlv(der, 0)  # Certificate ::= SEQUENCE { tbsCertificate, signatureAlgorithm, signature }
    _, ts, te = _tlv(der, cs)  # TBSCertificate ::= SEQUENCE { [0] version?, serial, signature, issuer, validity,
    fields = _children(der, ts, te)  #   subject, subjectPublicKeyInfo, [1]?, [2]?, [3] extensions? }
    if fields and fields[0][0] == 0xA0:
        fields = fields[1:]
    subject = fields[4]
    for tag, vs, _ in fields[6:]:
        if tag != 0xA3:
            continue
        _, es, ee = _tlv(der, vs)  # Extensions ::= SEQUENCE OF Extension { extnID, critical?, extnValue }
        for _, xs, xe in _children(der, es, ee):
            parts = _children(der, xs, xe)
            if der[parts[0][1]:parts[0][2]] != _OID_SAN:
                continue
            _, ns, ne = _tlv(der, parts[-1][1])  # the OCTET STRING holds GeneralNames ::= SEQUENCE OF GeneralName
            for tag_, gs, ge in _children(der, ns, ne):
                if tag_ == 0x82:  # [2] dNSName (IA5String)
                    return der[gs:ge].decode("ascii")
    names = []
    for _, rs, re_ in _children(der, subject[1], subject[2]):  # Name ::= SEQUENCE OF RelativeDistinguishedName (SET)
        for _, as_, ae in _children(der, rs, re_):  # AttributeTypeAndValue ::= SEQUENCE { type, value }
            oid, value = _children(der, as_, ae)[:2]
            if der[oid[1]:oid[2]] == _OID_CN:
                names.append(der[value[1]:value[2]].decode("utf-8", "replace"))
    return names[0] if names else None
