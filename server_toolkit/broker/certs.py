"""A private certificate authority for the fleet's broker (``fedsdk-server certs init``).

Writes into one directory:

* ``ca.pem`` / ``ca.key``          the fleet's CA (devices trust ``ca.pem``; keep ``ca.key`` safe);
* ``server.pem`` / ``server.key``  the broker's certificate, signed by the CA, with every
  ``--host`` name or IP address as a subject alternative name (what TLS clients check).

Keys are ECDSA P-256 (fast on small devices, supported by every TLS 1.2+ stack) and only
readable by their owner. An existing CA is kept: re-running issues a new server certificate
signed by it, so paired devices stay valid.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
import socket
from dataclasses import dataclass
from pathlib import Path

from sdk_device.transport.tls import certificate_fingerprint

CA_DAYS = 3650
SERVER_DAYS = 825


@dataclass(frozen=True)
class CertFiles:
    """The four files of a certificate directory."""

    directory: Path

    @property
    def ca_pem(self) -> Path:
        return self.directory / "ca.pem"

    @property
    def ca_key(self) -> Path:
        return self.directory / "ca.key"

    @property
    def server_pem(self) -> Path:
        return self.directory / "server.pem"

    @property
    def server_key(self) -> Path:
        return self.directory / "server.key"

    def check(self) -> CertFiles:
        """Self, if the CA certificate and the server pair exist (else a FileNotFoundError)."""
        missing = [p.name for p in (self.ca_pem, self.server_pem, self.server_key) if not p.is_file()]
        if missing:
            raise FileNotFoundError(
                f"{self.directory} lacks {', '.join(missing)}: "
                f"run fedsdk-server certs init --dir {self.directory}"
            )
        return self


def default_hosts() -> list[str]:
    """This machine's host name, ``localhost`` and ``127.0.0.1``."""
    return list(dict.fromkeys([socket.gethostname(), "localhost", "127.0.0.1"]))


def _write_key(path: Path, key) -> None:
    from cryptography.hazmat.primitives import serialization

    data = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def _san(hosts: list[str]):
    from cryptography import x509

    names = []
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    return x509.SubjectAlternativeName(names)


def init_certs(directory: str | Path, hosts: list[str] | None = None, new_ca: bool = False) -> CertFiles:
    """Make (or keep) the CA in ``directory`` and issue a server certificate for ``hosts``."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    files = CertFiles(Path(directory))
    files.directory.mkdir(parents=True, exist_ok=True)
    hosts = hosts or default_hosts()
    now = dt.datetime.now(dt.UTC)

    if new_ca or not (files.ca_pem.exists() and files.ca_key.exists()):
        ca_key = ec.generate_private_key(ec.SECP256R1())
        ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"fedsdk fleet CA ({hosts[0]})")])
        ca_cert = (
            x509.CertificateBuilder()
            .subject_name(ca_name)
            .issuer_name(ca_name)
            .public_key(ca_key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=CA_DAYS))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(
                x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                              content_commitment=False, key_encipherment=False, data_encipherment=False,
                              key_agreement=False, encipher_only=False, decipher_only=False),
                critical=True,
            )
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
            .sign(ca_key, hashes.SHA256())
        )
        _write_key(files.ca_key, ca_key)
        files.ca_pem.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    else:
        ca_key = serialization.load_pem_private_key(files.ca_key.read_bytes(), password=None)
        ca_cert = x509.load_pem_x509_certificate(files.ca_pem.read_bytes())

    server_key = ec.generate_private_key(ec.SECP256R1())
    server_cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0])]))
        .issuer_name(ca_cert.subject)
        .public_key(server_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=SERVER_DAYS))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_san(hosts), critical=False)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_cert.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    _write_key(files.server_key, server_key)
    files.server_pem.write_bytes(server_cert.public_bytes(serialization.Encoding.PEM))
    return files


def fingerprints(files: CertFiles) -> dict[str, str]:
    """``{"ca.pem": "sha256:…", "server.pem": "sha256:…"}``."""
    return {p.name: certificate_fingerprint(p.read_text()) for p in (files.ca_pem, files.server_pem)}


def server_hosts(files: CertFiles) -> list[str]:
    """The names and addresses the server certificate is valid for."""
    from cryptography import x509

    cert = x509.load_pem_x509_certificate(files.server_pem.read_bytes())
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return [str(name.value) for name in san]
