"""Certificates and keys for the test cluster, made on the fly.

The test cluster (:mod:`kcover.testing.cluster`) runs a real kube-apiserver on
loopback, which needs a CA, a serving certificate for 127.0.0.1, and an RSA key
pair to sign and verify service-account tokens. Users that permission tests
impersonate authenticate with client certificates signed by the same CA (the
API server trusts it through ``--client-ca-file``), so a new user needs no
restart of the API server. Everything here is pure: functions return PEM bytes
and the caller decides where to write them.

Keys are ECDSA P-256 (fast to make) by default. The service-account key is
RSA, and so is the optional webhook CA given to controllers that use
open-policy-agent's cert-controller (it parses the CA key as PKCS#1 RSA and
wants certificates valid for 90 days ahead, or it replaces them).
"""

from __future__ import annotations

import datetime as _dt
import ipaddress
from dataclasses import dataclass

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

__all__ = ["CertificateAuthority", "KeyPair", "new_ca", "new_service_account_key"]

_VALIDITY = _dt.timedelta(days=2)


@dataclass(frozen=True)
class KeyPair:
    """A PEM certificate (or public key) and its PEM private key."""

    cert_pem: bytes
    key_pem: bytes


PrivateKey = ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey


def _private_pem(key: PrivateKey) -> bytes:
    # RSA keys in PKCS#1 ("RSA PRIVATE KEY"), which every Go parser accepts.
    fmt = (
        serialization.PrivateFormat.TraditionalOpenSSL
        if isinstance(key, rsa.RSAPrivateKey)
        else serialization.PrivateFormat.PKCS8
    )
    return key.private_bytes(serialization.Encoding.PEM, fmt, serialization.NoEncryption())


def _name(common_name: str, organizations: tuple[str, ...] = ()) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, org) for org in organizations]
    attrs.append(x509.NameAttribute(NameOID.COMMON_NAME, common_name))
    return x509.Name(attrs)


@dataclass(frozen=True)
class CertificateAuthority:
    """A self-signed CA that issues serving and client certificates."""

    cert: x509.Certificate
    key: PrivateKey

    @property
    def cert_pem(self) -> bytes:
        return self.cert.public_bytes(serialization.Encoding.PEM)

    @property
    def key_pem(self) -> bytes:
        return _private_pem(self.key)

    def _issue(
        self,
        subject: x509.Name,
        usage: x509.ObjectIdentifier,
        sans: list[x509.GeneralName] | None = None,
        validity: _dt.timedelta = _VALIDITY,
    ) -> KeyPair:
        key = ec.generate_private_key(ec.SECP256R1())
        builder = (
            _builder(subject, self.cert.subject, key, validity, ca=False)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(self.key.public_key()),
                critical=False,
            )
        )
        if sans:
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        cert = builder.sign(self.key, hashes.SHA256())
        return KeyPair(cert.public_bytes(serialization.Encoding.PEM), _private_pem(key))

    def issue_server(self, hosts: list[str], validity: _dt.timedelta = _VALIDITY) -> KeyPair:
        """A serving certificate valid for each IP address or DNS name in ``hosts``."""
        return self._issue(_name(hosts[0]), ExtendedKeyUsageOID.SERVER_AUTH, _sans(hosts), validity)

    def issue_client(self, user: str, groups: tuple[str, ...] = ()) -> KeyPair:
        """A client certificate: Kubernetes reads the user from CN and groups from O."""
        return self._issue(_name(user, groups), ExtendedKeyUsageOID.CLIENT_AUTH)


def _builder(
    subject: x509.Name,
    issuer: x509.Name,
    key: PrivateKey,
    validity: _dt.timedelta,
    *,
    ca: bool,
) -> x509.CertificateBuilder:
    """A certificate builder with the fields every certificate here shares."""
    now = _dt.datetime.now(_dt.UTC)
    usage = x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=ca,
        crl_sign=ca,
        encipher_only=False,
        decipher_only=False,
    )
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _dt.timedelta(minutes=5))
        .not_valid_after(now + validity)
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        .add_extension(usage, critical=True)
    )


def _sans(hosts: list[str]) -> list[x509.GeneralName]:
    sans: list[x509.GeneralName] = []
    for host in hosts:
        try:
            sans.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            sans.append(x509.DNSName(host))
    return sans


def new_ca(
    common_name: str = "kcover-test-cluster-ca",
    *,
    use_rsa: bool = False,
    validity: _dt.timedelta = _VALIDITY,
    dns_names: tuple[str, ...] = (),
) -> CertificateAuthority:
    """Make a fresh self-signed CA (RSA if ``use_rsa``; ``dns_names`` as SANs)."""
    key: PrivateKey = (
        rsa.generate_private_key(public_exponent=65537, key_size=2048)
        if use_rsa
        else ec.generate_private_key(ec.SECP256R1())
    )
    subject = _name(common_name)
    builder = _builder(subject, subject, key, validity, ca=True).add_extension(
        x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False
    )
    if dns_names:
        builder = builder.add_extension(
            x509.SubjectAlternativeName(_sans(list(dns_names))), critical=False
        )
    return CertificateAuthority(builder.sign(key, hashes.SHA256()), key)


def new_service_account_key() -> KeyPair:
    """An RSA key pair for signing service-account tokens (public key PEM, private key PEM)."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    public = key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return KeyPair(public, _private_pem(key))
