"""The device side of pairing: trade a one-time code for this device's own credentials.

``PairClient`` connects as the broker's pairing account (``fedsdk-pair``, whose ACL confines
it to ``fedsdk/v1/pair/<its client id>/#``) with a random client id, and runs the exchange
of docs/protocol.md §19 through an ordinary ``Endpoint`` on ``PairTopics``:
``pair_request`` (code) -> ``pair_offer`` (the fleet's model as blobs) -> benchmark here ->
``pair_confirm`` (profile with step times) -> ``pair_accept`` (device id, password, tier, CA).

Trust on first contact (``mqtts://``): ``ca_file`` (a CA file copied from the server), or
``ca_fingerprint`` (``sha256:<hex>`` as ``fedsdk-server pair-code`` prints it): the client
then first connects *without* verifying, asks only for the CA (``pair_ca_request``; no
secret is sent on that connection), checks the CA's fingerprint, and reconnects verifying
the broker's certificate against it. Neither: the system's CAs. Plain ``mqtt://`` is
refused to a non-loopback host unless ``insecure`` (the code and the password would cross
the network in clear).

Every failure is a ``PairingError`` whose ``kind`` says which one (``EXIT_CODES``).
"""

from __future__ import annotations

import queue
import ssl
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .protocol import messages as msgs
from .protocol.pair_topics import PAIR_PASSWORD, PAIR_USERNAME, PairTopics, new_client_id
from .transport.blob_store import BlobStore
from .transport.endpoint import SERVER, Endpoint
from .transport.mqtt_link import BrokerAddress
from .transport.tls import certificate_fingerprint, is_loopback

# kind -> process exit code of ``fedsdk pair`` (scripts can tell failures apart)
EXIT_CODES = {
    "usage": 2,
    "unreachable": 3,
    "tls_trust": 4,
    "refused": 5,
    "no_server": 6,
    "code_wrong": 7,
    "code_expired": 8,
    "code_used": 9,
    "locked": 10,
    "insecure": 11,
    "no_runtime": 12,
    "failed": 13,
}
SERVER_CODES = {
    "code_wrong": "code_wrong",
    "code_expired": "code_expired",
    "code_used": "code_used",
    "pairing_locked": "locked",
}


class PairingError(Exception):
    """Pairing failed; ``kind`` is one of ``EXIT_CODES``, ``str()`` says what to do."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind

    @property
    def exit_code(self) -> int:
        return EXIT_CODES.get(self.kind, EXIT_CODES["failed"])


def normalize_fingerprint(text: str) -> str:
    """Accept ``sha256:ab12…``, ``AB:12:…`` or bare hex; returns ``sha256:<lower hex>``."""
    digits = text.strip().lower().removeprefix("sha256:").removeprefix("sha256=").replace(":", "")
    if len(digits) != 64 or any(c not in "0123456789abcdef" for c in digits):
        raise PairingError(
            "usage",
            f"{text!r} is not a SHA-256 fingerprint (64 hex digits, as `fedsdk-server pair-code` prints it)",
        )
    return f"sha256:{digits}"


def explain_connect_error(exc: ConnectionError, url: str) -> PairingError:
    """Turn the transport's ConnectionError into the user's distinct failure."""
    cause = exc.__cause__
    if isinstance(cause, ssl.SSLCertVerificationError):
        return PairingError(
            "tls_trust",
            f"TLS: the broker's certificate at {url} is not trusted "
            f"({getattr(cause, 'verify_message', None) or cause}). Give the CA the server uses: "
            "--ca-fingerprint as printed by `fedsdk-server pair-code`, or --ca-file.",
        )
    if isinstance(cause, ssl.SSLError):
        return PairingError(
            "tls_trust",
            f"TLS handshake with {url} failed ({getattr(cause, 'reason', None) or cause}): "
            "is that port really mqtts:// (TLS)?",
        )
    if isinstance(cause, OSError):
        return PairingError(
            "unreachable",
            f"cannot reach the broker at {url} ({cause.strerror or cause}). "
            "Is the server running, the address right and the port open from here?",
        )
    text = str(exc)
    if "refused us" in text and "no answer" not in text:
        return PairingError(
            "refused",
            f"the broker at {url} refused the pairing account ({text.split(': ')[-1]}): "
            "is broker security with pairing set up on the server?",
        )
    return PairingError("unreachable", f"no MQTT answer from {url}: {text}")


@dataclass(frozen=True)
class OfferedModel:
    """One model of a ``pair_offer``: its programs by format, its weights, and the server's
    estimate of its training memory (MiB)."""

    programs: dict[str, msgs.BlobRef]
    weights: msgs.BlobRef
    train_memory_mb: float | None


Benchmark = Callable[[msgs.PairOffer, dict[str, OfferedModel], Callable[[msgs.BlobRef], bytes]], dict]


def offered_models(offer: msgs.PairOffer) -> dict[str, OfferedModel]:
    """The offer's ``models`` (tier name -> model), checked against its ``blobs``."""
    refs = {ref.id: ref for ref in offer.blobs}
    models = {}
    try:
        for tier, entry in offer.models.items():
            programs = {refs[i].format: refs[i] for i in entry["programs"]}
            memory = entry.get("train_memory_mb")
            if "torchspec/1" not in programs or not isinstance(memory, int | float | None):
                raise ValueError(f"model {tier!r} lacks its torchspec/1 program")
            models[tier] = OfferedModel(programs, refs[entry["weights"]], memory)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise PairingError("failed", f"the server's pair_offer is malformed ({exc!r})") from None
    if not models:
        raise PairingError("failed", "the server's pair_offer names no model")
    return models


