"""Transport security policy shared by devices and the server (standard library only).

* Plain TCP (``mqtt://``) carries passwords and model weights in clear text: it is allowed
  to a loopback broker, and elsewhere only when the user says ``--insecure``.
* Certificates are named by the SHA-256 of their DER bytes (``sha256:<64 hex digits>``),
  the form ``fedsdk-server certs init`` prints and a device can pin.
"""

from __future__ import annotations

import hashlib
import ipaddress
import re
import ssl

_PEM_CERT = re.compile(r"-----BEGIN CERTIFICATE-----.+?-----END CERTIFICATE-----", re.S)


def is_loopback(host: str) -> bool:
    """True for ``localhost`` and 127.0.0.0/8 / ::1 addresses."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


class InsecureTransportError(ValueError):
    """Plain TCP to a broker on another machine without ``--insecure``."""


def check_plain_tcp(host: str, tls: bool, insecure: bool = False) -> None:
    """Refuse ``mqtt://`` (no TLS) to a non-loopback ``host`` unless ``insecure``."""
    if tls or insecure or is_loopback(host):
        return
    raise InsecureTransportError(
        f"refusing plain mqtt:// to {host}: passwords and weights would cross the network "
        "unencrypted. Use mqtts://HOST:8883 (fedsdk-server certs init makes the certificates), "
        "or pass --insecure if this network is trusted."
    )


def certificate_fingerprint(pem: str | bytes) -> str:
    """``sha256:<hex>`` of the first certificate in ``pem`` (hash of its DER encoding)."""
    text = pem.decode() if isinstance(pem, bytes) else pem
    match = _PEM_CERT.search(text)
    if match is None:
        raise ValueError("no PEM certificate found")
    der = ssl.PEM_cert_to_DER_cert(match.group(0))
    return "sha256:" + hashlib.sha256(der).hexdigest()
