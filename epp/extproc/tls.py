"""TLS for the ext_proc server (`--secure-serving`, `--cert-path`).

Gateways (Envoy Gateway, agentgateway, Istio) talk TLS to the EPP without verifying it, so when no certificate is
mounted the EPP serves a freshly generated self-signed one. With a cert path, `tls.crt` and `tls.key` are loaded
from that directory (the layout of a Kubernetes TLS Secret).

The certificate is generated with the `cryptography` package when it is importable, otherwise with the openssl CLI.
"""

from __future__ import annotations

import datetime
import ipaddress
import logging
import os
import shutil
import ssl
import subprocess
import tempfile
from collections.abc import Sequence
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
    from epp.h2grpc import server_ssl_context as context

    return context(*serving_cert(cert_path, hosts))
