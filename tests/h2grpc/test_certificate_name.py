"""The name `epp explain` / `epp endpoints` expect from a TLS port's certificate, read from its DER without the
cryptography package, checked against what cryptography reads from the same certificates."""

from __future__ import annotations

import datetime
import ipaddress

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from epp.h2grpc.tls import certificate_name, self_signed_cert


def issued(subject_cn: str | None, sans: list[x509.GeneralName], issuer_cn: str = "some issuing CA") -> bytes:
    """A certificate for `subject_cn` and `sans`, signed as if by another CA (issuer and subject differ)."""
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "pointsman tests"),
                         *([x509.NameAttribute(NameOID.COMMON_NAME, subject_cn)] if subject_cn else [])])
    issuer = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, issuer_cn)])
    now = datetime.datetime.now(datetime.timezone.utc)
    builder = (x509.CertificateBuilder().subject_name(subject).issuer_name(issuer).public_key(key.public_key())
               .serial_number(x509.random_serial_number()).not_valid_before(now)
               .not_valid_after(now + datetime.timedelta(days=1)))
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    builder = builder.add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
    return builder.sign(key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM)


def cryptographys_reading(pem: bytes) -> str:
    cert = x509.load_pem_x509_certificate(pem)
    try:
        dns = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(
            x509.DNSName)
        if dns:
            return str(dns[0])
    except x509.ExtensionNotFound:
        pass
    cn = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    return str(cn[0].value) if cn else "localhost"


CASES = {
    "serve's own self-signed": self_signed_cert()[1],
    "self-signed for a service": self_signed_cert(("epp.ns1.svc.cluster.local", "10.0.0.7"))[1],
    "IP SAN before the DNS one": issued("cn-name", [x509.IPAddress(ipaddress.ip_address("10.1.2.3")),
                                                    x509.DNSName("after-the-ip.example")]),
    "many SANs (long lengths)": issued("cn", [x509.DNSName(f"host-{i}.pool.example") for i in range(40)]),
    "no SAN: the subject's CN, not the issuer's": issued("the-subject", []),
    "no DNS SAN, no CN": issued(None, [x509.IPAddress(ipaddress.ip_address("10.1.2.3"))]),
}


@pytest.mark.parametrize("case", list(CASES))
def test_the_name_is_what_cryptography_reads(case: str) -> None:
    pem = CASES[case]
    assert certificate_name(pem) == cryptographys_reading(pem)


def test_what_each_case_names() -> None:
    names = {case: certificate_name(pem) for case, pem in CASES.items()}
    assert names["serve's own self-signed"] == "localhost"
    assert names["self-signed for a service"] == "epp.ns1.svc.cluster.local"
    assert names["IP SAN before the DNS one"] == "after-the-ip.example"
    assert names["many SANs (long lengths)"] == "host-0.pool.example"
    assert names["no SAN: the subject's CN, not the issuer's"] == "the-subject"
    assert names["no DNS SAN, no CN"] == "localhost"


@pytest.mark.parametrize("pem", [b"", b"not a certificate",
                                 b"-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"])
def test_what_does_not_parse_is_localhost(pem: bytes) -> None:
    assert certificate_name(pem) == "localhost"


def test_the_client_commands_do_not_load_cryptography() -> None:
    import subprocess
    import sys

    code = ("import sys; from epp.h2grpc.tls import certificate_name; "
            f"certificate_name({CASES['self-signed for a service']!r}); "
            "print('cryptography' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
