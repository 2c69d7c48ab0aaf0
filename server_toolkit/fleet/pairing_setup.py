"""What ``fedsdk-server run`` does to serve pairing next to the fleet: describe the fleet
(``fleet.json``: device URL, CA, tiers and their costs) and start the pairing service."""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import TYPE_CHECKING

from export.programs import ProgramCache
from sdk_device.protocol.pair_topics import PairTopics
from sdk_device.transport.blob_store import BlobStore
from sdk_device.transport.endpoint import Endpoint
from sdk_device.transport.mqtt_link import BrokerAddress
from sdk_device.transport.tls import is_loopback

from ..methods.base import Method
from .fleet_info import FleetInfo
from .fleet_store import fleet_file
from .pair_codes import LockoutPolicy, PairCodes
from .pairing_service import CredentialIssuer, PairingService
from .registry import FleetRegistry
from .tiers import spec_cost

if TYPE_CHECKING:
    from ..broker.secured import SecuredBroker


def device_url_for(address: BrokerAddress, ca_file: str | None, explicit: str | None = None) -> str:
    """The broker URL devices are told to use: ``explicit``, else the server's own address;
    a loopback address over TLS becomes a non-loopback name the broker certificate holds
    (e.g. this host's name), since devices are other machines and check that name."""
    if explicit:
        return BrokerAddress.parse(explicit).url
    if address.tls and is_loopback(address.host) and ca_file:
        from ..broker.certs import CertFiles, server_hosts

        cert_dir = Path(ca_file).parent
        if (cert_dir / "server.pem").is_file():
            names = [n for n in server_hosts(CertFiles(cert_dir)) if not is_loopback(n)]
            if names:
                return BrokerAddress(names[0], address.port, tls=True).url
    return address.url


def describe_fleet(
    method: Method,
    fleet: str,
    device_url: str,
    tiers: list[str],
    round_timeout_s: float,
    *,
    method_name: str,
    model: str,
    ca_file: str | None,
    security_dir: str | None,
    insecure: bool,
    lockout: LockoutPolicy,
) -> FleetInfo:
    """The fleet as pairing and the ``devices``/``pair-code`` commands see it. ValueError
    when a tier is not one the method understands."""
    full_spec, recipe = method.tier_plan(None)
    costs = {}
    for tier in tiers:
        spec, _ = method.tier_plan(tier)
        costs[tier] = spec_cost(spec).to_dict()
    return FleetInfo(
        fleet=fleet,
        broker_url=device_url,
        method=method_name,
        model=model,
        ca_file=ca_file,
        tiers=list(tiers),
        tier_costs=costs,
        full_cost=spec_cost(full_spec).to_dict(),
        recipe=recipe.to_dict(),
        round_timeout_s=round_timeout_s,
        lockout=vars(lockout).copy(),
        security_dir=security_dir,
        insecure=insecure,
        server_pid=os.getpid(),
        server_host=socket.gethostname(),
    )


def start_pairing(
    run_dir: Path,
    info: FleetInfo,
    address: BrokerAddress,
    method: Method,
    registry: FleetRegistry,
    programs: ProgramCache,
    *,
    username: str | None = None,
    password: str | None = None,
    ca_file: str | None = None,
    insecure: bool = False,
    security: CredentialIssuer | None = None,
    fleet_home: Path | None = None,
) -> PairingService:
    """Write ``fleet.json`` (in the run directory, and in ``fleet_home``, the directory of the
    fleet's members and pairing key when it is another: ``fleet/fleet_store.py``) and start
    the pairing service on its own connection and thread."""
    info.save(run_dir)
    if fleet_home is not None:
        info.save(fleet_home)
    endpoint = Endpoint(
        address,
        PairTopics(),
        BlobStore(Path(run_dir) / "pairing-blobs"),
        client_id=f"fedsdk-server-{info.fleet}-pair",
        username=username,
        password=password,
        ca_file=ca_file,
        insecure=insecure,
    )
    ca_pem = Path(ca_file).read_text() if ca_file and address.tls else None
    codes = PairCodes(registry, fleet_home or run_dir, LockoutPolicy(**info.lockout))
    return PairingService(
        endpoint, registry, codes, method, info, programs, security=security, ca_pem=ca_pem
    ).start()


def start_pairing_on(
    secured: SecuredBroker,
    run_dir: Path,
    method: Method,
    tiers: list[str],
    *,
    method_name: str,
    model: str,
    lockout: LockoutPolicy,
    programs: ProgramCache | None = None,
) -> tuple[PairingService, FleetRegistry]:
    """The pairing service of ``method``'s fleet on a secured mosquitto (tests and benches:
    ``broker.secured.make_secured_broker``), logged in as fedsdk-server, with the fleet's
    members in its security directory and the run's registry in ``run_dir`` (as ``run``)."""
    home = Path(secured.security.directory)
    registry = FleetRegistry(Path(run_dir) / "registry.sqlite", fleet_file(run_dir, home))
    info = describe_fleet(method, secured.fleet, secured.url, tiers, 60.0, method_name=method_name,
                          model=model, ca_file=secured.ca_file,
                          security_dir=str(secured.security.directory), insecure=False, lockout=lockout)
    user, password = secured.security.server_credentials()
    service = start_pairing(run_dir, info, secured.address, method, registry, programs or ProgramCache(),
                            username=user, password=password, ca_file=secured.ca_file,
                            security=secured.security, fleet_home=home)
    return service, registry
