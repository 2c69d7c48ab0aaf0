"""The pairing service: answers pairing requests while ``fedsdk-server run`` serves the fleet.

It has its own MQTT connection (an ``Endpoint`` on ``PairTopics``, client id
``fedsdk-server-<fleet>-pair``) and its own thread, so pairing never blocks the round loop.
The exchange with one pairing client (docs/protocol.md §19)::

    client                                   server
      pair_ca_request  ─────────────────────►           (only when pinning a CA fingerprint)
                       ◄─────────────────────  pair_ca
      pair_request (code, name, profile) ───►           check + claim the code
                       ◄─────────────────────  pair_offer (session, each tier's programs + weights)
      (pulls them, times training steps of each tier's model on each runtime it has)
      pair_confirm (session, name, profile) ►           tier, device id, credentials
                       ◄─────────────────────  pair_accept (device id, password, tier, CA, …)
      unpair_request (device id, password) ─►           revoke
                       ◄─────────────────────  ack

Every refusal is an ``error`` whose ``ref`` is the request's ``msg_id`` (codes:
``code_wrong``, ``code_expired``, ``code_used``, ``pairing_locked``, ``session_unknown``,
``not_paired``, ``no_ca``, ``pairing_failed``). A request delivered twice (QoS 1) is
answered once.
"""

from __future__ import annotations

import logging
import queue
import re
import secrets
import threading
from collections import OrderedDict
from typing import Protocol

from export.programs import ProgramCache
from fedcore import modelspec
from fedcore.recipe import Recipe
from sdk_device.benchmark import initial_weights
from sdk_device.protocol import messages as msgs
from sdk_device.protocol.blobs import encode_tensors
from sdk_device.protocol.errors import ProtocolError
from sdk_device.transport.endpoint import Endpoint, Incoming

from ..broker.security import RESERVED_PREFIX
from ..methods.base import Method
from .fleet_info import FleetInfo
from .membership import FleetMembers
from .pair_codes import PairCodes, sha256_text
from .tiers import spec_cost, train_memory_mb

log = logging.getLogger(__name__)



class CredentialIssuer(Protocol):
    """The part of ``BrokerSecurity`` (server_toolkit/broker/security.py) pairing uses."""

    def grant_device(self, device_id: str, password: str) -> None: ...

    def revoke_device(self, device_id: str) -> None: ...


def device_id_for(name: str, taken) -> str:
    """A free device id derived from ``name`` (``taken(id) -> bool``): the name made safe for a
    topic level (letters, digits, ``_.-``), then ``-2``, ``-3``… when it is in use."""
    base = re.sub(r"[^A-Za-z0-9_.-]+", "-", name).strip("-.")[:48] or "device"
    if base.lower().startswith(RESERVED_PREFIX):
        base = f"dev-{base}"[:48]
    candidate, n = base, 1
    while taken(candidate):
        n += 1
        candidate = f"{base}-{n}"
    return candidate