class PairClient:
    """One pairing conversation with the server behind ``server_url`` (see the module docstring)."""

    def __init__(
        self,
        server_url: str,
        *,
        ca_file: str | None = None,
        ca_fingerprint: str | None = None,
        insecure: bool = False,
        timeout_s: float = 30.0,
        say: Callable[[str], None] = lambda text: None,
    ) -> None:
        try:
            self.address = BrokerAddress.parse(server_url)
        except ValueError as exc:
            raise PairingError("usage", str(exc)) from None
        if not self.address.tls and not is_loopback(self.address.host) and not insecure:
            raise PairingError(
                "insecure",
                f"{server_url} is plain TCP to another machine: the pairing code and "
                "this device's password would cross the network readable by anyone. Use "
                "mqtts:// (the server's `fedsdk-server pair-code` prints the command), or add "
                "--insecure on a network you trust.",
            )
        if ca_file and ca_fingerprint:
            raise PairingError("usage", "give --ca-file or --ca-fingerprint, not both")
        self.url = self.address.url
        self.insecure = insecure
        self.ca_file = ca_file
        self.pin = normalize_fingerprint(ca_fingerprint) if ca_fingerprint else None
        self.timeout_s = timeout_s
        self.say = say
        self._tmp = tempfile.TemporaryDirectory(prefix="fedsdk-pair-")
        self.tmp = Path(self._tmp.name)
        self.ca_pem: str | None = None  # the CA this conversation trusts (None: system CAs / plain TCP)

    def close(self) -> None:
        self._tmp.cleanup()

    def __enter__(self) -> PairClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- connections -------------------------------------------------------------------------
    def _endpoint(self, verify: bool = True) -> Endpoint:
        client_id = new_client_id()
        ca_path = None
        if self.ca_pem is not None:
            ca_path = self.tmp / "ca.pem"
            ca_path.write_text(self.ca_pem)
        endpoint = Endpoint(
            self.address,
            PairTopics(),
            BlobStore(self.tmp / "blobs"),
            device_id=client_id,
            client_id=client_id,
            username=PAIR_USERNAME,
            password=PAIR_PASSWORD,
            ca_file=str(ca_path) if ca_path else None,
            ephemeral=True,
            tls_verify=verify,
            insecure=self.insecure,
        )
        try:
            endpoint.start(timeout_s=min(self.timeout_s, 15.0))
        except ConnectionError as exc:
            raise explain_connect_error(exc, self.url) from None
        return endpoint

    def establish_trust(self) -> None:
        """Settle which CA to trust before any secret is sent (see the module docstring)."""
        if not self.address.tls:
            return
        if self.ca_file:
            try:
                self.ca_pem = Path(self.ca_file).read_text()
                ssl.PEM_cert_to_DER_cert(self.ca_pem)
            except (OSError, ValueError) as exc:
                raise PairingError("usage", f"cannot use --ca-file {self.ca_file}: {exc}") from None
            return
        if self.pin is None:
            return  # the system's CAs
        endpoint = self._endpoint(verify=False)
        try:
            request = msgs.PairCaRequest()
            endpoint.send(SERVER, request)
            answer = self._wait(endpoint, request, (msgs.PairCa,))
        finally:
            endpoint.close()
        try:
            got = certificate_fingerprint(answer.ca_pem)
        except ValueError:
            raise PairingError("tls_trust", "the server sent a CA that is not a PEM certificate") from None
        if got != self.pin:
            raise PairingError(
                "tls_trust",
                f"the CA offered at {self.url} has fingerprint {got}, not the "
                f"{self.pin} you gave: this may not be your server. Nothing was sent.",
            )
        self.ca_pem = answer.ca_pem
        self.say(f"CA checked: {got[:23]}… matches the fingerprint you gave")

    def _wait(
        self,
        endpoint: Endpoint,
        request: msgs.Message,
        expected: tuple[type, ...],
        timeout_s: float | None = None,
    ) -> msgs.Message:
        """The server's answer to ``request``: one of ``expected``, or PairingError."""
        deadline = time.monotonic() + (timeout_s or self.timeout_s)
        while (left := deadline - time.monotonic()) > 0:
            try:
                incoming = endpoint.inbox.get(timeout=min(left, 0.5))
            except queue.Empty:
                continue
            message = incoming.message
            if isinstance(message, expected):
                return message
            if isinstance(message, msgs.Error) and message.ref in (request.msg_id, None):
                kind = SERVER_CODES.get(message.code, "failed")
                raise PairingError(
                    kind,
                    message.detail
                    if kind != "failed"
                    else f"the server refused: {message.code}: {message.detail}",
                )
        raise PairingError(
            "no_server",
            f"the broker at {self.url} let us in, but no fedsdk server answered "
            f"within {timeout_s or self.timeout_s:.0f} s: is `fedsdk-server run` serving with "
            "this broker?",
        )

    # -- the exchange ------------------------------------------------------------------------
    def pair(self, code: str, name: str, profile: dict, benchmark: Benchmark) -> msgs.PairAccept:
        """Run the whole exchange. ``benchmark(offer, models, fetch)`` times the offered models
        here (``offered_models``; ``fetch(ref) -> bytes`` pulls a blob) and returns the
        profile's ``bench`` entry."""
        self.establish_trust()
        endpoint = self._endpoint()
        self.say(f"connected to {self.url} as the pairing account")
        try:
            request = msgs.PairRequest(code=code, name=name, profile=profile)
            endpoint.send(SERVER, request)
            offer = self._wait(endpoint, request, (msgs.PairOffer,))
            self.say(f"code accepted by fleet {offer.fleet!r}")
            bench = benchmark(
                offer, offered_models(offer), lambda ref: endpoint.fetch(SERVER, ref, timeout_s=120)
            )
            confirm = msgs.PairConfirm(session=offer.session, name=name, profile={**profile, "bench": bench})
            endpoint.send(SERVER, confirm)
            return self._wait(endpoint, confirm, (msgs.PairAccept,))
        finally:
            endpoint.close()

    def unpair(self, device_id: str, password: str) -> None:
        """Ask the server to revoke ``device_id``; PairingError if it does not confirm."""
        self.establish_trust()
        endpoint = self._endpoint()
        try:
            request = msgs.UnpairRequest(device_id=device_id, password=password)
            endpoint.send(SERVER, request)
            answer = self._wait(endpoint, request, (msgs.Ack,), timeout_s=min(self.timeout_s, 15.0))
            if answer.ref != request.msg_id:
                raise PairingError("failed", "the server answered another request")
        finally:
            endpoint.close()