class PairingService:
    """Answers pairing requests on ``endpoint`` (a server-side ``Endpoint`` on ``PairTopics``).

    ``security`` issues broker credentials (None: the broker enforces none, e.g. a loopback
    development broker; devices still get ids, tiers and passwords). ``ca_pem``: the CA
    devices must trust for ``mqtts://`` (sent in ``pair_ca`` and ``pair_accept``).
    """

    def __init__(
        self,
        endpoint: Endpoint,
        registry: FleetMembers,
        codes: PairCodes,
        method: Method,
        info: FleetInfo,
        programs: ProgramCache,
        security: CredentialIssuer | None = None,
        ca_pem: str | None = None,
    ) -> None:
        self.endpoint = endpoint
        self.registry = registry
        self.codes = codes
        self.method = method
        self.info = info
        self.programs = programs
        self.security = security
        self.ca_pem = ca_pem
        self._seen: OrderedDict[str, None] = OrderedDict()  # msg ids answered (QoS-1 duplicates)
        self._weights: dict[bytes, bytes] = {}  # spec bytes -> encoded initial weights
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="pairing", daemon=True)
        self.paired: list[str] = []  # device ids paired by this service (for logs and tests)

    def start(self) -> PairingService:
        self.endpoint.start()
        self._thread.start()
        log.info("pairing service listening (broker security %s)", "on" if self.security else "OFF")
        return self

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self.endpoint.close()

    # -- the loop (own thread) ---------------------------------------------------------------
    def _loop(self) -> None:
        self._prepare()
        while not self._stop.is_set():
            try:
                incoming = self.endpoint.inbox.get(timeout=0.5)
            except queue.Empty:
                continue
            self.handle(incoming)

    def _prepare(self) -> None:
        """Build the programs pairing offers now (an ExecuTorch export takes seconds to
        minutes), so the first device does not wait for it; requests queue meanwhile."""
        try:
            for spec, recipe in self._models().values():
                self.programs.programs(spec, recipe)
                self._initial_weights(spec)
        except Exception:  # the offer will try again and report the error to the device
            log.exception("pairing: could not prepare the fleet's programs")

    def handle(self, incoming: Incoming) -> None:
        """Answer one incoming request (errors are answered, logged and never raised)."""
        client, message = incoming.peer, incoming.message
        if message is None or message.msg_id in self._seen:
            return  # statuses, rejects (already answered by the endpoint), duplicates
        self._seen[message.msg_id] = None
        while len(self._seen) > 1000:
            self._seen.popitem(last=False)
        handlers = {
            msgs.PairCaRequest: self._on_ca_request,
            msgs.PairRequest: self._on_request,
            msgs.PairConfirm: self._on_confirm,
            msgs.UnpairRequest: self._on_unpair,
        }
        handler = handlers.get(type(message))
        if handler is None:
            log.debug("pairing: ignoring %s from %s", message.TYPE, client)
            return
        try:
            answer = handler(client, message)
        except ProtocolError as err:
            log.warning("pairing: refused %s from %s: %s", message.TYPE, client, err)
            answer = msgs.Error(code=err.code, detail=err.detail[:500], ref=message.msg_id)
        except Exception as exc:  # never let one request end the service
            log.exception("pairing: %s from %s failed", message.TYPE, client)
            answer = msgs.Error(
                code="pairing_failed", detail=f"server error: {exc}"[:500], ref=message.msg_id
            )
        try:
            self.endpoint.send(client, answer)
        except Exception:
            log.exception("pairing: could not answer %s", client)

    # -- requests ----------------------------------------------------------------------------
    def _on_ca_request(self, client: str, request: msgs.PairCaRequest) -> msgs.Message:
        if self.ca_pem is None:
            raise ProtocolError("no_ca", "this server has no CA to hand out (its broker is not mqtts://)")
        return msgs.PairCa(ca_pem=self.ca_pem)

    def _on_request(self, client: str, request: msgs.PairRequest) -> msgs.Message:
        claim = self.codes.claim(request.code, client)
        log.info(
            "pairing: %s presented a valid code (name %r); offering the fleet's model", client, request.name
        )
        models, blobs = {}, {}
        for name, (spec, recipe) in self._models().items():
            refs = [
                self.endpoint.offer(client, data, "program", fmt)
                for fmt, data in self.programs.programs(spec, recipe)
            ]
            weights = self.endpoint.offer(client, self._initial_weights(spec), "weights", "safetensors")
            blobs.update({ref.id: ref for ref in [*refs, weights]})
            memory = train_memory_mb(spec_cost(spec), recipe.batch_size, recipe.optimizer)
            models[name] = {
                "programs": [r.id for r in refs],
                "weights": weights.id,
                "train_memory_mb": memory,
            }
        return msgs.PairOffer(
            session=claim.session,
            fleet=self.info.fleet,
            blobs=list(blobs.values()),
            models=models,
            recipe=recipe.to_dict(),
            expires_at=claim.session_expires,
        )

    def _models(self) -> dict[str, tuple[dict, Recipe]]:
        """(spec, recipe) of each tier's sub-model; key "" = the one model of a fleet without tiers."""
        return {name: self.method.tier_plan(name or None) for name in (self.info.tiers or [""])}

    def _on_confirm(self, client: str, confirm: msgs.PairConfirm) -> msgs.Message:
        row = self.codes.session(confirm.session)
        if row["used_by"] != client:
            raise ProtocolError("session_unknown", "this session belongs to another pairing client")
        profile = dict(confirm.profile)
        if row["tier"]:
            tier, reason = (
                row["tier"],
                {"mode": "code", "tier": row["tier"], "note": "set by the pairing code (pair-code --tier)"},
            )
        else:
            choice = self.info.choose_tier(profile)
            tier, reason = choice.tier, choice.reason
        device_id = device_id_for(confirm.name, self.registry.name_taken)
        password = secrets.token_urlsafe(24)
        if self.security is not None:
            self.security.grant_device(device_id, password)
        self.registry.register_paired(device_id, confirm.name, tier, profile, reason, sha256_text(password))
        self.registry.finish_pair_code(row["id"], device_id)
        self.endpoint.withdraw(client)
        self.paired.append(device_id)
        summary = reason.get("summary") or reason.get("note", "")
        log.info("pairing: paired %s as %s (%s)", confirm.name, device_id, summary)
        return msgs.PairAccept(
            device_id=device_id,
            username=device_id,
            password=password,
            fleet=self.info.fleet,
            broker_url=self.info.broker_url,
            tier=tier,
            tier_reason=summary[:1000],
            ca_pem=self.ca_pem,
        )

    def _on_unpair(self, client: str, request: msgs.UnpairRequest) -> msgs.Message:
        stored = self.registry.password_hash(request.device_id)
        if stored is None or not secrets.compare_digest(stored, sha256_text(request.password)):
            raise ProtocolError("not_paired", f"no paired device {request.device_id!r} with this password")
        if self.security is not None:
            self.security.revoke_device(request.device_id)
        self.registry.revoke(request.device_id)
        log.warning("pairing: device %s unpaired itself (revoked)", request.device_id)
        return msgs.Ack(ref=request.msg_id, detail="revoked")

    def _initial_weights(self, spec: dict) -> bytes:
        """Seeded weights of ``spec`` (the benchmark needs the right shapes, not trained values)."""
        key = modelspec.dumps(spec)
        if key not in self._weights:
            self._weights[key] = encode_tensors(initial_weights(spec))
        return self._weights[key]
